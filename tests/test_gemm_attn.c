/* test_gemm_attn.c: the attention inner loops of the CPU backend (the
 * per-chunk weighted sum of V rows with register-resident accumulators, and
 * f16 K/V rows read in place).
 *
 * For head_dim 64, 128 and 72 (a tail that is not a multiple of the 32-wide
 * slices), groups of 1, 2 and 3 query heads per kv head and a sequence long
 * enough to span many blocks and chunks: the f32 cache against a naive double
 * reference, and an f16 cache against an f32 cache holding the same
 * (f16-rounded) values, which must agree bit for bit (the f16 loops convert
 * and then do exactly the f32 loops' arithmetic). Run twice, the second time
 * with force_reference on (which changes only the matmul path, so both runs
 * must agree with the reference alike). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "quant/quant.h"
#include "test.h"

static uint32_t rng = 7;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
}

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
        for (int c = 0; c < 2; c++) kv_store_row(kv[c], &s[c], 0, p, k, v);
    }
    /* three query tokens: early, at a chunk edge, last */
    int32_t pos[3] = {5, 31, LEN - 1};
    float *q = malloc(sizeof(float) * 3 * (size_t)H * hd), *out[2];
    for (int i = 0; i < 3 * H * hd; i++) q[i] = frand() * 2;
    be_cpu_force_reference(b, ref);
    for (int c = 0; c < 2; c++) {
        out[c] = malloc(sizeof(float) * 3 * (size_t)H * hd);
        const kv_seq *seqs[3] = {&s[c], &s[c], &s[c]};
        be_attn_args a = {.q = q, .out = out[c], .n_tokens = 3, .n_head = H, .n_head_kv = HKV, .head_dim = hd,
                          .scale = 1.0f / sqrtf((float)hd), .kv = kv[c], .layer = 0, .pos = pos, .seqs = seqs};
        b->ops->attention(b, &a);
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

int main(void) {
    hn_err e;
    pool *p;
    be_backend *b;
    CHECK(pool_create(2, &p, &e) == HN_OK);
    CHECK(be_cpu_create(p, &b, &e) == HN_OK);
    be_limits l = {.max_rows = 8, .max_k = 256, .max_head_dim = 128, .max_group = 3};
    CHECK(b->ops->reserve(b, &l, &e) == HN_OK);
    static const int hds[] = {64, 128, 72};
    for (int ref = 0; ref < 2; ref++)
        for (size_t i = 0; i < 3; i++)
            for (int g = 1; g <= 3; g++) run_case(b, hds[i], g, ref);
    be_free(b);
    pool_free(p);
    TEST_DONE();
}
