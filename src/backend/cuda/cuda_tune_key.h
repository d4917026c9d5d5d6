/* cuda_tune_key.h: the pure logic of the cuda backend's tuning (C, no CUDA:
 * built into every binary and tested on machines without a GPU,
 * tests/test_tune.c). The cases themselves, which run on the device, are
 * cuda_tune.cu.
 *
 * The decode gemv (hc_gemv, cuda.h) has three parameters that change its
 * speed and never its bits: rows per warp (1, 2, 4), units of loads a lane
 * has in flight (4, 8) and warps a block (2, 4, 8); 18 configurations, all
 * searched. A winner travels through the backend table as be_mm_params:
 * tile = rows per warp, chunks = units, threads = warps (kernel and pack
 * 0); a field left 0 means the built-in choice for the call's row count.
 *
 * The device fingerprint the winners are cached under: "cuda-" and 16 hex
 * digits of XXH64 over the GPU's name, compute capability, driver version and
 * the digest of the CUDA sources the binary was built from (the Makefile
 * takes it), so another GPU, another driver or changed kernels tune again. */
#ifndef HN_CUDA_TUNE_KEY_H
#define HN_CUDA_TUNE_KEY_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stddef.h>

#include "../../tune/tune.h"
#include "../backend.h"

/* the decode family's version: bump it when the kernel's parameters change meaning */
#define HCT_GEMV_VERSION "cgemv1"

typedef struct hct_cfg {
    int rpw, units, warps; /* 0: the built-in choice */
} hct_cfg;

/* Writes the fingerprint ("cuda-" + 16 hex digits; at most 21 characters and
 * the NUL) into out[cap]. NULL strings count as "". */
void hct_fingerprint(const char *gpu_name, int cc_major, int cc_minor, int driver_version, const char *src_digest,
                     char *out, size_t cap);
/* Whether every field of c is in its set (rows per warp 1/2/4, units 4/8, warps 2/4/8; 0 not allowed). */
bool hct_cfg_valid(hct_cfg c);
/* Appends the three parameters to c (c->n_params must leave room: at most
 * TN_MAX_PARAMS - 3), with def's values as the defaults; false (nothing
 * appended) when def is not valid. */
bool hct_case_params(tn_case *c, hct_cfg def);
/* The configuration of values cfg[first..first + 2] of such a case. */
hct_cfg hct_cfg_of(const int *cfg, int first);
/* A configuration as backend parameters, and back (fields out of their sets read 0: the built-in choice). */
void hct_to_mm(hct_cfg c, be_mm_params *out);
hct_cfg hct_of_mm(const be_mm_params *p);

#ifdef __cplusplus
}
#endif

#endif
