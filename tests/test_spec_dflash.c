/* test_spec_dflash: speculative decoding with a DFlash drafter (spec/dflash.h,
 * model_dflash_*) is lossless, the drafter reads the target's hidden
 * states where the format says, and its block forward is what the format
 * computes.
 *
 * No trained DFlash weights exist here, so the drafter files are made for
 * the shared small targets (tests/dflash_fixture.h):
 *   - loading: the target's logits are the same, bit for bit, with and
 *     without a drafter tapping its layers; the file's options are read;
 *   - injection, on DFLF_PROBE (the V injected at layer 0 is the target's
 *     normed final hidden state): after a target step of three sequences,
 *     injecting two of them (a row selection that is not the identity),
 *     each injected V times the target's output matrix is the target's
 *     logits row of that position, and each layer's injected K is rope of
 *     the K norm of its projection at that position;
 *   - the block forward, on DFLF_RANDOM / _ANCHOR / _CAUSAL: the drafted
 *     tokens and their probabilities are those of a scalar reference of the
 *     format's block forward (written here from the format, over the K/V
 *     the drafter injected), which would tell a causal block from a
 *     non-causal one; the drafter's sequences then end where their requests'
 *     computed tokens do;
 *   - the engine, four sessions at once, every KV invariant of the target's
 *     and the drafter's caches checked after each step: greedy, constrained
 *     and seeded output with --spec dflash (and auto with the DFlash file)
 *     equals plain decoding's, token for token, on the random drafter
 *     (drafts mostly miss: counters shown), for a dense qwen3 and the
 *     hybrid qwen35 and qwen35moe targets (greedy only for the trained
 *     qwen3-agent); with the prefix cache, a second turn; under
 *     preemption; and on the DFLF_COPY oracle with sessions constrained to
 *     one token (the output repeats it, which the oracle drafts: nearly
 *     every draft accepted, far fewer steps);
 *   - the refusals: --spec dflash without a file or with a file that is not
 *     a DFlash drafter, a DFlash file with --spec draft, a vocabulary or
 *     width that is not the target's, a DSpark file; auto loads no DFlash
 *     drafter without a DFlash file. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sched/engine.h"
#include "spec/dflash.h"
#include "tokenizer/tokenizer.h"
#include "dflash_fixture.h"
#include "test.h"

enum { NS = 4, MAXT = 512 };

static const char *tdev(void) {
    const char *d = getenv("HONE_TEST_DEVICE");
    return d && *d ? d : NULL;
}

static char *path_of(const char *src, char *buf, size_t cap) {
    char rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", src);
    return (char *)test_data_path(buf, cap, rel);
}

/* ---- a target step of three sequences ---- */

typedef struct tstep {
    model *m;
    gguf_ctx *dg;            /* the drafter's file */
    kv_cache *kv;
    kv_seq sq[3];
    int32_t toks[3][24];     /* each sequence's tokens; toks[s][len[s]]: the token it samples */
    int len[3], row0[3], n;
    float *lg;               /* every row's logits */
    int V;
} tstep;

static bool tstep_run(tstep *t, const char *src, const char *fx) {
    memset(t, 0, sizeof *t);
    hn_err e;
    char sp[512];
    if (gguf_open(fx, &t->dg, &e)) {
        CHECKF(0, "%s: %s", fx, e.msg);
        return false;
    }
    model_params mp = {.n_threads = 2, .max_batch = 64, .max_seqs = 4, .max_logits = 32, .device = tdev(),
                       .dflash = t->dg};
    if (model_load(path_of(src, sp, sizeof sp), &mp, &t->m, &e)) {
        CHECKF(0, "%s with %s: %s", src, fx, e.msg);
        gguf_close(t->dg);
        return false;
    }
    t->V = model_hp(t->m)->n_vocab;
    kv_config c = model_kv_config(t->m, 32, 16);
    kv_create(&c, &t->kv, &e);
    kv_seq *seqs[3];
    for (int s = 0; s < 3; s++) {
        kv_seq_init(&t->sq[s], t->kv, 256, &e);
        if (model_hp(t->m)->hybrid) kv_seq_state_acquire(t->kv, &t->sq[s], &e);
        seqs[s] = &t->sq[s];
    }
    const int len[3] = {9, 13, 7};
    int32_t tok[32], pos[32], sid[32];
    bool want[32];
    int n = 0;
    for (int s = 0; s < 3; s++) {
        t->len[s] = len[s];
        t->row0[s] = n;
        for (int i = 0; i < len[s]; i++) {
            t->toks[s][i] = (int32_t)((i * 131 + s * 977 + 5) % 2000 + 20);
            tok[n] = t->toks[s][i];
            pos[n] = i;
            sid[n] = s;
            want[n] = true;
            n++;
        }
    }
    t->n = n;
    t->lg = malloc(sizeof(float) * (size_t)n * (size_t)t->V);
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs,
                     .n_seqs = 3};
    if (model_forward(t->m, t->kv, &b, t->lg, n, &e)) {
        CHECKF(0, "forward: %s", e.msg);
        return false;
    }
    for (int s = 0; s < 3; s++) {
        const float *r = t->lg + (size_t)(t->row0[s] + len[s] - 1) * (size_t)t->V;
        int32_t best = 0;
        for (int v = 1; v < t->V; v++)
            if (r[v] > r[best]) best = v;
        t->toks[s][len[s]] = best;
    }
    return true;
}

static void tstep_free(tstep *t) {
    for (int s = 0; s < 3; s++) kv_seq_free(&t->sq[s], t->kv);
    kv_free(t->kv);
    model_free(t->m);
    if (t->dg) gguf_close(t->dg);
    free(t->lg);
}

