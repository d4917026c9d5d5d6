/* fuzz_common.h: what the single-purpose harnesses (fuzz_gguf.c,
 * fuzz_tokenizer.c, fuzz_template.c, fuzz_grammar.c) share. Each harness
 * defines fuzz_<name>_init() and fuzz_<name>_one(data, size); the libFuzzer
 * entry points are compiled unless FUZZ_REPLAY is defined, so that
 * tests/test_fuzz_corpora.c can include all four and replay their corpora in
 * the ordinary suite. A finding calls fuzz_fail(), which aborts. */
#ifndef HN_FUZZ_COMMON_H
#define HN_FUZZ_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The shared data directory ($HONE_FUZZ_SHARED, else ../shared from the
 * project root) joined with rel. */
static inline const char *fuzz_shared(char *buf, size_t cap, const char *rel) {
    const char *root = getenv("HONE_FUZZ_SHARED");
    snprintf(buf, cap, "%s/%s", root ? root : "../shared", rel);
    return buf;
}

__attribute__((format(printf, 1, 2), noreturn)) static inline void fuzz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz finding: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* A deterministic stream of numbers from the input (for the choices a
 * harness makes while walking). */
static inline uint64_t fuzz_hash(const uint8_t *d, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 0x100000001b3ull;
    return h | 1;
}
static inline uint64_t fuzz_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#ifndef FUZZ_REPLAY
#define FUZZ_ENTRY(name)                                                    \
    int LLVMFuzzerInitialize(int *argc, char ***argv);                      \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);           \
    int LLVMFuzzerInitialize(int *argc, char ***argv) {                     \
        (void)argc;                                                         \
        (void)argv;                                                         \
        fuzz_##name##_init();                                               \
        return 0;                                                           \
    }                                                                       \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {          \
        fuzz_##name##_one(data, size);                                      \
        return 0;                                                           \
    }
#else
#define FUZZ_ENTRY(name)
#endif

#endif
