/* pack_kq.c: the packed layouts of Q4_K, Q5_K and Q6_K (8 rows interleaved
 * per super-block; the byte layouts are described in pack_kq_int.h), their
 * pack and exact unpack, the Q6_K activation prep, the portable reference
 * kernels (unpack a row, run dot.h's reference dot), and the kernel tables
 * cpu_pack_table_k (references), cpu_pack_table_k_x86 and
 * cpu_pack_table_k_arm (SIMD kernels, slowest first).
 *
 * Packing pre-decodes what a kernel would otherwise decode per call: the
 * 6-bit scales and mins of Q4_K/Q5_K become bytes, Q5_K's fifth bits become
 * bit masks, Q6_K's 4+2-bit codes are regrouped so that three 64-byte loads
 * give 256 codes with two or three logic ops each. unpack_row re-encodes all
 * of it, so it reproduces the GGUF bytes exactly. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "../../core/alloc.h"
#include "dot.h"
#include "pack_kq_int.h"

/* ---- Q4_K / Q5_K: 6-bit scales and mins ---- */

static void k4_decode(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0xf) | ((q[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* The inverse of k4_decode: every bit of the 12 bytes is a bit of some scale or min. */
static void k4_encode(const uint8_t sc[8], const uint8_t mn[8], uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4));
    }
}

static size_t group_bytes_q4_K(int64_t k) { return (size_t)(k / QK_K) * KQ4_SB; }
static size_t group_bytes_q5_K(int64_t k) { return (size_t)(k / QK_K) * KQ5_SB; }
static size_t group_bytes_q6_K(int64_t k) { return (size_t)(k / QK_K) * KQ6_SB; }

/* Header and codes of one row's super-block fields (shared by Q4_K and Q5_K:
 * the first fields of block_q5_K are block_q4_K's, qs at a different offset). */
static void k4_pack_sb(uint8_t *hdr, uint8_t *codes, int r, uint16_t d, uint16_t dmin, const uint8_t *scales,
                       const uint8_t *qs) {
    uint8_t sc[8], mn[8];
    k4_decode(scales, sc, mn);
    memcpy(hdr + 2 * r, &d, 2);
    memcpy(hdr + 16 + 2 * r, &dmin, 2);
    for (int j = 0; j < 8; j++) {
        hdr[32 + 8 * j + r] = sc[j];
        hdr[96 + 32 * (j / 4) + 4 * r + j % 4] = mn[j];
    }
    for (int c = 0; c < 16; c++) memcpy(codes + 64 * c + 8 * r, qs + 8 * c, 8);
}

static void k4_unpack_sb(const uint8_t *hdr, const uint8_t *codes, int r, uint16_t *d, uint16_t *dmin,
                         uint8_t *scales, uint8_t *qs) {
    uint8_t sc[8], mn[8];
    memcpy(d, hdr + 2 * r, 2);
    memcpy(dmin, hdr + 16 + 2 * r, 2);
    for (int j = 0; j < 8; j++) {
        sc[j] = hdr[32 + 8 * j + r];
        mn[j] = hdr[96 + 32 * (j / 4) + 4 * r + j % 4];
    }
    k4_encode(sc, mn, scales);
    for (int c = 0; c < 16; c++) memcpy(qs + 8 * c, codes + 64 * c + 8 * r, 8);
}

static void pack_q4_K(int64_t k, const void *restrict src, size_t src_row_bytes, void *restrict dst) {
    const int64_t nsb = k / QK_K;
    uint8_t *g = dst;
    memset(dst, 0, group_bytes_q4_K(k));
    for (int r = 0; r < KQ_R; r++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)r * src_row_bytes;
        for (int64_t i = 0; i < nsb; i++) {
            block_q4_K b; /* rows need not be aligned */
            memcpy(&b, row + sizeof b * (size_t)i, sizeof b);
            k4_pack_sb(g + KQ4_SB * i, g + KQ4_SB * i + KQ4_HDR, r, b.d, b.dmin, b.scales, b.qs);
        }
    }
}

