/* test_toolcall_fuzz.c: random model outputs made of markup fragments (tags,
 * half tags, JSON pieces, quotes, multi-byte text), fed to every format whole,
 * in random pieces and one byte at a time. The coalesced events must not
 * depend on the split, calls must be well formed (start, args, end; indices in
 * order) and every call's argument fragments must concatenate to a JSON object.
 * A seeded generator keeps failures reproducible. */
#include <jansson.h>

#include "template/toolcall.h"
#include "test.h"

typedef struct {
    char *buf; /* serialised coalesced events: kind byte, text, NUL */
    size_t n, cap;
    char last;
    int open, ncalls, bad;
    size_t args_at; /* offset of the open call's args text in buf */
    char why[128];
} rec;

static void put(rec *r, const char *s, size_t n) {
    if (r->n + n + 2 > r->cap) {
        r->cap = (r->n + n + 2) * 2;
        r->buf = realloc(r->buf, r->cap);
    }
    memcpy(r->buf + r->n, s, n);
    r->n += n;
}

static void bad(rec *r, const char *why) {
    if (!r->bad++) snprintf(r->why, sizeof r->why, "%s", why);
}

/* Checks that the open call's argument text is a JSON object. */
static void check_args(rec *r) {
    json_error_t e;
    json_t *v = json_loadb(r->buf + r->args_at, r->n - r->args_at, 0, &e);
    if (!json_is_object(v)) bad(r, "call arguments are not a JSON object");
    json_decref(v);
}

static void on_event(void *u, const tc_event *e) {
    rec *r = u;
    char k = "CRSAE"[e->kind];
    if ((k == 'C' || k == 'R' || k == 'A') && r->last == k) {
        put(r, e->text, e->len); /* coalesce */
        return;
    }
    if (r->last) put(r, "", 1); /* NUL between events */
    r->last = k;
    put(r, &k, 1);
    switch (e->kind) {
    case TC_EV_CONTENT:
    case TC_EV_REASONING:
        if (r->open >= 0) bad(r, "text inside a call");
        put(r, e->text, e->len);
        break;
    case TC_EV_CALL_START:
        if (r->open >= 0 || e->index != r->ncalls) bad(r, "bad call start");
        r->open = e->index;
        r->ncalls++;
        put(r, e->name, strlen(e->name));
        break;
    case TC_EV_CALL_ARGS:
        if (r->open != e->index) bad(r, "args outside call");
        r->args_at = r->n;
        put(r, e->text, e->len);
        break;
    case TC_EV_CALL_END:
        if (r->open != e->index) bad(r, "bad call end");
        r->open = -1;
        break;
    }
}

