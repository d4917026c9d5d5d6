/* creq_openai.c: OpenAI chat completions and legacy completions -> creq. */
#include <string.h>

#include "../core/alloc.h"
#include "creq_int.h"

#define OOM(e) creq_oom(e)

/* The name of the tool a call id belongs to (searching earlier assistant turns). */
/* One tool-call object of an assistant message ({id, type, function:{name, arguments}}). */
static bool add_chat_call(creq_msgs *m, const json_t *call, size_t i, api_error *e) {
    const json_t *fn = json_object_get(call, "function");
    if (!json_is_object(call) || !json_is_object(fn)) {
        api_seterr(e, APIE_INVALID, "messages", "tool_calls[%zu] must have a 'function' object", i);
        return false;
    }
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name) {
        api_seterr(e, APIE_INVALID, "messages", "tool_calls[%zu].function.name must be a string", i);
        return false;
    }
    const json_t *args = json_object_get(fn, "arguments");
    const char *id = json_string_value(json_object_get(call, "id"));
    bool ok = json_is_string(args)
                  ? creq_msgs_call(m, id, name, json_string_value(args), NULL)
                  : creq_msgs_call(m, id, name, NULL, args && !json_is_null(args) ? args : NULL);
    return ok || OOM(e);
}

static bool chat_message(creq_msgs *m, creq *r, const json_t *msg, size_t idx, api_error *e) {
    if (!json_is_object(msg)) {
        api_seterr(e, APIE_INVALID, "messages", "messages[%zu] must be an object", idx);
        return false;
    }
    const char *role = json_string_value(json_object_get(msg, "role"));
    if (!role) {
        api_seterr(e, APIE_INVALID, "messages", "messages[%zu].role must be a string", idx);
        return false;
    }
    sbuf text = {0};
    if (!creq_content_text(json_object_get(msg, "content"), &text)) {
        sb_free(&text);
        api_seterr(e, APIE_INVALID, "messages",
                   "messages[%zu].content must be a string or an array of content parts", idx);
        return false;
    }
    if (text.oom) {
        sb_free(&text);
        return OOM(e);
    }
    const char *t = text.data ? text.data : "";
    bool ok = true;
    if (!strcmp(role, "system") || !strcmp(role, "developer")) {
        ok = creq_msgs_system(m, t, text.len);
    } else if (!strcmp(role, "assistant")) {
        json_t *a = creq_msg("assistant", t, text.len);
        const json_t *rc = json_object_get(msg, "reasoning_content");
        if (!json_is_string(rc)) {
            rc = json_object_get(msg, "reasoning");
            if (json_is_string(rc)) r->echo_reasoning_as_reasoning = true;
        }
        if (a && json_is_string(rc)) json_object_set_new(a, "reasoning_content", json_string(json_string_value(rc)));
        ok = creq_msgs_push(m, a);
        const json_t *calls = json_object_get(msg, "tool_calls");
        if (ok && calls && !json_is_null(calls)) {
            if (!json_is_array(calls)) {
                sb_free(&text);
                api_seterr(e, APIE_INVALID, "messages", "messages[%zu].tool_calls must be an array", idx);
                return false;
            }
            size_t i;
            json_t *c;
            json_array_foreach(calls, i, c) if (!add_chat_call(m, c, i, e)) {
                sb_free(&text);
                return false;
            }
        }
        const json_t *fc = json_object_get(msg, "function_call"); /* legacy single call */
        if (ok && json_is_object(fc)) {
            json_t *wrap = json_pack("{s:s,s:O}", "id", "", "function", fc);
            ok = wrap && add_chat_call(m, wrap, 0, e);
            json_decref(wrap);
            if (!ok) {
                sb_free(&text);
                return false;
            }
        }
    } else if (!strcmp(role, "tool") || !strcmp(role, "function")) {
        json_t *tm = creq_msg("tool", t, text.len);
        creq_tool_result(m, tm, json_string_value(json_object_get(msg, "tool_call_id")),
                         json_string_value(json_object_get(msg, "name")));
        ok = creq_msgs_push(m, tm);
    } else {
        /* user, and any role we do not know: the user speaks */
        ok = creq_msgs_push(m, creq_msg("user", t, text.len));
    }
    sb_free(&text);
    return ok || OOM(e);
}

