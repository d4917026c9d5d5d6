/* test_pack_kq.c: the packed K-quant layouts and kernels (backend/cpu/pack_kq*.c),
 * read through their tables directly (cpu_pack_table_k, cpu_pack_table_k_x86 or
 * cpu_pack_table_k_arm).
 *
 * For Q4_K, Q5_K and Q6_K: pack then unpack_row gives back every row's GGUF
 * bytes (random bytes, quantizer output, rows given with a stride), and pack
 * is pure; the reference kernel equals dot.h's reference dot of the original
 * rows bit for bit; every kernel this CPU runs matches the reference within
 * test_gemm.c's tolerance for k = 256, 1024, 3072 and na = 1..8, on
 * quantizer rows, random block bytes and saturated codes (all 0xff with
 * activations at +-127); the SIMD variants agree bit for bit; and a row's
 * result is the same bits for every na and every position in the batch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/pack.h"
#include "core/alloc.h"
#include "quant/quant.h"
#include "test.h"


static const qt_type k_types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K};
enum { MODE_QUANT, MODE_BYTES, MODE_FF, MODE_COUNT };

/* Keeps f16 scale fields finite in random-byte blocks. */
static void tame_f16(qt_type t, uint8_t *row, int64_t k) {
    for (int64_t b = 0; b < k / QK_K; b++) {
        uint8_t *blk = row + b * qt_traits(t)->type_size;
        uint16_t h = qt_f32_to_f16(0.01f + 0.01f * (float)(test_rnd() % 100));
        uint16_t h2 = qt_f32_to_f16(0.01f + 0.01f * (float)(test_rnd() % 100));
        if (t == QT_Q6_K) {
            memcpy(blk + offsetof(block_q6_K, d), &h, 2);
        } else {
            memcpy(blk, &h, 2);
            memcpy(blk + 2, &h2, 2);
        }
    }
}

static bool isa_ok(unsigned isa) {
    const cpu_features *f = cpu_dot_features();
    unsigned have = 0;
    if (f->avx2 && f->fma && f->f16c) {
        have |= CPU_ISA_AVX2;
        if (f->avx_vnni) have |= CPU_ISA_AVXVNNI;
        if (f->avx512f && f->avx512bw) {
            have |= CPU_ISA_AVX512;
            if (f->avx512vnni) have |= CPU_ISA_VNNI512;
        }
    }
    if (f->neon) {
        have |= CPU_ISA_NEON;
        if (f->dotprod) have |= CPU_ISA_DOTPROD;
        if (f->dotprod && f->i8mm) have |= CPU_ISA_I8MM;
    }
    return (isa & ~have) == 0;
}

/* Every kernel of type t in the tables (reference first); returns the count. */
static int kernels(qt_type t, const cpu_pack_kernel **out, int cap, int *skipped) {
    int n = 0;
    *skipped = 0;
    const cpu_pack_table *tabs[2] = {&cpu_pack_table_k, NULL};
#if defined(__x86_64__)
    tabs[1] = &cpu_pack_table_k_x86;
#elif defined(__aarch64__)
    tabs[1] = &cpu_pack_table_k_arm;
#endif
    for (int ti = 0; ti < 2; ti++) {
        if (!tabs[ti]) continue;
        for (int i = 0; i < tabs[ti]->n; i++) {
            const cpu_pack_kernel *p = &tabs[ti]->k[i];
            if (p->wtype != t) continue;
            if (!isa_ok(p->isa)) {
                (*skipped)++;
                continue;
            }
            if (n < cap) out[n++] = p;
        }
    }
    return n;
}

/* Fills R rows of k elements (stride rb + pad) for a mode. */
static void make_rows(qt_type t, int mode, int64_t k, uint8_t *w, size_t stride, int R, float *xf) {
    size_t rb = qt_row_size(t, k);
    for (int j = 0; j < R; j++) {
        uint8_t *row = w + (size_t)j * stride;
        if (mode == MODE_QUANT) {
            float amp = 0.1f + (float)(test_rnd() % 40);
            for (int64_t i = 0; i < k; i++) xf[i] = amp * test_gauss() * (test_rnd() % 16 == 0 ? 8.0f : 1.0f);
            /* the quantizer writes aligned blocks; the strided copy may be unaligned */
            uint8_t *tmp = hn_malloc(rb);
            qt_traits(t)->from_float(xf, tmp, k);
            memcpy(row, tmp, rb);
            hn_free(tmp);
        } else {
            for (size_t i = 0; i < rb; i++) row[i] = mode == MODE_FF ? 0xff : (uint8_t)test_rnd();
            tame_f16(t, row, k);
        }
    }
}

