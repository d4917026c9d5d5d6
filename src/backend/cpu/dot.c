/* dot.c: the CPU dot-kernel registry, the scalar reference kernels, the
 * activation converters and run-time CPU feature detection.
 *
 * Activation types per weight type (what `act` produces, what `dot` reads):
 *   F32, F16                             -> F32 (a plain copy)
 *   BF16                                 -> BF16 (rounded to nearest even)
 *   Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4      -> Q8_0
 *   Q4_1, Q5_1                           -> Q8_1 (min term from its s field)
 *   Q2_K..Q6_K, IQ4_XS                   -> Q8_K
 *
 * A reference kernel computes exactly what the block formats say: the sum over
 * elements of dequant(w) * dequant(a), where every block's integer products
 * are summed exactly in integers and scaled once per (sub-)block, so it agrees
 * with an f64 dot of the dequantized rows to float rounding, with one
 * deliberate exception: Q4_1 / Q5_1 take their min term m * d_a * sum(q_a)
 * from the activation block's f16 field s = fp16(d_a * sum(q_a)), as llama.cpp's
 * CPU kernels do, so that logits agree with llama.cpp's (the f16 rounding of s
 * is within the 8-bit activation error anyway).
 *
 * The 8-bit converters also follow llama.cpp's arithmetic exactly (inverse
 * scale 127/amax, products rounded half to even): on models whose embeddings
 * are 4- or 5-bit, many activations land exactly on a rounding tie (x = amax/2
 * gives x*127/amax = 63.5), so a different but equally valid formula flips codes
 * and moves logits far beyond float noise. Faster variants live in dot_<isa>.c
 * and are listed here behind a run-time CPU check. */
#include "dot.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "../../core/isa.h"
#include "../../quant/quant.h"
#include "dot_int.h"

#if defined(__x86_64__)
#define HN_X86 1 /* the SIMD kernels are built (Makefile) and listed below */
#endif
#if defined(__aarch64__)
#define HN_ARM 1 /* dot_neon.c / dot_dotprod.c are built and listed below */
#endif

const int8_t cpu_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
const int8_t cpu_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---- activation converters (scalar references) ----
 * The registry's converters (cpu_act_q8_0 ...) dispatch at run time to the
 * AVX2 (dot_avx2.c), AVX-512 (dot_conv_avx512.c) or NEON (dot_neon.c) versions, which reproduce
 * these byte for byte, step by step (tests/test_dot.c checks every one). */

void cpu_act_f32_ref(const float *restrict x, void *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

/* BF16 weights see BF16 activations, as in llama.cpp (whose bf16 kernels
 * multiply bf16 by bf16): rounding the activations moves logits visibly. */
void cpu_act_bf16_ref(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = qt_f32_to_bf16(x[i]);
}

static inline int clamp_round(float v) {
    long r = lrintf(v);
    return r > 127 ? 127 : r < -127 ? -127 : (int)r;
}

/* Symmetric 8-bit blocks of 32: d = max|x| / 127, q = round-half-even(x * (127 / max|x|)). */
void cpu_act_q8_0_ref(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)clamp_round(x[j] * id);
    }
}

/* As Q8_0, plus s = d * sum(q) (f16; d in f32 before rounding). */
void cpu_act_q8_1_ref(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = 0;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            int q = clamp_round(x[j] * id);
            y[i].qs[j] = (int8_t)q;
            sum += q;
        }
        y[i].d = qt_f32_to_f16(d);
        y[i].s = qt_f32_to_f16(d * (float)sum);
    }
}

/* Blocks of 256 with an f32 scale and per-16 sums; |q| <= 127 so that the
 * SIMD kernels may negate activations without overflow. */
void cpu_act_q8_K_ref(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)clamp_round(iscale * x[j]);
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += y[i].qs[j * 16 + k];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ---- scalar reference kernels ---- */

static void dot_f32_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const float *w = vw, *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)w[i] * a[i];
    *s = (float)sum;
}

static void dot_f16_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const uint16_t *w = vw;
    const float *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)qt_f16_to_f32(w[i]) * a[i];
    *s = (float)sum;
}

static void dot_bf16_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const uint16_t *w = vw, *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)qt_bf16_to_f32(w[i]) * qt_bf16_to_f32(a[i]);
    *s = (float)sum;
}

static void dot_q4_0_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_0 *w = vw;
    const block_q8_0 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((w[i].qs[j] & 0xf) - 8) * a[i].qs[j];
            sumi += ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * qt_f16_to_f32(a[i].d)) * sumi;
    }
    *s = (float)sum;
}

