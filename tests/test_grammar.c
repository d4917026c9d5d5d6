/* test_grammar.c: constrained decoding.
 *
 * 1. Compiled grammars accept and refuse hand-written texts.
 * 2. Random-logit generation through the sampler's mask hook, over a
 *    synthetic vocabulary (all bytes plus a few hundred multi-byte tokens,
 *    an EOG token and control tokens), for many seeds: every output parses as
 *    JSON valid against the schema (a validator for the subset below), and
 *    every tool call parses (template/toolcall) with an offered name and
 *    arguments valid against that tool's schema.
 * 3. The same with the real Qwen3 vocabulary.
 * 4. For both vocabularies, the exported allowed-token bitmask in every state
 *    of random paths through several grammars, against gr_state_accept token
 *    by token, and the float mask hook against applying the bitmask. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "gguf/gguf.h"
#include "sample/grammar.h"
#include "sample/grammar_int.h"
#include "sample/sample.h"
#include "template/toolcall.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static int sanitized(void) {
    const char *e = getenv("HONE_SANITIZED");
    return e && *e == '1';
}

/* ---- a validator for the schema subset ---- */

static const json_t *deref(const json_t *root, const json_t *s) {
    for (int hop = 0; hop < 16 && json_is_string(json_object_get(s, "$ref")); hop++) {
        const char *r = json_string_value(json_object_get(s, "$ref"));
        if (!strncmp(r, "#/$defs/", 8)) s = json_object_get(json_object_get(root, "$defs"), r + 8);
        else if (!strncmp(r, "#/definitions/", 14)) s = json_object_get(json_object_get(root, "definitions"), r + 14);
        else return NULL;
    }
    return s;
}

static int valid(const json_t *v, const json_t *s, const json_t *root);

static int valid_type(const json_t *v, const char *t, const json_t *s, const json_t *root) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return 0;
        const json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r) if (!json_object_get(v, json_string_value(r))) return 0;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps) {
                if (!valid(x, ps, root)) return 0;
            } else if (json_is_object(addl)) {
                if (!valid(x, addl, root)) return 0;
            } else if (!json_is_true(addl) && (props || addl)) {
                return 0;
            }
        }
        return 1;
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return 0;
        const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (mn && (json_int_t)json_array_size(v) < json_integer_value(mn)) return 0;
        if (mx && (json_int_t)json_array_size(v) > json_integer_value(mx)) return 0;
        const json_t *it = json_object_get(s, "items");
        size_t i;
        json_t *x;
        if (it) json_array_foreach(v, i, x) if (!valid(x, it, root)) return 0;
        return 1;
    }
    return 0;
}

static int valid(const json_t *v, const json_t *s, const json_t *root) {
    s = deref(root, s);
    if (!s) return 0;
    if (json_is_true(s)) return 1;
    const json_t *x;
    if ((x = json_object_get(s, "const"))) return json_equal(v, x);
    if ((x = json_object_get(s, "enum"))) {
        size_t i;
        json_t *e;
        json_array_foreach(x, i, e) if (json_equal(v, e)) return 1;
        return 0;
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        size_t i;
        json_t *e;
        json_array_foreach(x, i, e) if (valid(v, e, root)) return 1;
        return 0;
    }
    if ((x = json_object_get(s, "type"))) {
        if (json_is_string(x)) return valid_type(v, json_string_value(x), s, root);
        size_t i;
        json_t *e;
        json_array_foreach(x, i, e) if (valid_type(v, json_string_value(e), s, root)) return 1;
        return 0;
    }
    if (json_object_get(s, "properties")) return valid_type(v, "object", s, root);
    return 1;
}

/* ---- unit: texts in and out ---- */

static json_t *js(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j) fprintf(stderr, "bad test json: %s: %s\n", text, e.text);
    return j;
}

/* Whether the grammar accepts exactly text (complete). */
static int accepts(const gr_grammar *g, const gr_vocab *v, const char *text) {
    gr_state *s;
    if (gr_state_new(g, v, &s, NULL) != HN_OK) return -1;
    int ok = gr_state_accept_bytes(s, text, strlen(text), NULL) == HN_OK && gr_state_done(s);
    gr_state_free(s);
    return ok;
}

static gr_vocab *byte_vocab(void) {
    char bytes[256];
    const char *ptrs[257];
    int32_t lens[257];
    uint8_t flags[257] = {0};
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        ptrs[i] = bytes + i;
        lens[i] = 1;
    }
    ptrs[256] = "";
    lens[256] = 0;
    flags[256] = GR_TOK_EOG;
    gr_vocab *v = NULL;
    gr_vocab_new(257, ptrs, lens, flags, &v, NULL);
    return v;
}

