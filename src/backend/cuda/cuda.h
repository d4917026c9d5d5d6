/* cuda.h: the CUDA foundation of the future cuda backend (DESIGN.md,
 * "backend/ cuda"): device probe, CUDA errors as hn_status, device memory,
 * and the quantized matrix-vector kernels of decode.
 *
 * This is C, callable from the C engine; the kernels live in *.cu files
 * compiled by nvcc into libhone_cuda.a (only when the build found nvcc: then
 * HN_HAVE_CUDA is defined). The CUDA runtime is linked statically and finds
 * the driver at run time, so a machine without a driver or GPU still runs the
 * CPU engine: hc_init() then fails with HN_ERR_UNSUPPORTED and a message.
 *
 * No function aborts: every CUDA error becomes an hn_status plus a message
 * naming the call ("cuda: cudaMalloc(1073741824 bytes): out of memory").
 * Functions that queue work on a stream report launch errors at once;
 * errors of the work itself appear at the next hc_sync.
 *
 * Matrix-vector product (decode): y[r][j] = dot(W[j], x[r]) for r < na
 * (1..HC_GEMV_MAX_ROWS activation rows), W an N x K matrix in its GGUF type
 * in device memory (hc_weight), x f32 [na][K] and y f32 [na][N], both device
 * memory, row-major. For the integer types (q4_0, q8_0, q4_K, q5_K, q6_K,
 * iq4_xs, mxfp4) x is first quantized on the device to 8 bits per value
 * exactly as the CPU backend quantizes it for the same weight type (Q8_0 for
 * the 32-block types, Q8_K for the 256-block ones: hc_gemv_act), so that the
 * two backends agree to float rounding, and the inner product is dp4a on
 * int8; f16 weights multiply f32 x directly, bf16 weights x rounded to bf16
 * (as the CPU does). Every type also has a scalar reference kernel (one thread per
 * output, f32 x, f64 sum, each weight decoded on its own from the device
 * layout) that tests compare with the CPU's dequantizer. */
#ifndef HN_CUDA_H
#define HN_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the C headers below too: hn_errf is a C function */
#endif

#include "../../core/status.h"
#include "../../quant/blocks.h"

#define HC_GEMV_MAX_ROWS 8

typedef struct hc_device {
    int index;
    char name[256];
    int cc_major, cc_minor;   /* compute capability */
    int sm_count;
    int l2_bytes;
    int smem_per_block_optin; /* largest dynamic shared memory a block may ask for */
    int clock_khz, mem_clock_khz, mem_bus_bits;
    size_t mem_total, mem_free;
    int driver_version, runtime_version; /* 13000 = 13.0 */
} hc_device;

/* Selects device `index` and makes its context. HN_ERR_UNSUPPORTED (with the
 * reason) when there is no driver, no device or no such device. */
hn_status hc_init(int index, hn_err *err);
/* Number of CUDA devices (0 without a driver or device; never fails). */
int hc_device_count(void);
/* Properties of the current device (after hc_init). */
hn_status hc_probe(hc_device *out, hn_err *err);
/* Device-to-device copy bandwidth in GB/s (bytes read + written, 1e9),
 * measured with a 16-byte-per-thread copy kernel over two buffers of `bytes`
 * (rounded down to 16), median of `reps` timed copies after a warm-up. */
hn_status hc_copy_bandwidth(size_t bytes, int reps, double *gbps, hn_err *err);

/* Read bandwidth in GB/s: a kernel that only reads `bytes` (16 bytes per
 * thread per step, summed into one word per thread), the ceiling of a
 * matrix-vector product, which reads its weights and writes almost nothing. */
hn_status hc_read_bandwidth(size_t bytes, int reps, double *gbps, hn_err *err);

/* ---- memory and streams (thin wrappers that turn errors into hn_status) ---- */
hn_status hc_malloc(void **p, size_t bytes, hn_err *err);
void hc_free(void *p);
hn_status hc_upload(void *dst, const void *src, size_t bytes, hn_err *err);
hn_status hc_download(void *dst, const void *src, size_t bytes, hn_err *err);
/* Fills n floats at p (device) with f, e.g. NaN to poison an output (queued on the default stream). */
hn_status hc_fill_f32(float *p, size_t n, float f, hn_err *err);
/* Waits for the device; the first error of queued work. */
hn_status hc_sync(hn_err *err);

