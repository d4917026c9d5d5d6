/* cmd_template.c: `hone template -t TEMPLATE.jinja -c CONTEXT.json` renders a
 * chat template with the variables of a JSON object and prints the result, or
 * prints the error and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../template/template.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone template -t TEMPLATE.jinja [-c CONTEXT.json]\n"
            "\n"
            "Renders a Jinja chat template the way transformers' apply_chat_template does\n"
            "(trim_blocks, lstrip_blocks, tojson as json.dumps, raise_exception, strftime_now)\n"
            "and prints the result. CONTEXT.json is an object whose keys become the\n"
            "template's variables: messages, tools, add_generation_prompt, bos_token,\n"
            "eos_token, and any others (enable_thinking, ...). null is Python None.\n"
            "\n"
            "  -t, --template FILE   the template source\n"
            "  -c, --context FILE    the variables (default: none)\n"
            "  -h, --help            this help\n"
            "\n"
            "Exit status: 0 rendered, 1 the template failed (the error is printed), 2 usage.\n");
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = hn_malloc(cap);
    while (buf) {
        if (n == cap) {
            char *nb = hn_realloc(buf, cap * 2);
            if (!nb) {
                hn_free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    fclose(f);
    *len = n;
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *tpath = NULL, *cpath = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--template")) && i + 1 < argc) {
            tpath = argv[++i];
        } else if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--context")) && i + 1 < argc) {
            cpath = argv[++i];
        } else {
            fprintf(stderr, "hone template: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!tpath) {
        usage(stderr);
        return 2;
    }
    size_t len;
    char *src = read_file(tpath, &len);
    if (!src) {
        fprintf(stderr, "hone template: cannot read %s\n", tpath);
        return 1;
    }
    json_t *ctx = NULL;
    if (cpath) {
        json_error_t jerr;
        ctx = json_load_file(cpath, JSON_DECODE_ANY, &jerr);
        if (!ctx || !json_is_object(ctx)) {
            if (ctx) fprintf(stderr, "hone template: %s: the context must be a JSON object\n", cpath);
            else fprintf(stderr, "hone template: %s:%d:%d: %s\n", cpath, jerr.line, jerr.column, jerr.text);
            json_decref(ctx);
            hn_free(src);
            return 1;
        }
    }
    hn_err err;
    hn_err_clear(&err);
    tpl_template *t;
    int rc = 0;
    if (tpl_compile(src, len, &t, &err) != HN_OK) {
        fprintf(stderr, "hone template: %s: syntax error: %s\n", tpath, err.msg);
        rc = 1;
    } else {
        tpl_buf out = {0};
        tpl_errkind kind;
        if (tpl_render(t, ctx, NULL, &out, &kind, &err) != HN_OK) {
            const char *what = kind == TPL_E_RAISE       ? "raise_exception"
                               : kind == TPL_E_UNDEFINED ? "undefined"
                               : kind == TPL_E_SECURITY  ? "sandbox"
                               : kind == TPL_E_LIMIT     ? "limit"
                               : kind == TPL_E_NOMEM     ? "out of memory"
                                                         : "runtime";
            fprintf(stderr, "hone template: %s: %s error: %s\n", tpath, what, err.msg);
            rc = 1;
        } else {
            fwrite(out.data, 1, out.len, stdout);
        }
        tpl_buf_free(&out);
        tpl_free(t);
    }
    json_decref(ctx);
    hn_free(src);
    return rc;
}