static void test_texts(void) {
    gr_vocab *v = byte_vocab();
    CHECK(v != NULL);
    struct {
        const char *schema;
        const char *good[6];
        const char *bad[6];
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
         {"{\"a\": 1}", "{\"a\": -20, \"b\": \"x\\n\\u00e9\"}", "{\"a\": 0, \"b\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"},
         {"{}", "{\"b\": \"x\"}", "{\"a\":1}", "{\"a\": 01}", "{\"a\": 1, \"b\": \"\xc3\"}", "{\"a\": 1, \"c\": 2}"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}",
         {"[true]", "[false, true]"},
         {"[]", "[true, true, true]", "[true,false]", "[null]"}},
        {"{\"enum\":[\"red\",\"green\",3]}", {"\"red\"", "\"green\"", "3"}, {"\"blue\"", "\"re\"", "4"}},
        {"{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]}",
         {"1.5", "-0.25e+10", "null", "7E3"},
         {"1.", ".5", "nul", "+1", "1e"}},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
         {"{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}"},
         {"{\"v\": 1}", "{\"next\": null, \"v\": 1}"}},
        {"{\"type\":\"object\"}",
         {"{}", "{\"x\": [1, {\"y\": null}], \"z\": \"\"}"},
         {"[]", "{\"x\" : 1}", "{\"x\": }"}},
        {"{\"type\":\"string\"}", {"\"\"", "\"a\\\"b\\\\\"", "\"\\ud7ff\""}, {"\"\\ud800\"", "\"\\u0000\"", "\"a\nb\"", "\"\xff\""}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}",
         {"{\"a\": 1, \"q\": \"w\"}", "{\"q\": \"w\"}", "{}"},
         {"{\"q\": 1}", "{\"q\": \"w\", \"a\": 1}"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        json_t *sch = js(cases[c].schema);
        gr_grammar *g = NULL;
        hn_err err;
        hn_status st = gr_from_schema(sch, &g, &err);
        CHECKF(st == HN_OK, "schema %zu: %s", c, err.msg);
        for (int i = 0; i < 6 && g; i++) {
            if (cases[c].good[i]) CHECKF(accepts(g, v, cases[c].good[i]) == 1, "schema %zu refuses %s", c, cases[c].good[i]);
            if (cases[c].bad[i]) CHECKF(accepts(g, v, cases[c].bad[i]) == 0, "schema %zu accepts %s", c, cases[c].bad[i]);
        }
        gr_grammar_free(g);
        json_decref(sch);
    }
    /* errors */
    json_t *bad = js("{\"$ref\":\"#/$defs/missing\"}");
    gr_grammar *g = NULL;
    CHECK(gr_from_schema(bad, &g, NULL) == HN_ERR_INVALID && !g);
    json_decref(bad);
    bad = js("{\"type\":\"frobnicate\"}");
    CHECK(gr_from_schema(bad, &g, NULL) == HN_ERR_UNSUPPORTED && !g);
    json_decref(bad);
    /* a schema that is only a reference to itself: no character sets at
     * all (the builder copied them from NULL: UBSan), a clear answer */
    bad = js("{\"$ref\":\"#\"}");
    hn_err rerr = {0};
    hn_status rst = gr_from_schema(bad, &g, &rerr);
    CHECKF(rst == HN_ERR_INVALID && !g && strstr(rerr.msg, "refers to itself"), "{\"$ref\":\"#\"}: %s", rerr.msg);
    gr_grammar_free(g);
    g = NULL;
    json_decref(bad);
    bad = js("{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#\"}]}"); /* left recursion through a choice */
    CHECK(gr_from_schema(bad, &g, NULL) == HN_ERR_INVALID && !g);
    json_decref(bad);
    /* recursion after content is fine (a tree) */
    bad = js("{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}}}");
    CHECK(gr_from_schema(bad, &g, NULL) == HN_OK && g);
    gr_grammar_free(g);
    g = NULL;
    json_decref(bad);

    /* tool-call texts */
    json_t *tools = js("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
                       "{\"name\":\"ping\",\"input_schema\":{\"type\":\"object\",\"properties\":{}}}]");
    gr_tool_opts o = {TC_FORMAT_HERMES, NULL, false, GR_THINK_NONE};
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_OK);
    CHECK(accepts(g, v, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>") == 1);
    CHECK(accepts(g, v, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>") == 1);
    CHECK(accepts(g, v, "<tool_call>\n{\"name\": \"pong\", \"arguments\": {}}\n</tool_call>") == 0);
    CHECK(accepts(g, v, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>") == 0);
    gr_grammar_free(g);
    o.parallel = true;
    o.think = GR_THINK_OPTIONAL;
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_OK);
    CHECK(accepts(g, v, "<think>\nhmm </thin> <think>\n</think>\n\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>") == 1);
    CHECK(accepts(g, v, "<think>a</think>b</think>\n\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>") == 0);
    gr_grammar_free(g);
    o = (gr_tool_opts){TC_FORMAT_QWEN_XML, "get_weather", false, GR_THINK_OPEN};
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_OK);
    CHECK(accepts(g, v, "ok\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew <b>York</b>\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>") == 1);
    CHECK(accepts(g, v, "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\na</parameter>b\n</parameter>\n</function>\n</tool_call>") == 0);
    CHECK(accepts(g, v, "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>") == 0);
    CHECK(accepts(g, v, "</think>\n\n<tool_call>\n<function=ping>\n</function>\n</tool_call>") == 0);
    gr_grammar_free(g);
    /* raw XML parameters share one text rule: a parameter costs a few rules,
     * not the text automaton's dozens again (which made a 24-tool list take
     * 55 ms to compile) */
    {
        char big[4096];
        int at = snprintf(big, sizeof big, "[{\"name\":\"t\",\"input_schema\":{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < 24; i++) at += snprintf(big + at, sizeof big - (size_t)at, "%s\"p%d\":{\"type\":\"string\"}", i ? "," : "", i);
        snprintf(big + at, sizeof big - (size_t)at, "}}}]");
        json_t *one = js("[{\"name\":\"t\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"p0\":{\"type\":\"string\"}}}}]");
        json_t *many = js(big);
        gr_grammar *g1 = NULL, *g24 = NULL;
        o = (gr_tool_opts){TC_FORMAT_QWEN_XML, NULL, false, GR_THINK_NONE};
        CHECK(gr_from_tools(one, &o, &g1, NULL) == HN_OK && gr_from_tools(many, &o, &g24, NULL) == HN_OK);
        int32_t r1 = gr_grammar_rules(g1), r24 = gr_grammar_rules(g24);
        CHECKF(r24 - r1 <= 23 * 4, "24 raw parameters: %d rules, one: %d", (int)r24, (int)r1);
        CHECK(accepts(g24, v, "<tool_call>\n<function=t>\n<parameter=p3>\nx</para\n</parameter>\n<parameter=p9>\n"
                              "</function\n</parameter>\n</function>\n</tool_call>") == 1);
        CHECK(accepts(g24, v, "<tool_call>\n<function=t>\n<parameter=p3>\nx</function>\n</parameter>\n</function>\n</tool_call>") == 0);
        gr_grammar_free(g1);
        gr_grammar_free(g24);
        json_decref(one);
        json_decref(many);
    }
    o = (gr_tool_opts){TC_FORMAT_LLAMA3, NULL, true, GR_THINK_NONE};
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_OK);
    CHECK(accepts(g, v, "{\"name\": \"ping\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"\"}}") == 1);
    gr_grammar_free(g);
    o.name = "nope";
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_ERR_INVALID && !g);
    o = (gr_tool_opts){TC_FORMAT_NONE, NULL, false, GR_THINK_NONE};
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_ERR_UNSUPPORTED);
    json_decref(tools);

    /* EOG only when complete; refused tokens leave the state as it was */
    json_t *sch = js("{\"type\":\"boolean\"}");
    CHECK(gr_from_schema(sch, &g, NULL) == HN_OK);
    gr_state *s;
    CHECK(gr_state_new(g, v, &s, NULL) == HN_OK);
    CHECK(!gr_state_allows(s, 256) && gr_state_allows(s, 't') && gr_state_allows(s, 'f') && !gr_state_allows(s, 'n'));
    CHECK(gr_state_accept(s, 256, NULL) == HN_ERR_INVALID);
    CHECK(gr_state_accept(s, 'x', NULL) == HN_ERR_INVALID);
    CHECK(gr_state_accept_bytes(s, "tru", 3, NULL) == HN_OK && !gr_state_done(s));
    CHECK(gr_state_accept(s, 'e', NULL) == HN_OK && gr_state_done(s));
    float lg[300];
    for (int i = 0; i < 300; i++) lg[i] = 1.0f;
    gr_state_mask(s, lg, 300);
    int n_ok = 0;
    for (int i = 0; i < 300; i++) n_ok += lg[i] == 1.0f;
    CHECK(n_ok == 1 && lg[256] == 1.0f);
    CHECK(gr_state_accept(s, 256, NULL) == HN_OK);
    CHECK(gr_state_accept(s, 't', NULL) == HN_ERR_INVALID);
    gr_accept_fn(s, 't');
    CHECK(gr_state_failed(s));
    gr_state_reset(s);
    CHECK(!gr_state_failed(s) && !gr_state_done(s) && gr_state_allows(s, 'f'));
    gr_state_free(s);
    gr_grammar_free(g);
    json_decref(sch);
    gr_vocab_free(v);
}

