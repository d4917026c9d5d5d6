/* cpu_matmul.c: matmul of f32 activations with a quantized weight, dense and
 * grouped by expert (MoE). This is the hot loop of the forward pass.
 *
 * One core serves both: a list of groups, each "matrix e of W times these
 * activation rows into those output rows". Dense matmul is one group over
 * every row. Work:
 *   1. convert each activation row once into the dot kernel's act_type
 *      (threaded over rows when there are several);
 *   2. split every group's weight rows into chunks and let threads take chunks
 *      from an atomic counter (balances load when another process steals a
 *      core). Inside a chunk, activation rows are taken in tiles so a tile
 *      stays in cache while the chunk's weight rows stream past it.
 * Decode (one row) reads each weight row exactly once, spread over threads.
 * Without a dot kernel for the type, each weight row is dequantized with the
 * reference to_float into a per-thread buffer and dotted in f32.
 *
 * Weights repacked at load (be_cpu_prepare_weight, pack.h) run their packed
 * kernel instead: chunks are whole groups of R rows, one call per group and
 * tile of up to 8 activation rows writes R outputs per activation row; rows
 * past the last full group run the kernels above on the GGUF rows. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../core/alloc.h"
#include "../../quant/quant.h"
#include "cpu_int.h"
#include "dot.h"
#include "gemm.h"
#include "pack.h"

#define TILE_ROWS 16
/* activation rows per tile when a gemm kernel runs (the tile's converted rows
 * stay in L2 while the chunk's weight rows stream past; calls take 8 at a time) */
#define GEMM_TILE_ROWS 64
/* multiply-adds below which a matmul runs on the caller: a dispatch costs a few
 * microseconds, more when the OS has to wake a worker */
#define MM_MIN_PARALLEL (1 << 17)

typedef struct mm_group {
    const be_tensor *w;
    const cpu_dot_kernel *kern; /* NULL: dequantize + f32 */
    const cpu_gemm_kernel *gemm; /* multi-row kernel reading kern's act_type, or NULL */
    const cpu_pack_kernel *pk;   /* packed kernel over w->packed (reads kern's act_type), or NULL */
    int64_t n_packed;            /* rows in whole groups of pk (the rest run gemm/kern on w->data) */
    int mat;              /* matrix (expert) index */
    int n;                /* activation rows in this group */
    const int32_t *in;    /* their indices into the converted rows */
    const int32_t *out;   /* their output rows in y */
    float *y;             /* output rows of w->ne[1] floats */
    const be_cpu_mm_params *mp; /* the tuned parameters for this weight and call size (NULL: defaults) */
    int tile;             /* activation rows per tile */
    int64_t chunk_rows;   /* weight rows per chunk */
    int nth_use;          /* threads that take part (the type's tuned count) */
    int first_chunk;      /* chunk ids [first_chunk, first_chunk + n_chunks) */
} mm_group;

typedef struct mm_task {
    cpu_be *cb;
    const cpu_dot_kernel *kern;  /* the activation converter (every group's act_type is the same) */
    int64_t k;                   /* row length shared by all groups */
    const float *x;              /* f32 input rows (k floats each) */
    int n_x;
    const unsigned char *act;    /* converted rows (kern) or x itself */
    size_t act_row;              /* bytes per converted row */
    const cpu_gemm_kernel *prep; /* the kernel whose prep pass runs on every converted row, or NULL */
    const unsigned char *pact;   /* prepped rows */
    size_t pact_row;
    cpu_gemm_prep_fn pprep;      /* the packed kernels' prep pass, or NULL */
    const unsigned char *ppact;  /* rows prepped by it */
    size_t ppact_row;
    const mm_group *groups;
    int n_groups;
    int nth_use;                 /* threads that take part in phase 2 */
    int total_chunks;
    _Atomic int next;
} mm_task;

/* Sizes the scratch for cb->lim; a second call with the same row count, row
 * length and expert count keeps what there is (allocates nothing). */
