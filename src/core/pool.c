/* pool.c: the thread pool.
 *
 * A job is published by bumping `gen` after resetting `ticket`, a 64-bit word:
 * high 32 bits the job's generation, bit 31 "closed", low bits the number of
 * workers that joined. A worker joins by CAS-incrementing the ticket while it
 * still names the job and is open, runs fn, then increments `done`. For a
 * shared job the caller closes the ticket after its own fn call and waits for
 * exactly the workers that joined; for a full job it waits for all n-1. Both
 * waits spin for a short while and then sleep on a futex (Linux) or a
 * condition variable (elsewhere). */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS 20000
#define TICKET_CLOSED 0x80000000u

struct pool {
    int n;
    pthread_t *threads;
    struct worker_arg *args;  /* [n - 1] */
    pool_fn fn;
    void *ctx;
    _Atomic int gen;          /* bumped once per job; workers wake on change */
    _Atomic uint64_t ticket;  /* gen << 32 | closed | joined */
    _Atomic int done;         /* workers that finished the current job */
    _Atomic int stop;
    _Atomic int sleepers;     /* threads sleeping (or about to) on gen or done */
    int hook;                 /* pool_test_slow was called: threads count their chunks */
    int slow_ith, slow_us;
    _Atomic long *chunks;     /* [n] chunks taken per thread while hooked */
#ifndef __linux__
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
};

typedef struct worker_arg {
    pool *p;
    int ith;
} worker_arg;

_Thread_local int pool_tl_hooked;
static _Thread_local _Atomic long *tl_count;
static _Thread_local int tl_delay_us;

/* The test hook's per-chunk work: count, and busy-wait when slowed. */
void pool_hook_chunk(void) {
    atomic_fetch_add_explicit(tl_count, 1, memory_order_relaxed);
    if (tl_delay_us <= 0) return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        cpu_relax();
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 < tl_delay_us);
}

/* Arms (or disarms) the calling thread's hook for a job of p run as ith. */
static void hook_enter(pool *p, int ith) {
    pool_tl_hooked = p->hook;
    if (!p->hook) return;
    tl_count = &p->chunks[ith];
    tl_delay_us = ith == p->slow_ith ? p->slow_us : 0;
}

void pool_test_slow(pool *p, int ith, int delay_us) {
    if (!p) return;
    p->hook = 1;
    p->slow_ith = delay_us > 0 ? ith : -1;
    p->slow_us = delay_us;
    for (int i = 0; i < p->n; i++) atomic_store(&p->chunks[i], 0);
}

long pool_test_chunks(const pool *p, int ith) {
    return p && ith >= 0 && ith < p->n ? atomic_load(&p->chunks[ith]) : 0;
}

/* Sleeps while *addr == val (spurious wake-ups are fine: callers loop). */
static void wait_on(pool *p, _Atomic int *addr, int val) {
#ifdef __linux__
    (void)p;
    syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->mu);
    if (atomic_load(addr) == val) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
#endif
}

static void wake_all(pool *p, _Atomic int *addr) {
#ifdef __linux__
    (void)p;
    syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0);
#else
    (void)addr;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
#endif
}

/* Waits until *addr != val: spin, then sleep. */
static void await_change(pool *p, _Atomic int *addr, int val) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val) return;
        cpu_relax();
    }
    while (atomic_load_explicit(addr, memory_order_acquire) == val) {
        atomic_fetch_add(&p->sleepers, 1); /* seq_cst, then re-check: no lost wake-up */
        if (atomic_load(addr) == val) wait_on(p, addr, val);
        atomic_fetch_sub(&p->sleepers, 1);
    }
}

static void *worker_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    pool *p = a.p;
    int seen = 0; /* gen starts at 0: a job published before this thread ran is still seen */
    for (;;) {
        await_change(p, &p->gen, seen);
        seen = atomic_load(&p->gen);
        if (atomic_load(&p->stop)) break;
        /* join the job if it is still the current one and open */
        uint64_t t = atomic_load(&p->ticket);
        bool joined = false;
        while ((uint32_t)(t >> 32) == (uint32_t)seen && !(t & TICKET_CLOSED)) {
            if (atomic_compare_exchange_weak(&p->ticket, &t, t + 1)) {
                joined = true;
                break;
            }
        }
        if (!joined) continue;
        hook_enter(p, a.ith);
        p->fn(p->ctx, a.ith, p->n);
        atomic_fetch_add(&p->done, 1);
        if (atomic_load(&p->sleepers) > 0) wake_all(p, &p->done);
    }
    return NULL;
}

hn_status pool_create(int n_threads, pool **out, hn_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return hn_errf(err, HN_ERR_INVALID, "pool: %d threads (want 1..1024)", n_threads);
    pool *p = hn_calloc(1, sizeof *p);
    if (!p) return hn_errf(err, HN_ERR_NOMEM, "pool: out of memory");
    p->n = n_threads;
    p->chunks = hn_calloc((size_t)n_threads, sizeof *p->chunks);
    if (!p->chunks) {
        hn_free(p);
        return hn_errf(err, HN_ERR_NOMEM, "pool: out of memory");
    }
#ifndef __linux__
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
#endif
    if (n_threads > 1) {
        /* the workers' arguments live as long as the pool, so that no thread
         * frees memory behind the back of a caller counting hn_alloc_bytes */
        p->threads = hn_calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = hn_calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) {
            hn_free(p->threads);
            hn_free(p->args);
            hn_free(p->chunks);
            hn_free(p);
            return hn_errf(err, HN_ERR_NOMEM, "pool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = &p->args[i - 1];
        a->p = p;
        a->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
            p->n = i; /* join the ones that started */
            pool_free(p);
            return hn_errf(err, HN_ERR_NOMEM, "pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return HN_OK;
}

void pool_free(pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    wake_all(p, &p->gen);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
#ifndef __linux__
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
#endif
    hn_free(p->threads);
    hn_free(p->args);
    hn_free(p->chunks);
    hn_free(p);
}

int pool_n_threads(const pool *p) { return p ? p->n : 1; }

static void run(pool *p, pool_fn fn, void *ctx, bool shared) {
    if (!p || p->n == 1) {
        if (p) hook_enter(p, 0);
        fn(ctx, 0, 1);
        pool_tl_hooked = 0;
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    int g = atomic_load(&p->gen) + 1;
    atomic_store(&p->ticket, (uint64_t)(uint32_t)g << 32);
    atomic_store(&p->gen, g); /* seq_cst: pairs with the sleepers count */
    if (atomic_load(&p->sleepers) > 0) wake_all(p, &p->gen);
    hook_enter(p, 0);
    fn(ctx, 0, p->n);
    pool_tl_hooked = 0;
    int want = p->n - 1;
    if (shared) want = (int)(atomic_fetch_or(&p->ticket, TICKET_CLOSED) & 0x7fffffffu);
    for (;;) {
        int d = atomic_load(&p->done);
        if (d >= want) break;
        await_change(p, &p->done, d);
    }
}

void pool_run(pool *p, pool_fn fn, void *ctx) { run(p, fn, ctx, false); }
void pool_run_shared(pool *p, pool_fn fn, void *ctx) { run(p, fn, ctx, true); }

int pool_cpu_count(void) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
