/* fuzz_api.c: a libFuzzer harness for one API's request mapping (FUZZ_API
 * names it: chat, completions, responses, messages): body bytes in, then
 * what the server does with a body: the UTF-8 and JSON-container checks,
 * jansson, creq_parse, and prm_build (the chat template and the tokenizer,
 * with control-token text in content kept as text) on the real Qwen3
 * vocabulary. Every input must end in a request and a prompt or in an API
 * error (4xx); a crash, a sanitizer report or a 5xx class for the client's
 * input is a finding. Built by `make fuzz` (clang, ASan+UBSan), run briefly
 * over tests/fuzz/corpus/api_<name> by `make fuzz-run`; tests/test_fuzz_replay.c
 * replays those corpora through the same code in the ordinary suite.
 *
 * The model: $HONE_FUZZ_MODEL, else ../shared/data/models/qwen3-real-q8_0.gguf
 * from the project root; without it only the mapping runs. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "server/creq.h"
#include "server/prompt.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#ifndef FUZZ_API
#define FUZZ_API "chat"
#endif

static api_kind g_api;
static bool g_inited;
static prm_model g_pm;
static bool g_have_pm;
static gguf_ctx *g_gguf; /* kept for the process's life (reachable: not a leak) */
static tok_vocab *g_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loads the model once (also used by tests/test_fuzz_replay.c). */
static void fuzz_init(void) {
    if (g_inited) return;
    g_inited = true;
    const char *path = getenv("HONE_FUZZ_MODEL");
    if (!path) path = "../shared/data/models/qwen3-real-q8_0.gguf";
    hn_err err = {0};
    if (gguf_open(path, &g_gguf, &err) == HN_OK && tok_load(g_gguf, &g_vocab, &err) == HN_OK &&
        prm_model_init(&g_pm, g_gguf, g_vocab, &err) == HN_OK)
        g_have_pm = true;
    else
        fprintf(stderr, "fuzz_api: no model (%s): the mapping only\n", err.msg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_api = !strcmp(FUZZ_API, "completions") ? API_COMPLETIONS
            : !strcmp(FUZZ_API, "responses") ? API_RESPONSES
            : !strcmp(FUZZ_API, "messages")  ? API_MESSAGES
                                             : API_CHAT;
    fuzz_init();
    return 0;
}

static void check_error(const api_error *e) {
    int st = api_http_status(g_api, e->kind);
    if (st < 400 || st >= 500 || !e->message[0]) {
        if (e->kind == APIE_INTERNAL && strstr(e->message, "out of memory")) return;
        fprintf(stderr, "fuzz_api: status %d for the client's input: %s\n", st, e->message);
        abort();
    }
}

/* One input through the mapping of api; aborts on a finding. */
static void fuzz_one(api_kind api, const uint8_t *data, size_t size) {
    g_api = api;
    const char *s = (const char *)data;
    if (!srv_utf8_valid(s, size)) return;
    if (srv_json_containers(s, size, 200000) > 200000) return;
    json_t *body = json_loadb(s, size, 0, NULL);
    if (!json_is_object(body)) {
        json_decref(body);
        return;
    }
    for (int count = 0; count < (g_api == API_MESSAGES ? 2 : 1); count++) {
        creq r;
        api_error e;
        if (!creq_parse(g_api, count == 1, body, &r, &e)) {
            check_error(&e);
            continue;
        }
        if (g_have_pm) {
            prm_prompt p;
            if (prm_build(&g_pm, &r, &p, &e)) {
                int32_t nv = tok_n_vocab(g_pm.vocab);
                for (int32_t i = 0; i < p.n_tokens; i++)
                    if (p.tokens[i] < 0 || p.tokens[i] >= nv) abort();
                prm_prompt_free(&p);
            } else {
                check_error(&e);
            }
        }
        creq_free(&r);
    }
    json_decref(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_one(g_api, data, size);
    return 0;
}
