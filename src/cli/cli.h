/* cli.h: the hone command-line tool. Each command is cmd_<name>(argc, argv)
 * with argv[0] the command name; it returns the process exit code (0 ok,
 * 1 error, 2 usage) and prints errors to stderr. Only cli/ may call exit(). */
#ifndef HN_CLI_H
#define HN_CLI_H

int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* `hone ps`: sessions and memory of a running server (cmd_ps.c). */
int cmd_ps(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `hone bench -m FILE`: prefill and decode speed of a model (cmd_bench_model.c). */
int cmd_bench_model(int argc, char **argv);

#include <stdbool.h>
#include <stdio.h>

#include <string.h>

#include <errno.h>
#include <stdlib.h>

#include "../backend/registry.h"
#include "../model/model.h"
#include "../sched/engine.h"
#include "../tune/apply.h"

#define CLI_SPEC_HELP "auto (default: where it pays, measured: the suffix drafter, then the --draft model or DFlash drafter, or else the model's own MTP layer), off, suffix, draft, mtp or dflash (always draft, that drafter only; mtp: the model's MTP (nextn) layer; dflash: the --draft file is a DFlash drafter)"
#define CLI_DRAFT_HELP "a draft model for --spec draft|auto: any GGUF with the target's vocabulary (not a hybrid); or a DFlash drafter (general.architecture dflash) for --spec dflash|auto"

/* Parses the value of --spec for command cmd into *out (eng_spec); prints
 * why and returns false for an unknown drafter. */
static inline bool cli_spec_parse(const char *cmd, const char *v, int *out) {
    int r = eng_spec_from_name(v, out);
    if (r) fprintf(stderr, "hone %s: unknown --spec '%s' (auto, off, suffix, draft, mtp, dflash)\n", cmd, v);
    return r == 0;
}

#define CLI_CPU_MOE_HELP "keep the routed experts of the last N layers (all: every layer; auto: as many as the device's memory, or --vram, needs) on the CPU, the rest of the model on the --device (for a MoE model whose experts do not fit its memory; default 0)"
#define CLI_VRAM_HELP "use at most SIZE (e.g. 8G) of the GPU's memory: the model must fit in it (with --cpu-moe auto, experts go to the CPU until it does) and the KV cache gets what is left"

/* Parses the value of --cpu-moe (a layer count, "all" / -1, or "auto") for command
 * cmd into *out (model_params.cpu_moe); prints why and returns false
 * otherwise (a count past the model's layers is the model's to refuse). */
static inline bool cli_cpu_moe_parse(const char *cmd, const char *v, int *out) {
    char *end;
    errno = 0;
    if (!strcmp(v, "auto")) {
        *out = -2; /* MODEL_CPU_MOE_AUTO */
        return true;
    }
    long n = strcmp(v, "all") ? strtol(v, &end, 10) : -1;
    if (strcmp(v, "all") && (end == v || *end || errno || n < -1 || n > 1 << 20)) {
        fprintf(stderr, "hone %s: bad --cpu-moe '%s' (a number of layers, all or auto)\n", cmd, v);
        return false;
    }
    *out = (int)n;
    return true;
}

/* Parses the value of --vram (a size: 8G, 512M, 24000000000; K/M/G/T in
 * binary units, an optional B or iB) for command cmd into *out
 * (model_params.mem_budget); prints why and returns false otherwise (0 is
 * refused: no budget is the default). */
static inline bool cli_vram_parse(const char *cmd, const char *v, size_t *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    double mul = 1;
    if (!errno && end != v) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; end++; break;
        case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
        }
        if (*end == 'i') end++;
        if (*end == 'b' || *end == 'B') end++;
    }
    if (errno || end == v || *end || !(x > 0) || x * mul < 1048576.0 || x * mul > 1e18) {
        fprintf(stderr, "hone %s: bad --vram '%s' (a size of 1M or more, e.g. 8G)\n", cmd, v);
        return false;
    }
    *out = (size_t)(x * mul);
    return true;
}

#define CLI_DEVICES_HELP "tensor parallel: split the model's heads, FFN and vocabulary over these ranks, e.g. cpu,cpu (CPU ranks only for now; dense llama, qwen2, qwen3; the kv heads must divide by the count)"

/* Parses --devices LIST (comma-separated ranks: "cpu" each, at most 8) for
 * command cmd into *n_ranks (model_params.n_ranks), checking it against
 * --device (*device: NULL, auto or cpu; set to "cpu"); prints why and
 * returns false otherwise (GPU ranks are refused: not built yet). */
static inline bool cli_devices_parse(const char *cmd, const char *v, const char **device, int *n_ranks) {
    int n = 0;
    const char *p = v;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 3 && !strncmp(p, "cpu", 3)) {
            n++;
        } else if (len == 0) {
            fprintf(stderr, "hone %s: bad --devices '%s' (an empty rank; e.g. cpu,cpu)\n", cmd, v);
            return false;
        } else if (!strncmp(p, "cuda", 4) || (*p >= '0' && *p <= '9')) {
            fprintf(stderr,
                    "hone %s: --devices '%s': tensor parallel over GPUs is not built yet (the NCCL communicator is; the "
                    "model's CUDA ranks are not): --devices takes CPU ranks for now, e.g. cpu,cpu\n",
                    cmd, v);
            return false;
        } else {
            fprintf(stderr, "hone %s: bad --devices '%s': unknown rank '%.*s' (cpu)\n", cmd, v, (int)len, p);
            return false;
        }
        if (!c) break;
        p = c + 1;
    }
    if (n > 8) {
        fprintf(stderr, "hone %s: --devices '%s': %d ranks (at most 8)\n", cmd, v, n);
        return false;
    }
    if (*device && strcmp(*device, "auto") && strcmp(*device, "cpu")) {
        fprintf(stderr, "hone %s: --devices %s runs on CPU ranks; --device %s contradicts it\n", cmd, v, *device);
        return false;
    }
    *device = "cpu";
    *n_ranks = n;
    return true;
}

/* The tuned kernel parameters (tn_load_tune) for the model's backend and,
 * with experts apart (--cpu-moe), for its expert backend; a failure only
 * warns. */
static inline void cli_load_tune(struct model *m, const char *cmd) {
    char who[64];
    snprintf(who, sizeof who, "hone %s", cmd);
    hn_err e = {0};
    if (tn_load_tune(model_backend(m), model_gguf(m), model_n_threads(m), who, &e) != HN_OK)
        fprintf(stderr, "hone %s: kernel tuning skipped: %s\n", cmd, e.msg);
    be_backend *x = model_moe_backend(m);
    if (x && tn_load_tune(x, model_gguf(m), be_n_threads(x), who, &e) != HN_OK)
        fprintf(stderr, "hone %s: kernel tuning of the expert backend skipped: %s\n", cmd, e.msg);
}

/* With --device auto (requested NULL or "auto"), one line on stderr saying
 * where the model runs: on the GPU, or on the CPU and why there is no GPU. */
static inline void cli_device_note(const char *cmd, const char *requested, const char *chosen) {
    if (requested && strcmp(requested, "auto")) return;
    if (strcmp(chosen, "cpu")) {
        fprintf(stderr, "hone %s: running on the GPU (the %s backend)\n", cmd, chosen);
        return;
    }
    const char *why = NULL;
    if (!be_available("cuda", &why))
        fprintf(stderr, "hone %s: running on the CPU; no GPU: %s\n", cmd, why ? why : "none found");
}

#endif
