/* cmd_info.c: `hone info FILE`: a GGUF file's header, metadata and tensor
 * table. Long strings and arrays are abbreviated so that a 150k-token vocab is
 * one line; everything printed comes from the validated reader. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gguf/gguf.h"
#include "cli.h"

#define STR_SHOWN 72  /* bytes of a string shown before "..." */
#define ARR_SHOWN 6   /* array elements shown */

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone info FILE\n\n"
            "Prints a GGUF file's version, alignment, metadata (key, type, value; long\n"
            "strings and arrays abbreviated) and tensor table (name, type, shape, offset,\n"
            "bytes), then the parameter and byte totals.\n");
}

/* Prints a string quoted, escaping control bytes, at most `max` bytes. */
static void print_str(const char *s, uint64_t len, uint64_t max) {
    putchar('"');
    uint64_t n = len < max ? len : max;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (len > max) printf("... (%" PRIu64 " bytes)", len);
}

/* Shortest decimal that reads back as the same float (1e-06, not 9.99999997e-07). */
static void print_f32(float f) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, f);
        if (strtof(buf, NULL) == f || prec == 9) break;
    }
    fputs(buf, stdout);
}

static void print_value(const gguf_value *v, int depth) {
    switch (v->type) {
    case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64: printf("%" PRIu64, v->v.u64); break;
    case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64: printf("%" PRId64, v->v.i64); break;
    case GGUF_F32: print_f32((float)v->v.f64); break;
    case GGUF_F64: printf("%.17g", v->v.f64); break;
    case GGUF_BOOL: fputs(v->v.b ? "true" : "false", stdout); break;
    case GGUF_STRING: print_str(v->v.str.ptr, v->v.str.len, depth ? 24 : STR_SHOWN); break;
    case GGUF_ARRAY: {
        uint64_t n = v->v.arr.n, shown = n < ARR_SHOWN ? n : ARR_SHOWN;
        printf("%s[%" PRIu64 "] [", gguf_vtype_name(v->v.arr.elem), n);
        for (uint64_t i = 0; i < shown; i++) {
            if (i) fputs(", ", stdout);
            gguf_vtype e = v->v.arr.elem;
            if (e == GGUF_STRING || e == GGUF_ARRAY) print_value(&v->v.arr.items[i], depth + 1);
            else if (e == GGUF_F32) print_f32((float)gguf_arr_float(v, i));
            else if (e == GGUF_F64) printf("%.17g", gguf_arr_float(v, i));
            else if (e == GGUF_U64) printf("%" PRIu64, (uint64_t)gguf_arr_int(v, i));
            else if (e == GGUF_BOOL) fputs(gguf_arr_int(v, i) ? "true" : "false", stdout);
            else printf("%" PRId64, gguf_arr_int(v, i));
        }
        fputs(n > shown ? ", ...]" : "]", stdout);
        break;
    }
    default: fputs("?", stdout); break;
    }
}

static const char *type_name(qt_type t) {
    static const char *const names[QT_TYPE_COUNT] = {
        [QT_F32] = "f32", [QT_F16] = "f16", [QT_Q4_0] = "q4_0", [QT_Q4_1] = "q4_1", [QT_Q5_0] = "q5_0",
        [QT_Q5_1] = "q5_1", [QT_Q8_0] = "q8_0", [QT_Q8_1] = "q8_1", [QT_Q2_K] = "q2_K", [QT_Q3_K] = "q3_K",
        [QT_Q4_K] = "q4_K", [QT_Q5_K] = "q5_K", [QT_Q6_K] = "q6_K", [QT_Q8_K] = "q8_K",
        [QT_IQ2_XXS] = "iq2_xxs", [QT_IQ2_XS] = "iq2_xs", [QT_IQ3_XXS] = "iq3_xxs", [QT_IQ1_S] = "iq1_s",
        [QT_IQ4_NL] = "iq4_nl", [QT_IQ3_S] = "iq3_s", [QT_IQ2_S] = "iq2_s", [QT_IQ4_XS] = "iq4_xs",
        [QT_I8] = "i8", [QT_I16] = "i16", [QT_I32] = "i32", [QT_I64] = "i64", [QT_F64] = "f64",
        [QT_IQ1_M] = "iq1_m", [QT_BF16] = "bf16", [QT_TQ1_0] = "tq1_0", [QT_TQ2_0] = "tq2_0",
        [QT_MXFP4] = "mxfp4",
    };
    return (unsigned)t < QT_TYPE_COUNT && names[t] ? names[t] : "?";
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "hone info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (path) {
            fprintf(stderr, "hone info: one file at a time\n");
            return 2;
        }
        path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    gguf_ctx *c = NULL;
    hn_err err;
    hn_err_clear(&err);
    if (gguf_open(path, &c, &err) != HN_OK) {
        fprintf(stderr, "hone info: %s\n", err.msg);
        return 1;
    }
    printf("file: %s\n", path);
    printf("version: %" PRIu32 "  alignment: %zu  data offset: %zu  metadata: %" PRId64 "  tensors: %" PRId64 "\n",
           gguf_version(c), gguf_alignment(c), gguf_data_offset(c), gguf_n_kv(c), gguf_n_tensors(c));
    printf("\nmetadata:\n");
    for (int64_t i = 0; i < gguf_n_kv(c); i++) {
        const gguf_value *v = gguf_kv_value(c, i);
        printf("  %-44s %-6s ", gguf_kv_key(c, i), gguf_vtype_name(v->type));
        print_value(v, 0);
        putchar('\n');
    }
    int64_t n_params = 0;
    uint64_t n_bytes = 0;
    if (gguf_n_tensors(c)) {
        printf("\ntensors:\n  %5s %-36s %-7s %-26s %12s %12s\n", "#", "name", "type", "shape", "offset", "bytes");
        for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
            const gguf_tensor *t = gguf_tensor_at(c, i);
            char shape[96];
            int o = snprintf(shape, sizeof shape, "[");
            int64_t ne = 1;
            for (int d = 0; d < t->n_dims; d++) {
                o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%" PRId64, d ? ", " : "", t->ne[d]);
                ne *= t->ne[d];
            }
            snprintf(shape + o, sizeof shape - (size_t)o, "]");
            printf("  %5" PRId64 " %-36s %-7s %-26s %12" PRIu64 " %12zu\n", i, t->name, type_name(t->type), shape,
                   t->offset, t->nbytes);
            n_params += ne;
            n_bytes += t->nbytes;
        }
    }
    printf("\ntotal: %" PRId64 " tensors, %" PRId64 " parameters (%.2f M), %" PRIu64 " bytes (%.2f MiB)\n",
           gguf_n_tensors(c), n_params, n_params / 1e6, n_bytes, n_bytes / (1024.0 * 1024.0));
    gguf_close(c);
    return 0;
}
