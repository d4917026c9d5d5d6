/* quant_avx2.c: AVX2+F16C versions of the f16 row converters (compiled with
 * -mavx2 -mfma -mf16c; quant.c only calls them after a run-time CPU check).
 *
 * vcvtps2ph rounds to nearest even exactly as qt_f32_to_f16 does (subnormal
 * halves, overflow to inf at 65520 included); the one difference, NaN
 * payloads, is patched to the quiet 0x7e00 (sign kept) that qt_f32_to_f16
 * writes. Widening is exact either way. */
#if defined(__AVX2__) && defined(__F16C__)

#include <immintrin.h>

#include "quant_int.h"

void qt_quant_f16_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    const __m256i qnan = _mm256_set1_epi32(0x7e00), sign = _mm256_set1_epi32(0x8000);
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m128i h0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m128i h1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 nan0 = _mm256_cmp_ps(v0, v0, _CMP_UNORD_Q), nan1 = _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(_mm256_or_ps(nan0, nan1), _mm256_or_ps(nan0, nan1))) {
            /* sign | 0x7e00 where NaN, as 16-bit lanes */
            __m256i s0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v0), 16), sign), qnan);
            __m256i s1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v1), 16), sign), qnan);
            __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(s0, s1), _MM_SHUFFLE(3, 1, 2, 0));
            __m256i m = _mm256_permute4x64_epi64(
                _mm256_packs_epi32(_mm256_castps_si256(nan0), _mm256_castps_si256(nan1)), _MM_SHUFFLE(3, 1, 2, 0));
            __m256i h = _mm256_set_m128i(h1, h0);
            _mm256_storeu_si256((__m256i *)(y + i), _mm256_blendv_epi8(h, p, m));
        } else {
            _mm_storeu_si128((__m128i *)(y + i), h0);
            _mm_storeu_si128((__m128i *)(y + i + 8), h1);
        }
    }
    for (; i < n; i++) y[i] = qt_f32_to_f16(x[i]);
}

void qt_dequant_f16_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        /* a NaN half widens with its payload; qt_f16_to_f32 sets the quiet bit, as does vcvtph2ps */
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) y[i] = qt_f16_to_f32(x[i]);
}

#else
typedef int hn_quant_avx2_unused;
#endif
