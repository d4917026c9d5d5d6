/* toolcall.c: the streaming tool-call and reasoning parser (see toolcall.h).
 *
 * Input accumulates in a pending buffer; step() decides as much of it as it
 * can and consumes it, until nothing more can be decided without more input.
 * States:
 *
 *   TEXT ──<think> at start──► REASON ──</think>──► TEXT
 *   TEXT ──<tool_call>──► HERMES (collect until </tool_call>) ──► TEXT
 *   TEXT ──'{' at content start──► JSON (bare call: collect until balanced) ──► TEXT
 *   TEXT ──<|python_tag|>──► PYTAG ──'{'──► JSON
 *   TEXT ──<tool_call>──► X_WAIT ──<function=──► X_NAME ──'>'──► X_FUNC
 *        X_FUNC ──<parameter=──► X_PNAME ──'>'──► X_VALUE ──</parameter>──► X_FUNC
 *        X_FUNC ──</function>──► X_AFTER ──</tool_call>──► TEXT
 *
 * A Hermes/JSON call is committed (events emitted) only once its JSON parsed;
 * a Qwen XML call is committed at '>' after its name, then its parameters
 * stream. Until commit, the markup consumed so far is kept in `raw` and given
 * back as content if the call turns out malformed. Every decision looks only at
 * bytes already fed (or at end of stream), so how the text was split into feeds
 * never changes the coalesced events. */
#include "toolcall.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../core/alloc.h"
#include "toolcall_int.h"

enum {
    S_TEXT,
    S_REASON,
    S_HERMES,
    S_JSON,
    S_PYTAG,
    S_X_WAIT,
    S_X_NAME,
    S_X_FUNC,
    S_X_PNAME,
    S_X_VALUE,
    S_X_AFTER,
    S_DONE,
};

#define NAME_MAX_LEN 256

static const char T_THINK[] = "<think>", T_THINK_END[] = "</think>";
static const char T_CALL[] = "<tool_call>", T_CALL_END[] = "</tool_call>";
static const char T_FUNC[] = "<function=", T_FUNC_END[] = "</function>";
static const char T_PARAM[] = "<parameter=", T_PARAM_END[] = "</parameter>";
static const char T_PYTAG[] = "<|python_tag|>";

struct tc_parser {
    tc_format fmt;
    unsigned flags;
    tc_tools tools;
    uint64_t seed, nids;

    tc_buf in;    /* pending input is in.p[off..in.n) */
    size_t off;
    int state;
    int eof;
    int think_ok;  /* a <think> here opens reasoning (nothing produced yet) */
    int json_ok;   /* a '{' here may start a bare JSON call (start of content) */
    int bare_json; /* bare JSON calls are recognised at all (format, tools offered) */
    int skip_ws;   /* drop leading whitespace of what follows */
    int skip_semi; /* drop one ';' (Llama 3 separates calls with it) */
    int rstart;    /* reasoning just began: drop whitespace and one repeated <think> */
    int xbare;     /* the XML call being named had no <tool_call> around it */
    tc_buf raw;    /* markup of an uncommitted call, given back as content on failure */
    tc_jscan js;   /* JSON state: scan for the end of the object */
    size_t scan;   /* bytes of pending input already searched for a terminator */

    int ncalls;
    int truncated;       /* the stream ended inside a committed call */
    const tc_tool *tool; /* tool of the open XML call (NULL: unknown name) */
    int nparams;         /* parameters emitted in the open XML call */
    int pstring;         /* the open parameter is a streamed JSON string */
    int vstart;          /* the open parameter's value has not started (strip one '\n') */
    const json_t *pschema;
    tc_buf val;  /* non-string parameter value being collected */
    tc_buf out;  /* scratch: argument fragments */
    tc_buf name; /* scratch: NUL-terminated names */

    tc_event_fn fn;
    void *user;
    hn_status st;
};

/* ---- small text helpers ---- */

#define W (p->in.p + p->off)
#define N (p->in.n - p->off)

static int starts(const char *w, size_t n, const char *t) {
    size_t k = strlen(t);
    return n >= k && memcmp(w, t, k) == 0;
}

/* w is a proper, non-empty prefix of t */
static int is_prefix(const char *w, size_t n, const char *t) {
    size_t k = strlen(t);
    return n > 0 && n < k && memcmp(w, t, n) == 0;
}

