/* bench_grammar.c: the cost of constrained decoding per token on a real vocabulary.
 *
 * Loads a GGUF vocabulary (default: the shared Qwen3 one), compiles a tool-call
 * grammar (Hermes and Qwen XML) and a JSON-schema grammar, then generates with
 * random logits: per step, gr_state_mask over the whole vocabulary, a pick of
 * the best allowed logit, gr_state_accept. Prints the mean mask and accept
 * time per token, how many masks had to be computed (cache misses) and the
 * cost of a cold mask inside a JSON string (a walk over the whole trie).
 * usage: bench/run_grammar.sh [vocab.gguf] [tokens] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "gguf/gguf.h"
#include "sample/grammar.h"
#include "tokenizer/tokenizer.h"

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\"},\"offset\":{\"type\":\"integer\"},\"limit\":{\"type\":\"integer\"}},\"required\":[\"path\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"edit\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\"},\"old_string\":{\"type\":\"string\"},\"new_string\":{\"type\":\"string\"},"
    "\"replace_all\":{\"type\":\"boolean\"}},\"required\":[\"path\",\"old_string\",\"new_string\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"command\":{\"type\":\"string\"},\"timeout\":{\"type\":\"number\"}},\"required\":[\"command\"]}}}]";

static void run(const char *label, const gr_grammar *g, const gr_vocab *v, int32_t n_vocab,
                const uint8_t *eog, int tokens) {
    gr_state *s = NULL;
    if (gr_state_new(g, v, &s, NULL) != HN_OK) return;
    float *lg = malloc((size_t)n_vocab * sizeof *lg);
    double tm = 0, ta = 0;
    int steps = 0, calls = 0;
    for (int t = 0; t < tokens; t++) {
        for (int32_t i = 0; i < n_vocab; i++) lg[i] = (float)(rnd() % 100000) * 1e-4f;
        double a = hn_now_s();
        gr_state_mask(s, lg, n_vocab);
        double b = hn_now_s();
        int32_t best = -1;
        for (int32_t i = 0; i < n_vocab; i++)
            if (lg[i] > -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
        if (best < 0) break;
        double c = hn_now_s();
        if (gr_state_accept(s, best, NULL) != HN_OK) {
            printf("%s: accept failed\n", label);
            break;
        }
        ta += hn_now_s() - c;
        tm += b - a;
        steps++;
        if (eog[best]) { /* start the next call */
            calls++;
            gr_state_reset(s);
        }
    }
    int64_t nc, nm;
    gr_state_counters(s, &nc, &nm);
    printf("%-12s %6d tokens %4d calls: mask %8.1f us/token, accept %6.2f us/token, %lld masks computed, %lld configurations\n",
           label, steps, calls, tm / steps * 1e6, ta / steps * 1e6, (long long)nm, (long long)nc);
    free(lg);
    gr_state_free(s);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "../shared/data/vocab/ggml-vocab-qwen3-npm.gguf";
    int tokens = argc > 2 ? atoi(argv[2]) : 3000;
    gguf_ctx *gg = NULL;
    tok_vocab *tv = NULL;
    hn_err err;
    if (gguf_open(path, &gg, &err) != HN_OK || tok_load(gg, &tv, &err) != HN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    gguf_close(gg);
    double t0 = hn_now_s();
    gr_vocab *v = NULL;
    if (gr_vocab_from_tok(tv, &v, &err) != HN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t n = tok_n_vocab(tv);
    printf("vocab %d tokens, index %.1f ms\n", n, (hn_now_s() - t0) * 1e3);
    uint8_t *eog = calloc((size_t)n, 1);
    for (int32_t i = 0; i < n; i++) eog[i] = tok_is_eog(tv, i);

    json_error_t je;
    json_t *tools = json_loads(TOOLS, 0, &je);
    gr_grammar *g = NULL;
    gr_tool_opts o = {TC_FORMAT_HERMES, NULL, false, GR_THINK_NONE};
    gr_from_tools(tools, &o, &g, NULL);
    /* a cold mask inside a JSON string */
    gr_state *s = NULL;
    gr_state_new(g, v, &s, NULL);
    const char *pre = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"";
    gr_state_accept_bytes(s, pre, strlen(pre), NULL);
    float *lg = calloc((size_t)n, sizeof *lg);
    double a = hn_now_s();
    gr_state_mask(s, lg, n);
    double b = hn_now_s();
    gr_state_mask(s, lg, n);
    double c = hn_now_s();
    int allowed = 0;
    for (int32_t i = 0; i < n; i++) allowed += lg[i] == 0.0f;
    printf("in a string: cold mask %.2f ms, cached %.1f us, %d tokens allowed\n", (b - a) * 1e3, (c - b) * 1e6, allowed);
    gr_state_free(s);
    run("hermes", g, v, n, eog, tokens);
    gr_grammar_free(g);
    o.format = TC_FORMAT_QWEN_XML;
    gr_from_tools(tools, &o, &g, NULL);
    run("qwen_xml", g, v, n, eog, tokens);
    gr_grammar_free(g);
    gr_any_object(&g, NULL);
    run("json_object", g, v, n, eog, tokens);
    gr_grammar_free(g);
    json_decref(tools);
    free(lg);
    free(eog);
    gr_vocab_free(v);
    tok_free(tv);
    return 0;
}
