/* cpu_ssm.c: the CPU backend's ops for hybrid (Gated DeltaNet) layers:
 * strided column copies, sigmoid gating, L2 norm, multi-section rope, the
 * short causal conv over each sequence's conv state, the gated delta rule
 * over each sequence's delta state, and state-slot copies. The scalar forms
 * here are the references (tests/test_backend_ops.c checks them against
 * double precision); the recurrences run in token order per sequence, split
 * over channels (conv) or (sequence, value head) pairs (delta rule). The
 * delta rule's token step has an AVX2 form with the same bits
 * (cpu_ssm_avx2.c) and a chunked (parallel) form for prefill runs, off by
 * default (HONE_DELTA_CHUNK), which equals the token step up to rounding.
 * Both recurrences write the state after a token into the plan's snapshot
 * slot for it (state_snap), when it names one. */
#include <math.h>
#include <string.h>

#include "cpu_int.h"

static void fail(cpu_be *cb, const char *msg) {
    if (cb->err) return;
    cb->err = HN_ERR_INVALID;
    snprintf(cb->err_msg, sizeof cb->err_msg, "cpu backend: %s", msg);
}

void cpu_op_copy_cols(be_backend *b, const be_tensor *xt, int x_ld, int x_off, int n, int nc, be_tensor *yt, int y_ld,
                      int y_off) {
    (void)b;
    const float *x = xt->data;
    float *y = yt->data;
    for (int r = 0; r < n; r++)
        memmove(y + (size_t)r * (size_t)y_ld + (size_t)y_off, x + (size_t)r * (size_t)x_ld + (size_t)x_off,
                sizeof(float) * (size_t)nc);
}

void cpu_op_sigmoid_mul(be_backend *b, const be_tensor *xt, const be_tensor *gt, int n, int dim, int g_dim,
                        be_tensor *yt) {
    (void)b;
    const float *x = xt->data, *g = gt->data;
    float *y = yt->data;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < dim; i++) {
            size_t at = (size_t)r * (size_t)dim + (size_t)i;
            float gv = g[(size_t)r * (size_t)g_dim + (size_t)(g_dim == 1 ? 0 : i)];
            /* as ggml: the sigmoid, then a product (not a quotient: the roundings differ) */
            float sg = 1.0f / (1.0f + expf(-gv));
            y[at] = x[at] * sg;
        }
}

void cpu_op_l2_norm(be_backend *b, const be_tensor *xt, int n, int dim, float eps, be_tensor *yt) {
    (void)b;
    const float *x = xt->data;
    float *y = yt->data;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        double ss = 0.0; /* as ggml_l2_norm: float squares summed in double */
        for (int i = 0; i < dim; i++) ss += (double)(xr[i] * xr[i]);
        float nrm = sqrtf((float)ss);
        float scale = 1.0f / (nrm > eps ? nrm : eps);
        for (int i = 0; i < dim; i++) yr[i] = xr[i] * scale;
    }
}

void cpu_op_rope_multi(be_backend *b, be_tensor *xt, int n, int n_head, int head_dim, int n_rot, float freq_base,
                       const int32_t sections[4]) {
    const step_plan *p = cpu_plan(cpu_of(b), "rope_multi");
    if (!p) return;
    float *x = xt->data;
    const int half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float cs[512], sn[512];
    for (int r = 0; r < n; r++) {
        /* text positions: t = h = w = pos, e = 0 (each section's theta advances by theta_scale) */
        float theta = (float)p->pos[r];
        for (int i = 0; i < half && i < 512; i++) {
            int sec = i % 3;
            bool rot = i < 3 * sections[sec];
            cs[i] = rot ? cosf(theta) : 1.0f;
            sn[i] = rot ? sinf(theta) : 0.0f;
            theta *= theta_scale;
        }
        for (int h = 0; h < n_head; h++) {
            float *v = x + ((size_t)r * (size_t)n_head + (size_t)h) * (size_t)head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], bb = v[i + half];
                v[i] = a * cs[i] - bb * sn[i];
                v[i + half] = a * sn[i] + bb * cs[i];
            }
        }
    }
}