hn_status cpu_matmul_reserve(cpu_be *cb, hn_err *err) {
    const be_limits *l = &cb->lim;
    size_t rows = (size_t)(l->max_rows > 0 ? l->max_rows : 1);
    size_t k = (size_t)(l->max_k > 0 ? l->max_k : 1);
    size_t ne = (size_t)(l->max_experts > 0 ? l->max_experts : 1);
    if (cb->act && rows == cb->mm_rows && k == cb->mm_k && ne == cb->mm_ne) return HN_OK;
    cpu_matmul_free(cb);
    /* 4 bytes per element bounds every act_type's row size (q8_0: 34/32, q8_K: 292/256, f16: 2) */
    cb->act_cap = rows * 4 * k + 64;
    cb->act = hn_pages_alloc(cb->act_cap);
    cb->prep = hn_pages_alloc(cb->act_cap);
    cb->pprep = hn_pages_alloc(cb->act_cap);
    cb->deq = hn_malloc(sizeof(float) * (size_t)cb->nth * k);
    cb->ident = hn_malloc(sizeof(int32_t) * rows);
    cb->order_in = hn_malloc(sizeof(int32_t) * rows);
    cb->order_out = hn_malloc(sizeof(int32_t) * rows);
    cb->counts = hn_malloc(sizeof(int32_t) * (ne + 1));
    cb->groups = hn_malloc(sizeof(mm_group) * ne);
    cb->route = hn_malloc(sizeof(float) * ne);
    if (!cb->act || !cb->prep || !cb->pprep || !cb->deq || !cb->ident || !cb->order_in || !cb->order_out || !cb->counts || !cb->groups ||
        !cb->route) {
        cpu_matmul_free(cb);
        return hn_errf(err, HN_ERR_NOMEM, "cpu backend: cannot allocate matmul scratch (%zu rows x %zu)", rows, k);
    }
    for (size_t i = 0; i < rows; i++) cb->ident[i] = (int32_t)i;
    cb->mm_rows = rows;
    cb->mm_k = k;
    cb->mm_ne = ne;
    cb->mm_bytes = 3 * cb->act_cap + sizeof(float) * (size_t)cb->nth * k + 3 * sizeof(int32_t) * rows +
                   sizeof(int32_t) * (ne + 1) + sizeof(mm_group) * ne + sizeof(float) * ne;
    return HN_OK;
}

void cpu_matmul_free(cpu_be *cb) {
    if (cb->act) hn_pages_free(cb->act, cb->act_cap);
    if (cb->prep) hn_pages_free(cb->prep, cb->act_cap);
    if (cb->pprep) hn_pages_free(cb->pprep, cb->act_cap);
    cb->act = cb->prep = cb->pprep = NULL;
    hn_free(cb->deq);
    hn_free(cb->ident);
    hn_free(cb->order_in);
    hn_free(cb->order_out);
    hn_free(cb->counts);
    hn_free(cb->groups);
    hn_free(cb->route);
    cb->deq = NULL;
    cb->ident = cb->order_in = cb->order_out = cb->counts = NULL;
    cb->groups = NULL;
    cb->route = NULL;
    cb->mm_rows = cb->mm_k = cb->mm_ne = 0;
    cb->mm_bytes = 0;
}

/* phase 1: convert activation rows, shared among the threads that show up */
static void mm_convert(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    mm_task *t = ctx;
    int64_t k = t->k;
    for (;;) {
        int r = pool_take(&t->next, 1, t->n_x);
        if (r >= t->n_x) break;
        unsigned char *row = (unsigned char *)t->act + (size_t)r * t->act_row;
        t->kern->act(t->x + (size_t)r * (size_t)k, row, k);
        if (t->prep) t->prep->prep(k, row, (unsigned char *)t->pact + (size_t)r * t->pact_row);
        if (t->pprep) t->pprep(k, row, (unsigned char *)t->ppact + (size_t)r * t->ppact_row);
    }
}

/* Weight rows [j0, j1) of a group (whole groups of its packed kernel). */
static void mm_rows_packed(const mm_task *t, const mm_group *gr, int64_t j0, int64_t j1) {
    const cpu_pack_kernel *pk = gr->pk;
    const be_tensor *w = gr->w;
    const int64_t k = t->k, n_out = w->ne[1], R = pk->rows;
    const size_t gb = pk->group_bytes(k);
    const unsigned char *pw = (const unsigned char *)w->packed + (size_t)gr->mat * (size_t)(n_out / R) * gb;
    const unsigned char *abase = pk->prep ? t->ppact : t->act;
    const size_t arow = pk->prep ? t->ppact_row : t->act_row;
    const void *ap[CPU_PACK_MAX_NA];
    float s[CPU_PACK_MAX_NA * CPU_PACK_MAX_ROWS];
    float *y = gr->y;
    for (int t0 = 0; t0 < gr->n; t0 += gr->tile) {
        int t1 = t0 + gr->tile < gr->n ? t0 + gr->tile : gr->n;
        for (int64_t j = j0; j < j1; j += R) {
            const void *gp = pw + (size_t)(j / R) * gb;
            for (int r0 = t0; r0 < t1; r0 += CPU_PACK_MAX_NA) {
                int na = t1 - r0 < CPU_PACK_MAX_NA ? t1 - r0 : CPU_PACK_MAX_NA;
                for (int r = 0; r < na; r++) ap[r] = abase + (size_t)gr->in[r0 + r] * arow;
                pk->fn(k, gp, na, ap, s);
                for (int r = 0; r < na; r++)
                    memcpy(y + (size_t)gr->out[r0 + r] * (size_t)n_out + (size_t)j, s + (size_t)r * (size_t)R,
                           sizeof(float) * (size_t)R);
            }
        }
    }
}

