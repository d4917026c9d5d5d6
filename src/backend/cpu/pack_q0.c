/* pack_q0.c: the x16 layouts of Q4_0 and Q8_0 (pack_q0.h): packing,
 * unpacking, the activation prep pass, each layout's reference (unpack a row,
 * then dot.h's reference dot) and a portable kernel that reads the layout
 * directly and rounds exactly as the SIMD kernels do. Also the table of the
 * x86 kernels (pack_q0_avx2.c, pack_q0_vnni.c) and of the AArch64 ones
 * (pack_q0_neon.c, pack_q0_dotprod.c, pack_q0_i8mm.c), each built on its
 * architecture only. */
#include <math.h>
#include <string.h>

#include "../../core/alloc.h"
#include "../../quant/quant.h"
#include "dot.h"
#include "pack_q0.h"

/* ---- layouts ---- */

static size_t q4_0x16_bytes(int64_t k) { return (size_t)(k / 32) * PQ4_BS; }
static size_t q8_0x16_bytes(int64_t k) { return (size_t)(k / 32) * PQ8_BS; }

static void q4_0x16_pack(int64_t k, const void *restrict src, size_t src_row_bytes, void *restrict dst) {
    const int64_t nb = k / 32;
    unsigned char *codes = dst;
    
    for (int l = 0; l < PQ0_R; l++) {
        const block_q4_0 *row = (const block_q4_0 *)((const unsigned char *)src + (size_t)l * src_row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            for (int v = 0; v < 4; v++) memcpy(codes + (size_t)b * PQ4_BS + v * 64 + l * 4, row[b].qs + 4 * v, 4);
            ((uint16_t *)(codes + (size_t)b * PQ4_BS + PQ0_R * 16))[l] = row[b].d;
        }
    }
}

static void q4_0x16_unpack_row(int64_t k, const void *restrict group, int j, void *restrict dst) {
    const int64_t nb = k / 32;
    const unsigned char *codes = group;
    
    block_q4_0 *row = dst;
    for (int64_t b = 0; b < nb; b++) {
        for (int v = 0; v < 4; v++) memcpy(row[b].qs + 4 * v, codes + (size_t)b * PQ4_BS + v * 64 + j * 4, 4);
        row[b].d = PQ4_D(group, b)[j];
    }
}

static void q8_0x16_pack(int64_t k, const void *restrict src, size_t src_row_bytes, void *restrict dst) {
    const int64_t nb = k / 32;
    unsigned char *codes = dst;
    
    for (int l = 0; l < PQ0_R; l++) {
        const block_q8_0 *row = (const block_q8_0 *)((const unsigned char *)src + (size_t)l * src_row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            for (int q = 0; q < 8; q++)
                for (int e = 0; e < 4; e++)
                    codes[(size_t)b * PQ8_BS + q * 64 + l * 4 + e] = (unsigned char)((uint8_t)row[b].qs[4 * q + e] ^ 0x80);
            ((uint16_t *)(codes + (size_t)b * PQ8_BS + PQ0_R * 32))[l] = row[b].d;
        }
    }
}

static void q8_0x16_unpack_row(int64_t k, const void *restrict group, int j, void *restrict dst) {
    const int64_t nb = k / 32;
    const unsigned char *codes = group;
    
    block_q8_0 *row = dst;
    for (int64_t b = 0; b < nb; b++) {
        for (int q = 0; q < 8; q++)
            for (int e = 0; e < 4; e++) row[b].qs[4 * q + e] = (int8_t)(codes[(size_t)b * PQ8_BS + q * 64 + j * 4 + e] ^ 0x80);
        row[b].d = PQ8_D(group, b)[j];
    }
}

/* ---- activation prep (shared by every Q4_0/Q8_0 x16 kernel) ---- */

static size_t pq0_prep_bytes(int64_t k) { return (size_t)(k / 32) * sizeof(pq0_act); }

static void pq0_prep(int64_t k, const void *restrict act, void *restrict out) {
    const block_q8_0 *a = act;
    pq0_act *p = out;
    for (int64_t b = 0; b < k / 32; b++) {
        int sum = 0;
        for (int i = 0; i < 32; i++) sum += a[b].qs[i];
        memcpy(p[b].qs, a[b].qs, 32);
        p[b].c4 = -8 * sum;
        p[b].c8 = -128 * sum;
        p[b].d = qt_f16_to_f32(a[b].d);
        p[b].pad = 0;
    }
}

/* ---- references: unpack a row, then dot.h's reference dot ---- */

static void ref_by_rows(qt_type t, void (*unpack)(int64_t, const void *, int, void *), int64_t k, const void *g,
                        int na, const void *const *a, float *s) {
    /* test and tuner path only: never in the token loop */
    void *row = hn_malloc(qt_row_size(t, k));
    cpu_dot_fn dot = cpu_dot_ref(t)->dot;
    for (int j = 0; j < PQ0_R; j++) {
        if (row) unpack(k, g, j, row);
        for (int r = 0; r < na; r++) {
            if (row)
                dot(k, &s[r * PQ0_R + j], row, a[r]);
            else
                s[r * PQ0_R + j] = NAN;
        }
    }
    hn_free(row);
}

static void q4_0x16_ref(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    ref_by_rows(QT_Q4_0, q4_0x16_unpack_row, k, g, na, a, s);
}

static void q8_0x16_ref(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    ref_by_rows(QT_Q8_0, q8_0x16_unpack_row, k, g, na, a, s);
}

/* ---- portable kernels (the SIMD kernels' arithmetic, one lane at a time) ---- */

