/* test_gemm_attn.c: the attention of the CPU backend, its kernels and the KV store.
 *
 * Kernels: every kernel set this CPU can run (AVX-512, AVX2) against the
 * portable reference: scores and weighted sums over chunks spread across
 * blocks (odd starting slots, lengths not a multiple of the vector width,
 * 1-6 query rows over 1-3 kv heads of each row, several head_dims), the
 * same for tiles of query rows given by pointer (prefill), one online-softmax
 * step, exp of a chunk, and the KV store's
 * f32 -> f16 conversion bit for bit against qt_f32_to_f16 (specials too).
 *
 * The op, with each kernel set forced: K f32/f16/q8_0 with several V types,
 * GQA groups 1, 2 and 4, sliding windows, two sequences in one batch, a
 * 3000-position context; a prefill batch (tiles of query rows) and decode
 * of the last token (positions split among threads and merged) against a
 * double reference over the cache's own (dequantized) K/V, and against each
 * other.
 *
 * The original inner-loop cases follow:  *
 * For head_dim 64, 128 and 72 (a tail that is not a multiple of the 32-wide
 * slices), groups of 1, 2 and 3 query heads per kv head and a sequence long
 * enough to span many blocks and chunks: the f32 cache against a naive double
 * reference, and an f16 cache against an f32 cache holding the same
 * (f16-rounded) values, which must agree bit for bit (the f16 loops convert
 * and then do exactly the f32 loops' arithmetic). Run twice, the second time
 * with force_reference on (which changes only the matmul path, so both runs
 * must agree with the reference alike).
 * Built with -DHN_TEST_KERNELS_ONLY (`make arm-test`), only the kernel cases run. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_int.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "quant/quant.h"
#include "sched/plan.h"
#include "test.h"

static uint32_t rng = 7;

#ifndef HN_TEST_KERNELS_ONLY
/* the step plan the ops read (made by hand: the K/V are stored by the tests) */
static step_plan plan;

/* Fills the plan with n tokens, token i at position pos[i] of sequence
 * seqs[seq[i]] (slot from its block table), and hands it to the backend. */
static bool plan_tokens(be_backend *b, const kv_cache *kv, int n, const int32_t *pos, const int32_t *seq,
                        const kv_seq *const *seqs, int n_seqs) {
    const int bs = kv->cfg.block_size;
    int32_t stride = 1;
    for (int q = 0; q < n_seqs; q++)
        if (seqs[q]->n_blocks > stride) stride = seqs[q]->n_blocks;
    if (n > plan.cap_tokens || n_seqs > plan.cap_seqs || stride > plan.cap_blocks) {
        CHECKF(0, "plan: %d tokens, %d sequences, %d blocks over its capacity", n, n_seqs, (int)stride);
        return false;
    }
    plan.n_tokens = plan.n_pad = n;
    plan.n_seqs = n_seqs;
    plan.n_out = 0;
    plan.bt_stride = stride;
    plan.block_size = bs;
    for (int q = 0; q < n_seqs; q++) {
        int32_t len = seqs[q]->n_tokens;
        for (int32_t j = 0; j < stride; j++)
            plan.block_table[(size_t)q * stride + j] = j < seqs[q]->n_blocks ? seqs[q]->blocks[j] : -1;
        for (int i = 0; i < n; i++)
            if (seq[i] == q && pos[i] + 1 > len) len = pos[i] + 1;
        plan.seq_len[q] = len;
        plan.seqs[q] = NULL;
    }
    for (int i = 0; i < n; i++) {
        plan.token[i] = 0;
        plan.pos[i] = pos[i];
        plan.seq[i] = seq[i];
        plan.slot[i] = seqs[seq[i]]->blocks[pos[i] / bs] * bs + pos[i] % bs;
    }
    b->ops->plan_set(b, &plan);
    return true;
}

/* Stores one position's K and V rows with the quant module's reference
 * quantizers at the cache's kv_block_* addresses (what the KV store must
 * write, f16 included). */
