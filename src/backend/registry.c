/* registry.c: the backends compiled into this binary, and be_create. */
#include "registry.h"

#include <string.h>

#include "../core/pool.h"
#include "../quant/quant.h"
#include "cpu/cpu.h"
#include "cpu/cpu_int.h"
#ifdef HN_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

static hn_status cpu_create(const be_config *cfg, be_backend **out, hn_err *err) {
    pool *p;
    hn_status st = pool_create(cfg && cfg->n_threads > 0 ? cfg->n_threads : pool_cpu_count(), &p, err);
    if (st) return st;
    if ((st = be_cpu_create(p, out, err))) {
        pool_free(p);
        return st;
    }
    cpu_of(*out)->own_pool = p;
    return HN_OK;
}

static bool cpu_available(const char **why) {
    if (why) *why = NULL;
    return true;
}

#ifndef HN_HAVE_CUDA
static hn_status cuda_create(const be_config *cfg, be_backend **out, hn_err *err) {
    (void)cfg;
    *out = NULL;
    return hn_errf(err, HN_ERR_UNSUPPORTED, "backend cuda: this hone was built without CUDA (no nvcc at build time)");
}

static bool cuda_available(const char **why) {
    if (why) *why = "this hone was built without CUDA (no nvcc at build time)";
    return false;
}
#else
/* Built with nvcc: the cuda backend (cuda/cuda_backend.h), available when a device is found. */
static hn_status cuda_create(const be_config *cfg, be_backend **out, hn_err *err) {
    return be_cuda_create(cfg ? cfg->device : 0, out, err);
}

static bool cuda_available(const char **why) { return be_cuda_available(why); }
#endif

static const struct {
    const char *name;
    hn_status (*create)(const be_config *cfg, be_backend **out, hn_err *err);
    bool (*available)(const char **why);
} registry[] = {
    /* preference order for "auto" */
    {"cuda", cuda_create, cuda_available},
    {"cpu", cpu_create, cpu_available},
};
#define N_REG (int)(sizeof registry / sizeof registry[0])

int be_registered(const char **names, int cap) {
    int n = 0;
    for (int i = 0; i < N_REG; i++) {
#ifndef HN_HAVE_CUDA
        if (!strcmp(registry[i].name, "cuda")) continue;
#endif
        if (n < cap) names[n] = registry[i].name;
        n++;
    }
    return n < cap ? n : cap;
}

const char *be_resolve(const char *name) {
    if (name && *name && strcmp(name, "auto")) return name;
    for (int i = 0; i < N_REG; i++)
        if (registry[i].available(NULL)) return registry[i].name;
    return NULL;
}

bool be_available(const char *name, const char **why) {
    for (int i = 0; i < N_REG; i++)
        if (!strcmp(registry[i].name, name)) return registry[i].available(why);
    if (why) *why = "no such backend (auto, cpu, cuda)";
    return false;
}

hn_status be_create(const char *name, const be_config *cfg, be_backend **out, hn_err *err) {
    *out = NULL;
    if (!name || !*name || !strcmp(name, "auto")) {
        for (int i = 0; i < N_REG; i++)
            if (registry[i].available(NULL)) return registry[i].create(cfg, out, err);
        return hn_errf(err, HN_ERR_UNSUPPORTED, "backend: none is available");
    }
    for (int i = 0; i < N_REG; i++) {
        if (strcmp(registry[i].name, name)) continue;
        const char *why = NULL;
        if (!registry[i].available(&why))
            return hn_errf(err, HN_ERR_UNSUPPORTED, "backend %s is not available: %s", name, why ? why : "unknown");
        return registry[i].create(cfg, out, err);
    }
    return hn_errf(err, HN_ERR_INVALID, "backend '%s' is unknown (auto, cpu, cuda)", name);
}

int be_n_threads(const be_backend *b) {
    return b && !strcmp(b->ops->name, "cpu") ? pool_n_threads(be_cpu_pool((be_backend *)b)) : 0;
}

size_t be_tensor_bytes(qt_type type, int64_t ne0, int64_t ne1) {
    (void)type; /* f32 and i32 */
    return ((size_t)ne0 * (size_t)ne1 * 4 + 255) & ~(size_t)255;
}

hn_status be_weight_src_check(const be_weight_src *src, const char *who, size_t *row_bytes, hn_err *err) {
    size_t rb = qt_row_size(src->type, src->ne[0]);
    *row_bytes = rb;
    if (!src->data || rb == 0 || src->ne[1] < 1 || src->ne[2] < 1 ||
        rb * (size_t)src->ne[1] * (size_t)src->ne[2] > src->bytes)
        return hn_errf(err, HN_ERR_INVALID, "%s backend: weight %s does not fit its %zu bytes", who,
                       src->name ? src->name : "?", src->bytes);
    return HN_OK;
}
