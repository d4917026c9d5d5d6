/* creq.c: the normalised chat request: shared helpers, message builder,
 * sampling fields (see creq.h). */
#include "creq_int.h"

#include <math.h>
#include <string.h>

#include "../core/alloc.h"

char *creq_strdup(const char *s) { return s ? hn_strdup(s) : NULL; }

void creq_init(creq *r, api_kind api) {
    memset(r, 0, sizeof *r);
    r->api = api;
    r->max_tokens = -1;
    r->thinking = -1;
    r->parallel_tool_calls = true;
}

json_t *creq_msg(const char *role, const char *text, size_t len) {
    json_t *m = json_object();
    if (!m) return NULL;
    if (json_object_set_new(m, "role", json_string(role)) ||
        json_object_set_new(m, "content", json_stringn(text ? text : "", text ? len : 0))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

bool creq_content_text(const json_t *content, sbuf *out) {
    if (!content || json_is_null(content)) return true;
    if (json_is_string(content)) {
        sb_add(out, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content)) return false;
    size_t i;
    json_t *part;
    bool first = true;
    json_array_foreach(content, i, part) {
        const json_t *t = NULL;
        if (json_is_string(part)) {
            t = part;
        } else if (json_is_object(part)) {
            const char *type = json_string_value(json_object_get(part, "type"));
            /* text-bearing parts; images, files, audio are dropped */
            if (!type || !strcmp(type, "text") || !strcmp(type, "input_text") ||
                !strcmp(type, "output_text") || !strcmp(type, "refusal") ||
                !strcmp(type, "reasoning_text") || !strcmp(type, "summary_text"))
                t = json_object_get(part, !type || strcmp(type, "refusal") ? "text" : "refusal");
        }
        if (!json_is_string(t)) continue;
        if (!first) sb_add(out, "\n", 1);
        sb_add(out, json_string_value(t), json_string_length(t));
        first = false;
    }
    return true;
}

json_t *creq_parse_args(const char *text) {
    if (!text) return json_object();
    const char *p = text;
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    if (!*p) return json_object();
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    if (v) return v;
    return json_string(text);
}

bool creq_msgs_init(creq_msgs *m) {
    memset(m, 0, sizeof *m);
    m->arr = json_array();
    m->names = json_object();
    m->turn_names = json_object();
    return m->arr && m->names && m->turn_names;
}

/* Puts the text appended to the last assistant message into its content. */
static bool flush_text(creq_msgs *m) {
    if (!m->text_of) return true;
    json_t *a = m->text_of;
    m->text_of = NULL;
    bool ok = !m->text.oom && !json_object_set_new(a, "content", json_stringn(m->text.data ? m->text.data : "", m->text.len));
    sb_reset(&m->text);
    return ok;
}

static bool flush_sys(creq_msgs *m) {
    if (m->started) return true;
    m->started = true;
    if (!m->has_sys) return true;
    json_t *s = creq_msg("system", m->sys.data, m->sys.len);
    if (!s || m->sys.oom) {
        json_decref(s);
        return false;
    }
    return json_array_insert_new(m->arr, 0, s) == 0;
}

bool creq_msgs_system(creq_msgs *m, const char *text, size_t len) {
    if (!m->started) {
        if (m->has_sys && m->sys.len && len) sb_add(&m->sys, "\n\n", 2);
        sb_add(&m->sys, text, len);
        m->has_sys = true;
        return !m->sys.oom;
    }
    json_t *s = creq_msg("system", text, len);
    if (!flush_text(m)) {
        json_decref(s);
        return false;
    }
    return s && json_array_append_new(m->arr, s) == 0;
}

const char *creq_call_name(const json_t *msgs, const char *id) {
    if (!id) return NULL;
    for (size_t i = json_array_size(msgs); i-- > 0;) {
        const json_t *calls = json_object_get(json_array_get(msgs, i), "tool_calls");
        size_t j;
        json_t *c;
        json_array_foreach(calls, j, c) {
            const char *cid = json_string_value(json_object_get(c, "id"));
            const char *nm = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
            if (cid && nm && !strcmp(cid, id)) return nm;
        }
    }
    return NULL;
}

/* creq_call_name(m->arr, id) from the index of the calls. */
static const char *indexed_call_name(const creq_msgs *m, const char *id) {
    if (!id) return NULL;
    const json_t *nm = json_object_get(m->turn_names, id);
    if (!nm) nm = json_object_get(m->names, id);
    return json_string_value(nm);
}

/* Indexes a call just added to message a: the first of a's calls with its
 * id, over those of earlier messages. */
static bool index_call(creq_msgs *m, const json_t *a, const json_t *call) {
    const char *id = json_string_value(json_object_get(call, "id"));
    json_t *nm = json_object_get(json_object_get(call, "function"), "name");
    if (!id || !json_is_string(nm)) return true; /* not a named call: creq_call_name skips it */
    if (a != m->turn_of) { /* a later message: its calls win over those before */
        if (json_object_update(m->names, m->turn_names)) return false;
        json_object_clear(m->turn_names);
        m->turn_of = a;
    }
    if (json_object_get(m->turn_names, id)) return true;
    return json_object_set_nocheck(m->turn_names, id, nm) == 0;
}

void creq_tool_result(creq_msgs *m, json_t *tm, const char *id, const char *name) {
    if (!tm) return;
    if (!name) name = indexed_call_name(m, id);
    if (id) json_object_set_new(tm, "tool_call_id", json_string(id));
    if (name) json_object_set_new(tm, "name", json_string(name));
}

bool creq_msgs_push(creq_msgs *m, json_t *msg) {
    if (!msg) return false;
    if (!flush_sys(m) || !flush_text(m)) {
        json_decref(msg);
        return false;
    }
    /* a pending Responses reasoning item belongs to the next assistant turn */
    const char *role = json_string_value(json_object_get(msg, "role"));
    if (m->has_reasoning && role && !strcmp(role, "assistant")) {
        if (m->reasoning.oom) {
            json_decref(msg);
            return false;
        }
        json_object_set_new(msg, "reasoning_content", json_string(m->reasoning.data ? m->reasoning.data : ""));
        sb_free(&m->reasoning);
        m->has_reasoning = false;
    }
    return json_array_append_new(m->arr, msg) == 0;
}

bool creq_msgs_reasoning(creq_msgs *m, const char *text, size_t len) {
    if (m->has_reasoning && len) sb_add(&m->reasoning, "\n", 1);
    sb_add(&m->reasoning, text, len);
    m->has_reasoning = true;
    return !m->reasoning.oom;
}

json_t *creq_msgs_last(creq_msgs *m, const char *role) {
    size_t n = json_array_size(m->arr);
    if (!n || !m->started) return NULL;
    json_t *last = json_array_get(m->arr, n - 1);
    const char *r = json_string_value(json_object_get(last, "role"));
    return r && !strcmp(r, role) ? last : NULL;
}

bool creq_msgs_call(creq_msgs *m, const char *id, const char *name, const char *args_text,
                    const json_t *args) {
    json_t *a = creq_msgs_last(m, "assistant");
    if (!a) {
        if (!creq_msgs_push(m, creq_msg("assistant", "", 0))) return false;
        a = creq_msgs_last(m, "assistant");
    }
    json_t *calls = json_object_get(a, "tool_calls");
    if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(a, "tool_calls", calls)) return false;
    }
    json_t *fn = json_object();
    json_t *call = json_object();
    if (!fn || !call) {
        json_decref(fn);
        json_decref(call);
        return false;
    }
    json_object_set_new(fn, "name", json_string(name ? name : ""));
    json_object_set_new(fn, "arguments", args ? json_deep_copy(args) : creq_parse_args(args_text));
    json_object_set_new(call, "id", json_string(id ? id : ""));
    json_object_set_new(call, "type", json_string("function"));
    json_object_set_new(call, "function", fn);
    return json_array_append_new(calls, call) == 0 && index_call(m, a, call);
}