static size_t find(const char *w, size_t n, const char *t) {
    const char *q = memmem(w, n, t, strlen(t));
    return q ? (size_t)(q - w) : (size_t)-1;
}

/* Longest suffix of w that is a proper prefix of t. */
static size_t partial(const char *w, size_t n, const char *t) {
    size_t k = strlen(t);
    for (size_t m = k - 1 < n ? k - 1 : n; m > 0; m--)
        if (memcmp(w + n - m, t, m) == 0) return m;
    return 0;
}

/* Moves e back so that w[0..e) does not end inside a UTF-8 sequence. */
static size_t utf8_cut(const char *w, size_t e) {
    for (size_t j = 1; j <= 3 && j <= e; j++) {
        unsigned char c = (unsigned char)w[e - j];
        if ((c & 0xC0) == 0x80) continue;
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len > j ? e - j : e;
    }
    return e;
}

static size_t rstrip(const char *w, size_t e) {
    while (e > 0 && isspace((unsigned char)w[e - 1])) e--;
    return e;
}

static size_t lead_ws(const char *w, size_t n) {
    size_t k = 0;
    while (k < n && isspace((unsigned char)w[k])) k++;
    return k;
}

static void consume(tc_parser *p, size_t k) { p->off += k; }

static void keep(tc_parser *p, tc_buf *b, const char *s, size_t n) {
    if (p->st == HN_OK) p->st = tc_buf_add(b, s, n);
}

/* ---- events ---- */

static void emit_text(tc_parser *p, tc_event_kind kind, const char *s, size_t n) {
    if (!n || p->st != HN_OK) return;
    tc_event ev = {.kind = kind, .text = s, .len = n, .index = -1};
    p->fn(p->user, &ev);
    if (kind == TC_EV_CONTENT) p->think_ok = p->json_ok = 0;
}

static void emit_content(tc_parser *p, const char *s, size_t n) { emit_text(p, TC_EV_CONTENT, s, n); }

/* Gives the markup of a failed call back as content, followed by s[0..n). */
static void give_back(tc_parser *p, const char *s, size_t n) {
    keep(p, &p->raw, s, n);
    emit_content(p, p->raw.p, p->raw.n);
    tc_buf_clear(&p->raw);
}

static uint64_t mix64(uint64_t z) { /* a bijection on 64-bit values */
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static _Atomic uint64_t g_key0, g_counter;

static uint64_t process_key(void) {
    uint64_t k = atomic_load(&g_key0);
    if (k) return k;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)&ts);
    }
    r |= 1;
    uint64_t expect = 0;
    atomic_compare_exchange_strong(&g_key0, &expect, r);
    return atomic_load(&g_key0);
}

/* "call_" + 24 base-62 digits of a 128-bit value whose high half is a bijection
 * of a counter (process-wide, or per parser when seeded): unique. */
static void make_id(tc_parser *p, char id[32]) {
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    uint64_t hi, lo;
    if (p->seed) {
        uint64_t c = p->nids++;
        hi = mix64(mix64(c) ^ p->seed);
        lo = mix64(hi + p->seed);
    } else {
        uint64_t key = process_key();
        uint64_t c = atomic_fetch_add(&g_counter, 1);
        hi = mix64(mix64(c) ^ key);
        lo = mix64(hi ^ mix64(key + c));
    }
    unsigned __int128 v = ((unsigned __int128)hi << 64) | lo;
    memcpy(id, "call_", 5);
    for (int i = 0; i < 24; i++) {
        id[5 + 23 - i] = digits[(int)(v % 62)];
        v /= 62;
    }
    id[29] = 0;
}

static void call_start(tc_parser *p, const char *name, size_t nlen, const tc_tool *tool) {
    if (p->st != HN_OK) return;
    char id[32];
    make_id(p, id);
    tc_buf_clear(&p->name);
    keep(p, &p->name, name, nlen);
    if (p->st != HN_OK) return;
    tc_event ev = {.kind = TC_EV_CALL_START, .index = p->ncalls, .id = id, .name = p->name.p,
                   .known_tool = tool != NULL};
    p->ncalls++;
    p->think_ok = p->json_ok = 0;
    p->fn(p->user, &ev);
}

