/* creq_anthropic.c: the Anthropic Messages API (Claude Code, Cline, Pi,
 * OpenCode's anthropic provider) and count_tokens -> creq.
 *
 * system (string or text blocks) becomes the leading system message (Claude
 * Code's billing block included: the chat layer removes it at render). User turns: text blocks are the user's text,
 * tool_result blocks become tool messages (placed before the turn's text,
 * since they answer the previous assistant turn). Assistant turns: text,
 * thinking (any signature: it is not checked) -> reasoning_content, tool_use
 * -> tool_calls with `input` kept as an object. A "system" role inside
 * messages (Claude Code sends them) stays in place. tool_choice: auto, any ->
 * required, tool -> named, none. thinking enabled/adaptive -> on, disabled -> off. */
#include <string.h>

#include "../core/alloc.h"
#include "creq_int.h"

#define OOM(e) creq_oom(e)

static bool system_field(creq_msgs *m, const json_t *sys, api_error *e) {
    if (!sys || json_is_null(sys)) return true;
    if (json_is_string(sys)) sys = json_pack("[{s:s,s:O}]", "type", "text", "text", sys);
    else if (json_is_array(sys)) json_incref((json_t *)sys);
    else {
        api_seterr(e, APIE_INVALID, "system", "'system' must be a string or an array of text blocks");
        return false;
    }
    if (!sys) return OOM(e);
    bool ok = true;
    size_t i;
    json_t *b;
    json_array_foreach(sys, i, b) {
        const char *t = json_string_value(json_object_get(b, "text"));
        if (!t) continue;
        if (*t) ok = ok && creq_msgs_system(m, t, strlen(t));
    }
    json_decref((json_t *)sys);
    return ok || OOM(e);
}

/* 'system' as a string or text blocks ({"type":"text","text":...}), as the API requires. */
static bool system_blocks_ok(const json_t *sys, api_error *e) {
    if (!json_is_array(sys)) return true; /* null, a string, or refused by system_field */
    size_t i;
    json_t *b;
    json_array_foreach(sys, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type || strcmp(type, "text") || !json_is_string(json_object_get(b, "text"))) {
            api_seterr(e, APIE_INVALID, "system", "system[%zu] must be a text block {\"type\":\"text\",\"text\":...}", i);
            return false;
        }
    }
    return true;
}

/* Text of a tool_result's content (string or blocks; images dropped). */
static bool tool_result(creq_msgs *m, const json_t *blk, size_t idx, api_error *e) {
    sbuf b = {0};
    if (!creq_content_text(json_object_get(blk, "content"), &b)) {
        sb_free(&b);
        api_seterr(e, APIE_INVALID, "messages", "messages[%zu]: tool_result content must be a string or blocks", idx);
        return false;
    }
    json_t *tm = creq_msg("tool", b.data ? b.data : "", b.len);
    sb_free(&b);
    creq_tool_result(m, tm, json_string_value(json_object_get(blk, "tool_use_id")), NULL);
    return creq_msgs_push(m, tm) || OOM(e);
}

static bool user_turn(creq_msgs *m, const json_t *content, size_t idx, api_error *e) {
    if (json_is_string(content))
        return creq_msgs_push(m, creq_msg("user", json_string_value(content), json_string_length(content))) ||
               OOM(e);
    sbuf text = {0};
    bool any_text = false, ok = true;
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!type) continue;
        if (!strcmp(type, "tool_result")) {
            ok = tool_result(m, blk, idx, e);
        } else if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(blk, "text");
            if (json_is_string(t)) {
                if (any_text) sb_add(&text, "\n", 1);
                sb_add(&text, json_string_value(t), json_string_length(t));
                any_text = true;
            }
        } else if (!strcmp(type, "mid_conv_system") || !strcmp(type, "system")) {
            sbuf s = {0};
            const json_t *c = json_object_get(blk, "content");
            if (!c) c = json_object_get(blk, "text");
            creq_content_text(c, &s);
            ok = creq_msgs_system(m, s.data ? s.data : "", s.len);
            sb_free(&s);
        }
        /* image, document, search_result, ...: not rendered */
        if (!ok) break;
    }
    if (ok && (any_text || json_array_size(content) == 0))
        ok = creq_msgs_push(m, creq_msg("user", text.data ? text.data : "", text.len)) || OOM(e);
    if (text.oom) ok = OOM(e);
    sb_free(&text);
    return ok;
}