bool creq_msgs_assistant_text(creq_msgs *m, const char *text, size_t len, const char *reasoning) {
    json_t *a = creq_msgs_last(m, "assistant");
    if (a && (json_object_get(a, "tool_calls") || (reasoning && json_object_get(a, "reasoning_content"))))
        a = NULL; /* text after calls, or a second reasoning: a new turn */
    if (!a) {
        if (!creq_msgs_push(m, creq_msg("assistant", "", 0))) return false;
        a = creq_msgs_last(m, "assistant");
    }
    if (len) {
        if (a != m->text_of) { /* the last message: no text of another waits */
            const json_t *old = json_object_get(a, "content");
            sb_reset(&m->text);
            sb_add(&m->text, json_string_value(old) ? json_string_value(old) : "", json_string_length(old));
            m->text_of = a;
        }
        if (m->text.len) sb_add(&m->text, "\n", 1);
        sb_add(&m->text, text, len);
        if (m->text.oom) return false;
    }
    if (reasoning) json_object_set_new(a, "reasoning_content", json_string(reasoning));
    return true;
}

bool creq_msgs_finish(creq_msgs *m, creq *r) {
    bool ok = flush_sys(m) && flush_text(m);
    if (ok && m->has_reasoning) { /* reasoning with nothing after it: its own turn */
        json_t *a = creq_msg("assistant", "", 0);
        ok = creq_msgs_push(m, a);
    }
    if (ok) {
        r->messages = m->arr;
        m->arr = NULL;
    }
    creq_msgs_free(m);
    return ok;
}

