/* test_template_cli.c: `hone template` end to end (needs HONE_BIN, the path of
 * the built binary; `make test` sets it). Renders a corpus pair and compares
 * with jinja2's output, and checks errors, exit codes and --help. */
#include <stdbool.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

int main(void) {
    const char *bin = getenv("HONE_BIN");
    CHECKF(bin && *bin, "HONE_BIN is not set");
    if (!bin || !*bin) TEST_DONE();
    static char out[1 << 16], want[1 << 16], cmd[4096];
    char dir[] = "/tmp/hone-template-cli-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char tpl[256], ctx[256], exp[1024], qwen[1024];
    snprintf(tpl, sizeof tpl, "%s/t.jinja", dir);
    snprintf(ctx, sizeof ctx, "%s/c.json", dir);

    /* a real template with a real conversation: same bytes as jinja2 */
    test_data_path(qwen, sizeof qwen, "data/templates/templates/Qwen-Qwen3-0.6B.jinja");
    test_data_path(exp, sizeof exp, "data/templates/expected/Qwen-Qwen3-0.6B__system_multi_turn.txt");
    write_file(ctx, "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a concise assistant. Answer in one sentence.\"},"
                    "{\"role\": \"user\", \"content\": \"What is the capital of France?\"},"
                    "{\"role\": \"assistant\", \"content\": \"The capital of France is Paris.\"},"
                    "{\"role\": \"user\", \"content\": \"And of Italy?\"}],"
                    "\"tools\": null, \"add_generation_prompt\": true,"
                    "\"bos_token\": \"<|endoftext|>\", \"eos_token\": \"<|im_end|>\"}");
    FILE *f = fopen(exp, "rb");
    size_t wn = f ? fread(want, 1, sizeof want - 1, f) : 0;
    if (f) fclose(f);
    want[wn] = 0;
    snprintf(cmd, sizeof cmd, "'%s' template -t '%s' -c '%s'", bin, qwen, ctx);
    int rc = run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d", rc);
    /* the conversation text must match the corpus' system_multi_turn for this to be equal */
    CHECKF(wn > 0 && !strcmp(out, want), "Qwen3 render differs:\n[%s]\nwant\n[%s]", out, want);

    /* plain variables, no context file */
    write_file(tpl, "{{ 1 + 2 }}-{{ x | default('none') }}\n");
    snprintf(cmd, sizeof cmd, "'%s' template -t '%s'", bin, tpl);
    CHECK(run(cmd, out, sizeof out) == 0 && !strcmp(out, "3-none"));

    /* raise_exception: exit 1, the template's message on stderr */
    write_file(tpl, "{{ raise_exception('Conversation roles must alternate') }}");
    snprintf(cmd, sizeof cmd, "'%s' template -t '%s' -c '%s' 2>&1 >/dev/null", bin, tpl, ctx);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "Conversation roles must alternate"));

    /* syntax error with a position */
    write_file(tpl, "ok\n{% if x %}\n");
    snprintf(cmd, sizeof cmd, "'%s' template -t '%s' 2>&1 >/dev/null", bin, tpl);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "line "));

    /* bad context, missing files, usage, help */
    write_file(ctx, "[1, 2]");
    snprintf(cmd, sizeof cmd, "'%s' template -t '%s' -c '%s' 2>/dev/null", bin, tpl, ctx);
    CHECK(run(cmd, out, sizeof out) == 1);
    snprintf(cmd, sizeof cmd, "'%s' template -t /nonexistent.jinja 2>/dev/null", bin);
    CHECK(run(cmd, out, sizeof out) == 1);
    snprintf(cmd, sizeof cmd, "'%s' template 2>/dev/null", bin);
    CHECK(run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "'%s' template --help", bin);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "usage: hone template"));

    unlink(tpl);
    unlink(ctx);
    rmdir(dir);
    TEST_DONE();
}
