/* tokenizer.c: loading a vocabulary from GGUF metadata, the special-token
 * splitter, tok_encode's driver, token pieces and the streaming detokenizer.
 * The merge algorithms live in tok_bpe.c, the pre-tokenizer in tok_pre.c.
 *
 * Everything follows llama.cpp's tokenizer so that ids match exactly,
 * including its defaults (BOS/EOS ids per model type, add_bos per
 * pre-tokenizer), its detection of end-of-generation tokens by their text, and
 * its special-token splitting: special tokens are tried longest first, each
 * one cutting every still-raw fragment at all its occurrences (left to right),
 * with lstrip/rstrip eating the whitespace beside a token that carries them. */
#include "tokenizer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "tok_int.h"

/* ---- loading ---- */

static int32_t meta_id(const gguf_ctx *g, const char *key, int32_t def, int32_t n) {
    int64_t v;
    if (!gguf_get_i64(g, key, &v)) return def;
    if (v < 0 || v >= n) return def; /* llama.cpp: a bad id keeps the default */
    return (int32_t)v;
}

int32_t tok_lookup(const struct tok_vocab *v, const char *s, size_t n) {
    int32_t sid = tok_strmap_find(&v->strs, s, n);
    return sid >= 0 ? v->str_tok[sid] : -1;
}

static int32_t find_text(const tok_vocab *v, const char *s) { return tok_lookup(v, s, strlen(s)); }

static bool text_is(const tok_vocab *v, int32_t id, const char *s) {
    uint32_t n;
    const char *t = tok_vtext(v, id, &n);
    return n == strlen(s) && memcmp(t, s, n) == 0;
}

/* Texts by which llama.cpp recognises special tokens the metadata may not name. */
static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                        "<end_of_utterance>", NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                            "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>",
                                            "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                            "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                        "<turn|>", "<|tool_response>",
                                        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[",
                                        NULL};

/* If *id is unset, the lowest-id token whose text is in list becomes it and
 * is made a control token. */
static void detect_by_text(tok_vocab *v, int32_t *id, const char *const *list) {
    if (*id >= 0) return;
    for (; *list; list++) {
        int32_t t = find_text(v, *list);
        if (t >= 0 && (*id < 0 || t < *id)) *id = t;
    }
    if (*id >= 0) v->attr[*id] |= TOK_ATTR_CONTROL;
}

static uint32_t attr_of_type(int64_t t) {
    switch (t) {
    case 1: return TOK_ATTR_NORMAL;
    case 2: return TOK_ATTR_UNKNOWN;
    case 3: return TOK_ATTR_CONTROL;
    case 4: return TOK_ATTR_USER_DEFINED;
    case 5: return TOK_ATTR_UNUSED;
    case 6: return TOK_ATTR_BYTE;
    default: return 0;
    }
}