/* Every snapshot slot the plan names (state_snap) is a slot of the cache. */
static bool snaps_ok(const step_plan *p, const kv_cache *kv) {
    for (int t = 0; p->state_snap && t < p->n_tokens; t++)
        if (p->state_snap[t] >= kv->n_state_slots || p->state_snap[t] < -1) return false;
    return true;
}

/* ---- the short conv ---- */

typedef struct {
    const step_plan *p;
    const float *x, *w;
    float *y;
    int n, C, K;
    const kv_cache *kv;
    size_t off;
} conv_ctx;

#define CONV_CHUNK 64 /* channels per task */
/* ggml's conv sums the taps in order; its build contracts them into fused multiply-adds */
#define CONV_MAD(a, b, c) fmaf(a, b, c)

static void conv_rows(void *ctx, int r0, int r1) {
    conv_ctx *c = ctx;
    const int C = c->C, K = c->K;
    for (int ch = r0; ch < r1; ch++) {
        int c0 = ch * CONV_CHUNK, c1 = c0 + CONV_CHUNK < C ? c0 + CONV_CHUNK : C;
        for (int t = 0; t < c->n; t++) {
            if (c->p->slot[t] < 0) continue; /* padding */
            int s = c->p->seq[t];
            float *st = (float *)(kv_state_ptr(c->kv, c->p->state_slot[s]) + c->off);
            if (c->p->pos[t] == 0)
                for (int j = 0; j < K - 1; j++) memset(st + (size_t)j * (size_t)C + c0, 0, sizeof(float) * (size_t)(c1 - c0));
            const float *xr = c->x + (size_t)t * (size_t)C;
            float *yr = c->y + (size_t)t * (size_t)C;
            for (int i = c0; i < c1; i++) {
                const float *w = c->w + (size_t)i * (size_t)K;
                float xv = xr[i], acc = 0.0f;
                for (int j = 0; j < K - 1; j++) acc = CONV_MAD(st[(size_t)j * (size_t)C + (size_t)i], w[j], acc);
                acc = CONV_MAD(xv, w[K - 1], acc);
                for (int j = 0; j + 1 < K - 1; j++) st[(size_t)j * (size_t)C + (size_t)i] = st[(size_t)(j + 1) * (size_t)C + (size_t)i];
                if (K > 1) st[(size_t)(K - 2) * (size_t)C + (size_t)i] = xv;
                yr[i] = acc / (1.0f + expf(-acc));
            }
            int32_t snap = c->p->state_snap ? c->p->state_snap[t] : -1;
            if (snap >= 0) { /* the window after this token into its snapshot slot */
                float *sn = (float *)(kv_state_ptr(c->kv, snap) + c->off);
                for (int j = 0; j < K - 1; j++)
                    memcpy(sn + (size_t)j * (size_t)C + c0, st + (size_t)j * (size_t)C + c0, sizeof(float) * (size_t)(c1 - c0));
            }
        }
    }
}

void cpu_op_ssm_conv(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int channels, int kernel,
                     const kv_cache *kv, size_t state_off, be_tensor *y) {
    cpu_be *cb = cpu_of(b);
    const step_plan *p = cpu_plan(cb, "ssm_conv");
    if (!p) return;
    if (!kv || !kv->state_slot_bytes || kernel < 1 || w->type != QT_F32 || w->ne[0] != kernel || w->ne[1] != channels ||
        state_off + sizeof(float) * (size_t)(kernel - 1) * (size_t)channels > kv->cfg.state_bytes)
        return fail(cb, "ssm_conv: bad arguments or no recurrent state in the cache");
    for (int s = 0; s < p->n_seqs; s++)
        if (p->state_slot[s] < 0 || p->state_slot[s] >= kv->n_state_slots)
            return fail(cb, "ssm_conv: a sequence has no recurrent-state slot");
    if (!snaps_ok(p, kv)) return fail(cb, "ssm_conv: a state snapshot slot out of range");
    conv_ctx c = {p, x->data, w->data, y->data, n, channels, kernel, kv, state_off};
    cpu_par_rows(cb, (channels + CONV_CHUNK - 1) / CONV_CHUNK, conv_rows, &c);
}

