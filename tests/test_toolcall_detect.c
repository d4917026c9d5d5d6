/* test_toolcall_detect.c: tc_detect() on the real chat templates of the shared
 * corpus (data/templates/templates), with and without a vocabulary lookup, and
 * tc_prompt_opens_think() on the corpus's rendered prompts. */
#include <dirent.h>

#include "template/toolcall.h"
#include "test.h"

static char *slurp(const char *rel) {
    char path[512];
    test_data_path(path, sizeof path, rel);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static int has_think_tokens(void *user, const char *text) {
    (void)user;
    return !strcmp(text, "<think>") || !strcmp(text, "</think>");
}

static int has_llama_tokens(void *user, const char *text) {
    (void)user;
    return !strcmp(text, "<|start_header_id|>") || !strcmp(text, "<|python_tag|>");
}

typedef struct {
    const char *tmpl;
    tc_format fmt;
    unsigned flags;
} want;

#define R TC_FLAG_REASONING
#define P TC_FLAG_THINK_IN_PROMPT

static const want WANT[] = {
    {"Qwen-Qwen3-0.6B", TC_FORMAT_HERMES, R},
    {"Qwen-Qwen2.5-7B-Instruct", TC_FORMAT_HERMES, 0},
    {"Qwen-QwQ-32B", TC_FORMAT_HERMES, R | P},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", TC_FORMAT_HERMES, 0},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", TC_FORMAT_HERMES, 0},
    {"ibm-granite-granite-4.0", TC_FORMAT_HERMES, 0},
    {"Reka-Edge", TC_FORMAT_HERMES, R | P},
    {"Qwen3-Coder", TC_FORMAT_QWEN_XML, 0},
    {"Qwen3.5-4B", TC_FORMAT_QWEN_XML, R | P},
    {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", TC_FORMAT_QWEN_XML, R | P},
    {"StepFun3.5-Flash", TC_FORMAT_QWEN_XML, R | P},
    {"meta-llama-Llama-3.1-8B-Instruct", TC_FORMAT_LLAMA3, 0},
    {"meta-llama-Llama-3.2-3B-Instruct", TC_FORMAT_LLAMA3, 0},
    {"meta-llama-Llama-3.3-70B-Instruct", TC_FORMAT_LLAMA3, 0},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", TC_FORMAT_NONE, R | P},
    {"google-gemma-2-2b-it", TC_FORMAT_NONE, 0},
    {"mistralai-Mistral-Nemo-Instruct-2407", TC_FORMAT_NONE, 0},
    {"GLM-4.6", TC_FORMAT_NONE, R},                     /* <arg_key> format: not parsed (yet) */
    {"ByteDance-Seed-OSS", TC_FORMAT_NONE, 0},          /* <seed:tool_call>: not parsed */
    {"unsloth-Apriel-1.5", TC_FORMAT_NONE, 0},          /* <tool_calls>[...]: not parsed */
    {"fireworks-ai-llama-3-firefunction-v2", TC_FORMAT_NONE, 0},
    {"HuggingFaceTB-SmolLM3-3B", TC_FORMAT_NONE, R},
};

static void test_templates(void) {
    for (size_t i = 0; i < sizeof WANT / sizeof WANT[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "data/templates/templates/%s.jinja", WANT[i].tmpl);
        char *src = slurp(rel);
        CHECKF(src != NULL, "read %s", rel);
        if (!src) continue;
        tc_detection d = tc_detect(src, NULL, NULL);
        CHECKF(d.format == WANT[i].fmt && d.flags == WANT[i].flags, "%s: got %s flags %u, want %s flags %u",
               WANT[i].tmpl, tc_format_name(d.format), d.flags, tc_format_name(WANT[i].fmt), WANT[i].flags);
        free(src);
    }
}

/* Every template in the corpus: detection never crashes and is deterministic;
 * every template that writes "<function=...><parameter=" inside <tool_call> is XML. */
static void test_all_templates(void) {
    char dir[512];
    test_data_path(dir, sizeof dir, "data/templates/templates");
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "open %s", dir);
    if (!d) return;
    int n = 0, hermes = 0, xml = 0, llama = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        char rel[512];
        snprintf(rel, sizeof rel, "data/templates/templates/%s", e->d_name);
        char *src = slurp(rel);
        if (!src) continue;
        tc_detection a = tc_detect(src, NULL, NULL), b = tc_detect(src, has_think_tokens, NULL);
        CHECKF(a.format == b.format && (b.flags & R), "%s: vocabulary adds reasoning only", e->d_name);
        n++;
        hermes += a.format == TC_FORMAT_HERMES;
        xml += a.format == TC_FORMAT_QWEN_XML;
        llama += a.format == TC_FORMAT_LLAMA3;
        free(src);
    }
    closedir(d);
    CHECKF(n == 68, "68 templates (got %d)", n);
    CHECKF(hermes >= 9 && xml >= 4 && llama >= 3, "hermes %d xml %d llama3 %d", hermes, xml, llama);
}

static void test_vocab(void) {
    tc_detection d = tc_detect("", has_think_tokens, NULL);
    CHECK(d.format == TC_FORMAT_NONE && d.flags == TC_FLAG_REASONING);
    d = tc_detect(NULL, NULL, NULL);
    CHECK(d.format == TC_FORMAT_NONE && d.flags == 0);
    /* a Llama 3 chat format known only from the vocabulary */
    d = tc_detect("{{ 'Respond in the format {\"name\": function name, \"parameters\": dict}' }}", has_llama_tokens,
                  NULL);
    CHECK(d.format == TC_FORMAT_LLAMA3);
    d = tc_detect("{{ 'Respond in the format {\"name\": function name, \"parameters\": dict}' }}", NULL, NULL);
    CHECK(d.format == TC_FORMAT_NONE);
}

static void test_prompt_opens_think(void) {
    static const struct {
        const char *file;
        int open;
    } P_[] = {
        {"data/templates/expected/Qwen3.5-4B__basic_user.txt", 1},
        {"data/templates/expected/Qwen3.5-4B__thinking_disabled.txt", 0},
        {"data/templates/expected/Qwen-Qwen3-0.6B__basic_user.txt", 0},
        {"data/templates/expected/Qwen-Qwen3-0.6B__thinking_disabled.txt", 0},
        {"data/templates/expected/Qwen-QwQ-32B__thinking_enabled.txt", 1},
        {"data/templates/expected/Qwen-QwQ-32B__basic_user.txt", 0},
        {"data/templates/expected/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16__tools_parallel_calls.txt", 1},
    };
    for (size_t i = 0; i < sizeof P_ / sizeof P_[0]; i++) {
        char *s = slurp(P_[i].file);
        CHECKF(s != NULL, "read %s", P_[i].file);
        if (!s) continue;
        CHECKF(tc_prompt_opens_think(s, strlen(s)) == P_[i].open, "%s", P_[i].file);
        free(s);
    }
    CHECK(tc_prompt_opens_think("", 0) == 0);
    CHECK(tc_prompt_opens_think("<think>\n\n", 9) == 1);
}

int main(void) {
    test_templates();
    test_all_templates();
    test_vocab();
    test_prompt_opens_think();
    CHECK(!strcmp(tc_format_name(TC_FORMAT_QWEN_XML), "qwen_xml"));
    TEST_DONE();
}