static void dot_q4_1_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_1 *w = vw;
    const block_q8_1 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_1 / 2; j++)
            sumi += (w[i].qs[j] & 0xf) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
        sum += (double)(qt_f16_to_f32(w[i].d) * qt_f16_to_f32(a[i].d)) * sumi + (double)qt_f16_to_f32(w[i].m) * qt_f16_to_f32(a[i].s);
    }
    *s = (float)sum;
}

static inline int q5_hi(uint32_t qh, int j) { return (int)((qh >> j) & 1) << 4; }

static void dot_q5_0_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_0 *w = vw;
    const block_q8_0 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        uint32_t qh;
        memcpy(&qh, w[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            sumi += (((w[i].qs[j] & 0xf) | q5_hi(qh, j)) - 16) * a[i].qs[j];
            sumi += (((w[i].qs[j] >> 4) | q5_hi(qh, j + 16)) - 16) * a[i].qs[j + 16];
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * qt_f16_to_f32(a[i].d)) * sumi;
    }
    *s = (float)sum;
}

static void dot_q5_1_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_1 *w = vw;
    const block_q8_1 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        uint32_t qh;
        memcpy(&qh, w[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            sumi += ((w[i].qs[j] & 0xf) | q5_hi(qh, j)) * a[i].qs[j];
            sumi += ((w[i].qs[j] >> 4) | q5_hi(qh, j + 16)) * a[i].qs[j + 16];
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * qt_f16_to_f32(a[i].d)) * sumi + (double)qt_f16_to_f32(w[i].m) * qt_f16_to_f32(a[i].s);
    }
    *s = (float)sum;
}

static void dot_q8_0_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q8_0 *w = vw;
    const block_q8_0 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += w[i].qs[j] * a[i].qs[j];
        sum += (double)(qt_f16_to_f32(w[i].d) * qt_f16_to_f32(a[i].d)) * sumi;
    }
    *s = (float)sum;
}

/* One 32-block of 4-bit indices into a 16-level table against Q8_0 codes. */
static inline int lut4_block(const uint8_t *qs, const int8_t *aq, const int8_t *lut) {
    int sumi = 0;
    for (int j = 0; j < 16; j++) sumi += lut[qs[j] & 0xf] * aq[j] + lut[qs[j] >> 4] * aq[j + 16];
    return sumi;
}

static void dot_iq4_nl_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_iq4_nl *w = vw;
    const block_q8_0 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        int sumi = lut4_block(w[i].qs, a[i].qs, cpu_kvalues_iq4nl);
        sum += (double)(qt_f16_to_f32(w[i].d) * qt_f16_to_f32(a[i].d)) * sumi;
    }
    *s = (float)sum;
}

static void dot_mxfp4_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_mxfp4 *w = vw;
    const block_q8_0 *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        int sumi = lut4_block(w[i].qs, a[i].qs, cpu_kvalues_mxfp4);
        sum += (double)(cpu_e8m0_half(w[i].e) * qt_f16_to_f32(a[i].d)) * sumi;
    }
    *s = (float)sum;
}

/* Q2_K: 16 sub-blocks of 16; value = d*(sc&15)*q - dmin*(sc>>4), q in 0..3.
 * Element order: for each half of 128, for shift 0,2,4,6: qs[0..16) then qs[16..32). */
static void dot_q2_K_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q2_K *w = vw;
    const block_q8_K *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        int sumi = 0, summ = 0, is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int k = 0; k < 2; k++, is++, aq += 16) {
                    int sc = w[i].scales[is], si = 0;
                    for (int l = 0; l < 16; l++) si += ((q[16 * k + l] >> shift) & 3) * aq[l];
                    sumi += (sc & 0xf) * si;
                    summ += (sc >> 4) * a[i].bsums[is];
                }
            }
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * a[i].d) * sumi - (double)(qt_f16_to_f32(w[i].dmin) * a[i].d) * summ;
    }
    *s = (float)sum;
}

