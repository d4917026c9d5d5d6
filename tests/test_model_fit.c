/* test_model_fit.c: a backend with memory of its own (a GPU) must hold the
 * model: model_load asks it (be_ops.mem_info) and refuses a model whose
 * weights do not fit with a message saying how much it needs and how much
 * is free, before uploading any weight; a backend on host memory (mem_info
 * false) is not checked. Checked with the CPU backend's ops wrapped so that
 * mem_info reports a given amount. */
#include <string.h>

#include "backend/registry.h"
#include "model/model.h"
#include "test.h"

static size_t fake_free, fake_total;
static int mem_calls;
static bool fake_mem_info(be_backend *b, size_t *free_b, size_t *total_b) {
    (void)b;
    mem_calls++;
    *free_b = fake_free;
    *total_b = fake_total;
    return true;
}

static hn_status load_with(const char *path, size_t free_b, model **m, hn_err *e) {
    be_backend *b;
    hn_status st = be_create("cpu", NULL, &b, e);
    if (st) return st;
    static be_ops ops;
    ops = *b->ops;
    ops.mem_info = fake_mem_info;
    const be_ops *real = b->ops;
    b->ops = &ops;
    fake_free = free_b;
    fake_total = (size_t)80 << 30;
    model_params p = {.backend = b};
    st = model_load(path, &p, m, e);
    if (*m) model_free(*m);
    *m = NULL;
    b->ops = real;
    be_free(b);
    return st;
}

int main(void) {
    char path[512];
    if (!test_data_path(path, sizeof path, "data/models/qwen3-2k-q8_0.gguf")) {
        printf("skip: qwen3-2k-q8_0.gguf not found\n");
        TEST_DONE();
    }
    model *m = NULL;
    hn_err e;
    /* plenty free: loads */
    mem_calls = 0;
    CHECKF(load_with(path, (size_t)40 << 30, &m, &e) == HN_OK, "load with 40 GiB free: %s", e.msg);
    CHECK(mem_calls == 1);
    /* 1 MiB free: refused, and the message says what it needs and what is free */
    hn_status st = load_with(path, (size_t)1 << 20, &m, &e);
    CHECK(st == HN_ERR_NOMEM);
    CHECKF(strstr(e.msg, "does not fit") && strstr(e.msg, "needs") && strstr(e.msg, "0.00 GiB of 80.00 GiB are free") &&
               strstr(e.msg, "--device cpu"),
           "message: %s", e.msg);
    /* the CPU backend itself reports host memory: no check */
    be_backend *b;
    CHECK(be_create("cpu", NULL, &b, &e) == HN_OK);
    size_t f = 7, t = 7;
    CHECK(b->ops->version >= 7 && b->ops->mem_info && !b->ops->mem_info(b, &f, &t) && f == 7 && t == 7);
    be_free(b);
    TEST_DONE();
}
