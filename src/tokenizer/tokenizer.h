/* tokenizer.h: text <-> token ids, from the vocabulary in a GGUF file.
 *
 * Supports `tokenizer.ggml.model` = "gpt2" (byte-level BPE, with the
 * pre-tokenizer regexes selected by `tokenizer.ggml.pre`) and "llama"
 * (SentencePiece-style BPE with byte fallback). Special/control tokens are
 * matched in the text when parse_special is set. BOS/EOS insertion follows the
 * vocabulary's metadata (`tokenizer.ggml.add_bos_token`, ...). The output must
 * match llama.cpp's tokenizer exactly (tests/test_tokenizer.c runs its vectors).
 *
 * Detokenizing is streaming: tok_stream_push emits only complete UTF-8
 * characters and holds back a split one until the next token completes it. */
#ifndef HN_TOKENIZER_H
#define HN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../gguf/gguf.h"

typedef struct tok_vocab tok_vocab;

/* Loads the vocabulary from an open GGUF (copies what it needs: the GGUF may be
 * closed afterwards). HN_ERR_UNSUPPORTED for unknown tokenizer models/pre-tokenizers. */
hn_status tok_load(const gguf_ctx *g, tok_vocab **out, hn_err *err);
void tok_free(tok_vocab *v);

int32_t tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);   /* -1 if none */
int32_t tok_eos(const tok_vocab *v);   /* -1 if none */
bool tok_add_bos(const tok_vocab *v);  /* whether add_special prepends BOS */
bool tok_add_eos(const tok_vocab *v);
/* End of generation: EOS, EOT, <|im_end|> and the like (from metadata and token attributes). */
bool tok_is_eog(const tok_vocab *v, int32_t id);
/* The token's stored string (raw vocabulary form), or NULL if out of range. */
const char *tok_text(const tok_vocab *v, int32_t id);
/* Whether the token is one that only parse_special matches in text (control
 * or unknown; user-defined tokens always match). *len gets its text's length. */
bool tok_is_control(const tok_vocab *v, int32_t id, size_t *len);

/* Tokenizes len bytes of text. add_special adds BOS/EOS per the metadata;
 * parse_special matches special-token text. Writes at most cap ids into out and
 * returns the total count (which may exceed cap: call again with a bigger
 * buffer), or -1 on an internal error. */
int64_t tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                   bool parse_special, int32_t *out, int64_t cap);
/* tok_encode with parse_special, except that no control or unknown token is
 * matched where it overlaps one of the n_spans byte ranges [spans[2i],
 * spans[2i+1]) (sorted, disjoint): text from outside the template (a
 * message's content) that spells one stays text, tokenized as
 * parse_special = false would. */
int64_t tok_encode_spans(const tok_vocab *v, const char *text, size_t len, bool add_special, const size_t *spans,
                         size_t n_spans, int32_t *out, int64_t cap);

/* The bytes a token decodes to (byte-level BPE unmapped, SentencePiece's
 * U+2581 turned into spaces, byte tokens <0xNN> as the byte). Writes at most
 * cap bytes and returns the full length, or -1 for an invalid id. Special tokens
 * render as their text only if `special` is set. */
int32_t tok_piece(const tok_vocab *v, int32_t id, bool special, char *out, int32_t cap);

/* Streaming detokenizer state; zero-initialise. */
typedef struct tok_stream {
    char pending[8];
    int n_pending;
    bool first;  /* set internally after the first token (SentencePiece strips a leading space) */
} tok_stream;

/* Appends a token's text to out (cap bytes) and returns the number of bytes
 * written: only whole UTF-8 characters; an incomplete tail waits in the state.
 * Invalid byte sequences are emitted as U+FFFD. */
size_t tok_stream_push(const tok_vocab *v, tok_stream *s, int32_t id, char *out, size_t cap);
/* Emits whatever is still pending (as U+FFFD if incomplete). */
size_t tok_stream_flush(tok_stream *s, char *out, size_t cap);

#endif