/* Sort keys for the special-token list: longer first, then lower id. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Appends the bytes a token stands for (with special tokens as their text). */
static bool piece_build(const tok_vocab *v, int32_t id, char **buf, size_t *n, size_t *cap) {
    uint32_t tl;
    const char *t = tok_vtext(v, id, &tl);
    uint32_t a = v->attr[id];
    size_t need = (size_t)tl * 4 + 64;
    if (*cap - *n < need) {
        size_t nc = *cap * 2 + need;
        char *nb = hn_realloc(*buf, nc);
        if (!nb) return false;
        *buf = nb;
        *cap = nc;
    }
    char *o = *buf + *n;
    size_t k = 0;
    bool unescape = v->type == TOK_TYPE_SPM || v->pflags.escape_ws;
    if (a & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED)) {
        memcpy(o, t, tl);
        k = tl;
    } else if (a & TOK_ATTR_NORMAL) {
        if (unescape) {
            for (uint32_t i = 0; i < tl;) {
                if (i + 3 <= tl && memcmp(t + i, "\xe2\x96\x81", 3) == 0) {
                    o[k++] = ' ';
                    i += 3;
                } else {
                    o[k++] = t[i++];
                }
            }
        } else {
            /* byte-level: each code point is one byte; anything else is shown
             * as llama.cpp shows it, [UNK_BYTE_0x<utf8 hex><token text>] */
            const unsigned char *u = (const unsigned char *)t;
            for (uint32_t i = 0; i < tl;) {
                size_t cl = tok_utf8_len(u[i]);
                uint32_t cp = 0xFFFD;
                size_t adv = 1;
                if (cl == 1 && u[i] < 0x80) cp = u[i];
                else if (cl == 2 && i + 1 < tl && (u[i + 1] & 0xC0) == 0x80) {
                    cp = ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F);
                    adv = 2;
                } else if (cl >= 3) {
                    cp = 0x10FFFF + 1; /* never a byte code point */
                    adv = cl <= tl - i ? cl : 1;
                }
                int b = cp <= 0x10FFFF ? tok_cp_to_byte(cp) : -1;
                if (b >= 0) {
                    o[k++] = (char)b;
                } else {
                    char tmp[4];
                    size_t tn = cp <= 0x10FFFF ? tok_utf8_put(cp, tmp) : adv;
                    const unsigned char *hx = cp <= 0x10FFFF ? (const unsigned char *)tmp : u + i;
                    size_t more = 12 + 2 * tn + tl + 1;
                    if (*cap - *n - k < more + 64) {
                        size_t nc = *cap * 2 + more + 64;
                        char *nb = hn_realloc(*buf, nc);
                        if (!nb) return false;
                        *buf = nb;
                        *cap = nc;
                        o = *buf + *n;
                    }
                    memcpy(o + k, "[UNK_BYTE_0x", 12);
                    k += 12;
                    for (size_t j = 0; j < tn; j++) {
                        static const char hexd[] = "0123456789abcdef";
                        o[k++] = hexd[hx[j] >> 4];
                        o[k++] = hexd[hx[j] & 15];
                    }
                    memcpy(o + k, t, tl);
                    k += tl;
                    o[k++] = ']';
                }
                i += (uint32_t)adv;
            }
        }
    } else if (a & TOK_ATTR_BYTE) {
        int hi = tl >= 5 ? hexval(t[3]) : -1, lo = tl >= 5 ? hexval(t[4]) : -1;
        o[k++] = (char)(hi >= 0 && lo >= 0 ? hi * 16 + lo : hi >= 0 ? hi : 0);
    }
    *n += k;
    return true;
}

static hn_status load_tokens(tok_vocab *v, const gguf_ctx *g, hn_err *err) {
    const gguf_value *toks = gguf_get(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_ARRAY || toks->v.arr.elem != GGUF_STRING)
        return hn_errf(err, HN_ERR_FORMAT, "tokenizer: no tokenizer.ggml.tokens string array");
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > (1u << 24))
        return hn_errf(err, HN_ERR_FORMAT, "tokenizer: %llu tokens is out of range", (unsigned long long)n);
    v->n_vocab = (int32_t)n;
    const gguf_value *scores = gguf_get(g, "tokenizer.ggml.scores");
    if (scores && (scores->type != GGUF_ARRAY || scores->v.arr.n < n || scores->v.arr.elem == GGUF_STRING ||
                   scores->v.arr.elem == GGUF_ARRAY))
        return hn_errf(err, HN_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores has fewer than %llu numbers",
                       (unsigned long long)n);
    const gguf_value *types = gguf_get(g, "tokenizer.ggml.token_type");
    if (types && (types->type != GGUF_ARRAY || types->v.arr.n < n || types->v.arr.elem == GGUF_STRING ||
                  types->v.arr.elem == GGUF_ARRAY))
        return hn_errf(err, HN_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type has fewer than %llu numbers",
                       (unsigned long long)n);

    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = 0;
        gguf_arr_str(toks, i, &len);
        if (len > (1u << 20)) return hn_errf(err, HN_ERR_FORMAT, "tokenizer: token %llu is too long", (unsigned long long)i);
        total += (len ? len : 24) + 1;
    }
    v->text_pool = hn_malloc(total);
    v->text_off = hn_malloc(n * sizeof *v->text_off);
    v->text_len = hn_malloc(n * sizeof *v->text_len);
    v->score = hn_calloc(n, sizeof *v->score);
    v->attr = hn_malloc(n * sizeof *v->attr);
    v->tok_str = hn_malloc(n * sizeof *v->tok_str);
    v->eog = hn_calloc(n, 1);
    if (!v->text_pool || !v->text_off || !v->text_len || !v->score || !v->attr || !v->tok_str || !v->eog ||
        tok_strmap_init(&v->strs, (int32_t)n * 2) != HN_OK)
        return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory for %llu tokens", (unsigned long long)n);
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = 0;
        const char *s = gguf_arr_str(toks, i, &len);
        v->text_off[i] = off;
        if (len) {
            memcpy(v->text_pool + off, s, len);
        } else { /* llama.cpp renames empty tokens */
            len = (uint64_t)snprintf(v->text_pool + off, 24, "[EMPTY_%llu]", (unsigned long long)i);
        }
        v->text_pool[off + len] = 0;
        v->text_len[i] = (uint32_t)len;
        off += len + 1;
        v->score[i] = scores ? (float)gguf_arr_float(scores, i) : 0.0f;
        v->attr[i] = types ? attr_of_type(gguf_arr_int(types, i)) : TOK_ATTR_NORMAL;
        v->tok_str[i] = tok_strmap_intern(&v->strs, v->text_pool + v->text_off[i], len, NULL);
        if (v->tok_str[i] < 0) return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    return HN_OK;
}