void creq_msgs_free(creq_msgs *m) {
    json_decref(m->arr);
    sb_free(&m->sys);
    sb_free(&m->reasoning);
    sb_free(&m->text);
    json_decref(m->names);
    json_decref(m->turn_names);
    memset(m, 0, sizeof *m);
}

/* ---- fields ---- */

static bool num_field(const json_t *body, const char *key, bool *has, float *out, double lo,
                      double hi, api_error *e) {
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        api_seterr(e, APIE_INVALID, key, "'%s' must be a number", key);
        return false;
    }
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi) {
        api_seterr(e, APIE_INVALID, key, "'%s' must be between %g and %g", key, lo, hi);
        return false;
    }
    *has = true;
    *out = (float)d;
    return true;
}

bool creq_int_field(const json_t *body, const char *key, int32_t *out, api_error *e) {
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return true;
    double d = json_is_number(v) ? json_number_value(v) : -1;
    if (!json_is_number(v) || d < 0 || d != floor(d)) {
        api_seterr(e, APIE_INVALID, key, "'%s' must be a non-negative integer", key);
        return false;
    }
    *out = d > 2147483647.0 ? 2147483647 : (int32_t)d;
    return true;
}

bool creq_str_field(const json_t *o, const char *key, char **out, api_error *e) {
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) {
        api_seterr(e, APIE_INVALID, key, "'%s' must be a string", key);
        return false;
    }
    *out = creq_strdup(json_string_value(v));
    if (!*out) {
        api_seterr(e, APIE_INTERNAL, NULL, "out of memory");
        return false;
    }
    return true;
}

bool creq_sampling(const json_t *body, creq *r, api_error *e) {
    /* each API's own range (OpenAI 0..2, Anthropic 0..1), as their servers check */
    if (!num_field(body, "temperature", &r->has_temp, &r->temp, 0, r->api == API_MESSAGES ? 1 : 2, e)) return false;
    if (!num_field(body, "top_p", &r->has_top_p, &r->top_p, 0, 1, e)) return false;
    if (!num_field(body, "min_p", &r->has_min_p, &r->min_p, 0, 1, e)) return false;
    if (!num_field(body, "presence_penalty", &r->has_presence, &r->presence_penalty, -2, 2, e))
        return false;
    if (!num_field(body, "frequency_penalty", &r->has_frequency, &r->frequency_penalty, -2, 2, e))
        return false;
    const json_t *k = json_object_get(body, "top_k");
    if (k && !json_is_null(k)) {
        if (!json_is_integer(k)) {
            api_seterr(e, APIE_INVALID, "top_k", "'top_k' must be an integer");
            return false;
        }
        json_int_t kv = json_integer_value(k);
        r->has_top_k = true;
        r->top_k = kv < 0 ? 0 : kv > 1000000 ? 1000000 : (int32_t)kv;
    }
    const json_t *s = json_object_get(body, "seed");
    if (s && !json_is_null(s)) {
        if (!json_is_integer(s)) {
            api_seterr(e, APIE_INVALID, "seed", "'seed' must be an integer");
            return false;
        }
        r->has_seed = true;
        r->seed = (uint64_t)json_integer_value(s);
    }
    const json_t *st = json_object_get(body, "stream");
    if (st && !json_is_null(st)) {
        if (!json_is_boolean(st)) {
            api_seterr(e, APIE_INVALID, "stream", "'stream' must be a boolean");
            return false;
        }
        r->stream = json_is_true(st);
    }
    return true;
}