/* phase 2: chunks of weight rows against their group's activation rows */
static void mm_dots(void *ctx, int ith, int nth) {
    (void)nth;
    mm_task *t = ctx;
    if (ith >= t->nth_use) return;
    const int64_t k = t->k;
    float *deq = t->cb->deq + (size_t)ith * (size_t)k;
    int g = 0;
    for (;;) {
        int c = pool_take(&t->next, 1, t->total_chunks);
        if (c >= t->total_chunks) break;
        while (g + 1 < t->n_groups && t->groups[g + 1].first_chunk <= c) g++;
        while (g > 0 && t->groups[g].first_chunk > c) g--;
        const mm_group *gr = &t->groups[g];
        const be_tensor *w = gr->w;
        const int64_t n_out = w->ne[1];
        int64_t j0 = (int64_t)(c - gr->first_chunk) * gr->chunk_rows;
        int64_t j1 = j0 + gr->chunk_rows < n_out ? j0 + gr->chunk_rows : n_out;
        if (gr->pk && j0 < gr->n_packed) {
            int64_t jp = j1 < gr->n_packed ? j1 : gr->n_packed;
            mm_rows_packed(t, gr, j0, jp);
            j0 = jp;
            if (j0 >= j1) continue;
        }
        const unsigned char *wm = (const unsigned char *)w->data + (size_t)gr->mat * w->mat_bytes;
        float *y = gr->y;
        if (gr->gemm) {
            cpu_gemm_fn fn = gr->gemm->fn;
            const void *ap[CPU_GEMM_MAX_NA];
            float s[CPU_GEMM_MAX_NA];
            for (int t0 = 0; t0 < gr->n; t0 += gr->tile) {
                int t1 = t0 + gr->tile < gr->n ? t0 + gr->tile : gr->n;
                for (int64_t j = j0; j < j1; j++) {
                    const void *wr = wm + (size_t)j * w->row_bytes;
                    for (int r0 = t0; r0 < t1; r0 += CPU_GEMM_MAX_NA) {
                        int na = t1 - r0 < CPU_GEMM_MAX_NA ? t1 - r0 : CPU_GEMM_MAX_NA;
                        if (gr->gemm->prep)
                            for (int r = 0; r < na; r++) ap[r] = t->pact + (size_t)gr->in[r0 + r] * t->pact_row;
                        else
                            for (int r = 0; r < na; r++) ap[r] = t->act + (size_t)gr->in[r0 + r] * t->act_row;
                        fn(k, wr, na, ap, s);
                        for (int r = 0; r < na; r++) y[(size_t)gr->out[r0 + r] * (size_t)n_out + (size_t)j] = s[r];
                    }
                }
            }
        } else if (gr->kern) {
            cpu_dot_fn dot = gr->kern->dot;
            for (int r0 = 0; r0 < gr->n; r0 += gr->tile) {
                int r1 = r0 + gr->tile < gr->n ? r0 + gr->tile : gr->n;
                for (int64_t j = j0; j < j1; j++) {
                    const void *wr = wm + (size_t)j * w->row_bytes;
                    for (int r = r0; r < r1; r++) {
                        float s;
                        dot(k, &s, wr, t->act + (size_t)gr->in[r] * t->act_row);
                        y[(size_t)gr->out[r] * (size_t)n_out + (size_t)j] = s;
                    }
                }
            }
        } else {
            const qt_type_traits *tr = qt_traits(w->type);
            for (int64_t j = j0; j < j1; j++) {
                const void *wr = wm + (size_t)j * w->row_bytes;
                const float *wf;
                if (w->type == QT_F32) {
                    wf = wr;
                } else {
                    tr->to_float(wr, deq, k);
                    wf = deq;
                }
                for (int r = 0; r < gr->n; r++)
                    y[(size_t)gr->out[r] * (size_t)n_out + (size_t)j] =
                        cpu_dot_f32(wf, t->x + (size_t)gr->in[r] * (size_t)k, k);
            }
        }
    }
}