static void check_round_trip(qt_type t, const cpu_pack_kernel *p) {
    static const int64_t ks[] = {256, 1024, 3072};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        int64_t k = ks[ki];
        size_t rb = qt_row_size(t, k), stride = rb + 7, gb = p->group_bytes(k);
        uint8_t *w = hn_malloc(stride * (size_t)p->rows), *g = hn_malloc(gb), *g2 = hn_malloc(gb), *back = hn_malloc(rb);
        float *xf = hn_malloc(sizeof(float) * (size_t)k);
        for (int mode = 0; mode < MODE_COUNT; mode++) {
            make_rows(t, mode, k, w, stride, p->rows, xf);
            memset(g, 0xa5, gb);
            memset(g2, 0x5a, gb);
            p->pack(k, w, stride, g);
            p->pack(k, w, stride, g2);
            CHECKF(memcmp(g, g2, gb) == 0, "%s k=%lld mode=%d: pack is not pure", p->name, (long long)k, mode);
            int bad = -1;
            for (int j = 0; j < p->rows; j++) {
                memset(back, 0x33, rb);
                p->unpack_row(k, g, j, back);
                if (memcmp(back, w + (size_t)j * stride, rb) != 0 && bad < 0) bad = j;
            }
            CHECKF(bad < 0, "%s k=%lld mode=%d: row %d does not round-trip", p->name, (long long)k, mode, bad);
        }
        hn_free(w);
        hn_free(g);
        hn_free(g2);
        hn_free(back);
        hn_free(xf);
    }
}