/* ---- random generation ---- */

typedef struct {
    char **text;      /* per token */
    int32_t *lens;
    uint8_t *flags;
    int32_t n;
} vocab_src;

static uint64_t rng_state;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* All bytes, then pieces likely in JSON and tool calls, then random words; the
 * last three: EOG, a control token "<|im_start|>", a control "<tool_call>". */
static void synth_vocab(vocab_src *vs) {
    static const char *pieces[] = {
        "{\"", "\":", "\": ", "\", \"", "\"}", "}}", "}\n", "\n", " ", ", ", "\"", "\\\"", "\\n", "\\u", "\\u00e9",
        "\\ud83d", "name", "arguments", "parameters", "\"name\"", "\"arguments\"", "<tool_call>", "</tool_call>",
        "<tool_call>\n", "\n</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">\n",
        "\n</", "<think>", "</think>", "think", "true", "false", "null", "nul", "tr", "123", "0", "-1", "1.5",
        "e+", "E", "[]", "{}", "[\"", "\"]", "],", "},", "]}", "get_weather", "city", "Paris", "read_file", "path",
        "/tmp/a.c", "offset", "limit", "edit", "old", "new", "replace_all", "search", "query", "filters", "lang",
        "max", "tags", "unit", "celsius", "fahrenheit", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xe2\x82",
        "\x82\xac", "\xc3", "a\xc3", "\xa9z", "\t", "\r\n", "  ", "    ", "\n\n", "</", "<", ">", "=", "param",
        "eter", "func", "tion", "tool", "_call", "weather", "_file", "\": \"", "\": {", "\": [", "\": 1", ", \"",
        "\"\n", "\"\n}", "\n}\n", "ok", "Hello", " world", "<|im_end|>", "<b>", "</b>",
    };
    int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    int n_words = 200;
    vs->n = 256 + n_pieces + n_words + 3;
    vs->text = calloc((size_t)vs->n, sizeof *vs->text);
    vs->lens = calloc((size_t)vs->n, sizeof *vs->lens);
    vs->flags = calloc((size_t)vs->n, 1);
    int k = 0;
    for (int i = 0; i < 256; i++, k++) {
        vs->text[k] = malloc(1);
        vs->text[k][0] = (char)i;
        vs->lens[k] = 1;
    }
    for (int i = 0; i < n_pieces; i++, k++) {
        vs->text[k] = strdup(pieces[i]);
        vs->lens[k] = (int32_t)strlen(pieces[i]);
    }
    rng_state = 12345;
    for (int i = 0; i < n_words; i++, k++) {
        int len = 2 + (int)(rnd() % 7);
        vs->text[k] = malloc((size_t)len + 1);
        static const char alpha[] = "abcdefghijklmnopqrstuvwxyz_ \"{}[]:,0123456789";
        for (int j = 0; j < len; j++) vs->text[k][j] = alpha[rnd() % (sizeof alpha - 1)];
        vs->text[k][len] = 0;
        vs->lens[k] = len;
    }
    vs->text[k] = strdup("<|endoftext|>");
    vs->lens[k] = 13;
    vs->flags[k++] = GR_TOK_EOG;
    vs->text[k] = strdup("<|im_start|>");
    vs->lens[k] = 12;
    vs->flags[k++] = GR_TOK_SPECIAL;
    vs->text[k] = strdup("<tool_call>");
    vs->lens[k] = 11;
    vs->flags[k++] = GR_TOK_SPECIAL;
}

static void synth_free(vocab_src *vs) {
    for (int i = 0; i < vs->n; i++) free(vs->text[i]);
    free(vs->text);
    free(vs->lens);
    free(vs->flags);
}

typedef struct {
    char *buf;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->buf = realloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->n, p, n);
    b->n += n;
    b->buf[b->n] = 0;
}

typedef struct {
    const char *const *text; /* token bytes */
    const int32_t *lens;
    const uint8_t *flags;
    int32_t n_vocab;
    int32_t max_tokens;
    double t_mask, t_accept; /* seconds */
    int64_t n_steps;
    uint8_t *closing; /* per token: text that tends to end things (set by generate) */
    int32_t finish_after; /* then tokens follow gr_state_completion */
} gen_ctx;

/* Random logits alone rarely end a string or a raw-text parameter; after a
 * while, tokens holding closing characters or tag words get a growing bonus
 * (a test device only: any token may still be drawn). */
static void mark_closing(gen_ctx *c) {
    if (c->closing) return;
    c->closing = calloc((size_t)c->n_vocab, 1);
    for (int32_t i = 0; i < c->n_vocab; i++) {
        const char *t = c->text[i];
        int32_t n = c->lens[i];
        for (int32_t k = 0; k < n; k++)
            if (strchr("\"<>\n}]", t[k]) && t[k]) c->closing[i] = 1;
        static const char *words[] = {"param", "function", "tool_call", "think"};
        for (int w = 0; w < 4; w++)
            if (n && memmem(t, (size_t)n, words[w], strlen(words[w]))) c->closing[i] = 1;
        if (c->flags[i] & GR_TOK_EOG) c->closing[i] = 1;
    }
}