/* Q3_K's 16 6-bit scales (biased by 32) from 12 packed bytes. */
static inline void q3_K_scales(const uint8_t *p, int8_t *sc) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (p[j] & 0xf) : (p[j - 8] >> 4);
        int hi = (p[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* Q3_K: value = d*(sc-32)*(q - (hmask bit ? 0 : 4)), q in 0..3 from qs. */
static void dot_q3_K_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q3_K *w = vw;
    const block_q8_K *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        q3_K_scales(w[i].scales, sc);
        const uint8_t *q = w[i].qs, *hm = w[i].hmask;
        const int8_t *aq = a[i].qs;
        int sumi = 0, is = 0, m = 1;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int k = 0; k < 2; k++, is++, aq += 16) {
                    int si = 0;
                    for (int l = 0; l < 16; l++) {
                        int v = ((q[16 * k + l] >> shift) & 3) - ((hm[16 * k + l] & m) ? 0 : 4);
                        si += v * aq[l];
                    }
                    sumi += sc[is] * si;
                }
            }
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * a[i].d) * sumi;
    }
    *s = (float)sum;
}

/* Q4_K / Q5_K's 8 pairs of 6-bit (scale, min) from 12 packed bytes. */
static inline void k4_scale_min(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K: 8 sub-blocks of 32; value = d*sc*q - dmin*m, q in 0..15; each 32
 * bytes of qs hold two sub-blocks (low nibbles, then high nibbles). */
static void dot_q4_K_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_K *w = vw;
    const block_q8_K *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, si = 0;
            k4_scale_min(j, w[i].scales, &sc, &m);
            int shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++) si += ((q[l] >> shift) & 0xf) * aq[l];
            sumi += sc * si;
            summ += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
            aq += 32;
            if (j & 1) q += 32;
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * a[i].d) * sumi - (double)(qt_f16_to_f32(w[i].dmin) * a[i].d) * summ;
    }
    *s = (float)sum;
}

/* Q5_K: Q4_K plus a fifth bit from qh (bit j of qh[l] for sub-block j). */
static void dot_q5_K_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_K *w = vw;
    const block_q8_K *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, si = 0;
            k4_scale_min(j, w[i].scales, &sc, &m);
            int shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xf) | (((w[i].qh[l] >> j) & 1) << 4);
                si += v * aq[l];
            }
            sumi += sc * si;
            summ += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
            aq += 32;
            if (j & 1) q += 32;
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * a[i].d) * sumi - (double)(qt_f16_to_f32(w[i].dmin) * a[i].d) * summ;
    }
    *s = (float)sum;
}

/* Q6_K: value = d*sc*(q-32), q = 4 bits of ql + 2 bits of qh; per 128
 * elements: ql[0..64), qh[0..32), scales[0..8). */
static void dot_q6_K_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q6_K *w = vw;
    const block_q8_K *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *sc = w[i].scales, *aq = a[i].qs;
        int sumi = 0;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, aq += 128) {
            int s4[8] = {0};
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                s4[is + 0] += q1 * aq[l];
                s4[is + 2] += q2 * aq[l + 32];
                s4[is + 4] += q3 * aq[l + 64];
                s4[is + 6] += q4 * aq[l + 96];
            }
            for (int k = 0; k < 8; k++) sumi += sc[k] * s4[k];
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * a[i].d) * sumi;
    }
    *s = (float)sum;
}

/* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (biased by 32), IQ4_NL levels. */
static void dot_iq4_xs_ref(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_iq4_xs *w = vw;
    const block_q8_K *a = va;
    double sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int ls = ((w[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((w[i].scales_h >> 2 * ib) & 3) << 4);
            sumi += (ls - 32) * lut4_block(w[i].qs + 16 * ib, a[i].qs + 32 * ib, cpu_kvalues_iq4nl);
        }
        sum += (double)(qt_f16_to_f32(w[i].d) * a[i].d) * sumi;
    }
    *s = (float)sum;
}

/* ---- CPU features: a view of core/isa.h's probe ---- */

static cpu_features g_features;
static pthread_once_t g_features_once = PTHREAD_ONCE_INIT;

static void detect_features(void) {
    uint32_t isa = hn_isa();
    g_features = (cpu_features){
        .avx2 = isa & HN_ISA_AVX2,
        .fma = isa & HN_ISA_FMA,
        .f16c = isa & HN_ISA_F16C,
        .avx512f = isa & HN_ISA_AVX512F,
        .avx512bw = isa & HN_ISA_AVX512BW,
        .avx512vnni = isa & HN_ISA_AVX512VNNI,
        .avx_vnni = isa & HN_ISA_AVXVNNI,
        .neon = isa & HN_ISA_NEON,
        .avx512bf16 = (isa & HN_ISA_AVX512BF16) && (isa & HN_ISA_AVX512F),
        .dotprod = (isa & HN_ISA_DOTPROD) && (isa & HN_ISA_NEON),
        .i8mm = (isa & HN_ISA_I8MM) && (isa & HN_ISA_DOTPROD) && (isa & HN_ISA_NEON),
    };
}