static void check_kernels(qt_type t) {
    const cpu_pack_kernel *ks_[8];
    int skipped = 0;
    int nk = kernels(t, ks_, 8, &skipped);
    const char *tn = qt_traits(t)->name;
    CHECKF(nk >= 1 && ks_[0]->isa == 0, "%s: no reference kernel", tn);
    if (nk < 1) return;
    const cpu_pack_kernel *ref = ks_[0];
    const cpu_dot_kernel *dref = cpu_dot_ref(t);
    CHECK(dref && dref->act_type == ref->act_type);
    CHECK(ref->rows == 8 && ref->layout == CPU_LAYOUT_X8 && ref->k_align == QK_K);
    check_round_trip(t, ref);
    for (int v = 1; v < nk; v++) {
        /* kernels of one layout read the same packed bytes */
        CHECK(ks_[v]->layout == ref->layout && ks_[v]->rows == ref->rows && ks_[v]->pack == ref->pack &&
              ks_[v]->group_bytes == ref->group_bytes && ks_[v]->act_type == ref->act_type);
    }
    const int R = ref->rows, NA = CPU_PACK_MAX_NA;
    const int64_t ksz[] = {256, 1024, 3072};
    for (size_t ki = 0; ki < sizeof ksz / sizeof ksz[0]; ki++) {
        int64_t k = ksz[ki];
        size_t rb = qt_row_size(t, k), ab = qt_row_size(ref->act_type, k), gb = ref->group_bytes(k);
        uint8_t *w = hn_malloc(rb * (size_t)R), *g = hn_malloc(gb + 64);
        uint8_t *acts = hn_malloc(ab * NA), *prep = hn_malloc((size_t)k * 4 * NA);
        float *xf = hn_malloc(sizeof(float) * (size_t)k);
        /* kernels must not rely on 64-byte alignment of the group */
        uint8_t *gp = g + 16;
        for (int mode = 0; mode < MODE_COUNT; mode++) {
            make_rows(t, mode, k, w, rb, R, xf);
            ref->pack(k, w, rb, gp);
            const void *aptr[CPU_PACK_MAX_NA];
            for (int r = 0; r < NA; r++) {
                for (int64_t i = 0; i < k; i++)
                    xf[i] = mode == MODE_FF ? ((r + i) % 3 ? 1.0f : -1.0f) : test_gauss() * (1.0f + (float)r);
                dref->act(xf, acts + (size_t)r * ab, k);
                aptr[r] = acts + (size_t)r * ab;
            }
            float want[CPU_PACK_MAX_NA * 8], got[CPU_PACK_MAX_NA * 8], all[CPU_PACK_MAX_NA * 8];
            ref->fn(k, gp, NA, aptr, want);
            /* the reference is dot.h's reference dot of the original rows */
            int refbad = 0;
            for (int r = 0; r < NA; r++)
                for (int j = 0; j < R; j++) {
                    float d;
                    dref->dot(k, &d, w + (size_t)j * rb, aptr[r]);
                    refbad += memcmp(&d, &want[r * R + j], sizeof d) != 0;
                }
            CHECKF(refbad == 0, "%s ref k=%lld mode=%d: %d results differ from dot.h's reference", tn, (long long)k, mode, refbad);
            double scale = 0;
            for (int i = 0; i < NA * R; i++) scale = fmax(scale, fabs(want[i]));
            float first_var[CPU_PACK_MAX_NA * 8];
            for (int v = 1; v < nk; v++) {
                const cpu_pack_kernel *kv = ks_[v];
                const void *vptr[CPU_PACK_MAX_NA];
                for (int r = 0; r < NA; r++) {
                    vptr[r] = aptr[r];
                    if (kv->prep) {
                        CHECK(kv->prep_bytes(k) <= (size_t)k * 4);
                        kv->prep(k, aptr[r], prep + (size_t)r * (size_t)k * 4);
                        vptr[r] = prep + (size_t)r * (size_t)k * 4;
                    }
                }
                for (int i = 0; i < NA * R; i++) all[i] = NAN;
                kv->fn(k, gp, NA, vptr, all);
                int far = 0, first = -1;
                for (int i = 0; i < NA * R; i++) {
                    double tol = 1e-5 * (scale + 1.0) + 1e-4 * fabs(want[i]);
                    if (!(fabs((double)all[i] - want[i]) <= tol)) {
                        far++;
                        if (first < 0) first = i;
                    }
                }
                CHECKF(far == 0, "%s %s k=%lld mode=%d: %d of %d off the reference (first [%d]: %.9g vs %.9g)", tn,
                       kv->name, (long long)k, mode, far, NA * R, first, first >= 0 ? all[first] : 0.0,
                       first >= 0 ? want[first] : 0.0);
                /* the SIMD variants of a layout agree bit for bit (the backend may switch between them) */
                if (v == 1) memcpy(first_var, all, sizeof all);
                else if (kv->prep == ks_[1]->prep)
                    CHECKF(memcmp(first_var, all, sizeof all) == 0, "%s %s vs %s k=%lld mode=%d: not bit-identical", tn,
                           kv->name, ks_[1]->name, (long long)k, mode);
                /* batch invariance: every na, and each row alone and at the end of a batch */
                int vary = 0;
                for (int na = 1; na < NA; na++) {
                    for (int i = 0; i < na * R; i++) got[i] = NAN;
                    kv->fn(k, gp, na, vptr, got);
                    vary += memcmp(got, all, sizeof(float) * (size_t)(na * R)) != 0;
                    const void *shifted[CPU_PACK_MAX_NA];
                    for (int r = 0; r < na; r++) shifted[r] = vptr[(r + NA - na) % NA];
                    kv->fn(k, gp, na, shifted, got);
                    for (int r = 0; r < na; r++)
                        vary += memcmp(&got[r * R], &all[((r + NA - na) % NA) * R], sizeof(float) * (size_t)R) != 0;
                }
                CHECKF(vary == 0, "%s %s k=%lld mode=%d: results depend on the batch (%d)", tn, kv->name, (long long)k,
                       mode, vary);
            }
        }
        hn_free(w);
        hn_free(g);
        hn_free(acts);
        hn_free(prep);
        hn_free(xf);
    }
    if (skipped) printf("%s: %d kernel(s) need an ISA this CPU lacks (not run)\n", tn, skipped);
    printf("%s: %d kernel(s) checked\n", tn, nk);
}

int main(void) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) check_kernels(k_types[i]);
    /* the tables hold only K-quant kernels of the x8 layout, each with its own pack and unpack */
    const cpu_pack_table *tabs[] = {&cpu_pack_table_k,
#if defined(__x86_64__)
                                    &cpu_pack_table_k_x86
#elif defined(__aarch64__)
                                    &cpu_pack_table_k_arm
#endif
    };
    for (size_t ti = 0; ti < sizeof tabs / sizeof tabs[0]; ti++)
        for (int i = 0; i < tabs[ti]->n; i++) {
            const cpu_pack_kernel *p = &tabs[ti]->k[i];
            CHECK(p->wtype == QT_Q4_K || p->wtype == QT_Q5_K || p->wtype == QT_Q6_K);
            CHECK(p->act_type == QT_Q8_K && p->pack && p->unpack_row && p->group_bytes && p->fn && p->name);
            CHECK((p->prep == NULL) == (p->prep_bytes == NULL));
            CHECK(ti == 0 ? p->isa == 0 : p->isa != 0);
        }
    TEST_DONE();
}
