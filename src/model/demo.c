/* demo.c: writes the demo model (see demo.h).
 *
 * Tokenizer: the 256 byte symbols in GPT-2's byte-to-unicode order, then one
 * token per merge learned by plain BPE pair counting over `corpus` below
 * (pre-tokenized roughly the way Qwen2's regex splits ASCII text, so merges
 * never cross word boundaries), then the special tokens. Weights: Irwin-Hall
 * normals from a splitmix64 stream scaled by 0.02 (norm weights 1.0), which
 * keeps activations in a sane range and needs no libm, so the bytes are the
 * same everywhere. */
#include "demo.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../core/alloc.h"
#include "../gguf/gguf.h"

/* Original text written for hone: short everyday English so that common words
 * ("the", "and", "was", "time") become single tokens. */
static const char corpus[] =
    "Once upon a time, in a small town by the sea, there lived a girl who loved to read. "
    "Every morning she walked to the old library at the end of the street, and every evening "
    "she walked back home with a new book under her arm. The library was quiet and warm, and "
    "the light came in through the tall windows in the afternoon.\n\n"
    "One day she found a book that had no name on the cover. She opened it and saw that the pages "
    "were empty, except for the first one, which said: \"Write what you want to happen, and it will.\" "
    "She did not believe it, of course. But she took the book home, and that night she wrote one "
    "small thing: \"Tomorrow it will rain in the morning and the sun will come out in the afternoon.\"\n\n"
    "The next day it rained in the morning, and in the afternoon the sun came out. She thought it "
    "was only a good guess. So she wrote another line, and then another, and each time the thing she "
    "wrote came true. She wrote that her friend would call, and her friend called. She wrote that the "
    "cat would come back, and the cat came back.\n\n"
    "After a while she began to think about what she should write. It is easy to want things, she "
    "said to herself, but it is hard to know which things are good to want. She thought about the "
    "people in the town, about the fishermen and the teachers and the children who played by the "
    "water. She thought about the old man who lived alone at the top of the hill.\n\n"
    "In the end she wrote only one more line, and then she put the book back on the shelf in the "
    "library where she had found it, so that someone else could find it one day. What she wrote "
    "is still a secret, but people in the town say that since that time the old man on the hill "
    "has never been alone.\n\n"
    "The model is a small language model. It reads the text you give it, one token at a time, "
    "and it tries to guess the next token. A token is a piece of a word, a whole word, or a "
    "number. The model has not been trained, so what it writes is not what you would expect, but "
    "the program that runs it is the same program that runs real models. You can ask it a question, "
    "you can give it a list of tools, and you can see how fast it runs on this computer.\n\n"
    "Here is a simple plan for the day: first we will read the message, then we will write a short "
    "answer, and at the end we will check that the answer is correct. If the answer is not correct, "
    "we will find the problem and fix it. It is better to check the work than to hope that it is "
    "right. There are 24 hours in a day, 7 days in a week, and 365 days in a year.\n\n"
    "def main():\n    print(\"hello, world\")\n    return 0\n\n"
    "The user asked the assistant for help, and the assistant answered the question with a short "
    "and clear answer. When the assistant needs more information, it can call a tool and read the "
    "result before it answers. The assistant should think about the problem, and then it should "
    "give the answer in a way that the user can understand.\n";

/* ---- byte-level symbols (GPT-2's byte-to-unicode mapping) ---- */

static bool byte_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

/* order[i] = the byte of token i (printable bytes first, then the rest);
 * cp[b] = the code point that stands for byte b in token text. */
static void byte_tables(uint8_t order[256], uint32_t cp[256]) {
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++)
        if (byte_printable(b)) {
            order[n++] = (uint8_t)b;
            cp[b] = (uint32_t)b;
        }
    for (int b = 0; b < 256; b++)
        if (!byte_printable(b)) {
            order[n++] = (uint8_t)b;
            cp[b] = 256u + (uint32_t)extra++;
        }
}