static hn_status load_merges(tok_vocab *v, const gguf_ctx *g, hn_err *err) {
    const gguf_value *m = gguf_get(g, "tokenizer.ggml.merges");
    if (!m) return hn_errf(err, HN_ERR_FORMAT, "tokenizer: BPE vocabulary without tokenizer.ggml.merges");
    if (m->type != GGUF_ARRAY || m->v.arr.elem != GGUF_STRING)
        return hn_errf(err, HN_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges is not a string array");
    uint64_t n = m->v.arr.n;
    if (n > (1u << 24)) return hn_errf(err, HN_ERR_FORMAT, "tokenizer: too many merges");
    if (tok_mergemap_init(&v->merges, n) != HN_OK) return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = 0;
        const char *s = gguf_arr_str(m, i, &len);
        /* "left right", split at the first space after the first byte */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) continue;
        size_t ll = (size_t)(sp - s), rl = len - ll - 1;
        if (ll + rl > cat_cap) {
            cat_cap = (ll + rl) * 2 + 64;
            char *nc = hn_realloc(cat, cat_cap);
            if (!nc) {
                hn_free(cat);
                return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
            }
            cat = nc;
        }
        memcpy(cat, s, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t a = tok_strmap_intern(&v->strs, s, ll, NULL);
        int32_t b = tok_strmap_intern(&v->strs, sp + 1, rl, NULL);
        int32_t c = tok_strmap_intern(&v->strs, cat, ll + rl, NULL);
        if (a < 0 || b < 0 || c < 0) {
            hn_free(cat);
            return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
        }
        tok_mergemap_put(&v->merges, a, b, (int32_t)i, c);
    }
    hn_free(cat);
    return HN_OK;
}