/* A drafter over the step's model with an f32 cache, and its two jobs: sequences 0 and 2. */
static dfl_drafter *drafter(tstep *t, dfl_seq **ds, dfl_job *jobs, int32_t k, int32_t (*out)[16], float (*pr)[16]) {
    dfl_params p = {.n_ctx = 256, .max_seqs = 4, .n_blocks = 64, .k_type = QT_F32, .v_type = QT_F32};
    dfl_drafter *d = NULL;
    hn_err e;
    if (dfl_new(t->m, &p, &d, &e)) {
        CHECKF(0, "dfl_new: %s", e.msg);
        return NULL;
    }
    for (int j = 0; j < 2; j++) {
        int s = j * 2;
        ds[j] = dfl_seq_new(d, 0);
        jobs[j] = (dfl_job){.seq = ds[j], .toks = t->toks[s], .from = 0, .n = t->len[s], .row0 = t->row0[s], .k = k,
                            .out = out[j], .p = pr[j]};
    }
    return d;
}

/* ---- f32 rows of the files, for the references ---- */

static const gguf_tensor *tensor(const gguf_ctx *g, const char *name) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    CHECKF(t != NULL, "tensor %s", name);
    return t;
}

/* Row r of a tensor (any type) as f32 into out. */
static void row_f32(const gguf_tensor *t, int64_t r, float *out) {
    size_t rb = qt_row_size(t->type, t->ne[0]);
    qt_traits(t->type)->to_float((const unsigned char *)t->data + (size_t)r * rb, out, t->ne[0]);
}

/* y[N] = W x for an f32 matrix tensor of rows of K (the file's layout: row j = output j). */
static void matvec(const gguf_tensor *w, const float *x, float *y) {
    const float *W = w->data;
    const int64_t K = w->ne[0], N = w->ne[1];
    for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t i = 0; i < K; i++) s += (double)W[j * K + i] * x[i];
        y[j] = (float)s;
    }
}

static void rms(const float *x, const float *w, int n, float eps, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float sc = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * sc * (w ? w[i] : 1.0f);
}

/* NEOX rope of one head at position pos (theta_i = pos base^(-2i/n)). */
static void rope(float *v, int hd, int pos, float base) {
    for (int i = 0; i < hd / 2; i++) {
        double th = pos * pow(base, -2.0 * i / hd);
        float a = v[i], b = v[i + hd / 2];
        v[i] = (float)(a * cos(th) - b * sin(th));
        v[i + hd / 2] = (float)(a * sin(th) + b * cos(th));
    }
}

static const float *f32_of(const gguf_ctx *g, const char *fmt, int il) {
    char nm[96];
    snprintf(nm, sizeof nm, fmt, il);
    const gguf_tensor *t = tensor(g, nm);
    return t ? t->data : NULL;
}

/* The target's output matrix (its own, else the tied embedding). */
static const gguf_tensor *out_matrix(const gguf_ctx *g) {
    const gguf_tensor *o = gguf_find_tensor(g, "output.weight");
    return o ? o : gguf_find_tensor(g, "token_embd.weight");
}

/* ---- loading ---- */

static void test_load(const char *src) {
    char fx[512], sp[512];
    if (!dflash_fixture(src, DFLF_RANDOM, fx, sizeof fx)) return;
    hn_err e;
    gguf_ctx *dg = NULL;
    CHECK(gguf_open(fx, &dg, &e) == HN_OK);
    float *a = NULL, *b = NULL;
    int V = 0;
    for (int with = 0; with < 2; with++) {
        model *m = NULL;
        model_params mp = {.n_threads = 2, .max_batch = 64, .device = tdev(), .dflash = with ? dg : NULL};
        if (model_load(path_of(src, sp, sizeof sp), &mp, &m, &e)) {
            CHECKF(0, "%s: load: %s", src, e.msg);
            break;
        }
        V = model_hp(m)->n_vocab;
        CHECKF(model_has_dflash(m) == (with != 0), "%s: model_has_dflash", src);
        if (with) {
            const model_dflash_info *d = model_dflash(m);
            int n_main = model_hp(m)->n_layer - model_hp(m)->n_nextn;
            CHECKF(d && d->block_size == DFLF_BLOCK && d->n_taps == 2 && d->taps[1] == n_main && d->mask_token == V - 1 &&
                       d->n_layer == DFLF_LAYERS && d->head_dim == DFLF_HD && !d->sample_from_anchor && !d->causal &&
                       d->weight_bytes > 0,
                   "%s: the drafter's options", src);
        }
        kv_config c = model_kv_config(m, 16, 16);
        kv_cache *kv;
        kv_seq sq;
        kv_create(&c, &kv, &e);
        kv_seq_init(&sq, kv, 64, &e);
        if (model_hp(m)->hybrid) kv_seq_state_acquire(kv, &sq, &e);
        int32_t tok[24], pos[24], sid[24] = {0};
        bool want[24];
        for (int i = 0; i < 24; i++) {
            tok[i] = i * 37 + 1;
            pos[i] = i;
            want[i] = i % 5 == 4;
        }
        kv_seq *seqs[1] = {&sq};
        model_batch bt = {.n_tokens = 24, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs,
                          .n_seqs = 1};
        float *o = malloc(sizeof(float) * 4 * (size_t)V);
        CHECKF(model_forward(m, kv, &bt, o, 4, &e) == HN_OK, "forward: %s", e.msg);
        if (with) b = o;
        else a = o;
        kv_seq_free(&sq, kv);
        kv_free(kv);
        model_free(m);
    }
    CHECKF(a && b && !memcmp(a, b, sizeof(float) * 4 * (size_t)V), "%s: the logits do not depend on the taps", src);
    free(a);
    free(b);
    gguf_close(dg);
}

/* ---- injection, on the probe ---- */

