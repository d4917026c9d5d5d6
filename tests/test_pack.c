/* test_pack.c: weights repacked at load (backend/cpu/pack.h) and the packed
 * matmul path.
 *
 * Kernel level, for every type with packed kernels on this CPU: pack then
 * unpack_row gives back every row's GGUF bytes; pack is pure; every variant
 * against its layout's reference (unpack + dot.h's reference dot) for several
 * k, na = 1..8, on rows from the reference quantizer, on random block bytes
 * and on all-0xff codes with +-127 activations; each row's result is the same
 * alone as in a batch; Q4_0/Q8_0 variants of a layout agree bit for bit.
 * Backend level: a prepared weight (N not a multiple of R, two matrices)
 * against the same weight unpacked through matmul, matmul_multi and
 * moe_matmul; the tuner's per-type switch (-1: unpacked, v: a variant).
 * Model level: the shared test models loaded packed and with HONE_NO_PACK=1
 * give the same greedy tokens and near-identical logits.
 * Built with -DHN_TEST_KERNELS_ONLY (the ARM cross build, `make arm-test`),
 * only the kernel level runs, linked with the kernel modules alone. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/pack.h"
#include "core/alloc.h"
#include "quant/quant.h"
#include "test.h"
#ifndef HN_TEST_KERNELS_ONLY
#include "backend/cpu/cpu.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/model_int.h"
#endif


#ifndef HN_TEST_KERNELS_ONLY
static int sanitized(void) {
    const char *s = getenv("HONE_SANITIZED");
    return s && *s && strcmp(s, "0") != 0;
}
#endif

/* every type a packed kernel may exist for (pack_q0.c and the K-quant tables) */
static const qt_type k_types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
enum { MODE_QUANT, MODE_BYTES, MODE_FF, MODE_COUNT };

/* Keeps f16 scale fields finite in random-byte blocks. */
static void tame_f16(qt_type t, uint8_t *row, int64_t n) {
    const qt_type_traits *tr = qt_traits(t);
    for (int64_t b = 0; b < n / tr->blck_size; b++) {
        uint8_t *blk = row + b * tr->type_size;
        uint16_t h = qt_f32_to_f16(0.01f + 0.01f * (float)(test_rnd() % 100));
        if (t == QT_Q6_K) {
            memcpy(blk + offsetof(block_q6_K, d), &h, 2);
        } else {
            memcpy(blk, &h, 2);
            if (t == QT_Q4_K || t == QT_Q5_K) memcpy(blk + 2, &h, 2); /* dmin */
        }
    }
}

/* rows x k weights of type t in the given mode */
static void make_rows(qt_type t, int mode, int64_t k, int rows, uint8_t *w) {
    size_t rb = qt_row_size(t, k);
    float *xf = hn_malloc(sizeof(float) * (size_t)k);
    for (int j = 0; j < rows; j++) {
        uint8_t *row = w + (size_t)j * rb;
        if (mode == MODE_QUANT) {
            for (int64_t i = 0; i < k; i++) xf[i] = test_gauss() * (test_rnd() % 16 == 0 ? 8.0f : 1.0f);
            qt_traits(t)->from_float(xf, row, k);
        } else {
            for (size_t i = 0; i < rb; i++) row[i] = mode == MODE_FF ? 0xff : (uint8_t)test_rnd();
            tame_f16(t, row, k);
        }
    }
    hn_free(xf);
}

