/* toolcall_json.c: the JSON side of tool-call parsing. Reads the offered tools,
 * parses the model's not-quite-JSON (single quotes, Python literals, trailing
 * commas, raw newlines inside strings, unclosed brackets), coerces values to a
 * tool's JSON schema, and prints compact JSON text. Private to toolcall*.c. */
#include "toolcall_int.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"

#define TC_MAX_DEPTH 64

/* ---- byte buffer ---- */

hn_status tc_buf_add(tc_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) {
            if (cap > ((size_t)-1) / 2) return HN_ERR_NOMEM;
            cap *= 2;
        }
        char *q = hn_realloc(b->p, cap);
        if (!q) return HN_ERR_NOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return HN_OK;
}

hn_status tc_buf_adds(tc_buf *b, const char *s) { return tc_buf_add(b, s, strlen(s)); }

void tc_buf_clear(tc_buf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void tc_buf_free(tc_buf *b) {
    hn_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

hn_status tc_buf_add_escaped(tc_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    hn_status st = HN_OK;
    while (i < n && st == HN_OK) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : utf8_seq(u + i, n - i);
        const char *esc = NULL;
        char tmp[8];
        if (len == 0) esc = "\\ufffd", len = 1;
        else if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        }
        if (esc) {
            st = tc_buf_add(b, s + run, i - run);
            if (st == HN_OK) st = tc_buf_adds(b, esc);
            i += len;
            run = i;
        } else {
            i += len;
        }
    }
    if (st == HN_OK) st = tc_buf_add(b, s + run, n - run);
    return st;
}

/* ---- tools ---- */

hn_status tc_tools_load(tc_tools *t, const json_t *tools) {
    t->v = NULL;
    t->n = 0;
    if (!json_is_array(tools) || json_array_size(tools) == 0) return HN_OK;
    size_t cap = json_array_size(tools);
    t->v = hn_calloc(cap, sizeof *t->v);
    if (!t->v) return HN_ERR_NOMEM;
    for (size_t i = 0; i < cap; i++) {
        const json_t *e = json_array_get(tools, i);
        const json_t *fn = json_object_get(e, "function");
        if (json_is_object(fn)) e = fn;
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || !*name) continue;
        const json_t *schema = json_object_get(e, "parameters");
        if (!json_is_object(schema)) schema = json_object_get(e, "input_schema");
        tc_tool *tool = &t->v[t->n];
        tool->name = hn_strdup(name);
        if (!tool->name) return HN_ERR_NOMEM;
        tool->schema = json_is_object(schema) ? json_deep_copy(schema) : NULL;
        if (json_is_object(schema) && !tool->schema) {
            hn_free(tool->name);
            return HN_ERR_NOMEM;
        }
        t->n++;
    }
    return HN_OK;
}

void tc_tools_free(tc_tools *t) {
    for (int i = 0; i < t->n; i++) {
        hn_free(t->v[i].name);
        json_decref(t->v[i].schema);
    }
    hn_free(t->v);
    t->v = NULL;
    t->n = 0;
}

const tc_tool *tc_tools_find(const tc_tools *t, const char *name, size_t len) {
    for (int i = 0; i < t->n; i++)
        if (strlen(t->v[i].name) == len && memcmp(t->v[i].name, name, len) == 0) return &t->v[i];
    return NULL;
}

/* ---- schemas ---- */

enum { T_STR = 1, T_INT = 2, T_NUM = 4, T_BOOL = 8, T_OBJ = 16, T_ARR = 32, T_NULL = 64 };

static unsigned type_bit(const char *s) {
    if (!s) return 0;
    if (!strcmp(s, "string")) return T_STR;
    if (!strcmp(s, "integer")) return T_INT;
    if (!strcmp(s, "number")) return T_NUM;
    if (!strcmp(s, "boolean")) return T_BOOL;
    if (!strcmp(s, "object")) return T_OBJ;
    if (!strcmp(s, "array")) return T_ARR;
    if (!strcmp(s, "null")) return T_NULL;
    return 0;
}

static unsigned value_bits(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT | T_NUM;
    case JSON_REAL: return T_NUM;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    default: return T_NULL;
    }
}