/* The parameters of a matmul of weight w with n activation rows: the shape's
 * entry with the largest min_rows <= n (single-matrix weights only), else the
 * type's (NULL: none). */
static const be_cpu_mm_params *mm_params(const cpu_be *cb, const be_tensor *w, int n) {
    const cpu_mm_shape *best = NULL;
    for (int i = 0; i < cb->n_mm_shape && w->ne[2] <= 1; i++) {
        const cpu_mm_shape *e = &cb->mm_shape[i];
        if (e->type == w->type && e->k == w->ne[0] && e->n == w->ne[1] && e->min_rows <= n &&
            (!best || e->min_rows > best->min_rows))
            best = e;
    }
    if (best) return &best->p;
    return (int)w->type < QT_TYPE_COUNT ? &cb->mm[w->type] : NULL;
}

/* The kernel a weight's matmul uses (NULL: the dequantize + f32 reference path). */
static const cpu_dot_kernel *mm_kernel(const cpu_be *cb, const be_tensor *w, const be_cpu_mm_params *mp) {
    if (cb->force_ref) return NULL;
    int choice = mp ? mp->kernel : 0;
    if (choice < 0) {
        const cpu_dot_kernel *v[16];
        int nv = cpu_dot_variants(w->type, v, 16);
        if (-choice <= nv && -choice <= 16) return v[-choice - 1];
    }
    return cpu_dot_best(w->type);
}

/* The multi-row kernel for a weight whose dot kernel is kern, for n activation
 * rows (NULL: none; the dot kernel runs): the type's tuned choice, else cpu_gemm_pick. */
static const cpu_gemm_kernel *mm_gemm(const cpu_be *cb, const be_tensor *w, const cpu_dot_kernel *kern, int n,
                                      const be_cpu_mm_params *mp) {
    if (!kern || cb->no_gemm) return NULL;
    int choice = mp ? mp->kernel : 0;
    if (choice < 0 && -choice <= cpu_dot_variants(w->type, NULL, 0)) return NULL;
    const cpu_gemm_kernel *g = NULL;
    if (choice > 0) {
        const cpu_gemm_kernel *v[16];
        int nv = cpu_gemm_variants(w->type, v, 16);
        if (choice <= nv && choice <= 16) g = v[choice - 1];
    }
    if (!g || !cpu_gemm_fits(g, w->ne[0])) g = cpu_gemm_pick_k(w->type, n, w->ne[0]);
    return g && g->act_type == kern->act_type ? g : NULL;
}

/* The packed kernel for a weight whose dot kernel is kern (NULL: run the GGUF
 * rows): the type's tuned variant when it reads the weight's layout, else the
 * fastest that does. */
static const cpu_pack_kernel *mm_pack(const be_tensor *w, const cpu_dot_kernel *kern, const be_cpu_mm_params *mp) {
    if (!w->packed || !kern || (int)w->type >= QT_TYPE_COUNT) return NULL;
    int choice = mp ? mp->pack : 0;
    if (choice < 0) return NULL;
    const cpu_pack_kernel *v[16], *p = NULL;
    int nv = cpu_pack_variants(w->type, v, 16);
    if (nv > 16) nv = 16;
    if (choice > 0 && choice <= nv && v[choice - 1]->layout == w->layout && cpu_pack_fits(v[choice - 1], w->ne[0]))
        p = v[choice - 1];
    for (int i = nv - 1; i >= 0 && !p; i--)
        if (v[i]->layout == w->layout && cpu_pack_fits(v[i], w->ne[0])) p = v[i];
    return p && p->act_type == kern->act_type ? p : NULL;
}

