/* alloc.c: the allocation hook. Each heap block carries a 16-byte header with
 * its size so that hn_free can keep the byte counter exact. */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define HDR 16

static atomic_size_t cur_bytes;
static atomic_size_t peak_bytes;
static atomic_long fail_countdown = -1;

static int should_fail(void) {
    long v = atomic_load(&fail_countdown);
    while (v >= 0) {
        if (v == 0) return 1;
        if (atomic_compare_exchange_weak(&fail_countdown, &v, v - 1)) return 0;
    }
    return 0;
}

static void account(size_t add, size_t sub) {
    size_t now = atomic_fetch_add(&cur_bytes, add) + add;
    atomic_fetch_sub(&cur_bytes, sub);
    now -= sub;
    size_t pk = atomic_load(&peak_bytes);
    while (now > pk && !atomic_compare_exchange_weak(&peak_bytes, &pk, now)) {
    }
}

void *hn_malloc(size_t n) {
    if (n > SIZE_MAX - HDR || should_fail()) return NULL;
    unsigned char *p = malloc(n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    account(n, 0);
    return p + HDR;
}

void *hn_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    void *p = hn_malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void *hn_realloc(void *p, size_t n) {
    if (!p) return hn_malloc(n);
    if (n > SIZE_MAX - HDR || should_fail()) return NULL;
    unsigned char *base = (unsigned char *)p - HDR;
    size_t old;
    memcpy(&old, base, sizeof old);
    unsigned char *q = realloc(base, n + HDR);
    if (!q) return NULL;
    memcpy(q, &n, sizeof n);
    account(n, old);
    return q + HDR;
}

void hn_free(void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - HDR;
    size_t old;
    memcpy(&old, base, sizeof old);
    atomic_fetch_sub(&cur_bytes, old);
    free(base);
}

char *hn_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = hn_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void *hn_pages_alloc(size_t n) {
    if (n == 0 || should_fail()) return NULL;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    account(n, 0);
    return p;
}

void *hn_pages_alloc_huge(size_t n) {
    const size_t huge = (size_t)2 << 20;
    if (n < huge) return hn_pages_alloc(n);
    if (should_fail()) return NULL;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    size_t len = (n + page - 1) / page * page;
    unsigned char *base = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)base + huge - 1) & ~(uintptr_t)(huge - 1));
    /* trim the unaligned head and the tail, so hn_pages_free(p, n) unmaps exactly the rest */
    if (p > base) munmap(base, (size_t)(p - base));
    size_t tail = (size_t)(base + len + huge - (p + len));
    if (tail) munmap(p + len, tail);
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    account(n, 0);
    return p;
}

void hn_pages_free(void *p, size_t n) {
    if (!p) return;
    munmap(p, n);
    atomic_fetch_sub(&cur_bytes, n);
}

void *hn_vm_reserve(size_t n) {
    const size_t huge = (size_t)2 << 20;
    if (n == 0 || should_fail()) return NULL;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    size_t len = (n + page - 1) / page * page;
    unsigned char *base = mmap(NULL, len + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)base + huge - 1) & ~(uintptr_t)(huge - 1));
    if (p > base) munmap(base, (size_t)(p - base));
    size_t tail = (size_t)(base + len + huge - (p + len));
    if (tail) munmap(p + len, tail);
    return p;
}

bool hn_vm_commit(void *p, size_t n) {
    if (should_fail()) return false;
    if (mprotect(p, n, PROT_READ | PROT_WRITE)) return false;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    account(n, 0);
    return true;
}

void hn_vm_decommit(void *p, size_t n) {
    madvise(p, n, MADV_DONTNEED); /* the pages go back; a later commit reads zeros */
    mprotect(p, n, PROT_NONE);
    atomic_fetch_sub(&cur_bytes, n);
}

void hn_vm_release(void *p, size_t n) {
    if (!p) return;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    munmap(p, (n + page - 1) / page * page);
}

size_t hn_page_size(void) {
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

size_t hn_alloc_bytes(void) { return atomic_load(&cur_bytes); }
size_t hn_alloc_peak(void) { return atomic_load(&peak_bytes); }
void hn_alloc_fail_after(long n) { atomic_store(&fail_countdown, n < 0 ? -1 : n); }
