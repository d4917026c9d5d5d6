/* fuzz_grammar.c: a libFuzzer harness for the grammar compiler (JSON schema
 * and tool-call grammars, src/sample/grammar*.c) and the matcher on what it
 * builds. Input: a selector byte, then JSON: an object is a schema
 * (gr_from_schema), an array a tools list (gr_from_tools, the format,
 * parallel, think mode and a named tool taken from the selector byte).
 * A grammar that compiles is walked over a small vocabulary (every byte,
 * common JSON and markup pieces, an EOG and a special token) for up to 48
 * tokens chosen from the allowed mask by a hash of the input: each chosen
 * token must be allowed and accepted, a token outside the mask refused,
 * and the completion gr_state_completion offers (asked on one input in
 * eight, for speed) must end the grammar, its search within its bound; on
 * one of those in 128, two fresh states fed the same text must get the same
 * answer from it and from the reference search that tries every byte
 * (gr_state_completion_ref), also where both give up.
 * A schema grammar's finished text must parse as JSON. Seeds:
 * tests/fuzz/corpus/grammar (schemas and tool lists of the client traces). */
#include <jansson.h>
#include <string.h>

#include "fuzz_common.h"
#include "sample/grammar.h"
#include "sample/grammar_int.h"

static gr_vocab *g_gv;

static const char *const GR_PIECES[] = {
    "{\"", "\":", "\": ", "\",", "\", \"", "\"}", "}", "{", "[", "]", "true", "false", "null", "\"name\"",
    "\"arguments\"", "\"parameters\"", ", ", "0", "12", "-1", ".5", "e+3", "\\n", "\\u00e9", "\xc3\xa9",
    "\xe2\x82\xac", "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
    "<think>", "</think>", "\n", "  ", "<|python_tag|>", "; ", "abc", "type", "string",
};
#define GR_NPIECES ((int32_t)(sizeof GR_PIECES / sizeof *GR_PIECES))

static void fuzz_grammar_init(void) {
    if (g_gv) return;
    int32_t n = 256 + GR_NPIECES + 2;
    const char *bytes[256 + GR_NPIECES + 2];
    int32_t lens[256 + GR_NPIECES + 2];
    uint8_t flags[256 + GR_NPIECES + 2];
    static char single[256];
    for (int i = 0; i < 256; i++) {
        single[i] = (char)i;
        bytes[i] = &single[i];
        lens[i] = 1;
        flags[i] = 0;
    }
    for (int32_t i = 0; i < GR_NPIECES; i++) {
        bytes[256 + i] = GR_PIECES[i];
        lens[256 + i] = (int32_t)strlen(GR_PIECES[i]);
        flags[256 + i] = 0;
    }
    bytes[n - 2] = "";
    lens[n - 2] = 0;
    flags[n - 2] = GR_TOK_EOG;
    bytes[n - 1] = "<|im_start|>";
    lens[n - 1] = 12;
    flags[n - 1] = GR_TOK_SPECIAL;
    hn_err err = {0};
    if (gr_vocab_new(n, bytes, lens, flags, &g_gv, &err) != HN_OK) fuzz_fail("gr_vocab_new: %s", err.msg);
}

__attribute__((unused)) static void fuzz_grammar_free(void) { /* for the replay test */
    gr_vocab_free(g_gv);
    g_gv = NULL;
}

static bool mask_bit(const uint32_t *m, int32_t t) { return (m[t >> 5] >> (t & 31)) & 1u; }

/* The byte-class search against the reference, on two fresh states fed the
 * same text (the same history, so the same bounds bite). */
static void compare_ref(const gr_grammar *g, const char *text, size_t len) {
    gr_state *a = NULL, *b = NULL;
    hn_err err = {0};
    if (gr_state_new(g, g_gv, &a, &err) == HN_OK && gr_state_new(g, g_gv, &b, &err) == HN_OK &&
        gr_state_accept_bytes(a, text, len, &err) == HN_OK && gr_state_accept_bytes(b, text, len, &err) == HN_OK) {
        static char ca[2048], cb[2048];
        int64_t ra = gr_state_completion(a, ca, sizeof ca), rb = gr_state_completion_ref(b, cb, sizeof cb);
        size_t m = ra > 0 ? (size_t)(ra < (int64_t)sizeof ca ? ra : (int64_t)sizeof ca) : 0;
        if (ra != rb || memcmp(ca, cb, m))
            fuzz_fail("after %zu bytes the completion is %lld bytes, the reference's %lld", len, (long long)ra,
                      (long long)rb);
    }
    gr_state_free(a);
    gr_state_free(b);
}