/* A group of weight w over n activation rows with the kernels of its parameters. */
static mm_group mm_group_for(const cpu_be *cb, const be_tensor *w, int n) {
    const be_cpu_mm_params *mp = mm_params(cb, w, n);
    const cpu_dot_kernel *kern = mm_kernel(cb, w, mp);
    mm_group g = {.w = w, .kern = kern, .gemm = mm_gemm(cb, w, kern, n, mp), .pk = mm_pack(w, kern, mp), .mp = mp,
                  .n = n};
    if (g.pk) {
        g.n_packed = w->ne[1] / g.pk->rows * g.pk->rows;
        if (g.n_packed == w->ne[1]) g.gemm = NULL; /* no tail rows: keep its prep pass from running */
    }
    return g;
}

void be_cpu_set_mm_params(be_backend *b, qt_type t, const be_cpu_mm_params *p) {
    cpu_be *cb = cpu_of(b);
    if ((int)t < 0 || (int)t >= QT_TYPE_COUNT) return;
    if (p)
        cb->mm[t] = *p;
    else
        memset(&cb->mm[t], 0, sizeof cb->mm[t]);
}

bool be_cpu_set_mm_params_shape(be_backend *b, qt_type t, int64_t k, int64_t n, int min_rows,
                                const be_cpu_mm_params *p) {
    cpu_be *cb = cpu_of(b);
    if ((int)t < 0 || (int)t >= QT_TYPE_COUNT || k < 1 || n < 1 || min_rows < 1) return false;
    int i = 0;
    while (i < cb->n_mm_shape && !(cb->mm_shape[i].type == t && cb->mm_shape[i].k == k && cb->mm_shape[i].n == n &&
                                   cb->mm_shape[i].min_rows == min_rows))
        i++;
    if (!p) {
        if (i < cb->n_mm_shape) cb->mm_shape[i] = cb->mm_shape[--cb->n_mm_shape];
        return true;
    }
    if (i == cb->n_mm_shape) {
        if (i == BE_CPU_MM_SHAPES) return false;
        cb->n_mm_shape++;
    }
    cb->mm_shape[i] = (cpu_mm_shape){.type = t, .k = k, .n = n, .min_rows = min_rows, .p = *p};
    return true;
}

void be_cpu_clear_mm_params_shape(be_backend *b) { cpu_of(b)->n_mm_shape = 0; }

/* Runs groups over the pool: converts the n_x input rows once (every group's
 * kernel must share one act_type, or all be NULL), then the dots of all groups
 * in one dispatch. */
static void mm_run(cpu_be *cb, const float *x, int n_x, mm_group *groups, int n_groups) {
    mm_task t;
    memset(&t, 0, sizeof t);
    t.cb = cb;
    t.x = x;
    t.n_x = n_x;
    t.groups = groups;
    t.n_groups = n_groups;
    t.kern = groups[0].kern;
    t.k = groups[0].w->ne[0];
    const int64_t k = t.k;
    if (t.kern && t.kern->act_type == QT_F32) {
        t.act = (const unsigned char *)x;  /* nothing to convert */
        t.act_row = sizeof(float) * (size_t)k;
    } else if (t.kern) {
        t.act = cb->act;
        t.act_row = qt_row_size(t.kern->act_type, k);
        /* one prep pass per run: groups whose kernel wants another fall back to theirs without one */
        for (int g = 0; g < n_groups; g++) {
            const cpu_gemm_kernel *gk = groups[g].gemm;
            if (!gk || !gk->prep) continue;
            if (!t.prep) t.prep = gk;
            else if (gk->prep != t.prep->prep) groups[g].gemm = NULL;
        }
        if (t.prep) {
            t.pact = cb->prep;
            t.pact_row = t.prep->prep_bytes(k);
        }
        /* likewise one packed kernels' prep (callers split runs so that they agree) */
        const cpu_pack_kernel *pp = NULL;
        for (int g = 0; g < n_groups; g++) {
            const cpu_pack_kernel *pk = groups[g].pk;
            if (!pk || !pk->prep) continue;
            if (!pp) pp = pk;
            else if (pk->prep != pp->prep) groups[g].pk = NULL;
        }
        if (pp) {
            t.pprep = pp->prep;
            t.ppact = cb->pprep;
            t.ppact_row = pp->prep_bytes(k);
        }
        atomic_store(&t.next, 0);
        if (n_x * (int64_t)k < 65536 || cb->nth == 1)
            mm_convert(&t, 0, 1);
        else
            pool_run_shared(cb->pool, mm_convert, &t);
    }
    /* chunks: about 4 per thread per group when decoding, smaller as rows grow
     * (or the tuned count of the group's weight); threads: all, or the first
     * group's tuned count; tiles: the tuned rows, else the kernel's default */
    int c = 0;
    int64_t work = 0;
    const be_cpu_mm_params *mp0 = groups[0].mp;
    int nth_use = mp0 && mp0->threads > 0 && mp0->threads < cb->nth ? mp0->threads : cb->nth;
    t.nth_use = nth_use;
    for (int g = 0; g < n_groups; g++) {
        const be_cpu_mm_params *mp = groups[g].mp;
        int64_t n_out = groups[g].w->ne[1];
        int cpt = mp && mp->chunks > 0 ? mp->chunks : (groups[g].n > 64 ? 8 : 4);
        groups[g].tile = mp && mp->tile > 0 ? mp->tile : groups[g].gemm || groups[g].pk ? GEMM_TILE_ROWS : TILE_ROWS;
        int64_t per = n_out / ((int64_t)nth_use * cpt);
        if (per < 4) per = 4;
        if (groups[g].pk) {
            /* whole groups of the packed kernel */
            int64_t R = groups[g].pk->rows;
            per = (per + R - 1) / R * R;
        }
        if (per > n_out) per = n_out;
        groups[g].chunk_rows = per;
        groups[g].first_chunk = c;
        c += (int)((n_out + per - 1) / per);
        work += (int64_t)groups[g].n * n_out * k;
    }
    t.total_chunks = c;
    atomic_store(&t.next, 0);
    if (nth_use == 1 || work < MM_MIN_PARALLEL)
        mm_dots(&t, 0, 1);
    else
        pool_run_shared(cb->pool, mm_dots, &t);
}