/* Generates with random logits through the sampler's mask hook until EOG;
 * returns 1 complete, 0 ran out of tokens, -1 on a grammar/sampler failure. */
static int generate(gen_ctx *c, const gr_grammar *g, const gr_vocab *v, uint64_t seed, sbuf *out) {
    smp_params p = smp_default_params();
    p.temp = 1.0f;
    p.top_k = 40;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    smp_sampler *smp = smp_new(&p, c->n_vocab);
    gr_state *s = NULL;
    if (!smp || gr_state_new(g, v, &s, NULL) != HN_OK) {
        smp_free(smp);
        return -1;
    }
    smp_set_mask(smp, gr_mask_fn, s);
    float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
    mark_closing(c);
    rng_state = seed * 2654435761u + 1;
    out->n = 0;
    sb_put(out, "", 0);
    int rc = 0;
    char want_buf[4096];
    const char *want = want_buf;
    int64_t want_n = -1;
    for (int t = 0; t < c->max_tokens; t++) {
        float bonus = t > 30 ? (float)(t - 30) * 0.1f : 0.0f;
        if (bonus > 20.0f) bonus = 20.0f;
        for (int32_t i = 0; i < c->n_vocab; i++)
            logits[i] = (float)(rnd() % 10000) / 1000.0f + (c->closing[i] ? bonus : 0.0f);
        double a = hn_now_s();
        int32_t tok = smp_sample(smp, logits);
        if (t >= c->finish_after) { /* out of patience: follow the shortest completion */
            if (want_n < 0) {
                want_n = gr_state_completion(s, want_buf, sizeof want_buf);
                if (want_n > (int64_t)sizeof want_buf) want_n = -1;
                want = want_buf;
            }
            int64_t wl = want_n;
            int32_t best = -1;
            for (int32_t i = 0; wl >= 0 && i < c->n_vocab; i++) {
                bool fits = wl == 0 ? (c->flags[i] & GR_TOK_EOG) != 0
                                    : c->lens[i] > 0 && c->lens[i] <= wl && !memcmp(c->text[i], want, (size_t)c->lens[i]) &&
                                          !(c->flags[i] & GR_TOK_EOG);
                if (fits && gr_state_allows(s, i) && (best < 0 || c->lens[i] > c->lens[best])) best = i;
            }
            if (best < 0) {
                fprintf(stderr, "no token along the completion (%lld bytes)\n", (long long)wl);
                rc = -1;
                break;
            }
            tok = best;
            want += c->lens[tok];
            want_n -= c->lens[tok];
        }
        double b = hn_now_s();
        if (tok < 0) {
            rc = -1;
            break;
        }
        gr_accept_fn(s, tok);
        double d = hn_now_s();
        c->t_mask += b - a;
        c->t_accept += d - b;
        c->n_steps++;
        if (gr_state_failed(s)) {
            rc = -1;
            break;
        }
        if (c->flags[tok] & GR_TOK_EOG) {
            rc = gr_state_done(s) ? 1 : -1;
            break;
        }
        sb_put(out, c->text[tok], (size_t)c->lens[tok]);
    }
    free(logits);
    gr_state_free(s);
    smp_free(smp);
    return rc;
}

typedef struct {
    json_t *calls; /* [{"name":..., "args": "..."}] */
} tc_collect;

static void on_tc(void *user, const tc_event *ev) {
    tc_collect *c = user;
    if (ev->kind == TC_EV_CALL_START) {
        json_array_append_new(c->calls, json_pack("{s:s,s:s,s:b}", "name", ev->name, "args", "", "known", ev->known_tool));
    } else if (ev->kind == TC_EV_CALL_ARGS) {
        json_t *call = json_array_get(c->calls, (size_t)ev->index);
        const char *old = json_string_value(json_object_get(call, "args"));
        size_t ol = strlen(old);
        char *nw = malloc(ol + ev->len + 1);
        memcpy(nw, old, ol);
        memcpy(nw + ol, ev->text, ev->len);
        nw[ol + ev->len] = 0;
        json_object_set_new(call, "args", json_string(nw));
        free(nw);
    } else if (ev->kind == TC_EV_CONTENT) {
        for (size_t i = 0; i < ev->len; i++)
            if (!strchr(" \n", ev->text[i])) {
                json_array_append_new(c->calls, json_pack("{s:s}", "content", "stray"));
                break;
            }
    }
}

static const json_t *tool_schema(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        if (!f) f = t;
        if (!strcmp(json_string_value(json_object_get(f, "name")), name)) return json_object_get(f, "parameters");
    }
    return NULL;
}

/* Checks that text holds valid calls of offered tools (only `name` if set). */
static int check_calls(const char *text, tc_format fmt, unsigned flags, const json_t *tools, const char *name,
                       int parallel, char *why, size_t wcap) {
    tc_parser *p = NULL;
    tc_options o = {flags, 0, 1};
    if (tc_parser_new(fmt, tools, &o, &p, NULL) != HN_OK) return snprintf(why, wcap, "parser"), 0;
    tc_collect c = {json_array()};
    tc_parser_feed(p, text, strlen(text), on_tc, &c);
    tc_parser_finish(p, on_tc, &c);
    tc_parser_free(p);
    int ok = json_array_size(c.calls) >= 1 && (parallel || json_array_size(c.calls) == 1);
    if (!ok) snprintf(why, wcap, "%zu calls", json_array_size(c.calls));
    size_t i;
    json_t *call;
    json_array_foreach(c.calls, i, call) {
        if (!ok) break;
        const char *n = json_string_value(json_object_get(call, "name"));
        if (!n) {
            snprintf(why, wcap, "stray content");
            ok = 0;
            break;
        }
        const json_t *sch = tool_schema(tools, n);
        if (!sch || (name && strcmp(n, name)) || !json_is_true(json_object_get(call, "known"))) {
            snprintf(why, wcap, "bad name %s", n);
            ok = 0;
            break;
        }
        json_error_t e;
        json_t *args = json_loads(json_string_value(json_object_get(call, "args")), 0, &e);
        if (!args || !valid(args, sch, sch)) {
            snprintf(why, wcap, "args invalid: %s", json_string_value(json_object_get(call, "args")));
            ok = 0;
        }
        json_decref(args);
    }
    json_decref(c.calls);
    return ok;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\"},\"offset\":{\"type\":\"integer\"},\"limit\":{\"type\":\"number\"}},"
    "\"required\":[\"path\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"edit\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\"},\"old\":{\"type\":\"string\"},\"new\":{\"type\":\"string\"},"
    "\"replace_all\":{\"type\":\"boolean\"}},\"required\":[\"path\",\"old\",\"new\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"query\":{\"type\":\"string\"},\"filters\":{\"type\":\"object\",\"properties\":{\"lang\":{\"type\":[\"string\",\"null\"]},"
    "\"max\":{\"type\":\"integer\"}},\"required\":[\"lang\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
    "\"maxItems\":3}},\"required\":[\"query\",\"filters\"]}}}]";

static const char *SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\"},\"score\":{\"type\":\"number\"},"
    "\"ok\":{\"type\":\"boolean\"},\"items\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":4}},"
    "\"required\":[\"answer\",\"ok\",\"items\"]}",
    "{\"$defs\":{\"step\":{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"read\",\"write\"]},"
    "\"sub\":{\"anyOf\":[{\"$ref\":\"#/$defs/step\"},{\"type\":\"null\"}]}},\"required\":[\"kind\",\"sub\"]}},"
    "\"type\":\"object\",\"properties\":{\"plan\":{\"$ref\":\"#/$defs/step\"},\"n\":{\"oneOf\":[{\"type\":\"integer\"},"
    "{\"type\":\"string\"}]}},\"required\":[\"plan\"]}",
};