static bool chat_tools(const json_t *tools, creq *r, api_error *e) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) {
        api_seterr(e, APIE_INVALID, "tools", "'tools' must be an array");
        return false;
    }
    json_t *out = json_array();
    if (!out) return OOM(e);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *fn = json_object_get(t, "function");
        if (type && strcmp(type, "function")) continue; /* custom / hosted tools: not offered */
        if (!json_is_object(fn)) {
            json_decref(out);
            api_seterr(e, APIE_INVALID, "tools", "tools[%zu].function must be an object", i);
            return false;
        }
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || !*name) {
            json_decref(out);
            api_seterr(e, APIE_INVALID, "tools", "tools[%zu].function.name must be a non-empty string", i);
            return false;
        }
        json_t *params = json_object_get(fn, "parameters");
        json_t *nt = creq_function_tool(name, json_string_value(json_object_get(fn, "description")),
                                        json_is_object(params) ? params : NULL, fn);
        if (!nt || json_array_append_new(out, nt)) {
            json_decref(out);
            return OOM(e);
        }
    }
    if (json_array_size(out) == 0) {
        json_decref(out);
        return true;
    }
    r->tools = out;
    return true;
}

static bool chat_tool_choice(const json_t *tc, creq *r, api_error *e) {
    if (!tc || json_is_null(tc)) return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "auto")) r->tool_choice = CREQ_TOOLS_AUTO;
        else if (!strcmp(s, "none")) r->tool_choice = CREQ_TOOLS_NONE;
        else if (!strcmp(s, "required") || !strcmp(s, "any")) r->tool_choice = CREQ_TOOLS_REQUIRED;
        else {
            api_seterr(e, APIE_INVALID, "tool_choice", "unknown tool_choice '%s'", s);
            return false;
        }
        return true;
    }
    if (!json_is_object(tc)) {
        api_seterr(e, APIE_INVALID, "tool_choice", "'tool_choice' must be a string or an object");
        return false;
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    if (!name) name = json_string_value(json_object_get(tc, "name"));
    if (type && !strcmp(type, "allowed_tools")) {
        const char *mode = json_string_value(json_object_get(json_object_get(tc, "allowed_tools"), "mode"));
        if (!mode) mode = json_string_value(json_object_get(tc, "mode"));
        r->tool_choice = mode && !strcmp(mode, "required") ? CREQ_TOOLS_REQUIRED : CREQ_TOOLS_AUTO;
        return true;
    }
    if (!name) {
        api_seterr(e, APIE_INVALID, "tool_choice", "tool_choice object needs function.name");
        return false;
    }
    r->tool_choice = CREQ_TOOLS_NAMED;
    r->tool_name = creq_strdup(name);
    return r->tool_name || OOM(e);
}

static bool response_format(const json_t *rf, creq *r, api_error *e) {
    if (!rf || json_is_null(rf)) return true;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type) {
        api_seterr(e, APIE_INVALID, "response_format", "'response_format.type' must be a string");
        return false;
    }
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object")) {
        r->format = CREQ_FMT_JSON_OBJECT;
        return true;
    }
    if (!strcmp(type, "json_schema")) {
        const json_t *js = json_object_get(rf, "json_schema");
        if (!json_is_object(js)) js = rf; /* lenient: schema at the top level */
        return creq_set_schema(r, js, "response_format", e);
    }
    api_seterr(e, APIE_INVALID, "response_format", "unknown response_format type '%s'", type);
    return false;
}

/* chat_template_kwargs, reasoning_effort -> thinking. */
static bool thinking_fields(const json_t *body, creq *r, api_error *e) {
    const json_t *eff = json_object_get(body, "reasoning_effort");
    if (json_is_string(eff)) r->thinking = strcmp(json_string_value(eff), "none") ? 1 : 0;
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) {
            api_seterr(e, APIE_INVALID, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            return false;
        }
        r->template_kwargs = json_deep_copy(kw);
        const json_t *et = json_object_get(kw, "enable_thinking");
        if (json_is_boolean(et)) r->thinking = json_is_true(et);
    }
    return true;
}