/* The set of types a schema allows (0: unknown / anything). */
static unsigned schema_types_d(const json_t *s, int depth) {
    if (!json_is_object(s) || depth > TC_MAX_DEPTH) return 0;
    const json_t *ty = json_object_get(s, "type");
    unsigned t = 0;
    if (json_is_string(ty)) t = type_bit(json_string_value(ty));
    else if (json_is_array(ty)) {
        size_t i;
        const json_t *e;
        json_array_foreach(ty, i, e) t |= type_bit(json_string_value(e));
    }
    if (t) return t;
    static const char *const combos[] = {"anyOf", "oneOf", "allOf"};
    for (int c = 0; c < 3; c++) {
        const json_t *arr = json_object_get(s, combos[c]);
        size_t i;
        const json_t *e;
        if (!json_is_array(arr)) continue;
        json_array_foreach(arr, i, e) {
            unsigned b = schema_types_d(e, depth + 1);
            if (!b) return 0;
            t |= b;
        }
        if (t) return t;
    }
    const json_t *en = json_object_get(s, "enum");
    if (json_is_array(en)) {
        size_t i;
        const json_t *e;
        json_array_foreach(en, i, e) t |= value_bits(e) & ~(unsigned)(json_is_integer(e) ? T_NUM : 0);
        return t;
    }
    if (json_object_get(s, "const")) return value_bits(json_object_get(s, "const"));
    if (json_object_get(s, "properties")) return T_OBJ;
    if (json_object_get(s, "items")) return T_ARR;
    return 0;
}

static unsigned schema_types(const json_t *s) { return schema_types_d(s, 0); }

/* For anyOf/oneOf: the first branch that allows v's type, else s itself. */
static const json_t *pick_branch(const json_t *s, const json_t *v) {
    static const char *const combos[] = {"anyOf", "oneOf"};
    for (int c = 0; c < 2; c++) {
        const json_t *arr = json_object_get(s, combos[c]);
        size_t i;
        const json_t *e;
        if (!json_is_array(arr)) continue;
        json_array_foreach(arr, i, e) if (schema_types(e) & value_bits(v)) return e;
    }
    return s;
}

const json_t *tc_schema_prop(const json_t *schema, const char *pname) {
    const json_t *props = json_object_get(schema, "properties");
    const json_t *p = json_object_get(props, pname);
    if (json_is_object(p)) return p;
    p = json_object_get(schema, "additionalProperties");
    return json_is_object(p) ? p : NULL;
}

int tc_schema_is_string(const json_t *schema) {
    unsigned t = schema_types(schema);
    return (t & T_STR) && !(t & ~(unsigned)(T_STR | T_NULL));
}

/* ---- lenient JSON ---- */

/* Rewrites s into strict JSON text in out (see tc_json_parse_lenient). */
static hn_status repair(tc_buf *out, const char *s, size_t n, int close_open) {
    char stack[TC_MAX_DEPTH];
    int depth = 0;
    size_t i = 0;
    hn_status st = HN_OK;
    while (i < n && st == HN_OK) {
        char c = s[i];
        if (c == '"' || c == '\'') {
            char q = c;
            st = tc_buf_add(out, "\"", 1);
            i++;
            int closed = 0;
            while (i < n && st == HN_OK) {
                char d = s[i];
                if (d == '\\' && i + 1 < n) {
                    if (s[i + 1] == '\'') st = tc_buf_add(out, "'", 1);
                    else st = tc_buf_add(out, s + i, 2);
                    i += 2;
                    continue;
                }
                if (d == q) {
                    closed = 1;
                    i++;
                    break;
                }
                if (d == '"') st = tc_buf_add(out, "\\\"", 2);
                else if ((unsigned char)d < 0x20) st = tc_buf_add_escaped(out, &d, 1);
                else st = tc_buf_add(out, &d, 1);
                i++;
            }
            if (st == HN_OK && (closed || close_open)) st = tc_buf_add(out, "\"", 1);
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth < TC_MAX_DEPTH) stack[depth] = c == '{' ? '}' : ']';
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth > 0) depth--;
            /* drop a trailing comma before the closer */
            size_t k = out->n;
            while (k > 0 && isspace((unsigned char)out->p[k - 1])) k--;
            if (k > 0 && out->p[k - 1] == ',') {
                out->n = k - 1;
                out->p[out->n] = 0;
            }
            st = tc_buf_add(out, &c, 1);
            i++;
            if (depth == 0) break;
            continue;
        } else if (isalpha((unsigned char)c)) {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
            const char *w = s + i;
            size_t wl = j - i;
            const char *rep = NULL;
            if (wl == 4 && !memcmp(w, "True", 4)) rep = "true";
            else if (wl == 5 && !memcmp(w, "False", 5)) rep = "false";
            else if (wl == 4 && !memcmp(w, "None", 4)) rep = "null";
            st = rep ? tc_buf_adds(out, rep) : tc_buf_add(out, w, wl);
            i = j;
            continue;
        }
        st = tc_buf_add(out, &c, 1);
        i++;
    }
    if (close_open) {
        while (st == HN_OK && depth > 0) {
            depth--;
            size_t k = out->n;
            while (k > 0 && isspace((unsigned char)out->p[k - 1])) k--;
            if (k > 0 && (out->p[k - 1] == ',' || out->p[k - 1] == ':')) {
                out->n = k - 1;
                out->p[out->n] = 0;
            }
            if (depth < TC_MAX_DEPTH) st = tc_buf_add(out, &stack[depth], 1);
        }
    }
    return st;
}

