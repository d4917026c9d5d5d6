/* test_template_fuzz.c: templates are untrusted input. Mutates the corpus
 * templates (byte flips, deletions, splices, inserted Jinja tokens), compiles
 * and renders each mutant under tight limits, and checks that every outcome is
 * a clean success or a clean error (run under ASan+UBSan too). Also fails
 * the Nth allocation throughout compile and render. */
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/alloc.h"
#include "template/template.h"
#include "test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static const char *const snippets[] = {
    "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", "{% endif %}", "{% endfor %}",
    "{% for x in messages %}", "{% if x %}", "{% else %}", "{% set ns.a = 1 %}", "{% macro m(a=1) %}",
    "{% endmacro %}", "{{ m() }}", "loop.", "|tojson", "|length", "|items", "(", ")", "[", "]", "{", "}",
    " is ", " not ", " in ", "namespace(", "'", "\"", "\\", "\\u12", "[::-1]", "[-1]", ".strip()",
    ".split(", "~", " + ", " * 99999", "range(999999)", "raise_exception('x')", "\n", " ", "|", ".",
    ",", "=", "{% break %}", "{% filter upper %}", "{% set x %}", "{% endset %}", "{% generation %}",
    "none", "true", "0", "-", "1e308", "9223372036854775807", "messages[0]", "tools", "é", "\xff",
};

static size_t mutate(char *dst, size_t cap, const char *src, size_t n) {
    size_t len = n < cap ? n : cap;
    memcpy(dst, src, len);
    int k = 1 + (int)(next() % 4);
    for (int m = 0; m < k; m++) {
        size_t pos = len ? next() % len : 0;
        switch (next() % 5) {
        case 0: /* byte replace */
            if (len) dst[pos] = (char)(next() % 256);
            break;
        case 1: { /* delete a range */
            size_t d = next() % 64;
            if (pos + d > len) d = len - pos;
            memmove(dst + pos, dst + pos + d, len - pos - d);
            len -= d;
            break;
        }
        case 2: { /* duplicate a range from elsewhere */
            size_t from = len ? next() % len : 0, d = next() % 128;
            if (from + d > len) d = len - from;
            if (len + d > cap) break;
            char tmp[128];
            memcpy(tmp, dst + from, d);
            memmove(dst + pos + d, dst + pos, len - pos);
            memcpy(dst + pos, tmp, d);
            len += d;
            break;
        }
        default: { /* insert a snippet */
            const char *s = snippets[next() % (sizeof snippets / sizeof snippets[0])];
            size_t d = strlen(s);
            if (len + d > cap) break;
            memmove(dst + pos + d, dst + pos, len - pos);
            memcpy(dst + pos, s, d);
            len += d;
        }
        }
    }
    return len;
}

int main(void) {
    char path[1024];
    json_error_t jerr;
    json_t *convs = json_load_file(test_data_path(path, sizeof path, "data/templates/conversations.json"), 0, &jerr);
    CHECKF(convs != NULL, "cannot load %s", path);
    if (!convs) TEST_DONE();
    json_t *clist = json_object_get(convs, "conversations");
    /* one context per conversation */
    size_t nconv = json_array_size(clist);
    json_t *ctx[32];
    for (size_t c = 0; c < nconv && c < 32; c++) {
        json_t *conv = json_array_get(clist, c);
        ctx[c] = json_object();
        json_object_set(ctx[c], "messages", json_object_get(conv, "messages"));
        json_t *tools = json_object_get(conv, "tools");
        json_object_set(ctx[c], "tools", tools ? tools : json_null());
        json_object_set(ctx[c], "add_generation_prompt", json_true());
        json_object_set_new(ctx[c], "bos_token", json_string("<s>"));
        json_object_set_new(ctx[c], "eos_token", json_string("</s>"));
    }
    const char *dirp = test_data_path(path, sizeof path, "data/templates/templates");
    char dirname[1024];
    snprintf(dirname, sizeof dirname, "%s", dirp);
    DIR *dir = opendir(dirname);
    CHECKF(dir != NULL, "cannot open %s", dirname);
    if (!dir) TEST_DONE();
    bool sanitized = getenv("HONE_SANITIZED") && *getenv("HONE_SANITIZED") == '1';
    int per_template = sanitized ? 80 : 400;
    if (getenv("HONE_FUZZ_ITERS")) per_template = atoi(getenv("HONE_FUZZ_ITERS")); /* longer local runs */
    if (getenv("HONE_FUZZ_SEED")) rng ^= strtoull(getenv("HONE_FUZZ_SEED"), NULL, 10) * 0x2545F4914F6CDD1Dull;
    tpl_options opt = {0};
    opt.max_output = 1 << 20;
    opt.max_memory = 64 << 20;
    opt.max_steps = 200000;
    opt.now = 1750000000;
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    long runs = 0, compiled = 0, rendered = 0, files = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        size_t nl = strlen(de->d_name);
        if (nl < 7 || strcmp(de->d_name + nl - 6, ".jinja")) continue;
        char fp[2048];
        snprintf(fp, sizeof fp, "%s/%s", dirname, de->d_name);
        size_t n;
        char *src = slurp(fp, &n);
        if (!src || n > cap) {
            free(src);
            continue;
        }
        files++;
        for (int it = 0; it < per_template; it++) {
            size_t len = mutate(buf, cap, src, n);
            tpl_template *t;
            hn_err err;
            runs++;
            if (tpl_compile(buf, len, &t, &err) != HN_OK) {
                CHECKF(err.msg[0] != 0, "compile error without a message");
                continue;
            }
            compiled++;
            tpl_buf out = {0};
            tpl_errkind kind;
            hn_status st = tpl_render(t, ctx[next() % nconv], &opt, &out, &kind, &err);
            if (st == HN_OK) {
                rendered++;
                CHECKF(out.data && strlen(out.data) <= out.len && out.len <= opt.max_output, "bad output buffer");
            } else {
                CHECKF(kind != TPL_E_NONE, "render failed without an error kind");
            }
            tpl_buf_free(&out);
            tpl_free(t);
        }
        /* allocation failure at every point of one compile+render (a few templates) */
        if (files % 17 == 1) {
            for (long k = 0; k < (sanitized ? 60 : 400); k += 1) {
                hn_alloc_fail_after(k);
                tpl_template *t;
                hn_err err;
                hn_status st = tpl_compile(src, n, &t, &err);
                if (st == HN_OK) {
                    tpl_buf out = {0};
                    tpl_errkind kind;
                    tpl_render(t, ctx[9 % nconv], &opt, &out, &kind, &err);
                    tpl_buf_free(&out);
                    tpl_free(t);
                } else {
                    CHECKF(st == HN_ERR_NOMEM || st == HN_ERR_FORMAT, "alloc failure gave status %d", st);
                }
                hn_alloc_fail_after(-1);
            }
        }
        free(src);
    }
    closedir(dir);
    CHECKF(files == 68, "expected 68 templates, found %ld", files);
    CHECKF(compiled > runs / 10 && rendered > 0, "mutants: %ld compiled, %ld rendered of %ld", compiled, rendered, runs);
    printf("fuzz: %ld mutants, %ld compiled, %ld rendered\n", runs, compiled, rendered);
    free(buf);
    for (size_t c = 0; c < nconv && c < 32; c++) json_decref(ctx[c]);
    json_decref(convs);
    TEST_DONE();
}