/* Times device work with two CUDA events on a stream (NULL: the default). */
typedef struct hc_timer {
    void *start, *stop;
} hc_timer;
hn_status hc_timer_init(hc_timer *t, hn_err *err);
void hc_timer_free(hc_timer *t);
void hc_timer_start(hc_timer *t, void *stream);
void hc_timer_stop(hc_timer *t, void *stream);
/* Waits for the stop event; milliseconds between the two events. */
hn_status hc_timer_ms(hc_timer *t, float *ms, hn_err *err);

/* ---- weights ---- */

/* A matrix of n rows of k elements in GGUF type `type` on the device. The
 * bytes are those of the file, possibly split into planes (all block scales
 * of the matrix in one array, all codes in another), so that the kernels
 * read 16 aligned bytes at a time: blocks of 18, 34, 136, 210 or 17 bytes
 * are not 16-byte aligned in the file layout. q4_K, q5_K (144, 176 bytes),
 * f16 and bf16 stay in the file layout. gguf_bytes is what one product reads. */
typedef struct hc_weight {
    qt_type type;
    int64_t k, n;
    size_t gguf_bytes;
    void *mem;                 /* the one allocation (owned) */
    const uint8_t *plane[4];   /* views into mem */
} hc_weight;

/* True if hc_gemv has kernels for the type. */
bool hc_gemv_supports(qt_type t);
/* How hc_gemv converts x for a weight type (the CPU backend's activation type). */
typedef enum { HC_ACT_F32 = 0, HC_ACT_BF16, HC_ACT_Q8_0, HC_ACT_Q8_K } hc_act;
hc_act hc_gemv_act(qt_type t);
/* Uploads n rows of k elements of type t from host memory (the file bytes:
 * n * qt_row_size(t, k)) and repacks them on the device. k must be a whole
 * number of blocks; bad shapes or types give HN_ERR_INVALID/UNSUPPORTED. */
hn_status hc_weight_upload(hc_weight *w, qt_type t, int64_t k, int64_t n, const void *host, hn_err *err);
void hc_weight_free(hc_weight *w);

/* ---- matrix-vector products ---- */

/* Scratch for the quantized activations (device memory, made once). */
typedef struct hc_gemv_scratch {
    int64_t max_k;
    int max_rows;  /* HC_GEMV_MAX_ROWS, or more for hc_mmq */
    int8_t *xq;    /* [max_rows][max_k] */
    float *xd;     /* [max_rows][max_k / 32]: block scales */
    float *xs;     /* [max_rows][max_k / 32]: scale * sum of the block's codes */
    void *xh;      /* [max_rows][max_k] f16: hc_mmf's activations for f16 weights */
    float *xe;     /* [max_rows]: their rows' power-of-two factors */
} hc_gemv_scratch;

/* for HC_GEMV_MAX_ROWS rows of up to max_k values */
hn_status hc_gemv_scratch_init(hc_gemv_scratch *s, int64_t max_k, hn_err *err);
/* for max_rows (HC_GEMV_MAX_ROWS..65535) rows: what hc_mmq needs for that many */
hn_status hc_gemv_scratch_init_rows(hc_gemv_scratch *s, int64_t max_k, int max_rows, hn_err *err);
void hc_gemv_scratch_free(hc_gemv_scratch *s);

/* Kernel parameters (0: the built-in choice); they change speed only, never
 * a bit of the result (every lane sums its units in the same order, and the
 * warp's butterfly is the same, whatever they are). rows_per_warp: output
 * rows one warp computes together (1, 2 or 4), so that the activation values
 * a lane loads serve that many weight rows. units: 32-weight units (8-weight
 * for f16/bf16) of loads a lane has in flight before it computes, counted
 * over its rows (4 or 8; built in: 4). warps: warps a block (2, 4 or 8;
 * built in: 4). reuse_x: the scratch already holds this x, quantized by the
 * previous call on the same stream with the same x, na, k and hc_gemv_act
 * (weights sharing an input, as q/k/v or gate/up do, convert it once);
 * ignored for f16/bf16. */
typedef struct hc_gemv_params {
    int rows_per_warp;
    int reuse_x;
    int units;
    int warps;
} hc_gemv_params;