static void test_probe(const char *src) {
    char fx[512];
    if (!dflash_fixture(src, DFLF_PROBE, fx, sizeof fx)) return;
    tstep t;
    if (!tstep_run(&t, src, fx)) {
        tstep_free(&t);
        return;
    }
    dfl_seq *ds[2];
    dfl_job jobs[2];
    int32_t out[2][16];
    float pr[2][16];
    dfl_drafter *d = drafter(&t, ds, jobs, 0, out, pr);
    hn_err e;
    if (d && dfl_step(d, jobs, 2, &e) == HN_OK) {
        const kv_cache *kv = dfl_cache(d);
        const model_dflash_info *inf = model_dflash(t.m);
        const int E = inf->n_embd, HD = inf->head_dim, HKV = inf->n_head_kv;
        const gguf_tensor *ow = out_matrix(model_gguf(t.m));
        float *wrow = malloc(sizeof(float) * (size_t)E), *k = malloc(sizeof(float) * (size_t)HKV * HD);
        double worst = 0, worst_k = 0;
        int argmax_ok = 0, rows = 0;
        for (int j = 0; j < 2; j++) {
            int s = j * 2;
            CHECKF(!jobs[j].failed && dfl_seq_len(ds[j]) == t.len[s], "sequence %d: injected %d of %d", s,
                   dfl_seq_len(ds[j]), t.len[s]);
            for (int p = 0; p < t.len[s] && !jobs[j].failed; p++) {
                const float *g = kv_v(kv, dfl_seq_kv(ds[j]), 0, p); /* = g_p: layer 0's V is the identity */
                const float *ref = t.lg + (size_t)(t.row0[s] + p) * (size_t)t.V;
                double mx = 0, err = 0, bl = -1e30;
                int32_t best = 0, rbest = 0;
                for (int v = 0; v < t.V; v++) {
                    row_f32(ow, v, wrow);
                    double l = 0;
                    for (int i = 0; i < E; i++) l += (double)wrow[i] * g[i];
                    if (fabs(ref[v]) > mx) mx = fabs(ref[v]);
                    if (fabs(l - ref[v]) > err) err = fabs(l - ref[v]);
                    if (l > bl) {
                        bl = l;
                        best = v;
                    }
                    if (ref[v] > ref[rbest]) rbest = v;
                }
                if (err / (mx > 0 ? mx : 1) > worst) worst = err / (mx > 0 ? mx : 1);
                argmax_ok += best == rbest;
                rows++;
                /* each layer's K: rope(k_norm(wk g)) at p */
                for (int il = 0; il < inf->n_layer; il++) {
                    char nm[64];
                    snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", il);
                    matvec(tensor(t.dg, nm), g, k);
                    const float *kn = f32_of(t.dg, "blk.%d.attn_k_norm.weight", il);
                    for (int h = 0; h < HKV; h++) {
                        rms(k + h * HD, kn, HD, 1e-6f, k + h * HD);
                        rope(k + h * HD, HD, p, 1e6f);
                    }
                    const float *kc = kv_k(kv, dfl_seq_kv(ds[j]), il, p);
                    for (int i = 0; i < HKV * HD; i++)
                        if (fabs(kc[i] - k[i]) > worst_k) worst_k = fabs(kc[i] - k[i]);
                }
            }
        }
        CHECKF(rows == t.len[0] + t.len[2] && worst < 0.03 && argmax_ok >= rows - 1,
               "%s: injected V times the output matrix vs the target's logits: worst relative %.4f, argmax %d of %d", src,
               worst, argmax_ok, rows);
        CHECKF(worst_k < 2e-3, "%s: injected K vs rope(k_norm(wk g)): worst %.2e", src, worst_k);
        printf("%s: probe: %d injected positions, logits from V within %.4f of the target's (argmax %d/%d), K within %.1e\n",
               src, rows, worst, argmax_ok, rows, worst_k);
        free(wrow);
        free(k);
        /* a sequence that is not where its job says is left out, not computed */
        dfl_job bad = {.seq = ds[0], .toks = t.toks[0], .from = 3, .n = 2, .row0 = 0, .k = 1, .out = out[0]};
        CHECK(dfl_step(d, &bad, 1, &e) == HN_OK && bad.failed && dfl_seq_len(ds[0]) == 0);
    } else if (d) {
        CHECKF(0, "dfl_step: %s", e.msg);
    }
    if (d) {
        for (int j = 0; j < 2; j++) dfl_seq_free(d, ds[j], t.toks[j * 2]);
        dfl_free(d);
    }
    tstep_free(&t);
}

/* ---- the block forward against a scalar reference ---- */

/* The format's block forward for one sequence: its context's K/V from the
 * drafter's cache (positions 0 .. L-1), the block [anchor, mask ...] at L ..
 * L + bs - 1; logits of the slots wanted (slot s0 + j for j < k) into lg. */
