/* test_tokenizer.c: the tokenizer against llama.cpp's own test vectors.
 *
 * For every vocabulary in <shared>/data/vocab: X.gguf.inp holds test texts
 * separated by "\n__ggml_vocab_test__\n", X.gguf.out one line of ids per text
 * (llama.cpp's output with add_special=false, parse_special=false). Every case
 * must match exactly. On top: detokenizing gives the text back (piece by
 * piece and through the streaming detokenizer, which must never emit a split
 * UTF-8 character), special-token parsing, BOS rules, EOG detection, malformed
 * input, and the speed of a long prompt. */
#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "gguf/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static tok_vocab *load_vocab(const char *path, hn_status *st_out, char *msg, size_t msg_cap) {
    hn_err err = {0};
    gguf_ctx *g = NULL;
    hn_status st = gguf_open(path, &g, &err);
    tok_vocab *v = NULL;
    if (st == HN_OK) st = tok_load(g, &v, &err);
    gguf_close(g);
    if (st_out) *st_out = st;
    if (msg) snprintf(msg, msg_cap, "%s", err.msg);
    return v;
}

/* encode into a malloc'd array; returns count (or -1) */
static int64_t enc(const tok_vocab *v, const char *s, size_t n, bool add_special, bool parse_special, int32_t **ids) {
    int64_t cnt = tok_encode(v, s, n, add_special, parse_special, NULL, 0);
    *ids = NULL;
    if (cnt < 0) return cnt;
    *ids = malloc(sizeof(int32_t) * (size_t)(cnt + 1));
    int64_t again = tok_encode(v, s, n, add_special, parse_special, *ids, cnt);
    return again == cnt ? cnt : -1;
}

static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || i + need > n) return false;
        for (size_t k = 1; k < need; k++)
            if ((u[i + k] & 0xC0) != 0x80) return false;
        if (c == 0xE0 && u[i + 1] < 0xA0) return false;
        if (c == 0xED && u[i + 1] > 0x9F) return false;
        if (c == 0xF0 && u[i + 1] < 0x90) return false;
        if (c == 0xF4 && u[i + 1] > 0x8F) return false;
        i += need;
    }
    return true;
}

static int split_pieces; /* tokens whose own piece was not whole UTF-8 (exercise the stream) */