bool creq_stops(const json_t *v, const char *param, creq *r, api_error *e) {
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return true;
        r->stop[r->n_stop] = creq_strdup(json_string_value(v));
        if (!r->stop[r->n_stop]) return creq_oom(e);
        r->n_stop++;
        return true;
    }
    if (!json_is_array(v)) {
        api_seterr(e, APIE_INVALID, param, "'%s' must be a string or an array of strings", param);
        return false;
    }
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) {
            api_seterr(e, APIE_INVALID, param, "'%s' must hold strings", param);
            return false;
        }
        if (json_string_length(s) == 0) continue;
        if (r->n_stop >= CREQ_MAX_STOP) {
            api_seterr(e, APIE_INVALID, param, "at most %d stop sequences", CREQ_MAX_STOP);
            return false;
        }
        r->stop[r->n_stop] = creq_strdup(json_string_value(s));
        if (!r->stop[r->n_stop]) return creq_oom(e);
        r->n_stop++;
    }
    return true;
}

json_t *creq_function_tool(const char *name, const char *description, const json_t *parameters,
                           const json_t *src) {
    json_t *fn = json_object();
    json_t *t = json_object();
    if (!fn || !t) {
        json_decref(fn);
        json_decref(t);
        return NULL;
    }
    json_object_set_new(fn, "name", json_string(name));
    if (description) json_object_set_new(fn, "description", json_string(description));
    json_object_set_new(fn, "parameters",
                        parameters ? json_deep_copy(parameters)
                                   : json_pack("{s:s,s:{}}", "type", "object", "properties"));
    /* keep other fields the client gave (strict, ...) after the main ones */
    if (src) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)src, k, v) {
            if (!strcmp(k, "type") || !strcmp(k, "name") || !strcmp(k, "description") ||
                !strcmp(k, "parameters") || !strcmp(k, "input_schema") || !strcmp(k, "cache_control") ||
                !strcmp(k, "function"))
                continue;
            json_object_set(fn, k, v);
        }
    }
    json_object_set_new(t, "type", json_string("function"));
    json_object_set_new(t, "function", fn);
    return t;
}

bool creq_set_schema(creq *r, const json_t *holder, const char *param, api_error *e) {
    const json_t *schema = json_object_get(holder, "schema");
    if (!schema) {
        /* Anthropic output_config.format may carry the schema itself */
        r->format = CREQ_FMT_JSON_OBJECT;
        return true;
    }
    if (!json_is_object(schema) && !json_is_boolean(schema)) {
        api_seterr(e, APIE_INVALID, param, "'%s' schema must be a JSON Schema object", param);
        return false;
    }
    json_decref(r->schema);
    r->schema = json_deep_copy(schema);
    r->format = CREQ_FMT_JSON_SCHEMA;
    return r->schema != NULL;
}

bool creq_parse(api_kind api, bool count_only, const json_t *body, creq *r, api_error *e) {
    switch (api) {
    case API_CHAT: return creq_from_chat(body, r, e);
    case API_COMPLETIONS: return creq_from_completions(body, r, e);
    case API_RESPONSES: return creq_from_responses(body, r, e);
    case API_MESSAGES: return creq_from_messages(body, count_only, r, e);
    }
    api_seterr(e, APIE_INTERNAL, NULL, "unknown API");
    return false;
}

void creq_free(creq *r) {
    hn_free(r->model);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->custom_tools);
    hn_free(r->prompt);
    hn_free(r->prompt_tokens);
    hn_free(r->tool_name);
    json_decref(r->schema);
    for (int i = 0; i < r->n_stop; i++) hn_free(r->stop[i]);
    json_decref(r->template_kwargs);
    memset(r, 0, sizeof *r);
}
