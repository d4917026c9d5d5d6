/* test_pool.c: the thread pool runs fn once per thread with the right ith/nth,
 * back to back many times (dispatch races), after an idle sleep (the futex
 * path), and with a single thread. */
#include <stdatomic.h>
#include <unistd.h>

#include "core/pool.h"
#include "test.h"

typedef struct {
    _Atomic int calls;
    _Atomic int mask;
    int nth_seen;
    long sum[8];
} ctx_t;

static void job(void *c, int ith, int nth) {
    ctx_t *x = c;
    atomic_fetch_add(&x->calls, 1);
    atomic_fetch_or(&x->mask, 1 << ith);
    x->nth_seen = nth;
    long s = 0;
    for (int i = ith; i < 1000; i += nth) s += i;
    x->sum[ith] = s;
}

static int check_run(pool *p, int n) {
    ctx_t c = {0};
    pool_run(p, job, &c);
    long total = 0;
    for (int i = 0; i < n; i++) total += c.sum[i];
    return atomic_load(&c.calls) == n && atomic_load(&c.mask) == (1 << n) - 1 && c.nth_seen == n && total == 499500;
}

int main(void) {
    hn_err e;
    pool *p;
    CHECK(pool_create(0, &p, &e) == HN_ERR_INVALID);
    for (int n = 1; n <= 4; n++) {
        CHECK(pool_create(n, &p, &e) == HN_OK);
        CHECK(pool_n_threads(p) == n);
        int ok = 1;
        for (int it = 0; it < 2000 && ok; it++) ok = check_run(p, n);
        CHECKF(ok, "%d threads: 2000 back-to-back runs", n);
        usleep(20000); /* let the workers fall asleep on the futex */
        CHECKF(check_run(p, n), "%d threads: run after idle", n);
        pool_free(p);
    }
    /* create and free right away, and a job published before workers start */
    for (int i = 0; i < 50; i++) {
        CHECK(pool_create(3, &p, &e) == HN_OK);
        if (i % 2) CHECK(check_run(p, 3));
        pool_free(p);
    }
    CHECK(pool_cpu_count() >= 1);
    TEST_DONE();
}
