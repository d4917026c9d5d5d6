/* tok_bpe.c: the two merge algorithms.
 *
 * Byte-level BPE (`gpt2`): each word from the pre-tokenizer is mapped byte by
 * byte to GPT-2's printable code points, split into characters, and the
 * adjacent pair with the lowest merge rank is merged until no pair is in the
 * merge table (ties go to the leftmost pair). Symbols carry interned string ids,
 * so a merge is two integer lookups, never a string build.
 *
 * SentencePiece-style BPE (`llama`): characters of the (space-escaped) text are
 * merged pairwise, highest vocabulary score first (leftmost on ties), as long
 * as the concatenation is a token; what is left that is not a token falls back
 * to byte tokens <0xNN>.
 *
 * Both use one binary heap of candidate pairs, ordered by one integer key
 * (the priority, then the left position), built in linear time from a word's
 * first pairs; stale candidates (one side already merged into something else)
 * are skipped when popped. The order of the live candidates is total (one
 * per left position), so the merges do not depend on the heap's layout. */
#include <string.h>

#include "../core/alloc.h"
#include "tok_int.h"

typedef struct sym {
    int32_t off, n;   /* bytes of the word/text */
    int32_t sid;      /* interned string id (BPE) */
    int32_t prev, next;
} sym;

typedef struct cand {
    uint64_t key;     /* smallest pops first: BPE (rank, left), SPM (score descending, left) */
    int32_t left, right;
    int32_t lid, rid; /* BPE: ids the pair had when queued */
    int32_t aux;      /* BPE: the merge's result id; SPM: byte length when queued */
} cand;

typedef struct heap {
    cand *v;
    size_t n, cap;
    bool oom;
} heap;

/* An SPM score as an order key: larger for a higher score, -0 as +0, a NaN
 * (only in a broken file) below every number. */
static uint32_t score_order(float f) {
    if (f != f) return 0;
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* Appends c without ordering (heap_build orders what was appended). */
static void heap_append(heap *h, cand c) {
    if (h->oom) return;
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 256;
        cand *v = hn_realloc(h->v, nc * sizeof *v);
        if (!v) {
            h->oom = true;
            return;
        }
        h->v = v;
        h->cap = nc;
    }
    h->v[h->n++] = c;
}

/* Puts c at i or below, moving smaller children up. */
static void sift_down(heap *h, size_t i, cand c) {
    for (;;) {
        size_t l = 2 * i + 1, m = l;
        if (l >= h->n) break;
        if (l + 1 < h->n && h->v[l + 1].key < h->v[l].key) m = l + 1;
        if (h->v[m].key >= c.key) break;
        h->v[i] = h->v[m];
        i = m;
    }
    h->v[i] = c;
}

static void heap_build(heap *h) {
    for (size_t i = h->n / 2; i-- > 0;) sift_down(h, i, h->v[i]);
}

static void heap_push(heap *h, cand c) {
    heap_append(h, c);
    if (h->oom) return;
    size_t i = h->n - 1;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->v[p].key <= c.key) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
}

static cand heap_pop(heap *h) {
    cand top = h->v[0];
    cand last = h->v[--h->n];
    if (h->n) sift_down(h, 0, last);
    return top;
}

typedef struct syms {
    sym *v;
    size_t cap;
} syms;

static bool syms_reserve(syms *s, size_t n) {
    if (n <= s->cap) return true;
    size_t nc = s->cap ? s->cap : 256;
    while (nc < n) nc *= 2;
    sym *v = hn_realloc(s->v, nc * sizeof *v);
    if (!v) return false;
    s->v = v;
    s->cap = nc;
    return true;
}

/* ---- byte-level BPE ---- */

/* Queues the pair (l, r) if the merge table has it; appended only (no order)
 * while a word's first pairs are gathered for heap_build. */
static void bpe_queue(const struct tok_vocab *v, heap *h, const sym *s, int32_t l, int32_t r, bool append) {
    if (l < 0 || r < 0) return;
    const tok_merge_ent *m = tok_mergemap_find(&v->merges, s[l].sid, s[r].sid);
    if (!m) return;
    cand c = {((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)l, l, r, s[l].sid, s[r].sid, m->result};
    if (append) heap_append(h, c);
    else heap_push(h, c);
}

/* Emits the tokens of one symbol: the token with its text, or else one token
 * per byte where such a token exists (bytes with none are dropped, as llama.cpp does). */
static void bpe_emit(const struct tok_vocab *v, const char *w, const sym *s, tok_ids *out) {
    int32_t tok = s->sid >= 0 ? v->str_tok[s->sid] : -1;
    if (tok >= 0) {
        tok_ids_push(out, tok);
        return;
    }
    for (int32_t j = 0; j < s->n; j++) {
        unsigned char c = (unsigned char)w[s->off + j];
        int32_t id = v->pflags.byte_encode ? tok_lookup(v, (const char *)&c, 1) : v->byte_tok[c];
        if (id >= 0) tok_ids_push(out, id);
    }
}

static bool all_newlines(const char *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != '\n') return false;
    return true;
}

