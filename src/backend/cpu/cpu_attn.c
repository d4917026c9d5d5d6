/* cpu_attn.c: attention over the paged KV cache (flash style), the KV store,
 * and the portable reference of every attention kernel.
 *
 * Work split. Query tokens are grouped into tiles: runs of consecutive
 * tokens of one sequence at consecutive positions, at most
 * CPU_ATTN_TILE_ROWS query rows (tokens x heads of a group) per kv head. A
 * work item is one tile over one range of positions, for every kv head, so
 * the item streams each block's K and V of the layer (contiguous in the
 * cache) once, and the rows of the tile share those loads from cache
 * (prefill at depth). When there are fewer tiles than threads can use
 * (decode), a tile's positions are split into segments, each item keeping
 * its partial max, sum and accumulator in a slot; the caller merges the
 * slots afterwards (flash decoding). Tokens are grouped, segments sized and
 * items handed out dynamically, so both threads stream KV whatever the batch.
 *
 * Inside an item positions go in chunks of up to CPU_ATTN_SCORE_CAP (whole
 * 16-position blocks), one online-softmax step per query row and chunk
 * (rescale the accumulator by exp(old max - new max) once per chunk). Each
 * token sees only its own valid range (causal, sliding window).
 *
 * Decode (one token per tile), f32/f16 caches read in place: per chunk, the
 * scores of every query head (one kernel call over all the chunk's blocks;
 * the heads sweep each K row front to back, which keeps the hardware
 * prefetchers streaming: walking one kv head's slice of every row at a time
 * was 1.6x slower), then the weighted sum of the V rows (a pair of heads of
 * one kv head in registers while eight V rows stream past, V read front to
 * back likewise); nothing is computed for masked positions.
 *
 * Prefill (tiles of several tokens, kernel sets with tile kernels): per
 * chunk and kv head, the head's rows of the chunk converted to f32 once
 * (dequantized for quantized caches), then register-tiled kernels for all
 * the tile's query rows (4 rows x 4 K rows per score tile, 4 rows x 64 dims
 * of accumulators per V tile); scores outside a row's range get weight 0.
 * The next chunk is prefetched in address order meanwhile. Otherwise (the
 * AVX2 set, quantized caches in decode) one kv head at a time, its rows
 * dequantized into per-thread scratch where needed.
 *
 * Kernels (scores, weighted sum, exp) come in sets: AVX-512 (cpu_attn_avx512.c),
 * AVX2 (cpu_attn_avx2.c), NEON (cpu_attn_neon.c) and the portable reference here; the fastest set the
 * CPU has whose head_dim rule fits is used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/alloc.h"
#include "../../quant/quant.h"
#include "cpu_int.h"
#include "dot.h"

/* ---- portable kernels: the reference ---- */

static float dot_h(const float *a, const uint16_t *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * qt_f16_to_f32(b[i + j]);
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) t += a[i] * qt_f16_to_f32(b[i]);
    return t;
}

static void scores_f32_ref(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                           float scale, float *s, int ss) {
    for (int r = 0; r < nq; r++)
        for (int i = 0; i < np; i++)
            s[(size_t)r * (size_t)ss + (size_t)i] =
                cpu_dot_f32(q + (size_t)r * qstride, (const float *)cpu_attn_row(k, i) + (size_t)(r / group) * (size_t)hd,
                            hd) * scale;
}

static void scores_f16_ref(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                           float scale, float *s, int ss) {
    for (int r = 0; r < nq; r++)
        for (int i = 0; i < np; i++)
            s[(size_t)r * (size_t)ss + (size_t)i] =
                dot_h(q + (size_t)r * qstride, (const uint16_t *)cpu_attn_row(k, i) + (size_t)(r / group) * (size_t)hd,
                      hd) * scale;
}

static void wsum_f32_ref(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np) {
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < np; i++) {
            float c = w[(size_t)h * (size_t)ws + (size_t)i];
            const float *x = (const float *)cpu_attn_row(v, i) + (size_t)(h / group) * (size_t)hd;
            float *a = acc + (size_t)h * (size_t)hd;
            for (int d = 0; d < hd; d++) a[d] += c * x[d];
        }
}

static void wsum_f16_ref(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np) {
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < np; i++) {
            float c = w[(size_t)h * (size_t)ws + (size_t)i];
            const uint16_t *x = (const uint16_t *)cpu_attn_row(v, i) + (size_t)(h / group) * (size_t)hd;
            float *a = acc + (size_t)h * (size_t)hd;
            for (int d = 0; d < hd; d++) a[d] += c * qt_f16_to_f32(x[d]);
        }
}

static void scores_tile_f32_ref(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np, float scale,
                                float *s, int ss) {
    for (int r = 0; r < nq; r++)
        for (int i = 0; i < np; i++)
            s[(size_t)r * (size_t)ss + (size_t)i] = cpu_dot_f32(q[r], (const float *)cpu_attn_row(k, i), hd) * scale;
}

static void scores_tile_f16_ref(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np, float scale,
                                float *s, int ss) {
    for (int r = 0; r < nq; r++)
        for (int i = 0; i < np; i++)
            s[(size_t)r * (size_t)ss + (size_t)i] = dot_h(q[r], (const uint16_t *)cpu_attn_row(k, i), hd) * scale;
}

static void wsum_tile_f32_ref(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                              int np) {
    for (int r = 0; r < nq; r++) wsum_f32_ref(acc[r], 1, hd, 1, w + (size_t)r * (size_t)ws, ws, v, np);
}

static void wsum_tile_f16_ref(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                              int np) {
    for (int r = 0; r < nq; r++) wsum_f16_ref(acc[r], 1, hd, 1, w + (size_t)r * (size_t)ws, ws, v, np);
}

