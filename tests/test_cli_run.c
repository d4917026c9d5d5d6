/* test_cli_run.c: `hone run` and `hone logits` end to end on shared models
 * (needs HONE_BIN, the path of the built binary; `make test` sets it).
 * `hone run` is a client of the engine; its tokens (greedy and sampled, a
 * prompt longer than one prefill step, the demo model) must equal what a
 * hand-run model_forward loop with the same sampler gives, which is what it
 * computed when it had its own loop. Ctrl-C ends it cleanly (exit 130). */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"
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

/* The old `hone run` loop by hand: the prompt in one model_forward (steps of
 * 256 tokens), then sample, accept, decode one token at a time, with the
 * prompt first in the penalty history and no stop at end of generation.
 * Returns the tokens made (gen) or -1. */
static int forward_run(const char *path, const int32_t *prompt, int n, int gen, const smp_params *sp, int32_t *out) {
    hn_err e = {0};
    model *m = NULL;
    model_params mp = {.n_threads = 2, .max_batch = 256};
    if (model_load(path, &mp, &m, &e) != HN_OK) {
        fprintf(stderr, "forward_run: %s\n", e.msg);
        return -1;
    }
    int nv = model_hp(m)->n_vocab, made = -1;
    kv_config kc = model_kv_config(m, (n + gen + 15) / 16, 16);
    kc.type = kc.v_type = QT_F16; /* hone run's KV type (eng_default_params) */
    kv_cache *kv = NULL;
    kv_seq s = {0};
    smp_sampler *smp = smp_new(sp, nv);
    float *lg = hn_malloc(sizeof(float) * (size_t)nv);
    int32_t *pos = hn_malloc(sizeof(int32_t) * (size_t)n), *sid = hn_calloc((size_t)n, sizeof(int32_t));
    if (!smp || !lg || !pos || !sid || kv_create(&kc, &kv, &e) != HN_OK || kv_seq_init(&s, kv, n + gen, &e) != HN_OK)
        goto out;
    /* a hybrid's sequence holds a recurrent-state slot */
    if (model_hp(m)->hybrid && kv_seq_state_acquire(kv, &s, &e) != HN_OK) goto out;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        smp_accept(smp, prompt[i]);
    }
    kv_seq *seqs[1] = {&s};
    model_batch b = {.n_tokens = n, .token = prompt, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    if (model_forward(m, kv, &b, lg, 1, &e) != HN_OK) goto out;
    for (made = 0; made < gen; made++) {
        int32_t t = smp_sample(smp, lg), p = n + made;
        smp_accept(smp, t);
        out[made] = t;
        if (made + 1 == gen) {
            made++;
            break;
        }
        model_batch d = {.n_tokens = 1, .token = &t, .pos = &p, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
        if (model_forward(m, kv, &d, lg, 1, &e) != HN_OK) {
            made = -1;
            break;
        }
    }
out:
    if (made < 0 && e.msg[0]) fprintf(stderr, "forward_run: %s\n", e.msg);
    hn_free(pos);
    hn_free(sid);
    hn_free(lg);
    smp_free(smp);
    if (kv) kv_seq_free(&s, kv);
    kv_free(kv);
    model_free(m);
    return made;
}

static void ids_text(const int32_t *t, int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o + 12 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, i ? " %d" : "%d", t[i]);
}

/* `hone run --print-ids --ignore-eos` on PROMPT with SAMPLING ("--temp 0" or
 * more options) equals forward_run with sp. */
static void run_equals_forward(const char *bin, const char *path, const int32_t *prompt, int n, int gen,
                               const char *sampling, const smp_params *sp, const char *what) {
    static char cmd[16384], pr[8192], out[8192], want[8192];
    static int32_t ref[512];
    ids_text(prompt, n, pr, sizeof pr);
    int got = forward_run(path, prompt, n, gen, sp, ref);
    CHECKF(got == gen, "%s: forward_run made %d of %d", what, got, gen);
    ids_text(ref, got > 0 ? got : 0, want, sizeof want);
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' --tokens '%s' -n %d %s --ignore-eos --print-ids -t 2 2>/dev/null",
             bin, path, pr, gen, sampling);
    CHECK(run(cmd, out, sizeof out) == 0);
    size_t ol = strlen(out);
    while (ol && (out[ol - 1] == '\n' || out[ol - 1] == ' ')) out[--ol] = 0;
    CHECKF(!strcmp(out, want), "%s: hone run '%s', forward '%s'", what, out, want);
}