static void check_kernel(const cpu_pack_kernel *v, const cpu_pack_kernel *ref, qt_type t) {
    const cpu_dot_kernel *dref = cpu_dot_ref(t);
    const int R = v->rows;
    CHECK(R >= 1 && R <= CPU_PACK_MAX_ROWS);
    CHECK(ref->unpack_row != NULL && ref->prep == NULL);
    static const int64_t ks[] = {256, 512, 1280, 96, 32};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        int64_t k = ks[ki];
        if (k % qt_traits(t)->blck_size || !cpu_pack_fits(v, k)) continue;
        size_t rb = qt_row_size(t, k), ab = qt_row_size(v->act_type, k), gb = v->group_bytes(k);
        uint8_t *w = hn_malloc(rb * (size_t)R), *g = hn_malloc(gb), *g2 = hn_malloc(gb), *back = hn_malloc(rb);
        uint8_t *acts = hn_malloc(ab * CPU_PACK_MAX_NA), *prep = hn_malloc((size_t)k * 4 * CPU_PACK_MAX_NA);
        float *xf = hn_malloc(sizeof(float) * (size_t)k);
        for (int mode = 0; mode < MODE_COUNT; mode++) {
            make_rows(t, mode, k, R, w);
            memset(g2, 0xa5, gb);
            v->pack(k, w, rb, g);
            v->pack(k, w, rb, g2);
            CHECKF(!memcmp(g, g2, gb), "%s k=%lld: pack is not pure", v->name, (long long)k);
            for (int j = 0; j < R; j++) {
                v->unpack_row(k, g, j, back);
                CHECKF(!memcmp(back, w + (size_t)j * rb, rb), "%s k=%lld mode=%d: row %d does not round-trip", v->name,
                       (long long)k, mode, j);
            }
            const void *aptr[CPU_PACK_MAX_NA], *vptr[CPU_PACK_MAX_NA];
            for (int r = 0; r < CPU_PACK_MAX_NA; r++) {
                for (int64_t i = 0; i < k; i++)
                    xf[i] = mode == MODE_FF ? ((r + i) % 3 ? 1.0f : -1.0f) : test_gauss() * (1.0f + (float)r);
                dref->act(xf, acts + (size_t)r * ab, k);
                aptr[r] = vptr[r] = acts + (size_t)r * ab;
                if (v->prep) {
                    CHECK(v->prep_bytes(k) <= (size_t)k * 4);
                    v->prep(k, aptr[r], prep + (size_t)r * (size_t)k * 4);
                    vptr[r] = prep + (size_t)r * (size_t)k * 4;
                }
            }
            float want[CPU_PACK_MAX_NA * CPU_PACK_MAX_ROWS], got[CPU_PACK_MAX_NA * CPU_PACK_MAX_ROWS],
                one[CPU_PACK_MAX_ROWS];
            ref->fn(k, g, CPU_PACK_MAX_NA, aptr, want);
            /* the reference is dot.h's reference dot of each unpacked row */
            float d0;
            dref->dot(k, &d0, w + (size_t)(R - 1) * rb, aptr[CPU_PACK_MAX_NA - 1]);
            CHECK(!memcmp(&d0, &want[(CPU_PACK_MAX_NA - 1) * R + R - 1], sizeof d0));
            for (int na = 1; na <= CPU_PACK_MAX_NA; na++) {
                for (int i = 0; i < na * R; i++) got[i] = NAN;
                v->fn(k, g, na, vptr, got);
                double scale = 0;
                for (int i = 0; i < na * R; i++) scale = fmax(scale, fabs(want[i]));
                int bad = 0, moved = 0;
                for (int r = 0; r < na; r++) {
                    v->fn(k, g, 1, &vptr[r], one);
                    if (memcmp(one, got + (size_t)r * R, sizeof(float) * (size_t)R)) moved++;
                    for (int j = 0; j < R; j++) {
                        double tol = 1e-5 * (scale + 1.0) + 1e-4 * fabs(want[r * R + j]);
                        if (!(fabs((double)got[r * R + j] - want[r * R + j]) <= tol)) {
                            if (!bad)
                                fprintf(stderr, "  %s k=%lld mode=%d na=%d row %d/%d: %g vs ref %g\n", v->name,
                                        (long long)k, mode, na, r, j, got[r * R + j], want[r * R + j]);
                            bad++;
                        }
                    }
                }
                CHECKF(bad == 0, "%s k=%lld mode=%d na=%d: %d results off the reference", v->name, (long long)k, mode,
                       na, bad);
                CHECKF(moved == 0, "%s k=%lld na=%d: %d rows differ alone and in a batch", v->name, (long long)k, na,
                       moved);
            }
        }
        hn_free(w);
        hn_free(g);
        hn_free(g2);
        hn_free(back);
        hn_free(acts);
        hn_free(prep);
        hn_free(xf);
    }
}