/* Detokenizes ids through the stream; checks each chunk is whole UTF-8; returns malloc'd text. */
static char *stream_detok(const tok_vocab *v, const int32_t *ids, int64_t n, size_t *len, bool *chunks_ok) {
    size_t cap = 64, w = 0;
    char *buf = malloc(cap);
    tok_stream s = {0};
    *chunks_ok = true;
    for (int64_t i = 0; i <= n; i++) {
        char chunk[4096];
        size_t k = i < n ? tok_stream_push(v, &s, ids[i], chunk, sizeof chunk) : tok_stream_flush(&s, chunk, sizeof chunk);
        if (i < n) {
            char p[4096];
            int32_t pn = tok_piece(v, ids[i], false, p, sizeof p);
            if (pn > 0 && !valid_utf8(p, (size_t)pn)) split_pieces++;
        }
        if (!valid_utf8(chunk, k)) *chunks_ok = false;
        if (w + k + 1 > cap) {
            cap = (w + k + 1) * 2;
            buf = realloc(buf, cap);
        }
        memcpy(buf + w, chunk, k);
        w += k;
    }
    buf[w] = 0;
    *len = w;
    return buf;
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    fprintf(stderr, "  %s:", label);
    for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Runs the .inp/.out vectors of one vocabulary; returns the number of cases. */
static int run_vectors(const char *name, const tok_vocab *v, const char *base, bool byte_level) {
    char path[1200];
    size_t inp_len, out_len;
    snprintf(path, sizeof path, "%s.inp", base);
    char *inp = read_all(path, &inp_len);
    snprintf(path, sizeof path, "%s.out", base);
    char *outs = read_all(path, &out_len);
    CHECKF(inp && outs, "%s: cannot read .inp/.out", name);
    if (!inp || !outs) {
        free(inp);
        free(outs);
        return 0;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    int n_cases = 0, n_ok = 0, n_rt = 0, n_rt_ok = 0, n_stream_ok = 0;
    size_t ipos = 0;
    char *oline = outs;
    while (ipos < inp_len) {
        char *next = memmem(inp + ipos, inp_len - ipos, sep, sep_len);
        size_t clen = next ? (size_t)(next - (inp + ipos)) : inp_len - ipos;
        const char *text = inp + ipos;
        /* expected ids: one line */
        char *eol = oline ? strchr(oline, '\n') : NULL;
        int32_t expect[4096];
        int n_expect = 0;
        bool have_line = oline && *oline;
        if (have_line) {
            char *p = oline;
            char *end = eol ? eol : oline + strlen(oline);
            while (p < end && n_expect < 4096) {
                while (p < end && (*p == ' ' || *p == '\r')) p++;
                if (p >= end) break;
                expect[n_expect++] = (int32_t)strtol(p, &p, 10);
            }
            oline = eol ? eol + 1 : NULL;
        }
        CHECKF(have_line || eol, "%s: case %d has no expected line", name, n_cases);
        int32_t *ids;
        int64_t n = enc(v, text, clen, false, false, &ids);
        bool ok = n == n_expect && (n == 0 || memcmp(ids, expect, sizeof(int32_t) * (size_t)n) == 0);
        CHECKF(ok, "%s: case %d ('%.*s') differs", name, n_cases, (int)(clen > 60 ? 60 : clen), text);
        if (!ok) {
            print_ids("want", expect, n_expect);
            print_ids("got ", ids, n);
        }
        n_ok += ok;
        /* round trip through pieces and the stream (the test texts are valid UTF-8) */
        if (n >= 0) {
            size_t dl;
            bool chunks_ok;
            char *d = stream_detok(v, ids, n, &dl, &chunks_ok);
            CHECKF(chunks_ok, "%s: case %d: the stream emitted a split UTF-8 character", name, n_cases);
            n_stream_ok += chunks_ok;
            /* byte-level BPE always round-trips; SentencePiece does here too
             * (no text in the set needs <unk>, and the stream drops the
             * leading space SentencePiece adds) */
            (void)byte_level;
            n_rt++;
            bool rt = dl == clen && memcmp(d, text, clen) == 0;
            CHECKF(rt, "%s: case %d: detokenized '%.*s' != '%.*s'", name, n_cases, (int)dl, d, (int)clen, text);
            n_rt_ok += rt;
            free(d);
        }
        free(ids);
        n_cases++;
        ipos = next ? (size_t)(next - inp) + sep_len : inp_len;
    }
    printf("%-28s %2d/%2d cases match, %2d/%2d round trips, %2d/%2d streams whole\n", name, n_ok, n_cases, n_rt_ok,
           n_rt, n_stream_ok, n_cases);
    CHECKF(n_cases >= 40, "%s: only %d cases read", name, n_cases);
    free(inp);
    free(outs);
    return n_cases;
}

static bool model_is(const char *path, const char *model) {
    gguf_ctx *g = NULL;
    if (gguf_open(path, &g, NULL) != HN_OK) return false;
    const char *m = gguf_get_str(g, "tokenizer.ggml.model");
    bool r = m && !strcmp(m, model);
    gguf_close(g);
    return r;
}

static void fuzz_malformed(const char *name, const tok_vocab *v, unsigned seed) {
    static const char *const cases[] = {"\xff\xfe", "\xe2\x82", "a\xed\xa0\x80z", "\xf4\x90\x80\x80", "\xc0\x80 x",
                                        "\xf8\x88\x80\x80\x80", "\x80\x80\x80", "hi\xe2", " \xf0\x9f\x98", "\0\0a\0"};
    bool ok = true;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = i == 9 ? 4 : strlen(cases[i]);
        for (int sp = 0; sp < 2; sp++) {
            int64_t r = tok_encode(v, cases[i], n, sp, sp, NULL, 0);
            if (r < 0) ok = false;
        }
    }
    int iters = getenv("HONE_SANITIZED") ? 30 : 200;
    static const char alphabet[] = "ab <|> \n\t\xe2\x96\x81\xf0\x9f\x98\x80'sS1";
    char buf[97];
    for (int it = 0; it < iters; it++) {
        size_t n = (size_t)(seed % 96);
        for (size_t k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = (seed >> 16) & 0xFF;
            buf[k] = r < 100 ? alphabet[r % (sizeof alphabet - 1)] : (char)r;
        }
        seed = seed * 1103515245u + 12345u;
        int32_t ids[512];
        int64_t r = tok_encode(v, buf, n, true, it & 1, ids, 512);
        if (r < 0) ok = false;
        tok_stream s = {0};
        char out[8192];
        for (int64_t k = 0; k < r && k < 512; k++) {
            size_t w = tok_stream_push(v, &s, ids[k], out, sizeof out);
            if (!valid_utf8(out, w)) ok = false;
        }
        size_t w = tok_stream_flush(&s, out, sizeof out);
        if (!valid_utf8(out, w)) ok = false;
    }
    CHECKF(ok, "%s: malformed input failed or streamed invalid UTF-8", name);
}

static void test_all_vocabs(void) {
    char dir[1024];
    test_data_path(dir, sizeof dir, "data/vocab");
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s", dir);
    if (!d) return;
    char *names[64];
    int n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < 64) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf")) names[n_names++] = strdup(e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n_names; i++) /* stable order for the log */
        for (int j = i + 1; j < n_names; j++)
            if (strcmp(names[i], names[j]) > 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    int n_tested = 0;
    for (int i = 0; i < n_names; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        hn_status st;
        char msg[512];
        tok_vocab *v = load_vocab(path, &st, msg, sizeof msg);
        if (st == HN_ERR_UNSUPPORTED) {
            /* only the WordPiece (BERT) vocabulary is expected to be unsupported */
            bool bert = model_is(path, "bert");
            CHECKF(bert, "%s: unexpectedly unsupported: %s", names[i], msg);
            printf("%-28s skipped: %s\n", names[i], msg);
            free(names[i]);
            continue;
        }
        CHECKF(st == HN_OK && v, "%s: load failed: %s", names[i], msg);
        if (v) {
            bool spm = model_is(path, "llama");
            run_vectors(names[i], v, path, !spm);
            fuzz_malformed(names[i], v, (unsigned)i * 7919u + 1);
            n_tested++;
        }
        tok_free(v);
        free(names[i]);
    }
    CHECKF(n_tested >= 11, "only %d vocabularies tested", n_tested);
}

static tok_vocab *vocab_named(const char *file) {
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "data/vocab/%s", file);
    test_data_path(path, sizeof path, rel);
    char msg[512];
    hn_status st;
    tok_vocab *v = load_vocab(path, &st, msg, sizeof msg);
    CHECKF(v != NULL, "%s: %s", file, msg);
    return v;
}