static void unpack_row_q4_K(int64_t k, const void *restrict group, int j, void *restrict dst) {
    const int64_t nsb = k / QK_K;
    const uint8_t *g = group;
    for (int64_t i = 0; i < nsb; i++) {
        block_q4_K b;
        k4_unpack_sb(g + KQ4_SB * i, g + KQ4_SB * i + KQ4_HDR, j, &b.d, &b.dmin, b.scales, b.qs);
        memcpy((uint8_t *)dst + sizeof b * (size_t)i, &b, sizeof b);
    }
}

/* Q5_K: fifth bit of element l of sub-block s is bit s of qh[l]. In chunk c
 * (pair c / 4), byte 8r + m holds element l = 8(c % 4) + m of sub-blocks
 * 2(c / 4) (low nibble) and 2(c / 4) + 1 (high nibble). */
static void pack_q5_K(int64_t k, const void *restrict src, size_t src_row_bytes, void *restrict dst) {
    const int64_t nsb = k / QK_K;
    uint8_t *g = dst;
    memset(dst, 0, group_bytes_q5_K(k));
    for (int r = 0; r < KQ_R; r++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)r * src_row_bytes;
        for (int64_t i = 0; i < nsb; i++) {
            block_q5_K b;
            memcpy(&b, row + sizeof b * (size_t)i, sizeof b);
            uint8_t *cb = g + KQ5_SB * i + KQ4_HDR;
            k4_pack_sb(g + KQ5_SB * i, cb, r, b.d, b.dmin, b.scales, b.qs);
            for (int c = 0; c < 16; c++) {
                uint8_t *mask = cb + 1024 + 16 * c;
                int s = 2 * (c / 4);
                for (int m = 0; m < 8; m++) {
                    int l = 8 * (c % 4) + m, bit = 8 * r + m;
                    mask[bit / 8] |= (uint8_t)(((b.qh[l] >> s) & 1) << (bit % 8));
                    mask[8 + bit / 8] |= (uint8_t)(((b.qh[l] >> (s + 1)) & 1) << (bit % 8));
                }
            }
        }
    }
}

static void unpack_row_q5_K(int64_t k, const void *restrict group, int j, void *restrict dst) {
    const int64_t nsb = k / QK_K;
    const uint8_t *g = group;
    for (int64_t i = 0; i < nsb; i++) {
        block_q5_K b;
        const uint8_t *cb = g + KQ5_SB * i + KQ4_HDR;
        k4_unpack_sb(g + KQ5_SB * i, cb, j, &b.d, &b.dmin, b.scales, b.qs);
        memset(b.qh, 0, sizeof b.qh);
        for (int c = 0; c < 16; c++) {
            const uint8_t *mask = cb + 1024 + 16 * c;
            int s = 2 * (c / 4);
            for (int m = 0; m < 8; m++) {
                int l = 8 * (c % 4) + m, bit = 8 * j + m;
                b.qh[l] |= (uint8_t)(((mask[bit / 8] >> (bit % 8)) & 1) << s);
                b.qh[l] |= (uint8_t)(((mask[8 + bit / 8] >> (bit % 8)) & 1) << (s + 1));
            }
        }
        memcpy((uint8_t *)dst + sizeof b * (size_t)i, &b, sizeof b);
    }
}

/* ---- Q6_K ---- */

/* A GGUF block's 256 6-bit codes, in element order (as the reference dot reads them). */
static void q6_codes(const block_q6_K *b, uint8_t q[QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t ql0 = b->ql[64 * h + l], ql1 = b->ql[64 * h + 32 + l], qh = b->qh[32 * h + l];
            q[128 * h + l] = (uint8_t)((ql0 & 0xf) | ((qh & 3) << 4));
            q[128 * h + 32 + l] = (uint8_t)((ql1 & 0xf) | (((qh >> 2) & 3) << 4));
            q[128 * h + 64 + l] = (uint8_t)((ql0 >> 4) | (((qh >> 4) & 3) << 4));
            q[128 * h + 96 + l] = (uint8_t)((ql1 >> 4) | (((qh >> 6) & 3) << 4));
        }
}

