/* cuda_units.cuh: private to backend/cuda: the integer weight types as the
 * matrix kernels see them (cuda_gemv.cu's decode gemv and hc_mmq, and
 * cuda_mmf.cu's prefill kernel): a "unit" is 32 weights of a row (one
 * 32-block, or an eighth of a 256-super-block) covering two 16-value runs A
 * and B of x; TT<T>::load reads a unit's bytes (loads only, so that several
 * units' loads can be in flight), prep decodes them (int8 values of the two
 * runs and their float factors), pos says where the runs lie in the row.
 * Shared so that every kernel reads the weights through the same code. */
#ifndef HN_CUDA_UNITS_CUH
#define HN_CUDA_UNITS_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda_wdec.cuh"

/* the quantized activations: row r's codes at q + r * ld, scales at d/s + r * ldb */
struct xview {
    const int8_t *q;
    const float *d, *s;
    int64_t ld, ldb;
};


/* ---- small device helpers ---- */

static __device__ __forceinline__ int dot4(int4 w, int4 x, int acc) {
    acc = __dp4a(w.x, x.x, acc);
    acc = __dp4a(w.y, x.y, acc);
    acc = __dp4a(w.z, x.z, acc);
    return __dp4a(w.w, x.w, acc);
}

static __device__ __forceinline__ int4 lo4(int4 q) {
    return make_int4(q.x & 0x0f0f0f0f, q.y & 0x0f0f0f0f, q.z & 0x0f0f0f0f, q.w & 0x0f0f0f0f);
}
static __device__ __forceinline__ int4 hi4(int4 q) {
    return make_int4((q.x >> 4) & 0x0f0f0f0f, (q.y >> 4) & 0x0f0f0f0f, (q.z >> 4) & 0x0f0f0f0f, (q.w >> 4) & 0x0f0f0f0f);
}

/* 4 bytes each holding a 4-bit index -> the 4 int8 entries of a 16-entry
 * table held as 4 words (t0 entries 0-3 ... t3 entries 12-15), by two byte
 * permutes and a select on each index's bit 3 */
static __device__ __forceinline__ int lut16(int idx, unsigned t0, unsigned t1, unsigned t2, unsigned t3) {
    const unsigned v = (unsigned)idx & 0x07070707u, t = v | (v >> 4);
    const unsigned sel = (t & 0xffu) | ((t >> 8) & 0xff00u);
    const unsigned lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const unsigned m = (((unsigned)idx >> 3) & 0x01010101u) * 0xffu;
    return (int)((hi & m) | (lo & ~m));
}

/* iq4_nl/iq4_xs values {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} as bytes */
#define IQ4_T0 0xbfad9881u /* -127 -104 -83 -65 */
#define IQ4_T1 0xf6eaddcfu /* -49 -35 -22 -10 */
#define IQ4_T2 0x26190d01u /* 1 13 25 38 */
#define IQ4_T3 0x71594535u /* 53 69 89 113 */
/* mxfp4 doubled E2M1 values {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} */
#define FP4_T0 0x03020100u
#define FP4_T1 0x0c080604u
#define FP4_T2 0xfdfeff00u
#define FP4_T3 0xf4f8fafcu

static __device__ __forceinline__ int4 lut4(int4 q, bool iq4) {
    if (iq4)
        return make_int4(lut16(q.x, IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3), lut16(q.y, IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3),
                         lut16(q.z, IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3), lut16(q.w, IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3));
    return make_int4(lut16(q.x, FP4_T0, FP4_T1, FP4_T2, FP4_T3), lut16(q.y, FP4_T0, FP4_T1, FP4_T2, FP4_T3),
                     lut16(q.z, FP4_T0, FP4_T1, FP4_T2, FP4_T3), lut16(q.w, FP4_T0, FP4_T1, FP4_T2, FP4_T3));
}

