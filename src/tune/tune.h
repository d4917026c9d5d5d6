/* tune.h: the autotuner core: variant registry, validate-then-time search,
 * and the on-disk cache of winners.
 *
 * A kernel family describes one tuning case (the kernel at one real shape) as
 * a tn_case: its tunable parameters (name, candidate values, index of the
 * default), a reference that computes the trusted output (the scalar kernel),
 * and run(), which executes the real shape with one configuration. The tuner:
 *
 *   1. runs the reference once;
 *   2. for every configuration it tries (all of them when the grid has at most
 *      TN_EXHAUSTIVE configurations, else coordinate descent from the default:
 *      one parameter at a time over all its values, repeated until nothing
 *      moves): fills the output with NaN, runs once (this is also the warm-up)
 *      and validates every element, |out - ref| <= tol_abs + tol_max *
 *      max|ref| + tol_rel * |ref|, with NaN only where the reference has NaN
 *      (infinities must match); a candidate that fails is
 *      rejected whatever its speed; the default itself must pass, else
 *      tn_tune fails with HN_ERR_INTERNAL;
 *   3. times survivors: repetitions calibrated so one sample covers at least
 *      TN_MIN_SAMPLE_NS (a validation run that long already means one run per
 *      sample), TN_SCREEN_SAMPLES samples, median; on the host's clock around
 *      run(), or, for a case that has time() (a device), on the device's
 *      own clock (e.g. CUDA events around reps back-to-back runs, after the
 *      validation run warmed it up);
 *   4. confirms: the TN_CONFIRM_TOP fastest survivors and the default are
 *      re-timed in turn, TN_CONFIRM_SAMPLES samples each, or at least 3 when
 *      the case's share of the budget runs out (a noisy screening sample
 *      cannot crown or sink a candidate alone); the fastest of them is
 *      kept only when its median beats the default's by the margin
 *      (tn_margin_wins), else the default stays.
 *
 * Results are cached on disk in <cache dir>/tune-<fingerprint>.txt, one line
 * per (kernel, shape), holding the kernel's implementation version: a lookup
 * hits only when fingerprint, kernel, version and shape all match, so a new
 * machine or a changed kernel retunes. A malformed cache file is ignored as a
 * whole (tn_tuner_cache_was_corrupt says so) and rewritten on the next save.
 * Searches cut short by the time budget are reported (partial) and not cached
 * unless opts.cache_partial; a case that starts after the budget is spent runs
 * nothing and keeps the defaults (not_reached, never cached). The search itself stops at 80% of a case's share
 * so that confirmation fits in the rest.
 *
 * A total time budget is shared among the cases the caller announces
 * (tn_opts.n_cases, total_weight), half equally and half in proportion to
 * each case's weight; with
 * opts.progress a progress bar is drawn on stderr. A candidate whose first
 * timed run is TN_SLOW_FACTOR times slower than the default's median is not
 * sampled further (it cannot win), which keeps slow scalar variants cheap. */
#ifndef HN_TN_TUNE_H
#define HN_TN_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

#define TN_MAX_PARAMS 6
#define TN_MAX_VALUES 16
#define TN_EXHAUSTIVE 64         /* grids this small are searched completely */
#define TN_MIN_SAMPLE_NS 1000000 /* a timed sample covers at least 1 ms of runs */
#define TN_SCREEN_SAMPLES 3
#define TN_CONFIRM_SAMPLES 7
#define TN_CONFIRM_TOP 3
#define TN_SLOW_FACTOR 3.0
#define TN_DEFAULT_MARGIN 0.03   /* a winner must be 3% faster than the default */
#define TN_CACHE_VERSION 1       /* the cache file's format and the search's definition */

/* One tunable parameter: candidate values, optional labels (what the cache and
 * tables show; NULL means the decimal value) and the index of the default. */
typedef struct tn_param {
    const char *name;
    int n;
    int values[TN_MAX_VALUES];
    const char *labels[TN_MAX_VALUES];
    int def;
} tn_param;

/* One kernel at one shape. kernel, version and shape are short strings without
 * whitespace other than single spaces in shape (no tabs or newlines). */