static void call_args(tc_parser *p, const char *s, size_t n) {
    if (!n || p->st != HN_OK) return;
    tc_event ev = {.kind = TC_EV_CALL_ARGS, .text = s, .len = n, .index = p->ncalls - 1};
    p->fn(p->user, &ev);
}

static void call_end(tc_parser *p) {
    if (p->st != HN_OK) return;
    tc_event ev = {.kind = TC_EV_CALL_END, .index = p->ncalls - 1};
    p->fn(p->user, &ev);
}

/* ---- JSON calls (Hermes, Llama 3, bare) ---- */

/* Finds the name and arguments of a call object; strict (bare JSON) also needs
 * an arguments/parameters key. Returns 0 when obj is not a call. */
static int call_parts(const json_t *obj, int strict, const char **name, json_t **args) {
    if (!json_is_object(obj)) return 0;
    const json_t *o = obj, *fn = json_object_get(obj, "function");
    if (json_is_object(fn)) o = fn;
    *name = json_string_value(json_object_get(o, "name"));
    if (!*name && json_is_string(fn)) *name = json_string_value(fn);
    if (!*name || !**name) return 0;
    static const char *const keys[] = {"arguments", "parameters", "args", "input"};
    const json_t *a = NULL;
    for (int k = 0; k < 4 && !a; k++) a = json_object_get(o, keys[k]);
    for (int k = 0; k < 4 && !a && o != obj; k++) a = json_object_get(obj, keys[k]);
    if (strict && !a) return 0;
    if (!a || json_is_null(a)) {
        *args = json_object();
        return *args != NULL;
    }
    if (json_is_string(a)) {
        const char *s = json_string_value(a);
        size_t n = json_string_length(a), k = lead_ws(s, n);
        if (k == n) {
            *args = json_object();
            return *args != NULL;
        }
        json_t *v = tc_json_parse_lenient(s, n, 0);
        if (!json_is_object(v)) {
            json_decref(v);
            return 0;
        }
        *args = v;
        return 1;
    }
    if (!json_is_object(a)) return 0;
    *args = json_deep_copy(a);
    return *args != NULL;
}

static void emit_json_call(tc_parser *p, const char *name, json_t *args) {
    const tc_tool *tool = tc_tools_find(&p->tools, name, strlen(name));
    args = tc_coerce(args, tool ? tool->schema : NULL);
    if (!args) {
        p->st = HN_ERR_NOMEM;
        return;
    }
    tc_buf_clear(&p->out);
    if (p->st == HN_OK) p->st = tc_buf_add_json(&p->out, args);
    json_decref(args);
    call_start(p, name, strlen(name), tool);
    call_args(p, p->out.p, p->out.n);
    call_end(p);
}

/* Emits the call(s) in v (an object, or an array of objects); returns 0 and
 * emits nothing when v is not entirely calls. */
static int emit_json_calls(tc_parser *p, const json_t *v, int strict) {
    const char *name;
    json_t *args;
    if (json_is_object(v)) {
        if (!call_parts(v, strict, &name, &args)) return 0;
        emit_json_call(p, name, args);
        return 1;
    }
    if (!json_is_array(v) || json_array_size(v) == 0) return 0;
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        if (!call_parts(e, strict, &name, &args)) return 0;
        json_decref(args);
    }
    json_array_foreach(v, i, e) {
        if (call_parts(e, strict, &name, &args)) emit_json_call(p, name, args);
    }
    return 1;
}

/* The body of a <tool_call>...</tool_call> (closed: the close tag was seen). */
static int hermes_body(tc_parser *p, const char *s, size_t n, int closed) {
    size_t k = 0;
    while (k < n && s[k] != '{' && s[k] != '[') k++;
    if (k == n) return 0;
    json_t *v = tc_json_parse_lenient(s + k, n - k, closed);
    if (!v) return 0;
    int ok = emit_json_calls(p, v, 0);
    json_decref(v);
    return ok;
}

/* ---- Llama 3 built-in tool call: name.call(key="value", ...) ---- */

