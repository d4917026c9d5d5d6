/* main.c: `hone COMMAND ...` dispatch. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"logits", cmd_logits, "write the last position's logits for a token list"},
    {"info", cmd_info, "print a GGUF file's metadata and tensor table"},
    {"quantize", cmd_quantize, "convert a GGUF model to another tensor type"},
    {"template", cmd_template, "render a chat template with a JSON context"},
    {"serve", cmd_serve, "serve OpenAI, Responses and Anthropic APIs over HTTP"},
    {"ps", cmd_ps, "show a running server's sessions, their memory, the KV pool and the model"},
    {"tune", cmd_tune, "probe this machine and tune the CPU (or --device cuda: GPU) kernels (cached per device)"},
    {"bench", cmd_bench, "prefill/decode speed like llama-bench; `bench agents`: concurrent sessions sharing a prefix"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: hone COMMAND [options]   (hone COMMAND --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "hone: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
