/* gemm_avx512.c: AVX-512 (F+BW) gemm kernels for the K-quants (compiled
 * with -mavx512f -mavx512bw on top of AVX2; gemm.c registers them behind a
 * run-time CPU check).
 *
 * One weight row against NA activation rows (NA = 1..8, each a separate
 * instantiation so every accumulator stays in a register). Per super-block of
 * 256 the weight's codes are unpacked once into four zmm vectors of 64 codes
 * (unsigned bytes) and its sub-block scales into four zmm vectors of i16
 * (one scale per pair of products); then, per activation row,
 * vpmaddubsw (u8 code x s8 activation -> i16 pair sums, at most
 * 2*63*127 = 16002: no saturation) and vpmaddwd by the scale give exact i32
 * sums, folded to 8 lanes that hold exactly what gemm_avx2.c's lanes hold and
 * scaled once per super-block in f32 the way gemm_avx2.c does: the two
 * variants give bit-identical results (tested), so the backend may pick either
 * per row count without a row's result depending on its batch. Offsets (Q4_K's mins, Q6_K's
 * 32) are folded in from the activation's 16-element sums (bsums).
 * Zen 4 runs a zmm op as two 256-bit halves, so the win over AVX2 is in
 * instructions per element, which is what bounds these kernels. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

#include "gemm_int.h"
#include "gemm_simd.h"

/* Q6_K's permutexvar maps: i16 lane l of scale vector j takes scale k_map_q6_K[j][l] (Q4_K's: k45_scale_maps) */
static const int16_t k_map_q6_K[4][32] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

static ALWAYS_INLINE void q4_K_body(int64_t k, const block_q4_K *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m256 acc[CPU_GEMM_MAX_NA];
    __m128 accm[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        acc[r] = _mm256_setzero_ps();
        accm[r] = _mm_setzero_ps();
    }
    /* constant lane maps: scale j of the 64 codes in vector j: lanes 0..15 sub-block 2j, 16..31 2j+1 */
    __m512i map[4];
    k45_scale_maps(map);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q4_K *b = &w[i];
        __m128i sm = k4_scales_mins(b->scales);
        __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
        __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        __m512i q[4], sc[4];
        #pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            __m256i q32 = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q32), _mm256_srli_epi16(q32, 4), 1);
            q[j] = _mm512_and_si512(v, lo4);
            sc[j] = _mm512_permutexvar_epi16(map[j], sc16);
        }
        k45_rows_512(q, sc, h2f(b->d), h2f(b->dmin), m16, i, NA, a, acc, accm);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]) - hsum4(accm[r]);
}

static ALWAYS_INLINE void q6_K_body(int64_t k, const block_q6_K *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), lo2 = _mm512_set1_epi8(0x03);
    __m256 acc[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();
    /* vector g (64 codes, elements 64g..64g+63 of the block) uses scales 4g + l/8 for i16 lane l */
    __m512i map[4];
    #pragma GCC unroll 8
    for (int g = 0; g < 4; g++) map[g] = _mm512_loadu_si512(k_map_q6_K[g]);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q6_K *b = &w[i];
        __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        __m512i sc16 = _mm512_castsi256_si512(sc16y);
        __m512i q[4], sc[4];
        #pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m512i l = _mm512_loadu_si512(b->ql + 64 * h);
            __m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, lo4), _mm512_slli_epi16(_mm512_and_si512(hz, lo2), 4));
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), lo4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hz, 4), lo2), 4));
        }
        #pragma GCC unroll 8
        for (int g = 0; g < 4; g++) sc[g] = _mm512_permutexvar_epi16(map[g], sc16);
        const float d = h2f(b->d);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const block_q8_K *y = (const block_q8_K *)a[r] + i;
            __m512i sumi = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int g = 0; g < 4; g++) {
                __m512i p = _mm512_maddubs_epi16(q[g], _mm512_loadu_si512(y->qs + 64 * g));
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, sc[g]));
            }
            /* codes are stored +32: subtract 32 * sum_s sc[s] * bsums[s] */
            __m256i off = _mm256_madd_epi16(sc16y, _mm256_loadu_si256((const __m256i *)y->bsums));
            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(fold(sumi)), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]);
}


/* ---- Q4_0: pairs of blocks per zmm, activations rearranged by a prep pass ----
 *
 * The weight's two 16-byte code runs of blocks A and B make one ymm; its low
 * and high nibbles make one zmm of 64 unsigned codes in the order
 * [A 0..15 | B 0..15 | A 16..31 | B 16..31]. The prep pass writes each
 * activation pair in that same order, plus 16 i32 corrections (8 x the sum of
 * the 4 activations under each i32 lane) so that vpmaddubsw on the unsigned
 * codes and one subtraction give sum((q - 8) * a) exactly, without the sign
 * trick that zmm lacks; and both blocks' scales as floats. */
typedef struct {
    int8_t qs[64];
    int32_t corr[16];
    float d[2];
} q4_0_pair;

size_t cpu_gemm_prep_bytes_q4_0(int64_t k) { return (size_t)(k / 64) * sizeof(q4_0_pair); }