static void ref_store_row(kv_cache *kv, const kv_seq *s, int layer, int32_t pos, const float *k, const float *v) {
    int bs = kv->cfg.block_size;
    int32_t blk = s->blocks[pos / bs];
    size_t slot = (size_t)(pos % bs);
    unsigned char *kd = kv_block_kraw(kv, blk, layer) + slot * kv->k_row_bytes;
    unsigned char *vd = kv_block_vraw(kv, blk, layer) + slot * kv->v_row_bytes;
    if (kv->cfg.type == QT_F32) memcpy(kd, k, kv->k_row_bytes);
    else qt_traits(kv->cfg.type)->from_float(k, kd, (int64_t)kv->row_elems);
    if (kv->cfg.v_type == QT_F32) memcpy(vd, v, kv->v_row_bytes);
    else qt_traits(kv->cfg.v_type)->from_float(v, vd, (int64_t)kv->row_elems);
}

static void sync_ok(be_backend *b) {
    hn_err e;
    hn_status st = b->ops->sync(b, &e);
    CHECKF(st == HN_OK, "sync: %s", e.msg);
}
#endif

static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
}

#ifndef HN_TEST_KERNELS_ONLY
static void run_case(be_backend *b, int hd, int group, bool ref) {
    hn_err e;
    const int HKV = 2, H = HKV * group, LEN = 75, BS = 16;
    kv_cache *kv[2];
    kv_seq s[2];
    for (int c = 0; c < 2; c++) {
        kv_config cfg = {.n_layer = 1, .n_head_kv = HKV, .head_dim = hd, .block_size = BS, .n_blocks = 8,
                         .type = c ? QT_F16 : QT_F32, .v_type = c ? QT_F16 : QT_F32};
        CHECK(kv_create(&cfg, &kv[c], &e) == HN_OK);
        kv_seq_init(&s[c], kv[c], LEN, &e);
        CHECK(kv_seq_reserve(kv[c], &s[c], LEN, &e) == HN_OK);
    }
    float *k = malloc(sizeof(float) * (size_t)HKV * hd), *v = malloc(sizeof(float) * (size_t)HKV * hd);
    float *kk = malloc(sizeof(float) * (size_t)LEN * HKV * hd), *vv = malloc(sizeof(float) * (size_t)LEN * HKV * hd);
    for (int p = 0; p < LEN; p++) {
        for (int i = 0; i < HKV * hd; i++) {
            /* f16-exact values so that both caches hold the same numbers */
            k[i] = qt_f16_to_f32(qt_f32_to_f16(frand() * 4));
            v[i] = qt_f16_to_f32(qt_f32_to_f16(frand() * 2));
            kk[(size_t)p * HKV * hd + i] = k[i];
            vv[(size_t)p * HKV * hd + i] = v[i];
        }
        for (int c = 0; c < 2; c++) ref_store_row(kv[c], &s[c], 0, p, k, v);
    }
    /* three query tokens: early, at a chunk edge, last */
    int32_t pos[3] = {5, 31, LEN - 1};
    float *q = malloc(sizeof(float) * 3 * (size_t)H * hd), *out[2];
    for (int i = 0; i < 3 * H * hd; i++) q[i] = frand() * 2;
    be_cpu_force_reference(b, ref);
    for (int c = 0; c < 2; c++) {
        out[c] = malloc(sizeof(float) * 3 * (size_t)H * hd);
        const kv_seq *seqs[1] = {&s[c]};
        const int32_t sq[3] = {0, 0, 0};
        plan_tokens(b, kv[c], 3, pos, sq, seqs, 1);
        be_tensor Q = be_cpu_host(QT_F32, q), O = be_cpu_host(QT_F32, out[c]);
        be_attn_args a = {.q = &Q, .out = &O, .n_tokens = 3, .n_head = H, .n_head_kv = HKV, .head_dim = hd,
                          .scale = 1.0f / sqrtf((float)hd), .kv = kv[c], .layer = 0};
        b->ops->attention(b, &a);
        sync_ok(b);
    }
    be_cpu_force_reference(b, false);
    CHECKF(!memcmp(out[0], out[1], sizeof(float) * 3 * (size_t)H * hd), "hd %d group %d%s: f16 cache differs from f32",
           hd, group, ref ? " (portable)" : "");
    double err = 0;
    for (int t = 0; t < 3; t++)
        for (int h = 0; h < H; h++) {
            const float *qh = q + ((size_t)t * H + h) * hd;
            int kvh = h / group;
            double sc[LEN], mx = -1e300, sum = 0;
            for (int p = 0; p <= pos[t]; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * kk[((size_t)p * HKV + kvh) * hd + i];
                sc[p] = d / sqrt((double)hd);
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p <= pos[t]; p++) sum += exp(sc[p] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int p = 0; p <= pos[t]; p++) o += exp(sc[p] - mx) / sum * vv[((size_t)p * HKV + kvh) * hd + i];
                double d = fabs(o - out[0][((size_t)t * H + h) * hd + i]);
                if (d > err) err = d;
            }
        }
    CHECKF(err < 1e-5, "hd %d group %d%s: max error %g", hd, group, ref ? " (portable)" : "", err);
    for (int c = 0; c < 2; c++) {
        kv_seq_free(&s[c], kv[c]);
        kv_free(kv[c]);
        free(out[c]);
    }
    free(k);
    free(v);
    free(kk);
    free(vv);
    free(q);
}