/* Names of a model that llama.cpp gives per-token strip attributes. */
static void apply_name_rules(tok_vocab *v, const gguf_ctx *g) {
    const char *name = gguf_get_str(g, "general.name");
    const char *pre = gguf_get_str(g, "tokenizer.ggml.pre");
    const char *arch = gguf_get_str(g, "general.architecture");
    char lname[256] = {0};
    if (name) {
        size_t i = 0;
        for (; name[i] && i + 1 < sizeof lname; i++) lname[i] = (char)tolower((unsigned char)name[i]);
        lname[i] = 0;
    }
    bool jina = pre && (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code"));
    bool bertmoe = arch && (strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3"));
    if (jina || bertmoe) {
        int32_t id = find_text(v, "<mask>");
        if (id >= 0) v->attr[id] |= TOK_ATTR_LSTRIP;
    } else if (strstr(lname, "phi-3") || strstr(lname, "phi3")) {
        for (int32_t i = 0; i < v->n_special; i++) v->attr[v->special[i]] |= TOK_ATTR_RSTRIP;
        int32_t id = find_text(v, "</s>");
        if (id >= 0) v->attr[id] |= TOK_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int k = 0; k < 3; k++)
            if ((id = find_text(v, keep[k])) >= 0) v->attr[id] &= ~(uint32_t)TOK_ATTR_RSTRIP;
    } else if (strstr(lname, "modern-bert")) {
        int32_t id = find_text(v, "[MASK]");
        if (id >= 0) v->attr[id] |= TOK_ATTR_LSTRIP;
    }
}

static void setup_eog(tok_vocab *v) {
    detect_by_text(v, &v->eot, eot_texts);
    detect_by_text(v, &v->eom, eom_texts);
    detect_by_text(v, &v->fim_pre, fim_pre_texts);
    detect_by_text(v, &v->fim_suf, fim_suf_texts);
    detect_by_text(v, &v->fim_mid, fim_mid_texts);
    detect_by_text(v, &v->fim_pad, fim_pad_texts);
    detect_by_text(v, &v->fim_rep, fim_rep_texts);
    detect_by_text(v, &v->fim_sep, fim_sep_texts);
    for (int32_t i = 0; i < v->n_vocab; i++) {
        uint32_t tl;
        const char *t = tok_vtext(v, i, &tl);
        if ((v->attr[i] & TOK_ATTR_CONTROL) && memmem(t, tl, "unused", 6)) v->attr[i] |= TOK_ATTR_UNUSED;
    }
    if (v->fim_pad >= 0) v->eog[v->fim_pad] = 1;
    if (v->fim_rep >= 0) v->eog[v->fim_rep] = 1;
    if (v->fim_sep >= 0) v->eog[v->fim_sep] = 1;
    /* by text: the token a text maps to (the last one, for a repeated text) */
    for (const char *const *t = eog_texts; *t; t++) {
        int32_t i = find_text(v, *t);
        if (i < 0) continue;
        v->eog[i] = 1;
        v->attr[i] |= TOK_ATTR_CONTROL;
    }
    static const char *const render[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *t = render; *t; t++) { /* gpt-oss: always rendered */
        int32_t i = find_text(v, *t);
        if (i >= 0) v->attr[i] = TOK_ATTR_USER_DEFINED;
    }
    if (v->eos >= 0) v->eog[v->eos] = 1;
    if (v->eot >= 0) v->eog[v->eot] = 1;
    if (v->eom >= 0) v->eog[v->eom] = 1;
    /* harmony / solar-open: "<|end|>" ends a message, not the generation */
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = -1, s_id = -1;
    bool has_tool_response = false;
    for (int32_t i = 0; i < v->n_vocab; i++) {
        if (!v->eog[i]) continue;
        if (text_is(v, i, "<|return|>")) has_return = true;
        else if (text_is(v, i, "<|call|>") || text_is(v, i, "<|calls|>")) has_call = true;
        else if (text_is(v, i, "<|flush|>")) has_flush = true;
        else if (text_is(v, i, "<|end|>")) end_id = i;
        if (text_is(v, i, "<|tool_response>")) has_tool_response = true;
        else if (text_is(v, i, "</s>")) s_id = i;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        v->eog[end_id] = 0;
        v->attr[end_id] = TOK_ATTR_USER_DEFINED;
    }
    /* gemma4: "</s>" is not the end when tool responses exist */
    if (has_tool_response && s_id >= 0) {
        v->eog[s_id] = 0;
        v->attr[s_id] = TOK_ATTR_NORMAL;
    }
}

hn_status tok_load(const gguf_ctx *g, tok_vocab **out, hn_err *err) {
    *out = NULL;
    const char *model = gguf_get_str(g, "tokenizer.ggml.model");
    const char *pre = gguf_get_str(g, "tokenizer.ggml.pre");
    if (!model) return hn_errf(err, HN_ERR_FORMAT, "tokenizer: no tokenizer.ggml.model");
    tok_type type;
    bool gemma4_model = false;
    if (!strcmp(model, "gpt2")) {
        type = TOK_TYPE_BPE;
    } else if (!strcmp(model, "gemma4")) {
        type = TOK_TYPE_BPE;
        gemma4_model = true;
        pre = "gemma4";
    } else if (!strcmp(model, "llama")) {
        type = TOK_TYPE_SPM;
    } else {
        return hn_errf(err, HN_ERR_UNSUPPORTED, "tokenizer: unsupported tokenizer model '%s'", model);
    }
    tok_vocab *v = hn_calloc(1, sizeof *v);
    if (!v) return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    v->type = type;
    hn_status st = HN_OK;
    if (type == TOK_TYPE_BPE) {
        st = tok_pre_new(pre, &v->pre, err);
        if (st == HN_OK) v->pflags = *tok_pre_get_flags(v->pre);
    } else {
        v->pflags.byte_encode = false;
    }
    if (st == HN_OK) st = load_tokens(v, g, err);
    if (st == HN_OK && type == TOK_TYPE_BPE) st = load_merges(v, g, err);
    if (st == HN_OK) {
        v->str_tok = hn_malloc((size_t)v->strs.n * sizeof *v->str_tok);
        if (!v->str_tok) st = hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (st != HN_OK) {
        tok_free(v);
        return st;
    }
    for (int32_t i = 0; i < v->strs.n; i++) v->str_tok[i] = -1;
    for (int32_t i = 0; i < v->n_vocab; i++) v->str_tok[v->tok_str[i]] = i; /* a repeated text: the last id wins */

    /* defaults per model type, then the metadata */
    int32_t n = v->n_vocab;
    v->bos = v->eos = v->eot = v->eom = v->unk = v->sep = v->pad = v->mask = -1;
    v->fim_pre = v->fim_suf = v->fim_mid = v->fim_pad = v->fim_rep = v->fim_sep = -1;
    if (type == TOK_TYPE_SPM) {
        v->bos = 1;
        v->eos = 2;
        v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
    } else {
        if (!gemma4_model) v->bos = v->eos = 11;
        if (v->pflags.no_bos_default) v->bos = -1;
        v->add_bos = v->pflags.add_bos == 1;
        v->clean_spaces = v->pflags.clean_spaces;
    }
    if (v->bos >= n) v->bos = -1;
    if (v->eos >= n) v->eos = -1;
    if (v->unk >= n) v->unk = -1;
    bool b;
    if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) v->add_space_prefix = b;
    v->bos = meta_id(g, "tokenizer.ggml.bos_token_id", v->bos, n);
    v->eos = meta_id(g, "tokenizer.ggml.eos_token_id", v->eos, n);
    v->eot = meta_id(g, "tokenizer.ggml.eot_token_id", v->eot, n);
    v->eom = meta_id(g, "tokenizer.ggml.eom_token_id", v->eom, n);
    v->unk = meta_id(g, "tokenizer.ggml.unknown_token_id", v->unk, n);
    v->sep = meta_id(g, "tokenizer.ggml.seperator_token_id", v->sep, n);
    v->pad = meta_id(g, "tokenizer.ggml.padding_token_id", v->pad, n);
    v->mask = meta_id(g, "tokenizer.ggml.mask_token_id", v->mask, n);
    v->fim_pre = meta_id(g, "tokenizer.ggml.fim_pre_token_id", v->fim_pre, n);
    v->fim_suf = meta_id(g, "tokenizer.ggml.fim_suf_token_id", v->fim_suf, n);
    v->fim_mid = meta_id(g, "tokenizer.ggml.fim_mid_token_id", v->fim_mid, n);
    v->fim_pad = meta_id(g, "tokenizer.ggml.fim_pad_token_id", v->fim_pad, n);
    v->fim_rep = meta_id(g, "tokenizer.ggml.fim_rep_token_id", v->fim_rep, n);
    v->fim_sep = meta_id(g, "tokenizer.ggml.fim_sep_token_id", v->fim_sep, n);
    v->fim_pre = meta_id(g, "tokenizer.ggml.prefix_token_id", v->fim_pre, n);
    v->fim_suf = meta_id(g, "tokenizer.ggml.suffix_token_id", v->fim_suf, n);
    v->fim_mid = meta_id(g, "tokenizer.ggml.middle_token_id", v->fim_mid, n);
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) v->add_bos = b;
    if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b)) v->add_eos = b;
    if (v->pflags.newline_words) v->add_bos = true; /* llama.cpp forces BOS for Gemma 4 */

    setup_eog(v);

    /* special tokens, longest first */
    v->special = hn_malloc((size_t)n * sizeof *v->special);
    if (!v->special) {
        tok_free(v);
        return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    uint64_t *keys = hn_malloc(((size_t)n + 1) * sizeof *keys);
    if (!keys) {
        tok_free(v);
        return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i < n; i++)
        if (v->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN))
            keys[v->n_special++] = ((uint64_t)(UINT32_MAX - v->text_len[i]) << 32) | (uint32_t)i;
    qsort(keys, (size_t)v->n_special, sizeof *keys, cmp_u64);
    for (int32_t i = 0; i < v->n_special; i++) v->special[i] = (int32_t)(keys[i] & 0xFFFFFFFFu);
    hn_free(keys);
    v->special_lens = hn_malloc(((size_t)v->n_special + 1) * sizeof *v->special_lens);
    if (!v->special_lens) {
        tok_free(v);
        return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = v->n_special - 1; i >= 0; i--) { /* shortest first */
        uint32_t tl;
        const unsigned char *t = (const unsigned char *)tok_vtext(v, v->special[i], &tl);
        v->special_first[t[0]] = 1;
        if (!v->n_special_lens || v->special_lens[v->n_special_lens - 1] != tl) v->special_lens[v->n_special_lens++] = tl;
    }

    /* byte fallback tokens: <0xNN>, else the byte itself */
    for (int c = 0; c < 256; c++) {
        char hx[8];
        snprintf(hx, sizeof hx, "<0x%02X>", c);
        int32_t id = find_text(v, hx);
        if (id < 0) {
            char one = (char)c;
            id = tok_lookup(v, &one, 1);
        }
        v->byte_tok[c] = id;
        char u[4];
        v->byte_sid[c] = tok_strmap_find(&v->strs, u, tok_utf8_put(tok_byte_to_cp((uint8_t)c), u));
    }

    /* decoded pieces */
    size_t cap = (size_t)v->strs.pool_len + 1024, used = 0;
    v->piece_pool = hn_malloc(cap);
    v->piece_off = hn_malloc((size_t)n * sizeof *v->piece_off);
    v->piece_len = hn_malloc((size_t)n * sizeof *v->piece_len);
    if (!v->piece_pool || !v->piece_off || !v->piece_len) {
        tok_free(v);
        return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        size_t before = used;
        if (!piece_build(v, i, &v->piece_pool, &used, &cap)) {
            tok_free(v);
            return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
        }
        v->piece_off[i] = before;
        v->piece_len[i] = (uint32_t)(used - before);
    }

    apply_name_rules(v, g);
    *out = v;
    return HN_OK;
}