void cpu_gemm_prep_q4_0_avx512(int64_t k, const void *restrict act, void *restrict out) {
    const block_q8_0 *a = act;
    q4_0_pair *p = out;
    for (int64_t i = 0; i < k / 64; i++, a += 2, p++) {
        memcpy(p->qs, a[0].qs, 16);
        memcpy(p->qs + 16, a[1].qs, 16);
        memcpy(p->qs + 32, a[0].qs + 16, 16);
        memcpy(p->qs + 48, a[1].qs + 16, 16);
        for (int l = 0; l < 16; l++) p->corr[l] = 8 * (p->qs[4 * l] + p->qs[4 * l + 1] + p->qs[4 * l + 2] + p->qs[4 * l + 3]);
        p->d[0] = _cvtsh_ss(a[0].d);
        p->d[1] = _cvtsh_ss(a[1].d);
    }
}

/* One pair of blocks (64 weights) into the NA rows' accumulators. */
static ALWAYS_INLINE void q4_0_pair_step(const block_q4_0 *restrict b, int64_t i, const int NA,
                                         const void *const *restrict a, __m512 *acc) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    const __m512i ones = _mm512_set1_epi16(1);
    /* scale lanes: i32 lanes 0..3 and 8..11 are block A's, 4..7 and 12..15 block B's */
    const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b[0].qs)),
                                        _mm_loadu_si128((const __m128i *)b[1].qs), 1);
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, lo4)),
                                   _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), 1);
    __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)b[0].d | ((uint32_t)b[1].d << 16))));
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const q4_0_pair *y = (const q4_0_pair *)a[r] + i;
        __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(q, _mm512_loadu_si512(y->qs)), ones);
        p = _mm512_sub_epi32(p, _mm512_loadu_si512(y->corr));
        __m128 dd = _mm_mul_ps(dw, _mm_castpd_ps(_mm_load_sd((const double *)y->d)));
        __m512 sc = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(dd));
        acc[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[r]);
    }
}

static ALWAYS_INLINE void q4_0_body(int64_t k, const block_q4_0 *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    /* two accumulators per row (even and odd pairs) hide the FMA latency at small NA */
    __m512 acc0[CPU_GEMM_MAX_NA], acc1[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    const int64_t np = k / 64;
    int64_t i = 0;
    for (; i + 2 <= np; i += 2) {
        q4_0_pair_step(&w[2 * i], i, NA, a, acc0);
        q4_0_pair_step(&w[2 * i + 2], i + 1, NA, a, acc1);
    }
    if (i < np) q4_0_pair_step(&w[2 * i], i, NA, a, acc0);
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

/* ---- Q8_0: pairs of blocks per zmm; the sign trick done with a mask ----
 * Activations are rearranged per pair as [A 0..31 | B 0..31] with both scales
 * as floats; per weight pair |w| and the mask of its negative bytes are made
 * once, and each activation row is negated under that mask (|a| <= 127, so
 * exact) before vpmaddubsw. */
typedef struct {
    int8_t qs[64];
    float d[2];
} q8_0_pair;

size_t cpu_gemm_prep_bytes_q8_0(int64_t k) { return (size_t)(k / 64) * sizeof(q8_0_pair); }

void cpu_gemm_prep_q8_0_avx512(int64_t k, const void *restrict act, void *restrict out) {
    const block_q8_0 *a = act;
    q8_0_pair *p = out;
    for (int64_t i = 0; i < k / 64; i++, a += 2, p++) {
        memcpy(p->qs, a[0].qs, 32);
        memcpy(p->qs + 32, a[1].qs, 32);
        p->d[0] = _cvtsh_ss(a[0].d);
        p->d[1] = _cvtsh_ss(a[1].d);
    }
}

static ALWAYS_INLINE void q8_0_pair_step(const block_q8_0 *restrict b, int64_t i, const int NA,
                                         const void *const *restrict a, __m512 *acc) {
    const __m512i ones = _mm512_set1_epi16(1);
    const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[0].qs)),
                                   _mm256_loadu_si256((const __m256i *)b[1].qs), 1);
    __mmask64 neg = _mm512_movepi8_mask(w);
    __m512i aw = _mm512_abs_epi8(w);
    __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)b[0].d | ((uint32_t)b[1].d << 16))));
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const q8_0_pair *y = (const q8_0_pair *)a[r] + i;
        __m512i av = _mm512_loadu_si512(y->qs);
        av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
        __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, av), ones);
        __m128 dd = _mm_mul_ps(dw, _mm_castpd_ps(_mm_load_sd((const double *)y->d)));
        __m512 sc = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(dd));
        acc[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[r]);
    }
}

static ALWAYS_INLINE void q8_0_body(int64_t k, const block_q8_0 *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    __m512 acc0[CPU_GEMM_MAX_NA], acc1[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    const int64_t np = k / 64;
    int64_t i = 0;
    for (; i + 2 <= np; i += 2) {
        q8_0_pair_step(&w[2 * i], i, NA, a, acc0);
        q8_0_pair_step(&w[2 * i + 2], i + 1, NA, a, acc1);
    }
    if (i < np) q8_0_pair_step(&w[2 * i], i, NA, a, acc0);
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}


void cpu_gemm_q4_K_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q4_K_body, block_q4_K)
}

void cpu_gemm_q4_0_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q4_0_body, block_q4_0)
}

void cpu_gemm_q8_0_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q8_0_body, block_q8_0)
}

void cpu_gemm_q6_K_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q6_K_body, block_q6_K)
}

#endif