bool creq_from_chat(const json_t *body, creq *r, api_error *e) {
    creq_init(r, API_CHAT);
    if (!json_is_object(body)) {
        api_seterr(e, APIE_INVALID, NULL, "the request body must be a JSON object");
        return false;
    }
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        api_seterr(e, APIE_INVALID, "messages", "'messages' must be a non-empty array");
        return false;
    }
    creq_msgs m;
    if (!creq_msgs_init(&m)) return OOM(e);
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg) if (!chat_message(&m, r, msg, i, e)) goto fail;
    if (!creq_msgs_finish(&m, r)) {
        OOM(e);
        goto fail;
    }
    const json_t *n = json_object_get(body, "n");
    if (json_is_integer(n) && json_integer_value(n) != 1) {
        api_seterr(e, APIE_INVALID, "n", "only n = 1 is supported");
        goto fail;
    }
    int32_t mt = -1, mct = -1;
    if (!creq_str_field(body, "model", &r->model, e) || !chat_tools(json_object_get(body, "tools"), r, e) ||
        !chat_tool_choice(json_object_get(body, "tool_choice"), r, e) ||
        !response_format(json_object_get(body, "response_format"), r, e) ||
        !creq_stops(json_object_get(body, "stop"), "stop", r, e) || !creq_sampling(body, r, e) ||
        !creq_int_field(body, "max_tokens", &mt, e) ||
        !creq_int_field(body, "max_completion_tokens", &mct, e) || !thinking_fields(body, r, e))
        goto fail;
    r->max_tokens = mct >= 0 ? mct : mt;
    const json_t *ptc = json_object_get(body, "parallel_tool_calls");
    if (json_is_boolean(ptc)) r->parallel_tool_calls = json_is_true(ptc);
    const json_t *so = json_object_get(body, "stream_options");
    r->include_usage = json_is_true(json_object_get(so, "include_usage"));
    if (r->tool_choice == CREQ_TOOLS_NAMED || r->tool_choice == CREQ_TOOLS_REQUIRED) {
        if (!r->tools) {
            api_seterr(e, APIE_INVALID, "tool_choice", "tool_choice requires 'tools'");
            goto fail;
        }
    }
    /* a trailing assistant message (without calls) is continued, not answered */
    json_t *last = json_array_get(r->messages, json_array_size(r->messages) - 1);
    const char *lr = json_string_value(json_object_get(last, "role"));
    r->prefill = lr && !strcmp(lr, "assistant") && !json_object_get(last, "tool_calls");
    return true;
fail:
    creq_msgs_free(&m);
    creq_free(r);
    return false;
}

bool creq_from_completions(const json_t *body, creq *r, api_error *e) {
    creq_init(r, API_COMPLETIONS);
    if (!json_is_object(body)) {
        api_seterr(e, APIE_INVALID, NULL, "the request body must be a JSON object");
        return false;
    }
    const json_t *p = json_object_get(body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* one prompt in a batch of one */
    if (json_is_string(p)) {
        r->prompt = creq_strdup(json_string_value(p));
        if (!r->prompt) return OOM(e);
    } else if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p), i;
        json_t *t;
        r->prompt_tokens = hn_malloc(n * sizeof(int32_t));
        if (!r->prompt_tokens) return OOM(e);
        json_array_foreach(p, i, t) {
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > 0x7fffffff) {
                api_seterr(e, APIE_INVALID, "prompt",
                           "'prompt' must be a string, or an array of token ids (one prompt only)");
                goto fail;
            }
            r->prompt_tokens[i] = (int32_t)json_integer_value(t);
        }
        r->n_prompt_tokens = (int32_t)n;
    } else {
        api_seterr(e, APIE_INVALID, "prompt", "'prompt' must be a non-empty string or token array");
        return false;
    }
    const json_t *n = json_object_get(body, "n");
    if (json_is_integer(n) && json_integer_value(n) != 1) {
        api_seterr(e, APIE_INVALID, "n", "only n = 1 is supported");
        goto fail;
    }
    if (!creq_str_field(body, "model", &r->model, e) || !creq_stops(json_object_get(body, "stop"), "stop", r, e) ||
        !creq_sampling(body, r, e) || !creq_int_field(body, "max_tokens", &r->max_tokens, e))
        goto fail;
    const json_t *so = json_object_get(body, "stream_options");
    r->include_usage = json_is_true(json_object_get(so, "include_usage"));
    return true;
fail:
    creq_free(r);
    return false;
}
