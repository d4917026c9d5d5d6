/* test_quant_cli.c: `hone quantize` against llama-quantize. The shared llama-2k
 * and qwen3-2k models were quantized by llama-quantize from the shared f32
 * files; hone quantizing the same f32 file must write the very same file, byte
 * for byte (metadata, tensor order, per-tensor types, data, padding). For the
 * MoE model (whose f32 source is not shipped) the metadata and tensor table
 * must match. Also: re-quantizing an already quantized file, F16 output, and
 * the command's error exits. */
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"

static const char *hone_bin(void) {
    const char *b = getenv("HONE_BIN");
    return b && *b ? b : "build/hone";
}

static char tmpdir[64];

/* Runs `hone quantize ARGS` quietly; returns the exit code (-1 if it did not exit). */
static int quantize(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s quantize %s >/dev/null 2>&1", hone_bin(), args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = hn_malloc(len > 0 ? (size_t)len : 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        hn_free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Quantizes data/models/<src>.gguf to <type> and compares the whole file with data/models/<ref>.gguf. */
static void same_file(const char *src, const char *type, const char *ref) {
    char in[512], want[512], out[600], args[1800];
    test_data_path(in, sizeof in, src);
    test_data_path(want, sizeof want, ref);
    snprintf(out, sizeof out, "%s/%s.gguf", tmpdir, type);
    snprintf(args, sizeof args, "%s %s %s -t 2", in, out, type);
    int rc = quantize(args);
    CHECKF(rc == 0, "quantize %s %s: exit %d", src, type, rc);
    size_t na = 0, nb = 0;
    uint8_t *a = slurp(out, &na), *b = slurp(want, &nb);
    CHECKF(a && b, "read %s / %s", out, want);
    if (a && b) {
        size_t k = 0, n = na < nb ? na : nb;
        while (k < n && a[k] == b[k]) k++;
        CHECKF(na == nb && k == n, "%s -> %s: %zu vs %zu bytes, first difference at byte %zu", src, type, na, nb, k);
        if (na == nb && k == n) printf("ok %s -> %s: identical to %s (%zu bytes)\n", src, type, ref, na);
    }
    hn_free(a);
    hn_free(b);
    unlink(out);
}

static bool value_eq(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case GGUF_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
    case GGUF_ARRAY:
        if (a->v.arr.elem != b->v.arr.elem || a->v.arr.n != b->v.arr.n) return false;
        if (a->v.arr.elem == GGUF_STRING || a->v.arr.elem == GGUF_ARRAY) {
            for (uint64_t i = 0; i < a->v.arr.n; i++)
                if (!value_eq(&a->v.arr.items[i], &b->v.arr.items[i])) return false;
            return true;
        }
        for (uint64_t i = 0; i < a->v.arr.n; i++)
            if (gguf_arr_float(a, i) != gguf_arr_float(b, i) || gguf_arr_int(a, i) != gguf_arr_int(b, i)) return false;
        return true;
    case GGUF_F32: case GGUF_F64: return a->v.f64 == b->v.f64;
    case GGUF_BOOL: return a->v.b == b->v.b;
    default: return a->v.u64 == b->v.u64;
    }
}

/* Same metadata (keys, order, values) and tensor table (order, names, types, shapes, offsets). */
static void same_layout(const char *src, const char *type, const char *ref) {
    char in[512], want[512], out[600], args[1800];
    test_data_path(in, sizeof in, src);
    test_data_path(want, sizeof want, ref);
    snprintf(out, sizeof out, "%s/layout.gguf", tmpdir);
    snprintf(args, sizeof args, "%s %s %s", in, out, type);
    CHECKF(quantize(args) == 0, "quantize %s %s", src, type);
    gguf_ctx *a = NULL, *b = NULL;
    hn_err err;
    if (gguf_open(out, &a, &err) || gguf_open(want, &b, &err)) {
        CHECKF(0, "open: %s", err.msg);
    } else {
        int bad = 0;
        CHECK(gguf_n_kv(a) == gguf_n_kv(b));
        for (int64_t i = 0; i < gguf_n_kv(a) && i < gguf_n_kv(b); i++)
            if (strcmp(gguf_kv_key(a, i), gguf_kv_key(b, i)) || !value_eq(gguf_kv_value(a, i), gguf_kv_value(b, i))) {
                fprintf(stderr, "  metadata %lld: %s vs %s\n", (long long)i, gguf_kv_key(a, i), gguf_kv_key(b, i));
                bad++;
            }
        CHECK(gguf_n_tensors(a) == gguf_n_tensors(b));
        for (int64_t i = 0; i < gguf_n_tensors(a) && i < gguf_n_tensors(b); i++) {
            const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_tensor_at(b, i);
            if (strcmp(x->name, y->name) || x->type != y->type || x->offset != y->offset ||
                memcmp(x->ne, y->ne, sizeof x->ne)) {
                fprintf(stderr, "  tensor %lld: %s %s vs %s %s\n", (long long)i, x->name, qt_name(x->type), y->name,
                        qt_name(y->type));
                bad++;
            }
        }
        CHECKF(bad == 0, "%s -> %s: %d metadata/tensor-table differences from %s", src, type, bad, ref);
    }
    gguf_close(a);
    gguf_close(b);
    unlink(out);
}