static void ref_block(const gguf_ctx *dg, const gguf_ctx *tg, const kv_cache *kv, const kv_seq *sq, int L,
                      int32_t anchor, bool causal, int s0, int k, float *lg, int V) {
    uint32_t E, H, HKV, F, bs;
    gguf_get_u32(dg, "dflash.embedding_length", &E);
    gguf_get_u32(dg, "dflash.attention.head_count", &H);
    gguf_get_u32(dg, "dflash.attention.head_count_kv", &HKV);
    gguf_get_u32(dg, "dflash.feed_forward_length", &F);
    gguf_get_u32(dg, "dflash.block_size", &bs);
    uint32_t mask;
    gguf_get_u32(dg, "tokenizer.ggml.mask_token_id", &mask);
    const int HD = DFLF_HD, NQ = (int)H * HD, NKV = (int)HKV * HD, grp = (int)(H / HKV);
    const float eps = 1e-6f, base = 1e6f;
    float *x = calloc((size_t)bs * E, sizeof(float)), *xb = calloc(E, sizeof(float));
    float *q = calloc((size_t)bs * NQ, sizeof(float)), *kk = calloc((size_t)bs * NKV, sizeof(float));
    float *vv = calloc((size_t)bs * NKV, sizeof(float)), *att = calloc(NQ, sizeof(float));
    float *o = calloc(E, sizeof(float)), *hg = calloc(F, sizeof(float)), *hu = calloc(F, sizeof(float));
    float *sc = calloc((size_t)L + bs, sizeof(float)), *wrow = calloc(E, sizeof(float));
    const gguf_tensor *emb = gguf_find_tensor(dg, "token_embd.weight");
    if (!emb) emb = gguf_find_tensor(tg, "token_embd.weight");
    for (uint32_t i = 0; i < bs; i++) row_f32(emb, i == 0 ? anchor : (int32_t)mask, x + (size_t)i * E);
    char nm[96];
#define T(fmt) (snprintf(nm, sizeof nm, fmt, il), tensor(dg, nm))
    for (int il = 0; il < DFLF_LAYERS; il++) {
        const float *an = f32_of(dg, "blk.%d.attn_norm.weight", il), *qn = f32_of(dg, "blk.%d.attn_q_norm.weight", il);
        const float *kn = f32_of(dg, "blk.%d.attn_k_norm.weight", il), *fn = f32_of(dg, "blk.%d.ffn_norm.weight", il);
        for (uint32_t i = 0; i < bs; i++) {
            rms(x + (size_t)i * E, an, (int)E, eps, xb);
            matvec(T("blk.%d.attn_q.weight"), xb, q + (size_t)i * NQ);
            matvec(T("blk.%d.attn_k.weight"), xb, kk + (size_t)i * NKV);
            matvec(T("blk.%d.attn_v.weight"), xb, vv + (size_t)i * NKV);
            for (uint32_t h = 0; h < H; h++) {
                rms(q + (size_t)i * NQ + h * HD, qn, HD, eps, q + (size_t)i * NQ + h * HD);
                rope(q + (size_t)i * NQ + h * HD, HD, L + (int)i, base);
            }
            for (uint32_t h = 0; h < HKV; h++) {
                rms(kk + (size_t)i * NKV + h * HD, kn, HD, eps, kk + (size_t)i * NKV + h * HD);
                rope(kk + (size_t)i * NKV + h * HD, HD, L + (int)i, base);
            }
        }
        for (uint32_t i = 0; i < bs; i++) {
            int nb = causal ? (int)i + 1 : (int)bs;
            for (uint32_t h = 0; h < H; h++) {
                int kh = (int)h / grp;
                const float *qh = q + (size_t)i * NQ + h * HD;
                float mx = -INFINITY;
                for (int p = 0; p < L + nb; p++) {
                    const float *kr = p < L ? kv_k(kv, sq, il, p) + kh * HD : kk + (size_t)(p - L) * NKV + kh * HD;
                    double s = 0;
                    for (int d = 0; d < HD; d++) s += (double)qh[d] * kr[d];
                    sc[p] = (float)(s / sqrt((double)HD));
                    if (sc[p] > mx) mx = sc[p];
                }
                double sum = 0;
                for (int p = 0; p < L + nb; p++) sum += sc[p] = expf(sc[p] - mx);
                for (int d = 0; d < HD; d++) {
                    double a = 0;
                    for (int p = 0; p < L + nb; p++) {
                        const float *vr = p < L ? kv_v(kv, sq, il, p) + kh * HD : vv + (size_t)(p - L) * NKV + kh * HD;
                        a += sc[p] * vr[d];
                    }
                    att[h * HD + d] = (float)(a / sum);
                }
            }
            matvec(T("blk.%d.attn_output.weight"), att, o);
            float *xi = x + (size_t)i * E;
            for (uint32_t d = 0; d < E; d++) xi[d] += o[d];
        }
        for (uint32_t i = 0; i < bs; i++) {
            float *xi = x + (size_t)i * E;
            rms(xi, fn, (int)E, eps, xb);
            matvec(T("blk.%d.ffn_gate.weight"), xb, hg);
            matvec(T("blk.%d.ffn_up.weight"), xb, hu);
            for (uint32_t f = 0; f < F; f++) hg[f] = hg[f] / (1.0f + expf(-hg[f])) * hu[f];
            matvec(T("blk.%d.ffn_down.weight"), hg, o);
            for (uint32_t d = 0; d < E; d++) xi[d] += o[d];
        }
    }
#undef T
    const float *onorm = tensor(dg, "output_norm.weight")->data;
    const gguf_tensor *ow = gguf_find_tensor(dg, "output.weight");
    if (!ow) ow = out_matrix(tg);
    for (int j = 0; j < k; j++) {
        rms(x + (size_t)(s0 + j) * E, onorm, (int)E, eps, xb);
        for (int v = 0; v < V; v++) {
            row_f32(ow, v, wrow);
            double l = 0;
            for (uint32_t d = 0; d < E; d++) l += (double)wrow[d] * xb[d];
            lg[(size_t)j * V + v] = (float)l;
        }
    }
    free(x);
    free(xb);
    free(q);
    free(kk);
    free(vv);
    free(att);
    free(o);
    free(hg);
    free(hu);
    free(sc);
    free(wrow);
}