json_t *tc_json_parse_lenient(const char *s, size_t n, int close_open) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    if (!n) return NULL;
    json_error_t e;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &e);
    if (v) return v;
    tc_buf b = {0};
    if (repair(&b, s, n, close_open) == HN_OK && b.n)
        v = json_loadb(b.p, b.n, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &e);
    tc_buf_free(&b);
    return v;
}

size_t tc_json_extent(const char *s, size_t n, tc_jscan *st) {
    for (; st->pos < n; st->pos++) {
        char c = s[st->pos];
        if (st->quote) {
            if (st->esc) st->esc = 0;
            else if (c == '\\') st->esc = 1;
            else if (c == st->quote) st->quote = 0;
            continue;
        }
        if (c == '"' || (c == '\'' && st->begun)) st->quote = c;
        else if (c == '{' || c == '[') {
            st->depth++;
            st->begun = 1;
        } else if ((c == '}' || c == ']') && st->begun) {
            if (--st->depth == 0) return ++st->pos;
        }
    }
    return 0;
}

/* ---- printing ---- */

static int reals_need_17(const json_t *v, int depth) {
    if (depth > TC_MAX_DEPTH) return 0;
    if (json_is_real(v)) {
        char tmp[40];
        double d = json_real_value(v);
        snprintf(tmp, sizeof tmp, "%.15g", d);
        return strtod(tmp, NULL) != d;
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) if (reals_need_17(e, depth + 1)) return 1;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (reals_need_17(e, depth + 1)) return 1;
    }
    return 0;
}

hn_status tc_buf_add_json(tc_buf *b, const json_t *v) {
    size_t flags = JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER |
                   JSON_REAL_PRECISION(reals_need_17(v, 0) ? 17 : 15);
    size_t need = json_dumpb(v, NULL, 0, flags);
    if (need == 0) return tc_buf_adds(b, "null");
    char *tmp = hn_malloc(need);
    if (!tmp) return HN_ERR_NOMEM;
    size_t got = json_dumpb(v, tmp, need, flags);
    hn_status st = got == need ? tc_buf_add(b, tmp, got) : HN_ERR_INTERNAL;
    hn_free(tmp);
    return st;
}

/* ---- coercion ---- */

/* A JSON string of s[0..n); invalid UTF-8 becomes U+FFFD. */
static json_t *make_string(const char *s, size_t n) {
    json_t *r = json_stringn(s, n);
    if (r) return r;
    tc_buf b = {0};
    if (tc_buf_add_escaped(&b, s, n) == HN_OK && tc_buf_add(&b, "\"", 1) == HN_OK) {
        /* parse the escaped text back as a JSON string literal */
        tc_buf q = {0};
        if (tc_buf_add(&q, "\"", 1) == HN_OK && tc_buf_add(&q, b.p, b.n) == HN_OK) {
            json_error_t e;
            r = json_loadb(q.p, q.n, JSON_DECODE_ANY, &e);
        }
        tc_buf_free(&q);
    }
    tc_buf_free(&b);
    return r;
}

static json_t *scalar_text(const json_t *v) {
    tc_buf b = {0};
    json_t *r = NULL;
    if (tc_buf_add_json(&b, v) == HN_OK) r = json_stringn(b.p, b.n);
    tc_buf_free(&b);
    return r;
}

/* Parses a whole trimmed string as a number: integer syntax -> integer. */
static json_t *parse_number(const char *s, size_t n, int want_int) {
    char tmp[64];
    if (n == 0 || n >= sizeof tmp) return NULL;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end;
    errno = 0;
    long long ll = strtoll(tmp, &end, 10);
    if (*end == 0 && errno == 0) return json_integer(ll);
    errno = 0;
    double d = strtod(tmp, &end);
    if (*end != 0 || errno || !isfinite(d)) return NULL;
    if (want_int && d == floor(d) && fabs(d) < 9.2e18) return json_integer((long long)d);
    return want_int ? NULL : json_real(d);
}