static size_t utf8_put(char *dst, uint32_t c) {
    if (c < 0x80) {
        dst[0] = (char)c;
        return 1;
    }
    dst[0] = (char)(0xC0 | (c >> 6)); /* every code point here is < 0x800 */
    dst[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

/* ---- BPE training ---- */

#define MAX_VOCAB (256 + DEMO_MAX_MERGES)
#define MAX_WORDS 1024
#define MAX_WORD_LEN 64

typedef struct {
    int n;
    int count;
    uint16_t sym[MAX_WORD_LEN];
} word;

typedef struct {
    char *text[MAX_VOCAB]; /* token text (byte-unicode, UTF-8) */
    int n_tokens;
    char *merges[DEMO_MAX_MERGES];
    int n_merges;
    word *words;
    int n_words;
    uint8_t byte_rank[256]; /* byte -> its token id */
} bpe;

static bool is_letter(int c) { return isalpha(c); }

/* Length of the next pre-token at s (ASCII approximation of Qwen2's split). */
static size_t pretoken_len(const char *s) {
    size_t i = 0;
    int c = (unsigned char)s[0];
    if (c == '\'') {
        static const char *const contr[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
        for (size_t k = 0; k < sizeof contr / sizeof contr[0]; k++) {
            size_t l = strlen(contr[k]);
            if (!strncmp(s, contr[k], l)) return l;
        }
    }
    if (is_letter(c) || (c != '\r' && c != '\n' && !isdigit(c) && is_letter((unsigned char)s[1]))) {
        i = 1;
        while (is_letter((unsigned char)s[i])) i++;
        return i;
    }
    if (isdigit(c)) return 1;
    if (!isspace(c) || (c == ' ' && s[1] && !isspace((unsigned char)s[1]))) {
        /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
        i = c == ' ' ? 1 : 0;
        while (s[i] && !isspace((unsigned char)s[i]) && !isalnum((unsigned char)s[i])) i++;
        while (s[i] == '\r' || s[i] == '\n') i++;
        return i ? i : 1;
    }
    /* whitespace: up to the last newline of the run, else all but a space
     * that starts the next word */
    size_t end = 0, last_nl = 0;
    while (s[end] && isspace((unsigned char)s[end])) {
        if (s[end] == '\n' || s[end] == '\r') last_nl = end + 1;
        end++;
    }
    if (last_nl) return last_nl;
    if (end > 1 && s[end]) return end - 1;
    return end;
}

static hn_status bpe_add_token(bpe *b, const char *text, size_t len) {
    char *t = hn_malloc(len + 1);
    if (!t) return HN_ERR_NOMEM;
    memcpy(t, text, len);
    t[len] = '\0';
    b->text[b->n_tokens++] = t;
    return HN_OK;
}

static int bpe_find(const bpe *b, const char *text) {
    for (int i = 0; i < b->n_tokens; i++)
        if (!strcmp(b->text[i], text)) return i;
    return -1;
}

static hn_status bpe_train(bpe *b) {
    uint8_t order[256];
    uint32_t cp[256];
    byte_tables(order, cp);
    for (int i = 0; i < 256; i++) {
        char buf[4];
        size_t n = utf8_put(buf, cp[order[i]]);
        if (bpe_add_token(b, buf, n)) return HN_ERR_NOMEM;
        b->byte_rank[order[i]] = (uint8_t)i;
    }
    /* unique pre-tokens with counts */
    b->words = hn_calloc(MAX_WORDS, sizeof *b->words);
    if (!b->words) return HN_ERR_NOMEM;
    for (const char *s = corpus; *s;) {
        size_t len = pretoken_len(s);
        if (len >= 2 && len <= MAX_WORD_LEN) {
            int w = 0;
            for (; w < b->n_words; w++) {
                const word *x = &b->words[w];
                if (x->n != (int)len) continue;
                size_t k = 0;
                while (k < len && x->sym[k] == b->byte_rank[(uint8_t)s[k]]) k++;
                if (k == len) break;
            }
            if (w == b->n_words && w < MAX_WORDS) {
                b->words[w].n = (int)len;
                for (size_t k = 0; k < len; k++) b->words[w].sym[k] = b->byte_rank[(uint8_t)s[k]];
                b->n_words++;
            }
            if (w < MAX_WORDS) b->words[w].count++;
        }
        s += len;
    }
    int *pairs = hn_calloc((size_t)MAX_VOCAB * MAX_VOCAB, sizeof *pairs);
    if (!pairs) return HN_ERR_NOMEM;
    hn_status st = HN_OK;
    while (b->n_merges < DEMO_MAX_MERGES) {
        /* count, pick the most frequent pair (ties: lowest ids), reset */
        for (int w = 0; w < b->n_words; w++)
            for (int k = 0; k + 1 < b->words[w].n; k++)
                pairs[b->words[w].sym[k] * MAX_VOCAB + b->words[w].sym[k + 1]] += b->words[w].count;
        int best = -1, best_n = 1;
        for (int w = 0; w < b->n_words; w++)
            for (int k = 0; k + 1 < b->words[w].n; k++) {
                int p = b->words[w].sym[k] * MAX_VOCAB + b->words[w].sym[k + 1];
                if (pairs[p] > best_n || (pairs[p] == best_n && best >= 0 && p < best)) {
                    best = p;
                    best_n = pairs[p];
                }
            }
        for (int w = 0; w < b->n_words; w++)
            for (int k = 0; k + 1 < b->words[w].n; k++)
                pairs[b->words[w].sym[k] * MAX_VOCAB + b->words[w].sym[k + 1]] = 0;
        if (best < 0) break; /* no pair occurs twice */
        int l = best / MAX_VOCAB, r = best % MAX_VOCAB;
        size_t ll = strlen(b->text[l]), rl = strlen(b->text[r]);
        char *m = hn_malloc(ll + rl + 2);
        if (!m) {
            st = HN_ERR_NOMEM;
            break;
        }
        memcpy(m, b->text[l], ll);
        m[ll] = ' ';
        memcpy(m + ll + 1, b->text[r], rl + 1);
        b->merges[b->n_merges++] = m;
        /* the merged text may already be a token reached by another path */
        char joined[2 * MAX_WORD_LEN * 2 + 1];
        snprintf(joined, sizeof joined, "%s%s", b->text[l], b->text[r]);
        int id = bpe_find(b, joined);
        if (id < 0) {
            if ((st = bpe_add_token(b, joined, strlen(joined)))) break;
            id = b->n_tokens - 1;
        }
        for (int w = 0; w < b->n_words; w++) {
            word *x = &b->words[w];
            int o = 0;
            for (int k = 0; k < x->n; k++) {
                if (k + 1 < x->n && x->sym[k] == l && x->sym[k + 1] == r) {
                    x->sym[o++] = (uint16_t)id;
                    k++;
                } else {
                    x->sym[o++] = x->sym[k];
                }
            }
            x->n = o;
        }
    }
    hn_free(pairs);
    return st;
}

static void bpe_free(bpe *b) {
    for (int i = 0; i < b->n_tokens; i++) hn_free(b->text[i]);
    for (int i = 0; i < b->n_merges; i++) hn_free(b->merges[i]);
    hn_free(b->words);
}

/* ---- chat template (ChatML with tools and optional reasoning) ---- */

static const char chat_template[] =
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}\n"
    "{{- '# Tools\\n\\nYou can call the functions described below, each given as a JSON schema:\\n<tools>' }}\n"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\n"
    "{{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object inside <tool_call></tool_call> tags:\\n"
    "<tool_call>\\n{\"name\": <function-name>, \"arguments\": <arguments-object>}\\n</tool_call><|im_end|>\\n' }}\n"
    "{%- elif messages[0].role == 'system' %}\n"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'system' and loop.first %}\n"
    "{%- elif message.role == 'user' or message.role == 'system' %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'assistant' %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if message.content %}{{- message.content }}{%- endif %}\n"
    "{%- if message.tool_calls %}\n"
    "{%- for call in message.tool_calls %}\n"
    "{%- set fn = call.function if call.function else call %}\n"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}\n"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}\n"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}\n"
    "{{- '}\\n</tool_call>' }}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'tool' %}\n"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n"
    "{%- endif %}\n";