void cpu_op_matmul(be_backend *b, const be_tensor *w, int mat, const be_tensor *xt, int n, be_tensor *yt) {
    cpu_be *cb = cpu_of(b);
    if (!cpu_rows_ok(cb, n, "matmul")) return;
    mm_group g = mm_group_for(cb, w, n);
    g.mat = mat;
    g.in = g.out = cb->ident;
    g.y = yt->data;
    mm_run(cb, xt->data, n, &g, 1);
}

void cpu_op_matmul_multi(be_backend *b, int n_w, const be_tensor *const *ws, const be_tensor *xt, int n,
                         be_tensor *const *yts) {
    cpu_be *cb = cpu_of(b);
    if (!cpu_rows_ok(cb, n, "matmul_multi")) return;
    const float *x = xt->data;
    mm_group g[BE_MULTI_MAX];
    int at = 0;
    while (at < n_w) {
        /* take the longest run of weights that can share converted (and prepped) activations */
        int m = 0;
        cpu_gemm_prep_fn pp = NULL;
        while (at + m < n_w && m < BE_MULTI_MAX) {
            mm_group gm = mm_group_for(cb, ws[at + m], n);
            const cpu_dot_kernel *km = gm.kern, *k0 = m > 0 ? g[0].kern : km;
            if ((km == NULL) != (k0 == NULL) || (km && km->act_type != k0->act_type)) break;
            if (gm.pk && gm.pk->prep) {
                if (pp && gm.pk->prep != pp) break;
                pp = gm.pk->prep;
            }
            gm.in = gm.out = cb->ident;
            gm.y = yts[at + m]->data;
            g[m++] = gm;
        }
        mm_run(cb, x, n, g, m);
        at += m;
    }
}

void cpu_op_moe_matmul(be_backend *b, const be_tensor *w, const be_tensor *xt, bool x_shared, int n, int k,
                       const be_tensor *idt, be_tensor *yt) {
    cpu_be *cb = cpu_of(b);
    const float *x = xt->data;
    const int32_t *ids = idt->data;
    float *y = yt->data;
    int n_exp = (int)w->ne[2];
    int total = n * k;
    if (!cpu_rows_ok(cb, total, "moe_matmul")) return;
    /* counting sort of the (row, slot) items by expert */
    int32_t *cnt = cb->counts;
    memset(cnt, 0, sizeof(int32_t) * (size_t)(n_exp + 1));
    for (int i = 0; i < total; i++) cnt[ids[i] + 1]++;
    for (int e = 0; e < n_exp; e++) cnt[e + 1] += cnt[e];
    mm_group *groups = cb->groups;
    int n_groups = 0;
    for (int e = 0; e < n_exp; e++) {
        if (cnt[e + 1] == cnt[e]) continue;
        mm_group *g = &groups[n_groups++];
        *g = mm_group_for(cb, w, cnt[e + 1] - cnt[e]);
        g->y = y;
        g->mat = e;
        g->in = cb->order_in + cnt[e];
        g->out = cb->order_out + cnt[e];
    }
    for (int i = 0; i < total; i++) {
        int32_t at = cnt[ids[i]]++;
        cb->order_in[at] = x_shared ? i / k : i;
        cb->order_out[at] = i;
    }
    if (n_groups > 0) mm_run(cb, x, x_shared ? n : total, groups, n_groups);
}