#endif /* HN_TEST_KERNELS_ONLY */

/* ---- kernels against the portable reference ---- */

static void kernel_cases(void) {
    const cpu_attn_kernels *ks[4];
    int nk = cpu_attn_variants(ks, 4);
    const cpu_attn_kernels *ref = ks[nk - 1];
    CHECK(!strcmp(ref->name, "portable"));
    enum { NB = 6, BS = 16, MAXHD = 256 };
    static const int hds[] = {16, 64, 128, 80, 256, 40};
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
        int hd = hds[hi];
        size_t stride = (size_t)3 * hd; /* rows of 3 kv heads */
        float *kf = malloc(sizeof(float) * NB * BS * stride);
        uint16_t *kh = malloc(sizeof(uint16_t) * NB * BS * stride);
        for (size_t i = 0; i < (size_t)NB * BS * stride; i++) {
            kh[i] = qt_f32_to_f16(frand() * 3);
            kf[i] = qt_f16_to_f32(kh[i]);
        }
        /* blocks in scrambled order, as a block table gives them */
        const unsigned char *bf[NB], *bh[NB];
        static const int order[NB] = {3, 0, 5, 1, 4, 2};
        for (int j = 0; j < NB; j++) {
            bf[j] = (const unsigned char *)(kf + (size_t)order[j] * BS * stride);
            bh[j] = (const unsigned char *)(kh + (size_t)order[j] * BS * stride);
        }
        float q[6 * MAXHD], w[6 * CPU_ATTN_SCORE_CAP];
        for (int i = 0; i < 6 * hd; i++) q[i] = frand() * 2;
        for (int i = 0; i < 6 * CPU_ATTN_SCORE_CAP; i++) w[i] = frand() + 0.5f;
        static const int slots[] = {0, 5, 15};
        static const int nps[] = {1, 7, 16, 33, 64};
        for (int v = 0; v < nk - 1; v++) {
            if (hd % ks[v]->hd_mult) continue;
            double es = 0, ew = 0;
            for (int si = 0; si < 3; si++)
                for (int ni = 0; ni < 5; ni++)
                    for (int nq = 1; nq <= 6; nq++)
                        for (int f16 = 0; f16 < 2; f16++) {
                            int np = nps[ni];
                            /* query rows per kv head: 1, 2 or 3 (pairs that do and do not share one) */
                            int group = nq <= 3 ? 1 + (nq + si) % 3 : (nq + 2) / 3;
                            cpu_attn_rows r = {.blk = f16 ? bh : bf, .stride = stride * (f16 ? 2 : 4), .slot0 = slots[si], .bs = BS};
                            float s0[6 * CPU_ATTN_SCORE_CAP], s1[6 * CPU_ATTN_SCORE_CAP];
                            ref->scores[f16](q, nq, (size_t)hd, hd, group, &r, np, 0.125f, s0, CPU_ATTN_SCORE_CAP);
                            ks[v]->scores[f16](q, nq, (size_t)hd, hd, group, &r, np, 0.125f, s1, CPU_ATTN_SCORE_CAP);
                            for (int qi = 0; qi < nq; qi++)
                                for (int i = 0; i < np; i++) {
                                    double d = fabs(s0[qi * CPU_ATTN_SCORE_CAP + i] - s1[qi * CPU_ATTN_SCORE_CAP + i]);
                                    if (d > es) es = d;
                                }
                            float a0[6 * MAXHD], a1[6 * MAXHD];
                            for (int i = 0; i < 6 * hd; i++) a0[i] = a1[i] = frand();
                            ref->wsum[f16](a0, nq, hd, group, w, CPU_ATTN_SCORE_CAP, &r, np);
                            ks[v]->wsum[f16](a1, nq, hd, group, w, CPU_ATTN_SCORE_CAP, &r, np);
                            for (int i = 0; i < nq * hd; i++) {
                                double d = fabs(a0[i] - a1[i]) / (1.0 + fabs(a0[i]));
                                if (d > ew) ew = d;
                            }
                        }
            /* tiles of query rows (prefill kernels), one kv head: the row pointers scrambled */
            if (ks[v]->scores_tile[0])
                for (int si = 0; si < 3; si++)
                    for (int ni = 0; ni < 5; ni++)
                        for (int nq = 1; nq <= 6; nq++)
                            for (int f16 = 0; f16 < 2; f16++) {
                                int np = nps[ni];
                                cpu_attn_rows r = {.blk = f16 ? bh : bf, .stride = stride * (f16 ? 2 : 4), .slot0 = slots[si], .bs = BS};
                                const float *qp[6];
                                float a0[6 * MAXHD], a1[6 * MAXHD], *ap0[6], *ap1[6];
                                for (int j = 0; j < nq; j++) {
                                    qp[j] = q + (size_t)((j * 5 + 3) % 6) * hd;
                                    ap0[j] = a0 + (size_t)(nq - 1 - j) * hd;
                                    ap1[j] = a1 + (size_t)(nq - 1 - j) * hd;
                                }
                                for (int i = 0; i < 6 * hd; i++) a0[i] = a1[i] = frand();
                                float s0[6 * CPU_ATTN_SCORE_CAP], s1[6 * CPU_ATTN_SCORE_CAP];
                                ref->scores_tile[f16](qp, nq, hd, &r, np, 0.125f, s0, CPU_ATTN_SCORE_CAP);
                                ks[v]->scores_tile[f16](qp, nq, hd, &r, np, 0.125f, s1, CPU_ATTN_SCORE_CAP);
                                for (int qi = 0; qi < nq; qi++)
                                    for (int i = 0; i < np; i++) {
                                        double d = fabs(s0[qi * CPU_ATTN_SCORE_CAP + i] - s1[qi * CPU_ATTN_SCORE_CAP + i]);
                                        if (d > es) es = d;
                                    }
                                ref->wsum_tile[f16](ap0, nq, hd, w, CPU_ATTN_SCORE_CAP, &r, np);
                                ks[v]->wsum_tile[f16](ap1, nq, hd, w, CPU_ATTN_SCORE_CAP, &r, np);
                                for (int i = 0; i < nq * hd; i++) {
                                    double d = fabs(a0[i] - a1[i]) / (1.0 + fabs(a0[i]));
                                    if (d > ew) ew = d;
                                }
                            }
            /* one online-softmax step: two chunks in a row, against the reference's */
            for (int n = 1; n <= CPU_ATTN_SCORE_CAP; n += 9) {
                float x0[CPU_ATTN_SCORE_CAP], x1[CPU_ATTN_SCORE_CAP], c0[MAXHD], c1[MAXHD];
                float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
                for (int d = 0; d < hd; d++) c0[d] = c1[d] = 0;
                for (int step = 0; step < 2; step++) {
                    for (int i = 0; i < n; i++) x0[i] = x1[i] = frand() * 8 + (float)step * 3;
                    ref->softmax(x0, n, &m0, &l0, c0, hd);
                    ks[v]->softmax(x1, n, &m1, &l1, c1, hd);
                    for (int i = 0; i < n; i++) {
                        if (fabs(x0[i] - x1[i]) > 1e-6 * (1 + x0[i])) es = 1;
                        c0[i % hd] += x0[i], c1[i % hd] += x1[i];
                    }
                }
                if (m0 != m1 || fabs(l0 - l1) > 1e-5 * l0) es = 1;
                for (int d = 0; d < hd; d++)
                    if (fabs(c0[d] - c1[d]) > 1e-5 * (1 + fabs(c0[d]))) es = 1;
            }
            CHECKF(es < 1e-4, "%s scores hd %d: max error %g", ks[v]->name, hd, es);
            CHECKF(ew < 1e-5, "%s wsum hd %d: max error %g", ks[v]->name, hd, ew);
        }
        free(kf);
        free(kh);
    }
    /* exp of a chunk: every length up to the cap, scores down to -100 and -inf */
    for (int v = 0; v < nk; v++) {
        double e = 0;
        for (int n = 1; n <= CPU_ATTN_SCORE_CAP; n++) {
            float x[CPU_ATTN_SCORE_CAP], y[CPU_ATTN_SCORE_CAP + 1];
            for (int i = 0; i < n; i++) x[i] = y[i] = (frand() - 0.5f) * 200.0f;
            x[n - 1] = y[n - 1] = -INFINITY;
            y[n] = 12345.0f; /* past the end: untouched */
            float sum = ks[v]->vexp(y, n, 3.0f);
            double ds = 0;
            for (int i = 0; i < n; i++) {
                double want = exp((double)x[i] - 3.0);
                ds += want;
                double d = fabs(y[i] - want) / (want > 1e-30 ? want : 1e-30);
                if (want > 1e-30 && d > e) e = d;
                if (want < 1e-38 && y[i] > 1e-37f) e = 1;
            }
            if (fabs(sum - ds) > 1e-5 * ds + 1e-30) e = 1;
            if (y[n] != 12345.0f) e = 1;
        }
        CHECKF(e < 1e-6, "%s exp: max relative error %g", ks[v]->name, e);
    }
}