const cpu_features *cpu_dot_features(void) {
    pthread_once(&g_features_once, detect_features);
    return &g_features;
}

/* ---- activation converters: run-time dispatch and their registry ---- */

enum { ACT_REF, ACT_AVX2, ACT_AVX512, ACT_NEON };

static int act_level(void) {
    const cpu_features *f = cpu_dot_features();
#ifdef HN_ARM
    return f->neon ? ACT_NEON : ACT_REF;
#endif
    if (!(f->avx2 && f->fma && f->f16c)) return ACT_REF;
    return f->avx512f && f->avx512bw ? ACT_AVX512 : ACT_AVX2;
}

#ifdef HN_X86
#define ACT_DISPATCH(name)                                                               \
    void cpu_act_##name(const float *restrict x, void *restrict y, int64_t n) {          \
        switch (act_level()) {                                                           \
        case ACT_AVX512: cpu_act_##name##_avx512(x, y, n); break;                        \
        case ACT_AVX2: cpu_act_##name##_avx2(x, y, n); break;                            \
        default: cpu_act_##name##_ref(x, y, n); break;                                   \
        }                                                                                \
    }
#elif defined(HN_ARM)
#define ACT_DISPATCH(name)                                                      \
    void cpu_act_##name(const float *restrict x, void *restrict y, int64_t n) { \
        if (act_level() == ACT_NEON)                                            \
            cpu_act_##name##_neon(x, y, n);                                     \
        else                                                                    \
            cpu_act_##name##_ref(x, y, n);                                      \
    }
#else
#define ACT_DISPATCH(name)                                                      \
    void cpu_act_##name(const float *restrict x, void *restrict y, int64_t n) { \
        cpu_act_##name##_ref(x, y, n);                                          \
    }
#endif

void cpu_act_f32(const float *restrict x, void *restrict y, int64_t n) { cpu_act_f32_ref(x, y, n); }
ACT_DISPATCH(bf16)
ACT_DISPATCH(q8_0)
ACT_DISPATCH(q8_1)
ACT_DISPATCH(q8_K)

typedef struct {
    cpu_act_kernel k;
    int level;
} act_entry;

#define ACT_REF_E(T, FN) {{T, FN, "ref"}, ACT_REF}
#define ACT_AVX2_E(T, FN) {{T, FN, "avx2"}, ACT_AVX2}
#define ACT_AVX512_E(T, FN) {{T, FN, "avx512"}, ACT_AVX512}
#define ACT_NEON_E(T, FN) {{T, FN, "neon"}, ACT_NEON}

static const act_entry g_acts[] = {
    ACT_REF_E(QT_F32, cpu_act_f32_ref),
    ACT_REF_E(QT_BF16, cpu_act_bf16_ref),
    ACT_REF_E(QT_Q8_0, cpu_act_q8_0_ref),
    ACT_REF_E(QT_Q8_1, cpu_act_q8_1_ref),
    ACT_REF_E(QT_Q8_K, cpu_act_q8_K_ref),
#ifdef HN_X86
    ACT_AVX2_E(QT_BF16, cpu_act_bf16_avx2),
    ACT_AVX2_E(QT_Q8_0, cpu_act_q8_0_avx2),
    ACT_AVX2_E(QT_Q8_1, cpu_act_q8_1_avx2),
    ACT_AVX2_E(QT_Q8_K, cpu_act_q8_K_avx2),
    ACT_AVX512_E(QT_BF16, cpu_act_bf16_avx512),
    ACT_AVX512_E(QT_Q8_0, cpu_act_q8_0_avx512),
    ACT_AVX512_E(QT_Q8_1, cpu_act_q8_1_avx512),
    ACT_AVX512_E(QT_Q8_K, cpu_act_q8_K_avx512),
#endif
#ifdef HN_ARM
    ACT_NEON_E(QT_BF16, cpu_act_bf16_neon),
    ACT_NEON_E(QT_Q8_0, cpu_act_q8_0_neon),
    ACT_NEON_E(QT_Q8_1, cpu_act_q8_1_neon),
    ACT_NEON_E(QT_Q8_K, cpu_act_q8_K_neon),
#endif
};