static int builtin_call(tc_parser *p, const char *s, size_t n) {
    size_t i = lead_ws(s, n), e = rstrip(s, n);
    size_t a = i;
    while (i < e && (isalnum((unsigned char)s[i]) || s[i] == '_')) i++;
    size_t b = i;
    if (b == a || e - i < 7 || memcmp(s + i, ".call(", 6) != 0 || s[e - 1] != ')') return 0;
    i += 6;
    json_t *args = json_object();
    if (!args) return 0;
    int ok = 1;
    while (ok) {
        i += lead_ws(s + i, e - 1 - i);
        if (i >= e - 1) break;
        size_t ka = i;
        while (i < e && (isalnum((unsigned char)s[i]) || s[i] == '_')) i++;
        size_t kb = i;
        i += lead_ws(s + i, e - i);
        if (kb == ka || i >= e || s[i] != '=') {
            ok = 0;
            break;
        }
        i++;
        i += lead_ws(s + i, e - i);
        size_t va = i;
        if (i < e && (s[i] == '"' || s[i] == '\'')) {
            char q = s[i++];
            while (i < e - 1 && s[i] != q) i += s[i] == '\\' ? 2 : 1;
            i++;
        } else {
            while (i < e - 1 && s[i] != ',') i++;
        }
        if (i > e - 1) {
            ok = 0;
            break;
        }
        json_t *v = tc_json_parse_lenient(s + va, i - va, 0);
        char key[NAME_MAX_LEN];
        if (!v || kb - ka >= sizeof key) {
            json_decref(v);
            ok = 0;
            break;
        }
        memcpy(key, s + ka, kb - ka);
        key[kb - ka] = 0;
        json_object_set_new(args, key, v);
        i += lead_ws(s + i, e - 1 - i);
        if (i < e - 1 && s[i] == ',') i++;
    }
    if (!ok) {
        json_decref(args);
        return 0;
    }
    tc_buf_clear(&p->name);
    keep(p, &p->name, s + a, b - a);
    if (p->st != HN_OK) {
        json_decref(args);
        return 1;
    }
    char *name = hn_strdup(p->name.p);
    if (!name) {
        json_decref(args);
        p->st = HN_ERR_NOMEM;
        return 1;
    }
    emit_json_call(p, name, args);
    hn_free(name);
    return 1;
}

/* ---- Qwen XML calls ---- */

static void xml_close_call(tc_parser *p) {
    call_args(p, p->nparams ? "}" : "{}", p->nparams ? 1 : 2);
    call_end(p);
    p->tool = NULL;
    p->nparams = 0;
}

/* Ends the open parameter whose value is w[0..e) (one trailing '\n' dropped). */
static void xml_end_param(tc_parser *p, const char *w, size_t e) {
    if (e > 0 && w[e - 1] == '\n') e--;
    tc_buf_clear(&p->out);
    if (p->pstring) {
        if (p->st == HN_OK) p->st = tc_buf_add_escaped(&p->out, w, e);
        keep(p, &p->out, "\"", 1);
    } else {
        keep(p, &p->val, w, e);
        json_t *v = p->st == HN_OK ? tc_coerce_raw(p->val.p ? p->val.p : "", p->val.n, p->pschema) : NULL;
        if (!v) {
            if (p->st == HN_OK) p->st = HN_ERR_NOMEM;
            return;
        }
        p->st = tc_buf_add_json(&p->out, v);
        json_decref(v);
        tc_buf_clear(&p->val);
    }
    call_args(p, p->out.p, p->out.n);
    p->nparams++;
}

static void xml_begin_param(tc_parser *p, const char *name, size_t n) {
    tc_buf_clear(&p->name);
    keep(p, &p->name, name, n);
    if (p->st != HN_OK) return;
    p->pschema = p->tool ? tc_schema_prop(p->tool->schema, p->name.p) : NULL;
    p->pstring = p->pschema && tc_schema_is_string(p->pschema);
    tc_buf_clear(&p->out);
    keep(p, &p->out, p->nparams ? ",\"" : "{\"", 2);
    if (p->st == HN_OK) p->st = tc_buf_add_escaped(&p->out, name, n);
    keep(p, &p->out, p->pstring ? "\":\"" : "\":", p->pstring ? 3 : 2);
    call_args(p, p->out.p, p->out.n);
    tc_buf_clear(&p->val);
    p->vstart = 1;
}

/* Scans w for a name ending in '>' (at most NAME_MAX_LEN bytes, no newline or
 * '<'). Returns 1 and sets *end at the '>', 0 when more input is needed, -1
 * when it is not a name. */
