/* apply.h: the tuner at model level. tn_tune_model finds every distinct
 * matmul weight shape (type, k, n) of a GGUF model and tunes it, on the
 * backend it is given (its mm_case_* ops make the cases: the candidates and
 * their meaning are the backend's), in both families: decode (the CPU's
 * "gemv" at one activation row; a device may ask for several call sizes,
 * e.g. CUDA's "cuda-gemv" at 1, 2, 4 and 8 rows: tune_info) and prefill
 * ("prefill", TN_PREFILL_ROWS_A and TN_PREFILL_ROWS_B rows, where the
 * backend has it; not the output matrix, whose prefill calls only carry the
 * rows that want logits), or takes the winners from the device's disk cache
 * (tune.h, keyed by the backend's fingerprint: the host's for the CPU, the
 * GPU's for CUDA) without running anything. tn_apply_report hands the
 * winners to the backend per shape and call size (its set_mm_params op):
 * a decode entry tuned at r rows applies from r rows up to the next decode
 * entry (the CPU's single one: 1..TN_DECODE_MAX_ROWS), from
 * TN_DECODE_MAX_ROWS + 1 rows the first prefill winner, from
 * TN_PREFILL_SWITCH rows the second. Searches the budget cuts short are
 * cached too (the best found within the budget), so a second start never
 * tunes again; `hone tune --force` redoes them.
 *
 * tn_load_tune is what model load calls (hone run, serve, bench): apply what
 * the cache holds and tune what it lacks within the budget (27 s of search,
 * 30 s with setup), with a
 * progress bar on stderr when stderr is a terminal and one summary line
 * either way (when the machine is busy, thread counts are not tuned); nothing at all when HONE_NO_TUNE is set to anything but "0" or
 * "" (the backend keeps its built-in defaults). HONE_TUNE_BUDGET=SECONDS
 * changes the budget. A cache that cannot be written (no directory, a full
 * or read-only disk) costs only the next start a new search: the results
 * apply to this run, with a warning. */
#ifndef HN_TN_APPLY_H
#define HN_TN_APPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../core/status.h"
#include "../gguf/gguf.h"
#include "tune.h"

#define TN_DECODE_MAX_ROWS 8   /* calls of at most this many rows take the decode parameters */
#define TN_PREFILL_ROWS_A 32   /* prefill is tuned at these call sizes */
#define TN_PREFILL_ROWS_B 128
#define TN_PREFILL_SWITCH 64   /* from this many rows on, the TN_PREFILL_ROWS_B winner applies */
#define TN_DEFAULT_BUDGET_S 27.0 /* leaves room for setup within 30 s on a loaded machine */

enum { TN_FAM_DECODE = 1, TN_FAM_PREFILL = 2 };

typedef struct tn_model_opts {
    be_backend *backend; /* the backend to tune for (borrowed); NULL: a CPU backend of n_threads, made and freed here */
    int n_threads;    /* with backend NULL: its threads (shapes are keyed by them); <= 0: all CPUs */
    double budget_s;  /* total tuning time; <= 0: TN_DEFAULT_BUDGET_S */
    int families;     /* TN_FAM_* bits; 0: both */
    bool force;       /* ignore cached entries and tune again (they are replaced) */
    bool progress;    /* draw a progress bar on stderr */
    bool cache_only;  /* answer from the cache only: shapes it lacks keep the defaults */
} tn_model_opts;

typedef struct tn_model_entry {
    const char *kernel;        /* the case's family: "gemv", "prefill", "cuda-gemv" */
    int family;                /* TN_FAM_DECODE or TN_FAM_PREFILL */
    char shape[96];            /* as cached: "q4_K k1024 n3072 r64 t2" */
    qt_type type;
    int64_t k, n;
    int rows;                  /* activation rows tuned at */
    int min_rows;              /* calls of at least this many rows use it (set_mm_params) */
    int n_tensors;             /* model tensors of this shape */
    bool is_output;            /* the logits matrix */
    bool tuned;                /* a result exists (false: cache_only miss, or not reached) */
    tn_result res;
    char cfg[256];             /* the chosen parameters, "kernel=gemm-avx2,threads=1,chunks=4" */
    be_mm_params params;       /* the same as backend parameters */
    size_t bytes;              /* weight bytes of one matrix */
    double macs;               /* multiply-adds of one run */
    double secs;               /* time spent on it (tuning or lookup) */
} tn_model_entry;