/* byte i (0..11) of the K-quant scale bytes held in h.y, h.z, h.w */
static __device__ __forceinline__ unsigned kbyte(const int4 &h, int i) {
    const unsigned w = i < 4 ? (unsigned)h.y : i < 8 ? (unsigned)h.z : (unsigned)h.w;
    return (w >> (8 * (i & 3))) & 0xffu;
}
/* the 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block, as integers and as floats */
static __device__ __forceinline__ void kscale_i(const int4 &h, int j, int &sc, int &m) {
    if (j < 4) {
        sc = (int)(kbyte(h, j) & 63);
        m = (int)(kbyte(h, j + 4) & 63);
    } else {
        sc = (int)((kbyte(h, j + 4) & 0xf) | ((kbyte(h, j - 4) >> 6) << 4));
        m = (int)((kbyte(h, j + 4) >> 4) | ((kbyte(h, j) >> 6) << 4));
    }
}
/* the same for the pair of sub-blocks 2p, 2p + 1 (p = 0..3) at once, as the
 * bytes [sc(2p), sc(2p + 1), m(2p), m(2p + 1)]: two byte permutes and a
 * select instead of kscale_i's per-byte choices (a lane's p is the same for
 * every unit it takes, so nothing diverges) */
static __device__ __forceinline__ unsigned kscale_pair(const int4 &h, int p) {
    const unsigned jl = (unsigned)(2 * p) & 3u;
    /* low p: bytes jl, jl + 1 (scales) and 4 + jl, 5 + jl (mins); high p: the same bytes carry the top two bits */
    const unsigned a = __byte_perm((unsigned)h.y, (unsigned)h.z, jl | (jl + 1) << 4 | (jl + 4) << 8 | (jl + 5) << 12);
    /* high p: bytes 8 + jl, 9 + jl hold the low four bits of the scales (low nibbles) and mins (high nibbles) */
    const unsigned b = __byte_perm((unsigned)h.w, 0u, jl | (jl + 1) << 4);
    const unsigned hi = (b & 0x0f0fu) | ((b << 12) & 0x0f0f0000u) | ((a >> 2) & 0x30303030u);
    return p < 2 ? a & 0x3f3f3f3fu : hi;
}

/* one unit's activations for one row: the runs A and B (16 codes each) and
 * their blocks' scales d and scaled sums s (when A and B lie in one block,
 * only the first of each is loaded) */
struct XU {
    int4 a, b;
    float da, db, sa, sb;
};

/* PAIR: A and B lie in consecutive blocks, the first of them even (the
 * K-quants' units), so each pair of factors is one 8-byte load (the
 * scratch's factor rows start 8-byte aligned and hold a multiple of 8) */
template <bool SUMS, bool ONE_BLOCK, bool PAIR = false>
static __device__ __forceinline__ void xload(const xview &x, int r, int pa, int pb, XU &o) {
    const int8_t *q = x.q + r * x.ld;
    o.a = __ldg((const int4 *)(q + pa));
    o.b = __ldg((const int4 *)(q + pb));
    const float *d = x.d + r * x.ldb;
    o.sa = o.sb = 0;
    if (PAIR) {
        const float2 dd = __ldg((const float2 *)(d + pa / 32));
        o.da = dd.x;
        o.db = dd.y;
        if (SUMS) {
            const float2 ss = __ldg((const float2 *)(x.s + r * x.ldb + pa / 32));
            o.sa = ss.x;
            o.sb = ss.y;
        }
        return;
    }
    o.da = __ldg(d + pa / 32);
    o.db = ONE_BLOCK ? o.da : __ldg(d + pb / 32);
    if (SUMS) {
        const float *s = x.s + r * x.ldb;
        o.sa = __ldg(s + pa / 32);
        if (!ONE_BLOCK) o.sb = __ldg(s + pb / 32);
    }
}

/* a unit of weights made ready for the activation rows: int8 values of the
 * runs A and B, their scales fa, fb, and the factors ma, mb of the
 * activation sums (q4_0's offset 8 and the K-quants' mins): the unit adds
 * fa * da * (A . xa) + fb * db * (B . xb) - ma * sa - mb * sb per row */
struct PU {
    int4 a, b;
    float fa, fb, ma, mb;
};