static int scan_name(const char *w, size_t n, int eof, size_t *end) {
    for (size_t i = 0; i < n; i++) {
        if (w[i] == '>') {
            *end = i;
            return 1;
        }
        if (w[i] == '\n' || w[i] == '<' || i >= NAME_MAX_LEN) return -1;
    }
    return eof ? -1 : 0;
}

static void trim(const char **s, size_t *n) {
    size_t k = lead_ws(*s, *n);
    *s += k;
    *n = rstrip(*s, *n - k);
}

/* ---- states ---- */

static int step_text(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    if (p->skip_ws) {
        size_t k = lead_ws(w, n);
        if (k) {
            consume(p, k);
            return 1;
        }
        if (!n) return 0;
        p->skip_ws = 0;
    }
    if (!n) return 0;
    if (p->skip_semi) {
        p->skip_semi = 0;
        if (w[0] == ';') {
            consume(p, 1);
            p->skip_ws = 1;
            return 1;
        }
    }
    if (p->think_ok) {
        if (starts(w, n, T_THINK)) {
            consume(p, strlen(T_THINK));
            p->state = S_REASON;
            p->think_ok = p->json_ok = 0;
            p->rstart = 1;
            return 1;
        }
        if (is_prefix(w, n, T_THINK) && !p->eof) return 0;
    }
    if (p->json_ok && p->bare_json && w[0] == '{') {
        p->state = S_JSON;
        memset(&p->js, 0, sizeof p->js);
        tc_buf_clear(&p->raw);
        return 1;
    }
    const char *trig[2] = {NULL, NULL};
    if (p->fmt == TC_FORMAT_HERMES) trig[0] = T_CALL;
    else if (p->fmt == TC_FORMAT_QWEN_XML) trig[0] = T_CALL, trig[1] = T_FUNC;
    else if (p->fmt == TC_FORMAT_LLAMA3) trig[0] = T_PYTAG;
    size_t best = (size_t)-1, hold = 0;
    int which = -1;
    for (int t = 0; t < 2 && trig[t]; t++) {
        size_t i = find(w, n, trig[t]);
        if (i < best) best = i, which = t;
        size_t h = partial(w, n, trig[t]);
        if (h > hold) hold = h;
    }
    if (which >= 0) {
        /* whitespace before a call is dropped, or given back with the markup if the call fails */
        size_t e = rstrip(w, best);
        emit_content(p, w, e);
        tc_buf_clear(&p->raw);
        keep(p, &p->raw, w + e, best - e);
        keep(p, &p->raw, trig[which], strlen(trig[which]));
        consume(p, best + strlen(trig[which]));
        p->scan = 0;
        if (trig[which] == T_PYTAG) p->state = S_PYTAG;
        else if (trig[which] == T_FUNC) p->state = S_X_NAME, p->xbare = 1;
        else p->state = p->fmt == TC_FORMAT_HERMES ? S_HERMES : S_X_WAIT;
        return 1;
    }
    size_t e = n;
    if (!p->eof) e = utf8_cut(w, rstrip(w, n - hold));
    if (!e) return 0;
    emit_content(p, w, e);
    consume(p, e);
    return 1;
}

static int step_reason(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    if (p->rstart) {
        size_t k = lead_ws(w, n);
        if (k) {
            consume(p, k);
            return 1;
        }
        if (!n) return 0;
        if (starts(w, n, T_THINK)) { /* the model opened again what the prompt opened */
            consume(p, strlen(T_THINK));
            return 1;
        }
        if (is_prefix(w, n, T_THINK) && !p->eof) return 0;
        p->rstart = 0;
    }
    size_t i = find(w, n, T_THINK_END);
    if (i != (size_t)-1) {
        emit_text(p, TC_EV_REASONING, w, rstrip(w, i));
        consume(p, i + strlen(T_THINK_END));
        p->state = S_TEXT;
        p->skip_ws = 1;
        p->json_ok = 1;
        return 1;
    }
    size_t e = n;
    if (!p->eof) e = utf8_cut(w, rstrip(w, n - partial(w, n, T_THINK_END)));
    if (!e) return 0;
    emit_text(p, TC_EV_REASONING, w, e);
    consume(p, e);
    return 1;
}

static void after_call(tc_parser *p) {
    p->state = S_TEXT;
    p->skip_ws = 1;
    tc_buf_clear(&p->raw);
}

