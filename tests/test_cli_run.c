/* test_cli_run.c: `hone run` and `hone logits` end to end on shared models
 * (needs HONE_BIN, the path of the built binary; `make test` sets it). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

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
    const char *bin = getenv("HONE_BIN");
    CHECKF(bin && *bin, "HONE_BIN is not set");
    if (!bin || !*bin) TEST_DONE();
    char real[1024], q3[1024], ref[1024], cmd[4096], out[8192];
    test_data_path(real, sizeof real, "data/models/qwen3-real-q8_0.gguf");
    test_data_path(q3, sizeof q3, "data/models/qwen3-2k-f32.gguf");

    /* greedy ids from a token prompt equal llama.cpp's greedy tokens (qwen3-2k-f32 p2: 32 must match) */
    test_data_path(ref, sizeof ref, "data/ref/qwen3-2k-f32/p2.json");
    FILE *f = fopen(ref, "r");
    char js[65536];
    size_t n = f ? fread(js, 1, sizeof js - 1, f) : 0;
    if (f) fclose(f);
    js[n] = 0;
    /* pull the two arrays out with a tiny scan (no JSON library needed for this) */
    char prompt[2048] = "", greedy[2048] = "";
    const char *pt = strstr(js, "\"prompt_tokens\""), *gt = strstr(js, "\"greedy_tokens\"");
    CHECK(pt && gt);
    if (pt && gt) {
        char *dst[2] = {prompt, greedy};
        const char *src[2] = {strchr(pt, '['), strchr(gt, '[')};
        for (int k = 0; k < 2; k++) {
            size_t o = 0;
            int count = 0;
            for (const char *s = src[k] + 1; *s && *s != ']' && o < 2000; s++) {
                if (*s >= '0' && *s <= '9') dst[k][o++] = *s;
                else if (*s == ',') {
                    dst[k][o++] = ' ';
                    count++;
                }
                if (k == 1 && count == 8) break; /* first 8 greedy tokens */
            }
            while (o && dst[k][o - 1] == ' ') o--;
            dst[k][o] = 0;
        }
    }
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --tokens '%s' -n 8 --temp 0 --print-ids -t 2 2>/dev/null", bin, q3,
             prompt);
    CHECK(run(cmd, out, sizeof out) == 0);
    size_t ol = strlen(out);
    while (ol && (out[ol - 1] == '\n' || out[ol - 1] == ' ')) out[--ol] = 0;
    CHECKF(!strcmp(out, greedy), "greedy ids '%s', llama.cpp '%s'", out, greedy);

    /* text in, text out, speed on stderr */
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'Hello, my name is' -n 6 --temp 0.7 --seed 1 2>&1 >/dev/null", bin, real);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "tok/s") && strstr(out, "prompt 5 tokens"), "stderr: %s", out);
    /* same seed, same text; sampling parameters are accepted */
    char a[4096], b[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' run -m '%s' -p 'Hello' -n 10 --temp 0.9 --top-k 20 --top-p 0.9 --min-p 0.01 --repeat-penalty 1.1 --seed 7 2>/dev/null",
             bin, real);
    CHECK(run(cmd, a, sizeof a) == 0);
    CHECK(run(cmd, b, sizeof b) == 0);
    CHECKF(!strcmp(a, b) && strlen(a) > 1, "seeded runs differ: '%s' vs '%s'", a, b);

    /* hone logits writes n_vocab floats that match llama.cpp's last logits */
    char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/hone-test-logits-%d.f32", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --tokens '%s' -o '%s'", bin, q3, prompt, tmp);
    CHECK(run(cmd, out, sizeof out) == 0);
    static float got[2048], want[2048];
    f = fopen(tmp, "rb");
    size_t ng = f ? fread(got, 4, 2048, f) : 0;
    if (f) fclose(f);
    unlink(tmp);
    test_data_path(ref, sizeof ref, "data/ref/qwen3-2k-f32/p2.last.f32");
    f = fopen(ref, "rb");
    size_t nw = f ? fread(want, 4, 2048, f) : 0;
    if (f) fclose(f);
    CHECK(ng == 2048 && nw == 2048);
    float d = 0;
    for (int i = 0; i < 2048; i++)
        if (fabsf(got[i] - want[i]) > d) d = fabsf(got[i] - want[i]);
    CHECKF(d < 1e-2f, "logits differ from llama.cpp's by %g", d);

    /* demo model: written to the cache dir on first use, reused after */
    char cache[256];
    snprintf(cache, sizeof cache, "/tmp/hone-test-cache-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s' '%s' run -n 4 -p 'Once upon' 2>&1 >/dev/null", cache, bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "wrote the demo model"));
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "running the demo model") && !strstr(out, "wrote"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    CHECK(system(cmd) == 0);

    /* help and errors */
    snprintf(cmd, sizeof cmd, "'%s' run --help", bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "usage: hone run"));
    snprintf(cmd, sizeof cmd, "'%s' logits --help", bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "usage: hone logits"));
    snprintf(cmd, sizeof cmd, "'%s' run -m /nonexistent.gguf -p hi 2>&1", bin);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "nonexistent"));
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --tokens '1 999999' 2>&1", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "999999"));
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --bogus 2>/dev/null", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -n abc 2>/dev/null", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --tokens '1 2' 2>&1", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "-o"));
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --tokens '1 2' -o /nonexistent/dir/x 2>&1", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "cannot write"));
    TEST_DONE();
}