static void on_event_checked(void *u, const tc_event *e) {
    rec *r = u;
    if (e->kind == TC_EV_CALL_END) {
        if (r->last != 'A') bad(r, "call without arguments");
        else check_args(r);
    }
    on_event(u, e);
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"location\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":"
    "\"object\"}}}}},{\"name\":\"list_files\",\"parameters\":{\"type\":\"object\",\"properties\":{\"all\":{"
    "\"type\":\"boolean\"},\"paths\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}}]";

static const char *const FRAG[] = {
    "<tool_call>", "</tool_call>", "<tool_", "</tool", "<function=get_weather>", "<function=list_files>",
    "<function=nope>", "<function=", "</function>", "<parameter=location>", "<parameter=days>",
    "<parameter=opts>", "<parameter=all>", "<parameter=paths>", "<parameter=", "</parameter>", "</param",
    "<think>", "</think>", "<thi", "<|python_tag|>", "{", "}", "[", "]", "\"", "'", ":", ",", ";", "\\",
    "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": \"3\"}}",
    "{\"name\": \"list_files\", \"parameters\": {\"all\": \"true\"}}", "{'name': 'list_files'}",
    "\"name\": \"get_weather\"", "\"arguments\": {", "\"parameters\": ", "Paris", "5", "true", "{\"a\": [1, 2]}",
    "\n", "\n\n", " ", "\t", "text", "Hello, world.", "é", "日本", "🌤", "\xe2\x82", "<", ">", "=",
    "brave_search.call(query=\"x\")", "True", "None",
};

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static void run(tc_format fmt, unsigned flags, int sr, json_t *tools, const char *s, size_t n, const size_t *cuts,
                int ncuts, rec *r) {
    memset(r, 0, sizeof *r);
    r->open = -1;
    tc_options o = {.flags = flags, .start_in_reasoning = sr};
    tc_parser *p = NULL;
    if (tc_parser_new(fmt, tools, &o, &p, NULL) != HN_OK) {
        bad(r, "new failed");
        return;
    }
    size_t prev = 0;
    for (int i = 0; i <= ncuts; i++) {
        size_t e = i < ncuts ? cuts[i] : n;
        if (tc_parser_feed(p, s + prev, e - prev, on_event_checked, r) != HN_OK) bad(r, "feed failed");
        prev = e;
    }
    if (tc_parser_finish(p, on_event_checked, r) != HN_OK) bad(r, "finish failed");
    if (r->open >= 0) bad(r, "call left open");
    tc_parser_free(p);
}

static int same(const rec *a, const rec *b) { return a->n == b->n && (a->n == 0 || !memcmp(a->buf, b->buf, a->n)); }

static void show(const char *what, const char *s, size_t n) {
    fprintf(stderr, "%s (%zu bytes): ", what, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c == 0) fputs("|", stderr);
        else if (c < 0x20) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputc('\n', stderr);
}

int main(void) {
    json_error_t je;
    json_t *tools = json_loads(TOOLS, 0, &je);
    CHECK(tools != NULL);
    const char *san = getenv("HONE_SANITIZED");
    int iters = san && *san == '1' ? 600 : 3000;
    static const tc_format fmts[] = {TC_FORMAT_HERMES, TC_FORMAT_QWEN_XML, TC_FORMAT_LLAMA3, TC_FORMAT_NONE};
    int failures = 0;
    size_t cuts[4096];
    char s[4096];
    for (int it = 0; it < iters && failures < 5; it++) {
        rng_state = 0x9E3779B97F4A7C15ull * (uint64_t)(it + 1);
        size_t n = 0;
        int nf = 1 + (int)(rnd() % 24);
        for (int f = 0; f < nf; f++) {
            const char *fr = FRAG[rnd() % (sizeof FRAG / sizeof FRAG[0])];
            size_t l = strlen(fr);
            if (n + l >= sizeof s) break;
            memcpy(s + n, fr, l);
            n += l;
        }
        tc_format fmt = fmts[rnd() % 4];
        unsigned flags = rnd() % 2 ? TC_FLAG_REASONING : 0;
        int sr = rnd() % 4 == 0;
        json_t *tl = rnd() % 5 ? tools : NULL;

        rec whole, r;
        run(fmt, flags, sr, tl, s, n, NULL, 0, &whole);
        int ok = !whole.bad;
        const char *why = whole.why;
        /* random splits */
        for (int k = 0; k < 4 && ok; k++) {
            int nc = n > 1 ? 1 + (int)(rnd() % 6) : 0;
            size_t prev = 0;
            int m = 0;
            for (int c = 0; c < nc; c++) {
                size_t at = prev + 1 + rnd() % (n - prev > 1 ? (n - prev) / 2 + 1 : 1);
                if (at >= n) break;
                cuts[m++] = prev = at;
            }
            run(fmt, flags, sr, tl, s, n, cuts, m, &r);
            ok = !r.bad && same(&whole, &r);
            if (!ok) why = r.bad ? r.why : "random split differs";
            free(r.buf);
        }
        /* every two-way split, for a quarter of the inputs */
        for (size_t k = 1; k < n && ok && it % 4 == 0; k++) {
            run(fmt, flags, sr, tl, s, n, &k, 1, &r);
            ok = !r.bad && same(&whole, &r);
            if (!ok) why = r.bad ? r.why : "two-way split differs";
            free(r.buf);
        }
        /* one byte at a time */
        if (ok) {
            for (size_t k = 0; k + 1 < n; k++) cuts[k] = k + 1;
            run(fmt, flags, sr, tl, s, n, cuts, n ? (int)n - 1 : 0, &r);
            ok = !r.bad && same(&whole, &r);
            if (!ok) {
                why = r.bad ? r.why : "byte-at-a-time differs";
                show("  bytewise", r.buf, r.n);
            }
            free(r.buf);
        }
        if (!ok) {
            failures++;
            fprintf(stderr, "iteration %d: format %s flags %u start_in_reasoning %d tools %d: %s\n", it,
                    tc_format_name(fmt), flags, sr, tl != NULL, why);
            show("  input", s, n);
            show("  whole", whole.buf, whole.n);
        }
        CHECKF(ok, "fuzz iteration %d", it);
        free(whole.buf);
    }
    json_decref(tools);
    TEST_DONE();
}
