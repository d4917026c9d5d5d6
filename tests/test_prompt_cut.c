/* test_prompt_cut: a prompt row's bits do not depend on where the prompt was
 * cut into chunks. The scheduler cuts a prompt by the step budget that the
 * other sessions leave, so the same prompt is cut elsewhere when their
 * timing changes (speculation on or off, another client): if a row's bits
 * followed the cut, a greedy reply could change with the load. Each cut
 * below prefills the same prompt (its chunks block-aligned as the scheduler
 * makes them, or not) and compares the last row's logits, bit for bit, with
 * the prompt in one chunk: 1 + rest, rest + 1 (the last prompt token alone
 * in its step, marked as a prompt row), rest + 17 (a tile of 16 and a lone
 * row), + 33, + 9, 512 + rest, three chunks; then a chunk beside another
 * sequence's decode row in the same step. On the CPU backend, at a context
 * long enough that decode rows are split into segments, on a random q4_K_M
 * and an f16 model and (not under sanitizers) the trained agent model.
 * HONE_TEST_DEVICE=cuda: the same on the CUDA backend (prompt rows take the
 * prefill kernels and the flash-attention tiles however few they are). */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kv/kv.h"
#include "model/model.h"
#include "test.h"

static int32_t tokat(int s, int i) { return (int32_t)((i * 7919 + s * 104729 + 13) % 1900 + 50); }

typedef struct {
    model *m;
    kv_cache *kv;
    kv_seq s[2];
    int V;
} rig;

/* tokens [at, at + n) of sequence s (prompt rows: the prompt flag set) and, with other >= 0, one decode row of sequence other */
static hn_status chunk(rig *r, int s, int at, int n, int P, int other, int opos, float *out) {
    static int32_t tok[1200], pos[1200], sid[1200];
    static bool want[1200];
    int k = 0;
    if (other >= 0) {
        tok[k] = tokat(other, opos);
        pos[k] = opos;
        sid[k] = other;
        want[k++] = false;
    }
    for (int i = 0; i < n; i++, k++) {
        tok[k] = tokat(s, at + i);
        pos[k] = at + i;
        sid[k] = s;
        want[k] = at + i == P - 1;
    }
    bool prompt[2] = {true, true};
    if (other >= 0) prompt[other] = false;
    kv_seq *seqs[2] = {&r->s[0], &r->s[1]};
    model_batch b = {.n_tokens = k, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .prompt = prompt,
                     .seqs = seqs, .n_seqs = 2};
    hn_err e;
    hn_status st = model_forward(r->m, r->kv, &b, out, 1, &e);
    if (st) fprintf(stderr, "forward: %s\n", e.msg);
    return st;
}

static void one(const char *name, int P) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", name);
    test_data_path(path, sizeof path, rel);
    rig r = {0};
    hn_err e;
    const char *dev = getenv("HONE_TEST_DEVICE");
    if (dev && !strcmp(dev, "cuda")) setenv("HONE_CUDA_PROMPT", "1", 0); /* not yet the CUDA backend's default */
    model_params mp = {.n_threads = 2, .max_batch = 1200, .max_logits = 4, .device = dev && *dev ? dev : NULL};
    if (model_load(path, &mp, &r.m, &e)) {
        CHECKF(0, "%s: %s", name, e.msg);
        return;
    }
    kv_config c = model_kv_config(r.m, 2400, 16);
    c.type = QT_F16;
    c.v_type = QT_F16;
    CHECK(kv_create(&c, &r.kv, &e) == HN_OK);
    for (int i = 0; i < 2; i++) kv_seq_init(&r.s[i], r.kv, 2400, &e);
    r.V = model_hp(r.m)->n_vocab;
    const size_t V = (size_t)r.V;
    float *ref = hn_malloc(sizeof(float) * V), *got = hn_malloc(sizeof(float) * V);
    /* the other sequence: a prompt of 300, for the decode row beside a chunk */
    for (int at = 0; at < 300; at += 150) CHECK(chunk(&r, 1, at, 150, 300, -1, 0, got) == HN_OK);
    CHECK(chunk(&r, 0, 0, P, P, -1, 0, ref) == HN_OK);
    const int cuts[][4] = {{1, 0}, {P - 1, 0}, {P - 17, 0}, {P - 33, 0}, {P - 9, 0}, {512, 0}, {256, 512, 0}, {7, 0}};
    int n_cuts = 0, n_same = 0;
    for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
        kv_seq_truncate(r.kv, &r.s[0], 0);
        int at = 0;
        hn_status st = HN_OK;
        for (int k = 0; st == HN_OK && at < P; k++) {
            int end = cuts[ci][k] > 0 && cuts[ci][k] < P ? cuts[ci][k] : P;
            st = chunk(&r, 0, at, end - at, P, -1, 0, got);
            at = end;
        }
        const bool same = st == HN_OK && !memcmp(ref, got, sizeof(float) * V);
        CHECKF(same, "%s, %d tokens: the prompt cut at %d (then %d) differs from one chunk", name, P, cuts[ci][0],
               cuts[ci][1]);
        n_cuts++;
        n_same += same;
    }
    /* the last 40 rows as a chunk beside sequence 1's decode row */
    kv_seq_truncate(r.kv, &r.s[0], 0);
    CHECK(chunk(&r, 0, 0, P - 40, P, -1, 0, got) == HN_OK);
    CHECK(chunk(&r, 0, P - 40, 40, P, 1, 300, got) == HN_OK);
    const bool beside = !memcmp(ref, got, sizeof(float) * V);
    CHECKF(beside, "%s, %d tokens: the last chunk beside a decode row differs from one chunk", name, P);
    printf("%s, %d tokens%s%s: %d of %d cuts give the one-chunk bits; beside a decode row: %s\n", name, P,
           mp.device ? " on " : "", mp.device ? mp.device : "", n_same, n_cuts, beside ? "the same" : "DIFFERENT");
    hn_free(ref);
    hn_free(got);
    for (int i = 0; i < 2; i++) kv_seq_free(&r.s[i], r.kv);
    kv_free(r.kv);
    model_free(r.m);
}

int main(void) {
    const char *san = getenv("HONE_SANITIZED");
    const bool sanitized = san && *san && strcmp(san, "0") != 0;
    one("qwen3-2k-q4_k_m.gguf", 1009);
    one("llama-2k-f16.gguf", sanitized ? 401 : 1009);
    if (!sanitized) one("qwen3-agent-q8_0.gguf", 1009);
    TEST_DONE();
}