#ifndef HN_TEST_KERNELS_ONLY
/* f32 -> f16 as the KV store does it, against qt_f32_to_f16 bit for bit */
static void to_f16_case(be_backend *b) {
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N);
    uint16_t *h0 = malloc(2 * N), *h1 = malloc(2 * N);
    for (int i = 0; i < N; i++) {
        uint32_t u;
        rng = rng * 1664525u + 1013904223u;
        u = rng;
        switch (i % 4) {
        case 0: memcpy(&x[i], &u, 4); break;                 /* any bits: NaN, inf, subnormals */
        case 1: x[i] = frand() * 1e-4f; break;                /* f16 subnormal range */
        case 2: x[i] = frand() * 140000.0f; break;            /* overflow to inf */
        default: x[i] = frand() * 8; break;
        }
    }
    x[0] = 65519.0f, x[1] = 65520.0f, x[2] = -0.0f, x[3] = 2.9802322e-8f, x[4] = 5.9604645e-8f;
    for (int i = 0; i < N; i++) h0[i] = qt_f32_to_f16(x[i]);
    cpu_attn_select(cpu_of(b));
    cpu_of(b)->to_f16(x, h1, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += h0[i] != h1[i];
    CHECKF(bad == 0, "f32 -> f16: %d of %d differ", bad, N);
    free(x);
    free(h0);
    free(h1);
}

