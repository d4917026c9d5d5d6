/* pool.h: a fixed thread pool for data-parallel kernels.
 *
 * A pool of n threads is the caller plus n-1 workers. pool_run(p, fn, ctx)
 * calls fn(ctx, ith, n) once on every thread (the caller is ith 0) and returns
 * when all calls have returned, so a kernel splits its work by ith/nth and
 * needs no locking. Dispatch is a generation counter: idle workers spin
 * briefly on it (a matmul follows a matmul within microseconds in the token
 * loop) and then sleep on a futex, so an idle pool burns no CPU. pool_run
 * does not allocate (nor does pool_run_shared). It must not be called from inside fn, nor from two
 * threads at once on the same pool. */
#ifndef HN_POOL_H
#define HN_POOL_H

#include <stdatomic.h>

#include "status.h"

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n_threads (>= 1; 1 means the caller only). */
hn_status pool_create(int n_threads, pool **out, hn_err *err);
/* Stops and joins the workers and frees the pool (NULL is fine). */
void pool_free(pool *p);
/* The number of threads, caller included. */
int pool_n_threads(const pool *p);
/* Runs fn(ctx, ith, nth) on every thread and waits for all of them. */
void pool_run(pool *p, pool_fn fn, void *ctx);
/* Work-sharing run: fn runs on the caller and on the workers that pick the job
 * up before the caller's call returns; workers that arrive later skip it. fn
 * must therefore share its work dynamically (an atomic counter of chunks) so
 * that any subset of threads finishes it; ith is still unique per call. On a
 * busy machine this avoids waiting for a worker the OS has not scheduled. */
void pool_run_shared(pool *p, pool_fn fn, void *ctx);
/* Takes the next piece of a work-sharing job: atomic_fetch_add(next, step),
 * relaxed; end is the job's size (a value >= end takes nothing). Kernels take
 * their chunks through it so that the test hook below sees each chunk. */
extern _Thread_local int pool_tl_hooked;
void pool_hook_chunk(void);
static inline int pool_take(_Atomic int *next, int step, int end) {
    int c = atomic_fetch_add_explicit(next, step, memory_order_relaxed);
    if (__builtin_expect(pool_tl_hooked, 0) && c < end) pool_hook_chunk();
    return c;
}
/* Test hook (tests only; nothing in the engine calls it): from the next run
 * on, thread ith busy-waits delay_us microseconds for each chunk it takes
 * through pool_take (a slow core: an E core, or one shared with another
 * process; ith < 0 or delay_us 0: none slowed), and every thread counts the
 * chunks it takes. Call it between runs. */
void pool_test_slow(pool *p, int ith, int delay_us);
/* Chunks thread ith (0 = the caller) took through pool_take in runs since the
 * last pool_test_slow. */
long pool_test_chunks(const pool *p, int ith);
/* Number of CPUs this process may run on (at least 1). */
int pool_cpu_count(void);

#endif
