/* creq_responses.c: the OpenAI Responses API (what Codex speaks) -> creq.
 *
 * Stateless: `previous_response_id` is refused (nothing is stored). Input
 * items map as: message -> a message of its role (developer/system text is
 * system text), function_call -> a tool call on the assistant turn,
 * function_call_output -> a tool message, reasoning -> reasoning_content of
 * the next assistant turn, custom_tool_call(_output) -> a call with
 * {"input": ...} and its result. Hosted tools (web_search, ...) are not
 * offered; `namespace` tools are flattened into their functions. */
#include <string.h>

#include "../core/alloc.h"
#include "creq_int.h"

#define OOM(e) creq_oom(e)

static bool text_of(const json_t *v, sbuf *b, const char *what, size_t idx, api_error *e) {
    if (!creq_content_text(v, b)) {
        api_seterr(e, APIE_INVALID, "input", "input[%zu].%s must be a string or content parts", idx, what);
        return false;
    }
    return !b->oom || OOM(e);
}

static bool add_reasoning(creq_msgs *m, const json_t *it) {
    sbuf b = {0};
    const json_t *content = json_object_get(it, "content");
    if (json_is_array(content) && json_array_size(content)) creq_content_text(content, &b);
    if (b.len == 0) creq_content_text(json_object_get(it, "summary"), &b);
    if (b.oom) {
        sb_free(&b);
        return false;
    }
    /* a reasoning item is replayed even when empty (encrypted only) */
    bool ok = creq_msgs_reasoning(m, b.data ? b.data : "", b.len);
    sb_free(&b);
    return ok;
}

static bool input_item(creq_msgs *m, const json_t *it, size_t idx, api_error *e) {
    if (!json_is_object(it)) {
        api_seterr(e, APIE_INVALID, "input", "input[%zu] must be an object", idx);
        return false;
    }
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!type || !strcmp(type, "message")) {
        if (!role) {
            api_seterr(e, APIE_INVALID, "input", "input[%zu].role must be a string", idx);
            return false;
        }
        sbuf b = {0};
        if (!text_of(json_object_get(it, "content"), &b, "content", idx, e)) {
            sb_free(&b);
            return false;
        }
        const char *t = b.data ? b.data : "";
        bool ok;
        if (!strcmp(role, "system") || !strcmp(role, "developer"))
            ok = creq_msgs_system(m, t, b.len);
        else if (!strcmp(role, "assistant"))
            ok = creq_msgs_assistant_text(m, t, b.len, NULL);
        else
            ok = creq_msgs_push(m, creq_msg("user", t, b.len));
        sb_free(&b);
        return ok || OOM(e);
    }
    if (!strcmp(type, "function_call") || !strcmp(type, "custom_tool_call")) {
        const char *name = json_string_value(json_object_get(it, "name"));
        const char *id = json_string_value(json_object_get(it, "call_id"));
        if (!name) {
            api_seterr(e, APIE_INVALID, "input", "input[%zu].name must be a string", idx);
            return false;
        }
        bool ok;
        if (!strcmp(type, "custom_tool_call")) {
            const char *in = json_string_value(json_object_get(it, "input"));
            json_t *args = json_pack("{s:s}", "input", in ? in : "");
            ok = args && creq_msgs_call(m, id, name, NULL, args);
            json_decref(args);
        } else {
            const json_t *a = json_object_get(it, "arguments");
            ok = json_is_string(a) ? creq_msgs_call(m, id, name, json_string_value(a), NULL)
                                   : creq_msgs_call(m, id, name, NULL, json_is_null(a) ? NULL : a);
        }
        return ok || OOM(e);
    }
    if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output")) {
        sbuf b = {0};
        if (!text_of(json_object_get(it, "output"), &b, "output", idx, e)) {
            sb_free(&b);
            return false;
        }
        json_t *tm = creq_msg("tool", b.data ? b.data : "", b.len);
        sb_free(&b);
        creq_tool_result(m, tm, json_string_value(json_object_get(it, "call_id")), NULL);
        return creq_msgs_push(m, tm) || OOM(e);
    }
    if (!strcmp(type, "reasoning")) return add_reasoning(m, it) || OOM(e);
    return true; /* item_reference, web_search_call, local_shell_call, ...: nothing to render */
}

static bool add_fn(json_t *out, const json_t *t, api_error *e) {
    const char *name = json_string_value(json_object_get(t, "name"));
    if (!name || !*name) {
        api_seterr(e, APIE_INVALID, "tools", "function tools need a non-empty 'name'");
        return false;
    }
    const json_t *params = json_object_get(t, "parameters");
    json_t *nt = creq_function_tool(name, json_string_value(json_object_get(t, "description")),
                                    json_is_object(params) ? params : NULL, t);
    return (nt && !json_array_append_new(out, nt)) || OOM(e);
}