static void run_schemas(gen_ctx *c, const gr_vocab *v, int seeds, const char *label) {
    sbuf out = {0};
    for (size_t k = 0; k <= sizeof SCHEMAS / sizeof SCHEMAS[0]; k++) {
        json_t *sch = k < sizeof SCHEMAS / sizeof SCHEMAS[0] ? js(SCHEMAS[k]) : NULL;
        gr_grammar *g = NULL;
        hn_err err;
        hn_status st = sch ? gr_from_schema(sch, &g, &err) : gr_any_object(&g, &err);
        CHECKF(st == HN_OK, "%s: schema %zu: %s", label, k, err.msg);
        if (st != HN_OK) continue;
        int complete = 0, bad = 0;
        for (int seed = 0; seed < seeds; seed++) {
            int rc = generate(c, g, v, (uint64_t)seed + 1000 * k, &out);
            if (rc < 0) {
                bad++;
                fprintf(stderr, "%s schema %zu seed %d: failure after %s\n", label, k, seed, out.buf);
                continue;
            }
            if (!rc) continue;
            complete++;
            json_error_t e;
            json_t *j = json_loads(out.buf, 0, &e);
            int ok = j && (sch ? valid(j, sch, sch) : json_is_object(j));
            if (!ok) {
                bad++;
                fprintf(stderr, "%s schema %zu seed %d: invalid: %s\n", label, k, seed, out.buf);
            }
            json_decref(j);
        }
        CHECKF(bad == 0, "%s: schema %zu: %d bad outputs", label, k, bad);
        CHECKF(complete == seeds, "%s: schema %zu: only %d of %d complete", label, k, complete, seeds);
        gr_grammar_free(g);
        json_decref(sch);
    }
    free(out.buf);
}

static void run_tools(gen_ctx *c, const gr_vocab *v, int seeds, const char *label) {
    json_t *tools = js(TOOLS);
    sbuf out = {0};
    static const struct {
        tc_format fmt;
        const char *name;
        bool parallel;
        gr_think think;
    } modes[] = {
        {TC_FORMAT_HERMES, NULL, false, GR_THINK_NONE},
        {TC_FORMAT_HERMES, "search", true, GR_THINK_NONE},
        {TC_FORMAT_HERMES, NULL, true, GR_THINK_OPTIONAL},
        {TC_FORMAT_QWEN_XML, NULL, false, GR_THINK_NONE},
        {TC_FORMAT_QWEN_XML, "edit", true, GR_THINK_NONE},
        {TC_FORMAT_QWEN_XML, "search", false, GR_THINK_OPEN},
    };
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        gr_tool_opts o = {modes[m].fmt, modes[m].name, modes[m].parallel, modes[m].think};
        gr_grammar *g = NULL;
        hn_err err;
        hn_status st = gr_from_tools(tools, &o, &g, &err);
        CHECKF(st == HN_OK, "%s: tools mode %zu: %s", label, m, err.msg);
        if (st != HN_OK) continue;
        int complete = 0, bad = 0;
        for (int seed = 0; seed < seeds; seed++) {
            int rc = generate(c, g, v, (uint64_t)seed + 7919 * m, &out);
            if (rc < 0) {
                bad++;
                fprintf(stderr, "%s tools mode %zu seed %d: failure after %s\n", label, m, seed, out.buf);
                continue;
            }
            if (!rc) {
                if (getenv("GR_DEBUG")) fprintf(stderr, "%s tools mode %zu seed %d incomplete: %s\n", label, m, seed, out.buf);
                continue;
            }
            complete++;
            char why[300];
            unsigned fl = modes[m].think ? TC_FLAG_REASONING : 0;
            const char *text = out.buf;
            char *prefixed = NULL;
            if (modes[m].think == GR_THINK_OPEN) { /* the prompt opened the block */
                prefixed = malloc(out.n + 8);
                memcpy(prefixed, "<think>", 7);
                memcpy(prefixed + 7, out.buf, out.n + 1);
                text = prefixed;
            }
            if (!check_calls(text, modes[m].fmt, fl, tools, modes[m].name, modes[m].parallel, why, sizeof why)) {
                bad++;
                fprintf(stderr, "%s tools mode %zu seed %d: %s in:\n%s\n", label, m, seed, why, out.buf);
            }
            free(prefixed);
        }
        CHECKF(bad == 0, "%s: tools mode %zu: %d bad outputs", label, m, bad);
        CHECKF(complete == seeds, "%s: tools mode %zu: only %d of %d complete", label, m, complete, seeds);
        gr_grammar_free(g);
    }
    free(out.buf);
    json_decref(tools);
}

/* ---- the exported bitmask ---- */

static int bit(const uint32_t *m, int32_t t) { return (int)((m[t >> 5] >> (t & 31)) & 1u); }

/* Puts b back at the path's end: reset, then accept every path token. */
static int replay(gr_state *b, const int32_t *path, int n) {
    gr_state_reset(b);
    for (int i = 0; i < n; i++)
        if (gr_state_accept(b, path[i], NULL) != HN_OK) return 0;
    return 1;
}

typedef struct {
    int64_t states, oracle, allowed_seen, refused_seen, eog_seen;
    int pad_ok, hook_ok, wide_ok, allows_ok, oracle_ok, end_ok;
} bm_stats;