static int step_hermes(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    size_t from = p->scan > 16 ? p->scan - 16 : 0;
    size_t i1 = find(w + from, n - from, T_CALL_END);
    if (i1 != (size_t)-1) i1 += from;
    /* an implicit close: the next <tool_call> after a complete JSON value */
    size_t i2 = (size_t)-1;
    for (size_t s = from; s < n;) {
        size_t j = find(w + s, n - s, T_CALL);
        if (j == (size_t)-1 || s + j > i1) break;
        tc_jscan js = {0};
        if (tc_json_extent(w, s + j, &js)) {
            i2 = s + j;
            break;
        }
        s += j + 1;
    }
    size_t body, used;
    int closed;
    if (i2 != (size_t)-1) body = used = i2, closed = 1;
    else if (i1 != (size_t)-1) body = i1, used = i1 + strlen(T_CALL_END), closed = 1;
    else if (p->eof) body = used = n, closed = 0;
    else {
        p->scan = n;
        return 0;
    }
    if (hermes_body(p, w, body, closed)) {
        consume(p, used);
        after_call(p);
        return 1;
    }
    give_back(p, w, used);
    consume(p, used);
    p->state = S_TEXT;
    return 1;
}

static int step_json(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    size_t e = tc_json_extent(w, n, &p->js);
    if (!e) {
        if (!p->eof) return 0;
        give_back(p, w, n); /* unterminated: text */
        consume(p, n);
        p->state = S_TEXT;
        return 1;
    }
    json_t *v = tc_json_parse_lenient(w, e, 0);
    int ok = v && emit_json_calls(p, v, 1);
    json_decref(v);
    if (ok) {
        consume(p, e);
        after_call(p);
        p->skip_semi = 1;
        p->json_ok = 1;
        return 1;
    }
    give_back(p, w, e);
    consume(p, e);
    p->state = S_TEXT;
    return 1;
}

static int step_pytag(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    size_t k = lead_ws(w, n);
    if (k) {
        keep(p, &p->raw, w, k);
        consume(p, k);
        return 1;
    }
    if (n && w[0] == '{') {
        p->state = S_JSON;
        memset(&p->js, 0, sizeof p->js);
        return 1;
    }
    if (!p->eof) return 0;
    /* built-in tool call or code for the interpreter: decided at end of stream */
    if (n && builtin_call(p, w, n)) {
        consume(p, n);
        after_call(p);
        return 1;
    }
    if (n) {
        json_t *args = json_object();
        if (!args || json_object_set_new(args, "code", json_stringn(w, n))) {
            json_decref(args);
            give_back(p, w, n);
        } else {
            emit_json_call(p, "python", args);
        }
        consume(p, n);
        after_call(p);
        return 1;
    }
    give_back(p, w, 0);
    p->state = S_TEXT;
    return 1;
}

static int step_x_wait(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    size_t k = lead_ws(w, n);
    if (k) {
        keep(p, &p->raw, w, k);
        consume(p, k);
        return 1;
    }
    if (starts(w, n, T_FUNC)) {
        keep(p, &p->raw, T_FUNC, strlen(T_FUNC));
        consume(p, strlen(T_FUNC));
        p->state = S_X_NAME;
        p->xbare = 0;
        return 1;
    }
    if (is_prefix(w, n, T_FUNC) && !p->eof) return 0;
    if (!n && !p->eof) return 0;
    if (n && w[0] == '{') { /* a Hermes JSON body inside the XML format's tag */
        p->state = S_HERMES;
        p->scan = 0;
        return 1;
    }
    give_back(p, w, 0);
    p->state = S_TEXT;
    return 1;
}

static int step_x_name(tc_parser *p) {
    const char *w = W;
    size_t n = N, end = 0;
    int r = scan_name(w, n, p->eof, &end);
    if (r == 0) return 0;
    const char *name = w;
    size_t nl = end;
    trim(&name, &nl);
    const tc_tool *tool = r > 0 && nl ? tc_tools_find(&p->tools, name, nl) : NULL;
    if (r < 0 || nl == 0 || (p->xbare && !tool)) {
        give_back(p, w, 0);
        p->state = S_TEXT;
        return 1;
    }
    call_start(p, name, nl, tool);
    p->tool = tool;
    p->nparams = 0;
    consume(p, end + 1);
    tc_buf_clear(&p->raw);
    p->state = S_X_FUNC;
    return 1;
}