static bool resp_tools(const json_t *tools, creq *r, api_error *e) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) {
        api_seterr(e, APIE_INVALID, "tools", "'tools' must be an array");
        return false;
    }
    json_t *out = json_array();
    if (!out) return OOM(e);
    size_t i, j;
    json_t *t, *u;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        bool ok = true;
        if (type && !strcmp(type, "function")) {
            /* chat-style {"type":"function","function":{...}} is accepted too */
            const json_t *fn = json_object_get(t, "function");
            ok = add_fn(out, json_is_object(fn) ? fn : t, e);
        } else if (type && !strcmp(type, "namespace")) {
            json_array_foreach(json_object_get(t, "tools"), j, u) {
                const char *ut = json_string_value(json_object_get(u, "type"));
                if (ok && (!ut || !strcmp(ut, "function"))) ok = add_fn(out, u, e);
            }
        } else if (type && !strcmp(type, "custom")) {
            /* freeform tool: offered as a function taking the text as "input" */
            const char *name = json_string_value(json_object_get(t, "name"));
            if (name) {
                json_t *params = json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties",
                                           "input", "type", "string", "required", "input");
                json_t *nt = creq_function_tool(name, json_string_value(json_object_get(t, "description")),
                                                params, NULL);
                json_decref(params);
                ok = (nt && !json_array_append_new(out, nt)) || OOM(e);
                if (ok && !r->custom_tools) r->custom_tools = json_array();
                if (ok && r->custom_tools) json_array_append_new(r->custom_tools, json_string(name));
            }
        }
        if (!ok) {
            json_decref(out);
            return false;
        }
    }
    if (json_array_size(out)) r->tools = out;
    else json_decref(out);
    return true;
}

static bool resp_tool_choice(const json_t *tc, creq *r, api_error *e) {
    if (!tc || json_is_null(tc)) return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "none")) r->tool_choice = CREQ_TOOLS_NONE;
        else if (!strcmp(s, "required")) r->tool_choice = CREQ_TOOLS_REQUIRED;
        else if (!strcmp(s, "auto")) r->tool_choice = CREQ_TOOLS_AUTO;
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
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (type && (!strcmp(type, "function") || !strcmp(type, "custom")) && name) {
        r->tool_choice = CREQ_TOOLS_NAMED;
        r->tool_name = creq_strdup(name);
        return r->tool_name || OOM(e);
    }
    if (type && !strcmp(type, "allowed_tools")) {
        const char *mode = json_string_value(json_object_get(tc, "mode"));
        r->tool_choice = mode && !strcmp(mode, "required") ? CREQ_TOOLS_REQUIRED : CREQ_TOOLS_AUTO;
    }
    return true;
}

bool creq_from_responses(const json_t *body, creq *r, api_error *e) {
    creq_init(r, API_RESPONSES);
    if (!json_is_object(body)) {
        api_seterr(e, APIE_INVALID, NULL, "the request body must be a JSON object");
        return false;
    }
    const json_t *prev = json_object_get(body, "previous_response_id");
    if (prev && !json_is_null(prev)) {
        api_seterr(e, APIE_INVALID, "previous_response_id",
                   "previous_response_id is not supported: this server stores no responses; send the "
                   "whole conversation in 'input' (store: false)");
        return false;
    }
    const json_t *input = json_object_get(body, "input");
    if (!json_is_string(input) && !(json_is_array(input) && json_array_size(input))) {
        api_seterr(e, APIE_INVALID, "input", "'input' must be a string or a non-empty array of items");
        return false;
    }
    creq_msgs m;
    if (!creq_msgs_init(&m)) return OOM(e);
    const json_t *ins = json_object_get(body, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) {
            api_seterr(e, APIE_INVALID, "instructions", "'instructions' must be a string");
            goto fail;
        }
        if (!creq_msgs_system(&m, json_string_value(ins), json_string_length(ins))) {
            OOM(e);
            goto fail;
        }
    }
    if (json_is_string(input)) {
        if (!creq_msgs_push(&m, creq_msg("user", json_string_value(input), json_string_length(input)))) {
            OOM(e);
            goto fail;
        }
    } else {
        size_t i;
        json_t *it;
        json_array_foreach(input, i, it) if (!input_item(&m, it, i, e)) goto fail;
    }
    if (!creq_msgs_finish(&m, r)) {
        OOM(e);
        goto fail;
    }
    if (!creq_str_field(body, "model", &r->model, e) || !resp_tools(json_object_get(body, "tools"), r, e) ||
        !resp_tool_choice(json_object_get(body, "tool_choice"), r, e) || !creq_sampling(body, r, e) ||
        !creq_int_field(body, "max_output_tokens", &r->max_tokens, e))
        goto fail;
    const json_t *ptc = json_object_get(body, "parallel_tool_calls");
    if (json_is_boolean(ptc)) r->parallel_tool_calls = json_is_true(ptc);
    const json_t *reasoning = json_object_get(body, "reasoning");
    const json_t *eff = json_object_get(reasoning, "effort");
    if (json_is_string(eff)) r->thinking = strcmp(json_string_value(eff), "none") ? 1 : 0;
    const json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    if (json_is_object(fmt)) {
        const char *ft = json_string_value(json_object_get(fmt, "type"));
        if (ft && !strcmp(ft, "json_object")) r->format = CREQ_FMT_JSON_OBJECT;
        else if (ft && !strcmp(ft, "json_schema") && !creq_set_schema(r, fmt, "text.format", e)) goto fail;
    }
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (json_is_object(kw)) {
        r->template_kwargs = json_deep_copy(kw);
        const json_t *et = json_object_get(kw, "enable_thinking");
        if (json_is_boolean(et)) r->thinking = json_is_true(et);
    }
    if ((r->tool_choice == CREQ_TOOLS_NAMED || r->tool_choice == CREQ_TOOLS_REQUIRED) && !r->tools) {
        api_seterr(e, APIE_INVALID, "tool_choice", "tool_choice requires 'tools'");
        goto fail;
    }
    return true;
fail:
    creq_msgs_free(&m);
    creq_free(r);
    return false;
}