static bool assistant_turn(creq_msgs *m, const json_t *content, api_error *e) {
    if (json_is_string(content))
        return creq_msgs_push(m, creq_msg("assistant", json_string_value(content), json_string_length(content))) ||
               OOM(e);
    sbuf text = {0}, think = {0};
    bool any_think = false;
    json_t *a = creq_msg("assistant", "", 0);
    if (!a || !creq_msgs_push(m, a)) return OOM(e);
    size_t i;
    json_t *blk;
    bool ok = true;
    json_array_foreach(content, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!type) continue;
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(blk, "text");
            if (json_is_string(t)) {
                if (text.len) sb_add(&text, "\n", 1);
                sb_add(&text, json_string_value(t), json_string_length(t));
            }
        } else if (!strcmp(type, "thinking")) {
            const json_t *t = json_object_get(blk, "thinking");
            if (json_is_string(t)) {
                if (think.len) sb_add(&think, "\n", 1);
                sb_add(&think, json_string_value(t), json_string_length(t));
                any_think = true;
            }
        } else if (!strcmp(type, "tool_use")) {
            const json_t *in = json_object_get(blk, "input");
            const char *name = json_string_value(json_object_get(blk, "name"));
            if (!name) {
                api_seterr(e, APIE_INVALID, "messages", "tool_use blocks need a 'name'");
                ok = false;
                break;
            }
            ok = (json_is_string(in) ? creq_msgs_call(m, json_string_value(json_object_get(blk, "id")), name,
                                                      json_string_value(in), NULL)
                                     : creq_msgs_call(m, json_string_value(json_object_get(blk, "id")), name,
                                                      NULL, json_is_object(in) ? in : NULL)) ||
                 OOM(e);
            if (!ok) break;
        }
        /* redacted_thinking, server_tool_use, *_tool_result: not rendered */
    }
    if (ok && (text.oom || think.oom)) ok = OOM(e);
    if (ok) {
        json_object_set_new(a, "content", json_stringn(text.data ? text.data : "", text.len));
        if (any_think) json_object_set_new(a, "reasoning_content", json_stringn(think.data, think.len));
    }
    sb_free(&text);
    sb_free(&think);
    return ok;
}

static bool msg_tools(const json_t *tools, creq *r, api_error *e) {
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
        if (type && strcmp(type, "custom")) continue; /* server tools (web_search_..., bash_...) */
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!name || !*name) {
            json_decref(out);
            api_seterr(e, APIE_INVALID, "tools", "tools[%zu].name must be a non-empty string", i);
            return false;
        }
        const json_t *schema = json_object_get(t, "input_schema");
        json_t *nt = creq_function_tool(name, json_string_value(json_object_get(t, "description")),
                                        json_is_object(schema) ? schema : NULL, NULL);
        if (!nt || json_array_append_new(out, nt)) {
            json_decref(out);
            return OOM(e);
        }
    }
    if (json_array_size(out)) r->tools = out;
    else json_decref(out);
    return true;
}

static bool msg_tool_choice(const json_t *tc, creq *r, api_error *e) {
    if (!tc || json_is_null(tc)) return true;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type) {
        api_seterr(e, APIE_INVALID, "tool_choice", "'tool_choice' must be an object with a 'type'");
        return false;
    }
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use"))) r->parallel_tool_calls = false;
    if (!strcmp(type, "auto")) r->tool_choice = CREQ_TOOLS_AUTO;
    else if (!strcmp(type, "any")) r->tool_choice = CREQ_TOOLS_REQUIRED;
    else if (!strcmp(type, "none")) r->tool_choice = CREQ_TOOLS_NONE;
    else if (!strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (!name) {
            api_seterr(e, APIE_INVALID, "tool_choice", "tool_choice of type 'tool' needs a 'name'");
            return false;
        }
        r->tool_choice = CREQ_TOOLS_NAMED;
        r->tool_name = creq_strdup(name);
        if (!r->tool_name) return OOM(e);
    } else {
        api_seterr(e, APIE_INVALID, "tool_choice", "unknown tool_choice type '%s'", type);
        return false;
    }
    return true;
}