/* ---- weights ---- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately standard normal: the sum of 12 uniforms minus 6 (exact float
 * arithmetic, so identical on every machine). */
static float rng_normal(uint64_t *s) {
    float sum = 0.0f;
    for (int i = 0; i < 12; i++) sum += (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f);
    return sum - 6.0f;
}

typedef struct {
    char name[48];
    int n_dims;
    int64_t ne[2];
    float *data;
} demo_tensor;

static hn_status add_weight(gguf_writer *w, demo_tensor *t, int *n_t, uint64_t *seed, const char *name, int64_t ne0,
                            int64_t ne1, bool norm) {
    demo_tensor *d = &t[(*n_t)++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->n_dims = ne1 ? 2 : 1;
    d->ne[0] = ne0;
    d->ne[1] = ne1 ? ne1 : 1;
    size_t n = (size_t)(ne0 * d->ne[1]);
    d->data = hn_malloc(n * sizeof(float));
    if (!d->data) return HN_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) d->data[i] = norm ? 1.0f : 0.02f * rng_normal(seed);
    return gguf_writer_add_tensor(w, d->name, QT_F32, d->n_dims, d->ne, d->data, n * sizeof(float));
}

/* ---- the file ---- */

#define N_SPECIAL 7

hn_status demo_model_write(const char *path, hn_err *err) {
    static const char *const specials[N_SPECIAL] = {
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    };
    static const int32_t special_type[N_SPECIAL] = {3, 3, 3, 4, 4, 4, 4}; /* control / user-defined */
    enum { N_TENSORS = 2 + DEMO_N_LAYER * 11 };

    bpe *b = hn_calloc(1, sizeof *b);
    gguf_writer *w = gguf_writer_new();
    demo_tensor *t = hn_calloc(N_TENSORS, sizeof *t);
    int32_t *types = NULL;
    const char **toks = NULL;
    int n_t = 0;
    hn_status s = (!b || !w || !t) ? HN_ERR_NOMEM : HN_OK;
    if (!s) s = bpe_train(b);
    int n_vocab = b ? b->n_tokens + N_SPECIAL : 0;
    if (!s) {
        types = hn_malloc((size_t)n_vocab * sizeof *types);
        toks = hn_malloc((size_t)n_vocab * sizeof *toks);
        if (!types || !toks) s = HN_ERR_NOMEM;
    }
    if (!s) {
        for (int i = 0; i < b->n_tokens; i++) {
            toks[i] = b->text[i];
            types[i] = 1; /* normal */
        }
        for (int i = 0; i < N_SPECIAL; i++) {
            toks[b->n_tokens + i] = specials[i];
            types[b->n_tokens + i] = special_type[i];
        }
    }
    uint32_t id_eot = b ? (uint32_t)b->n_tokens : 0, id_im_end = id_eot + 2;
    const char *arch = "qwen3";
    if (!s) s = gguf_writer_set_str(w, "general.architecture", arch);
    if (!s) s = gguf_writer_set_str(w, "general.type", "model");
    if (!s) s = gguf_writer_set_str(w, "general.name", "hone-demo");
    if (!s) s = gguf_writer_set_str(w, "general.description",
                                    "hone's built-in demo model: seeded random weights, real byte-level BPE tokenizer");
    if (!s) s = gguf_writer_set_u32(w, "general.file_type", 0); /* all F32 */
    if (!s) s = gguf_writer_set_u32(w, "qwen3.block_count", DEMO_N_LAYER);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.context_length", DEMO_N_CTX);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.embedding_length", DEMO_N_EMBD);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.feed_forward_length", DEMO_N_FF);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.attention.head_count", DEMO_N_HEAD);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.attention.head_count_kv", DEMO_N_HEAD_KV);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.attention.key_length", DEMO_HEAD_DIM);
    if (!s) s = gguf_writer_set_u32(w, "qwen3.attention.value_length", DEMO_HEAD_DIM);
    if (!s) s = gguf_writer_set_f32(w, "qwen3.rope.freq_base", 1000000.0f);
    if (!s) s = gguf_writer_set_f32(w, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
    if (!s) s = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!s) s = gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    if (!s) s = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n_vocab);
    if (!s) s = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, (uint64_t)n_vocab);
    if (!s) s = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)b->merges, (uint64_t)b->n_merges);
    if (!s) s = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", id_im_end);
    if (!s) s = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", id_eot);
    if (!s) s = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", id_eot);
    if (!s) s = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (!s) s = gguf_writer_set_str(w, "tokenizer.chat_template", chat_template);

    /* tensors in llama.cpp's converter order; ne[0] is the input width */
    uint64_t seed = 0x686f6e6564656d6full; /* "honedemo" */
    const int64_t E = DEMO_N_EMBD, Q = DEMO_N_HEAD * DEMO_HEAD_DIM, KV = DEMO_N_HEAD_KV * DEMO_HEAD_DIM;
    if (!s) s = add_weight(w, t, &n_t, &seed, "token_embd.weight", E, n_vocab, false);
    for (int l = 0; l < DEMO_N_LAYER && !s; l++) {
        static const struct { const char *name; int in, out; bool norm; } spec[] = {
            {"attn_norm", 'E', 0, true},   {"attn_q", 'E', 'Q', false},  {"attn_k", 'E', 'K', false},
            {"attn_v", 'E', 'K', false},   {"attn_output", 'Q', 'E', false}, {"attn_q_norm", 'H', 0, true},
            {"attn_k_norm", 'H', 0, true}, {"ffn_norm", 'E', 0, true},   {"ffn_gate", 'E', 'F', false},
            {"ffn_up", 'E', 'F', false},   {"ffn_down", 'F', 'E', false},
        };
        for (size_t k = 0; k < sizeof spec / sizeof spec[0] && !s; k++) {
            int64_t dim[2];
            int codes[2] = {spec[k].in, spec[k].out};
            for (int j = 0; j < 2; j++) {
                switch (codes[j]) {
                case 'E': dim[j] = E; break;
                case 'Q': dim[j] = Q; break;
                case 'K': dim[j] = KV; break;
                case 'H': dim[j] = DEMO_HEAD_DIM; break;
                case 'F': dim[j] = DEMO_N_FF; break;
                default: dim[j] = 0; break;
                }
            }
            char name[48];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, spec[k].name);
            s = add_weight(w, t, &n_t, &seed, name, dim[0], dim[1], spec[k].norm);
        }
    }
    if (!s) s = add_weight(w, t, &n_t, &seed, "output_norm.weight", E, 0, true);

    if (s == HN_OK) s = gguf_writer_write(w, path, err);
    else hn_errf(err, s, "building the demo model: %s", hn_status_str(s));
    for (int i = 0; i < n_t; i++) hn_free(t[i].data);
    hn_free(t);
    hn_free(types);
    hn_free(toks);
    gguf_writer_free(w);
    if (b) bpe_free(b);
    hn_free(b);
    return s;
}
