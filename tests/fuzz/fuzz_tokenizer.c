/* fuzz_tokenizer.c: a libFuzzer harness for the tokenizers (tok_encode,
 * tok_encode_spans, tok_piece, tok_stream_*) over real vocabularies: the
 * Qwen3 model's and llama.cpp's test vocabularies (SentencePiece and several
 * byte-level BPE pre-tokenizers). The first input byte picks the vocabulary
 * and the flags, the rest is the text. Checked: the count call (cap 0) and
 * the full call agree, ids are in range, a span covering the whole text
 * gives what parse_special = false gives, and for byte-level BPE without
 * special parsing, decoding the ids gives back the text exactly (valid
 * UTF-8 input of bytes that each have a token: others are dropped, as in
 * llama.cpp). Seeds: tests/fuzz/corpus/tokenizer (the llama.cpp vocab
 * test texts, one per file, behind a selector byte). */
#include <string.h>

#include "fuzz_common.h"
#include "gguf/gguf.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

static const char *const TOK_FILES[] = {
    "data/models/qwen3-real-q8_0.gguf",     "data/vocab/ggml-vocab-llama-spm.gguf",
    "data/vocab/ggml-vocab-gpt-2.gguf",     "data/vocab/ggml-vocab-llama3-npm.gguf",
    "data/vocab/ggml-vocab-phi-3.gguf",     "data/vocab/ggml-vocab-deepseek-coder.gguf",
    "data/vocab/ggml-vocab-falcon.gguf",    "data/vocab/ggml-vocab-starcoder.gguf",
};
#define TOK_MAX 8
static tok_vocab *g_tv[TOK_MAX];
static bool g_tv_bpe[TOK_MAX]; /* byte-level BPE ("gpt2"): decoding is exact */
/* bytes that have a token of their own: a byte without one is dropped (as
 * llama.cpp does), so the exact decoding holds for texts of these only */
static bool g_tv_byte[TOK_MAX][256];
static int g_ntv;
static bool g_tok_inited;

static void fuzz_tokenizer_init(void) {
    if (g_tok_inited) return;
    g_tok_inited = true;
    for (size_t i = 0; i < sizeof TOK_FILES / sizeof *TOK_FILES && g_ntv < TOK_MAX; i++) {
        char path[512];
        gguf_ctx *g = NULL;
        hn_err err = {0};
        if (gguf_open(fuzz_shared(path, sizeof path, TOK_FILES[i]), &g, &err) != HN_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s (skipped)\n", path, err.msg);
            continue;
        }
        const char *model = gguf_get_str(g, "tokenizer.ggml.model");
        if (tok_load(g, &g_tv[g_ntv], &err) == HN_OK) {
            g_tv_bpe[g_ntv] = model && !strcmp(model, "gpt2");
            for (int b = 0; b < 256; b++) {
                char c = (char)b, piece[8];
                int32_t id;
                g_tv_byte[g_ntv][b] = tok_encode(g_tv[g_ntv], &c, 1, false, false, &id, 1) == 1 &&
                                      tok_piece(g_tv[g_ntv], id, false, piece, sizeof piece) == 1 && piece[0] == c;
            }
            g_ntv++;
        } else {
            fprintf(stderr, "fuzz_tokenizer: %s: %s (skipped)\n", path, err.msg);
        }
        gguf_close(g);
    }
    if (!g_ntv) fprintf(stderr, "fuzz_tokenizer: no vocabulary loaded\n");
}

__attribute__((unused)) static void fuzz_tokenizer_free(void) { /* for the replay test */
    for (int i = 0; i < g_ntv; i++) tok_free(g_tv[i]);
    g_ntv = 0;
    g_tok_inited = false;
}

#define TOK_CAP 16384
static int32_t g_ids[TOK_CAP], g_ids2[TOK_CAP];
static char g_dec[TOK_CAP * 8];

static void fuzz_tokenizer_one(const uint8_t *data, size_t size) {
    if (!g_ntv || size < 1 || size > 8192) return;
    int which = data[0] % g_ntv;
    bool add = data[0] & 0x10, ps = data[0] & 0x20;
    tok_vocab *v = g_tv[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int64_t n = tok_encode(v, text, len, add, ps, NULL, 0);
    if (n < 0) fuzz_fail("tok_encode count: %lld", (long long)n);
    if (n > TOK_CAP) fuzz_fail("%lld tokens for %zu bytes", (long long)n, len);
    int64_t m = tok_encode(v, text, len, add, ps, g_ids, TOK_CAP);
    if (m != n) fuzz_fail("count %lld, then %lld", (long long)n, (long long)m);
    int32_t nv = tok_n_vocab(v);
    for (int64_t i = 0; i < n; i++)
        if (g_ids[i] < 0 || g_ids[i] >= nv) fuzz_fail("id %d out of range", g_ids[i]);
    /* a span over the whole text: as parse_special = false */
    size_t spans[2] = {0, len};
    int64_t k = tok_encode_spans(v, text, len, add, spans, 1, g_ids2, TOK_CAP);
    int64_t k2 = tok_encode(v, text, len, add, false, g_ids, TOK_CAP);
    if (k != k2 || (k > 0 && memcmp(g_ids, g_ids2, (size_t)k * sizeof *g_ids)))
        fuzz_fail("a whole-text span gives %lld tokens, parse_special=false %lld", (long long)k, (long long)k2);
    /* decode (no special parsing, no BOS/EOS: byte-level BPE is exact); without
     * BOS/EOS that is the call just made, whose ids are in g_ids */
    int64_t n0 = add ? tok_encode(v, text, len, false, false, g_ids, TOK_CAP) : k2;
    if (n0 < 0 || n0 > TOK_CAP) fuzz_fail("tok_encode: %lld", (long long)n0);
    size_t dlen = 0;
    tok_stream st;
    memset(&st, 0, sizeof st);
    char sbuf[256];
    size_t slen = 0;
    for (int64_t i = 0; i < n0; i++) {
        int32_t r = tok_piece(v, g_ids[i], false, g_dec + dlen, (int32_t)(sizeof g_dec - dlen));
        if (r < 0) fuzz_fail("tok_piece(%d): %d", g_ids[i], r);
        if ((size_t)r > sizeof g_dec - dlen) fuzz_fail("piece longer than the buffer");
        dlen += (size_t)r;
        slen += tok_stream_push(v, &st, g_ids[i], sbuf, sizeof sbuf);
    }
    slen += tok_stream_flush(&st, sbuf, sizeof sbuf);
    bool exact = g_tv_bpe[which] && srv_utf8_valid(text, len);
    for (size_t i = 0; exact && i < len; i++) exact = g_tv_byte[which][(unsigned char)text[i]];
    if (exact && (dlen != len || memcmp(g_dec, text, len)))
        fuzz_fail("vocab %d: decoding %lld ids gives %zu bytes, not the %zu of the text", which, (long long)n0,
                  dlen, len);
    (void)slen;
}

FUZZ_ENTRY(tokenizer)
