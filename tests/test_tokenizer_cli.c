/* test_tokenizer_cli.c: `hone tokenize` end to end (needs HONE_BIN, the path
 * of the built binary; `make test` sets it). */
#include <stdbool.h>
#include <sys/wait.h>

#include "test.h"

static const char *bin;

/* Runs a shell command; captures stdout into out; returns the exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    bin = getenv("HONE_BIN");
    CHECKF(bin && *bin, "HONE_BIN is not set");
    if (!bin || !*bin) TEST_DONE();
    char model[1024], spm[1024], cmd[4096], out[4096];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    test_data_path(spm, sizeof spm, "data/vocab/ggml-vocab-llama-spm.gguf");

    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' 'Hello, my name is'", bin, model);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(out, "9707 11 847 829 374\n"), "got '%s'", out);

    /* special tokens: parsed by default, plain text with --no-parse-special */
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' '<|im_start|>user'", bin, model);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(!strncmp(out, "151644 ", 7), "got '%s'", out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --no-parse-special -m '%s' '<|im_start|>user'", bin, model);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(strncmp(out, "151644", 6) != 0 && strlen(out) > 8, "got '%s'", out);

    /* BOS from the metadata (llama-spm adds it), --no-bos drops it */
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' 'Hello world'", bin, spm);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(out, "1 15043 3186\n"), "got '%s'", out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --no-bos -m '%s' 'Hello world'", bin, spm);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(out, "15043 3186\n"), "got '%s'", out);

    /* help, usage errors and load errors */
    snprintf(cmd, sizeof cmd, "'%s' tokenize --help", bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "usage: hone tokenize"));
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m /nonexistent/file.gguf hi 2>/dev/null", bin);
    CHECK(run(cmd, out, sizeof out) == 1 && out[0] == 0);
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' 2>&1 >/dev/null", bin, model);
    CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "missing TEXT"));
    snprintf(cmd, sizeof cmd, "'%s' tokenize --bogus -m '%s' hi 2>/dev/null", bin, model);
    CHECK(run(cmd, out, sizeof out) == 2);
    char bert[1024];
    test_data_path(bert, sizeof bert, "data/vocab/ggml-vocab-bert-bge.gguf");
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' hi 2>&1", bin, bert);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "unsupported"));
    TEST_DONE();
}