/* The Q4_0/Q8_0 kernels of a layout round alike (pack_q0.h): every non-reference variant equals the portable one. */
static void check_identical(qt_type t) {
    const cpu_pack_kernel *v[16];
    int nv = cpu_pack_variants(t, v, 16);
    const int64_t k = 1280;
    for (int a = 0; a < nv && a < 16; a++) {
        if (v[a]->fn == cpu_pack_ref(t, v[a]->layout)->fn) continue;
        for (int b = a + 1; b < nv && b < 16; b++) {
            if (v[b]->layout != v[a]->layout || v[b]->prep != v[a]->prep) continue;
            size_t rb = qt_row_size(t, k), ab = qt_row_size(v[a]->act_type, k), gb = v[a]->group_bytes(k);
            uint8_t *w = hn_malloc(rb * (size_t)v[a]->rows), *g = hn_malloc(gb), *acts = hn_malloc(ab * 8),
                    *prep = hn_malloc((size_t)k * 4 * 8);
            float *xf = hn_malloc(sizeof(float) * (size_t)k), sa[128], sb[128];
            make_rows(t, MODE_QUANT, k, v[a]->rows, w);
            v[a]->pack(k, w, rb, g);
            const void *ap[8];
            for (int r = 0; r < 8; r++) {
                for (int64_t i = 0; i < k; i++) xf[i] = test_gauss();
                cpu_dot_ref(t)->act(xf, acts + (size_t)r * ab, k);
                v[a]->prep(k, acts + (size_t)r * ab, prep + (size_t)r * (size_t)k * 4);
                ap[r] = prep + (size_t)r * (size_t)k * 4;
            }
            v[a]->fn(k, g, 8, ap, sa);
            v[b]->fn(k, g, 8, ap, sb);
            CHECKF(!memcmp(sa, sb, sizeof(float) * 8 * (size_t)v[a]->rows), "%s and %s differ", v[a]->name, v[b]->name);
            hn_free(w);
            hn_free(g);
            hn_free(acts);
            hn_free(prep);
            hn_free(xf);
        }
    }
}

static void test_kernels(void) {
    int total = 0;
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        qt_type t = k_types[i];
        const cpu_pack_kernel *v[16];
        int nv = cpu_pack_variants(t, v, 16);
        for (int j = 0; j < nv && j < 16; j++) {
            const cpu_pack_kernel *ref = cpu_pack_ref(t, v[j]->layout);
            CHECKF(ref != NULL, "%s: no reference for its layout", v[j]->name);
            CHECK(v[j]->wtype == t && v[j]->act_type == cpu_dot_best(t)->act_type);
            if (ref) check_kernel(v[j], ref, t);
            total++;
        }
        /* the best is the last variant, unless that is the layout's reference (never packed for) */
        if (nv > 0) {
            const cpu_pack_kernel *last = v[(nv < 16 ? nv : 16) - 1];
            CHECK(cpu_pack_best(t, 4096) == (last == cpu_pack_ref(t, last->layout) ? NULL : last));
        }
    }
    /* Q4_0 and Q8_0 always have packed kernels (portable ones at least) */
    CHECK(cpu_pack_best(QT_Q4_0, 1024) != NULL && cpu_pack_best(QT_Q8_0, 1024) != NULL);
    CHECK(cpu_pack_best(QT_Q4_0, 48) == NULL); /* not a whole number of blocks */
    CHECK(cpu_pack_best(QT_F32, 1024) == NULL);
    check_identical(QT_Q4_0);
    check_identical(QT_Q8_0);
    const cpu_features *f = cpu_dot_features();
    if (f->avx512f && f->avx512bw && f->avx512vnni && f->avx2 && f->fma && f->f16c)
        CHECK(!strcmp(cpu_pack_best(QT_Q4_0, 1024)->name, "q4_0x16-avx512vnni"));
    printf("%d packed variants checked\n", total);
}

#ifndef HN_TEST_KERNELS_ONLY
/* ---- backend level ---- */

static float frand(void) { return (float)((int)(test_rnd() % 2001) - 1000) / 1000.0f; }

/* the matmul ops over host arrays (handles wrapping them, as the CPU backend allows) */
static void mm(be_backend *b, const be_tensor *w, int mat, const float *x, int n, float *y) {
    be_tensor X = be_cpu_host(QT_F32, (void *)x), Y = be_cpu_host(QT_F32, y);
    b->ops->matmul(b, w, mat, &X, n, &Y);
}