int cpu_act_variants(qt_type act_type, const cpu_act_kernel **out, int cap) {
    int n = 0, level = act_level();
    for (size_t i = 0; i < sizeof(g_acts) / sizeof(g_acts[0]); i++) {
        if (g_acts[i].k.act_type != act_type || g_acts[i].level > level) continue;
        if (n < cap) out[n] = &g_acts[i].k;
        n++;
    }
    return n;
}

/* ---- registry ---- */

enum { ISA_REF, ISA_AVX2, ISA_NEON, ISA_DOTPROD };

typedef struct {
    cpu_dot_kernel k;
    int isa;
} entry;

#define REF(T, A, ACT, FN) {{T, A, ACT, FN, "ref"}, ISA_REF}
#define AVX2(T, A, ACT, FN) {{T, A, ACT, FN, "avx2"}, ISA_AVX2}
#define NEON(T, A, ACT, FN) {{T, A, ACT, FN, "neon"}, ISA_NEON}
#define DOTPROD(T, A, ACT, FN) {{T, A, ACT, FN, "dotprod"}, ISA_DOTPROD}

/* Reference first for every type, then faster variants in order of preference. */
static const entry g_kernels[] = {
    REF(QT_F32, QT_F32, cpu_act_f32, dot_f32_ref),
    REF(QT_F16, QT_F32, cpu_act_f32, dot_f16_ref),
    REF(QT_BF16, QT_BF16, cpu_act_bf16, dot_bf16_ref),
    REF(QT_Q4_0, QT_Q8_0, cpu_act_q8_0, dot_q4_0_ref),
    REF(QT_Q4_1, QT_Q8_1, cpu_act_q8_1, dot_q4_1_ref),
    REF(QT_Q5_0, QT_Q8_0, cpu_act_q8_0, dot_q5_0_ref),
    REF(QT_Q5_1, QT_Q8_1, cpu_act_q8_1, dot_q5_1_ref),
    REF(QT_Q8_0, QT_Q8_0, cpu_act_q8_0, dot_q8_0_ref),
    REF(QT_Q2_K, QT_Q8_K, cpu_act_q8_K, dot_q2_K_ref),
    REF(QT_Q3_K, QT_Q8_K, cpu_act_q8_K, dot_q3_K_ref),
    REF(QT_Q4_K, QT_Q8_K, cpu_act_q8_K, dot_q4_K_ref),
    REF(QT_Q5_K, QT_Q8_K, cpu_act_q8_K, dot_q5_K_ref),
    REF(QT_Q6_K, QT_Q8_K, cpu_act_q8_K, dot_q6_K_ref),
    REF(QT_IQ4_NL, QT_Q8_0, cpu_act_q8_0, dot_iq4_nl_ref),
    REF(QT_IQ4_XS, QT_Q8_K, cpu_act_q8_K, dot_iq4_xs_ref),
    REF(QT_MXFP4, QT_Q8_0, cpu_act_q8_0, dot_mxfp4_ref),
#ifdef HN_X86
    AVX2(QT_F32, QT_F32, cpu_act_f32, cpu_dot_f32_avx2),
    AVX2(QT_F16, QT_F32, cpu_act_f32, cpu_dot_f16_avx2),
    AVX2(QT_BF16, QT_BF16, cpu_act_bf16, cpu_dot_bf16_avx2),
    AVX2(QT_Q4_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q4_0_avx2),
    AVX2(QT_Q4_1, QT_Q8_1, cpu_act_q8_1, cpu_dot_q4_1_avx2),
    AVX2(QT_Q5_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q5_0_avx2),
    AVX2(QT_Q5_1, QT_Q8_1, cpu_act_q8_1, cpu_dot_q5_1_avx2),
    AVX2(QT_Q8_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q8_0_avx2),
    AVX2(QT_Q2_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q2_K_avx2),
    AVX2(QT_Q3_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q3_K_avx2),
    AVX2(QT_Q4_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q4_K_avx2),
    AVX2(QT_Q5_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q5_K_avx2),
    AVX2(QT_Q6_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q6_K_avx2),
    AVX2(QT_IQ4_NL, QT_Q8_0, cpu_act_q8_0, cpu_dot_iq4_nl_avx2),
    AVX2(QT_IQ4_XS, QT_Q8_K, cpu_act_q8_K, cpu_dot_iq4_xs_avx2),
    AVX2(QT_MXFP4, QT_Q8_0, cpu_act_q8_0, cpu_dot_mxfp4_avx2),
#endif
#ifdef HN_ARM
    NEON(QT_F32, QT_F32, cpu_act_f32, cpu_dot_f32_neon),
    NEON(QT_F16, QT_F32, cpu_act_f32, cpu_dot_f16_neon),
    NEON(QT_BF16, QT_BF16, cpu_act_bf16, cpu_dot_bf16_neon),
    NEON(QT_Q4_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q4_0_neon),
    NEON(QT_Q4_1, QT_Q8_1, cpu_act_q8_1, cpu_dot_q4_1_neon),
    NEON(QT_Q5_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q5_0_neon),
    NEON(QT_Q5_1, QT_Q8_1, cpu_act_q8_1, cpu_dot_q5_1_neon),
    NEON(QT_Q8_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q8_0_neon),
    NEON(QT_Q2_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q2_K_neon),
    NEON(QT_Q3_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q3_K_neon),
    NEON(QT_Q4_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q4_K_neon),
    NEON(QT_Q5_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q5_K_neon),
    NEON(QT_Q6_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q6_K_neon),
    NEON(QT_IQ4_NL, QT_Q8_0, cpu_act_q8_0, cpu_dot_iq4_nl_neon),
    NEON(QT_IQ4_XS, QT_Q8_K, cpu_act_q8_K, cpu_dot_iq4_xs_neon),
    NEON(QT_MXFP4, QT_Q8_0, cpu_act_q8_0, cpu_dot_mxfp4_neon),
    DOTPROD(QT_F32, QT_F32, cpu_act_f32, cpu_dot_f32_dotprod),
    DOTPROD(QT_F16, QT_F32, cpu_act_f32, cpu_dot_f16_dotprod),
    DOTPROD(QT_BF16, QT_BF16, cpu_act_bf16, cpu_dot_bf16_dotprod),
    DOTPROD(QT_Q4_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q4_0_dotprod),
    DOTPROD(QT_Q4_1, QT_Q8_1, cpu_act_q8_1, cpu_dot_q4_1_dotprod),
    DOTPROD(QT_Q5_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q5_0_dotprod),
    DOTPROD(QT_Q5_1, QT_Q8_1, cpu_act_q8_1, cpu_dot_q5_1_dotprod),
    DOTPROD(QT_Q8_0, QT_Q8_0, cpu_act_q8_0, cpu_dot_q8_0_dotprod),
    DOTPROD(QT_Q2_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q2_K_dotprod),
    DOTPROD(QT_Q3_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q3_K_dotprod),
    DOTPROD(QT_Q4_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q4_K_dotprod),
    DOTPROD(QT_Q5_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q5_K_dotprod),
    DOTPROD(QT_Q6_K, QT_Q8_K, cpu_act_q8_K, cpu_dot_q6_K_dotprod),
    DOTPROD(QT_IQ4_NL, QT_Q8_0, cpu_act_q8_0, cpu_dot_iq4_nl_dotprod),
    DOTPROD(QT_IQ4_XS, QT_Q8_K, cpu_act_q8_K, cpu_dot_iq4_xs_dotprod),
    DOTPROD(QT_MXFP4, QT_Q8_0, cpu_act_q8_0, cpu_dot_mxfp4_dotprod),
#endif
};