static int step_x_func(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    size_t k = lead_ws(w, n);
    if (k) {
        consume(p, k);
        return 1;
    }
    if (!n) {
        if (!p->eof) return 0;
        p->truncated = 1;
        xml_close_call(p);
        after_call(p);
        return 1;
    }
    if (starts(w, n, T_PARAM)) {
        consume(p, strlen(T_PARAM));
        p->state = S_X_PNAME;
        return 1;
    }
    if (starts(w, n, T_FUNC_END)) {
        consume(p, strlen(T_FUNC_END));
        xml_close_call(p);
        p->state = S_X_AFTER;
        return 1;
    }
    if (starts(w, n, T_CALL_END)) {
        consume(p, strlen(T_CALL_END));
        xml_close_call(p);
        after_call(p);
        return 1;
    }
    if (starts(w, n, T_CALL)) {
        xml_close_call(p);
        after_call(p);
        return 1;
    }
    if (starts(w, n, T_FUNC)) {
        xml_close_call(p);
        consume(p, strlen(T_FUNC));
        tc_buf_clear(&p->raw);
        keep(p, &p->raw, T_FUNC, strlen(T_FUNC));
        p->xbare = 0;
        p->state = S_X_NAME;
        return 1;
    }
    if (!p->eof && (is_prefix(w, n, T_PARAM) || is_prefix(w, n, T_FUNC_END) || is_prefix(w, n, T_CALL_END) ||
                    is_prefix(w, n, T_CALL) || is_prefix(w, n, T_FUNC)))
        return 0;
    /* stray text inside the function: skip it */
    const char *lt = memchr(w + 1, '<', n - 1);
    consume(p, lt ? (size_t)(lt - w) : n);
    return 1;
}

static int step_x_pname(tc_parser *p) {
    const char *w = W;
    size_t n = N, end = 0;
    int r = scan_name(w, n, p->eof, &end);
    if (r == 0) return 0;
    const char *name = w;
    size_t nl = end;
    trim(&name, &nl);
    if (r < 0 || nl == 0) { /* not a parameter name: drop the tag, go on */
        if (r > 0) consume(p, end + 1);
        p->state = S_X_FUNC;
        return 1;
    }
    xml_begin_param(p, name, nl);
    consume(p, end + 1);
    p->state = S_X_VALUE;
    p->scan = 0;
    return 1;
}

static int step_x_value(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    if (p->vstart) {
        if (!n && !p->eof) return 0;
        p->vstart = 0;
        if (n && w[0] == '\n') consume(p, 1);
        return 1;
    }
    static const char *const ends[] = {T_PARAM_END, T_PARAM, T_FUNC_END, T_CALL_END};
    size_t from = p->scan > 16 ? p->scan - 16 : 0;
    size_t best = (size_t)-1, hold = 0;
    int which = -1;
    for (int t = 0; t < 4; t++) {
        size_t i = find(w + from, n - from, ends[t]);
        if (i != (size_t)-1 && i + from < best) best = i + from, which = t;
        size_t h = partial(w, n, ends[t]);
        if (h > hold) hold = h;
    }
    if (which >= 0 || p->eof) {
        size_t e = which >= 0 ? best : n;
        if (which < 0) p->truncated = 1;
        xml_end_param(p, w, e);
        consume(p, e + (which == 0 ? strlen(T_PARAM_END) : 0));
        p->state = S_X_FUNC;
        return 1;
    }
    if (!p->pstring) { /* wait for the whole value */
        p->scan = n;
        return 0;
    }
    size_t e = n - hold;
    if (e > 0 && w[e - 1] == '\n') e--; /* may be the newline before </parameter> */
    e = utf8_cut(w, e);
    if (!e) return 0;
    tc_buf_clear(&p->out);
    if (p->st == HN_OK) p->st = tc_buf_add_escaped(&p->out, w, e);
    call_args(p, p->out.p, p->out.n);
    consume(p, e);
    return 1;
}

