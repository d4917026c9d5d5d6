/* pack_kq_avx2.c: AVX2 kernels for the packed K-quant layouts (pack_kq_int.h);
 * compiled with AVX2+FMA+F16C, listed in cpu_pack_table_k_x86 and only run
 * after the registry's CPU check. They read the same packed bytes (and, for
 * Q6_K, the same prepped activations) as the VNNI kernels.
 *
 * The group's 8 rows are done as two halves of 4 (one 256-bit half of each
 * 64-byte code vector; both halves over a few super-blocks at a time, so
 * the second reads L1, not DRAM), keeping the VNNI kernels' lanes: i32 lane 2r + e of a
 * half holds what lane 2r + e of the VNNI accumulator holds. Products come
 * from vpmaddubsw (at most 2 * 63 * 127 per pair: no saturation) and
 * vpmaddwd by the sub-block scale, which is the VNNI kernels' vpdpbusd sum
 * times the scale as the same exact integer; the float work per lane is the
 * same sequence too, so these kernels give the VNNI kernels' results bit for
 * bit (tested), and a row's result never depends on NA or on which of the
 * two the backend picked. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

#include "pack_kq_int.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* super-blocks per pass of the two halves (4 records of Q6_K: 6.7 KB, in L1) */
#define KQ_CHUNK 4

static ALWAYS_INLINE __m256i bcast64(const void *p) {
    long long v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

static ALWAYS_INLINE uint32_t ld32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 4 f16 values (rows 4hf..4hf+3) as 8 f32 lanes, lane 2r + e = row r */
static ALWAYS_INLINE __m256 rows_f16(const uint8_t *p) {
    long long v;
    memcpy(&v, p, 8);
    __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128(v));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

/* 4 unsigned scale bytes (one per row) as i16 pairs: lane 2r + e = (sc[r], sc[r]) */
static ALWAYS_INLINE __m256i scales_u8(const uint8_t *p) {
    const __m256i idx = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1, 2, -1, 2, -1, 2, -1, 2,
                                         -1, 3, -1, 3, -1, 3, -1, 3, -1);
    return _mm256_shuffle_epi8(_mm256_set1_epi32((int)ld32(p)), idx);
}

/* 32 mask bits as 32 bytes of 0x10 (bit set) or 0 */
static ALWAYS_INLINE __m256i expand_bits(uint32_t m) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                          3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), shuf), bits);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bits), _mm256_set1_epi8(0x10));
}

/* s[8r + 4hf + j] = lane 2j + lane 2j + 1 of acc */
static ALWAYS_INLINE void store_half(float *s, __m256 acc) {
    __m256 t = _mm256_add_ps(acc, _mm256_permute_ps(acc, 0xb1));
    t = _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    _mm_storeu_ps(s, _mm256_castps256_ps128(t));
}

static ALWAYS_INLINE void k45_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                   float *restrict s, const int HI) {
    const int64_t nsb = k / QK_K;
    const size_t sb = HI ? KQ5_SB : KQ4_SB;
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 accs[2][CPU_PACK_MAX_NA];
    for (int hf = 0; hf < 2; hf++)
        for (int r = 0; r < NA; r++) accs[hf][r] = _mm256_setzero_ps();
    /* a few super-blocks at a time, both halves over them while they are in L1 */
    for (int64_t i0 = 0; i0 < nsb; i0 += KQ_CHUNK)
    for (int hf = 0; hf < 2; hf++) {
        __m256 acc[CPU_PACK_MAX_NA];
        __m256i sumi[CPU_PACK_MAX_NA];
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) acc[r] = accs[hf][r];
        for (int64_t i = i0; i < nsb && i < i0 + KQ_CHUNK; i++) {
            const uint8_t *h = g + sb * i, *cb = h + KQ4_HDR;
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) sumi[r] = _mm256_setzero_si256();
            for (int jj = 0; jj < 4; jj++) {
                const __m256i scl = scales_u8(h + 32 + 8 * (2 * jj) + 4 * hf);
                const __m256i sch = scales_u8(h + 32 + 8 * (2 * jj + 1) + 4 * hf);
                #pragma GCC unroll 4
                for (int z = 0; z < 4; z++) {
                    const int c = 4 * jj + z;
                    __m256i v = _mm256_loadu_si256((const __m256i *)(cb + 64 * c + 32 * hf));
                    __m256i ql = _mm256_and_si256(v, lo4), qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                    if (HI) {
                        ql = _mm256_or_si256(ql, expand_bits(ld32(cb + 1024 + 16 * c + 4 * hf)));
                        qh = _mm256_or_si256(qh, expand_bits(ld32(cb + 1024 + 16 * c + 8 + 4 * hf)));
                    }
                    #pragma GCC unroll 8
                    for (int r = 0; r < NA; r++) {
                        const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 64 * jj + 8 * z;
                        __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(ql, bcast64(aq)), scl);
                        __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(qh, bcast64(aq + 32)), sch);
                        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pl, ph));
                    }
                }
            }
            const __m256 d8 = rows_f16(h + 8 * hf), dm8 = rows_f16(h + 16 + 8 * hf);
            const __m256i m0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(h + 96 + 16 * hf)));
            const __m256i m1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(h + 128 + 16 * hf)));
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const block_q8_K *y = (const block_q8_K *)a[r] + i;
                __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                            _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
                __m256i b0 = _mm256_broadcastq_epi64(bs), b1 = _mm256_broadcastq_epi64(_mm_unpackhi_epi64(bs, bs));
                __m256i mins = _mm256_add_epi32(_mm256_madd_epi16(m0, b0), _mm256_madd_epi16(m1, b1));
                const __m256 ad = _mm256_set1_ps(y->d);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(d8, ad), acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dm8, ad), acc[r]);
            }
        }
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) accs[hf][r] = acc[r];
    }
    for (int hf = 0; hf < 2; hf++)
        for (int r = 0; r < NA; r++) store_half(s + KQ_R * r + 4 * hf, accs[hf][r]);
}