/* Queues y = W x (see the top of this file) on `stream` (a cudaStream_t;
 * NULL: the default stream). p may be NULL. Fails on bad arguments (na out of
 * 1..8, k over the scratch, parameters out of their sets) or a launch error. */
hn_status hc_gemv(const hc_weight *w, const float *x, int na, float *y, hc_gemv_scratch *s,
                  const hc_gemv_params *p, void *stream, hn_err *err);
/* The parameters hc_gemv runs w with for na rows under p (NULL: the
 * built-in ones): p's non-zero fields, the built-in choice for the others;
 * reuse_x is p's. */
hc_gemv_params hc_gemv_resolve(const hc_weight *w, int na, const hc_gemv_params *p);
/* n_w (1..3) weights sharing x in one launch (q/k/v, gate/up), each with
 * the parameters p (NULL: the built-in ones, which must then be the same for
 * all), so each y[i] has hc_gemv's bits. hc_gemv_multi_ok: whether they can
 * (one integer type, one row length, one resolved set of parameters).
 * reuse_x is p's. */
int hc_gemv_multi_ok(int n_w, const hc_weight *const *w, int na, const hc_gemv_params *p);
hn_status hc_gemv_multi(int n_w, const hc_weight *const *w, const float *x, int na, float *const *y,
                        hc_gemv_scratch *s, const hc_gemv_params *p, void *stream, hn_err *err);
/* Copies a weight on the device (dst gets its own allocation, same layout):
 * the tuner's rotation of copies, so that timed runs stream from memory. */
hn_status hc_weight_clone(hc_weight *dst, const hc_weight *src, hn_err *err);
/* The scalar reference: same contract, one thread per output, no scratch. */
hn_status hc_gemv_ref(const hc_weight *w, const float *x, int na, float *y, void *stream, hn_err *err);

/* Fused producers of a quantized x for the next hc_gemv / hc_gemv_multi /
 * hc_mmq with reuse_x (a decode step's records fuse them): each writes its
 * f32 output AND leaves it in the scratch quantized for act (Q8_0 or Q8_K),
 * the bits of the unfused kernels followed by the gemv's own quantization.
 * hc_norm_quant: [x = x + r (r may be NULL);] y = rms_norm(x) * w (w may be
 * NULL), n rows of dim. hc_swiglu_quant: y = silu(g) * u, n rows of k.
 * hc_quant_fusable: whether they take that act, row length and row count
 * (hc_norm_quant also needs dim <= HC_NORM_QUANT_MAX: the row sits in shared
 * memory; hc_swiglu_quant takes any k). */
#define HC_NORM_QUANT_MAX 8192
bool hc_quant_fusable(hc_act act, int64_t dim, int na, const hc_gemv_scratch *s);
hn_status hc_norm_quant(float *x, const float *r, const float *w, int n, int dim, float eps, float *y, hc_act act,
                        hc_gemv_scratch *s, void *stream, hn_err *err);
hn_status hc_swiglu_quant(const float *g, const float *u, int n, int64_t k, float *y, hc_act act,
                          hc_gemv_scratch *s, void *stream, hn_err *err);

/* Expert stacks: w holds mats matrices of nr rows each (w->n = mats * nr).
 * Slot s (0 <= s < slots) computes y[s][0..nr) = W_e x_r with e = ids[s]
 * (device memory, read there: a recorded step needs no host round trip), or
 * e = mat when ids is NULL; an e outside [0, mats) gives zeros; r = s / ks
 * (ks > 0: the k slots of a token share its row, as moe_matmul's shared x)
 * or r = s (ks 0). x (f32 rows) is quantized here, in chunks of the
 * scratch's rows; reuse_x: the scratch already holds them, quantized for
 * w's activation type and row length by the call before (one chunk only:
 * HN_ERR_INVALID otherwise). Every slot has the bits of a one-row hc_gemv of
 * matrix e, whatever the slots around it. Integer types
 * (hc_gemv_slots_supports). */
bool hc_gemv_slots_supports(qt_type t);
hn_status hc_gemv_slots(const hc_weight *w, int64_t nr, int mats, const float *x, int slots, int ks,
                        const int32_t *ids, int mat, float *y, hc_gemv_scratch *s, int reuse_x, void *stream,
                        hn_err *err);