static void moe_mm(be_backend *b, const be_tensor *w, const float *x, bool shared, int n, int k, const int32_t *ids,
                   float *y) {
    be_tensor X = be_cpu_host(QT_F32, (void *)x), I = be_cpu_host(QT_I32, (void *)ids), Y = be_cpu_host(QT_F32, y);
    b->ops->moe_matmul(b, w, &X, shared, n, k, &I, &Y);
}

static void test_backend_type(be_backend *b, qt_type t) {
    const cpu_pack_kernel *pk = cpu_pack_best(t, 256);
    if (!pk) return;
    const int K = 256, R = pk->rows, N = 3 * R + 5, NM = 2, NX = 21;
    size_t rb = qt_row_size(t, K);
    uint8_t *w = hn_malloc(rb * (size_t)N * NM);
    make_rows(t, MODE_QUANT, K, N * NM, w);
    float *x = hn_malloc(sizeof(float) * (size_t)K * NX), *y = hn_malloc(sizeof(float) * (size_t)N * NX * 2),
          *yu = hn_malloc(sizeof(float) * (size_t)N * NX * 2), *y1 = hn_malloc(sizeof(float) * (size_t)N);
    for (int i = 0; i < K * NX; i++) x[i] = frand() * 2;
    be_tensor W = {.type = t, .ne = {K, N, NM}, .row_bytes = rb, .mat_bytes = rb * (size_t)N, .data = w};
    be_tensor U = W; /* the same weight, never prepared */
    hn_err e;
    CHECK(be_cpu_prepare_weight(b, &W, 0, &e) == HN_OK);
    CHECKF(W.packed != NULL && W.layout == pk->layout, "%s: not packed", qt_traits(t)->name);
    const void *first = W.packed;
    CHECK(be_cpu_prepare_weight(b, &W, 0, &e) == HN_OK && W.packed == first); /* idempotent */
    for (int n = 1; n <= NX; n += 4) {
        mm(b, &W, 1, x, n, y);
        mm(b, &U, 1, x, n, yu);
        int bad = 0, tail = 0, moved = 0;
        for (int r = 0; r < n; r++) {
            mm(b, &W, 1, x + (size_t)r * K, 1, y1);
            if (memcmp(y1, y + (size_t)r * N, sizeof(float) * (size_t)N)) moved++;
            for (int j = 0; j < N; j++) {
                float a = y[(size_t)r * N + j], c = yu[(size_t)r * N + j];
                if (!(fabsf(a - c) <= 1e-3f * (1.0f + fabsf(c)))) bad++;
                if (j >= N / R * R && memcmp(&a, &c, sizeof a)) tail++; /* rows past the groups: the same kernels */
            }
        }
        CHECKF(bad == 0, "%s n=%d: %d packed results off the unpacked ones", qt_traits(t)->name, n, bad);
        CHECKF(tail == 0, "%s n=%d: %d tail rows differ", qt_traits(t)->name, n, tail);
        CHECKF(moved == 0, "%s n=%d: %d rows differ alone and in the batch", qt_traits(t)->name, n, moved);
    }
    /* multi: the packed weight next to the unpacked one in one dispatch */
    const be_tensor *ws[2] = {&W, &U};
    be_tensor X = be_cpu_host(QT_F32, x), Y = be_cpu_host(QT_F32, y), YU = be_cpu_host(QT_F32, yu);
    be_tensor *ys[2] = {&Y, &YU};
    b->ops->matmul_multi(b, 2, ws, &X, 9, ys);
    int bad = 0;
    for (int i = 0; i < 9 * N; i++)
        if (!(fabsf(y[i] - yu[i]) <= 1e-3f * (1.0f + fabsf(yu[i])))) bad++;
    CHECKF(bad == 0, "%s multi: %d results differ", qt_traits(t)->name, bad);
    /* moe: 7 rows, 2 experts each, shared input */
    int32_t ids[14];
    for (int i = 0; i < 14; i++) ids[i] = (i * 5 + i / 3) % NM;
    moe_mm(b, &W, x, true, 7, 2, ids, y);
    moe_mm(b, &U, x, true, 7, 2, ids, yu);
    bad = 0;
    for (int i = 0; i < 14 * N; i++)
        if (!(fabsf(y[i] - yu[i]) <= 1e-3f * (1.0f + fabsf(yu[i])))) bad++;
    CHECKF(bad == 0, "%s moe: %d results differ", qt_traits(t)->name, bad);
    /* the tuner's switch: -1 runs the GGUF rows (bit for bit the unpacked weight) */
    be_cpu_mm_params mp = {.pack = -1};
    be_cpu_set_mm_params(b, t, &mp);
    mm(b, &W, 0, x, 5, y);
    mm(b, &U, 0, x, 5, yu);
    CHECK(!memcmp(y, yu, sizeof(float) * 5 * (size_t)N));
    /* each variant of the layout by number (the Q4_0/Q8_0 ones round alike) */
    const cpu_pack_kernel *v[16];
    int nv = cpu_pack_variants(t, v, 16);
    be_cpu_set_mm_params(b, t, NULL);
    mm(b, &W, 0, x, 5, yu);
    for (int i = 0; i < nv && i < 16; i++) {
        if (v[i]->layout != W.layout) continue;
        mp = (be_cpu_mm_params){.pack = i + 1};
        be_cpu_set_mm_params(b, t, &mp);
        mm(b, &W, 0, x, 5, y);
        bad = 0;
        for (int j = 0; j < 5 * N; j++)
            if (!(fabsf(y[j] - yu[j]) <= 1e-3f * (1.0f + fabsf(yu[j])))) bad++;
        CHECKF(bad == 0, "%s via params: %d results differ", v[i]->name, bad);
        if ((t == QT_Q4_0 || t == QT_Q8_0) && v[i]->prep)
            CHECKF(!memcmp(y, yu, sizeof(float) * 5 * (size_t)N), "%s via params: not bit-identical", v[i]->name);
    }
    be_cpu_set_mm_params(b, t, NULL);
    hn_free(w);
    hn_free(x);
    hn_free(y);
    hn_free(yu);
    hn_free(y1);
}

