/* alloc.h: the one allocation hook.
 *
 * All engine memory goes through hn_malloc/hn_calloc/hn_realloc/hn_free, so the
 * engine can report what it uses and tests can make the Nth allocation fail
 * (hn_alloc_fail_after). Large, page-aligned regions (weights repacked at load,
 * KV slabs) use hn_pages_alloc/hn_pages_free, which map memory straight from the
 * OS so that freeing it gives it back. The counters are process-wide and
 * thread-safe. */
#ifndef HN_ALLOC_H
#define HN_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Like malloc/calloc/realloc/free; return NULL on failure (or injected failure). */
void *hn_malloc(size_t n);
void *hn_calloc(size_t count, size_t size);
void *hn_realloc(void *p, size_t n);
void hn_free(void *p);
/* Returns a copy of s made with hn_malloc, or NULL. */
char *hn_strdup(const char *s);

/* Page-aligned memory from the OS (mmap); zero-filled; NULL on failure. */
void *hn_pages_alloc(size_t n);
/* As hn_pages_alloc, for large regions streamed by kernels: aligned to 2 MiB
 * and marked for transparent huge pages where the OS has them (fewer TLB
 * misses while a kernel streams it); freed with hn_pages_free. */
void *hn_pages_alloc_huge(size_t n);
void hn_pages_free(void *p, size_t n);

/* Address space without memory, for pools that grow and shrink in place (the
 * KV pool): hn_vm_reserve maps n bytes (2 MiB aligned) inaccessible and
 * uncounted; hn_vm_commit backs page-aligned [p, p + n) inside it with
 * zero-filled memory (huge pages where the OS has them) and counts it;
 * hn_vm_decommit gives those pages back (counted off); hn_vm_release unmaps
 * the whole range. */
void *hn_vm_reserve(size_t n);
bool hn_vm_commit(void *p, size_t n);
void hn_vm_decommit(void *p, size_t n);
void hn_vm_release(void *p, size_t n);
size_t hn_page_size(void);

/* Bytes currently allocated through the hook (heap + pages), and the peak. */
size_t hn_alloc_bytes(void);
size_t hn_alloc_peak(void);

/* Test hook: after `n` more successful allocations, every allocation fails
 * until called again with a negative n (which disables injection). */
void hn_alloc_fail_after(long n);

#endif