typedef struct tn_case {
    const char *kernel;  /* family name: "gemv" */
    const char *version; /* implementation version compiled in; bump when the kernel changes */
    char shape[96];      /* the real shape: "q4_K 1024x3072 r1" */
    int n_params;
    tn_param params[TN_MAX_PARAMS];
    size_t n_out;         /* floats written by reference and run */
    float tol_abs, tol_rel;
    float tol_max; /* adds tol_max * max|ref| to tol_abs (error that scales with the output) */
    void *ctx;
    /* Writes the trusted output for the shape into out. */
    hn_status (*reference)(void *ctx, float *out, hn_err *err);
    /* Runs the real shape once with cfg[i] = a value of params[i], writing out;
     * returns false if the configuration cannot run here (it is skipped). */
    bool (*run)(void *ctx, const int *cfg, float *out);
    /* Optional: called before every validation run so that run computes what
     * the reference did (e.g. rewinds a rotation over copies of the weights). */
    void (*reset)(void *ctx);
    /* Optional (a device): runs configuration cfg reps times back to back,
     * as run does but without returning the output, and returns the
     * nanoseconds of one run measured on the device's clock; <= 0 when it
     * cannot (the tuner then times run() on the host's clock). */
    double (*time)(void *ctx, const int *cfg, int reps);
    /* Share of the budget relative to the other cases (e.g. bytes one run
     * reads); <= 0 means 1. */
    double weight;
} tn_case;

typedef struct tn_result {
    int cfg[TN_MAX_PARAMS]; /* the chosen values (the defaults unless beaten) */
    double default_ns;      /* median time of one run with the defaults */
    double tuned_ns;        /* median time of one run with cfg (= default_ns if default kept) */
    int n_tried;            /* configurations run (validated) */
    int n_rejected;         /* of those, failed validation */
    int n_skipped;          /* run() said it cannot run */
    bool cached;            /* came from the cache: nothing was run */
    bool partial;           /* the budget cut the search short (not cached) */
    bool changed;           /* cfg differs from the defaults */
    bool not_reached;       /* the budget was spent before this case: nothing run, defaults, not cached */
} tn_result;

typedef struct tn_opts {
    double budget_s; /* total for this tuner; <= 0 means 30 s */
    int n_cases;     /* cases the caller will tune; <= 0 means 1 */
    double total_weight; /* sum of their weights (shares the budget); <= 0 means n_cases */
    double margin;   /* < 0 means TN_DEFAULT_MARGIN */
    bool force;      /* ignore cached entries (they are replaced) */
    bool progress;   /* draw a progress bar on stderr */
    bool no_cache;   /* neither read nor write the disk cache */
    bool cache_partial; /* cache searches the budget cut short too (the best found so far) */
} tn_opts;

typedef struct tn_tuner tn_tuner;

/* Opens a tuner for this device fingerprint, loading its cache file from the
 * cache directory (see probe.h) unless opts->no_cache. */
hn_status tn_tuner_open(const char *fingerprint, const tn_opts *opts, tn_tuner **out, hn_err *err);
/* Frees the tuner (NULL is fine); does not save. */
void tn_tuner_close(tn_tuner *t);
/* Tunes one case (or takes its cached result) and records it for tn_tuner_save. */
hn_status tn_tune(tn_tuner *t, const tn_case *c, tn_result *res, hn_err *err);
/* Writes every recorded entry (loaded and new) to the cache file atomically. */
hn_status tn_tuner_save(tn_tuner *t, hn_err *err);
/* Looks a case up without running anything: true and cfg filled when the cache
 * holds this (kernel, version, shape) with labels that parse for c's params. */
bool tn_tuner_lookup(const tn_tuner *t, const tn_case *c, int *cfg, double *default_ns, double *tuned_ns);
/* True when the cache file existed but was malformed (it was ignored). */
bool tn_tuner_cache_was_corrupt(const tn_tuner *t);
/* The cache file's path ("" with no_cache). */
const char *tn_tuner_cache_path(const tn_tuner *t);
/* Seconds of budget used so far. */
double tn_tuner_elapsed(const tn_tuner *t);

/* True when a candidate's median (cand_ns) beats the default's by more than
 * margin, i.e. cand_ns < default_ns * (1 - margin); false on non-positive times. */
bool tn_margin_wins(double default_ns, double cand_ns, double margin);

/* True when every out[i] is within tol_abs + tol_rel*|ref[i]| of ref[i] (NaN
 * only where ref is NaN, infinities equal); else false and *bad = first index. */
bool tn_validate(const float *ref, const float *out, size_t n, float tol_abs, float tol_rel, size_t *bad);

/* Writes "name=label,name=label" for cfg into buf; returns buf. */
const char *tn_cfg_str(const tn_case *c, const int *cfg, char *buf, size_t cap);

#endif