static void test_backend(void) {
    pool *p;
    be_backend *b;
    hn_err e;
    if (pool_create(2, &p, &e) || be_cpu_create(p, &b, &e)) {
        CHECKF(0, "backend: %s", e.msg);
        return;
    }
    be_limits lim = {.max_rows = 64, .max_k = 256, .max_head_dim = 64, .max_group = 1, .max_experts = 2};
    CHECK(b->ops->reserve(b, &lim, &e) == HN_OK);
    CHECK(b->ops->version == BE_OPS_VERSION && b->ops->weight_load != NULL);
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) test_backend_type(b, k_types[i]);
    /* a type without packed kernels stays as it is */
    float wf[256 * 4] = {0};
    be_tensor F = {.type = QT_F32, .ne = {256, 4, 1}, .row_bytes = 1024, .mat_bytes = 4096, .data = wf};
    CHECK(be_cpu_prepare_weight(b, &F, 0, &e) == HN_OK && F.packed == NULL && F.layout == 0);
    be_free(b);
    pool_free(p);
    /* HONE_NO_PACK=1 leaves weights unpacked */
    setenv("HONE_NO_PACK", "1", 1);
    if (pool_create(1, &p, &e) || be_cpu_create(p, &b, &e)) return;
    CHECK(b->ops->reserve(b, &lim, &e) == HN_OK);
    uint8_t w[18 * 8 * 32];
    make_rows(QT_Q4_0, MODE_QUANT, 256, 32, w);
    be_tensor W = {.type = QT_Q4_0, .ne = {256, 32, 1}, .row_bytes = 144, .mat_bytes = 144 * 32, .data = w};
    CHECK(be_cpu_prepare_weight(b, &W, 0, &e) == HN_OK && W.packed == NULL);
    be_free(b);
    pool_free(p);
    unsetenv("HONE_NO_PACK");
}

/* ---- model level ---- */

typedef struct {
    model *m;
    kv_cache *kv;
    kv_seq seq;
    int n_vocab;
} rig;