/* Ctrl-C while generating: the engine request is cancelled, the text so far
 * ends with a newline, stderr says so, exit 130. */
static void test_interrupt(const char *bin, const char *path) {
    char tout[128], terr[128];
    snprintf(tout, sizeof tout, "/tmp/hone-test-int-%d.out", (int)getpid());
    snprintf(terr, sizeof terr, "/tmp/hone-test-int-%d.err", (int)getpid());
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(tout, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(terr, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(99);
        dup2(fo, 1);
        dup2(fe, 2);
        signal(SIGINT, SIG_DFL);
        setenv("HONE_NO_TUNE", "1", 1);
        execl(bin, bin, "run", "-m", path, "-p", "def main():", "-n", "20000", "--ignore-eos", "-t", "2", (char *)NULL);
        _exit(98);
    }
    CHECK(pid > 0);
    if (pid <= 0) return;
    /* wait (up to 120 s) for the first streamed text, then interrupt */
    struct stat st;
    for (int i = 0; i < 1200 && !(stat(tout, &st) == 0 && st.st_size > 0); i++) usleep(100000);
    CHECK(stat(tout, &st) == 0 && st.st_size > 0);
    kill(pid, SIGINT);
    int ws = 0;
    pid_t w;
    for (int i = 0; i < 300 && (w = waitpid(pid, &ws, WNOHANG)) == 0; i++) usleep(100000);
    if (w == 0) { /* did not end within 30 s: a defect; do not leave it running */
        kill(pid, SIGKILL);
        waitpid(pid, &ws, 0);
        CHECKF(0, "hone run did not end within 30 s of SIGINT");
    }
    CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 130, "exit status %d after SIGINT", ws);
    size_t n = 0;
    char *o = test_slurp(tout, &n), *e = test_slurp(terr, NULL);
    CHECK(o && n > 0 && o[n - 1] == '\n');
    CHECKF(e && strstr(e, "interrupted") && strstr(e, "tok/s"), "stderr: %s", e ? e : "");
    free(o);
    free(e);
    unlink(tout);
    unlink(terr);
}