static void q4_0x16_c(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    const unsigned char *codes = g;
    
    for (int r = 0; r < na; r++) {
        const pq0_act *y = a[r];
        float acc[PQ0_R] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const unsigned char *cb = codes + (size_t)b * PQ4_BS;
            for (int l = 0; l < PQ0_R; l++) {
                int32_t sum = y[b].c4;
                for (int v = 0; v < 4; v++)
                    for (int e = 0; e < 4; e++) {
                        int c = cb[v * 64 + l * 4 + e];
                        sum += (c & 15) * y[b].qs[4 * v + e] + (c >> 4) * y[b].qs[16 + 4 * v + e];
                    }
                float sc = qt_f16_to_f32(PQ4_D(g, b)[l]) * y[b].d;
                acc[l] = fmaf(sc, (float)sum, acc[l]);
            }
        }
        memcpy(s + (size_t)r * PQ0_R, acc, sizeof acc);
    }
}

static void q8_0x16_c(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    const unsigned char *codes = g;
    
    for (int r = 0; r < na; r++) {
        const pq0_act *y = a[r];
        float acc[PQ0_R] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const unsigned char *cb = codes + (size_t)b * PQ8_BS;
            for (int l = 0; l < PQ0_R; l++) {
                int32_t sum = y[b].c8;
                for (int q = 0; q < 8; q++)
                    for (int e = 0; e < 4; e++) sum += cb[q * 64 + l * 4 + e] * y[b].qs[4 * q + e];
                float sc = qt_f16_to_f32(PQ8_D(g, b)[l]) * y[b].d;
                acc[l] = fmaf(sc, (float)sum, acc[l]);
            }
        }
        memcpy(s + (size_t)r * PQ0_R, acc, sizeof acc);
    }
}

/* ---- tables ---- */

#define Q4_0X16(name, fn, prep, prep_bytes, isa)                                                      \
    {QT_Q4_0, QT_Q8_0, CPU_LAYOUT_X16, PQ0_R, 32, name, q4_0x16_bytes, q4_0x16_pack, fn, prep, prep_bytes, \
     q4_0x16_unpack_row, isa}
#define Q8_0X16(name, fn, prep, prep_bytes, isa)                                                      \
    {QT_Q8_0, QT_Q8_0, CPU_LAYOUT_X16, PQ0_R, 32, name, q8_0x16_bytes, q8_0x16_pack, fn, prep, prep_bytes, \
     q8_0x16_unpack_row, isa}

static const cpu_pack_kernel k_q0[] = {
    Q4_0X16("q4_0x16-ref", q4_0x16_ref, NULL, NULL, 0),
    Q4_0X16("q4_0x16-c", q4_0x16_c, pq0_prep, pq0_prep_bytes, 0),
    Q8_0X16("q8_0x16-ref", q8_0x16_ref, NULL, NULL, 0),
    Q8_0X16("q8_0x16-c", q8_0x16_c, pq0_prep, pq0_prep_bytes, 0),
};
const cpu_pack_table cpu_pack_table_0 = {k_q0, (int)(sizeof k_q0 / sizeof k_q0[0])};

#if defined(__x86_64__)
static const cpu_pack_kernel k_q0_x86[] = {
    Q4_0X16("q4_0x16-avx2", cpu_pack_q4_0x16_avx2, pq0_prep, pq0_prep_bytes, CPU_ISA_AVX2),
    Q4_0X16("q4_0x16-avx512vnni", cpu_pack_q4_0x16_vnni, pq0_prep, pq0_prep_bytes, CPU_ISA_AVX2 | CPU_ISA_AVX512 | CPU_ISA_VNNI512),
    Q8_0X16("q8_0x16-avx2", cpu_pack_q8_0x16_avx2, pq0_prep, pq0_prep_bytes, CPU_ISA_AVX2),
    Q8_0X16("q8_0x16-avx512vnni", cpu_pack_q8_0x16_vnni, pq0_prep, pq0_prep_bytes, CPU_ISA_AVX2 | CPU_ISA_AVX512 | CPU_ISA_VNNI512),
};
const cpu_pack_table cpu_pack_table_0_x86 = {k_q0_x86, (int)(sizeof k_q0_x86 / sizeof k_q0_x86[0])};
#endif

#if defined(__aarch64__)
static const cpu_pack_kernel k_q0_arm[] = {
    Q4_0X16("q4_0x16-neon", cpu_pack_q4_0x16_neon, pq0_prep, pq0_prep_bytes, CPU_ISA_NEON),
    Q4_0X16("q4_0x16-dotprod", cpu_pack_q4_0x16_dotprod, pq0_prep, pq0_prep_bytes, CPU_ISA_NEON | CPU_ISA_DOTPROD),
    Q4_0X16("q4_0x16-i8mm", cpu_pack_q4_0x16_i8mm, pq0_prep, pq0_prep_bytes, CPU_ISA_NEON | CPU_ISA_DOTPROD | CPU_ISA_I8MM),
    Q8_0X16("q8_0x16-neon", cpu_pack_q8_0x16_neon, pq0_prep, pq0_prep_bytes, CPU_ISA_NEON),
    Q8_0X16("q8_0x16-dotprod", cpu_pack_q8_0x16_dotprod, pq0_prep, pq0_prep_bytes, CPU_ISA_NEON | CPU_ISA_DOTPROD),
    Q8_0X16("q8_0x16-i8mm", cpu_pack_q8_0x16_i8mm, pq0_prep, pq0_prep_bytes, CPU_ISA_NEON | CPU_ISA_DOTPROD | CPU_ISA_I8MM),
};
const cpu_pack_table cpu_pack_table_0_arm = {k_q0_arm, (int)(sizeof k_q0_arm / sizeof k_q0_arm[0])};
#endif