/* Walks `paths` random allowed paths of up to `steps` tokens through g and
 * checks, in every state met: the bitmask against an oracle that offers each
 * token to gr_state_accept on a second state brought to the same point (every
 * token when n_probe <= 0, else n_probe random tokens plus n_probe allowed
 * ones); the bits past the vocabulary clear; gr_state_mask (the float mask
 * hook) == smp_apply_allowed(gr_state_allowed) on random logits, also for a
 * row wider than the vocabulary; gr_state_allows == the bit; after an EOG
 * token an all-zero mask. */
static void walk_bitmasks(const gr_grammar *g, const gr_vocab *v, const uint8_t *flags, int paths, int steps,
                          int n_probe, uint64_t seed, bm_stats *st) {
    int32_t nv = gr_vocab_n(v), words = (nv + 31) / 32, wide = nv + 37;
    gr_state *a = NULL, *b = NULL;
    if (gr_state_new(g, v, &a, NULL) != HN_OK || gr_state_new(g, v, &b, NULL) != HN_OK) {
        st->oracle_ok = 0;
        gr_state_free(a);
        return;
    }
    uint32_t *m = malloc(sizeof(uint32_t) * (size_t)words);
    float *x = malloc(sizeof(float) * (size_t)wide), *hook = malloc(sizeof(float) * (size_t)wide),
          *ap = malloc(sizeof(float) * (size_t)wide);
    int32_t *path = malloc(sizeof(int32_t) * (size_t)(steps + 1)), *allowed = malloc(sizeof(int32_t) * (size_t)nv);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 7;
    for (int pi = 0; pi < paths; pi++) {
        gr_state_reset(a);
        int n = 0, b_at = -1; /* b sits at the end of path[0..b_at) (-1: unknown) */
        for (int step = 0; step <= steps; step++) {
            memcpy(m, gr_state_allowed(a), sizeof(uint32_t) * (size_t)words);
            st->states++;
            if (nv % 32) st->pad_ok &= (m[words - 1] >> (nv % 32)) == 0;
            for (int32_t t = 0; t < wide; t++) x[t] = (float)(rnd() % 2001) / 100.0f - 10.0f;
            memcpy(hook, x, sizeof(float) * (size_t)wide);
            memcpy(ap, x, sizeof(float) * (size_t)wide);
            gr_state_mask(a, hook, nv);
            smp_apply_allowed(ap, m, nv);
            st->hook_ok &= !memcmp(hook, ap, sizeof(float) * (size_t)nv);
            memcpy(hook, x, sizeof(float) * (size_t)wide);
            gr_state_mask(a, hook, wide);
            int w_ok = !memcmp(hook, ap, sizeof(float) * (size_t)nv);
            for (int32_t t = nv; t < wide; t++) w_ok &= hook[t] == -INFINITY;
            st->wide_ok &= w_ok;
            int32_t n_allowed = 0;
            for (int32_t t = 0; t < nv; t++)
                if (bit(m, t)) allowed[n_allowed++] = t;
            /* the oracle */
            int32_t n_check = n_probe <= 0 ? nv : 2 * n_probe;
            for (int32_t k = 0; k < n_check; k++) {
                int32_t t = n_probe <= 0 ? k
                            : k < n_probe || !n_allowed ? (int32_t)(rnd() % (uint64_t)nv)
                                                        : allowed[rnd() % (uint64_t)n_allowed];
                if (b_at != n) {
                    if (!replay(b, path, n)) {
                        st->oracle_ok = 0;
                        break;
                    }
                    b_at = n;
                }
                int ok = gr_state_accept(b, t, NULL) == HN_OK;
                if (ok) b_at = -1; /* b moved on */
                st->oracle++;
                if (ok != bit(m, t) && st->oracle_ok)
                    fprintf(stderr, "bitmask: token %d: bit %d, accept %s (step %d)\n", (int)t, bit(m, t),
                            ok ? "ok" : "refused", step);
                st->oracle_ok &= ok == bit(m, t);
                st->allows_ok &= gr_state_allows(a, t) == (bit(m, t) != 0);
                if (ok) st->allowed_seen++;
                else st->refused_seen++;
            }
            if (!n_allowed || step == steps) break;
            /* next: a random allowed token, EOG only now and then */
            int32_t tok = allowed[rnd() % (uint64_t)n_allowed];
            for (int tries = 0; tries < 8 && (flags[tok] & GR_TOK_EOG) && n_allowed > 1 && rnd() % 4; tries++)
                tok = allowed[rnd() % (uint64_t)n_allowed];
            if (gr_state_accept(a, tok, NULL) != HN_OK) {
                st->oracle_ok = 0;
                break;
            }
            path[n++] = tok;
            if (flags[tok] & GR_TOK_EOG) {
                st->eog_seen++;
                const uint32_t *z = gr_state_allowed(a);
                int zero = 1;
                for (int32_t w = 0; w < words; w++) zero &= z[w] == 0;
                st->end_ok &= zero;
            }
        }
    }
    free(m);
    free(x);
    free(hook);
    free(ap);
    free(path);
    free(allowed);
    gr_state_free(a);
    gr_state_free(b);
}