/* ---- load-time repacking ---- */

typedef struct {
    const cpu_pack_kernel *pk;
    const be_tensor *w;
    unsigned char *dst;
    int64_t n_groups; /* per matrix */
    int64_t total;    /* n_groups x matrices */
    bool drop;        /* give source pages back as they are packed (BE_W_DROP_SOURCE) */
    _Atomic int64_t next;
} pack_task;

static void drop_pages(const void *p, size_t n);

static void pack_worker(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    pack_task *t = ctx;
    const be_tensor *w = t->w;
    const int64_t k = w->ne[0], R = t->pk->rows;
    const size_t gb = t->pk->group_bytes(k);
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&t->next, 16, memory_order_relaxed);
        if (i >= t->total) break;
        for (int64_t e = i; e < i + 16 && e < t->total; e++) {
            int64_t mat = e / t->n_groups, g = e % t->n_groups;
            const unsigned char *src =
                (const unsigned char *)w->data + (size_t)mat * w->mat_bytes + (size_t)(g * R) * w->row_bytes;
            t->pk->pack(k, src, w->row_bytes, t->dst + (size_t)e * gb);
            /* the source's whole pages go as soon as they are copied, so packing a
             * large weight never holds it twice (pages shared with a neighbouring
             * group fault back in if that group is still to come) */
            if (t->drop) drop_pages(src, (size_t)R * w->row_bytes);
        }
    }
}

/* Gives the whole pages inside [p, p + n) of a read-only file mapping back to the OS. */
static void drop_pages(const void *p, size_t n) {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)ps - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

hn_status be_cpu_prepare_weight(be_backend *b, be_tensor *w, unsigned flags, hn_err *err) {
    cpu_be *cb = cpu_of(b);
    if (cb->no_pack || w->packed || !w->data || w->ne[0] <= 0 || w->ne[1] <= 0 || w->ne[2] <= 0) return HN_OK;
    const cpu_pack_kernel *pk = cpu_pack_best(w->type, w->ne[0]);
    if (!pk || pk->rows > CPU_PACK_MAX_ROWS || w->ne[1] < pk->rows) return HN_OK;
    const int64_t ng = w->ne[1] / pk->rows;
    const size_t bytes = pk->group_bytes(w->ne[0]) * (size_t)ng * (size_t)w->ne[2];
    if (cb->n_packs == cb->cap_packs) {
        int cap = cb->cap_packs ? 2 * cb->cap_packs : 64;
        void *np = hn_realloc(cb->packs, sizeof *cb->packs * (size_t)cap);
        if (!np) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: out of memory");
        cb->packs = np;
        cb->cap_packs = cap;
    }
    unsigned char *dst = hn_pages_alloc_huge(bytes);
    if (!dst) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes for a repacked weight", bytes);
    pack_task t = {.pk = pk, .w = w, .dst = dst, .n_groups = ng, .total = ng * w->ne[2],
                   .drop = (flags & BE_W_DROP_SOURCE) != 0};
    atomic_store(&t.next, 0);
    if (cb->nth == 1 || t.total < 64)
        pack_worker(&t, 0, 1);
    else
        pool_run_shared(cb->pool, pack_worker, &t);
    cb->packs[cb->n_packs++] = (struct cpu_packed){dst, bytes};
    if (flags & BE_W_DROP_SOURCE)
        for (int64_t m = 0; m < w->ne[2]; m++)
            drop_pages((const unsigned char *)w->data + (size_t)m * w->mat_bytes, (size_t)(ng * pk->rows) * w->row_bytes);
    w->packed = dst;
    w->layout = pk->layout;
    return HN_OK;
}

void cpu_packs_free(cpu_be *cb) {
    for (int i = 0; i < cb->n_packs; i++) hn_pages_free(cb->packs[i].p, cb->packs[i].bytes);
    hn_free(cb->packs);
    cb->packs = NULL;
    cb->n_packs = cb->cap_packs = 0;
}