/* ---- the op ---- */

typedef struct op_rig {
    kv_cache *kv;
    kv_seq s[2];
    int len[2];
    int HKV, hd;
} op_rig;

/* The double reference for query q (n_head x hd) of a token of sequence sq at pos. */
static double ref_err(const op_rig *r, const float *q, const float *out, int H, int sq, int32_t pos, int window) {
    const int hd = r->hd, HKV = r->HKV, G = H / HKV, bs = r->kv->cfg.block_size;
    int32_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    int n = pos - lo + 1;
    double *sc = malloc(sizeof(double) * (size_t)n);
    float *k = malloc(sizeof(float) * (size_t)hd), *v = malloc(sizeof(float) * (size_t)n * hd);
    double err = 0;
    for (int kvh = 0; kvh < HKV; kvh++) {
        for (int p = lo; p <= pos; p++) {
            int32_t blk = r->s[sq].blocks[p / bs];
            size_t slot = (size_t)(p % bs);
            cpu_kv_rows_to_f32(r->kv->cfg.v_type, hd,
                               kv_block_vraw(r->kv, blk, 0) + slot * r->kv->v_row_bytes + kvh * r->kv->v_head_bytes, 0, 1,
                               v + (size_t)(p - lo) * hd);
        }
        for (int g = 0; g < G; g++) {
            const float *qh = q + (size_t)(kvh * G + g) * hd;
            double mx = -1e300, sum = 0;
            for (int p = lo; p <= pos; p++) {
                int32_t blk = r->s[sq].blocks[p / bs];
                size_t slot = (size_t)(p % bs);
                cpu_kv_rows_to_f32(r->kv->cfg.type, hd,
                                   kv_block_kraw(r->kv, blk, 0) + slot * r->kv->k_row_bytes + kvh * r->kv->k_head_bytes,
                                   0, 1, k);
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * k[i];
                sc[p - lo] = d / sqrt((double)hd);
                if (sc[p - lo] > mx) mx = sc[p - lo];
            }
            for (int i = 0; i < n; i++) sum += exp(sc[i] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int p = 0; p < n; p++) o += exp(sc[p] - mx) / sum * v[(size_t)p * hd + i];
                double d = fabs(o - out[(size_t)(kvh * G + g) * hd + i]);
                if (d > err) err = d;
            }
        }
    }
    free(sc);
    free(k);
    free(v);
    return err;
}