/* hc_gemv_slots2: a MoE layer's gate and up products of the same x in one
 * launch (wg and wu: expert stacks of one type and shape; ids on the device):
 * yg and yu as two hc_gemv_slots calls would give them, bit for bit, and
 * with h (else NULL) h = swiglu(yg, yu) as the backend's swiglu op computes
 * it. NOT YET RUN ON A GPU: the backend calls it only with
 * HONE_CUDA_SLOTS2=1. */
hn_status hc_gemv_slots2(const hc_weight *wg, const hc_weight *wu, int64_t nr, int mats, const float *x, int slots,
                         int ks, const int32_t *ids, float *yg, float *yu, float *h, hc_gemv_scratch *s, int reuse_x,
                         void *stream, hn_err *err);

/* ---- matrix-matrix products (prefill) ----
 *
 * hc_mmq: y = W x for na rows (1..s->max_rows), the integer types only
 * (hc_mmq_supports), on the tensor cores (int8 mma.sync): every output is
 * BIT-IDENTICAL to hc_gemv's for the same row (whatever na, the rows around
 * it or the parameters), so a row's result does not depend on the batch it
 * came in. It pays from about HC_MMQ_MIN_ROWS rows; fewer take hc_gemv.
 * x is quantized into the scratch as hc_gemv does (all na rows);
 * p->reuse_x: the scratch already holds this x for all na rows (a previous
 * hc_mmq, or an hc_gemv of the same na <= HC_GEMV_MAX_ROWS rows); rows_per_warp
 * is ignored. How the bits stay equal: cuda_gemv.cu, "matrix-matrix". */
#define HC_MMQ_MIN_ROWS 16
bool hc_mmq_supports(qt_type t);
hn_status hc_mmq(const hc_weight *w, const float *x, int na, float *y, hc_gemv_scratch *s, const hc_gemv_params *p,
                 void *stream, hn_err *err);

/* hc_mmf: y = W x for na rows (1..s->max_rows) on the tensor cores, for the
 * types of hc_mmf_supports with rows of a multiple of 64 values
 * (hc_mmf_takes). The integer types: x quantized as hc_gemv quantizes it
 * (into the same scratch; reuse_x as in hc_gemv_params, for all na rows),
 * exact integer dots (int8 mma.sync) and the CPU's scalings, so the result
 * is the CPU's up to the float summation order; f16 weights: x as f16 (the
 * CPU's f16 dot converts it so), f16 mma.sync with f32 sums. A row's result
 * does not depend on na or the other rows (no split over k), but it is NOT
 * hc_gemv's bits (another float summation order). For prefill rows; decode
 * rows and rows that must equal a decode step take hc_gemv / hc_mmq. How:
 * cuda_mmf.cu. */
bool hc_mmf_supports(qt_type t);
bool hc_mmf_takes(const hc_weight *w);
hn_status hc_mmf(const hc_weight *w, const float *x, int na, float *y, hc_gemv_scratch *s, int reuse_x, void *stream,
                 hn_err *err);

/* hc_mmf_slots: a MoE layer's prefill product on the tensor cores, in one
 * launch: w an expert stack (mats matrices of nr rows, w->n = mats * nr), slot q
 * (0 <= q < slots) gets y[q][0..nr) = W_e x_r with e = ids[q] (device memory)
 * and r = q / ks (ks > 0: a token's k slots share its row) or q; a slot whose
 * e is outside [0, mats) is not written. The slots are sorted by expert on the
 * device (work: device memory of hc_mmf_slots_work bytes), tiles of up to 128
 * slots of one expert; x (its rows: ceil(slots / ks) or slots, at most the
 * scratch's) quantized once. Each slot has hc_mmf's bits for its row alone
 * times its matrix alone (a row's result depends only on that row). Integer
 * types (hc_mmf_slots_takes); moe_matmul's prefill tokens take it. */
size_t hc_mmf_slots_work(int slots, int mats);
bool hc_mmf_slots_takes(const hc_weight *w, int64_t nr, int mats);
hn_status hc_mmf_slots(const hc_weight *w, int64_t nr, int mats, const float *x, int slots, int ks, const int32_t *ids,
                       float *y, hc_gemv_scratch *s, void *work, size_t work_bytes, void *stream, hn_err *err);

#ifdef __cplusplus
}
#endif

#endif
