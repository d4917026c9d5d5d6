/* registry.h: backends are chosen, not built in.
 *
 * Each backend compiled into this binary registers a name and a probe
 * (whether it can run here: the CPU always, CUDA when built and a device is
 * present). be_create("auto") takes the first available in preference order
 * (cuda, then cpu); "cpu" and "cuda" ask for one by name and fail with
 * HN_ERR_UNSUPPORTED, saying why, when it is not available. */
#ifndef HN_REGISTRY_H
#define HN_REGISTRY_H

#include <stdbool.h>

#include "backend.h"

typedef struct be_config {
    int n_threads;   /* CPU threads (0: all CPUs); the cpu backend makes and owns its pool */
    int device;      /* GPU ordinal for GPU backends */
} be_config;

/* Creates the backend named name ("auto", "cpu", "cuda"; NULL means auto). */
hn_status be_create(const char *name, const be_config *cfg, be_backend **out, hn_err *err);
/* The names of the backends compiled in, in preference order; returns how many (at most cap). */
int be_registered(const char **names, int cap);
/* The backend be_create(name) would make: name itself, or for NULL / "" /
 * "auto" the first available in preference order (NULL when none is). */
const char *be_resolve(const char *name);
/* Whether the named backend can run on this machine (why not: *why, static text). */
bool be_available(const char *name, const char **why);
/* Threads a backend computes with on the host (the cpu backend's pool; 0 otherwise). */
int be_n_threads(const be_backend *b);

#endif