int main(void) {
    const char *bin = getenv("HONE_BIN");
    CHECKF(bin && *bin, "HONE_BIN is not set");
    if (!bin || !*bin) TEST_DONE();
    char real[1024], q3[1024], ref[1024], cmd[4096], out[8192];
    test_data_path(real, sizeof real, "data/models/qwen3-real-q8_0.gguf");
    test_data_path(q3, sizeof q3, "data/models/qwen3-2k-f32.gguf");

    /* greedy ids from a token prompt equal llama.cpp's greedy tokens (qwen3-2k-f32 p2: all 32 must match) */
    test_data_path(ref, sizeof ref, "data/ref/qwen3-2k-f32/p2.json");
    FILE *f = fopen(ref, "r");
    char js[65536];
    size_t n = f ? fread(js, 1, sizeof js - 1, f) : 0;
    if (f) fclose(f);
    js[n] = 0;
    /* pull the two arrays out with a tiny scan (no JSON library needed for this) */
    char prompt[2048] = "", greedy[2048] = "";
    const char *pt = strstr(js, "\"prompt_tokens\""), *gt = strstr(js, "\"greedy_tokens\"");
    const char *mm = strstr(js, "\"greedy_must_match\"");
    int must = mm ? atoi(strchr(mm, ':') + 1) : 0;
    CHECK(pt && gt && must >= 8);
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
                if (k == 1 && count == must) break; /* the first greedy_must_match tokens */
            }
            while (o && dst[k][o - 1] == ' ') o--;
            dst[k][o] = 0;
        }
    }
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --tokens '%s' -n %d --temp 0 --print-ids -t 2 2>/dev/null", bin, q3,
             prompt, must);
    CHECK(run(cmd, out, sizeof out) == 0);
    size_t ol = strlen(out);
    while (ol && (out[ol - 1] == '\n' || out[ol - 1] == ' ')) out[--ol] = 0;
    CHECKF(!strcmp(out, greedy), "greedy ids '%s', llama.cpp '%s'", out, greedy);

    /* the engine client computes what the model's own loop does: greedy on a
     * prompt of two prefill steps (300 tokens), and sampled with every
     * sampler option, the prompt counted by the repeat penalty */
    char q8[1024], lq4[1024];
    test_data_path(q8, sizeof q8, "data/models/qwen3-2k-q8_0.gguf");
    test_data_path(lq4, sizeof lq4, "data/models/llama-2k-q4_k_m.gguf");
    static int32_t longp[300];
    for (int i = 0; i < 300; i++) longp[i] = (int32_t)((i * 7919 + 13) % 2048);
    const int32_t rep[12] = {1, 17, 17, 5, 17, 300, 5, 5, 17, 300, 9, 17};
    smp_params greedy_sp = smp_default_params(), hot = smp_default_params();
    greedy_sp.temp = 0;
    greedy_sp.repeat_penalty = 1;
    hot.temp = 0.9f;
    hot.top_k = 20;
    hot.top_p = 0.9f;
    hot.min_p = 0.01f;
    hot.repeat_penalty = 1.3f;
    hot.seed = 7;
    const char *hot_args = "--temp 0.9 --top-k 20 --top-p 0.9 --min-p 0.01 --repeat-penalty 1.3 --seed 7";
    run_equals_forward(bin, q8, longp, 300, 40, "--temp 0", &greedy_sp, "qwen3-2k-q8_0 greedy, 300-token prompt");
    run_equals_forward(bin, lq4, longp, 300, 40, "--temp 0", &greedy_sp, "llama-2k-q4_k_m greedy, 300-token prompt");
    run_equals_forward(bin, q8, rep, 12, 48, hot_args, &hot, "qwen3-2k-q8_0 sampled");
    run_equals_forward(bin, lq4, rep, 12, 48, hot_args, &hot, "llama-2k-q4_k_m sampled");
    /* experts apart (--cpu-moe): the tokens of the model on one backend */
    char moe[1024], hyb[1024], moe_hot[256];
    test_data_path(moe, sizeof moe, "data/models/qwen3moe-2k-q8_0.gguf");
    test_data_path(hyb, sizeof hyb, "data/models/qwen35moe-tiny-q8_0.gguf");
    snprintf(moe_hot, sizeof moe_hot, "%s --cpu-moe all", hot_args);
    run_equals_forward(bin, moe, longp, 300, 40, "--temp 0 --cpu-moe 1", &greedy_sp, "qwen3moe-2k-q8_0 --cpu-moe 1 greedy");
    run_equals_forward(bin, hyb, rep, 12, 48, moe_hot, &hot, "qwen35moe-tiny-q8_0 --cpu-moe all sampled");

    /* text in, text out, speed on stderr */
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'Hello, my name is' -n 6 --temp 0.7 --seed 1 2>&1 >/dev/null", bin, real);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "tok/s") && strstr(out, "prompt 5 tokens"), "stderr: %s", out);
    /* --device auto (the default) says where it runs, in one line; an explicit device does not */
    const char *note = strstr(out, "hone run: running on the ");
    CHECKF(note && !strstr(note + strlen("hone run: running on the "), "running on the "), "stderr: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'Hello' -n 2 --device cpu 2>&1 >/dev/null", bin, real);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(!strstr(out, "running on the"), "stderr: %s", out);
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
    char demo[512];
    snprintf(demo, sizeof demo, "%s/hone/demo.gguf", cache);
    run_equals_forward(bin, demo, rep, 12, 40, "--temp 0", &greedy_sp, "demo model greedy");
    run_equals_forward(bin, demo, rep, 12, 40, hot_args, &hot, "demo model sampled");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    CHECK(system(cmd) == 0);

    /* Ctrl-C */
    char agent[1024];
    test_interrupt(bin, test_data_path(agent, sizeof agent, "data/models/qwen3-agent-q8_0.gguf"));

    /* help and errors */
    snprintf(cmd, sizeof cmd, "'%s' run --help", bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "usage: hone run"));
    snprintf(cmd, sizeof cmd, "'%s' logits --help", bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "usage: hone logits"));
    static const char *const with_moe[] = {"run", "serve", "bench -r 1", "bench agents"};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --help", bin, with_moe[i]);
        CHECKF(run(cmd, out, sizeof out) == 0 && strstr(out, "--cpu-moe N") && strstr(out, "on the CPU"),
               "hone %s --help does not document --cpu-moe", with_moe[i]);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --help", bin, with_moe[i]);
        CHECKF(run(cmd, out, sizeof out) == 0 && strstr(out, "--vram SIZE") && strstr(out, "auto"),
               "hone %s --help does not document --vram and --cpu-moe auto", with_moe[i]);
    }
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p hi --vram 1k 2>&1", bin, moe);
    CHECKF(run(cmd, out, sizeof out) == 2 && strstr(out, "bad --vram '1k'"), "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -p 4 -n 0 -r 1 --vram lots 2>&1", bin, moe);
    CHECKF(run(cmd, out, sizeof out) == 2 && strstr(out, "bad --vram 'lots'"), "%s", out);
    /* auto on host memory (and on a dense model): nothing apart, the run goes on */
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' --tokens '1 2 3' -n 2 --temp 0 --cpu-moe auto --vram 64G 2>&1",
             bin, moe);
    CHECKF(run(cmd, out, sizeof out) == 0, "--cpu-moe auto: %s", out);
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' --tokens '1 2 3' -n 2 --temp 0 --cpu-moe auto 2>&1", bin, q3);
    CHECKF(run(cmd, out, sizeof out) == 0, "--cpu-moe auto on a dense model: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p hi --cpu-moe many 2>&1", bin, moe);
    CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "bad --cpu-moe 'many'"));
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p hi --cpu-moe -2 2>&1", bin, moe);
    CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "bad --cpu-moe '-2'"));
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' -p hi --cpu-moe 3 2>&1", bin, moe);
    CHECKF(run(cmd, out, sizeof out) == 1 && strstr(out, "counted 0..2"), "%s", out);
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' -p hi --cpu-moe 1 2>&1", bin, q3);
    CHECKF(run(cmd, out, sizeof out) == 1 && strstr(out, "not a MoE model"), "%s", out);
    /* tensor parallel (--devices): two CPU ranks give the one-backend tokens (a float model: its logits agree to
     * 1e-6, test_tp.c), and bad lists are refused saying why */
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --help", bin, with_moe[i]);
        CHECKF(run(cmd, out, sizeof out) == 0 && strstr(out, "--devices LIST") && strstr(out, "cpu,cpu"),
               "hone %s --help does not document --devices", with_moe[i]);
    }
    {
        char lf[1024], one[4096], two[4096];
        test_data_path(lf, sizeof lf, "data/models/llama-2k-f32.gguf");
        snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' --tokens '1 2 3 4 5' -n 24 --temp 0 --print-ids 2>/dev/null", bin, lf);
        int r1 = run(cmd, one, sizeof one);
        snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' --tokens '1 2 3 4 5' -n 24 --temp 0 --print-ids --devices cpu,cpu 2>/dev/null", bin, lf);
        int r2 = run(cmd, two, sizeof two);
        CHECKF(r1 == 0 && r2 == 0 && strlen(one) > 24 && !strcmp(one, two), "run --devices cpu,cpu: '%s' vs one backend's '%s'", two, one);
    }
    static const struct { const char *list, *says; int rc; } bad_devices[] = {
        {"cpu,,cpu", "an empty rank", 2}, {"cuda:0,cuda:1", "not built yet", 2}, {"0,1", "not built yet", 2},
        {"cpu,gpu", "unknown rank 'gpu'", 2}, {"cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu", "at most 8", 2},
        {"cpu,cpu,cpu,cpu", "do not split into 4", 1},
    };
    for (size_t i = 0; i < sizeof bad_devices / sizeof bad_devices[0]; i++) {
        snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' run -m '%s' -p hi --devices %s 2>&1", bin, q3, bad_devices[i].list);
        int rc = run(cmd, out, sizeof out);
        CHECKF(rc == bad_devices[i].rc && strstr(out, bad_devices[i].says), "--devices %s: %d %s", bad_devices[i].list, rc, out);
    }
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p hi --devices cpu,cpu --device cuda 2>&1", bin, q3);
    CHECKF(run(cmd, out, sizeof out) == 2 && strstr(out, "contradicts"), "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' run -m /nonexistent.gguf -p hi 2>&1", bin);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "nonexistent"));
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --tokens '1 999999' 2>&1", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "999999"));
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --tokens '1 2 3' -n 4094 2>&1", bin, q3);
    CHECKF(run(cmd, out, sizeof out) == 1 && strstr(out, "exceed the model's context of 4096"), "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --tokens '' 2>&1", bin, q3);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "no tokens"));
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
