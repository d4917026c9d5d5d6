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

#include "../backend/registry.h"
#include "../sched/engine.h"

#define CLI_SPEC_HELP "auto (default: where it pays, measured: the suffix drafter, then the --draft model or DFlash drafter, or else the model's own MTP layer), off, suffix, draft, mtp or dflash (always draft, that drafter only; mtp: the model's MTP (nextn) layer; dflash: the --draft file is a DFlash drafter)"
#define CLI_DRAFT_HELP "a draft model for --spec draft|auto: any GGUF with the target's vocabulary (not a hybrid); or a DFlash drafter (general.architecture dflash) for --spec dflash|auto"

/* Parses the value of --spec for command cmd into *out (eng_spec); prints
 * why and returns false for an unknown drafter. */
static inline bool cli_spec_parse(const char *cmd, const char *v, int *out) {
    int r = eng_spec_from_name(v, out);
    if (r) fprintf(stderr, "hone %s: unknown --spec '%s' (auto, off, suffix, draft, mtp, dflash)\n", cmd, v);
    return r == 0;
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