/* ---- the gated delta rule ---- */

/* ggml's f32 dot product order (its AVX-512 build): 4 accumulators of 16
 * lanes with fused multiply-adds over steps of 64, pairwise reduced. The
 * delta rule follows llama.cpp's CPU kernel operation for operation (decay,
 * k-dot, fused rank-1 update, q-dot), so that the quantized models' 8-bit
 * activation roundings see the same floats. */
#define GDN_EPR 16
static float ggml_dot(const float *x, const float *y, int n) {
    enum { E = GDN_EPR };
    float acc[4][E] = {{0}};
    int np = n & ~(4 * E - 1), i = 0;
    for (; i < np; i += 4 * E)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < E; l++) acc[j][l] = fmaf(x[i + j * E + l], y[i + j * E + l], acc[j][l]);
    for (int l = 0; l < E; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for (int l = 0; l < E; l++) acc[0][l] += acc[1][l];
    float r;
    if (E == 16) {
        float h[8], q[4];
        for (int l = 0; l < 8; l++) h[l] = acc[0][l] + acc[0][l + 8];
        for (int l = 0; l < 4; l++) q[l] = h[l] + h[l + 4];
        r = (q[0] + q[2]) + (q[1] + q[3]);
    } else {
        float t0[4];
        for (int l = 0; l < 4; l++) t0[l] = acc[0][l] + acc[0][l + 4];
        r = (t0[0] + t0[1]) + (t0[2] + t0[3]);
    }
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

typedef struct {
    const step_plan *p;
    const be_delta_args *a;
    int n;
    int chunk_min; /* runs of at least this many tokens take the chunked form (0: never) */
    bool avx2;     /* the token step's AVX2 kernel (S a multiple of 64) */
} delta_ctx;

#define DCH 32         /* tokens per chunk of the chunked form */
#define DCH_MAX_S 256  /* the chunked form's largest head dim (its scratch is on the stack) */

static float softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* One token of the recurrence on one value head's state M (S x S). */
static void delta_token(float *M, int S, const float *qt, const float *kt, const float *vt, float g, float beta,
                        float *ot) {
    const float scale = 1.0f / sqrtf((float)S);
    float decay = expf(g);
    for (int vi = 0; vi < S; vi++) {
        float *row = M + (size_t)vi * (size_t)S;
        for (int ki = 0; ki < S; ki++) row[ki] *= decay;
        float d = (vt[vi] - ggml_dot(row, kt, S)) * beta;
        for (int ki = 0; ki < S; ki++) row[ki] = fmaf(kt[ki], d, row[ki]);
        ot[vi] = ggml_dot(row, qt, S) * scale;
    }
}

/* The chunked (parallel) form over c <= DCH consecutive tokens of one value
 * head, from state M0 = M. With G_t the cumulative log decay inside the
 * chunk, M_t = e^{G_t} M0 + sum_{i<=t} e^{G_t - G_i} d_i k_i^T, where the
 * new-value vectors d solve the unit lower-triangular system
 *   d_t = b_t (v_t - e^{G_t} M0 k_t) - sum_{i<t} b_t e^{G_t-G_i} (k_t.k_i) d_i;
 * the outputs are o_t = (e^{G_t} M0 q_t + sum_{i<=t} e^{G_t-G_i} (q_t.k_i) d_i) / sqrt(S)
 * and the state leaves as M_c. The state is read and written once per
 * chunk (M0 k and M0 q as one pass over its rows) instead of once per
 * token; the result equals the token-step form up to float rounding. */
static void delta_chunk(float *M, int S, int c, const float *const *q, const float *const *k,
                        const float *const *v, const float *g, const float *beta, float *const *o) {
    float G[DCH] = {0}, kk[DCH][DCH], qk[DCH][DCH];
    float d[DCH][DCH_MAX_S], y[DCH][DCH_MAX_S];
    const float scale = 1.0f / sqrtf((float)S);
    for (int t = 0; t < c; t++) G[t] = (t ? G[t - 1] : 0.0f) + g[t];
    /* one pass over M0's rows: w = M0 k_t into d (the right-hand side), M0 q_t into y */
    for (int vi = 0; vi < S; vi++) {
        const float *row = M + (size_t)vi * (size_t)S;
        for (int t = 0; t < c; t++) {
            d[t][vi] = beta[t] * (v[t][vi] - expf(G[t]) * cpu_dot_f32(row, k[t], S));
            y[t][vi] = expf(G[t]) * cpu_dot_f32(row, q[t], S);
        }
    }
    for (int t = 0; t < c; t++)
        for (int i = 0; i <= t; i++) {
            kk[t][i] = cpu_dot_f32(k[t], k[i], S);
            qk[t][i] = cpu_dot_f32(q[t], k[i], S);
        }
    /* forward substitution */
    for (int t = 1; t < c; t++)
        for (int i = 0; i < t; i++) {
            float f = beta[t] * expf(G[t] - G[i]) * kk[t][i];
            for (int vi = 0; vi < S; vi++) d[t][vi] -= f * d[i][vi];
        }
    /* outputs */
    for (int t = 0; t < c; t++) {
        float *ot = o[t];
        for (int vi = 0; vi < S; vi++) ot[vi] = y[t][vi];
        for (int i = 0; i <= t; i++) {
            float f = expf(G[t] - G[i]) * qk[t][i];
            for (int vi = 0; vi < S; vi++) ot[vi] += f * d[i][vi];
        }
        for (int vi = 0; vi < S; vi++) ot[vi] *= scale;
    }
    /* the state after the chunk */
    float e_c = expf(G[c - 1]), w[DCH];
    for (int vi = 0; vi < S; vi++) {
        float *row = M + (size_t)vi * (size_t)S;
        for (int i = 0; i < c; i++) w[i] = expf(G[c - 1] - G[i]) * d[i][vi];
        for (int ki = 0; ki < S; ki++) {
            float acc = e_c * row[ki];
            for (int i = 0; i < c; i++) acc += w[i] * k[i][ki];
            row[ki] = acc;
        }
    }
}

static void delta_rows(void *ctx, int r0, int r1) {
    delta_ctx *c = ctx;
    const be_delta_args *a = c->a;
    const int S = a->head_dim, Nk = a->n_k_heads, Nv = a->n_v_heads;
    const float *q = a->q->data, *k = a->k->data, *v = a->v->data, *al = a->alpha->data, *be = a->beta->data;
    const float *dtb = a->dt_bias->data, *A = a->a->data;
    float *out = a->out->data;
    for (int task = r0; task < r1; task++) {
        int s = task / Nv, j = task % Nv, kh = j % Nk;
        float *M = (float *)(kv_state_ptr(a->kv, c->p->state_slot[s]) + a->state_off) + (size_t)j * (size_t)S * (size_t)S;
        /* this sequence's tokens, in order; a run is cut at a restart (position 0) */
        const float *qs[DCH], *ks[DCH], *vs[DCH];
        float gs[DCH], bs[DCH], *os[DCH];
        int run = 0, n_seq = 0;
        const int32_t *snap = c->p->state_snap;
        bool snaps = false; /* a sequence with snapshots, or verified rows, takes the token step (decode's bits) */
        if (c->chunk_min > 0 && S <= DCH_MAX_S)
            for (int t = 0; t < c->n; t++)
                if (c->p->seq[t] == s && c->p->slot[t] >= 0) {
                    n_seq++;
                    snaps |= snap && snap[t] >= 0;
                }
        bool chunked = c->chunk_min > 0 && S <= DCH_MAX_S && n_seq >= c->chunk_min && !snaps &&
                       !(c->p->rowwise && c->p->rowwise[s]);
        for (int t = 0; t < c->n; t++) {
            if (c->p->seq[t] != s || c->p->slot[t] < 0) continue;
            if (c->p->pos[t] == 0) {
                if (run) delta_chunk(M, S, run, qs, ks, vs, gs, bs, os);
                run = 0;
                memset(M, 0, sizeof(float) * (size_t)S * (size_t)S);
            }
            const float *qt = q + (size_t)t * (size_t)Nk * (size_t)S + (size_t)kh * (size_t)S;
            const float *kt = k + (size_t)t * (size_t)Nk * (size_t)S + (size_t)kh * (size_t)S;
            const float *vt = v + (size_t)t * (size_t)Nv * (size_t)S + (size_t)j * (size_t)S;
            float *ot = out + (size_t)t * (size_t)Nv * (size_t)S + (size_t)j * (size_t)S;
            float g = softplus(al[(size_t)t * (size_t)Nv + (size_t)j] + dtb[j]) * A[j];
            float beta = 1.0f / (1.0f + expf(-be[(size_t)t * (size_t)Nv + (size_t)j]));
            if (!chunked) {
                if (c->avx2) cpu_delta_token_avx2(M, S, qt, kt, vt, g, beta, ot);
                else delta_token(M, S, qt, kt, vt, g, beta, ot);
                if (snap && snap[t] >= 0) /* this head's state after the token into its snapshot slot */
                    memcpy((float *)(kv_state_ptr(a->kv, snap[t]) + a->state_off) + (size_t)j * (size_t)S * (size_t)S, M,
                           sizeof(float) * (size_t)S * (size_t)S);
                continue;
            }
            qs[run] = qt;
            ks[run] = kt;
            vs[run] = vt;
            os[run] = ot;
            gs[run] = g;
            bs[run] = beta;
            if (++run == DCH) {
                delta_chunk(M, S, run, qs, ks, vs, gs, bs, os);
                run = 0;
            }
        }
        if (run) delta_chunk(M, S, run, qs, ks, vs, gs, bs, os);
    }
}

void cpu_op_delta_net(be_backend *b, const be_delta_args *a) {
    cpu_be *cb = cpu_of(b);
    const step_plan *p = cpu_plan(cb, "delta_net");
    if (!p) return;
    const kv_cache *kv = a->kv;
    size_t need = sizeof(float) * (size_t)a->n_v_heads * (size_t)a->head_dim * (size_t)a->head_dim;
    if (!kv || !kv->state_slot_bytes || a->n_k_heads < 1 || a->n_v_heads < 1 || a->head_dim < 1 ||
        a->state_off + need > kv->cfg.state_bytes)
        return fail(cb, "delta_net: bad arguments or no recurrent state in the cache");
    for (int s = 0; s < p->n_seqs; s++)
        if (p->state_slot[s] < 0 || p->state_slot[s] >= kv->n_state_slots)
            return fail(cb, "delta_net: a sequence has no recurrent-state slot");
    if (!snaps_ok(p, kv)) return fail(cb, "delta_net: a state snapshot slot out of range");
    delta_ctx c = {p, a, a->n_tokens, cb->force_ref ? 0 : cb->delta_chunk,
                   !cb->force_ref && cb->delta_avx2 && a->head_dim % 64 == 0};
    cpu_par_rows(cb, p->n_seqs * a->n_v_heads, delta_rows, &c);
}

void cpu_delta_chunk(be_backend *b, int min_tokens) { cpu_of(b)->delta_chunk = min_tokens > 0 ? min_tokens : 0; }

void cpu_op_state_copy(be_backend *b, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst) {
    cpu_be *cb = cpu_of(b);
    for (int i = 0; i < n; i++) {
        if (!kv || src[i] < 0 || dst[i] < 0 || src[i] >= kv->n_state_slots || dst[i] >= kv->n_state_slots)
            return fail(cb, "state_copy: bad slot");
        if (src[i] != dst[i]) memcpy(kv_state_ptr(kv, dst[i]), kv_state_ptr(kv, src[i]), kv->cfg.state_bytes);
    }
}