static bool isa_ok(int isa) {
    const cpu_features *f = cpu_dot_features();
    switch (isa) {
    case ISA_REF: return true;
    case ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case ISA_NEON: return f->neon;
    case ISA_DOTPROD: return f->neon && f->dotprod;
    default: return false;
    }
}

int cpu_dot_variants(qt_type t, const cpu_dot_kernel **out, int cap) {
    int n = 0;
    for (size_t i = 0; i < sizeof(g_kernels) / sizeof(g_kernels[0]); i++) {
        if (g_kernels[i].k.wtype != t || !isa_ok(g_kernels[i].isa)) continue;
        if (n < cap) out[n] = &g_kernels[i].k;
        n++;
    }
    return n;
}

const cpu_dot_kernel *cpu_dot_best(qt_type t) {
    const cpu_dot_kernel *best = NULL;
    for (size_t i = 0; i < sizeof(g_kernels) / sizeof(g_kernels[0]); i++)
        if (g_kernels[i].k.wtype == t && isa_ok(g_kernels[i].isa)) best = &g_kernels[i].k;
    return best;
}

const cpu_dot_kernel *cpu_dot_ref(qt_type t) {
    for (size_t i = 0; i < sizeof(g_kernels) / sizeof(g_kernels[0]); i++)
        if (g_kernels[i].k.wtype == t && g_kernels[i].isa == ISA_REF) return &g_kernels[i].k;
    return NULL;
}