static void test_block(const char *src, int kind) {
    char fx[512];
    if (!dflash_fixture(src, kind, fx, sizeof fx)) return;
    tstep t;
    if (!tstep_run(&t, src, fx)) {
        tstep_free(&t);
        return;
    }
    const model_dflash_info *inf = model_dflash(t.m);
    const int per = inf->sample_from_anchor ? inf->block_size : inf->block_size - 1, s0 = inf->sample_from_anchor ? 0 : 1;
    dfl_seq *ds[2];
    dfl_job jobs[2];
    int32_t out[2][16];
    float pr[2][16];
    dfl_drafter *d = drafter(&t, ds, jobs, 16, out, pr); /* asks for more than a block drafts */
    hn_err e;
    if (d && dfl_step(d, jobs, 2, &e) == HN_OK) {
        CHECK(dfl_block_drafts(d) == per);
        float *ref = malloc(sizeof(float) * (size_t)per * (size_t)t.V), *alt = malloc(sizeof(float) * (size_t)per * (size_t)t.V);
        double worst_p = 0, gap = 0;
        int near = 0, n = 0;
        for (int j = 0; j < 2; j++) {
            int s = j * 2;
            CHECKF(!jobs[j].failed && jobs[j].n_out == per, "sequence %d: %d drafted of %d (failed %d)", s, jobs[j].n_out,
                   per, (int)jobs[j].failed);
            CHECKF(dfl_seq_len(ds[j]) == t.len[s], "sequence %d: the drafter holds %d positions, not %d", s,
                   dfl_seq_len(ds[j]), t.len[s]);
            ref_block(t.dg, model_gguf(t.m), dfl_cache(d), dfl_seq_kv(ds[j]), t.len[s], t.toks[s][t.len[s]], inf->causal,
                      s0, per, ref, t.V);
            /* the other attention (causal for a non-causal file and back): a reference that tells them apart */
            ref_block(t.dg, model_gguf(t.m), dfl_cache(d), dfl_seq_kv(ds[j]), t.len[s], t.toks[s][t.len[s]], !inf->causal,
                      s0, per, alt, t.V);
            for (int i = 0; i < jobs[j].n_out; i++) {
                const float *r = ref + (size_t)i * t.V;
                double mx = -1e30, sum = 0;
                for (int v = 0; v < t.V; v++)
                    if (r[v] > mx) mx = r[v];
                for (int v = 0; v < t.V; v++) sum += exp(r[v] - mx);
                int32_t tok = out[j][i];
                near += r[tok] >= mx - 0.05 * (fabs(mx) + 1);
                double pref = exp(r[tok] - mx) / sum;
                if (fabs(pref - pr[j][i]) > worst_p) worst_p = fabs(pref - pr[j][i]);
                for (int v = 0; v < t.V; v++)
                    if (fabs(r[v] - alt[(size_t)i * t.V + v]) > gap) gap = fabs(r[v] - alt[(size_t)i * t.V + v]);
                n++;
            }
        }
        CHECKF(n == 2 * per && near == n && worst_p < 0.02,
               "%s (%s): %d of %d drafts are the reference's argmax; probabilities within %.4f", src, fx, near, n, worst_p);
        CHECKF(inf->causal || gap > 0.1, "%s: the reference does not tell causal from not (%.3f)", src, gap);
        printf("%s (%s block): %d drafts as the reference's, probabilities within %.4f; the other attention differs by %.3f\n",
               src, inf->causal ? "causal" : inf->sample_from_anchor ? "anchor-first" : "non-causal", near, worst_p, gap);
        const kv_seq *ks[2] = {dfl_seq_kv(ds[0]), dfl_seq_kv(ds[1])};
        CHECKF(dfl_check(d, ks, 2, &e) == HN_OK, "drafter cache: %s", e.msg);
        dfl_stats st;
        dfl_get_stats(d, &st);
        CHECKF(st.steps == 2 && st.blocks == 2 && st.drafted == (uint64_t)(2 * per) &&
                   st.tokens == (uint64_t)(t.len[0] + t.len[2] + 2 * inf->block_size),
               "stats: %llu steps, %llu blocks, %llu rows, %llu drafted", (unsigned long long)st.steps,
               (unsigned long long)st.blocks, (unsigned long long)st.tokens, (unsigned long long)st.drafted);
        free(ref);
        free(alt);
    } else if (d) {
        CHECKF(0, "dfl_step: %s", e.msg);
    }
    if (d) {
        for (int j = 0; j < 2; j++) dfl_seq_free(d, ds[j], t.toks[j * 2]);
        dfl_free(d);
    }
    tstep_free(&t);
}

/* ---- through the engine ---- */

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAXT];
    int n, done;
    eng_finish fin;
    eng_req_stats st;
    int32_t last;
    int narrow;
    int32_t only;
    uint32_t mask[8192];
    int32_t n_vocab;
    int bad_constraint;
} coll;