bool creq_from_messages(const json_t *body, bool count_only, creq *r, api_error *e) {
    creq_init(r, API_MESSAGES);
    r->count_only = count_only;
    if (!json_is_object(body)) {
        api_seterr(e, APIE_INVALID, NULL, "the request body must be a JSON object");
        return false;
    }
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) {
        api_seterr(e, APIE_INVALID, "messages", "messages: field required (an array)");
        return false;
    }
    if (!count_only && json_array_size(msgs) == 0) {
        api_seterr(e, APIE_INVALID, "messages", "messages: at least one message is required");
        return false;
    }
    creq_msgs m;
    if (!creq_msgs_init(&m)) return OOM(e);
    if (!system_blocks_ok(json_object_get(body, "system"), e) || !system_field(&m, json_object_get(body, "system"), e))
        goto fail;
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg) {
        const char *role = json_string_value(json_object_get(msg, "role"));
        const json_t *content = json_object_get(msg, "content");
        if (!role) {
            api_seterr(e, APIE_INVALID, "messages", "messages.%zu.role: field required", i);
            goto fail;
        }
        if (!json_is_string(content) && !json_is_array(content)) {
            api_seterr(e, APIE_INVALID, "messages", "messages.%zu.content: must be a string or an array of blocks", i);
            goto fail;
        }
        bool ok;
        if (!strcmp(role, "assistant")) {
            ok = assistant_turn(&m, content, e);
        } else if (!strcmp(role, "system")) {
            sbuf s = {0};
            creq_content_text(content, &s);
            ok = creq_msgs_system(&m, s.data ? s.data : "", s.len) || OOM(e);
            sb_free(&s);
        } else {
            ok = user_turn(&m, content, i, e);
        }
        if (!ok) goto fail;
    }
    if (!creq_msgs_finish(&m, r)) {
        OOM(e);
        goto fail;
    }
    const json_t *mt = json_object_get(body, "max_tokens");
    if (!count_only && mt && !json_is_null(mt) && !json_is_integer(mt)) {
        api_seterr(e, APIE_INVALID, "max_tokens", "max_tokens: must be an integer");
        goto fail;
    }
    if (!creq_str_field(body, "model", &r->model, e) || !msg_tools(json_object_get(body, "tools"), r, e) ||
        !msg_tool_choice(json_object_get(body, "tool_choice"), r, e) ||
        !creq_stops(json_object_get(body, "stop_sequences"), "stop_sequences", r, e) ||
        !creq_sampling(body, r, e) || (!count_only && !creq_int_field(body, "max_tokens", &r->max_tokens, e)))
        goto fail;
    const json_t *th = json_object_get(body, "thinking");
    const char *tt = json_string_value(json_object_get(th, "type"));
    if (tt) {
        r->thinking = strcmp(tt, "disabled") ? 1 : 0;
        const json_t *bt = json_object_get(th, "budget_tokens");
        if (json_is_integer(bt) && json_integer_value(bt) > 0)
            r->thinking_budget = json_integer_value(bt) > 0x7fffffff ? 0x7fffffff : (int32_t)json_integer_value(bt);
    }
    const json_t *oc = json_object_get(body, "output_config");
    const json_t *fmt = json_object_get(oc, "format");
    if (json_is_object(fmt)) {
        const char *ft = json_string_value(json_object_get(fmt, "type"));
        if (!ft || !strcmp(ft, "json_schema")) {
            if (!creq_set_schema(r, fmt, "output_config.format", e)) goto fail;
        }
    }
    if ((r->tool_choice == CREQ_TOOLS_NAMED || r->tool_choice == CREQ_TOOLS_REQUIRED) && !r->tools) {
        api_seterr(e, APIE_INVALID, "tool_choice", "tool_choice requires 'tools'");
        goto fail;
    }
    json_t *last = json_array_get(r->messages, json_array_size(r->messages) - 1);
    const char *lr = json_string_value(json_object_get(last, "role"));
    r->prefill = !count_only && lr && !strcmp(lr, "assistant") && !json_object_get(last, "tool_calls");
    return true;
fail:
    creq_msgs_free(&m);
    creq_free(r);
    return false;
}