typedef struct tn_model_report {
    tn_model_entry *e;
    int n;
    int n_cached;      /* answered from the cache (nothing run) */
    int n_tuned;       /* searched now */
    int n_partial;     /* searches the budget cut short (applied, not cached) */
    int n_missing;     /* cache_only misses */
    int n_not_reached; /* cases the budget ran out before (defaults kept, tuned on a later start) */
    double elapsed_s;
    bool cache_corrupt;
    char cache_path[4200];
    char fingerprint[32];      /* the cache's key: the host's, or the device's (tune_info) */
    double load_avg;   /* the 1-minute load average when tuning started (-1: unknown) */
    int usable_cpus;   /* CPUs this process may use */
    bool busy_start;   /* other work kept the CPUs busy when tuning began (load >= usable CPUs): the
                        * threads parameter stays at all threads (fewer-thread winners measured under
                        * contention made whole-model decode slower) */
    bool busy;         /* busy_start and something was tuned: the winners may not hold on an idle machine */
    bool not_saved;    /* the results stand but the cache could not be written (no cache directory, a full or
                        * read-only disk): the call returned that error; save_msg says why */
    char save_msg[520];
} tn_model_report;

#define TN_SHAPE_MATS 64

/* One distinct matmul weight shape and where its matrices are. */
typedef struct tn_shape {
    qt_type type;
    int64_t k, n;
    const void *mats[TN_SHAPE_MATS]; /* up to TN_SHAPE_MATS matrices of the shape (none: synthetic weights) */
    int n_mats;
    int n_total;    /* tensors of this shape in the model */
    bool is_output; /* the logits matrix (not tuned for prefill) */
} tn_shape;

/* The distinct (type, k, n) of g's 2-D matmul weights that have a CPU dot
 * kernel, in file order, into a new array *out (hn_free it); returns the count
 * or -1 (out of memory). */
int tn_model_shapes(const gguf_ctx *g, tn_shape **out, hn_err *err);
/* Tunes (or looks up) shapes in the families of o for this device and saves
 * the cache; fills rep (free with tn_model_report_free, also after an error). */
hn_status tn_tune_shapes(const tn_shape *shapes, int n_shapes, const tn_model_opts *o, tn_model_report *rep,
                         hn_err *err);
/* tn_model_shapes + tn_tune_shapes. */
hn_status tn_tune_model(const gguf_ctx *g, const tn_model_opts *o, tn_model_report *rep, hn_err *err);
/* Frees rep's entries (rep itself is the caller's). */
void tn_model_report_free(tn_model_report *rep);
/* Sets every tuned entry of rep whose parameters differ from the defaults on
 * the backend b per shape and call size; returns how many were set. */
int tn_apply_report(be_backend *b, const tn_model_report *rep);
/* What backend b says of its tuning (backend.h: tune_info), or the CPU's
 * answer where it says nothing (host fingerprint, decode at 1 row, prefill). */
void tn_backend_info(be_backend *b, be_tune_info *out);

/* Load-time tuning (see the header comment): applies the cached or newly
 * tuned winners for g's shapes to backend b (a CPU backend on n_threads
 * threads). who prefixes the summary line ("hone run"). Returns HN_OK without
 * doing anything when HONE_NO_TUNE is set; an error leaves the defaults. */
hn_status tn_load_tune(be_backend *b, const gguf_ctx *g, int n_threads, const char *who, hn_err *err);
/* True when HONE_NO_TUNE asks for the built-in defaults. */
bool tn_no_tune_env(void);

#endif