/* the float part of a unit, given the runs' exact integer dots ia, ib as
 * floats: every operation explicitly rounded (nothing contracted into an
 * FMA), so that mmv_q and mmq, which get ia, ib in different ways, give the
 * same bits. Without SUMS the min factors and sums are zero and, with
 * ONE_BLOCK, mb and sb: r - 0 * 0 is r exactly, so those terms are left out. */
template <bool SUMS, bool ONE_BLOCK>
static __device__ __forceinline__ float pcomb(float fa, float fb, float ma, float mb, float da, float db, float sa,
                                              float sb, float ia, float ib) {
    float r = __fadd_rn(__fmul_rn(__fmul_rn(fa, da), ia), __fmul_rn(__fmul_rn(fb, db), ib));
    if (SUMS) {
        r = __fsub_rn(r, __fmul_rn(ma, sa));
        if (!ONE_BLOCK) r = __fsub_rn(r, __fmul_rn(mb, sb));
    }
    return r;
}

template <bool SUMS, bool ONE_BLOCK>
static __device__ __forceinline__ float pdot(const PU &w, const XU &x) {
    return pcomb<SUMS, ONE_BLOCK>(w.fa, w.fb, w.ma, w.mb, x.da, x.db, x.sa, x.sb, (float)dot4(w.a, x.a, 0),
                                  (float)dot4(w.b, x.b, 0));
}

/* ---- per-type units: load (loads only, so that several units' loads are in
 * flight before the first use), prep (decoding, once per unit and weight
 * row), pos (where the unit's runs A and B lie in the row) ---- */

template <int T> struct TT;

template <> struct TT<QT_Q4_0> {
    static constexpr bool SUMS = true, ONE_BLOCK = true, PAIR = false;
    struct W { int4 q; unsigned short d; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        W o;
        o.q = __ldg((const int4 *)(w.p[0] + b * 16));
        o.d = __ldg((const unsigned short *)w.p[1] + b);
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) { pa = 32 * u; pb = pa + 16; }
    static __device__ __forceinline__ PU prep(const W &w, int) {
        const float d = h2f(w.d);
        return PU{lo4(w.q), hi4(w.q), d, d, 8.0f * d, 0.0f};
    }
};

template <> struct TT<QT_Q8_0> {
    static constexpr bool SUMS = false, ONE_BLOCK = true, PAIR = false;
    struct W { int4 q0, q1; unsigned short d; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        W o;
        o.q0 = __ldg((const int4 *)(w.p[0] + b * 32));
        o.q1 = __ldg((const int4 *)(w.p[0] + b * 32 + 16));
        o.d = __ldg((const unsigned short *)w.p[1] + b);
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) { pa = 32 * u; pb = pa + 16; }
    static __device__ __forceinline__ PU prep(const W &w, int) {
        const float d = h2f(w.d);
        return PU{w.q0, w.q1, d, d, 0.0f, 0.0f};
    }
};

/* q4_K/q5_K unit u = 8 * block + c: 16-byte chunk c of the codes; its low
 * nibbles are sub-block 2p (p = c / 2) values 16 (c & 1) .. +16, its high
 * nibbles the same values of sub-block 2p + 1. The min term covers a whole
 * sub-block, so the even chunk of each pair adds it. */
static __device__ __forceinline__ void kpos(int u, int &pa, int &pb) {
    const int c = u & 7;
    pa = 256 * (u >> 3) + 64 * (c >> 1) + 16 * (c & 1);
    pb = pa + 32;
}

static __device__ __forceinline__ PU kprep(const int4 &h, int c, int4 a, int4 b) {
    const float d = h2f((unsigned short)(h.x & 0xffff)), dmin = h2f((unsigned short)((unsigned)h.x >> 16));
    const unsigned sm = kscale_pair(h, c >> 1);
    const float sca = (float)(sm & 0xffu), scb = (float)((sm >> 8) & 0xffu), ma = (float)((sm >> 16) & 0xffu),
                mb = (float)(sm >> 24);
    const float odd = (c & 1) ? 0.0f : dmin;
    return PU{a, b, d * sca, d * scb, odd * ma, odd * mb};
}

