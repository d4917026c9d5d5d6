/* test_core.c: status codes and the allocation hook. */
#include "core/alloc.h"
#include "core/status.h"
#include "test.h"

int main(void) {
    hn_err e;
    hn_err_clear(&e);
    CHECK(e.code == HN_OK && e.msg[0] == 0);
    CHECK(hn_errf(&e, HN_ERR_FORMAT, "bad %d", 7) == HN_ERR_FORMAT);
    CHECK(e.code == HN_ERR_FORMAT && !strcmp(e.msg, "bad 7"));
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
