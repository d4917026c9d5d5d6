/* test_hybrid_types: the Qwen3.5 hybrids in the GGUF types that have no
 * llama.cpp reference file in ../shared (F16, BF16, Q4_0, Q5_K_M, Q6_K,
 * IQ4_XS; Q4_K_M and Q8_0 beside them). `hone quantize` (HONE_BIN) writes
 * each from a shared file (qwen35-tiny-f32; qwen35moe-tiny-q8_0, dequantized
 * first); each loads and runs the source's three reference prompts, and its
 * last-position logits must be finite and near those of the backend's scalar
 * reference kernels on the same file. How near depends on the type: F16
 * weights take f32 activations on both paths (the same sums but for order:
 * KL < 1e-9); BF16 rounds activations to bf16 on the fast path only; the
 * integer types quantize activations to 8 bits on the fast path only (as
 * llama.cpp does) and these random-weight tiny models amplify that rounding
 * to KL 0.01-0.5 (measured), so their bound (1.0) only catches a type that
 * computes garbage or fails on the hybrid layers; the types' kernels
 * themselves are checked bit for bit against scalar references elsewhere
 * (test_dot, test_gemm, test_pack*). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "kv/kv.h"
#include "backend/cpu/cpu.h"
#include "model/model.h"
#include "model/model_int.h"
#include "test.h"

static char tmpdir[64];

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
        double pr = exp(ref[i] - lr);
        kl += pr * ((ref[i] - lr) - (ours[i] - lo));
    }
    return kl;
}

/* the last-position logits of tokens[0..n) prefilled in one forward */
static bool run_prompt(model *m, const int32_t *tok, int n, float *out) {
    hn_err e;
    kv_cache *kv = NULL;
    kv_config c = model_kv_config(m, 512, 16);
    if (kv_create(&c, &kv, &e)) return false;
    kv_seq s;
    bool ok = kv_seq_init(&s, kv, 512, &e) == HN_OK && kv_seq_state_acquire(kv, &s, &e) == HN_OK;
    int32_t pos[256], sid[256];
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        sid[i] = 0;
    }
    kv_seq *seqs[1] = {&s};
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    ok = ok && model_forward(m, kv, &b, out, 1, &e) == HN_OK;
    if (!ok) fprintf(stderr, "forward: %s\n", e.msg);
    kv_seq_free(&s, kv);
    kv_free(kv);
    return ok;
}

typedef struct {
    const char *type;
    double bound; /* KL against llama.cpp's logits for the source file */
} tcase;

static void one_source(const char *src, const tcase *cases, int n_cases) {
    char in[512], rel[300], path[512];
    snprintf(rel, sizeof rel, "data/models/%s.gguf", src);
    test_data_path(in, sizeof in, rel);
    const char *bin = getenv("HONE_BIN");
    if (!bin || !*bin) bin = "build/hone";
    for (int ci = 0; ci < n_cases; ci++) {
        char out[600], cmd[2048];
        snprintf(out, sizeof out, "%s/%s-%s.gguf", tmpdir, src, cases[ci].type);
        snprintf(cmd, sizeof cmd, "%s quantize %s %s %s -t 2 >/dev/null 2>&1", bin, in, out, cases[ci].type);
        int st = system(cmd);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: hone quantize %s", src, cases[ci].type);
        model *m = NULL;
        hn_err e;
        model_params mp = {.n_threads = 2, .max_batch = 256, .max_logits = 4};
        if (model_load(out, &mp, &m, &e)) {
            CHECKF(0, "%s %s: load: %s", src, cases[ci].type, e.msg);
            continue;
        }
        const int V = model_hp(m)->n_vocab;
        float *ref = hn_malloc(sizeof(float) * (size_t)V), *lg = hn_malloc(sizeof(float) * (size_t)V);
        double worst = 0;
        int n_prompts = 0;
        for (int pi = 1; pi <= 3; pi++) {
            snprintf(rel, sizeof rel, "data/ref/%s/p%d.json", src, pi);
            json_error_t je;
            json_t *js = json_load_file(test_data_path(path, sizeof path, rel), 0, &je);
            if (!js) continue;
            json_t *pt = json_object_get(js, "prompt_tokens");
            int n = (int)json_array_size(pt);
            int32_t tok[256];
            for (int i = 0; i < n && i < 256; i++) tok[i] = (int32_t)json_integer_value(json_array_get(pt, i));
            json_decref(js);
            /* the reference: the same file through the backend's scalar reference kernels */
            be_cpu_force_reference(m->be, true);
            size_t got = n > 0 && n <= 256 && run_prompt(m, tok, n, ref) ? (size_t)V : 0;
            be_cpu_force_reference(m->be, false);
            CHECKF(got == (size_t)V, "%s p%d: the reference path runs", src, pi);
            bool ran = got == (size_t)V && n > 0 && n <= 256 && run_prompt(m, tok, n, lg);
            bool finite = ran;
            for (int i = 0; i < V && finite; i++) finite = isfinite(lg[i]);
            const double kl = finite ? kl_div(ref, lg, V) : INFINITY;
            CHECKF(finite && kl <= cases[ci].bound, "%s as %s p%d: KL %.3g against the reference kernels (bound %.3g)",
                   src, cases[ci].type, pi, kl, cases[ci].bound);
            if (kl > worst) worst = kl;
            n_prompts++;
        }
        CHECKF(n_prompts == 3, "%s: 3 reference prompts (%d)", src, n_prompts);
        printf("%-22s %-7s KL up to %.3g (bound %.3g) over %d prompts\n", src, cases[ci].type, worst, cases[ci].bound,
               n_prompts);
        hn_free(ref);
        hn_free(lg);
        model_free(m);
        remove(out);
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hone-test-hybrid-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    static const tcase dense[] = {{"F16", 1e-9}, {"BF16", 5e-2}, {"Q8_0", 1.0},   {"Q6_K", 1.0},
                                  {"Q5_K_M", 1.0}, {"Q4_K_M", 1.0}, {"Q4_0", 1.0}, {"IQ4_XS", 1.0}};
    one_source("qwen35-tiny-f32", dense, (int)(sizeof dense / sizeof dense[0]));
    static const tcase moe[] = {{"F16", 1e-9},    {"BF16", 5e-2},   {"Q6_K", 1.0}, {"Q5_K_M", 1.0},
                                {"Q4_K_M", 1.0}, {"Q4_0", 1.0}, {"IQ4_XS", 1.0}};
    one_source("qwen35moe-tiny-q8_0", moe, (int)(sizeof moe / sizeof moe[0]));
    rmdir(tmpdir);
    TEST_DONE();
}
