/* tok_int.h: private to the tokenizer module (tokenizer.c, tok_map.c,
 * tok_pre.c, tok_bpe.c). Not for other modules: use tokenizer.h.
 *
 * Shape of a loaded vocabulary:
 *   - every token text lives in `text_pool` (NUL-terminated), addressed by
 *     text_off/text_len; `strs` interns the distinct token texts plus every
 *     string that only appears in a BPE merge, so merging works on integer ids;
 *     str_tok maps an interned id to its token (-1 for merge-only strings);
 *   - `merges` maps an (left id, right id) pair to its rank and result id;
 *   - `special` lists the control/user-defined/unknown tokens, longest first,
 *     in the order the special-token splitter tries them;
 *   - `piece` caches each token's decoded bytes (the special=true rendering). */
#ifndef HN_TOK_INT_H
#define HN_TOK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

/* token attributes (bit flags, as llama.cpp defines them) */
enum {
    TOK_ATTR_UNKNOWN = 1 << 0,
    TOK_ATTR_UNUSED = 1 << 1,
    TOK_ATTR_NORMAL = 1 << 2,
    TOK_ATTR_CONTROL = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_LSTRIP = 1 << 7,
    TOK_ATTR_RSTRIP = 1 << 8,
};

typedef enum { TOK_TYPE_BPE, TOK_TYPE_SPM } tok_type;

/* ---- string interning map: byte string -> int32 id ---- */
typedef struct tok_strmap {
    char *pool;          /* all interned strings, each followed by a NUL */
    size_t pool_len, pool_cap;
    uint64_t *off;       /* per id: offset into pool */
    uint32_t *len;       /* per id: length */
    int32_t n, cap;      /* ids in use */
    int32_t *slots;      /* open addressing: id + 1, 0 = empty */
    uint64_t *slot_hash; /* full hash per slot, to skip most compares */
    size_t n_slots;      /* power of two */
} tok_strmap;

hn_status tok_strmap_init(tok_strmap *m, int32_t expect);
void tok_strmap_free(tok_strmap *m);
/* Id of a string, or -1. */
int32_t tok_strmap_find(const tok_strmap *m, const char *s, size_t n);
/* Id of a string, adding it (with the next id) if absent; -1 on no memory.
 * If `added` is non-NULL it says whether the string was new. */
int32_t tok_strmap_intern(tok_strmap *m, const char *s, size_t n, bool *added);
static inline const char *tok_strmap_str(const tok_strmap *m, int32_t id) { return m->pool + m->off[id]; }

/* ---- merge map: (left id, right id) -> (rank, result id) ---- */
typedef struct tok_merge_ent {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} tok_merge_ent;

typedef struct tok_mergemap {
    tok_merge_ent *ents;
    size_t n_slots, n;
} tok_mergemap;

hn_status tok_mergemap_init(tok_mergemap *m, size_t expect);
void tok_mergemap_free(tok_mergemap *m);
/* Adds a pair unless present (the first rank of a repeated pair wins). */
void tok_mergemap_put(tok_mergemap *m, int32_t left, int32_t right, int32_t rank, int32_t result);
/* The entry for a pair, or NULL. */
const tok_merge_ent *tok_mergemap_find(const tok_mergemap *m, int32_t left, int32_t right);

/* ---- growable id vector used while encoding ---- */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
    bool oom;
} tok_ids;

void tok_ids_push(tok_ids *ids, int32_t id);

/* ---- pre-tokenizer (tok_pre.c) ---- */
typedef struct tok_pre tok_pre;

/* Compiles the pre-tokenizer for a `tokenizer.ggml.pre` value; NULL name means
 * "default". HN_ERR_UNSUPPORTED for unknown names. */
hn_status tok_pre_new(const char *name, tok_pre **out, hn_err *err);
void tok_pre_free(tok_pre *p);
const char *tok_pre_name(const tok_pre *p);

