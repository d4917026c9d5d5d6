/* cuda_tune_key.c: the cuda backend's tuning logic that needs no GPU (see
 * cuda_tune_key.h): the fingerprint and the parameters' sets and mapping. */
#include "cuda_tune_key.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static const int rpw_set[] = {1, 2, 4}, units_set[] = {4, 8}, warps_set[] = {2, 4, 8};

static int index_in(const int *set, int n, int v) {
    for (int i = 0; i < n; i++)
        if (set[i] == v) return i;
    return -1;
}

void hct_fingerprint(const char *gpu_name, int cc_major, int cc_minor, int driver_version, const char *src_digest,
                     char *out, size_t cap) {
    char key[512];
    int n = snprintf(key, sizeof key, "cuda|%s|sm_%d%d|driver=%d|src=%s", gpu_name ? gpu_name : "", cc_major,
                     cc_minor, driver_version, src_digest ? src_digest : "");
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof key) n = (int)sizeof key - 1;
    snprintf(out, cap, "cuda-%016" PRIx64, (uint64_t)XXH64(key, (size_t)n, 0));
}

bool hct_cfg_valid(hct_cfg c) {
    return index_in(rpw_set, 3, c.rpw) >= 0 && index_in(units_set, 2, c.units) >= 0 &&
           index_in(warps_set, 3, c.warps) >= 0;
}

static void put_param(tn_param *p, const char *name, const int *set, int n, int def) {
    memset(p, 0, sizeof *p);
    p->name = name;
    p->n = n;
    for (int i = 0; i < n; i++) p->values[i] = set[i];
    p->def = index_in(set, n, def);
}

bool hct_case_params(tn_case *c, hct_cfg def) {
    if (!hct_cfg_valid(def) || c->n_params < 0 || c->n_params > TN_MAX_PARAMS - 3) return false;
    put_param(&c->params[c->n_params++], "rpw", rpw_set, 3, def.rpw);
    put_param(&c->params[c->n_params++], "units", units_set, 2, def.units);
    put_param(&c->params[c->n_params++], "warps", warps_set, 3, def.warps);
    return true;
}

hct_cfg hct_cfg_of(const int *cfg, int first) {
    return (hct_cfg){.rpw = cfg[first], .units = cfg[first + 1], .warps = cfg[first + 2]};
}

void hct_to_mm(hct_cfg c, be_mm_params *out) {
    memset(out, 0, sizeof *out);
    out->tile = c.rpw;
    out->chunks = c.units;
    out->threads = c.warps;
}

hct_cfg hct_of_mm(const be_mm_params *p) {
    hct_cfg c = {0, 0, 0};
    if (!p) return c;
    if (index_in(rpw_set, 3, p->tile) >= 0) c.rpw = p->tile;
    if (index_in(units_set, 2, p->chunks) >= 0) c.units = p->chunks;
    if (index_in(warps_set, 3, p->threads) >= 0) c.warps = p->threads;
    return c;
}
