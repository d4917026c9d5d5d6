/* test.h: the minimal test harness. Each test binary calls CHECK/CHECKF and
 * ends with TEST_DONE(), which prints "N passed, N failed" and returns non-zero
 * on any failure. Data files live in ../shared relative to the project root;
 * test_data_path() builds such paths (HONE_SHARED overrides the location). */
#ifndef HN_TEST_H
#define HN_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed_, test_failed_;

#define CHECK(cond) CHECKF(cond, "%s", #cond)
#define CHECKF(cond, ...)                                              \
    do {                                                               \
        if (cond) {                                                    \
            test_passed_++;                                            \
        } else {                                                       \
            test_failed_++;                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                              \
            fputc('\n', stderr);                                       \
        }                                                              \
    } while (0)

#define TEST_DONE()                                                    \
    do {                                                               \
        printf("%d passed, %d failed\n", test_passed_, test_failed_); \
        return test_failed_ ? 1 : 0;                                   \
    } while (0)

/* Writes "<dir>/<name>" into buf and returns buf, dir being a scratch folder
 * for files a test writes: HONE_TEST_TMP (scripts/run_tests.sh makes a fresh
 * one per run), else TMPDIR, else /tmp. */
static inline const char *test_tmp_path(char *buf, size_t cap, const char *name) {
    const char *d = getenv("HONE_TEST_TMP");
    if (!d || !*d) d = getenv("TMPDIR");
    snprintf(buf, cap, "%s/%s", d && *d ? d : "/tmp", name);
    return buf;
}

/* Writes "<shared>/<rel>" into buf and returns buf. */
static inline const char *test_data_path(char *buf, size_t cap, const char *rel) {
    const char *root = getenv("HONE_SHARED");
    snprintf(buf, cap, "%s/%s", root && *root ? root : "../shared", rel);
    return buf;
}

/* Reads a whole file (binary) into a malloc'd, NUL-terminated buffer; NULL if
 * it cannot be read. *len (if non-NULL) gets the byte count. Caller frees. */
static inline char *test_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

/* A xorshift generator for test data; a binary that wants other data sets
 * *test_rng_state() first. */
static inline uint64_t *test_rng_state(void) {
    static uint64_t s = 0x9e3779b97f4a7c15ull;
    return &s;
}
static inline uint32_t test_rnd(void) {
    uint64_t *s = test_rng_state();
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 32);
}
/* Roughly normal (mean 0, sd 1): a scaled sum of 4 uniforms. */
static inline float test_gauss(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)test_rnd() / 4294967296.0f;
    return (s - 2.0f) * 1.7320508f;
}

#endif