template <> struct TT<QT_Q4_K> {
    static constexpr bool SUMS = true, ONE_BLOCK = false, PAIR = true;
    struct W { int4 q, h; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const uint8_t *blk = w.p[0] + (row * (w.k / 256) + (u >> 3)) * 144;
        W o;
        o.h = __ldg((const int4 *)blk);
        o.q = __ldg((const int4 *)(blk + 16 + 16 * (u & 7)));
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) { kpos(u, pa, pb); }
    static __device__ __forceinline__ PU prep(const W &w, int u) { return kprep(w.h, u & 7, lo4(w.q), hi4(w.q)); }
};

template <> struct TT<QT_Q5_K> {
    static constexpr bool SUMS = true, ONE_BLOCK = false, PAIR = true;
    struct W { int4 q, qh, h; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const uint8_t *blk = w.p[0] + (row * (w.k / 256) + (u >> 3)) * 176;
        W o;
        o.h = __ldg((const int4 *)blk);
        o.qh = __ldg((const int4 *)(blk + 16 + 16 * (u & 1)));
        o.q = __ldg((const int4 *)(blk + 48 + 16 * (u & 7)));
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) { kpos(u, pa, pb); }
    static __device__ __forceinline__ PU prep(const W &w, int u) {
        const int sh = 2 * ((u & 7) >> 1);
        int4 l = lo4(w.q), h = hi4(w.q);
        l.x |= (((unsigned)w.qh.x >> sh) & 0x01010101u) << 4;
        l.y |= (((unsigned)w.qh.y >> sh) & 0x01010101u) << 4;
        l.z |= (((unsigned)w.qh.z >> sh) & 0x01010101u) << 4;
        l.w |= (((unsigned)w.qh.w >> sh) & 0x01010101u) << 4;
        h.x |= (((unsigned)w.qh.x >> (sh + 1)) & 0x01010101u) << 4;
        h.y |= (((unsigned)w.qh.y >> (sh + 1)) & 0x01010101u) << 4;
        h.z |= (((unsigned)w.qh.z >> (sh + 1)) & 0x01010101u) << 4;
        h.w |= (((unsigned)w.qh.w >> (sh + 1)) & 0x01010101u) << 4;
        return kprep(w.h, u & 7, l, h);
    }
};

/* q6_K unit u = 8 * block + c: chunk c of ql (16 bytes) in half hf = c / 4;
 * with c4 = c % 4 its low nibbles are values 128 hf + 16 c4 .. +16 (scale
 * 8 hf + c4), its high nibbles those + 64 (scale + 4); the two high bits
 * come from qh bytes 32 hf + 16 (c4 & 1) .. +16, shifted by 2 (c4 / 2) and
 * that + 4. */
static __device__ __forceinline__ int q6v(unsigned ql, unsigned qh, int sh) {
    return (int)__vsub4((ql & 0x0f0f0f0fu) | (((qh >> sh) & 0x03030303u) << 4), 0x20202020u);
}

template <> struct TT<QT_Q6_K> {
    static constexpr bool SUMS = false, ONE_BLOCK = false, PAIR = false;
    struct W { int4 ql, qh; uint2 sc; unsigned short d; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 256) + (u >> 3);
        const int c = u & 7, hf = c >> 2;
        W o;
        o.ql = __ldg((const int4 *)(w.p[0] + b * 128 + 16 * c));
        o.qh = __ldg((const int4 *)(w.p[1] + b * 64 + 32 * hf + 16 * (c & 1)));
        o.sc = __ldg((const uint2 *)(w.p[2] + b * 16 + 8 * hf));
        o.d = __ldg((const unsigned short *)w.p[3] + b);
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) {
        pa = 256 * (u >> 3) + 128 * ((u & 7) >> 2) + 16 * (u & 3);
        pb = pa + 64;
    }
    static __device__ __forceinline__ PU prep(const W &w, int u) {
        const int c4 = u & 3, sh = 2 * (c4 >> 1);
        const int4 l = make_int4(q6v(w.ql.x, w.qh.x, sh), q6v(w.ql.y, w.qh.y, sh), q6v(w.ql.z, w.qh.z, sh),
                                 q6v(w.ql.w, w.qh.w, sh));
        const int4 h = make_int4(q6v(w.ql.x >> 4, w.qh.x, sh + 4), q6v(w.ql.y >> 4, w.qh.y, sh + 4),
                                 q6v(w.ql.z >> 4, w.qh.z, sh + 4), q6v(w.ql.w >> 4, w.qh.w, sh + 4));
        const float d = h2f(w.d);
        return PU{l, h, d * (float)(int8_t)(w.sc.x >> (8 * c4)), d * (float)(int8_t)(w.sc.y >> (8 * c4)), 0.0f, 0.0f};
    }
};