void tok_free(tok_vocab *v) {
    if (!v) return;
    tok_pre_free(v->pre);
    tok_strmap_free(&v->strs);
    tok_mergemap_free(&v->merges);
    hn_free(v->text_pool);
    hn_free(v->text_off);
    hn_free(v->text_len);
    hn_free(v->str_tok);
    hn_free(v->tok_str);
    hn_free(v->score);
    hn_free(v->attr);
    hn_free(v->special);
    hn_free(v->special_lens);
    hn_free(v->eog);
    hn_free(v->piece_pool);
    hn_free(v->piece_off);
    hn_free(v->piece_len);
    hn_free(v);
}

int32_t tok_n_vocab(const tok_vocab *v) { return v->n_vocab; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
bool tok_add_bos(const tok_vocab *v) { return v->add_bos && v->bos >= 0; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos && v->eos >= 0; }
bool tok_is_eog(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n_vocab && v->eog[id]; }

const char *tok_text(const tok_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return NULL;
    return v->text_pool + v->text_off[id];
}

bool tok_is_control(const tok_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n_vocab || !(v->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) return false;
    uint32_t l;
    tok_vtext(v, id, &l);
    *len = l;
    return true;
}

/* ---- encoding ---- */

/* Byte ranges where control tokens are not matched (tok_encode_spans). */
typedef struct lit_spans {
    const size_t *v; /* pairs */
    size_t n;
} lit_spans;

/* Whether [a, b) overlaps one of the spans. */
static bool in_spans(const lit_spans *ls, size_t a, size_t b) {
    if (!ls || !ls->n) return false;
    size_t lo = 0, hi = ls->n; /* first span with end > a */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ls->v[2 * mid + 1] <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo < ls->n && ls->v[2 * lo] < b;
}

typedef struct frag {
    int32_t tok; /* -1: raw text [off, off+len) */
    size_t off, len;
} frag;

typedef struct frags {
    frag *v;
    size_t n, cap;
    bool oom;
} frags;

static void frag_push(frags *f, int32_t tok, size_t off, size_t len) {
    if (f->oom) return;
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 16;
        frag *nv = hn_realloc(f->v, nc * sizeof *nv);
        if (!nv) {
            f->oom = true;
            return;
        }
        f->v = nv;
        f->cap = nc;
    }
    f->v[f->n].tok = tok;
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->n++;
}

static bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Cuts every raw fragment at each occurrence of special token id. */
static void cut_special(const tok_vocab *v, int32_t id, const char *text, const frags *in, frags *out,
                        const lit_spans *ls) {
    uint32_t sl;
    const char *st = tok_vtext(v, id, &sl);
    uint32_t a = v->attr[id];
    if (!(a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) ls = NULL; /* user-defined tokens always match */
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        frag f = in->v[k];
        if (f.tok >= 0) {
            frag_push(out, f.tok, 0, 0);
            continue;
        }
        size_t base = f.off, end = f.off + f.len, from = base;
        for (;;) {
            const char *m = end - from >= sl ? memmem(text + from, end - from, st, sl) : NULL;
            if (!m) break;
            size_t mpos = (size_t)(m - text);
            if (in_spans(ls, mpos, mpos + sl)) { /* literal text from a message: not this token */
                from = mpos + 1;
                continue;
            }
            size_t left_len = mpos - base;
            if (a & TOK_ATTR_LSTRIP)
                while (left_len > 0 && is_c_space(text[base + left_len - 1])) left_len--;
            if (left_len) frag_push(out, -1, base, left_len);
            frag_push(out, id, 0, 0);
            base = mpos + sl;
            if (a & TOK_ATTR_RSTRIP)
                while (base < end && is_c_space(text[base])) base++;
            from = base;
        }
        if (base < end) frag_push(out, -1, base, end - base);
    }
}