static float exp_sub_ref(float *s, int n, float mx) {
    float sum = 0;
    for (int i = 0; i < n; i++) {
        s[i] = expf(s[i] - mx);
        sum += s[i];
    }
    return sum;
}

static void softmax_ref(float *s, int n, float *m, float *l, float *acc, int hd) {
    float mx = *m;
    for (int i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    float corr = expf(*m - mx); /* 0 on the first chunk (m = -inf) */
    if (corr != 1.0f) {
        for (int d = 0; d < hd; d++) acc[d] *= corr;
        *l *= corr;
    }
    *m = mx;
    *l += exp_sub_ref(s, n, mx);
}

static void to_f16_ref(const float *x, uint16_t *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = qt_f32_to_f16(x[i]);
}

static const cpu_attn_kernels k_ref = {"portable",
                                       1,
                                       {scores_f32_ref, scores_f16_ref},
                                       {wsum_f32_ref, wsum_f16_ref},
                                       exp_sub_ref,
                                       {scores_tile_f32_ref, scores_tile_f16_ref},
                                       {wsum_tile_f32_ref, wsum_tile_f16_ref},
                                       softmax_ref};
#if defined(__x86_64__) || defined(__i386__)
static const cpu_attn_kernels k_avx2 = {"avx2",
                                        8,
                                        {cpu_attn_scores_f32_avx2, cpu_attn_scores_f16_avx2},
                                        {cpu_attn_wsum_f32_avx2, cpu_attn_wsum_f16_avx2},
                                        cpu_vec_exp_sub_avx2,
                                        {NULL, NULL},
                                        {NULL, NULL},
                                        cpu_attn_softmax_avx2};
static const cpu_attn_kernels k_avx512 = {"avx512",
                                          16,
                                          {cpu_attn_scores_f32_avx512, cpu_attn_scores_f16_avx512},
                                          {cpu_attn_wsum_f32_avx512, cpu_attn_wsum_f16_avx512},
                                          cpu_vec_exp_sub_avx512,
                                          {cpu_attn_scores_tile_f32_avx512, cpu_attn_scores_tile_f16_avx512},
                                          {cpu_attn_wsum_tile_f32_avx512, cpu_attn_wsum_tile_f16_avx512},
                                          cpu_attn_softmax_avx512};
#endif
#if defined(__aarch64__)
static const cpu_attn_kernels k_neon = {"neon",
                                        4,
                                        {cpu_attn_scores_f32_neon, cpu_attn_scores_f16_neon},
                                        {cpu_attn_wsum_f32_neon, cpu_attn_wsum_f16_neon},
                                        cpu_vec_exp_sub_neon,
                                        {cpu_attn_scores_tile_f32_neon, cpu_attn_scores_tile_f16_neon},
                                        {cpu_attn_wsum_tile_f32_neon, cpu_attn_wsum_tile_f16_neon},
                                        cpu_attn_softmax_neon};
#endif

int cpu_attn_variants(const cpu_attn_kernels **out, int cap) {
    int n = 0;
#if defined(__x86_64__) || defined(__i386__)
    const cpu_features *f = cpu_dot_features();
    if (f->avx512f && f->avx512bw && f->avx2 && f->fma && f->f16c && n < cap) out[n++] = &k_avx512;
    if (f->avx2 && f->fma && f->f16c && n < cap) out[n++] = &k_avx2;
#endif
#if defined(__aarch64__)
    if (cpu_dot_features()->neon && n < cap) out[n++] = &k_neon;
#endif
    if (n < cap) out[n++] = &k_ref;
    return n;
}

void cpu_attn_select(cpu_be *cb) {
    const cpu_attn_kernels *v[3];
    int n = cpu_attn_variants(v, 3);
    cb->n_ak = 0;
    for (int i = 0; i < n; i++)
        if (!cb->force_ref || v[i] == &k_ref) cb->ak[cb->n_ak++] = v[i];
    cb->attn_force = -1;
    const char *e = getenv("HONE_ATTN_KERNEL");
    if (e && *e)
        for (int i = 0; i < cb->n_ak; i++)
            if (!strcmp(cb->ak[i]->name, e)) cb->attn_force = i;
    cb->to_f16 = to_f16_ref;
#if defined(__x86_64__) || defined(__i386__)
    if (!cb->force_ref && cpu_dot_features()->avx2 && cpu_dot_features()->f16c) cb->to_f16 = cpu_attn_to_f16_avx2;
#elif defined(__aarch64__)
    if (!cb->force_ref && cpu_dot_features()->neon) cb->to_f16 = cpu_attn_to_f16_neon;
#endif
}

void cpu_attn_force(be_backend *b, const char *name) {
    cpu_be *cb = cpu_of(b);
    cb->attn_force = -1;
    for (int i = 0; name && i < cb->n_ak; i++)
        if (!strcmp(cb->ak[i]->name, name)) cb->attn_force = i;
}

/* the kernel set for head_dim hd: the forced one if it takes hd, else the fastest that does */
static const cpu_attn_kernels *pick(const cpu_be *cb, int hd) {
    if (cb->attn_force >= 0 && hd % cb->ak[cb->attn_force]->hd_mult == 0) return cb->ak[cb->attn_force];
    for (int i = 0; i < cb->n_ak; i++)
        if (hd % cb->ak[i]->hd_mult == 0) return cb->ak[i];
    return &k_ref;
}

/* ---- KV store ---- */

/* K/V element conversion, the one place it lives: rows of f32 into the
 * cache's element types (the reference quantizers; f16 through the CPU's
 * converter, which rounds as qt_f32_to_f16 does) and back */
static void store_row(const cpu_be *cb, qt_type t, const float *x, unsigned char *d, size_t row, size_t bytes) {
    if (t == QT_F32) memcpy(d, x, bytes);
    else if (t == QT_F16) cb->to_f16(x, (uint16_t *)d, (int64_t)row);
    else qt_traits(t)->from_float(x, d, (int64_t)row);
}

void cpu_kv_rows_to_f32(qt_type t, int hd, const unsigned char *src, size_t stride, int n, float *dst) {
    if (t == QT_F32) {
        for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * (size_t)hd, src + (size_t)i * stride, sizeof(float) * (size_t)hd);
        return;
    }
    qt_to_float_fn f = qt_traits(t)->to_float;
    for (int i = 0; i < n; i++) f(src + (size_t)i * stride, dst + (size_t)i * (size_t)hd, hd);
}

