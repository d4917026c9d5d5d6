/* dot_conv_avx512.c: AVX-512 (F+BW) activation converters (compiled with
 * -mavx512f -mavx512bw on top of AVX2; dot.c only calls them after checking
 * the CPU at run time).
 *
 * Each writes exactly the bytes of dot.c's scalar converter, step by step:
 * the same max |x| (NaNs ignored: vmaxps returns its second operand when
 * either is NaN, and the running maximum is always that operand), the same
 * inverse scale (127/amax, or -127/max for Q8_K), the same products rounded
 * half to even by vcvtps2dq (MXCSR's default mode, as lrintf), out-of-range
 * and NaN products clamped to -127 as lrintf's LONG_MIN is, and f16 scales by
 * F16C (round to nearest even, as qt_f32_to_f16 for every non-NaN value). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "dot_int.h"

static inline float amax_n(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + j)), m);
    return _mm512_reduce_max_ps(m);
}

static inline __m512i round_clamp(__m512 x, __m512 m) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, m));
    return _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
}

static inline __m512i q8_block32(const float *x, __m512 id, int8_t *qs) {
    __m512i q0 = round_clamp(_mm512_loadu_ps(x), id), q1 = round_clamp(_mm512_loadu_ps(x + 16), id);
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtepi32_epi8(q1));
    return _mm512_add_epi32(q0, q1);
}

void cpu_act_q8_0_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = amax_n(x, QK8_0);
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        (void)q8_block32(x, _mm512_set1_ps(id), y[i].qs);
    }
}

void cpu_act_q8_1_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = amax_n(x, QK8_1);
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        int sum = _mm512_reduce_add_epi32(q8_block32(x, _mm512_set1_ps(id), y[i].qs));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
    }
}

void cpu_act_q8_K_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        /* the largest |x| and its sign: the first element of that magnitude (as the scalar scan keeps it) */
        __m512 hi = _mm512_set1_ps(-INFINITY), lo = _mm512_set1_ps(INFINITY);
        for (int j = 0; j < QK_K; j += 16) {
            __m512 v = _mm512_loadu_ps(x + j);
            hi = _mm512_max_ps(v, hi);
            lo = _mm512_min_ps(v, lo);
        }
        float vmax = _mm512_reduce_max_ps(hi), vmin = _mm512_reduce_min_ps(lo);
        float amax = vmax > -vmin ? vmax : -vmin;
        if (!(amax > 0)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max;
        if (vmax != amax) max = vmin;
        else if (-vmin != amax) max = vmax;
        else { /* both +amax and -amax occur: the first one wins */
            max = 0;
            for (int j = 0; j < QK_K; j++)
                if (fabsf(x[j]) == amax) {
                    max = x[j];
                    break;
                }
        }
        float iscale = -127.0f / max;
        const __m512 m = _mm512_set1_ps(iscale);
        for (int j = 0; j < QK_K / 16; j++)
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), _mm512_cvtepi32_epi8(round_clamp(_mm512_loadu_ps(x + 16 * j), m)));
        /* bsums: sad of (q + 128) against zero sums each 8 bytes into a u64 lane; lanes 2g, 2g+1 make group g */
        const __m512i bias = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
        __m512i s[4];
        for (int j = 0; j < 4; j++) s[j] = _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(y[i].qs + 64 * j), bias), zero);
        const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
        const __m512i off = _mm512_set1_epi64(16 * 128);
        for (int h = 0; h < 2; h++) {
            __m512i g = _mm512_add_epi64(_mm512_permutex2var_epi64(s[2 * h], even, s[2 * h + 1]),
                                         _mm512_permutex2var_epi64(s[2 * h], odd, s[2 * h + 1]));
            _mm_storeu_si128((__m128i *)(y[i].bsums + 8 * h), _mm512_cvtepi64_epi16(_mm512_sub_epi64(g, off)));
        }
        y[i].d = 1.0f / iscale;
    }
}

void cpu_act_bf16_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    const __m512i lsb = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512i u = _mm512_castps_si512(v);
        __m512i up = _mm512_srli_epi32(u, 16);
        __m512i rn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(up, lsb)), 16);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        rn = _mm512_mask_or_epi32(rn, nan, up, quiet);
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(rn));
    }
    if (i < n) cpu_act_bf16_ref(x + i, y + i, n - i);
}

#else
/* Not an x86 target with AVX-512 flags: nothing here (dot.c calls nothing). */
typedef int hn_dot_conv_avx512_unused;
#endif
