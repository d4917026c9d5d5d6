/* cpu_attn.c: attention over the paged KV cache, flash style.
 *
 * One work item is (token, kv head): the group of query heads that share that
 * kv head walks the sequence's blocks once, so each K/V row is loaded once
 * per group (GQA). Per block it scores all the block's positions for every
 * head of the group, then applies the online softmax: rescale the running sum
 * and accumulator by exp(old_max - new_max) once per block, add exp(s - max)
 * weighted V rows. Only positions the token may see are visited (causal, and
 * the sliding window if any): no work is spent on masked positions. The dot
 * over head_dim and the chunk's weighted sum of V rows (accumulators of the
 * whole group held in registers while V streams, one V load per group) are
 * the backend's vector helpers (AVX2+FMA+F16C when the CPU has them). f32 and
 * f16 caches are read in place; other quantized caches (q8_0 K, q8_0/q4 V)
 * are dequantized one chunk of at most CPU_ATTN_SCORE_CAP rows at a time into
 * per-thread scratch. */
#include <math.h>
#include <string.h>

#include "cpu_int.h"



typedef struct attn_task {
    cpu_be *cb;
    const be_attn_args *a;
    _Atomic int next;
} attn_task;

static void attn_item(cpu_be *cb, const be_attn_args *a, int t, int kvh, float *scratch) {
    const kv_cache *kv = a->kv;
    const kv_seq *seq = a->seqs[t];
    const int hd = a->head_dim;
    const int group = a->n_head / a->n_head_kv;
    const int bs = kv->cfg.block_size;
    const size_t row = kv->row_elems;
    float *acc = scratch;                      /* [group][hd] */
    float *m = acc + (size_t)group * (size_t)hd; /* [group] running max */
    float *l = m + group;                      /* [group] running sum */
    float *s = l + group;                      /* [group][CPU_ATTN_SCORE_CAP] scores */
    float *kd = s + (size_t)group * CPU_ATTN_SCORE_CAP; /* [CPU_ATTN_SCORE_CAP][hd] dequantized K (quantized caches) */
    float *vd = kd + (size_t)CPU_ATTN_SCORE_CAP * (size_t)hd; /* same for V */
    const bool k_f32 = kv->cfg.type == QT_F32, v_f32 = kv->cfg.v_type == QT_F32;
    for (int h = 0; h < group; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)group * (size_t)hd);
    const float *q = a->q + (size_t)t * (size_t)a->n_head * (size_t)hd + (size_t)kvh * (size_t)group * (size_t)hd;
    int32_t hi = a->pos[t];
    int32_t lo = a->window > 0 && hi - a->window + 1 > 0 ? hi - a->window + 1 : 0;
    for (int32_t p0 = lo; p0 <= hi;) {
        int32_t blk = p0 / bs, slot0 = p0 % bs;
        int32_t p1 = (blk + 1) * bs - 1 < hi ? (blk + 1) * bs - 1 : hi;
        if (p1 - p0 + 1 > CPU_ATTN_SCORE_CAP) p1 = p0 + CPU_ATTN_SCORE_CAP - 1;
        int np = p1 - p0 + 1;
        /* this chunk's K and V rows of kv head kvh: in place for f32, else dequantized */
        const unsigned char *kr = kv_block_kraw(kv, seq->blocks[blk], a->layer) + (size_t)slot0 * kv->k_row_bytes +
                                  (size_t)kvh * kv->k_head_bytes;
        const unsigned char *vr = kv_block_vraw(kv, seq->blocks[blk], a->layer) + (size_t)slot0 * kv->v_row_bytes +
                                  (size_t)kvh * kv->v_head_bytes;
        const float *kb = (const float *)kr, *vb = (const float *)vr;
        const bool k_f16 = kv->cfg.type == QT_F16, v_f16 = kv->cfg.v_type == QT_F16;
        size_t krow = row, vrow = row;
        if (!k_f32 && !k_f16) {
            kv_k_to_f32(kv, kr, kv->k_row_bytes, np, kd);
            kb = kd;
            krow = (size_t)hd;
        }
        if (!v_f32 && !v_f16) {
            kv_v_to_f32(kv, vr, kv->v_row_bytes, np, vd);
            vb = vd;
            vrow = (size_t)hd;
        }
        /* scores and online-softmax weights of the chunk for every head of the group
         * (f16 rows are read in place: k_row_bytes / 2 elements apart) */
        for (int h = 0; h < group; h++) {
            const float *qh = q + (size_t)h * (size_t)hd;
            float *sh = s + (size_t)h * CPU_ATTN_SCORE_CAP;
            float mx = m[h];
            if (k_f16 && cb->scores_h && hd % 8 == 0) {
                cb->scores_h(qh, hd, (const uint16_t *)kr, kv->k_row_bytes / 2, np, a->scale, sh);
            } else if (!k_f16 && cb->scores && hd % 8 == 0) {
                cb->scores(qh, hd, kb, krow, np, a->scale, sh);
            } else {
                for (int i = 0; i < np; i++)
                    sh[i] = (k_f16 ? cb->vdot_h(qh, (const uint16_t *)kr + (size_t)i * (kv->k_row_bytes / 2), hd)
                                   : cb->vdot(qh, kb + (size_t)i * krow, hd)) *
                            a->scale;
            }
            for (int i = 0; i < np; i++)
                if (sh[i] > mx) mx = sh[i];
            float corr = expf(m[h] - mx); /* 0 on the first block (m = -inf) */
            float *ah = acc + (size_t)h * (size_t)hd;
            if (corr != 1.0f) {
                for (int d = 0; d < hd; d++) ah[d] *= corr;
                l[h] *= corr;
            }
            m[h] = mx;
            l[h] += cb->vexp(sh, np, mx);
        }
        /* acc[h] += sum_i w[h][i] V_i, each V row loaded once for the whole group */
        if (v_f16)
            cb->wsum_h(acc, group, hd, s, CPU_ATTN_SCORE_CAP, (const uint16_t *)vr, kv->v_row_bytes / 2, np);
        else
            cb->wsum(acc, group, hd, s, CPU_ATTN_SCORE_CAP, vb, vrow, np);
        p0 = p1 + 1;
    }
    float *o = a->out + (size_t)t * (size_t)a->n_head * (size_t)hd + (size_t)kvh * (size_t)group * (size_t)hd;
    for (int h = 0; h < group; h++) {
        float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
        for (int d = 0; d < hd; d++) o[(size_t)h * (size_t)hd + (size_t)d] = acc[(size_t)h * (size_t)hd + (size_t)d] * inv;
    }
}

static void attn_worker(void *ctx, int ith, int nth) {
    (void)nth;
    attn_task *t = ctx;
    const be_attn_args *a = t->a;
    float *scratch = t->cb->attn + (size_t)ith * t->cb->attn_stride;
    int total = a->n_tokens * a->n_head_kv;
    for (;;) {
        int i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (i >= total) break;
        attn_item(t->cb, a, i / a->n_head_kv, i % a->n_head_kv, scratch);
    }
}

void cpu_op_attention(be_backend *b, const be_attn_args *a) {
    cpu_be *cb = cpu_of(b);
    attn_task t = {.cb = cb, .a = a};
    atomic_store(&t.next, 0);
    if (cb->nth == 1 || a->n_tokens * a->n_head_kv == 1)
        attn_worker(&t, 0, 1);
    else
        pool_run_shared(cb->pool, attn_worker, &t);
}