static void on_event(void *ctx, const eng_event *ev) {
    coll *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (ev->type == ENG_EV_TOKEN) {
        if (c->n < MAXT) c->toks[c->n] = ev->token;
        c->n++;
    } else {
        c->done = 1;
        c->fin = ev->finish;
        c->st = ev->stats;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static const uint32_t *allowed(void *ctx) {
    coll *c = ctx;
    int nw = (c->n_vocab + 31) / 32;
    for (int w = 0; w < nw; w++) {
        uint32_t m = 0;
        for (int b = 0; b < 32; b++) {
            int t = w * 32 + b;
            if (c->narrow ? t == c->only : t % 3 == (int)((c->last + 1) % 3)) m |= 1u << b;
        }
        c->mask[w] = m;
    }
    return c->mask;
}

static void accept(void *ctx, int32_t tok) {
    coll *c = ctx;
    if (c->narrow ? tok != c->only : tok % 3 != (c->last + 1) % 3) c->bad_constraint++;
    c->last = tok;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

typedef struct workload {
    int32_t prompt[NS][600];
    int n_prompt[NS];
    int max_tokens[NS];
    bool constrained;
    int narrow;
    float temp;
} workload;

typedef struct result {
    int32_t toks[NS][MAXT];
    int n[NS];
    eng_finish fin[NS];
    eng_req_stats st[NS];
    eng_stats es;
    int bad_constraint;
    bool ok;
} result;

static size_t kv_bytes = (size_t)64 << 20;

static void run(const char *path, const char *draft, int spec, bool prefix_cache, int turns, const workload *w,
                result *r) {
    memset(r, 0, sizeof *r);
    eng_params p = eng_default_params();
    p.model_path = path;
    p.draft_path = draft;
    p.device = tdev();
    p.n_threads = 2;
    p.n_ctx = 2048;
    p.kv_max_bytes = kv_bytes;
    p.step_tokens = 64; /* prompts prefill over several steps: injection across chunks */
    p.max_running = NS;
    p.prefix_cache = prefix_cache;
    p.debug_check = true;
    p.spec = spec;
    hn_err err;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &err)) {
        CHECKF(0, "%s: eng_create: %s", path, err.msg);
        return;
    }
    coll *c = calloc(NS, sizeof *c);
    const int nv = (int)tok_n_vocab(eng_vocab(g));
    r->ok = true;
    for (int turn = 0; turn < turns; turn++) {
        memset(c, 0, sizeof *c * NS);
        for (int i = 0; i < NS; i++) {
            pthread_mutex_init(&c[i].mu, NULL);
            pthread_cond_init(&c[i].cv, NULL);
            c[i].n_vocab = nv;
            c[i].narrow = w->narrow;
            c[i].only = 100 + 37 * i;
            eng_request rq = {.prompt = w->prompt[i], .n_prompt = w->n_prompt[i], .max_tokens = w->max_tokens[i],
                              .ignore_eog = true, .on_event = on_event, .ctx = &c[i]};
            rq.sampling = smp_default_params();
            rq.sampling.temp = w->temp;
            rq.sampling.seed = 7 + (uint64_t)i;
            if (w->constrained || w->narrow) {
                rq.allowed = allowed;
                rq.accept = accept;
                rq.mask_ctx = &c[i];
            }
            eng_req_id id;
            if (eng_submit(g, &rq, &id, &err)) CHECKF(0, "submit: %s", err.msg);
        }
        r->bad_constraint = 0;
        for (int i = 0; i < NS; i++) {
            struct timespec ts;
            hn_deadline_ms(&ts, 300000);
            pthread_mutex_lock(&c[i].mu);
            while (!c[i].done)
                if (pthread_cond_timedwait(&c[i].cv, &c[i].mu, &ts)) break;
            r->ok &= c[i].done;
            r->n[i] = c[i].n < MAXT ? c[i].n : MAXT;
            memcpy(r->toks[i], c[i].toks, sizeof(int32_t) * (size_t)r->n[i]);
            r->fin[i] = c[i].fin;
            r->st[i] = c[i].st;
            r->bad_constraint += c[i].bad_constraint;
            pthread_mutex_unlock(&c[i].mu);
        }
        for (int i = 0; i < NS; i++) {
            pthread_mutex_destroy(&c[i].mu);
            pthread_cond_destroy(&c[i].cv);
        }
    }
    for (int t = 0; t < 100; t++) { /* the last step's stats are published after the events */
        eng_get_stats(g, &r->es);
        if (r->es.n_running == 0) break;
        usleep(10000);
    }
    eng_get_stats(g, &r->es);
    eng_free(g);
    free(c);
}

static bool same(const result *a, const result *b, const char *what) {
    bool ok = a->ok && b->ok;
    for (int i = 0; i < NS && ok; i++) {
        if (a->n[i] != b->n[i] || a->fin[i] != b->fin[i] ||
            memcmp(a->toks[i], b->toks[i], sizeof(int32_t) * (size_t)a->n[i])) {
            int j = 0;
            while (j < a->n[i] && j < b->n[i] && a->toks[i][j] == b->toks[i][j]) j++;
            CHECKF(0, "%s: session %d differs at token %d (%d vs %d tokens, finish %d vs %d)", what, i, j, a->n[i],
                   b->n[i], (int)a->fin[i], (int)b->fin[i]);
            ok = false;
        }
    }
    return ok;
}

static void make_workload(workload *w) {
    memset(w, 0, sizeof *w);
    for (int i = 0; i < NS; i++) {
        int plen = 40 + 10 * i, n = 0;
        int32_t passage[80];
        for (int j = 0; j < plen; j++) passage[j] = 3 + (int32_t)(rnd() % 1997u);
        if (i % 2 == 0) {
            for (int rep = 0; rep < 3; rep++)
                for (int j = 0; j < plen; j++) w->prompt[i][n++] = passage[j];
        } else {
            for (int j = 0; j < 150; j++) w->prompt[i][n++] = 3 + (int32_t)(rnd() % 1997u);
        }
        w->n_prompt[i] = n;
        w->max_tokens[i] = 60 + 12 * i;
    }
}

/* The counters of a run with the DFlash drafter: the requests' add up to
 * the engine's, accepted <= verified <= proposed, the drafter ran
 * (injection rows for every computed token at least) and its memory is
 * reported. Returns the acceptance ratio. */
static double check_counters(const result *r, const char *what, bool one_turn) {
    uint64_t d = 0, a = 0;
    for (int i = 0; i < NS; i++) {
        d += (uint64_t)r->st[i].n_drafted;
        a += (uint64_t)r->st[i].n_accepted;
    }
    bool add_up = one_turn ? d == r->es.spec_drafted && a == r->es.spec_accepted
                           : d <= r->es.spec_drafted && a <= r->es.spec_accepted;
    CHECKF(add_up && a <= d, "%s: counters %llu/%llu vs %llu/%llu", what, (unsigned long long)d, (unsigned long long)a,
           (unsigned long long)r->es.spec_drafted, (unsigned long long)r->es.spec_accepted);
    CHECKF(r->es.dflash_loaded && !r->es.mtp_loaded && !r->es.draft_loaded && r->es.dflash_kv_peak_bytes > 0 &&
               r->es.dflash_blocks > 0 && r->es.dflash_tokens + r->es.cached_tokens >= r->es.prompt_tokens &&
               r->es.dflash_drafted >= r->es.spec_drafted && r->es.spec_drafted > 0 && r->es.dflash_left_out == 0,
           "%s: DFlash stats (loaded %d, KV peak %zu, %llu steps, %llu rows, %llu blocks, %llu proposed, %llu verified, "
           "%llu left out)",
           what, (int)r->es.dflash_loaded, r->es.dflash_kv_peak_bytes, (unsigned long long)r->es.dflash_steps,
           (unsigned long long)r->es.dflash_tokens, (unsigned long long)r->es.dflash_blocks,
           (unsigned long long)r->es.dflash_drafted, (unsigned long long)r->es.spec_drafted,
           (unsigned long long)r->es.dflash_left_out);
    CHECKF(r->es.check_failures == 0, "%s: KV check: %s", what, r->es.check_error);
    return d ? (double)a / (double)d : 0;
}

/* full: besides greedy output, constrained, sampled, two turns and preemption; oracle: and the oracle */
static void engine_case(const char *src, bool full, bool oracle) {
    char fx[512], tp[512], what[700];
    if (!dflash_fixture(src, DFLF_RANDOM, fx, sizeof fx)) return;
    path_of(src, tp, sizeof tp);
    workload w;
    make_workload(&w);
    static result off, dfl, aut;
    run(tp, NULL, ENG_SPEC_OFF, false, 1, &w, &off);
    run(tp, fx, ENG_SPEC_DFLASH, false, 1, &w, &dfl);
    run(tp, fx, ENG_SPEC_AUTO, false, 1, &w, &aut);
    snprintf(what, sizeof what, "%s, dflash vs off", src);
    bool ok1 = same(&off, &dfl, what);
    double acc = check_counters(&dfl, what, true);
    CHECKF(dfl.es.spec == ENG_SPEC_DFLASH && dfl.es.spec_verify_steps > 0, "%s: never verified", what);
    CHECKF(!off.es.dflash_loaded, "%s: --spec off loads no DFlash drafter", what);
    snprintf(what, sizeof what, "%s, auto with the DFlash file vs off", src);
    bool ok2 = same(&off, &aut, what);
    CHECKF(aut.es.dflash_loaded && !aut.es.draft_loaded && !aut.es.mtp_loaded && aut.es.check_failures == 0,
           "%s: auto uses the DFlash drafter (KV check: %s)", what, aut.es.check_error);
    printf("%s (random DFlash drafter): %s; dflash: drafted %llu accepted %llu (%.1f%%), steps %llu vs %llu, %llu drafter "
           "steps (%llu rows, %llu blocks); auto drafted %llu accepted %llu (DFlash proposed %llu)\n",
           src, ok1 && ok2 ? "identical" : "DIFFERENT", (unsigned long long)dfl.es.spec_drafted,
           (unsigned long long)dfl.es.spec_accepted, 100 * acc, (unsigned long long)dfl.es.steps,
           (unsigned long long)off.es.steps, (unsigned long long)dfl.es.dflash_steps,
           (unsigned long long)dfl.es.dflash_tokens, (unsigned long long)dfl.es.dflash_blocks,
           (unsigned long long)aut.es.spec_drafted, (unsigned long long)aut.es.spec_accepted,
           (unsigned long long)aut.es.dflash_drafted);

    if (!full) return;
    /* a constraint: a drafted token it refuses is a miss */
    w.constrained = true;
    run(tp, NULL, ENG_SPEC_OFF, false, 1, &w, &off);
    run(tp, fx, ENG_SPEC_DFLASH, false, 1, &w, &dfl);
    snprintf(what, sizeof what, "%s, constrained, dflash vs off", src);
    same(&off, &dfl, what);
    CHECKF(off.bad_constraint == 0 && dfl.bad_constraint == 0, "%s: constraint broken (%d, %d)", what,
           off.bad_constraint, dfl.bad_constraint);
    check_counters(&dfl, what, true);
    w.constrained = false;

    /* seeded sampling: a draft is accepted when the sampler's own draw is it */
    w.temp = 0.8f;
    run(tp, NULL, ENG_SPEC_OFF, false, 1, &w, &off);
    run(tp, fx, ENG_SPEC_DFLASH, false, 1, &w, &dfl);
    snprintf(what, sizeof what, "%s, sampled, dflash vs off", src);
    same(&off, &dfl, what);
    check_counters(&dfl, what, true);
    w.temp = 0;

    /* the prefix cache, two turns on one engine: the second turn's drafter
     * sequences start from the drafter's own cached blocks (none left out) */
    run(tp, NULL, ENG_SPEC_OFF, true, 2, &w, &off);
    run(tp, fx, ENG_SPEC_DFLASH, true, 2, &w, &dfl);
    snprintf(what, sizeof what, "%s, prefix cache, second turn, dflash vs off", src);
    same(&off, &dfl, what);
    check_counters(&dfl, what, false);
    CHECKF(dfl.es.cached_tokens > 0, "%s: nothing came from the prefix cache", what);

    /* a pool too small for the four sessions at once: requests are
     * preempted (their drafter sequences start again with them) and resumed
     * through both prefix caches; every invariant holds and every request
     * finishes */
    kv_bytes = (size_t)600 << 10;
    run(tp, fx, ENG_SPEC_DFLASH, true, 1, &w, &dfl);
    kv_bytes = (size_t)64 << 20;
    snprintf(what, sizeof what, "%s, preempted, dflash", src);
    bool all = dfl.ok;
    for (int i = 0; i < NS; i++) all &= dfl.fin[i] == ENG_FINISH_LENGTH && dfl.n[i] == w.max_tokens[i];
    CHECKF(all && dfl.es.check_failures == 0 && dfl.es.preemptions > 0 && dfl.es.dflash_blocks > 0,
           "%s: finished %d, %llu preemptions, KV check: %s", what, (int)all, (unsigned long long)dfl.es.preemptions,
           dfl.es.check_error);
    printf("%s: %llu preemptions, drafted %llu, %llu requests left out of the drafter\n", what,
           (unsigned long long)dfl.es.preemptions, (unsigned long long)dfl.es.spec_drafted,
           (unsigned long long)dfl.es.dflash_left_out);

    /* the oracle: sessions restricted to one token each repeat it, which
     * DFLF_COPY drafts in every slot: nearly every draft is accepted */
    char ox[512];
    if (!oracle || !dflash_fixture(src, DFLF_COPY, ox, sizeof ox)) return;
    w.narrow = 1;
    run(tp, NULL, ENG_SPEC_OFF, false, 1, &w, &off);
    run(tp, ox, ENG_SPEC_DFLASH, false, 1, &w, &dfl);
    snprintf(what, sizeof what, "%s, oracle DFlash drafter, one allowed token, dflash vs off", src);
    bool ok3 = same(&off, &dfl, what);
    acc = check_counters(&dfl, what, true);
    CHECKF(acc >= 0.9 && 3 * dfl.es.steps < off.es.steps, "%s: accepted %.1f%%, %llu steps vs %llu", what, 100 * acc,
           (unsigned long long)dfl.es.steps, (unsigned long long)off.es.steps);
    CHECKF(off.bad_constraint == 0 && dfl.bad_constraint == 0, "%s: constraint broken", what);
    printf("%s (oracle DFlash drafter): %s; drafted %llu accepted %llu (%.1f%%), steps %llu vs %llu\n", src,
           ok3 ? "identical" : "DIFFERENT", (unsigned long long)dfl.es.spec_drafted,
           (unsigned long long)dfl.es.spec_accepted, 100 * acc, (unsigned long long)dfl.es.steps,
           (unsigned long long)off.es.steps);
}

/* ---- refusals ---- */

static void refused(const char *target, const char *draft, int spec, hn_status want, const char *needle) {
    eng_params p = eng_default_params();
    p.model_path = target;
    p.draft_path = draft;
    p.device = tdev();
    p.n_threads = 2;
    p.n_ctx = 512;
    p.kv_max_bytes = (size_t)16 << 20;
    p.spec = spec;
    hn_err err = {0};
    eng_engine *g = NULL;
    hn_status st = eng_create(&p, &g, &err);
    CHECKF(st == want && (!needle || strstr(err.msg, needle)), "%s with %s (%s): status %d, '%s' (want %d, '%s')",
           target, draft ? draft : "no draft", eng_spec_name(spec), (int)st, st ? err.msg : "", (int)want,
           needle ? needle : "");
    if (!st) {
        eng_stats es;
        eng_get_stats(g, &es);
        bool is_dflash = false;
        if (draft) {
            gguf_ctx *dg;
            if (gguf_open(draft, &dg, &err) == HN_OK) {
                const char *a = gguf_get_str(dg, "general.architecture");
                is_dflash = a && !strcmp(a, "dflash");
                gguf_close(dg);
            }
        }
        bool want_loaded = is_dflash && (spec == ENG_SPEC_AUTO || spec == ENG_SPEC_DFLASH);
        CHECKF(es.dflash_loaded == want_loaded, "%s (%s): a DFlash drafter loaded only from a DFlash file (%d)", target,
               eng_spec_name(spec), (int)es.dflash_loaded);
        eng_free(g);
    } else {
        printf("refused as expected: %s\n", err.msg);
    }
}

static void test_refusals(void) {
    char q3[512], q35[512], real[512], fx[512], bad[512], dsp[512];
    path_of("qwen3-2k-q8_0.gguf", q3, sizeof q3);
    path_of("qwen35-tiny-q8_0.gguf", q35, sizeof q35);
    path_of("qwen3-real-q8_0.gguf", real, sizeof real);
    if (!dflash_fixture("qwen3-2k-q8_0.gguf", DFLF_RANDOM, fx, sizeof fx) ||
        !dflash_fixture("qwen3-2k-q8_0.gguf", DFLF_BADVOCAB, bad, sizeof bad) ||
        !dflash_fixture("qwen3-2k-q8_0.gguf", DFLF_DSPARK, dsp, sizeof dsp))
        return;
    refused(q3, NULL, ENG_SPEC_DFLASH, HN_ERR_INVALID, "--spec dflash needs a DFlash drafter");
    refused(q3, q35, ENG_SPEC_DFLASH, HN_ERR_UNSUPPORTED, "not general.architecture dflash");
    refused(q3, fx, ENG_SPEC_DRAFT, HN_ERR_UNSUPPORTED, "is a DFlash drafter");
    refused(q3, bad, ENG_SPEC_DFLASH, HN_ERR_UNSUPPORTED, "token 5 is");
    refused(q3, bad, ENG_SPEC_AUTO, HN_ERR_UNSUPPORTED, "vocabulary");
    refused(q3, dsp, ENG_SPEC_DFLASH, HN_ERR_UNSUPPORTED, "DSpark");
    refused(real, fx, ENG_SPEC_DFLASH, HN_ERR_UNSUPPORTED, "width");
    /* auto picks DFlash only from a DFlash file: not without a draft file, not with a draft model */
    refused(q3, NULL, ENG_SPEC_AUTO, HN_OK, NULL);
    refused(q3, q3, ENG_SPEC_AUTO, HN_OK, NULL);
    refused(q3, fx, ENG_SPEC_AUTO, HN_OK, NULL);
    /* --spec mtp and off leave the draft file alone */
    refused(q3, fx, ENG_SPEC_OFF, HN_OK, NULL);
    int v;
    CHECK(eng_spec_from_name("dflash", &v) == 0 && v == ENG_SPEC_DFLASH && !strcmp(eng_spec_name(v), "dflash"));
}

int main(void) {
    test_load("qwen3-2k-q8_0.gguf");
    test_load("qwen35-tiny-q8_0.gguf");
    test_probe("qwen3-2k-q8_0.gguf");
    test_probe("qwen35-tiny-q8_0.gguf");
    test_block("qwen3-2k-q8_0.gguf", DFLF_RANDOM);
    test_block("qwen3-2k-q8_0.gguf", DFLF_ANCHOR);
    test_block("qwen3-2k-q8_0.gguf", DFLF_CAUSAL);
    test_block("qwen35-tiny-q8_0.gguf", DFLF_RANDOM);
    test_refusals();
    test_block("qwen35moe-tiny-q8_0.gguf", DFLF_RANDOM);
    engine_case("qwen3-2k-q8_0.gguf", true, true);
    engine_case("qwen35-tiny-q8_0.gguf", true, true);
    engine_case("qwen35moe-tiny-q8_0.gguf", true, false);
    engine_case("qwen3-agent-q8_0.gguf", false, false); /* the trained target: greedy output */
    TEST_DONE();
}