/* Marks in `present` (a bitmap over interned ids) every special token text
 * that occurs somewhere in text, so the splitter skips the others. */
static void find_present(const tok_vocab *v, const char *text, size_t len, uint8_t *present) {
    for (size_t i = 0; i < len; i++) {
        if (!v->special_first[(unsigned char)text[i]]) continue;
        for (int32_t k = 0; k < v->n_special_lens && v->special_lens[k] <= len - i; k++) {
            int32_t sid = tok_strmap_find(&v->strs, text + i, v->special_lens[k]);
            if (sid >= 0) present[sid >> 3] |= (uint8_t)(1u << (sid & 7));
        }
    }
}

static int64_t encode(const tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                      const lit_spans *ls, int32_t *out, int64_t cap) {
    tok_ids ids = {0};
    frags fa = {0}, fb = {0};
    uint8_t *present = NULL;
    if (len) frag_push(&fa, -1, 0, len);
    if (len && v->n_special) {
        present = hn_calloc((size_t)v->strs.n / 8 + 1, 1);
        if (!present) goto fail;
        find_present(v, text, len, present);
        for (int32_t i = 0; i < v->n_special && !fa.oom && !fb.oom; i++) {
            int32_t id = v->special[i];
            if (!parse_special && (v->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
            int32_t sid = v->tok_str[id];
            if (!(present[sid >> 3] & (1u << (sid & 7)))) continue;
            cut_special(v, id, text, &fa, &fb, ls);
            frags t = fa;
            fa = fb;
            fb = t;
        }
        if (fa.oom || fb.oom) goto fail;
    }
    if (fa.oom) goto fail;
    if (add_special && v->add_bos && v->bos >= 0) tok_ids_push(&ids, v->bos);
    if (v->type == TOK_TYPE_SPM) {
        bool prev_special = true; /* a leading space goes before the first text and after each special token */
        char *buf = NULL;
        size_t buf_cap = 0;
        for (size_t k = 0; k < fa.n && !ids.oom; k++) {
            if (fa.v[k].tok >= 0) {
                tok_ids_push(&ids, fa.v[k].tok);
                prev_special = true;
                continue;
            }
            const char *s = text + fa.v[k].off;
            size_t sn = fa.v[k].len, need = (sn + 1) * 3;
            if (need > buf_cap) {
                char *nb = hn_realloc(buf, need);
                if (!nb) {
                    ids.oom = true;
                    break;
                }
                buf = nb;
                buf_cap = need;
            }
            size_t bn = 0;
            if (v->add_space_prefix && prev_special) {
                memcpy(buf, "\xe2\x96\x81", 3);
                bn = 3;
            }
            for (size_t i = 0; i < sn; i++) {
                if (s[i] == ' ') {
                    memcpy(buf + bn, "\xe2\x96\x81", 3);
                    bn += 3;
                } else {
                    buf[bn++] = s[i];
                }
            }
            tok_spm_encode(v, buf, bn, &ids);
            prev_special = false;
        }
        hn_free(buf);
    } else {
        for (size_t k = 0; k < fa.n && !ids.oom; k++) {
            if (fa.v[k].tok >= 0) tok_ids_push(&ids, fa.v[k].tok);
            else tok_bpe_encode(v, text + fa.v[k].off, fa.v[k].len, &ids);
        }
    }
    if (add_special && v->add_eos && v->eos >= 0) tok_ids_push(&ids, v->eos);
    if (ids.oom) goto fail;
    hn_free(present);
    hn_free(fa.v);
    hn_free(fb.v);
    if (out && cap > 0 && ids.n) memcpy(out, ids.v, (size_t)((int64_t)ids.n < cap ? (int64_t)ids.n : cap) * sizeof *out);
    hn_free(ids.v);
    return (int64_t)ids.n;
fail:
    hn_free(present);
    hn_free(fa.v);
    hn_free(fb.v);
    hn_free(ids.v);
    return -1;
}

int64_t tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                   int32_t *out, int64_t cap) {
    return encode(v, text, len, add_special, parse_special, NULL, out, cap);
}

int64_t tok_encode_spans(const tok_vocab *v, const char *text, size_t len, bool add_special, const size_t *spans,
                         size_t n_spans, int32_t *out, int64_t cap) {
    lit_spans ls = {spans, n_spans};
    return encode(v, text, len, add_special, true, &ls, out, cap);
}

/* ---- pieces and streaming ---- */

int32_t tok_piece(const tok_vocab *v, int32_t id, bool special, char *out, int32_t cap) {
    if (id < 0 || id >= v->n_vocab) return -1;
    if (!special && (v->attr[id] & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL))) return 0;
    int32_t n = (int32_t)v->piece_len[id];
    if (out && cap > 0) memcpy(out, v->piece_pool + v->piece_off[id], (size_t)(n < cap ? n : cap));
    return n;
}

