/* test_grammar_model.c: constrained decoding with a real forward pass.
 *
 * The shared qwen3-real-q8_0 model has random weights and the real Qwen3
 * tokenizer: unconstrained it writes noise. Rendered a ChatML prompt and
 * decoded through the sampler with the tool-call grammar as its mask hook,
 * it must still produce a tool call that template/toolcall parses, naming an
 * offered tool, with arguments of the schema's shape. Within a token budget
 * the grammar's shortest completion closes the call (as a server would when
 * max_tokens runs out). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "kv/kv.h"
#include "model/model.h"
#include "sample/grammar.h"
#include "sample/sample.h"
#include "template/toolcall.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"}},\"required\":[\"path\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"run\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"command\":{\"type\":\"string\"},\"background\":{\"type\":\"boolean\"}},\"required\":[\"command\",\"background\"]}}}]";

typedef struct {
    int n_calls, n_bad, n_content;
    char name[64];
    char args[4096];
} calls;

static void on_ev(void *user, const tc_event *ev) {
    calls *c = user;
    if (ev->kind == TC_EV_CALL_START) {
        c->n_calls++;
        if (!ev->known_tool) c->n_bad++;
        snprintf(c->name, sizeof c->name, "%s", ev->name);
        c->args[0] = 0;
    } else if (ev->kind == TC_EV_CALL_ARGS) {
        size_t l = strlen(c->args);
        if (l + ev->len < sizeof c->args) {
            memcpy(c->args + l, ev->text, ev->len);
            c->args[l + ev->len] = 0;
        }
    } else if (ev->kind == TC_EV_CONTENT) {
        for (size_t i = 0; i < ev->len; i++)
            if (ev->text[i] != '\n' && ev->text[i] != ' ') c->n_content++;
    }
}

/* Generates one constrained answer; returns 1 when it is a valid call. */
static int generate(model *m, kv_cache *kv, const tok_vocab *tv, const gr_vocab *gv, const gr_grammar *g,
                    tc_format fmt, uint64_t seed, int budget) {
    hn_err e;
    int32_t n_vocab = model_hp(m)->n_vocab;
    const char *prompt = "<|im_start|>system\nYou can call tools.<|im_end|>\n<|im_start|>user\n"
                         "Show me the README.<|im_end|>\n<|im_start|>assistant\n";
    int32_t toks[256];
    int64_t np = tok_encode(tv, prompt, strlen(prompt), false, true, toks, 256);
    if (np <= 0 || np > 200) return 0;
    kv_seq seq;
    if (kv_seq_init(&seq, kv, 512, &e) != HN_OK) return 0;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    gr_state *s = NULL;
    smp_params sp = smp_default_params();
    sp.seed = seed;
    smp_sampler *smp = smp_new(&sp, n_vocab);
    int ok = 0;
    char *text = calloc(1, 65536);
    size_t tl = 0;
    if (!logits || !smp || gr_state_new(g, gv, &s, &e) != HN_OK) goto out;
    smp_set_mask(smp, gr_mask_fn, s);
    int32_t pos[256], sid[256];
    for (int i = 0; i < np; i++) pos[i] = i, sid[i] = 0;
    kv_seq *seqs[1] = {&seq};
    model_batch b = {.n_tokens = (int32_t)np, .token = toks, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    if (model_forward(m, kv, &b, logits, 1, &e) != HN_OK) {
        fprintf(stderr, "forward: %s\n", e.msg);
        goto out;
    }
    char want[2048];
    int64_t want_n = -1, want_at = 0;
    int32_t p = (int32_t)np;
    for (int t = 0; t < 400; t++) {
        int32_t tok;
        if (t < budget) {
            tok = smp_sample(smp, logits);
        } else { /* out of budget: follow the shortest completion */
            if (want_n < 0) {
                want_n = gr_state_completion(s, want, sizeof want);
                if (want_n < 0 || want_n > (int64_t)sizeof want) break;
            }
            if (want_at == want_n) {
                tok = tok_eos(tv); /* <|im_end|> or <|endoftext|>: an EOG token */
                for (int32_t i = 0; i < n_vocab && !gr_state_allows(s, tok); i++)
                    if (tok_is_eog(tv, i)) tok = i;
            } else {
                int32_t tk[64];
                int64_t nt = tok_encode(tv, want + want_at, (size_t)(want_n - want_at), false, true, tk, 64);
                tok = nt > 0 ? tk[0] : -1;
                if (tok >= 0 && !gr_state_allows(s, tok)) { /* fall back to the one byte */
                    nt = tok_encode(tv, want + want_at, 1, false, true, tk, 64);
                    tok = nt > 0 ? tk[0] : -1;
                }
            }
        }
        if (tok < 0 || gr_state_accept(s, tok, &e) != HN_OK) {
            fprintf(stderr, "seed %llu: token %d refused\n", (unsigned long long)seed, tok);
            goto out;
        }
        smp_accept(smp, tok);
        if (tok_is_eog(tv, tok)) {
            ok = gr_state_done(s);
            break;
        }
        int32_t n = tok_piece(tv, tok, true, text + tl, (int32_t)(65535 - tl));
        if (n > 0 && tl + (size_t)n < 65535) tl += (size_t)n;
        if (want_n >= 0) want_at += n > 0 ? n : 0;
        b = (model_batch){.n_tokens = 1, .token = &tok, .pos = &p, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
        if (model_forward(m, kv, &b, logits, 1, &e) != HN_OK) {
            fprintf(stderr, "forward: %s\n", e.msg);
            goto out;
        }
        p++;
    }
    if (ok) {
        json_error_t je;
        json_t *tools = json_loads(TOOLS, 0, &je);
        tc_parser *tp = NULL;
        tc_options o = {0, 0, 7};
        calls c = {0};
        if (tc_parser_new(fmt, tools, &o, &tp, NULL) == HN_OK) {
            tc_parser_feed(tp, text, tl, on_ev, &c);
            tc_parser_finish(tp, on_ev, &c);
        }
        tc_parser_free(tp);
        json_t *args = json_loads(c.args, 0, &je);
        ok = c.n_calls == 1 && !c.n_bad && !c.n_content && json_is_object(args);
        if (ok && !strcmp(c.name, "read_file")) ok = json_is_string(json_object_get(args, "path"));
        else if (ok) ok = !strcmp(c.name, "run") && json_is_string(json_object_get(args, "command")) &&
                         json_is_boolean(json_object_get(args, "background"));
        if (!ok || getenv("GR_DEBUG"))
            fprintf(stderr, "seed %llu (%s, %d sampled tokens): %s\n", (unsigned long long)seed, ok ? "valid" : "not a valid call",
                    budget, text);
        json_decref(args);
        json_decref(tools);
    } else {
        fprintf(stderr, "seed %llu: incomplete: %s\n", (unsigned long long)seed, text);
    }
out:
    free(text);
    smp_free(smp);
    gr_state_free(s);
    free(logits);
    kv_seq_free(&seq, kv);
    return ok;
}

int main(void) {
    char path[512];
    hn_err e;
    model *m = NULL;
    model_params mp = {.n_threads = 2, .max_batch = 256};
    if (model_load(test_data_path(path, sizeof path, "data/models/qwen3-real-q8_0.gguf"), &mp, &m, &e) != HN_OK) {
        CHECKF(0, "load: %s", e.msg);
        TEST_DONE();
    }
    tok_vocab *tv = NULL;
    CHECKF(tok_load(model_gguf(m), &tv, &e) == HN_OK, "%s", e.msg);
    kv_config kc = model_kv_config(m, 64, 16);
    kv_cache *kv = NULL;
    CHECKF(kv_create(&kc, &kv, &e) == HN_OK, "%s", e.msg);
    gr_vocab *gv = NULL;
    if (tv) CHECK(gr_vocab_from_tok(tv, &gv, &e) == HN_OK);
    json_error_t je;
    json_t *tools = json_loads(TOOLS, 0, &je);
    const char *san = getenv("HONE_SANITIZED");
    int seeds = san && *san == '1' ? 1 : 3;
    tc_format fmts[] = {TC_FORMAT_HERMES, TC_FORMAT_QWEN_XML};
    for (int f = 0; f < 2 && gv && kv; f++) {
        gr_tool_opts o = {fmts[f], NULL, false, GR_THINK_NONE};
        gr_grammar *g = NULL;
        CHECK(gr_from_tools(tools, &o, &g, &e) == HN_OK);
        for (int sd = 0; sd < seeds && g; sd++)
            CHECKF(generate(m, kv, tv, gv, g, fmts[f], (uint64_t)(sd + 1), 120), "format %d seed %d", f, sd);
        gr_grammar_free(g);
    }
    json_decref(tools);
    gr_vocab_free(gv);
    kv_free(kv);
    tok_free(tv);
    model_free(m);
    TEST_DONE();
}