static int ieq(const char *a, size_t n, const char *b) {
    return strlen(b) == n && strncasecmp(a, b, n) == 0;
}

static json_t *coerce_d(json_t *v, const json_t *schema, int depth);

static json_t *coerce_children(json_t *v, const json_t *schema, int depth) {
    if (json_is_object(v)) {
        void *it = json_object_iter(v);
        while (it) {
            const char *k = json_object_iter_key(it);
            const json_t *ps = tc_schema_prop(schema, k);
            if (ps) {
                json_t *c = coerce_d(json_incref(json_object_iter_value(it)), ps, depth + 1);
                if (!c) {
                    json_decref(v);
                    return NULL;
                }
                json_object_iter_set_new(v, it, c);
            }
            it = json_object_iter_next(v, it);
        }
    } else if (json_is_array(v)) {
        const json_t *items = json_object_get(schema, "items");
        if (json_is_object(items)) {
            for (size_t i = 0; i < json_array_size(v); i++) {
                json_t *c = coerce_d(json_incref(json_array_get(v, i)), items, depth + 1);
                if (!c) {
                    json_decref(v);
                    return NULL;
                }
                json_array_set_new(v, i, c);
            }
        }
    }
    return v;
}

static json_t *coerce_d(json_t *v, const json_t *schema, int depth) {
    if (!v || !json_is_object(schema) || depth > TC_MAX_DEPTH) return v;
    unsigned t = schema_types(schema);
    unsigned vb = value_bits(v);
    if (t == 0 || (t & vb)) {
        const json_t *br = pick_branch(schema, v);
        return coerce_children(v, br, depth);
    }
    json_t *r = NULL;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        while (n && isspace((unsigned char)*s)) s++, n--;
        while (n && isspace((unsigned char)s[n - 1])) n--;
        if (!r && (t & (T_OBJ | T_ARR))) {
            json_t *p = tc_json_parse_lenient(s, n, 0);
            if (p && (value_bits(p) & t & (T_OBJ | T_ARR))) r = coerce_d(p, schema, depth + 1);
            else json_decref(p);
        }
        if (!r && (t & (T_INT | T_NUM))) r = parse_number(s, n, !(t & T_NUM));
        if (!r && (t & T_BOOL)) {
            if (ieq(s, n, "true")) r = json_true();
            else if (ieq(s, n, "false")) r = json_false();
        }
        if (!r && (t & T_NULL) && (ieq(s, n, "null") || ieq(s, n, "none"))) r = json_null();
    } else if (json_is_real(v) && (t & T_INT)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.2e18) r = json_integer((long long)d);
    } else if ((t & T_STR) && (json_is_number(v) || json_is_boolean(v))) {
        r = scalar_text(v);
    }
    if (!r && (t & T_ARR) && !json_is_array(v)) {
        /* a single value where the schema wants a list of them */
        const json_t *items = json_object_get(schema, "items");
        if (!json_is_object(items) || (schema_types(items) & vb) || schema_types(items) == 0) {
            json_t *a = json_array();
            if (a && json_array_append(a, v) == 0) r = coerce_children(a, schema, depth);
            else json_decref(a);
        }
    }
    if (!r && (t & T_STR) && (json_is_object(v) || json_is_array(v))) r = scalar_text(v);
    if (!r) return v; /* nothing fits: keep what the model said */
    json_decref(v);
    return r;
}

json_t *tc_coerce(json_t *v, const json_t *schema) { return coerce_d(v, schema, 0); }

json_t *tc_coerce_raw(const char *s, size_t n, const json_t *schema) {
    unsigned t = schema_types(schema);
    if (t && tc_schema_is_string(schema)) return make_string(s, n);
    const char *a = s;
    size_t m = n;
    while (m && isspace((unsigned char)*a)) a++, m--;
    while (m && isspace((unsigned char)a[m - 1])) m--;
    json_error_t e;
    json_t *v = m ? json_loadb(a, m, JSON_DECODE_ANY, &e) : NULL;
    if (!v && t && m && (*a == '{' || *a == '[' || *a == '\'')) v = tc_json_parse_lenient(a, m, 0);
    if (v && t == 0) {
        if (json_is_string(v)) { /* a quoted string in an untyped parameter: keep the raw text */
            json_decref(v);
            v = NULL;
        }
        return v ? v : make_string(s, n);
    }
    if (v && (value_bits(v) & t)) return tc_coerce(v, schema);
    json_decref(v);
    /* let the string conversions (numbers, booleans, null, wrapping) try */
    return tc_coerce(make_string(s, n), schema);
}