/* Length of a well-formed UTF-8 sequence at s (n bytes available): >0 complete,
 * 0 a valid but unfinished prefix, <0 invalid (-k: the first k bytes are a
 * maximal invalid subpart to replace with one U+FFFD). */
static int utf8_check(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return -i;
    }
    return need;
}

/* Emits whole characters from data, keeping an unfinished tail in s. */
static size_t stream_emit(tok_stream *s, const unsigned char *data, size_t n, char *out, size_t cap) {
    size_t w = 0, i = 0;
    while (i < n) {
        int r = utf8_check(data + i, n - i);
        if (r == 0) { /* unfinished: keep it for the next token */
            s->n_pending = (int)(n - i);
            memcpy(s->pending, data + i, n - i);
            return w;
        }
        size_t take = r > 0 ? (size_t)r : (size_t)-r;
        size_t outn = r > 0 ? take : 3;
        if (w + outn > cap) break; /* out of room: drop the rest (documented) */
        if (r > 0) memcpy(out + w, data + i, take);
        else memcpy(out + w, "\xef\xbf\xbd", 3);
        w += outn;
        i += take;
    }
    s->n_pending = 0;
    return w;
}

size_t tok_stream_push(const tok_vocab *v, tok_stream *s, int32_t id, char *out, size_t cap) {
    int32_t pn = tok_piece(v, id, false, NULL, 0);
    if (pn < 0) pn = 0;
    const char *p = pn > 0 ? v->piece_pool + v->piece_off[id] : "";
    if (!s->first) {
        s->first = true;
        if (v->add_space_prefix && pn > 0 && p[0] == ' ') {
            p++;
            pn--;
        }
    }
    if (s->n_pending <= 0 || s->n_pending > 4) s->n_pending = 0;
    /* the pending bytes (at most 3) and the piece, as one run */
    unsigned char small[256];
    size_t total = (size_t)s->n_pending + (size_t)pn;
    unsigned char *buf = total <= sizeof small ? small : hn_malloc(total);
    if (!buf) return 0;
    memcpy(buf, s->pending, (size_t)s->n_pending);
    memcpy(buf + s->n_pending, p, (size_t)pn);
    size_t w = stream_emit(s, buf, total, out, cap);
    if (buf != small) hn_free(buf);
    return w;
}

size_t tok_stream_flush(tok_stream *s, char *out, size_t cap) {
    size_t w = 0;
    if (s->n_pending > 0 && cap >= 3) {
        memcpy(out, "\xef\xbf\xbd", 3);
        w = 3;
    }
    s->n_pending = 0;
    return w;
}