static int rig_open(rig *r, const char *path, bool pack) {
    hn_err e;
    memset(r, 0, sizeof *r);
    if (!pack) setenv("HONE_NO_PACK", "1", 1);
    model_params p = {.n_threads = 2, .max_batch = 32};
    hn_status st = model_load(path, &p, &r->m, &e);
    unsetenv("HONE_NO_PACK");
    if (st) {
        fprintf(stderr, "load %s: %s\n", path, e.msg);
        return 0;
    }
    kv_config c = model_kv_config(r->m, 16, 16);
    if (kv_create(&c, &r->kv, &e) || kv_seq_init(&r->seq, r->kv, 128, &e)) {
        model_free(r->m);
        return 0;
    }
    r->n_vocab = model_hp(r->m)->n_vocab;
    return 1;
}

static void rig_close(rig *r) {
    kv_seq_free(&r->seq, r->kv);
    kv_free(r->kv);
    model_free(r->m);
}

/* Prefills tok[0..n) then decodes greedily `steps` tokens; returns the prefill's last logits in lg, the tokens in out. */
static int run_greedy(rig *r, const int32_t *tok, int n, int steps, float *lg, int32_t *out) {
    hn_err e;
    int32_t pos[32], sid[32] = {0};
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_seq *seqs[1] = {&r->seq};
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    if (model_forward(r->m, r->kv, &b, lg, 1, &e)) return 0;
    float *tmp = malloc(sizeof(float) * (size_t)r->n_vocab);
    const float *cur = lg;
    for (int s = 0; s < steps; s++) {
        int32_t best = 0;
        for (int i = 1; i < r->n_vocab; i++)
            if (cur[i] > cur[best]) best = i;
        out[s] = best;
        int32_t p1 = n + s;
        model_batch d = {.n_tokens = 1, .token = &out[s], .pos = &p1, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
        if (model_forward(r->m, r->kv, &d, tmp, 1, &e)) {
            free(tmp);
            return 0;
        }
        cur = tmp;
    }
    free(tmp);
    return 1;
}

static void test_model(const char *file) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    rig a, u;
    if (!rig_open(&a, path, true)) {
        CHECKF(0, "%s: cannot load", file);
        return;
    }
    if (!rig_open(&u, path, false)) {
        CHECKF(0, "%s: cannot load unpacked", file);
        rig_close(&a);
        return;
    }
    /* every matmul weight of the layers is packed in one, none in the other */
    const model_layer *L = &a.m->layers[0];
    CHECKF(L->wq->packed && L->wo->packed && ((L->w_down && L->w_down->packed) || (L->down_exps && L->down_exps->packed)),
           "%s: weights not packed", file);
    CHECK(!u.m->layers[0].wq->packed && !u.m->output->packed);
    static const int32_t prompt[] = {1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889};
    const int n = (int)(sizeof prompt / sizeof prompt[0]), steps = sanitized() ? 3 : 8;
    int32_t ta[8], tu[8], tok[16];
    for (int i = 0; i < n; i++) tok[i] = prompt[i] % a.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)a.n_vocab), *lu = malloc(sizeof(float) * (size_t)a.n_vocab);
    int ok = run_greedy(&a, tok, n, steps, la, ta) && run_greedy(&u, tok, n, steps, lu, tu);
    CHECKF(ok, "%s: forward failed", file);
    if (ok) {
        double d = 0, mx = 0;
        for (int i = 0; i < a.n_vocab; i++) {
            d = fmax(d, fabs((double)la[i] - lu[i]));
            mx = fmax(mx, fabs((double)lu[i]));
        }
        CHECKF(d <= 2e-2 * (1.0 + mx), "%s: packed logits differ from unpacked by %g (max %g)", file, d, mx);
        CHECKF(!memcmp(ta, tu, sizeof(int32_t) * (size_t)steps), "%s: greedy tokens differ packed vs unpacked", file);
    }
    free(la);
    free(lu);
    rig_close(&a);
    rig_close(&u);
}

#endif /* HN_TEST_KERNELS_ONLY */

int main(void) {
    test_kernels();
#ifndef HN_TEST_KERNELS_ONLY
    test_backend();
    test_model("llama-2k-q4_0.gguf");
    test_model("qwen3-2k-q8_0.gguf");
    if (!sanitized()) {
        test_model("qwen2-2k-q8_0.gguf");
        test_model("qwen3moe-2k-q8_0.gguf");
    }
#endif
    TEST_DONE();
}