void tok_bpe_encode(const struct tok_vocab *v, const char *text, size_t len, tok_ids *out) {
    char *esc = NULL;
    if (v->pflags.escape_ws) {
        size_t ns = 0;
        for (size_t i = 0; i < len; i++) ns += text[i] == ' ';
        esc = hn_malloc(len + 2 * ns + 1);
        if (!esc) {
            out->oom = true;
            return;
        }
        size_t k = 0;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(esc + k, "\xe2\x96\x81", 3);
                k += 3;
            } else {
                esc[k++] = text[i];
            }
        }
        text = esc;
        len = k;
    }
    char *clean = NULL;
    tok_span *spans = NULL;
    int64_t n_spans = tok_pre_split(v->pre, text, len, &clean, &spans);
    hn_free(esc);
    if (n_spans < 0) {
        out->oom = true;
        return;
    }
    size_t max_word = 0;
    for (int64_t i = 0; i < n_spans; i++)
        if (spans[i].len > max_word) max_word = spans[i].len;
    char *w = hn_malloc(max_word * 2 + 1);
    syms S = {0};
    heap H = {0};
    if (!w || !syms_reserve(&S, max_word + 1)) out->oom = true;
    for (int64_t k = 0; k < n_spans && !out->oom && !H.oom; k++) {
        const char *src = clean + spans[k].off;
        size_t wn = 0;
        if (v->pflags.byte_encode) {
            for (size_t i = 0; i < spans[k].len; i++)
                wn += tok_utf8_put(tok_byte_to_cp((uint8_t)src[i]), w + wn);
        } else {
            memcpy(w, src, spans[k].len);
            wn = spans[k].len;
        }
        if (v->pflags.ignore_merges || (v->pflags.newline_words && all_newlines(w, wn))) {
            int32_t id = tok_lookup(v, w, wn);
            if (id >= 0) {
                tok_ids_push(out, id);
                continue;
            }
        }
        sym *s = S.v;
        int32_t ns = 0;
        for (size_t off = 0; off < wn; ns++) {
            size_t cl = tok_utf8_len((unsigned char)w[off]);
            if (cl > wn - off) cl = wn - off;
            s[ns].off = (int32_t)off;
            s[ns].n = (int32_t)cl;
            /* byte-level: symbol ns is the character of byte src[ns] */
            s[ns].sid = v->pflags.byte_encode ? v->byte_sid[(unsigned char)src[ns]] : tok_strmap_find(&v->strs, w + off, cl);
            s[ns].prev = ns - 1;
            off += cl;
            s[ns].next = off == wn ? -1 : ns + 1;
        }
        H.n = 0;
        for (int32_t i = 1; i < ns; i++) bpe_queue(v, &H, s, i - 1, i, true);
        heap_build(&H);
        while (H.n && !H.oom) {
            cand c = heap_pop(&H);
            sym *l = &s[c.left], *r = &s[c.right];
            if (l->n == 0 || r->n == 0 || l->sid != c.lid || r->sid != c.rid) continue;
            l->n += r->n;
            l->sid = c.aux;
            r->n = 0;
            l->next = r->next;
            if (r->next >= 0) s[r->next].prev = c.left;
            bpe_queue(v, &H, s, l->prev, c.left, false);
            bpe_queue(v, &H, s, c.left, l->next, false);
        }
        for (int32_t i = 0; i != -1 && ns > 0; i = s[i].next) bpe_emit(v, w, &s[i], out);
    }
    if (H.oom) out->oom = true;
    hn_free(H.v);
    hn_free(S.v);
    hn_free(w);
    hn_free(spans);
    hn_free(clean);
}

/* ---- SentencePiece-style BPE ---- */

static void spm_queue(const struct tok_vocab *v, heap *h, const sym *s, const char *text, int32_t l, int32_t r,
                      bool append) {
    if (l < 0 || r < 0) return;
    int32_t size = s[l].n + s[r].n;
    int32_t tok = tok_lookup(v, text + s[l].off, (size_t)size);
    if (tok < 0) return;
    cand c = {((uint64_t)(UINT32_MAX - score_order(v->score[tok])) << 32) | (uint32_t)l, l, r, 0, 0, size};
    if (append) heap_append(h, c);
    else heap_push(h, c);
}

void tok_spm_encode(const struct tok_vocab *v, const char *text, size_t len, tok_ids *out) {
    if (!len) return;
    if (len > INT32_MAX) {
        out->oom = true;
        return;
    }
    syms S = {0};
    heap H = {0};
    if (!syms_reserve(&S, len + 1)) {
        out->oom = true;
        return;
    }
    sym *s = S.v;
    int32_t ns = 0;
    for (size_t off = 0; off < len; ns++) {
        size_t cl = tok_utf8_len((unsigned char)text[off]);
        if (cl > len - off) cl = len - off;
        s[ns].off = (int32_t)off;
        s[ns].n = (int32_t)cl;
        s[ns].sid = -1;
        s[ns].prev = ns - 1;
        off += cl;
        s[ns].next = off == len ? -1 : ns + 1;
    }
    for (int32_t i = 1; i < ns; i++) spm_queue(v, &H, s, text, i - 1, i, true);
    heap_build(&H);
    while (H.n && !H.oom) {
        cand c = heap_pop(&H);
        sym *l = &s[c.left], *r = &s[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.aux) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = c.left;
        spm_queue(v, &H, s, text, l->prev, c.left, false);
        spm_queue(v, &H, s, text, c.left, l->next, false);
    }
    for (int32_t i = 0; i != -1; i = s[i].next) {
        int32_t tok = tok_lookup(v, text + s[i].off, (size_t)s[i].n);
        if (tok >= 0) {
            tok_ids_push(out, tok);
            continue;
        }
        for (int32_t j = 0; j < s[i].n; j++) {
            int32_t id = v->byte_tok[(unsigned char)text[s[i].off + j]];
            if (id < 0) id = v->unk;
            if (id >= 0) tok_ids_push(out, id);
        }
    }
    if (H.oom) out->oom = true;
    hn_free(H.v);
    hn_free(S.v);
}
