/* gemm_avx2.c: AVX2+FMA+F16C gemm kernels (see gemm.h; gemm.c registers them
 * behind a run-time CPU check).
 *
 * One weight row against NA activation rows (NA = 1..8, one instantiation
 * each). The weight's chunk is decoded once into registers and multiplied into
 * every activation row: 32-element types (Q8_0, Q4_0) per block with the sign
 * trick (|w| as unsigned times sign(w)*a, exact because activations are in
 * [-127, 127]) and one f32 FMA per block and row; K-quants per 64 elements
 * with vpmaddubsw (unsigned codes) and vpmaddwd by the sub-block scale, one
 * f32 FMA per super-block and row, offsets from the activation's bsums. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

#include "gemm_int.h"
#include "gemm_simd.h"

/* 32 nibbles of 16 bytes: low nibbles in the low lane, high in the high lane. */
static ALWAYS_INLINE __m256i nibbles32(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* Signed 32-code weight blocks (already decoded to i8) against NA Q8_0 rows. */
#define Q32_BODY(NAME, BT, DECODE)                                                                      \
    static ALWAYS_INLINE void NAME(int64_t k, const BT *restrict w, const int NA,                      \
                                   const void *const *restrict a, float *restrict s) {                 \
        const __m256i ones = _mm256_set1_epi16(1);                                                     \
        __m256 acc[CPU_GEMM_MAX_NA];                                                                   \
        _Pragma("GCC unroll 8")                                                                                \
        for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();                                     \
        for (int64_t i = 0; i < k / 32; i++) {                                                         \
            __m256i q = DECODE(&w[i]);                                                                 \
            __m256i aw = _mm256_sign_epi8(q, q);                                                       \
            const float d = h2f(w[i].d);                                                               \
            _Pragma("GCC unroll 8")                                                                                \
            for (int r = 0; r < NA; r++) {                                                             \
                const block_q8_0 *y = (const block_q8_0 *)a[r] + i;                                    \
                __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), q)); \
                __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));                             \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * h2f(y->d)), f, acc[r]);                    \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 8")                                                                                \
        for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]);                                             \
    }

static ALWAYS_INLINE __m256i dec_q8_0(const block_q8_0 *b) { return _mm256_loadu_si256((const __m256i *)b->qs); }
static ALWAYS_INLINE __m256i dec_q4_0(const block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8));
}
Q32_BODY(q8_0_body, block_q8_0, dec_q8_0)
Q32_BODY(q4_0_body, block_q4_0, dec_q4_0)

static ALWAYS_INLINE void q4_K_body(int64_t k, const block_q4_K *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 acc[CPU_GEMM_MAX_NA];
    __m128 accm[CPU_GEMM_MAX_NA];
    __m256i sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        acc[r] = _mm256_setzero_ps();
        accm[r] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q4_K *b = &w[i];
        __m128i sm = k4_scales_mins(b->scales);
        __m128i s16 = _mm_cvtepu8_epi16(sm);
        __m256i sc16 = _mm256_set_m128i(s16, s16);
        __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            __m256i qq = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            __m256i ql = _mm256_and_si256(qq, lo4), qh = _mm256_and_si256(_mm256_srli_epi16(qq, 4), lo4);
            __m256i sl = bcast16(sc16, 2 * j), sh = bcast16(sc16, 2 * j + 1);
            k45_pair_rows(ql, qh, sl, sh, i, j, NA, a, sumi);
        }
        k45_scale_rows(sumi, h2f(b->d), h2f(b->dmin), m16, i, NA, a, acc, accm);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        __m128 m = accm[r];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        s[r] = hsum8(acc[r]) - _mm_cvtss_f32(m);
    }
}

static ALWAYS_INLINE void q6_K_body(int64_t k, const block_q6_K *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), lo2 = _mm256_set1_epi8(0x03);
    __m256 acc[CPU_GEMM_MAX_NA];
    __m256i sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q6_K *b = &w[i];
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            /* codes are stored +32: start from -32 * sum_s sc[s] * bsums[s] (in lane 0..7) */
            __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)((const block_q8_K *)a[r] + i)->bsums));
            sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        }
        #pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_slli_epi16(_mm256_and_si256(hb, lo2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), lo2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), lo2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), lo2), 4));
            #pragma GCC unroll 8
            for (int g = 0; g < 4; g++) {
                /* 32 codes = sub-blocks 8h+2g (low lane) and 8h+2g+1 (high lane) */
                int s0 = 8 * h + 2 * g;
                __m256i lane = _mm256_set_m128i(_mm_set1_epi16((short)b->scales[s0 + 1]), _mm_set1_epi16((short)b->scales[s0]));
                #pragma GCC unroll 8
                for (int r = 0; r < NA; r++) {
                    const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 128 * h + 32 * g;
                    __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *)aq));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, lane));
                }
            }
        }
        const float d = h2f(b->d);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const block_q8_K *y = (const block_q8_K *)a[r] + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]);
}


void cpu_gemm_q8_0_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q8_0_body, block_q8_0)
}
void cpu_gemm_q4_0_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q4_0_body, block_q4_0)
}
void cpu_gemm_q4_K_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q4_K_body, block_q4_K)
}
void cpu_gemm_q6_K_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q6_K_body, block_q6_K)
}

#endif
