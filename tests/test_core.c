/* test_core.c: status codes, the allocation hook, the clock and the CPU-feature probe. */
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/isa.h"
#include "core/status.h"
#include "test.h"

/* hn_isa against the compiler's own cpuid reader (x86) and its own rules. */
static void test_isa(void) {
    uint32_t isa = hn_isa();
    CHECK(hn_isa() == isa); /* probed once */
    CHECK(isa < (1u << HN_ISA_COUNT));
    for (int i = 0; i < HN_ISA_COUNT; i++) {
        CHECKF(hn_isa_name(i) && hn_isa_name(i)[0], "flag %d has no name", i);
        for (int j = 0; j < i; j++) CHECK(!hn_isa_name(j) || strcmp(hn_isa_name(i), hn_isa_name(j)));
    }
    CHECK(hn_isa_name(HN_ISA_COUNT) == NULL && hn_isa_name(-1) == NULL);
    CHECK(!strcmp(hn_isa_name(2), "avx2") && !strcmp(hn_isa_name(5), "avx512f"));
    /* extensions that need the OS's YMM / ZMM state imply AVX / each other */
    if (isa & (HN_ISA_AVX2 | HN_ISA_FMA | HN_ISA_F16C | HN_ISA_AVXVNNI)) CHECK(isa & HN_ISA_AVX);
    if (isa & HN_ISA_AVX512BW) CHECK(isa & HN_ISA_AVX);
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    struct {
        uint32_t bit;
        int has;
    } oracle[] = {
        {HN_ISA_SSE42, __builtin_cpu_supports("sse4.2")},   {HN_ISA_AVX, __builtin_cpu_supports("avx")},
        {HN_ISA_AVX2, __builtin_cpu_supports("avx2")},      {HN_ISA_FMA, __builtin_cpu_supports("fma")},
        {HN_ISA_AVX512F, __builtin_cpu_supports("avx512f")}, {HN_ISA_AVX512BW, __builtin_cpu_supports("avx512bw")},
        {HN_ISA_AVX512VL, __builtin_cpu_supports("avx512vl")},
        {HN_ISA_AVX512VNNI, __builtin_cpu_supports("avx512vnni")},
    };
    for (size_t i = 0; i < sizeof oracle / sizeof oracle[0]; i++)
        CHECKF(!!(isa & oracle[i].bit) == !!oracle[i].has, "%s: probe %d, compiler %d", hn_isa_name(__builtin_ctz(oracle[i].bit)),
               !!(isa & oracle[i].bit), !!oracle[i].has);
#endif
    printf("isa:");
    for (int i = 0; i < HN_ISA_COUNT; i++)
        if (isa & (1u << i)) printf(" %s", hn_isa_name(i));
    printf("\n");
}

/* The monotonic clock moves forward in both units; deadlines are normalised. */
static void test_clock(void) {
    double m0 = hn_now_ms(), s0 = hn_now_s();
    struct timespec nap = {0, 20 * 1000000L};
    nanosleep(&nap, NULL);
    double m1 = hn_now_ms(), s1 = hn_now_s();
    CHECKF(m1 - m0 >= 19.0 && m1 - m0 < 5000.0, "slept 20 ms, clock says %.3f ms", m1 - m0);
    CHECKF(s1 - s0 >= 0.019 && s1 - s0 < 5.0, "slept 20 ms, clock says %.6f s", s1 - s0);
    CHECKF(s0 * 1e3 - m0 > -1.0 && s0 * 1e3 - m0 < 20.0 + (m1 - m0), "ms and s disagree: %.3f vs %.6f", m0, s0);
    long cases[] = {0, 1, 999, 1000, 1500, 2999, 60000};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct timespec now, d;
        clock_gettime(CLOCK_REALTIME, &now);
        hn_deadline_ms(&d, cases[i]);
        double ahead = (double)(d.tv_sec - now.tv_sec) * 1e3 + (double)(d.tv_nsec - now.tv_nsec) / 1e6;
        CHECKF(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L, "deadline %ld ms: tv_nsec %ld", cases[i], (long)d.tv_nsec);
        CHECKF(ahead >= (double)cases[i] && ahead < (double)cases[i] + 50.0, "deadline %ld ms is %.3f ms ahead",
               cases[i], ahead);
    }
}

int main(void) {
    test_isa();
    test_clock();

    hn_err e;
    hn_err_clear(&e);
    CHECK(e.code == HN_OK && e.msg[0] == 0);
    CHECK(hn_errf(&e, HN_ERR_FORMAT, "bad %d", 7) == HN_ERR_FORMAT);
    CHECK(e.code == HN_ERR_FORMAT && !strcmp(e.msg, "bad 7"));
    CHECK(hn_errf(&e, HN_ERR_IO, "later") == HN_ERR_IO); /* the last error wins */
    CHECK(e.code == HN_ERR_IO && !strcmp(e.msg, "later"));
    CHECK(hn_errf(NULL, HN_ERR_RANGE, "nowhere") == HN_ERR_RANGE);
    CHECK(!strcmp(hn_status_name(HN_ERR_FORMAT), "HN_ERR_FORMAT"));
    CHECK(!strcmp(hn_status_str(HN_OK), "ok"));
    CHECK(!strcmp(hn_status_str((hn_status)999), "unknown status"));

    size_t base = hn_alloc_bytes();
    void *p = hn_malloc(1000);
    CHECK(p && hn_alloc_bytes() == base + 1000);
    p = hn_realloc(p, 50);
    CHECK(p && hn_alloc_bytes() == base + 50);
    hn_free(p);
    CHECK(hn_alloc_bytes() == base);
    CHECK(hn_calloc((size_t)-1, 16) == NULL);

    hn_alloc_fail_after(2);
    void *a = hn_malloc(8), *b = hn_malloc(8), *c = hn_malloc(8);
    CHECK(a && b && !c);
    hn_alloc_fail_after(-1);
    c = hn_malloc(8);
    CHECK(c != NULL);
    hn_free(a);
    hn_free(b);
    hn_free(c);

    void *pg = hn_pages_alloc(1 << 20);
    CHECK(pg && hn_alloc_bytes() == base + (1 << 20));
    hn_pages_free(pg, 1 << 20);
    CHECK(hn_alloc_bytes() == base);
    TEST_DONE();
}