/* The inverse of q6_codes. */
static void q6_store(block_q6_K *b, const uint8_t q[QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t q0 = q[128 * h + l], q1 = q[128 * h + 32 + l], q2 = q[128 * h + 64 + l], q3 = q[128 * h + 96 + l];
            b->ql[64 * h + l] = (uint8_t)((q0 & 0xf) | ((q2 & 0xf) << 4));
            b->ql[64 * h + 32 + l] = (uint8_t)((q1 & 0xf) | ((q3 & 0xf) << 4));
            b->qh[32 * h + l] = (uint8_t)((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
        }
}

static void pack_q6_K(int64_t k, const void *restrict src, size_t src_row_bytes, void *restrict dst) {
    const int64_t nsb = k / QK_K;
    uint8_t *g = dst;
    memset(dst, 0, group_bytes_q6_K(k));
    for (int r = 0; r < KQ_R; r++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)r * src_row_bytes;
        for (int64_t i = 0; i < nsb; i++) {
            block_q6_K bk; /* rows need not be aligned */
            uint8_t q[QK_K];
            memcpy(&bk, row + sizeof bk * (size_t)i, sizeof bk);
            q6_codes(&bk, q);
            uint8_t *h = g + KQ6_SB * i, *cb = h + KQ6_HDR;
            memcpy(h + 2 * r, &bk.d, 2);
            for (int p = 0; p < 8; p++)
                for (int e = 0; e < 2; e++) h[16 + 16 * p + 2 * r + e] = (uint8_t)bk.scales[2 * p + e];
            for (int p = 0; p < 8; p++) {
                uint8_t *A = cb + 192 * p, *B = A + 64, *C = A + 128;
                for (int e = 0; e < 2; e++)
                    for (int t = 0; t < 4; t++) {
                        int base = 16 * (2 * p + e) + t, o = 8 * r + 4 * e + t;
                        int q0 = q[base], q1 = q[base + 4], q2 = q[base + 8], q3 = q[base + 12];
                        A[o] = (uint8_t)(q0 | ((q2 >> 4) << 6));
                        B[o] = (uint8_t)(q1 | ((q3 >> 4) << 6));
                        C[o] = (uint8_t)((q2 & 0xf) | ((q3 & 0xf) << 4));
                    }
            }
        }
    }
}

static void unpack_row_q6_K(int64_t k, const void *restrict group, int j, void *restrict dst) {
    const int64_t nsb = k / QK_K;
    const uint8_t *g = group;
    for (int64_t i = 0; i < nsb; i++) {
        block_q6_K bk;
        uint8_t q[QK_K];
        const uint8_t *h = g + KQ6_SB * i, *cb = h + KQ6_HDR;
        memcpy(&bk.d, h + 2 * j, 2);
        for (int p = 0; p < 8; p++)
            for (int e = 0; e < 2; e++) bk.scales[2 * p + e] = (int8_t)h[16 + 16 * p + 2 * j + e];
        for (int p = 0; p < 8; p++) {
            const uint8_t *A = cb + 192 * p, *B = A + 64, *C = A + 128;
            for (int e = 0; e < 2; e++)
                for (int t = 0; t < 4; t++) {
                    int base = 16 * (2 * p + e) + t, o = 8 * j + 4 * e + t;
                    q[base] = A[o] & 63;
                    q[base + 4] = B[o] & 63;
                    q[base + 8] = (uint8_t)((C[o] & 0xf) | ((A[o] >> 6) << 4));
                    q[base + 12] = (uint8_t)((C[o] >> 4) | ((B[o] >> 6) << 4));
                }
        }
        q6_store(&bk, q);
        memcpy((uint8_t *)dst + sizeof bk * (size_t)i, &bk, sizeof bk);
    }
}

size_t cpu_pack_kq_prep_bytes_q6_K(int64_t k) { return (size_t)(k / QK_K) * sizeof(kq6_prep_block); }

/* Activations in the codes' (pair p, quad q, e) order: byte 32p + 8q + 4e + b
 * is element 16(2p + e) + 4q + b; nb[2p + e] = -32 * bsums[2p + e] (Q6_K's
 * codes are stored +32). */
void cpu_pack_kq_prep_q6_K(int64_t k, const void *restrict act, void *restrict out) {
    const block_q8_K *a = act;
    kq6_prep_block *p = out;
    for (int64_t i = 0; i < k / QK_K; i++) {
        memset(&p[i], 0, sizeof p[i]);
        for (int pr = 0; pr < 8; pr++)
            for (int q = 0; q < 4; q++)
                for (int e = 0; e < 2; e++) memcpy(p[i].qs + 32 * pr + 8 * q + 4 * e, a[i].qs + 16 * (2 * pr + e) + 4 * q, 4);
        for (int s = 0; s < 16; s++) p[i].nb[s] = -32 * a[i].bsums[s];
        p[i].d = a[i].d;
    }
}

/* ---- references: unpack each row, dot.h's reference dot ---- */

/* rows of up to this many bytes are unpacked on the stack (k = 16384 at Q5_K/Q6_K) */
enum { REF_STACK = 64 * sizeof(block_q6_K) };

static void ref_gemm(qt_type t, void (*unpack)(int64_t, const void *, int, void *), int64_t k, const void *group, int na,
                     const void *const *a, float *s) {
    _Alignas(16) unsigned char stack[REF_STACK];
    size_t rb = (size_t)(k / QK_K) * (t == QT_Q6_K ? sizeof(block_q6_K) : t == QT_Q5_K ? sizeof(block_q5_K) : sizeof(block_q4_K));
    unsigned char *row = rb <= sizeof stack ? stack : hn_malloc(rb);
    cpu_dot_fn dot = cpu_dot_ref(t)->dot;
    for (int j = 0; j < KQ_R; j++) {
        if (!row) {
            for (int r = 0; r < na; r++) s[r * KQ_R + j] = NAN;
            continue;
        }
        unpack(k, group, j, row);
        for (int r = 0; r < na; r++) dot(k, &s[r * KQ_R + j], row, a[r]);
    }
    if (row != stack) hn_free(row);
}

static void ref_q4_K(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    ref_gemm(QT_Q4_K, unpack_row_q4_K, k, g, na, a, s);
}
static void ref_q5_K(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    ref_gemm(QT_Q5_K, unpack_row_q5_K, k, g, na, a, s);
}
static void ref_q6_K(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    ref_gemm(QT_Q6_K, unpack_row_q6_K, k, g, na, a, s);
}

#define KQ_ENTRY(T, name, gb, pk, fn, prep, prep_bytes, unpack, isa) \
    {T, QT_Q8_K, CPU_LAYOUT_X8, KQ_R, QK_K, name, gb, pk, fn, prep, prep_bytes, unpack, isa}

static const cpu_pack_kernel k_refs[] = {
    KQ_ENTRY(QT_Q4_K, "q4_Kx8-ref", group_bytes_q4_K, pack_q4_K, ref_q4_K, NULL, NULL, unpack_row_q4_K, 0),
    KQ_ENTRY(QT_Q5_K, "q5_Kx8-ref", group_bytes_q5_K, pack_q5_K, ref_q5_K, NULL, NULL, unpack_row_q5_K, 0),
    KQ_ENTRY(QT_Q6_K, "q6_Kx8-ref", group_bytes_q6_K, pack_q6_K, ref_q6_K, NULL, NULL, unpack_row_q6_K, 0),
};
const cpu_pack_table cpu_pack_table_k = {k_refs, (int)(sizeof k_refs / sizeof k_refs[0])};

#if defined(__x86_64__)
/* slowest first: the registry takes the last entry this CPU runs */
static const cpu_pack_kernel k_x86[] = {
    KQ_ENTRY(QT_Q4_K, "q4_Kx8-avx2", group_bytes_q4_K, pack_q4_K, cpu_pack_q4_K_avx2, NULL, NULL, unpack_row_q4_K,
             CPU_ISA_AVX2),
    KQ_ENTRY(QT_Q5_K, "q5_Kx8-avx2", group_bytes_q5_K, pack_q5_K, cpu_pack_q5_K_avx2, NULL, NULL, unpack_row_q5_K,
             CPU_ISA_AVX2),
    KQ_ENTRY(QT_Q6_K, "q6_Kx8-avx2", group_bytes_q6_K, pack_q6_K, cpu_pack_q6_K_avx2, cpu_pack_kq_prep_q6_K,
             cpu_pack_kq_prep_bytes_q6_K, unpack_row_q6_K, CPU_ISA_AVX2),
    KQ_ENTRY(QT_Q4_K, "q4_Kx8-avx512vnni", group_bytes_q4_K, pack_q4_K, cpu_pack_q4_K_vnni, NULL, NULL, unpack_row_q4_K,
             CPU_ISA_AVX2 | CPU_ISA_AVX512 | CPU_ISA_VNNI512),
    KQ_ENTRY(QT_Q6_K, "q6_Kx8-avx512vnni", group_bytes_q6_K, pack_q6_K, cpu_pack_q6_K_vnni, cpu_pack_kq_prep_q6_K,
             cpu_pack_kq_prep_bytes_q6_K, unpack_row_q6_K, CPU_ISA_AVX2 | CPU_ISA_AVX512 | CPU_ISA_VNNI512),
    KQ_ENTRY(QT_Q5_K, "q5_Kx8-avx512vnni", group_bytes_q5_K, pack_q5_K, cpu_pack_q5_K_vnni, NULL, NULL, unpack_row_q5_K,
             CPU_ISA_AVX2 | CPU_ISA_AVX512 | CPU_ISA_VNNI512),
};
const cpu_pack_table cpu_pack_table_k_x86 = {k_x86, (int)(sizeof k_x86 / sizeof k_x86[0])};
#endif

#if defined(__aarch64__)
/* slowest first */
static const cpu_pack_kernel k_arm[] = {
    KQ_ENTRY(QT_Q4_K, "q4_Kx8-neon", group_bytes_q4_K, pack_q4_K, cpu_pack_q4_K_neon, NULL, NULL, unpack_row_q4_K,
             CPU_ISA_NEON),
    KQ_ENTRY(QT_Q5_K, "q5_Kx8-neon", group_bytes_q5_K, pack_q5_K, cpu_pack_q5_K_neon, NULL, NULL, unpack_row_q5_K,
             CPU_ISA_NEON),
    KQ_ENTRY(QT_Q6_K, "q6_Kx8-neon", group_bytes_q6_K, pack_q6_K, cpu_pack_q6_K_neon, cpu_pack_kq_prep_q6_K,
             cpu_pack_kq_prep_bytes_q6_K, unpack_row_q6_K, CPU_ISA_NEON),
    KQ_ENTRY(QT_Q4_K, "q4_Kx8-dotprod", group_bytes_q4_K, pack_q4_K, cpu_pack_q4_K_dotprod, NULL, NULL, unpack_row_q4_K,
             CPU_ISA_NEON | CPU_ISA_DOTPROD),
    KQ_ENTRY(QT_Q5_K, "q5_Kx8-dotprod", group_bytes_q5_K, pack_q5_K, cpu_pack_q5_K_dotprod, NULL, NULL, unpack_row_q5_K,
             CPU_ISA_NEON | CPU_ISA_DOTPROD),
    KQ_ENTRY(QT_Q6_K, "q6_Kx8-dotprod", group_bytes_q6_K, pack_q6_K, cpu_pack_q6_K_dotprod, cpu_pack_kq_prep_q6_K,
             cpu_pack_kq_prep_bytes_q6_K, unpack_row_q6_K, CPU_ISA_NEON | CPU_ISA_DOTPROD),
    KQ_ENTRY(QT_Q4_K, "q4_Kx8-i8mm", group_bytes_q4_K, pack_q4_K, cpu_pack_q4_K_i8mm, NULL, NULL, unpack_row_q4_K,
             CPU_ISA_NEON | CPU_ISA_DOTPROD | CPU_ISA_I8MM),
    KQ_ENTRY(QT_Q5_K, "q5_Kx8-i8mm", group_bytes_q5_K, pack_q5_K, cpu_pack_q5_K_i8mm, NULL, NULL, unpack_row_q5_K,
             CPU_ISA_NEON | CPU_ISA_DOTPROD | CPU_ISA_I8MM),
    KQ_ENTRY(QT_Q6_K, "q6_Kx8-i8mm", group_bytes_q6_K, pack_q6_K, cpu_pack_q6_K_i8mm, cpu_pack_kq_prep_q6_K,
             cpu_pack_kq_prep_bytes_q6_K, unpack_row_q6_K, CPU_ISA_NEON | CPU_ISA_DOTPROD | CPU_ISA_I8MM),
};
const cpu_pack_table cpu_pack_table_k_arm = {k_arm, (int)(sizeof k_arm / sizeof k_arm[0])};
#endif