static void op_case(be_backend *b, qt_type kt, qt_type vt, int hd, int G, int window, int long_len,
                    const char *kname) {
    hn_err e;
    const int HKV = 2, H = HKV * G;
    op_rig r = {.HKV = HKV, .hd = hd, .len = {long_len, 45}};
    kv_config cfg = {.n_layer = 1, .n_head_kv = HKV, .head_dim = hd, .block_size = 16, .n_blocks = (long_len + 45) / 16 + 8,
                     .type = kt, .v_type = vt};
    CHECK(kv_create(&cfg, &r.kv, &e) == HN_OK);
    float *k = malloc(sizeof(float) * (size_t)HKV * hd), *v = malloc(sizeof(float) * (size_t)HKV * hd);
    for (int sq = 0; sq < 2; sq++) {
        kv_seq_init(&r.s[sq], r.kv, r.len[sq], &e);
        CHECK(kv_seq_reserve(r.kv, &r.s[sq], r.len[sq], &e) == HN_OK);
        for (int32_t p = 0; p < r.len[sq]; p++) {
            /* keys with a drift so that some positions dominate, values plain */
            for (int i = 0; i < HKV * hd; i++) {
                k[i] = frand() * 3 + (i % 7 == 0 ? 0.002f * (float)(p % 500) : 0.0f);
                v[i] = frand() * 2;
            }
            const kv_seq *sp = &r.s[sq];
            const int32_t s0 = 0;
            plan_tokens(b, r.kv, 1, &p, &s0, &sp, 1);
            be_tensor K = be_cpu_host(QT_F32, k), V = be_cpu_host(QT_F32, v);
            b->ops->kv_store(b, r.kv, 0, &K, &V, 1);
            sync_ok(b);
        }
    }
    /* prefill batch: the last 37 positions of the long sequence, interleaved with the last 9 of the short one */
    enum { NA = 37, NBT = 9, N = NA + NBT };
    int32_t pos[N], sqs[N];
    const kv_seq *seqs[2] = {&r.s[0], &r.s[1]};
    int n = 0;
    for (int i = 0; i < NA; i++) {
        if (i % 12 == 5 && n - i < NBT) { /* a short-sequence token in between (runs of up to 12 tile) */
            pos[n] = r.len[1] - NBT + (n - i), sqs[n] = 1, n++;
        }
        pos[n] = r.len[0] - NA + i, sqs[n] = 0, n++;
    }
    while (n < N) pos[n] = r.len[1] - NBT + (n - NA), sqs[n] = 1, n++;
    float *q = malloc(sizeof(float) * N * (size_t)H * hd), *out = malloc(sizeof(float) * N * (size_t)H * hd);
    float *out1 = malloc(sizeof(float) * (size_t)H * hd);
    for (int i = 0; i < N * H * hd; i++) q[i] = frand() * 2;
    cpu_attn_force(b, kname);
    plan_tokens(b, r.kv, N, pos, sqs, seqs, 2);
    be_tensor Q = be_cpu_host(QT_F32, q), O = be_cpu_host(QT_F32, out);
    be_attn_args a = {.q = &Q, .out = &O, .n_tokens = N, .n_head = H, .n_head_kv = HKV, .head_dim = hd,
                      .scale = 1.0f / sqrtf((float)hd), .window = window, .kv = r.kv, .layer = 0};
    b->ops->attention(b, &a);
    sync_ok(b);
    double err = 0;
    for (int t = 0; t < N; t++) {
        double d = ref_err(&r, q + (size_t)t * H * hd, out + (size_t)t * H * hd, H, sqs[t], pos[t], window);
        if (d > err) err = d;
    }
    /* decode: the long sequence's last token alone */
    int last = 0;
    for (int t = 0; t < N; t++)
        if (sqs[t] == 0) last = t;
    plan_tokens(b, r.kv, 1, &pos[last], &sqs[last], seqs, 2);
    be_tensor Q1 = be_cpu_host(QT_F32, q + (size_t)last * H * hd), O1 = be_cpu_host(QT_F32, out1);
    be_attn_args d1 = a;
    d1.q = &Q1, d1.out = &O1, d1.n_tokens = 1;
    b->ops->attention(b, &d1);
    sync_ok(b);
    double errd = ref_err(&r, Q1.data, out1, H, 0, pos[last], window), diff = 0;
    for (int i = 0; i < H * hd; i++) {
        double dd = fabs(out1[i] - out[(size_t)last * H * hd + i]);
        if (dd > diff) diff = dd;
    }
    cpu_attn_force(b, NULL);
    const char *kn = qt_traits(kt)->name, *vn = qt_traits(vt)->name;
    CHECKF(err < 2e-5, "%s K %s V %s hd %d group %d window %d len %d: prefill max error %g", kname, kn, vn, hd, G, window,
           long_len, err);
    CHECKF(errd < 2e-5, "%s K %s V %s hd %d group %d window %d len %d: decode max error %g", kname, kn, vn, hd, G,
           window, long_len, errd);
    CHECKF(diff < 2e-5, "%s K %s V %s hd %d group %d: decode and prefill differ by %g", kname, kn, vn, hd, G, diff);
    for (int sq = 0; sq < 2; sq++) kv_seq_free(&r.s[sq], r.kv);
    kv_free(r.kv);
    free(k);
    free(v);
    free(q);
    free(out);
    free(out1);
}