/* The bitmask over every schema, any object and each tool-call format. */
static void check_bitmasks(const gr_vocab *v, const uint8_t *flags, int paths, int steps, int n_probe,
                           const char *label) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bm_stats st = {0};
    st.pad_ok = st.hook_ok = st.wide_ok = st.allows_ok = st.oracle_ok = st.end_ok = 1;
    int n_grammars = 0;
    json_t *tools = js(TOOLS);
    for (size_t k = 0; k <= sizeof SCHEMAS / sizeof SCHEMAS[0]; k++) {
        json_t *sch = k < sizeof SCHEMAS / sizeof SCHEMAS[0] ? js(SCHEMAS[k]) : NULL;
        gr_grammar *g = NULL;
        if ((sch ? gr_from_schema(sch, &g, NULL) : gr_any_object(&g, NULL)) == HN_OK) {
            walk_bitmasks(g, v, flags, paths, steps, n_probe, 100 + k, &st);
            n_grammars++;
        }
        gr_grammar_free(g);
        json_decref(sch);
    }
    static const gr_tool_opts modes[] = {
        {TC_FORMAT_HERMES, NULL, false, GR_THINK_NONE},
        {TC_FORMAT_HERMES, "search", true, GR_THINK_OPTIONAL},
        {TC_FORMAT_QWEN_XML, NULL, true, GR_THINK_NONE},
        {TC_FORMAT_QWEN_XML, "edit", false, GR_THINK_OPEN},
        {TC_FORMAT_LLAMA3, NULL, true, GR_THINK_NONE},
    };
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        gr_grammar *g = NULL;
        if (gr_from_tools(tools, &modes[k], &g, NULL) == HN_OK) {
            walk_bitmasks(g, v, flags, paths, steps, n_probe, 200 + k, &st);
            n_grammars++;
        }
        gr_grammar_free(g);
    }
    json_decref(tools);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s: %lld states, %lld tokens offered to the oracle, %.1f s\n", label, (long long)st.states,
           (long long)st.oracle, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    CHECKF(n_grammars == 8, "%s: %d grammars built", label, n_grammars);
    CHECKF(st.oracle_ok, "%s: bitmask == accept oracle (%lld states, %lld tokens: %lld allowed, %lld refused)", label,
           (long long)st.states, (long long)st.oracle, (long long)st.allowed_seen, (long long)st.refused_seen);
    CHECKF(st.allowed_seen > 100 && st.refused_seen > 100 && st.states > 50, "%s: the oracle saw both sides", label);
    CHECKF(st.hook_ok && st.wide_ok, "%s: gr_state_mask == smp_apply_allowed(gr_state_allowed) (and -inf past the vocabulary)", label);
    CHECKF(st.pad_ok && st.allows_ok, "%s: padding bits clear, gr_state_allows == bit", label);
    CHECKF(st.end_ok, "%s: all-zero mask after EOG (%lld times)", label, (long long)st.eog_seen);
}

/* ---- the completion search's byte classes against trying every byte ---- */

typedef struct {
    int64_t compared, found, none;
    double t_fast, t_ref; /* seconds */
} comp_stats;

/* Two fresh states fed the same text: gr_state_completion and the reference
 * (every byte of every configuration, gr_state_completion_ref) must give the
 * same answer, also where the search gives up at its bounds, and a
 * completion must end the grammar. */
static void compare_completion(const gr_grammar *g, const gr_vocab *v, const char *text, size_t n, comp_stats *st,
                               const char *label) {
    gr_state *a = NULL, *b = NULL;
    if (gr_state_new(g, v, &a, NULL) != HN_OK || gr_state_new(g, v, &b, NULL) != HN_OK) {
        CHECKF(0, "%s: gr_state_new", label);
        gr_state_free(a);
        return;
    }
    if (gr_state_accept_bytes(a, text, n, NULL) == HN_OK && gr_state_accept_bytes(b, text, n, NULL) == HN_OK) {
        static char ca[8192], cb[8192];
        double t0 = hn_now_s();
        int64_t ra = gr_state_completion(a, ca, sizeof ca);
        double t1 = hn_now_s();
        int64_t rb = gr_state_completion_ref(b, cb, sizeof cb);
        st->t_fast += t1 - t0;
        st->t_ref += hn_now_s() - t1;
        size_t m = ra > 0 ? (size_t)(ra < (int64_t)sizeof ca ? ra : (int64_t)sizeof ca) : 0;
        CHECKF(ra == rb && !memcmp(ca, cb, m), "%s: after %zu bytes the completion is %lld bytes, the reference's %lld",
               label, n, (long long)ra, (long long)rb);
        if (ra > 0 && ra <= (int64_t)sizeof ca)
            CHECKF(gr_state_accept_bytes(a, ca, (size_t)ra, NULL) == HN_OK && gr_state_done(a),
                   "%s: the completion does not end the grammar", label);
        st->compared++;
        st->found += ra > 0;
        st->none += ra < 0;
    }
    gr_state_free(a);
    gr_state_free(b);
}

/* Random paths over normal tokens (so that the text replays as bytes),
 * compared every few tokens. */
static void completion_paths(const gr_grammar *g, const gr_vocab *v, const vocab_src *vs, int paths, int steps,
                             comp_stats *st, const char *label) {
    static char text[16384];
    for (int p = 0; p < paths; p++) {
        gr_state *s = NULL;
        if (gr_state_new(g, v, &s, NULL) != HN_OK) return;
        rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(p + 1);
        size_t n = 0;
        for (int t = 0; t < steps; t++) {
            if (t % 5 == 0) compare_completion(g, v, text, n, st, label);
            const uint32_t *m = gr_state_allowed(s);
            int32_t pick = -1, seen = 0;
            for (int32_t i = 0; i < vs->n; i++)
                if ((m[i >> 5] >> (i & 31) & 1) && !vs->flags[i] && vs->lens[i] > 0 && rnd() % (uint64_t)++seen == 0)
                    pick = i;
            if (pick < 0 || n + (size_t)vs->lens[pick] > sizeof text) break;
            if (gr_state_accept(s, pick, NULL) != HN_OK) {
                CHECKF(0, "%s: token %d of the mask refused", label, pick);
                break;
            }
            memcpy(text + n, vs->text[pick], (size_t)vs->lens[pick]);
            n += (size_t)vs->lens[pick];
        }
        gr_state_free(s);
    }
}

