/* cmd_tokenize.c: `hone tokenize -m FILE [--no-bos] [--parse-special|--no-parse-special] TEXT`
 * prints the token ids of TEXT (space-separated, one line) using the
 * vocabulary of a GGUF model. BOS/EOS are added as the model's metadata says
 * unless --no-bos; special-token text is parsed by default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../gguf/gguf.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone tokenize -m FILE [--no-bos] [--parse-special|--no-parse-special] TEXT\n"
            "\n"
            "Prints the token ids of TEXT, separated by spaces.\n"
            "\n"
            "  -m, --model FILE     GGUF file whose vocabulary to use\n"
            "  --no-bos             do not add BOS/EOS even if the model asks for them\n"
            "  --parse-special      match special-token text such as <|im_start|> (default)\n"
            "  --no-parse-special   treat special-token text as plain text\n"
            "  -h, --help           this help\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool add_special = true, parse_special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "hone tokenize: %s needs a file\n", a);
                return 2;
            }
            model = argv[++i];
        } else if (!strcmp(a, "--no-bos")) {
            add_special = false;
        } else if (!strcmp(a, "--parse-special")) {
            parse_special = true;
        } else if (!strcmp(a, "--no-parse-special")) {
            parse_special = false;
        } else if (!strcmp(a, "--")) {
            if (i + 1 < argc && !text) text = argv[++i];
            if (i + 1 < argc) {
                fprintf(stderr, "hone tokenize: only one TEXT argument\n");
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "hone tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "hone tokenize: only one TEXT argument (quote it)\n");
            return 2;
        }
    }
    if (!model || !text) {
        fprintf(stderr, "hone tokenize: %s\n", !model ? "missing -m FILE" : "missing TEXT");
        usage(stderr);
        return 2;
    }
    hn_err err = {0};
    gguf_ctx *g = NULL;
    if (gguf_open(model, &g, &err) != HN_OK) {
        fprintf(stderr, "hone tokenize: %s\n", err.msg);
        return 1;
    }
    tok_vocab *v = NULL;
    hn_status st = tok_load(g, &v, &err);
    gguf_close(g);
    if (st != HN_OK) {
        fprintf(stderr, "hone tokenize: %s\n", err.msg);
        return 1;
    }
    size_t len = strlen(text);
    int64_t n = tok_encode(v, text, len, add_special, parse_special, NULL, 0);
    int32_t *ids = n > 0 ? hn_malloc((size_t)n * sizeof *ids) : NULL;
    if (n < 0 || (n > 0 && (!ids || tok_encode(v, text, len, add_special, parse_special, ids, n) != n))) {
        fprintf(stderr, "hone tokenize: tokenization failed (out of memory?)\n");
        hn_free(ids);
        tok_free(v);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    hn_free(ids);
    tok_free(v);
    return fflush(stdout) == 0 ? 0 : 1;
}