void cpu_kv_store_rows(const cpu_be *cb, kv_cache *kv, int layer, int n, const float *k, const float *v,
                       const int32_t *slot) {
    const size_t row = kv->row_elems;
    const int bs = kv->cfg.block_size;
    for (int t = 0; t < n; t++) {
        if (slot[t] < 0) continue;
        int32_t blk = slot[t] / bs;
        size_t sl = (size_t)(slot[t] % bs);
        unsigned char *kd = kv_block_kraw(kv, blk, layer) + sl * kv->k_row_bytes;
        unsigned char *vd = kv_block_vraw(kv, blk, layer) + sl * kv->v_row_bytes;
        store_row(cb, kv->cfg.type, k + (size_t)t * row, kd, row, kv->k_row_bytes);
        store_row(cb, kv->cfg.v_type, v + (size_t)t * row, vd, row, kv->v_row_bytes);
    }
}

void cpu_op_kv_store(be_backend *b, kv_cache *kv, int layer, const be_tensor *k, const be_tensor *v, int n) {
    cpu_be *cb = cpu_of(b);
    const step_plan *p = cpu_plan(cb, "kv_store");
    if (p) cpu_kv_store_rows(cb, kv, layer, n, k->data, v->data, p->slot);
}

/* ---- work split ---- */

#define SEG_MIN_BLOCKS 8 /* a segment of a split tile covers at least this many blocks */
#define ML_MIN 4096      /* state rows (tokens x heads) of one item at least */

typedef struct attn_tile {
    int32_t t0, nt;       /* tokens t0 .. t0+nt-1 */
    int32_t lo, hi;       /* positions any of them sees */
    int32_t item0, nitems;
    bool dec;             /* a decode row (decode_row): split over positions as a lone decode token is;
                           * otherwise a prefill tile, split over kv heads only */
} attn_tile;

typedef struct attn_item {
    int32_t tile, p0, p1; /* positions p0..p1 of the tile's range */
    int32_t kh0, kh1;     /* its kv heads */
    int64_t part;         /* float offset of its slot in attn_part, -1: writes the output */
} attn_item;

/* Token e of the call is a decode row (a one-token tile computed as a lone
 * decode token is, whatever else is in the step): a rowwise token, or one
 * alone in its sequence in the call that is not a prompt row. Every other
 * token is a prefill row, whose bits do not depend on the call either: its
 * tile is never split over positions (only over kv heads, which compute
 * independently), so a prompt row has the same bits however the prompt was
 * cut into chunks (tests/test_prompt_cut.c). */
static inline bool decode_row(const cpu_attn_args *a, int e) {
    const int s = a->seq[e];
    if (a->rowwise && a->rowwise[s]) return true;
    if (a->prompt && a->prompt[s]) return false;
    return (e == 0 || a->seq[e - 1] != s) && (e + 1 == a->n_tokens || a->seq[e + 1] != s);
}

typedef struct attn_work {
    attn_tile *tiles;
    attn_item *items;
    int tile_cap, item_cap;
    size_t ml_cap;        /* state rows per thread */
    size_t s_rows;        /* score rows per thread */
} attn_work;

typedef struct attn_call {
    cpu_be *cb;
    const cpu_attn_args *a;
    const cpu_attn_kernels *ks;
    const attn_tile *tiles;
    const attn_item *items;
    int n_items;
    _Atomic int next;
} attn_call;

void cpu_attn_free(cpu_be *cb) {
    attn_work *w = cb->attn_work;
    if (w) {
        hn_free(w->tiles);
        hn_free(w->items);
        hn_free(w);
    }
    cb->attn_work = NULL;
    hn_free(cb->attn);
    cb->attn = NULL;
    hn_free(cb->attn_part);
    cb->attn_part = NULL;
    cb->attn_bytes = 0;
}

/* Sizes the scratch for cb->lim. It only grows: a later call with fewer rows
 * keeps it (it is small, and the ranges a call is cut into, at most tile_cap
 * tokens, stay those of the first limits whatever the later ones). */