static void test_completion_ref(void) {
    vocab_src vs;
    synth_vocab(&vs);
    gr_vocab *v = NULL;
    CHECK(gr_vocab_new(vs.n, (const char *const *)vs.text, vs.lens, vs.flags, &v, NULL) == HN_OK);
    comp_stats st = {0};
    int paths = sanitized() ? 1 : 2;
    for (size_t k = 0; k <= sizeof SCHEMAS / sizeof SCHEMAS[0]; k++) {
        json_t *sch = k < sizeof SCHEMAS / sizeof SCHEMAS[0] ? js(SCHEMAS[k]) : NULL;
        gr_grammar *g = NULL;
        if ((sch ? gr_from_schema(sch, &g, NULL) : gr_any_object(&g, NULL)) == HN_OK)
            completion_paths(g, v, &vs, paths, 50, &st, "schema");
        gr_grammar_free(g);
        json_decref(sch);
    }
    static const tc_format fmts[] = {TC_FORMAT_HERMES, TC_FORMAT_QWEN_XML, TC_FORMAT_LLAMA3};
    json_t *tools = js(TOOLS);
    for (int f = 0; f < 3; f++) {
        gr_tool_opts o = {fmts[f], NULL, f == 1, f == 2 ? GR_THINK_OPTIONAL : GR_THINK_NONE};
        gr_grammar *g = NULL;
        if (gr_from_tools(tools, &o, &g, NULL) == HN_OK) completion_paths(g, v, &vs, paths, 50, &st, "tools");
        gr_grammar_free(g);
    }
    json_decref(tools);
    /* the tool list that once made one search intern 32,729 configurations:
     * both searches stop at the same bound */
    FILE *fp = fopen("tests/fuzz/corpus/grammar/regress-completion-slow", "rb");
    CHECKF(fp != NULL, "tests/fuzz/corpus/grammar/regress-completion-slow missing");
    if (fp) {
        static char buf[8192];
        size_t n = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        json_t *list = n > 1 ? json_loadb(buf + 1, n - 1, 0, NULL) : NULL;
        gr_tool_opts o = {TC_FORMAT_HERMES, NULL, false, GR_THINK_NONE};
        gr_grammar *g = NULL;
        CHECK(list && gr_from_tools(list, &o, &g, NULL) == HN_OK);
        if (g) completion_paths(g, v, &vs, 1, 30, &st, "regress-completion-slow");
        gr_grammar_free(g);
        json_decref(list);
    }
    printf("completion: %lld states compared with the reference, %lld completed, %lld gave up; %.3f s searching, "
           "the reference %.3f s\n",
           (long long)st.compared, (long long)st.found, (long long)st.none, st.t_fast, st.t_ref);
    CHECKF(st.compared > 40 && st.found > 20 && st.none > 0, "the comparison saw completions and bounded searches");
    gr_vocab_free(v);
    synth_free(&vs);
}

static void test_synthetic(void) {
    vocab_src vs;
    synth_vocab(&vs);
    gr_vocab *v = NULL;
    CHECK(gr_vocab_new(vs.n, (const char *const *)vs.text, vs.lens, vs.flags, &v, NULL) == HN_OK);
    gen_ctx c = {(const char *const *)vs.text, vs.lens, vs.flags, vs.n, 1500, 0, 0, 0, NULL, 300};
    int seeds = sanitized() ? 12 : 60;
    run_schemas(&c, v, seeds, "synthetic");
    run_tools(&c, v, seeds, "synthetic");
    check_bitmasks(v, vs.flags, sanitized() ? 2 : 4, 60, 0, "synthetic bitmask");

    /* control tokens: <tool_call> may stand for the literal, <|im_start|> never */
    json_t *tools = js(TOOLS);
    gr_tool_opts o = {TC_FORMAT_HERMES, "edit", false, GR_THINK_NONE};
    gr_grammar *g = NULL;
    CHECK(gr_from_tools(tools, &o, &g, NULL) == HN_OK);
    gr_state *s = NULL;
    CHECK(gr_state_new(g, v, &s, NULL) == HN_OK);
    int32_t im_start = vs.n - 2, tc_special = vs.n - 1, eog = vs.n - 3;
    CHECK(gr_state_allows(s, tc_special) && !gr_state_allows(s, im_start) && !gr_state_allows(s, eog));
    CHECK(gr_state_accept(s, tc_special, NULL) == HN_OK);
    const char *pre = "\n{\"name\": \"edit\", \"arguments\": {\"path\": \"";
    CHECK(gr_state_accept_bytes(s, pre, strlen(pre), NULL) == HN_OK);
    CHECK(!gr_state_allows(s, im_start) && !gr_state_allows(s, tc_special) && gr_state_allows(s, '<'));
    gr_state_free(s);
    gr_grammar_free(g);
    json_decref(tools);
    free(c.closing);
    gr_vocab_free(v);
    synth_free(&vs);
}

static void test_qwen3(void) {
    char path[512];
    gguf_ctx *gg = NULL;
    tok_vocab *tv = NULL;
    hn_err err;
    CHECKF(gguf_open(test_data_path(path, sizeof path, "data/vocab/ggml-vocab-qwen3-npm.gguf"), &gg, &err) == HN_OK,
           "%s", err.msg);
    if (!gg) return;
    CHECKF(tok_load(gg, &tv, &err) == HN_OK, "%s", err.msg);
    gguf_close(gg);
    if (!tv) return;
    double a = hn_now_ms();
    gr_vocab *v = NULL;
    CHECK(gr_vocab_from_tok(tv, &v, &err) == HN_OK);
    double b = hn_now_ms();
    int32_t n = tok_n_vocab(tv);
    printf("qwen3 vocab: %d tokens, index built in %.1f ms\n", n,
           b - a);
    /* the token texts for the generator */
    char **text = calloc((size_t)n, sizeof *text);
    int32_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *flags = calloc((size_t)n, 1);
    int n_special = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t pl = tok_piece(tv, i, false, NULL, 0);
        lens[i] = pl > 0 ? pl : 0;
        text[i] = malloc((size_t)lens[i] + 1);
        tok_piece(tv, i, false, text[i], lens[i]);
        if (tok_is_eog(tv, i)) flags[i] = GR_TOK_EOG;
        else if (!pl && tok_piece(tv, i, true, NULL, 0) > 0) {
            flags[i] = GR_TOK_SPECIAL;
            n_special++;
        }
        if (flags[i] == GR_TOK_SPECIAL) { /* a control token appears as its text */
            int32_t sl = tok_piece(tv, i, true, NULL, 0);
            free(text[i]);
            text[i] = malloc((size_t)sl + 1);
            tok_piece(tv, i, true, text[i], sl);
            lens[i] = sl;
        }
    }
    CHECK(n_special > 0);
    gen_ctx c = {(const char *const *)text, lens, flags, n, 600, 0, 0, 0, NULL, 200};
    int seeds = sanitized() ? 2 : 6;
    run_tools(&c, v, seeds, "qwen3");
    run_schemas(&c, v, seeds, "qwen3");
    check_bitmasks(v, flags, 1, sanitized() ? 12 : 40, 48, "qwen3 bitmask");
    printf("qwen3: %lld steps, mask + sampling %.1f us/token, accept %.1f us/token\n", (long long)c.n_steps,
           c.t_mask / (double)c.n_steps * 1e6, c.t_accept / (double)c.n_steps * 1e6);
    free(c.closing);
    for (int32_t i = 0; i < n; i++) free(text[i]);
    free(text);
    free(lens);
    free(flags);
    gr_vocab_free(v);
    tok_free(tv);
}

int main(void) {
    test_texts();
    test_synthetic();
    test_completion_ref();
    test_qwen3();
    TEST_DONE();
}