/* Per-pre-type flags that change the rest of the pipeline. */
typedef struct tok_pre_flags {
    bool clean_spaces;   /* detokenizer cleanup (kept for completeness) */
    bool ignore_merges;  /* a word that is a whole token skips merging */
    int add_bos;         /* -1 keep the model default, 0/1 force */
    bool byte_encode;    /* GPT-2 byte-to-unicode mapping of words */
    bool escape_ws;      /* spaces become U+2581 before splitting */
    bool no_bos_default; /* the default BOS id is cleared (chatglm) */
    bool newline_words;  /* gemma4: an all-newline word that is a token stays whole */
} tok_pre_flags;
const tok_pre_flags *tok_pre_get_flags(const tok_pre *p);

/* A word produced by the splitter: bytes [off, off+len) of the cleaned text. */
typedef struct tok_span {
    size_t off, len;
} tok_span;

/* Splits text into words. The text is first decoded like llama.cpp does
 * (every invalid UTF-8 byte becomes U+FFFD) and re-encoded into *clean (an
 * hn_malloc'd buffer the caller frees); the spans index *clean. Returns the
 * number of spans (written to *spans, hn_malloc'd), or -1 on error. */
int64_t tok_pre_split(const tok_pre *p, const char *text, size_t len, char **clean, tok_span **spans);

/* ---- UTF-8 helpers ---- */
/* Length of a UTF-8 sequence from its first byte, as llama.cpp computes it
 * (1 for continuation bytes and ASCII). */
static inline size_t tok_utf8_len(unsigned char c) {
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}
/* Writes the UTF-8 form of cp (<= 0x10FFFF) to out (4 bytes room); returns its length. */
size_t tok_utf8_put(uint32_t cp, char *out);

/* ---- the vocabulary ---- */
struct tok_vocab {
    tok_type type;
    int32_t n_vocab;
    char *text_pool;      /* token texts, NUL-terminated */
    uint64_t *text_off;
    uint32_t *text_len;
    tok_strmap strs;      /* interned strings (token texts and merge parts) */
    int32_t *str_tok;     /* interned id -> token id (the last token with that text), or -1 */
    int32_t *tok_str;     /* token id -> interned id */
    float *score;
    uint32_t *attr;
    tok_mergemap merges;
    tok_pre *pre;
    tok_pre_flags pflags;

    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos, add_space_prefix, clean_spaces;

    int32_t *special;     /* control/user-defined/unknown ids, longest first */
    int32_t n_special;
    uint8_t special_first[256]; /* 1 if some special token starts with this byte */
    uint32_t *special_lens;     /* distinct special-token lengths, ascending */
    int32_t n_special_lens;
    uint8_t *eog;         /* per token: 1 if end-of-generation */

    char *piece_pool;     /* decoded bytes of every token (special rendering) */
    uint64_t *piece_off;
    uint32_t *piece_len;

    int32_t byte_tok[256]; /* token for a raw byte (<0xNN> or GPT-2 mapped), -1 if none */
    int32_t byte_sid[256]; /* byte-level BPE: interned id of the byte's GPT-2 character, -1 if none */
};

/* Token text and length of token id (id < n_vocab). */
static inline const char *tok_vtext(const struct tok_vocab *v, int32_t id, uint32_t *len) {
    *len = v->text_len[id];
    return v->text_pool + v->text_off[id];
}
/* Token id of a string, or -1 (strings interned only from merges are not tokens). */
int32_t tok_lookup(const struct tok_vocab *v, const char *s, size_t n);

/* BPE over one fragment of raw text (tok_bpe.c); appends ids. */
void tok_bpe_encode(const struct tok_vocab *v, const char *text, size_t len, tok_ids *out);
/* SentencePiece-style merging of one already-escaped text (tok_bpe.c); appends ids. */
void tok_spm_encode(const struct tok_vocab *v, const char *text, size_t len, tok_ids *out);

/* GPT-2 byte <-> unicode mapping. */
uint32_t tok_byte_to_cp(uint8_t b);
/* The byte a code point stands for, or -1. */
int tok_cp_to_byte(uint32_t cp);

#endif