static int32_t id_of(const tok_vocab *v, const char *text) {
    for (int32_t i = 0; i < tok_n_vocab(v); i++)
        if (!strcmp(tok_text(v, i), text)) return i;
    return -1;
}

static void test_qwen3_specials(void) {
    tok_vocab *v = vocab_named("ggml-vocab-qwen3-npm.gguf");
    if (!v) return;
    int32_t im_start = id_of(v, "<|im_start|>"), im_end = id_of(v, "<|im_end|>"), eot = id_of(v, "<|endoftext|>");
    CHECK(im_start == 151644 && im_end == 151645 && eot == 151643);
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    int32_t *ids;
    int64_t n = enc(v, chat, strlen(chat), true, true, &ids);
    CHECKF(n >= 4 && ids[0] == im_start && ids[n - 1] == im_end, "qwen3: specials not parsed (n=%lld)", (long long)n);
    /* the text between is plain: "user\nhi" */
    int32_t *mid;
    int64_t nm = enc(v, "user\nhi", 7, false, false, &mid);
    CHECK(n == nm + 2 && memcmp(ids + 1, mid, sizeof(int32_t) * (size_t)nm) == 0);
    free(mid);
    free(ids);
    /* without parse_special the markers are ordinary text */
    n = enc(v, chat, strlen(chat), false, false, &ids);
    bool has_special = false;
    for (int64_t i = 0; i < n; i++) has_special |= ids[i] == im_start || ids[i] == im_end;
    CHECK(n > 4 && !has_special);
    free(ids);
    /* empty text: no ids, no output written (and no memcpy from NULL: UBSan) */
    int32_t none[2] = {-7, -7};
    CHECK(tok_encode(v, "", 0, false, true, none, 2) == 0 && none[0] == -7);
    CHECK(tok_encode(v, "", 0, true, true, none, 2) == 0);
    CHECK(tok_encode_spans(v, "", 0, true, NULL, 0, none, 2) == 0);
    /* spans: a control token overlapping one is text (as without
     * parse_special); outside spans they match; user-defined ones always */
    const char *mix = "<|im_start|>x<|im_end|>y<think>";
    size_t sp[2] = {13, 23}; /* the <|im_end|> */
    int32_t a[64], b[64];
    int64_t na = tok_encode_spans(v, mix, strlen(mix), false, sp, 1, a, 64);
    int64_t nb = tok_encode(v, "x<|im_end|>y<think>", 19, false, false, b, 64);
    CHECKF(na == nb + 1 && a[0] == im_start && !memcmp(a + 1, b, (size_t)nb * sizeof *b), "spans: %lld vs %lld", (long long)na,
           (long long)nb);
    size_t sp2[2] = {20, 21}; /* only the last byte of <|im_end|> */
    na = tok_encode_spans(v, mix, strlen(mix), false, sp2, 1, a, 64);
    bool end_tok = false;
    for (int64_t i = 0; i < na; i++) end_tok |= a[i] == im_end;
    CHECK(!end_tok);
    size_t sp3[2] = {0, 1}; /* the span covers <|im_start|>'s first byte only */
    na = tok_encode_spans(v, mix, strlen(mix), false, sp3, 1, a, 64);
    nb = tok_encode(v, mix, strlen(mix), false, true, b, 64);
    CHECK(na > 0 && a[0] != im_start && nb > 0 && b[0] == im_start);
    /* no BOS for qwen (add_bos_token=false); EOG set */
    CHECK(!tok_add_bos(v));
    n = enc(v, "Hi", 2, true, false, &ids);
    CHECK(n == 1 && ids[0] != tok_bos(v));
    free(ids);
    CHECK(tok_is_eog(v, im_end) && tok_is_eog(v, eot) && !tok_is_eog(v, im_start) && !tok_is_eog(v, 9707));
    CHECK(!tok_is_eog(v, -1) && !tok_is_eog(v, tok_n_vocab(v)));
    /* pieces: control tokens render only with special */
    char buf[64];
    CHECK(tok_piece(v, im_end, false, buf, sizeof buf) == 0);
    CHECK(tok_piece(v, im_end, true, buf, sizeof buf) == 10 && !memcmp(buf, "<|im_end|>", 10));
    CHECK(tok_piece(v, -1, true, buf, sizeof buf) == -1 && tok_piece(v, tok_n_vocab(v), true, buf, sizeof buf) == -1);
    CHECK(tok_text(v, -5) == NULL);
    /* a too-small output buffer: the total comes back, the buffer holds a prefix */
    const char *long_text = "one two three four five six seven";
    int32_t few[3];
    int64_t total = tok_encode(v, long_text, strlen(long_text), false, false, few, 3);
    CHECK(total == 7);
    /* streaming: a 4-byte character the vocabulary splits over byte tokens comes
     * out whole, and only once complete */
    char emoji[5] = {0};
    n = 0;
    ids = NULL;
    for (uint32_t cp = 0x10300; cp < 0x10FFF && n < 2; cp++) {
        emoji[0] = (char)(0xF0 | (cp >> 18));
        emoji[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        emoji[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        emoji[3] = (char)(0x80 | (cp & 0x3F));
        free(ids);
        n = enc(v, emoji, 4, false, false, &ids);
    }
    CHECKF(n >= 2, "no 4-byte character took several tokens (got %lld)", (long long)n);
    tok_stream s = {0};
    char out[64];
    size_t got = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t w = tok_stream_push(v, &s, ids[i], out + got, sizeof out - got);
        if (i < n - 1) CHECKF(w == 0, "stream emitted %zu bytes before the character was complete", w);
        got += w;
    }
    CHECK(got == 4 && !memcmp(out, emoji, 4));
    /* an unfinished character at the end comes out as U+FFFD on flush */
    tok_stream s2 = {0};
    CHECK(tok_stream_push(v, &s2, ids[0], out, sizeof out) == 0);
    CHECK(tok_stream_flush(&s2, out, sizeof out) == 3 && !memcmp(out, "\xef\xbf\xbd", 3));
    free(ids);
    /* invalid bytes inside a piece become U+FFFD: feed a lone continuation byte token */
    int32_t lone = -1;
    unsigned char b80 = 0x80;
    for (int32_t i = 0; i < tok_n_vocab(v) && lone < 0; i++) {
        char p[8];
        if (tok_piece(v, i, false, p, sizeof p) == 1 && (unsigned char)p[0] == b80) lone = i;
    }
    CHECK(lone >= 0);
    tok_stream s3 = {0};
    size_t w = tok_stream_push(v, &s3, lone, out, sizeof out);
    CHECK(w == 3 && !memcmp(out, "\xef\xbf\xbd", 3));
    tok_free(v);
}

static void test_llama_spm(void) {
    tok_vocab *v = vocab_named("ggml-vocab-llama-spm.gguf");
    if (!v) return;
    CHECK(tok_add_bos(v) && tok_bos(v) == 1 && tok_eos(v) == 2 && !tok_add_eos(v));
    int32_t *ids, *plain;
    int64_t n = enc(v, "Hello world", 11, true, false, &ids);
    int64_t m = enc(v, "Hello world", 11, false, false, &plain);
    CHECK(n == m + 1 && ids[0] == 1 && !memcmp(ids + 1, plain, sizeof(int32_t) * (size_t)m));
    free(ids);
    free(plain);
    /* "</s>" is a control token: parsed only with parse_special, and a space prefix follows it */
    n = enc(v, "a</s>b", 6, false, true, &ids);
    CHECK(n >= 3);
    bool found = false;
    for (int64_t i = 0; i < n; i++) found |= ids[i] == 2;
    CHECK(found);
    free(ids);
    CHECK(tok_is_eog(v, 2) && !tok_is_eog(v, 1));
    /* stream strips the SentencePiece leading space of the first token only */
    n = enc(v, "Hi there", 8, false, false, &ids);
    tok_stream s = {0};
    char out[64];
    size_t got = 0;
    for (int64_t i = 0; i < n; i++) got += tok_stream_push(v, &s, ids[i], out + got, sizeof out - got);
    CHECK(got == 8 && !memcmp(out, "Hi there", 8));
    free(ids);
    /* byte fallback: a character missing from the vocabulary becomes <0xNN> tokens */
    n = enc(v, "\xf0\x9f\xa6\x99", 4, false, false, &ids);
    int bytes = 0;
    for (int64_t i = 0; i < n; i++) bytes += !strncmp(tok_text(v, ids[i]), "<0x", 3);
    CHECK(bytes == 4);
    free(ids);
    tok_free(v);
}

static void test_llama3(void) {
    tok_vocab *v = vocab_named("ggml-vocab-llama3-npm.gguf");
    if (!v) return;
    CHECK(tok_add_bos(v) && tok_bos(v) == 128000);
    int32_t eot = id_of(v, "<|eot_id|>");
    CHECK(eot >= 0 && tok_is_eog(v, eot) && tok_is_eog(v, 128001));
    int32_t *ids;
    int64_t n = enc(v, "Hi", 2, true, false, &ids);
    CHECK(n == 2 && ids[0] == 128000);
    free(ids);
    const char *t = "<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>";
    n = enc(v, t, strlen(t), true, true, &ids);
    CHECK(n >= 6 && ids[0] == 128000 && ids[1] == id_of(v, "<|start_header_id|>") && ids[n - 1] == eot);
    free(ids);
    tok_free(v);
}

static void test_real_model(void) {
    char path[1024];
    test_data_path(path, sizeof path, "data/models/qwen3-real-q8_0.gguf");
    char msg[512];
    hn_status st;
    tok_vocab *v = load_vocab(path, &st, msg, sizeof msg);
    CHECKF(v != NULL, "qwen3-real: %s", msg);
    if (!v) return;
    char jpath[1024];
    test_data_path(jpath, sizeof jpath, "data/ref/qwen3-real-q8_0/p1.json");
    size_t jl;
    char *json = read_all(jpath, &jl);
    CHECK(json != NULL);
    int32_t want[64];
    int nw = 0;
    char *p = json ? strstr(json, "\"prompt_tokens\"") : NULL;
    if (p && (p = strchr(p, '['))) {
        char *end = strchr(p, ']');
        p++;
        while (p && p < end && nw < 64) {
            while (p < end && (*p == ' ' || *p == '\n' || *p == ',')) p++;
            if (p >= end) break;
            want[nw++] = (int32_t)strtol(p, &p, 10);
        }
    }
    CHECK(nw == 5);
    int32_t *ids;
    const char *prompt = "Hello, my name is";
    int64_t n = enc(v, prompt, strlen(prompt), true, true, &ids);
    CHECKF(n == nw && !memcmp(ids, want, sizeof(int32_t) * (size_t)nw), "qwen3-real: prompt tokens differ (n=%lld)",
           (long long)n);
    free(ids);
    free(json);

    /* speed: a ~30K-token prompt (mixed text, code, CJK, specials) in well under a second */
    char inp[1024];
    test_data_path(inp, sizeof inp, "data/vocab/ggml-vocab-qwen3-npm.gguf.inp");
    size_t il;
    char *chunk = read_all(inp, &il);
    if (chunk) {
        size_t reps = 130000 / il + 1, bl = 0;
        char *big = malloc(reps * (il + 32) + 1);
        for (size_t r = 0; r < reps; r++) {
            memcpy(big + bl, chunk, il);
            bl += il;
            bl += (size_t)sprintf(big + bl, "<|im_end|>\n<|im_start|>%zu ", r);
        }
        double t0 = hn_now_s();
        int64_t cnt = tok_encode(v, big, bl, true, true, NULL, 0);
        double secs = hn_now_s() - t0;
        printf("long prompt: %zu bytes -> %lld tokens in %.3f s\n", bl, (long long)cnt, secs);
        CHECK(cnt > 25000);
        CHECKF(secs < (getenv("HONE_SANITIZED") ? 20.0 : 0.5), "long prompt took %.3f s", secs);
        free(big);
        free(chunk);
    }
    tok_free(v);
}

/* encoding is thread-safe: several threads share one vocabulary */
typedef struct thr_arg {
    const tok_vocab *v;
    const char *text;
    size_t len;
    int64_t want;
    uint64_t want_sum;
    bool ok;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    static _Thread_local int32_t ids[8192];
    a->ok = true;
    for (int r = 0; r < 20; r++) {
        int64_t n = tok_encode(a->v, a->text, a->len, true, true, ids, 8192);
        uint64_t sum = 0;
        for (int64_t i = 0; i < n && i < 8192; i++) sum = sum * 31 + (uint64_t)ids[i];
        if (n != a->want || sum != a->want_sum) a->ok = false;
    }
    return NULL;
}

static void test_threads(void) {
    tok_vocab *v = vocab_named("ggml-vocab-llama3-npm.gguf");
    if (!v) return;
    char inp[1024];
    test_data_path(inp, sizeof inp, "data/vocab/ggml-vocab-llama3-npm.gguf.inp");
    size_t il;
    char *text = read_all(inp, &il);
    CHECK(text != NULL);
    if (text) {
        static int32_t ids[8192];
        int64_t n = tok_encode(v, text, il, true, true, ids, 8192);
        uint64_t sum = 0;
        for (int64_t i = 0; i < n && i < 8192; i++) sum = sum * 31 + (uint64_t)ids[i];
        thr_arg a[4];
        pthread_t th[4];
        for (int t = 0; t < 4; t++) {
            a[t] = (thr_arg){v, text, il, n, sum, false};
            pthread_create(&th[t], NULL, thr_main, &a[t]);
        }
        for (int t = 0; t < 4; t++) {
            pthread_join(th[t], NULL);
            CHECKF(a[t].ok, "thread %d got different tokens", t);
        }
        free(text);
    }
    tok_free(v);
}

static void test_alloc_failure(void) {
    /* loading under injected allocation failures must fail cleanly, never crash */
    char path[1024];
    test_data_path(path, sizeof path, "data/vocab/ggml-vocab-gpt-2.gguf");
    gguf_ctx *g = NULL;
    if (gguf_open(path, &g, NULL) != HN_OK) {
        CHECK(0);
        return;
    }
    int failures = 0;
    long steps[] = {0, 1, 2, 5, 10, 20, 40};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        tok_vocab *v = NULL;
        hn_alloc_fail_after(steps[i]);
        hn_status st = tok_load(g, &v, NULL);
        hn_alloc_fail_after(-1);
        if (st != HN_OK) failures++;
        CHECK((st == HN_OK) == (v != NULL));
        if (v) {
            hn_alloc_fail_after(3);
            int64_t r = tok_encode(v, "Hello world, this is a test", 27, true, true, NULL, 0);
            hn_alloc_fail_after(-1);
            CHECK(r == -1 || r > 0);
        }
        tok_free(v);
    }
    CHECK(failures > 0);
    gguf_close(g);
}

int main(void) {
    test_all_vocabs();
    CHECKF(split_pieces > 0, "no token piece split a UTF-8 character: the stream test proved nothing");
    test_qwen3_specials();
    test_llama_spm();
    test_llama3();
    test_real_model();
    test_threads();
    test_alloc_failure();
    TEST_DONE();
}