static ALWAYS_INLINE void q4_K_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    k45_body(k, g, NA, a, s, 0);
}
static ALWAYS_INLINE void q5_K_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    k45_body(k, g, NA, a, s, 1);
}

static ALWAYS_INLINE void q6_K_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    const int64_t nsb = k / QK_K;
    const __m256i m3f = _mm256_set1_epi8(0x3f), m30 = _mm256_set1_epi8(0x30), m0f = _mm256_set1_epi8(0x0f);
    __m256 accs[2][CPU_PACK_MAX_NA];
    for (int hf = 0; hf < 2; hf++)
        for (int r = 0; r < NA; r++) accs[hf][r] = _mm256_setzero_ps();
    for (int64_t i0 = 0; i0 < nsb; i0 += KQ_CHUNK)
    for (int hf = 0; hf < 2; hf++) {
        __m256 acc[CPU_PACK_MAX_NA];
        __m256i sumi[CPU_PACK_MAX_NA];
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) acc[r] = accs[hf][r];
        for (int64_t i = i0; i < nsb && i < i0 + KQ_CHUNK; i++) {
            const uint8_t *h = g + KQ6_SB * i, *cb = h + KQ6_HDR;
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) sumi[r] = _mm256_setzero_si256();
            for (int p = 0; p < 8; p++) {
                const uint8_t *c = cb + 192 * p + 32 * hf;
                const __m256i A = _mm256_loadu_si256((const __m256i *)c);
                const __m256i B = _mm256_loadu_si256((const __m256i *)(c + 64));
                const __m256i C = _mm256_loadu_si256((const __m256i *)(c + 128));
                __m256i q[4];
                q[0] = _mm256_and_si256(A, m3f);
                q[1] = _mm256_and_si256(B, m3f);
                q[2] = _mm256_or_si256(_mm256_and_si256(C, m0f), _mm256_and_si256(_mm256_srli_epi16(A, 2), m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(C, 4), m0f),
                                       _mm256_and_si256(_mm256_srli_epi16(B, 2), m30));
                long long sv;
                memcpy(&sv, h + 16 + 16 * p + 8 * hf, 8);
                const __m128i s8 = _mm_cvtepi8_epi16(_mm_cvtsi64_si128(sv));
                const __m256i sc16 = _mm256_set_m128i(_mm_unpackhi_epi16(s8, s8), _mm_unpacklo_epi16(s8, s8));
                const __m256i sc32 = _mm256_cvtepi16_epi32(s8);
                #pragma GCC unroll 8
                for (int r = 0; r < NA; r++) {
                    const kq6_prep_block *y = (const kq6_prep_block *)a[r] + i;
                    __m256i t = _mm256_mullo_epi32(bcast64(y->nb + 2 * p), sc32);
                    #pragma GCC unroll 4
                    for (int qd = 0; qd < 4; qd++)
                        t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(q[qd], bcast64(y->qs + 32 * p + 8 * qd)), sc16));
                    sumi[r] = _mm256_add_epi32(sumi[r], t);
                }
            }
            const __m256 d8 = rows_f16(h + 8 * hf);
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const kq6_prep_block *y = (const kq6_prep_block *)a[r] + i;
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(d8, _mm256_set1_ps(y->d)), acc[r]);
            }
        }
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) accs[hf][r] = acc[r];
    }
    for (int hf = 0; hf < 2; hf++)
        for (int r = 0; r < NA; r++) store_half(s + KQ_R * r + 4 * hf, accs[hf][r]);
}

#define PACK_DISPATCH(body)                                   \
    switch (na) {                                             \
    case 1: body(k, (const uint8_t *)group, 1, a, s); break;  \
    case 2: body(k, (const uint8_t *)group, 2, a, s); break;  \
    case 3: body(k, (const uint8_t *)group, 3, a, s); break;  \
    case 4: body(k, (const uint8_t *)group, 4, a, s); break;  \
    case 5: body(k, (const uint8_t *)group, 5, a, s); break;  \
    case 6: body(k, (const uint8_t *)group, 6, a, s); break;  \
    case 7: body(k, (const uint8_t *)group, 7, a, s); break;  \
    default: body(k, (const uint8_t *)group, 8, a, s); break; \
    }

void cpu_pack_q4_K_avx2(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q4_K_body)
}
void cpu_pack_q5_K_avx2(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q5_K_body)
}
void cpu_pack_q6_K_avx2(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q6_K_body)
}

#endif