static void fuzz_grammar_one(const uint8_t *data, size_t size) {
    if (size < 2 || size > 64 * 1024) return;
    uint8_t sel = data[0];
    json_t *j = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    if (!j) return;
    gr_grammar *g = NULL;
    hn_err err = {0};
    hn_status st;
    bool schema = json_is_object(j);
    if (schema) {
        st = (sel & 0x80) ? gr_any_object(&g, &err) : gr_from_schema(j, &g, &err);
    } else if (json_is_array(j)) {
        gr_tool_opts o;
        memset(&o, 0, sizeof o);
        static const tc_format fmts[] = {TC_FORMAT_HERMES, TC_FORMAT_QWEN_XML, TC_FORMAT_LLAMA3, TC_FORMAT_NONE};
        o.format = fmts[sel & 3];
        o.parallel = sel & 4;
        o.think = (gr_think)((sel >> 3) % 3);
        json_t *first = json_array_get(j, 0);
        const char *name = json_string_value(json_object_get(json_object_get(first, "function"), "name"));
        if (!name) name = json_string_value(json_object_get(first, "name"));
        o.name = (sel & 0x20) ? name : NULL;
        st = gr_from_tools(j, &o, &g, &err);
    } else {
        json_decref(j);
        return;
    }
    if (st != HN_OK) {
        if (g) fuzz_fail("the compiler failed but set *out");
        if (!err.msg[0]) fuzz_fail("the compiler failed (%d) without a message", (int)st);
        json_decref(j);
        return;
    }
    (void)gr_grammar_rules(g);
    gr_state *s = NULL;
    if (gr_state_new(g, g_gv, &s, &err) != HN_OK) {
        if (err.code == HN_ERR_NOMEM) goto out;
        fuzz_fail("gr_state_new: %s", err.msg);
    }
    int32_t nv = gr_vocab_n(g_gv);
    uint64_t rng = fuzz_hash(data, size);
    static char text[4096];
    size_t tlen = 0;
    bool eog = false, cut = false, special = false; /* cut: text did not fit; special: a control token is not in it */
    for (int step = 0; step < 48 && !eog; step++) {
        const uint32_t *m = gr_state_allowed(s);
        int32_t cnt = 0;
        for (int32_t t = 0; t < nv; t++) cnt += mask_bit(m, t);
        if (!cnt) break;
        int32_t pick = (int32_t)(fuzz_next(&rng) % (uint64_t)cnt), tok = -1;
        for (int32_t t = 0; t < nv; t++)
            if (mask_bit(m, t) && pick-- == 0) {
                tok = t;
                break;
            }
        /* a token outside the mask is refused (state unchanged) */
        int32_t bad = (int32_t)(fuzz_next(&rng) % (uint64_t)nv);
        if (!mask_bit(m, bad)) {
            if (gr_state_allows(s, bad)) fuzz_fail("token %d outside the mask is allowed", bad);
            if (gr_state_accept(s, bad, &err) == HN_OK) fuzz_fail("token %d outside the mask accepted", bad);
            m = gr_state_allowed(s);
        }
        if (!gr_state_allows(s, tok)) fuzz_fail("token %d of the mask not allowed", tok);
        hn_status a = gr_state_accept(s, tok, &err);
        if (a == HN_ERR_NOMEM) goto out;
        if (a != HN_OK) fuzz_fail("token %d of the mask refused: %s", tok, err.msg);
        if (tok == nv - 2) {
            eog = true;
        } else if (tok == nv - 1) {
            special = true;
        } else if (tok < 256) {
            if (tlen < sizeof text) text[tlen++] = (char)tok;
            else cut = true;
        } else if (tok < 256 + GR_NPIECES) {
            size_t l = strlen(GR_PIECES[tok - 256]);
            if (tlen + l <= sizeof text) memcpy(text + tlen, GR_PIECES[tok - 256], l), tlen += l;
            else cut = true;
        }
    }
    if (!eog && fuzz_next(&rng) % 8 == 0) { /* the search is slow: on one input in eight */
        /* the reference tries every byte: up to a few hundred times the search */
        if (fuzz_next(&rng) % 128 == 0 && !cut && !special) compare_ref(g, text, tlen);
        char comp[2048];
        int64_t n0, n1;
        gr_state_counters(s, &n0, NULL);
        int64_t c = gr_state_completion(s, comp, sizeof comp);
        gr_state_counters(s, &n1, NULL);
        if (n1 - n0 > GR_COMPLETION_NEW_CFGS + 64) /* the bound that keeps one search short */
            fuzz_fail("the completion search interned %lld configurations", (long long)(n1 - n0));
        if (c >= 0 && (size_t)c <= sizeof comp) {
            if (gr_state_accept_bytes(s, comp, (size_t)c, &err) != HN_OK)
                fuzz_fail("the completion (%lld bytes) is refused: %s", (long long)c, err.msg);
            if (!gr_state_done(s)) fuzz_fail("the completion (%lld bytes) does not end the grammar", (long long)c);
            if (tlen + (size_t)c <= sizeof text) memcpy(text + tlen, comp, (size_t)c), tlen += (size_t)c;
            else cut = true;
            eog = true;
        }
    }
    if (eog && schema && !cut) {
        json_error_t je;
        json_t *v = json_loadb(text, tlen, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v && !strstr(je.text, "too big") && !strstr(je.text, "overflow"))
            fuzz_fail("a finished schema text is not JSON (%s): %.*s", je.text, (int)tlen, text);
        json_decref(v);
    }
out:
    gr_state_free(s);
    gr_grammar_free(g);
    json_decref(j);
}

FUZZ_ENTRY(grammar)