hn_status cpu_attn_reserve(cpu_be *cb, hn_err *err) {
    const be_limits *lim = &cb->lim;
    size_t g = (size_t)(lim->max_group > 0 ? lim->max_group : 1);
    size_t hd = (size_t)(lim->max_head_dim > 0 ? lim->max_head_dim : 1);
    size_t rows = g > CPU_ATTN_TILE_ROWS ? g : CPU_ATTN_TILE_ROWS;
    size_t heads = (size_t)lim->max_k / hd; /* the output projection's K is n_head * head_dim */
    if (heads < g) heads = g;
    size_t ml = heads > ML_MIN ? heads : ML_MIN;
    if (rows < heads) rows = heads; /* scores of every head of a token at once */
    int tokens = lim->max_rows > 0 ? lim->max_rows : 1;
    const attn_work *w0 = cb->attn_work;
    if (w0 && w0->tiles && w0->items && cb->attn && cb->attn_part && w0->tile_cap >= tokens && w0->ml_cap >= ml &&
        w0->s_rows >= rows && cb->attn_stride >= 2 * ml + rows * CPU_ATTN_SCORE_CAP + 2 * (size_t)CPU_ATTN_SCORE_CAP * hd + 16 &&
        cb->attn_part_cap >= (size_t)CPU_ATTN_SLOTS * heads * (hd + 2))
        return HN_OK;
    if (w0 && w0->tile_cap > tokens) tokens = w0->tile_cap;
    cpu_attn_free(cb);
    attn_work *w = hn_calloc(1, sizeof *w);
    cb->attn_work = w;
    if (!w) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: cannot allocate attention scratch");
    w->tile_cap = tokens;
    w->item_cap = tokens + CPU_ATTN_SLOTS;
    w->ml_cap = ml;
    w->s_rows = rows;
    w->tiles = hn_malloc(sizeof(attn_tile) * (size_t)w->tile_cap);
    w->items = hn_malloc(sizeof(attn_item) * (size_t)w->item_cap);
    /* per thread: m and l of the state rows, scores of a tile's rows over a chunk,
     * dequantized K and V rows of a chunk */
    cb->attn_stride = 2 * ml + rows * CPU_ATTN_SCORE_CAP + 2 * (size_t)CPU_ATTN_SCORE_CAP * hd + 16;
    cb->attn = hn_malloc(sizeof(float) * cb->attn_stride * (size_t)cb->nth);
    /* slots: CPU_ATTN_SLOTS decode tokens' worth of every head's accumulator, max and sum */
    cb->attn_part_cap = (size_t)CPU_ATTN_SLOTS * heads * (hd + 2);
    cb->attn_part = hn_malloc(sizeof(float) * cb->attn_part_cap);
    if (!w->tiles || !w->items || !cb->attn || !cb->attn_part)
        return hn_errf(err, HN_ERR_NOMEM, "cpu backend: cannot allocate attention scratch");
    cb->attn_bytes = sizeof *w + sizeof(attn_tile) * (size_t)w->tile_cap + sizeof(attn_item) * (size_t)w->item_cap +
                     sizeof(float) * (cb->attn_stride * (size_t)cb->nth + cb->attn_part_cap);
    return HN_OK;
}

/* ---- one item ---- */