/* the op's KV store writes exactly what the reference quantizers write (ref_store_row) */
static void store_case(be_backend *b, qt_type kt, qt_type vt) {
    hn_err e;
    kv_config cfg = {.n_layer = 2, .n_head_kv = 2, .head_dim = 64, .block_size = 16, .n_blocks = 4, .type = kt, .v_type = vt};
    kv_cache *kv[2];
    kv_seq s[2];
    for (int c = 0; c < 2; c++) {
        CHECK(kv_create(&cfg, &kv[c], &e) == HN_OK);
        kv_seq_init(&s[c], kv[c], 40, &e);
        CHECK(kv_seq_reserve(kv[c], &s[c], 40, &e) == HN_OK);
    }
    float k[5 * 128], v[5 * 128];
    for (int i = 0; i < 5 * 128; i++) k[i] = frand() * 5, v[i] = frand() * 3;
    int32_t pos[5] = {0, 17, 18, 31, 39};
    const kv_seq *sp[1] = {&s[0]};
    const int32_t sq[5] = {0, 0, 0, 0, 0};
    plan_tokens(b, kv[0], 5, pos, sq, sp, 1);
    be_tensor K = be_cpu_host(QT_F32, k), V = be_cpu_host(QT_F32, v);
    b->ops->kv_store(b, kv[0], 1, &K, &V, 5);
    sync_ok(b);
    for (int t = 0; t < 5; t++) ref_store_row(kv[1], &s[1], 1, pos[t], k + t * 128, v + t * 128);
    bool same = true;
    for (int j = 0; j < 3; j++)
        same = same && !memcmp(kv_block_kraw(kv[0], s[0].blocks[j], 1), kv_block_kraw(kv[1], s[1].blocks[j], 1),
                               kv[0]->layer_bytes);
    CHECKF(same, "kv_store %s/%s differs from the reference quantizers", qt_traits(kt)->name, qt_traits(vt)->name);
    for (int c = 0; c < 2; c++) {
        kv_seq_free(&s[c], kv[c]);
        kv_free(kv[c]);
    }
}