static int step_x_after(tc_parser *p) {
    const char *w = W;
    size_t n = N;
    size_t k = lead_ws(w, n);
    if (k) {
        consume(p, k);
        return 1;
    }
    if (starts(w, n, T_CALL_END)) {
        consume(p, strlen(T_CALL_END));
        after_call(p);
        return 1;
    }
    if (starts(w, n, T_FUNC)) {
        consume(p, strlen(T_FUNC));
        tc_buf_clear(&p->raw);
        keep(p, &p->raw, T_FUNC, strlen(T_FUNC));
        p->xbare = 0;
        p->state = S_X_NAME;
        return 1;
    }
    if (!p->eof && (!n || is_prefix(w, n, T_CALL_END) || is_prefix(w, n, T_FUNC))) return 0;
    after_call(p); /* no </tool_call>: what follows is text (or the next <tool_call>) */
    return 1;
}

static int step(tc_parser *p) {
    switch (p->state) {
    case S_TEXT: return step_text(p);
    case S_REASON: return step_reason(p);
    case S_HERMES: return step_hermes(p);
    case S_JSON: return step_json(p);
    case S_PYTAG: return step_pytag(p);
    case S_X_WAIT: return step_x_wait(p);
    case S_X_NAME: return step_x_name(p);
    case S_X_FUNC: return step_x_func(p);
    case S_X_PNAME: return step_x_pname(p);
    case S_X_VALUE: return step_x_value(p);
    case S_X_AFTER: return step_x_after(p);
    default: return 0;
    }
}

static hn_status run(tc_parser *p, tc_event_fn fn, void *user) {
    p->fn = fn;
    p->user = user;
    while (p->st == HN_OK && step(p)) {
    }
    /* drop consumed input; keep the pending tail at the front */
    if (p->off && (p->off == p->in.n || p->off > p->in.n / 2)) {
        memmove(p->in.p, p->in.p + p->off, p->in.n - p->off);
        p->in.n -= p->off;
        p->in.p[p->in.n] = 0;
        p->off = 0;
    }
    return p->st;
}

/* ---- API ---- */

hn_status tc_parser_new(tc_format fmt, const json_t *tools, const tc_options *opt, tc_parser **out,
                        hn_err *err) {
    *out = NULL;
    if ((int)fmt < 0 || fmt >= TC_FORMAT_COUNT) return hn_errf(err, HN_ERR_INVALID, "toolcall: bad format %d", fmt);
    tc_parser *p = hn_calloc(1, sizeof *p);
    if (!p) return hn_errf(err, HN_ERR_NOMEM, "toolcall: out of memory");
    p->fmt = fmt;
    if (opt) {
        p->flags = opt->flags;
        p->seed = opt->id_seed;
    }
    if (tc_tools_load(&p->tools, tools) != HN_OK) {
        tc_parser_free(p);
        return hn_errf(err, HN_ERR_NOMEM, "toolcall: out of memory reading tools");
    }
    p->state = S_TEXT;
    p->skip_ws = 1;
    p->bare_json = (fmt == TC_FORMAT_HERMES || fmt == TC_FORMAT_LLAMA3) && p->tools.n > 0;
    p->json_ok = 1;
    if (p->flags & TC_FLAG_REASONING) p->think_ok = 1;
    if (opt && opt->start_in_reasoning) {
        p->state = S_REASON;
        p->rstart = 1;
        p->think_ok = 0;
    }
    *out = p;
    return HN_OK;
}

hn_status tc_parser_feed(tc_parser *p, const char *text, size_t len, tc_event_fn fn, void *user) {
    if (p->st != HN_OK) return p->st;
    if (p->state == S_DONE || p->eof) return HN_OK;
    p->st = tc_buf_add(&p->in, text, len);
    if (p->st != HN_OK) return p->st;
    return run(p, fn, user);
}

hn_status tc_parser_finish(tc_parser *p, tc_event_fn fn, void *user) {
    if (p->st != HN_OK) return p->st;
    if (p->state == S_DONE) return HN_OK;
    p->eof = 1;
    hn_status st = run(p, fn, user);
    if (st == HN_OK && N) emit_content(p, W, N); /* cannot happen; never lose text */
    p->state = S_DONE;
    return p->st;
}

int tc_parser_ncalls(const tc_parser *p) { return p->ncalls; }

int tc_parser_truncated(const tc_parser *p) { return p->truncated; }

void tc_parser_free(tc_parser *p) {
    if (!p) return;
    tc_tools_free(&p->tools);
    tc_buf_free(&p->in);
    tc_buf_free(&p->raw);
    tc_buf_free(&p->val);
    tc_buf_free(&p->out);
    tc_buf_free(&p->name);
    hn_free(p);
}