static inline int32_t lo_of(const cpu_attn_args *a, int32_t p) {
    return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

/* Prefetches (into L2) the K and V rows of positions c0..c1 of seq, in address order. */
static void prefetch_rows(const kv_cache *kv, const int32_t *blocks, int layer, int32_t c0, int32_t c1) {
    const int bs = kv->cfg.block_size;
    for (int32_t p = c0; p <= c1;) {
        int32_t b = p / bs, e = (b + 1) * bs - 1 < c1 ? (b + 1) * bs - 1 : c1;
        const unsigned char *kr = kv_block_kraw(kv, blocks[b], layer) + (size_t)(p % bs) * kv->k_row_bytes;
        const unsigned char *vr = kv_block_vraw(kv, blocks[b], layer) + (size_t)(p % bs) * kv->v_row_bytes;
        size_t kn = (size_t)(e - p + 1) * kv->k_row_bytes, vn = (size_t)(e - p + 1) * kv->v_row_bytes;
        for (size_t o = 0; o < kn; o += 64) __builtin_prefetch(kr + o, 0, 2);
        for (size_t o = 0; o < vn; o += 64) __builtin_prefetch(vr + o, 0, 2);
        p = e + 1;
    }
}

/* Runs item it: the tile's tokens over positions p0..p1 for kv heads kh0..kh1-1.
 * State: accumulators acc [nt][n_head][hd] (token stride acc_tstride), max and
 * sum of token tt's head h at m[tt*mstride + h - moff], l[same]. With
 * normalize, divides each accumulator by its sum at the end. */
static void run_heads(const attn_call *c, const attn_item *it, int kh0, int kh1, float *acc, size_t acc_tstride,
                      float *m, float *l, int mstride, int moff, bool normalize, float *scr) {
    const cpu_attn_args *a = c->a;
    const cpu_attn_kernels *ks = c->ks;
    const attn_tile *tl = &c->tiles[it->tile];
    const kv_cache *kv = a->kv;
    const int32_t *blocks = a->bt + (size_t)a->seq[tl->t0] * (size_t)a->bt_stride;
    const int hd = a->head_dim, H = a->n_head, group = a->n_head / a->n_head_kv, bs = kv->cfg.block_size;
    const int nt = tl->nt;
    const qt_type kt = kv->cfg.type, vt = kv->cfg.v_type;
    const bool k_in = kt == QT_F32 || kt == QT_F16, v_in = vt == QT_F32 || vt == QT_F16;
    const cpu_attn_scores_fn scores = ks->scores[kt == QT_F16];
    const cpu_attn_wsum_fn wsum = ks->wsum[vt == QT_F16];
    const cpu_attn_scores_fn scores_f32 = ks->scores[0]; /* dequantized rows */
    const cpu_attn_wsum_fn wsum_f32 = ks->wsum[0];
    float *s = scr;                                                    /* [tile rows][CAP] */
    float *kd = s + ((const attn_work *)c->cb->attn_work)->s_rows * CPU_ATTN_SCORE_CAP;
    float *vd = kd + (size_t)CPU_ATTN_SCORE_CAP * (size_t)hd;
    const size_t hbytes = (size_t)hd * sizeof(float);
    for (int tt = 0; tt < nt; tt++)
        for (int h = kh0 * group; h < kh1 * group; h++) {
            memset(acc + (size_t)tt * acc_tstride + (size_t)h * (size_t)hd, 0, hbytes);
            m[tt * mstride + h - moff] = -INFINITY;
            l[tt * mstride + h - moff] = 0.0f;
        }
    const int nbl = CPU_ATTN_SCORE_CAP / bs > 0 ? CPU_ATTN_SCORE_CAP / bs : 1;
    /* a prefill tile takes the tile kernels however many rows it has (one
     * included), so that its rows' bits do not depend on the tile */
    const bool tile = (nt > 1 || !tl->dec) && ks->scores_tile[0] && nt * group <= CPU_ATTN_TILE_ROWS;
    const bool all = k_in && v_in && kh0 == 0 && kh1 == a->n_head_kv && moff == 0 &&
                     (size_t)H <= ((const attn_work *)c->cb->attn_work)->s_rows;
    const unsigned char *kb[CPU_ATTN_SCORE_CAP + 1], *vb[CPU_ATTN_SCORE_CAP + 1];
    const unsigned char *kbh[CPU_ATTN_SCORE_CAP + 1], *vbh[CPU_ATTN_SCORE_CAP + 1];
    for (int32_t c0 = it->p0; c0 <= it->p1;) {
        /* chunks of nbl blocks at fixed positions (multiples of nbl blocks), so
         * that a row's online softmax takes the same steps whatever its tile */
        int32_t c1 = (c0 / bs / nbl + 1) * nbl * bs - 1;
        if (c1 > it->p1) c1 = it->p1;
        if (c1 - c0 + 1 > CPU_ATTN_SCORE_CAP) c1 = c0 + CPU_ATTN_SCORE_CAP - 1;
        const int32_t b0 = c0 / bs, nb = c1 / bs - b0 + 1;
        for (int j = 0; j < nb; j++) {
            kb[j] = kv_block_kraw(kv, blocks[b0 + j], a->layer);
            vb[j] = kv_block_vraw(kv, blocks[b0 + j], a->layer);
        }
        if (tile) { /* prefill: all the tile's query rows of one kv head at once */
            /* the next chunk's rows into cache in address order while this one computes
             * (the kv heads below walk it in column stripes, which the hardware
             * prefetchers do not follow) */
            prefetch_rows(kv, blocks, a->layer, c1 + 1, c1 + CPU_ATTN_SCORE_CAP < it->p1 ? c1 + CPU_ATTN_SCORE_CAP : it->p1);
            const int32_t u0 = tl->lo > c0 ? tl->lo : c0, u1 = tl->hi < c1 ? tl->hi : c1;
            const int R = nt * group, n = u1 - u0 + 1;
            if (u0 > u1) {
                c0 = c1 + 1;
                continue;
            }
            for (int kvh = kh0; kvh < kh1; kvh++) {
                for (int j = 0; j < nb; j++) {
                    kbh[j] = kb[j] + (size_t)kvh * kv->k_head_bytes;
                    vbh[j] = vb[j] + (size_t)kvh * kv->v_head_bytes;
                }
                cpu_attn_rows kr = {.blk = kbh, .stride = kv->k_row_bytes, .slot0 = u0 - b0 * bs, .bs = bs};
                cpu_attn_rows vr = {.blk = vbh, .stride = kv->v_row_bytes, .slot0 = u0 - b0 * bs, .bs = bs};
                /* the rows as f32, once for all the tile's rows (f16 included: the
                 * kernels then do no conversions in their inner loops) */
                const unsigned char *kdp = (const unsigned char *)kd, *vdp = (const unsigned char *)vd;
                if (kt != QT_F32) {
                    for (int i = 0; i < n;) {
                        int sl = (u0 + i) % bs, cnt = bs - sl < n - i ? bs - sl : n - i;
                        cpu_kv_rows_to_f32(kt, hd, kbh[(u0 - b0 * bs + i) / bs] + (size_t)sl * kv->k_row_bytes, kv->k_row_bytes, cnt,
                                    kd + (size_t)i * (size_t)hd);
                        i += cnt;
                    }
                    kr = (cpu_attn_rows){.blk = &kdp, .stride = hbytes, .slot0 = 0, .bs = CPU_ATTN_SCORE_CAP};
                }
                if (vt != QT_F32) {
                    for (int i = 0; i < n;) {
                        int sl = (u0 + i) % bs, cnt = bs - sl < n - i ? bs - sl : n - i;
                        cpu_kv_rows_to_f32(vt, hd, vbh[(u0 - b0 * bs + i) / bs] + (size_t)sl * kv->v_row_bytes, kv->v_row_bytes, cnt,
                                    vd + (size_t)i * (size_t)hd);
                        i += cnt;
                    }
                    vr = (cpu_attn_rows){.blk = &vdp, .stride = hbytes, .slot0 = 0, .bs = CPU_ATTN_SCORE_CAP};
                }
                const float *qp[CPU_ATTN_TILE_ROWS];
                float *ap[CPU_ATTN_TILE_ROWS];
                for (int r = 0; r < R; r++) {
                    int tt = r / group, g = r % group;
                    qp[r] = a->q + (size_t)(tl->t0 + tt) * (size_t)H * (size_t)hd + (size_t)(kvh * group + g) * (size_t)hd;
                    ap[r] = acc + (size_t)tt * acc_tstride + (size_t)(kvh * group + g) * (size_t)hd;
                }
                ks->scores_tile[0](qp, R, hd, &kr, n, a->scale, s, CPU_ATTN_SCORE_CAP);
                for (int r = 0; r < R; r++) {
                    int tt = r / group;
                    int32_t hi = a->pos[tl->t0 + tt], lo = lo_of(a, hi);
                    int32_t v0 = lo > u0 ? lo : u0, v1 = hi < u1 ? hi : u1;
                    float *sr = s + (size_t)r * CPU_ATTN_SCORE_CAP;
                    if (v0 > v1) { /* nothing of the chunk for this row */
                        memset(sr, 0, sizeof(float) * (size_t)n);
                        continue;
                    }
                    for (int i = 0; i < v0 - u0; i++) sr[i] = 0.0f;
                    for (int i = v1 - u0 + 1; i < n; i++) sr[i] = 0.0f;
                    int mi = tt * mstride + kvh * group + r % group - moff;
                    ks->softmax(sr + (v0 - u0), v1 - v0 + 1, &m[mi], &l[mi], ap[r], hd);
                }
                ks->wsum_tile[0](ap, R, hd, s, CPU_ATTN_SCORE_CAP, &vr, n);
            }
            c0 = c1 + 1;
            continue;
        }
        if (all) { /* every head of a token at once: each K and V row read front to back */
            cpu_attn_rows kr = {.blk = kb, .stride = kv->k_row_bytes, .bs = bs};
            cpu_attn_rows vr = {.blk = vb, .stride = kv->v_row_bytes, .bs = bs};
            for (int tt = 0; tt < nt; tt++) {
                int32_t hi = a->pos[tl->t0 + tt], lo = lo_of(a, hi);
                int32_t v0 = lo > c0 ? lo : c0, v1 = hi < c1 ? hi : c1;
                if (v0 > v1) continue;
                int n = v1 - v0 + 1;
                kr.slot0 = vr.slot0 = v0 - b0 * bs;
                const float *q = a->q + (size_t)(tl->t0 + tt) * (size_t)H * (size_t)hd;
                float *at = acc + (size_t)tt * acc_tstride;
                scores(q, H, (size_t)hd, hd, group, &kr, n, a->scale, s, CPU_ATTN_SCORE_CAP);
                for (int h = 0; h < H; h++)
                    ks->softmax(s + (size_t)h * CPU_ATTN_SCORE_CAP, n, &m[tt * mstride + h], &l[tt * mstride + h],
                                 at + (size_t)h * (size_t)hd, hd);
                wsum(at, H, hd, group, s, CPU_ATTN_SCORE_CAP, &vr, n);
            }
            c0 = c1 + 1;
            continue;
        }
        for (int kvh = kh0; kvh < kh1; kvh++) {
            cpu_attn_rows kr = {.blk = kbh, .stride = kv->k_row_bytes, .slot0 = c0 % bs, .bs = bs};
            cpu_attn_rows vr = {.blk = vbh, .stride = kv->v_row_bytes, .slot0 = c0 % bs, .bs = bs};
            for (int j = 0; j < nb; j++) {
                kbh[j] = kb[j] + (size_t)kvh * kv->k_head_bytes;
                vbh[j] = vb[j] + (size_t)kvh * kv->v_head_bytes;
            }
            cpu_attn_scores_fn sc = scores;
            cpu_attn_wsum_fn ws = wsum;
            const unsigned char *kdp = (const unsigned char *)kd, *vdp = (const unsigned char *)vd;
            int np = c1 - c0 + 1;
            if (!k_in) { /* this head's K rows of the chunk, as f32 */
                for (int i = 0; i < np;) {
                    int sl = (c0 + i) % bs, n = bs - sl < np - i ? bs - sl : np - i;
                    cpu_kv_rows_to_f32(kt, hd, kbh[(c0 % bs + i) / bs] + (size_t)sl * kv->k_row_bytes, kv->k_row_bytes, n,
                                kd + (size_t)i * (size_t)hd);
                    i += n;
                }
                kr = (cpu_attn_rows){.blk = &kdp, .stride = hbytes, .slot0 = 0, .bs = CPU_ATTN_SCORE_CAP};
                sc = scores_f32;
            }
            if (!v_in) {
                for (int i = 0; i < np;) {
                    int sl = (c0 + i) % bs, n = bs - sl < np - i ? bs - sl : np - i;
                    cpu_kv_rows_to_f32(vt, hd, vbh[(c0 % bs + i) / bs] + (size_t)sl * kv->v_row_bytes, kv->v_row_bytes, n,
                                vd + (size_t)i * (size_t)hd);
                    i += n;
                }
                vr = (cpu_attn_rows){.blk = &vdp, .stride = hbytes, .slot0 = 0, .bs = CPU_ATTN_SCORE_CAP};
                ws = wsum_f32;
            }
            for (int tt = 0; tt < nt; tt++) {
                int32_t hi = a->pos[tl->t0 + tt], lo = lo_of(a, hi);
                int32_t v0 = lo > c0 ? lo : c0, v1 = hi < c1 ? hi : c1;
                if (v0 > v1) continue; /* nothing this token sees in the chunk */
                int n = v1 - v0 + 1, off = v0 - c0;
                cpu_attn_rows kr2 = kr, vr2 = vr;
                kr2.slot0 += off;
                vr2.slot0 += off;
                float *st = s + (size_t)tt * (size_t)group * CPU_ATTN_SCORE_CAP;
                const float *q = a->q + (size_t)(tl->t0 + tt) * (size_t)H * (size_t)hd + (size_t)kvh * (size_t)group * (size_t)hd;
                sc(q, group, (size_t)hd, hd, group, &kr2, n, a->scale, st, CPU_ATTN_SCORE_CAP);
                float *at = acc + (size_t)tt * acc_tstride + (size_t)kvh * (size_t)group * (size_t)hd;
                for (int g = 0; g < group; g++) {
                    int r = tt * mstride + kvh * group + g - moff;
                    ks->softmax(st + (size_t)g * CPU_ATTN_SCORE_CAP, n, &m[r], &l[r], at + (size_t)g * (size_t)hd, hd);
                }
                ws(at, group, hd, group, st, CPU_ATTN_SCORE_CAP, &vr2, n);
            }
        }
        c0 = c1 + 1;
    }
    if (normalize)
        for (int tt = 0; tt < nt; tt++)
            for (int h = kh0 * group; h < kh1 * group; h++) {
                float lv = l[tt * mstride + h - moff], inv = lv > 0 ? 1.0f / lv : 0.0f;
                float *o = acc + (size_t)tt * acc_tstride + (size_t)h * (size_t)hd;
                for (int d = 0; d < hd; d++) o[d] *= inv;
            }
}

static void run_item(const attn_call *c, const attn_item *it, float *scr) {
    const cpu_attn_args *a = c->a;
    const attn_tile *tl = &c->tiles[it->tile];
    const attn_work *w = c->cb->attn_work;
    const int H = a->n_head, hd = a->head_dim, group = a->n_head / a->n_head_kv, nt = tl->nt;
    const size_t ts = (size_t)H * (size_t)hd;
    float *rest = scr + 2 * w->ml_cap;
    if (it->part >= 0) { /* slot: acc [nt][H][hd], m [nt][H], l [nt][H] */
        float *acc = c->cb->attn_part + it->part, *m = acc + (size_t)nt * ts;
        run_heads(c, it, 0, a->n_head_kv, acc, ts, m, m + (size_t)nt * (size_t)H, H, 0, false, rest);
        return;
    }
    /* accumulators in the output rows; all kv heads at once when their max and
     * sum fit the scratch (always, for a sane model), else a few at a time */
    int per = (int)(w->ml_cap / ((size_t)nt * (size_t)group));
    if (per < 1) per = 1;
    for (int kh0 = it->kh0; kh0 < it->kh1; kh0 += per) {
        int kh1 = kh0 + per < it->kh1 ? kh0 + per : it->kh1;
        run_heads(c, it, kh0, kh1, a->out + (size_t)tl->t0 * ts, ts, scr, scr + w->ml_cap, (kh1 - kh0) * group,
                  kh0 * group, true, rest);
    }
}

static void attn_worker(void *ctx, int ith, int nth) {
    (void)nth;
    attn_call *c = ctx;
    float *scr = c->cb->attn + (size_t)ith * c->cb->attn_stride;
    for (;;) {
        int i = pool_take(&c->next, 1, c->n_items);
        if (i >= c->n_items) break;
        run_item(c, &c->items[i], scr);
    }
}

/* out rows of a split tile = merge of its items' slots */
static void merge_tile(const cpu_be *cb, const cpu_attn_args *a, const attn_tile *tl, const attn_item *items) {
    const int H = a->n_head, hd = a->head_dim, nt = tl->nt;
    const size_t ts = (size_t)H * (size_t)hd;
    for (int tt = 0; tt < nt; tt++)
        for (int h = 0; h < H; h++) {
            float M = -INFINITY;
            for (int j = 0; j < tl->nitems; j++) {
                const float *m = cb->attn_part + items[j].part + (size_t)nt * ts;
                if (m[tt * H + h] > M) M = m[tt * H + h];
            }
            float *o = a->out + (size_t)(tl->t0 + tt) * ts + (size_t)h * (size_t)hd;
            memset(o, 0, sizeof(float) * (size_t)hd);
            float L = 0;
            for (int j = 0; j < tl->nitems; j++) {
                const float *acc = cb->attn_part + items[j].part;
                const float *m = acc + (size_t)nt * ts, *l = m + (size_t)nt * (size_t)H;
                if (m[tt * H + h] == -INFINITY) continue;
                float f = expf(m[tt * H + h] - M);
                L += f * l[tt * H + h];
                const float *ah = acc + (size_t)tt * ts + (size_t)h * (size_t)hd;
                for (int d = 0; d < hd; d++) o[d] += f * ah[d];
            }
            float inv = L > 0 ? 1.0f / L : 0.0f;
            for (int d = 0; d < hd; d++) o[d] *= inv;
        }
}

/* Attention of tokens [t0, t0+n) (n within the work arrays' capacity). */
static void attn_range(cpu_be *cb, const cpu_attn_args *a, int t0, int n) {
    attn_work *w = cb->attn_work;
    const int H = a->n_head, group = a->n_head / a->n_head_kv, bs = a->kv->cfg.block_size;
    int tmax = CPU_ATTN_TILE_ROWS / group > 0 ? CPU_ATTN_TILE_ROWS / group : 1;
    if ((size_t)tmax * (size_t)H > w->ml_cap) tmax = 1;
    int n_tiles = 0;
    for (int t = t0; t < t0 + n;) {
        int e = t + 1;
        const bool rw = a->rowwise && a->rowwise[a->seq[t]];
        while (!rw && e < t0 + n && e - t < tmax && a->seq[e] == a->seq[t] && a->pos[e] == a->pos[e - 1] + 1) e++;
        attn_tile *tl = &w->tiles[n_tiles++];
        tl->t0 = t;
        tl->nt = e - t;
        tl->lo = lo_of(a, a->pos[t]);
        tl->hi = a->pos[e - 1];
        tl->dec = tl->nt == 1 && decode_row(a, t);
        t = e;
    }
    /* split tiles into segments when there are too few to keep the threads busy */
    const size_t slot = (size_t)H * ((size_t)a->head_dim + 2);
    size_t part_used = 0;
    int want = cb->nth > 1 ? 4 * cb->nth : 1;
    int per_tile = n_tiles >= want ? 1 : (want + n_tiles - 1) / n_tiles;
    int n_items = 0;
    const int HKV = a->n_head_kv;
    const cpu_attn_kernels *ks = pick(cb, a->head_dim);
    const bool ks_tiles = ks->scores_tile[0] != NULL;
    for (int i = 0; i < n_tiles; i++) {
        attn_tile *tl = &w->tiles[i];
        if (!tl->dec) {
            /* a prefill tile: all its positions in one pass (from a block
             * boundary), split over kv heads when tiles are few; only with the
             * tile kernels (without them every head of a token goes at once) */
            int nkh = ks_tiles && per_tile < HKV ? per_tile : ks_tiles ? HKV : 1;
            if (nkh > w->item_cap - n_items - (n_tiles - i - 1)) nkh = w->item_cap - n_items - (n_tiles - i - 1);
            if (nkh < 1) nkh = 1;
            tl->item0 = n_items;
            tl->nitems = nkh;
            for (int k = 0; k < nkh; k++) {
                attn_item *it = &w->items[n_items++];
                it->tile = i;
                it->p0 = tl->lo / bs * bs;
                it->p1 = tl->hi;
                it->kh0 = HKV * k / nkh;
                it->kh1 = HKV * (k + 1) / nkh;
                it->part = -1;
            }
            continue;
        }
        int32_t b0 = tl->lo / bs, b1 = tl->hi / bs, nblk = b1 - b0 + 1;
        /* a one-token tile (a decode row) is split as a lone decode token is,
         * whatever else is in the step, so its result does not depend on the
         * batch (cpu_attention sized the range so that its parts fit) */
        int pt = tl->nt == 1 ? want : per_tile;
        int nseg = pt < nblk / SEG_MIN_BLOCKS ? pt : nblk / SEG_MIN_BLOCKS;
        size_t need = (size_t)tl->nt * slot;
        if (nseg > 1 && (size_t)nseg * need > cb->attn_part_cap - part_used) nseg = (int)((cb->attn_part_cap - part_used) / need);
        if (nseg > w->item_cap - n_items - (n_tiles - i - 1)) nseg = w->item_cap - n_items - (n_tiles - i - 1);
        if (nseg < 1) nseg = 1;
        tl->item0 = n_items;
        tl->nitems = nseg;
        for (int sg = 0; sg < nseg; sg++) {
            attn_item *it = &w->items[n_items++];
            int32_t sb = b0 + (int32_t)((int64_t)nblk * sg / nseg), eb = b0 + (int32_t)((int64_t)nblk * (sg + 1) / nseg);
            it->tile = i;
            it->p0 = sb * bs > tl->lo ? sb * bs : tl->lo;
            it->p1 = eb * bs - 1 < tl->hi ? eb * bs - 1 : tl->hi;
            it->kh0 = 0;
            it->kh1 = HKV;
            it->part = -1;
            if (nseg > 1) {
                it->part = (int64_t)part_used;
                part_used += need;
            }
        }
    }
    attn_call c = {.cb = cb, .a = a, .ks = ks, .tiles = w->tiles, .items = w->items, .n_items = n_items};
    atomic_store(&c.next, 0);
    if (cb->nth == 1 || n_items == 1) attn_worker(&c, 0, 1);
    else pool_run_shared(cb->pool, attn_worker, &c);
    for (int i = 0; i < n_tiles; i++)
        if (w->tiles[i].dec && w->tiles[i].nitems > 1) merge_tile(cb, a, &w->tiles[i], &w->items[w->tiles[i].item0]);
}

/* The most one-token tiles (decode rows) a range may hold so that each can
 * have the segments a lone decode token gets (their partial results must fit
 * the slots): CPU_ATTN_SLOTS / the most segments a row of this call can have. */
static int decode_rows_per_range(const cpu_be *cb, const cpu_attn_args *a) {
    const int bs = a->kv->cfg.block_size;
    int32_t maxpos = 0;
    for (int t = 0; t < a->n_tokens; t++)
        if (a->pos[t] > maxpos) maxpos = a->pos[t];
    int want = cb->nth > 1 ? 4 * cb->nth : 1, seg = (int)((maxpos / bs + 1) / SEG_MIN_BLOCKS);
    if (seg > want) seg = want;
    if (seg < 1) seg = 1;
    int r = CPU_ATTN_SLOTS / seg;
    return r < 1 ? 1 : r;
}

void cpu_attention(cpu_be *cb, const cpu_attn_args *a) {
    const attn_work *w = cb->attn_work;
    int cap = w->tile_cap, dr = decode_rows_per_range(cb, a);
    /* ranges: at most tile_cap tokens and (so that decode rows are split the
     * same whatever the batch) at most dr tokens that will be one-token tiles
     * (a token alone in its sequence, or a rowwise one); a prefill tile is
     * never cut by this, its tokens count as one */
    for (int t = 0; t < a->n_tokens;) {
        int e = t, nd = 0;
        while (e < a->n_tokens && e - t < cap) {
            bool one = decode_row(a, e);
            if (one && nd == dr) break;
            nd += one;
            e++;
        }
        attn_range(cb, a, t, e - t);
        t = e;
    }
}

void cpu_op_attention(be_backend *b, const be_attn_args *ba) {
    cpu_be *cb = cpu_of(b);
    const step_plan *p = cpu_plan(cb, "attention");
    if (!p || !cpu_rows_ok(cb, 1, "attention")) return;
    cpu_attn_args a = {
        .q = ba->q->data, .out = ba->out->data, .n_tokens = ba->n_tokens, .n_head = ba->n_head,
        .n_head_kv = ba->n_head_kv, .head_dim = ba->head_dim, .scale = ba->scale, .window = ba->window,
        .kv = ba->kv, .layer = ba->layer, .pos = p->pos, .seq = p->seq, .bt = p->block_table,
        .bt_stride = p->bt_stride, .rowwise = p->rowwise, .prompt = p->prompt,
    };
    cpu_attention(cb, &a);
}