#endif /* HN_TEST_KERNELS_ONLY */

#ifdef HN_TEST_KERNELS_ONLY
/* the ARM cross build (`make arm-test`): the kernel cases alone, linked with the kernel modules */
int main(void) {
    kernel_cases();
    TEST_DONE();
}
#else
int main(void) {
    hn_err e;
    pool *p;
    be_backend *b;
    CHECK(pool_create(2, &p, &e) == HN_OK);
    CHECK(plan_init(&plan, 64, 2, 256, &e) == HN_OK);
    CHECK(be_cpu_create(p, &b, &e) == HN_OK);
    be_limits l = {.max_rows = 8, .max_k = 256, .max_head_dim = 128, .max_group = 3};
    CHECK(b->ops->reserve(b, &l, &e) == HN_OK);
    static const int hds[] = {64, 128, 72};
    for (int ref = 0; ref < 2; ref++)
        for (size_t i = 0; i < 3; i++)
            for (int g = 1; g <= 3; g++) run_case(b, hds[i], g, ref);
    kernel_cases();
    to_f16_case(b);
    store_case(b, QT_F16, QT_F16);
    store_case(b, QT_F32, QT_F16);
    store_case(b, QT_Q8_0, QT_Q4_1);
    store_case(b, QT_F16, QT_Q8_0);
    be_free(b);
    /* the op: limits of a real model (max_k = n_head * head_dim or more) */
    CHECK(be_cpu_create(p, &b, &e) == HN_OK);
    be_limits l2 = {.max_rows = 64, .max_k = 1024, .max_head_dim = 128, .max_group = 4};
    CHECK(b->ops->reserve(b, &l2, &e) == HN_OK);
    const cpu_attn_kernels *ks[4];
    int nk = cpu_attn_variants(ks, 4);
    bool san = getenv("HONE_SANITIZED") != NULL;
    int long_len = san ? 700 : 3000;
    for (int v = 0; v < nk; v++) {
        const char *kn = ks[v]->name;
        op_case(b, QT_F16, QT_F16, 128, 2, 0, long_len, kn);
        op_case(b, QT_F32, QT_F32, 64, 1, 0, 300, kn);
        op_case(b, QT_F16, QT_F16, 64, 4, 100, long_len, kn);
        op_case(b, QT_Q8_0, QT_Q8_0, 64, 2, 0, 300, kn);
        op_case(b, QT_Q8_0, QT_Q4_0, 64, 2, 33, 300, kn);
        op_case(b, QT_F16, QT_Q4_1, 128, 2, 0, 300, kn);
        op_case(b, QT_F32, QT_F16, 96, 2, 0, 200, kn);
        op_case(b, QT_F16, QT_F32, 32, 1, 17, 100, kn);
    }
    be_free(b);
    plan_free(&plan);
    pool_free(p);
    TEST_DONE();
}
#endif
