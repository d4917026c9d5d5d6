/* cmd_logits.c: `hone logits -m FILE --tokens "ID ..." -o OUT` runs the token
 * list as one batch and writes the logits of the last position as n_vocab
 * little-endian float32 values (the format of the reference dumps). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone logits -m FILE --tokens \"ID ID ...\" -o OUT [-t THREADS]\n"
            "\n"
            "Runs the tokens as one batch and writes the last position's logits to OUT\n"
            "as n_vocab float32 values (little-endian).\n"
            "\n"
            "  -m, --model FILE     GGUF model\n"
            "  --tokens \"ID ...\"    token ids, separated by spaces or commas\n"
            "  -o, --output OUT     output file\n"
            "  -t, --threads N      threads (default: all CPUs)\n"
            "  --device NAME        backend: auto (default), cpu, cuda\n"
            "  -h, --help           this help\n");
}

int cmd_logits(int argc, char **argv) {
    const char *path = NULL, *tokens = NULL, *out = NULL, *device = NULL;
    int n_threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-' || i + 1 >= argc) {
            fprintf(stderr, "hone logits: %s '%s'\n", a[0] == '-' ? "missing value for" : "unexpected argument", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) path = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            char *end;
            long t = strtol(v, &end, 10);
            if (*end || end == v || t < 0 || t > 1024) {
                fprintf(stderr, "hone logits: bad thread count '%s'\n", v);
                return 2;
            }
            n_threads = (int)t;
        } else {
            fprintf(stderr, "hone logits: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path || !tokens || !out) {
        fprintf(stderr, "hone logits: missing %s\n", !path ? "-m FILE" : !tokens ? "--tokens" : "-o OUT");
        usage(stderr);
        return 2;
    }
    /* parse the ids */
    int32_t n = 0, cap = 64;
    int32_t *ids = hn_malloc(sizeof *ids * (size_t)cap);
    for (const char *s = tokens; ids && *s;) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "hone logits: --tokens wants non-negative ids, got '%s'\n", s);
            hn_free(ids);
            return 2;
        }
        if (n == cap) {
            int32_t *p = hn_realloc(ids, sizeof *ids * (size_t)(cap *= 2));
            if (!p) hn_free(ids);
            ids = p;
            if (!ids) break;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    if (!ids || n == 0) {
        fprintf(stderr, "hone logits: %s\n", ids ? "no tokens given" : "out of memory");
        hn_free(ids);
        return ids ? 2 : 1;
    }
    int rc = 1;
    hn_err err = {0};
    model *m = NULL;
    kv_cache *kv = NULL;
    kv_seq seq = {0};
    float *logits = NULL;
    int32_t *pos = NULL, *sid = NULL;
    model_params mp = {.n_threads = n_threads, .max_batch = 256, .device = device};
    if (model_load(path, &mp, &m, &err) != HN_OK) {
        fprintf(stderr, "hone logits: %s: %s\n", path, err.msg);
        goto done;
    }
    int32_t V = model_hp(m)->n_vocab;
    kv_config kc = model_kv_config(m, (n + 15) / 16, 16);
    logits = hn_malloc(sizeof(float) * (size_t)V);
    pos = hn_malloc(sizeof(int32_t) * (size_t)n);
    sid = hn_calloc((size_t)n, sizeof(int32_t));
    if (!logits || !pos || !sid || kv_create(&kc, &kv, &err) != HN_OK || kv_seq_init(&seq, kv, n, &err) != HN_OK ||
        (model_hp(m)->hybrid && kv_seq_state_acquire(kv, &seq, &err) != HN_OK)) {
        fprintf(stderr, "hone logits: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    kv_seq *seqs[1] = {&seq};
    model_batch b = {.n_tokens = n, .token = ids, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    if (model_forward(m, kv, &b, logits, 1, &err) != HN_OK) {
        fprintf(stderr, "hone logits: %s\n", err.msg);
        goto done;
    }
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)V, f) != (size_t)V) {
        fprintf(stderr, "hone logits: cannot write %s: %s\n", out, strerror(errno));
        if (f) fclose(f);
        goto done;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "hone logits: cannot write %s: %s\n", out, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    hn_free(ids);
    hn_free(pos);
    hn_free(sid);
    hn_free(logits);
    if (kv) kv_seq_free(&seq, kv);
    kv_free(kv);
    model_free(m);
    return rc;
}