/* the signed 6-bit scale (ls - 32) of sub-block ib of an iq4_xs block, from its 8-byte header */
static __device__ __forceinline__ int iq4xs_scale(const uint2 &h, int ib) {
    return ((int)((h.y >> (4 * ib)) & 0xf) | (int)(((h.x >> (16 + 2 * ib)) & 3) << 4)) - 32;
}

/* iq4_xs unit u = 8 * block + ib: sub-block ib, 16 code bytes (low nibbles
 * values 0..15, high 16..31), scale from the block's 8-byte header */
template <> struct TT<QT_IQ4_XS> {
    static constexpr bool SUMS = false, ONE_BLOCK = true, PAIR = false;
    struct W { int4 q; uint2 h; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 256) + (u >> 3);
        W o;
        o.q = __ldg((const int4 *)(w.p[0] + b * 128 + 16 * (u & 7)));
        o.h = __ldg((const uint2 *)(w.p[1] + b * 8));
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) { pa = 32 * u; pb = pa + 16; }
    static __device__ __forceinline__ PU prep(const W &w, int u) {
        const int ib = u & 7;
        const float dl = h2f((unsigned short)(w.h.x & 0xffff)) * (float)iq4xs_scale(w.h, ib);
        return PU{lut4(lo4(w.q), true), lut4(hi4(w.q), true), dl, dl, 0.0f, 0.0f};
    }
};

template <> struct TT<QT_MXFP4> {
    static constexpr bool SUMS = false, ONE_BLOCK = true, PAIR = false;
    struct W { int4 q; unsigned char e; };
    static __device__ __forceinline__ W load(const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        W o;
        o.q = __ldg((const int4 *)(w.p[0] + b * 16));
        o.e = __ldg(w.p[1] + b);
        return o;
    }
    static __device__ __forceinline__ void pos(int u, int &pa, int &pb) { pa = 32 * u; pb = pa + 16; }
    static __device__ __forceinline__ PU prep(const W &w, int) {
        const float d = e8m0_half(w.e);
        return PU{lut4(lo4(w.q), false), lut4(hi4(w.q), false), d, d, 0.0f, 0.0f};
    }
};

/* what the kernels see of an uploaded weight */
static inline wview wview_of(const hc_weight *w) {
    wview v;
    for (int i = 0; i < 4; i++) v.p[i] = w->plane[i];
    v.k = w->k;
    v.n = w->n;
    return v;
}

/* asynchronous global -> shared copies of 16, 8 and 4 bytes (sm_80+) */
static __device__ __forceinline__ unsigned su32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void cpa16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(su32(dst)), "l"(src) : "memory");
}
static __device__ __forceinline__ void cpa8(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(su32(dst)), "l"(src) : "memory");
}
static __device__ __forceinline__ void cpa4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(su32(dst)), "l"(src) : "memory");
}

/* d = a (16 x 16 int8, rows of the weights) . b (16 x 8 int8) + c: lane 4 g + t
 * holds a's rows g and g + 8 at k = 4t..4t+3 (a0, a1), b's column g at
 * k = 4t..4t+3 (b) and gets d rows g (d[0], d[1]) and g + 8 (d[2], d[3]) at
 * columns 2t, 2t + 1 */
static __device__ __forceinline__ void mma_s8(int (&d)[4], unsigned a0, unsigned a1, unsigned b, int c) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c));
}

#endif