/* Quantizes and checks every tensor's type against a reference file and the
 * values against dequantized f32 data (relative rmse below `tol`). */
static void check_types_and_values(const char *src, const char *type, const char *ref, double tol) {
    char in[512], want[512], out[600], args[1800], f32[512];
    test_data_path(in, sizeof in, src);
    test_data_path(want, sizeof want, ref);
    test_data_path(f32, sizeof f32, "data/models/llama-2k-f32.gguf");
    snprintf(out, sizeof out, "%s/vals.gguf", tmpdir);
    snprintf(args, sizeof args, "%s %s %s", in, out, type);
    CHECKF(quantize(args) == 0, "quantize %s %s", src, type);
    gguf_ctx *a = NULL, *b = NULL, *orig = NULL;
    hn_err err;
    if (gguf_open(out, &a, &err) || gguf_open(want, &b, &err) || gguf_open(f32, &orig, &err)) {
        CHECKF(0, "open: %s", err.msg);
    } else {
        int bad_type = 0, bad_val = 0;
        for (int64_t i = 0; i < gguf_n_tensors(a); i++) {
            const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_find_tensor(b, x->name),
                              *o = gguf_find_tensor(orig, x->name);
            if (!y || !o || x->type != y->type) {
                bad_type++;
                continue;
            }
            int64_t n = x->ne[0] * x->ne[1] * x->ne[2] * x->ne[3];
            float *v = hn_malloc((size_t)n * sizeof(float));
            qt_traits(x->type)->to_float(x->data, v, n);
            const float *w = o->data;
            double e = 0, r = 0;
            for (int64_t k = 0; k < n; k++) {
                e += ((double)v[k] - w[k]) * ((double)v[k] - w[k]);
                r += (double)w[k] * w[k];
            }
            if (r > 0 && e / r > tol * tol) bad_val++;
            hn_free(v);
        }
        CHECKF(bad_type == 0, "%s -> %s: %d tensor types differ from %s", src, type, bad_type, ref);
        CHECKF(bad_val == 0, "%s -> %s: %d tensors too far from the f32 weights", src, type, bad_val);
    }
    gguf_close(a);
    gguf_close(b);
    gguf_close(orig);
    unlink(out);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hone-quant-test-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        CHECKF(0, "mkdtemp");
        TEST_DONE();
    }
    same_file("data/models/llama-2k-f32.gguf", "Q8_0", "data/models/llama-2k-q8_0.gguf");
    same_file("data/models/llama-2k-f32.gguf", "Q4_0", "data/models/llama-2k-q4_0.gguf");
    same_file("data/models/llama-2k-f32.gguf", "Q4_K_M", "data/models/llama-2k-q4_k_m.gguf");
    same_file("data/models/qwen3-2k-f32.gguf", "Q4_K_M", "data/models/qwen3-2k-q4_k_m.gguf");
    {
        static const char *more[][2] = {{"Q4_1", "q4_1"}, {"Q5_0", "q5_0"}, {"Q5_1", "q5_1"}, {"Q2_K", "q2_k"},
                                        {"Q3_K_M", "q3_k_m"}, {"Q5_K_M", "q5_k_m"}, {"Q6_K", "q6_k"},
                                        {"IQ4_NL", "iq4_nl"}, {"IQ4_XS", "iq4_xs"}};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
            char ref[128];
            snprintf(ref, sizeof ref, "data/models/llama-2k-%s.gguf", more[i][1]);
            same_file("data/models/llama-2k-f32.gguf", more[i][0], ref);
        }
        same_file("data/models/qwen3-2k-f32.gguf", "q8_0", "data/models/qwen3-2k-q8_0.gguf");
    }
    /* MoE mix (8 experts: attn_v/attn_k to Q8_0, per-layer ffn_down_exps) and qwen2 */
    same_layout("data/models/qwen3moe-2k-f16.gguf", "Q4_K_M", "data/models/qwen3moe-2k-q4_k_m.gguf");
    same_layout("data/models/qwen2-2k-f16.gguf", "Q8_0", "data/models/qwen2-2k-q8_0.gguf");
    /* already-quantized input is dequantized first; F16 output */
    check_types_and_values("data/models/llama-2k-q8_0.gguf", "Q4_0", "data/models/llama-2k-q4_0.gguf", 0.15);
    check_types_and_values("data/models/llama-2k-bf16.gguf", "F16", "data/models/llama-2k-f16.gguf", 0.01);

    /* errors */
    char in[512], args[1200];
    test_data_path(in, sizeof in, "data/models/llama-2k-f32.gguf");
    snprintf(args, sizeof args, "%s %s/x.gguf Q7_Z", in, tmpdir);
    CHECK(quantize(args) == 2);
    snprintf(args, sizeof args, "%s/missing.gguf %s/x.gguf Q8_0", tmpdir, tmpdir);
    CHECK(quantize(args) == 1);
    CHECK(quantize("") == 2);
    snprintf(args, sizeof args, "%s %s/nodir/x.gguf Q8_0", in, tmpdir);
    CHECK(quantize(args) == 1);
    CHECK(quantize("--help") == 0);
    rmdir(tmpdir);
    TEST_DONE();
}
