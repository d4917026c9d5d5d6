/* lexer.c: template source to tokens, as jinja2's lexer does it with
 * trim_blocks=True and lstrip_blocks=True: newlines normalised to "\n", one
 * trailing newline dropped, `-` markers strip whitespace on their side, a
 * newline after a block or comment tag is removed, and spaces/tabs before a
 * block or comment tag at the start of a line are removed. Comments vanish. */
#include <stdio.h>
#include <string.h>

#include "tpl_int.h"

typedef struct lexer {
    tpl_arena *ar;
    const char *s;
    size_t n, pos;
    int line;
    size_t line_start;
    tpl_token *toks;
    int ntoks, cap;
    hn_err *err;
    int status;
} lexer;

static void adv(lexer *L, size_t to) {
    for (size_t i = L->pos; i < to && i < L->n; i++)
        if (L->s[i] == '\n') {
            L->line++;
            L->line_start = i + 1;
        }
    L->pos = to;
}

static int lfail(lexer *L, const char *msg) {
    if (!L->status)
        hn_errf(L->err, HN_ERR_FORMAT, "line %d, column %d: %s", L->line,
                (int)(L->pos - L->line_start) + 1, msg);
    L->status = -1;
    return -1;
}

static tpl_token *push(lexer *L, int kind) {
    if (L->ntoks == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        tpl_token *nt = tpl_arena_alloc(L->ar, sizeof(tpl_token) * (size_t)cap);
        if (!nt) {
            if (!L->status) hn_errf(L->err, HN_ERR_NOMEM, "out of memory");
            L->status = -1;
            return NULL;
        }
        if (L->ntoks) memcpy(nt, L->toks, sizeof(tpl_token) * (size_t)L->ntoks);
        L->toks = nt;
        L->cap = cap;
    }
    tpl_token *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    t->line = L->line;
    t->col = (int)(L->pos - L->line_start) + 1;
    return t;
}

/* Length in bytes of a Unicode whitespace char at s[i], or 0. */
static size_t space_at(const char *s, size_t n, size_t i) {
    size_t j = i;
    uint32_t cp = tpl_utf8_next(s, n, &j);
    return tpl_py_isspace(cp) ? j - i : 0;
}

/* Strips trailing Unicode whitespace from s[0..n); returns the new length. */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80 && n - k < 4) k--;
        size_t w = space_at(s, n, k);
        if (w == 0 || k + w != n) break;
        n = k;
    }
    return n;
}

static size_t skip_space(const char *s, size_t n, size_t i) {
    size_t w;
    while (i < n && (w = space_at(s, n, i)) > 0) i += w;
    return i;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Lexes a string literal starting at the quote; Python unicode-escape decoding. */
static int lex_string(lexer *L) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    while (i < L->n && L->s[i] != q) {
        if (L->s[i] == '\\' && i + 1 < L->n) i++;
        i++;
    }
    if (i >= L->n) return lfail(L, "unexpected end of string");
    tpl_token *t = push(L, TK_STRING);
    if (!t) return -1;
    tpl_sb b;
    tpl_sb_init(&b, L->ar, 0);
    for (size_t k = L->pos + 1; k < i; k++) {
        char c = L->s[k];
        if (c != '\\') {
            tpl_sb_putc(&b, c);
            continue;
        }
        char e = L->s[++k];
        int digits = 0;
        switch (e) {
        case '\n': break;
        case '\\': tpl_sb_putc(&b, '\\'); break;
        case '\'': tpl_sb_putc(&b, '\''); break;
        case '"': tpl_sb_putc(&b, '"'); break;
        case 'a': tpl_sb_putc(&b, 7); break;
        case 'b': tpl_sb_putc(&b, 8); break;
        case 'f': tpl_sb_putc(&b, 12); break;
        case 'n': tpl_sb_putc(&b, '\n'); break;
        case 'r': tpl_sb_putc(&b, '\r'); break;
        case 't': tpl_sb_putc(&b, '\t'); break;
        case 'v': tpl_sb_putc(&b, 11); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && k + 1 < i && L->s[k + 1] >= '0' && L->s[k + 1] <= '7'; d++)
                    v = v * 8 + (uint32_t)(L->s[++k] - '0');
                tpl_utf8_put(&b, v);
            } else {
                tpl_sb_putc(&b, '\\');
                tpl_sb_putc(&b, e);
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int d = 0; d < digits; d++) {
                int h = k + 1 < i ? hexval(L->s[k + 1]) : -1;
                if (h < 0) return lfail(L, "truncated \\x, \\u or \\U escape in string literal");
                v = v * 16 + (uint32_t)h;
                k++;
            }
            if (v > 0x10ffff) return lfail(L, "illegal Unicode character in string literal");
            tpl_utf8_put(&b, v);
        }
    }
    if (b.failed) return lfail(L, "out of memory");
    t->s = b.p ? b.p : "";
    t->n = (uint32_t)b.n;
    adv(L, i + 1);
    return 0;
}

static bool isdig(char c) { return c >= '0' && c <= '9'; }
static bool isname0(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Digits with optional single underscores between them; returns end index. */
static size_t scan_digits(const char *s, size_t n, size_t i) {
    if (i >= n || !isdig(s[i])) return i;
    while (i < n && isdig(s[i])) {
        i++;
        if (i + 1 < n && s[i] == '_' && isdig(s[i + 1])) i++;
    }
    return i;
}

static int lex_number(lexer *L) {
    const char *s = L->s;
    size_t i = L->pos, e = scan_digits(s, L->n, i);
    bool is_float = false;
    if (i == 0 || s[i - 1] != '.') {
        size_t f = e;
        if (f + 1 < L->n && s[f] == '.' && isdig(s[f + 1])) {
            f = scan_digits(s, L->n, f + 1);
            is_float = true;
        }
        if (f < L->n && (s[f] == 'e' || s[f] == 'E')) {
            size_t x = f + 1;
            if (x < L->n && (s[x] == '+' || s[x] == '-')) x++;
            if (x < L->n && isdig(s[x])) {
                f = scan_digits(s, L->n, x);
                is_float = true;
            }
        }
        if (is_float) e = f;
    }
    char buf[128];
    size_t k = 0;
    for (size_t j = i; j < e && k + 1 < sizeof buf; j++)
        if (s[j] != '_') buf[k++] = s[j];
    buf[k] = 0;
    tpl_token *t = push(L, is_float ? TK_FLOAT : TK_INT);
    if (!t) return -1;
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        if (k > 18) return lfail(L, "integer literal too large");
        t->i = strtoll(buf, NULL, 10);
    }
    adv(L, e);
    return 0;
}

static const struct { const char *s; int op; } ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {"<=", OP_LE},
    {">=", OP_GE}, {"+", OP_ADD}, {"-", OP_SUB}, {"*", OP_MUL}, {"/", OP_DIV}, {"%", OP_MOD},
    {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN}, {"{", OP_LBRACE}, {"}", OP_RBRACE}, {"<", OP_LT}, {">", OP_GT},
    {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON}, {"|", OP_PIPE}, {",", OP_COMMA},
    {";", OP_SEMI},
};

/* Lexes the inside of a {{ }} or {% %} tag up to and including its end. */
static int lex_tag(lexer *L, bool block) {
    int balance = 0;
    for (;;) {
        size_t i = skip_space(L->s, L->n, L->pos);
        adv(L, i);
        if (L->pos >= L->n) return lfail(L, block ? "unexpected end of template, expected '%}'"
                                                  : "unexpected end of template, expected '}}'");
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        char close = block ? '%' : '}';
        if (balance == 0) {
            if (left >= 3 && p[0] == '-' && p[1] == close && p[2] == '}') {
                if (!push(L, block ? TK_BEND : TK_VEND)) return -1;
                adv(L, skip_space(L->s, L->n, L->pos + 3));
                return 0;
            }
            if (block && left >= 3 && p[0] == '+' && p[1] == '%' && p[2] == '}') {
                if (!push(L, TK_BEND)) return -1;
                adv(L, L->pos + 3);
                return 0;
            }
            if (left >= 2 && p[0] == close && p[1] == '}') {
                if (!push(L, block ? TK_BEND : TK_VEND)) return -1;
                size_t e = L->pos + 2;
                if (block && e < L->n && L->s[e] == '\n') e++;
                adv(L, e);
                return 0;
            }
        }
        if (isdig(p[0])) {
            if (lex_number(L)) return -1;
            continue;
        }
        if (isname0(p[0])) {
            size_t e = L->pos + 1;
            while (e < L->n && (isname0(L->s[e]) || isdig(L->s[e]))) e++;
            tpl_token *t = push(L, TK_NAME);
            if (!t) return -1;
            t->s = p;
            t->n = (uint32_t)(e - L->pos);
            adv(L, e);
            continue;
        }
        if (p[0] == '\'' || p[0] == '"') {
            if (lex_string(L)) return -1;
            continue;
        }
        int op = 0;
        size_t olen = 0;
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            size_t ol = strlen(ops[k].s);
            if (ol <= left && !memcmp(p, ops[k].s, ol)) {
                op = ops[k].op;
                olen = ol;
                break;
            }
        }
        if (!op) return lfail(L, "unexpected character in tag");
        if (op == OP_LPAREN || op == OP_LBRACKET || op == OP_LBRACE) {
            if (++balance > 1000) return lfail(L, "brackets nested too deeply");
        } else if (op == OP_RPAREN || op == OP_RBRACKET || op == OP_RBRACE) {
            if (balance == 0) return lfail(L, "unexpected closing bracket");
            balance--;
        }
        tpl_token *t = push(L, TK_OP);
        if (!t) return -1;
        t->op = (uint16_t)op;
        adv(L, L->pos + olen);
    }
}

/* Normalises \r\n and \r to \n and drops one trailing newline. */
static char *normalise(tpl_arena *ar, const char *src, size_t len, size_t *olen) {
    char *o = tpl_arena_alloc(ar, len + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            if (i + 1 < len && src[i + 1] == '\n') i++;
            o[k++] = '\n';
        } else {
            o[k++] = src[i];
        }
    }
    if (k > 0 && o[k - 1] == '\n') k--;
    o[k] = 0;
    *olen = k;
    return o;
}

int tpl_lex(tpl_arena *ar, const char *src, size_t len, tpl_token **out, hn_err *err) {
    lexer L;
    memset(&L, 0, sizeof L);
    L.ar = ar;
    L.err = err;
    L.line = 1;
    L.s = normalise(ar, src, len, &L.n);
    if (!L.s) {
        hn_errf(err, HN_ERR_NOMEM, "out of memory");
        return -1;
    }
    bool line_starting = true;
    while (L.pos < L.n) {
        /* find the next tag opener */
        size_t k = L.pos;
        char tagc = 0;
        for (; k + 1 < L.n; k++)
            if (L.s[k] == '{' && (L.s[k + 1] == '{' || L.s[k + 1] == '%' || L.s[k + 1] == '#')) {
                tagc = L.s[k + 1];
                break;
            }
        if (!tagc) k = L.n;
        const char *text = L.s + L.pos;
        size_t tlen = k - L.pos;
        char sign = tagc && k + 2 < L.n && (L.s[k + 2] == '-' || L.s[k + 2] == '+') ? L.s[k + 2] : 0;
        if (sign == '-') {
            tlen = rstrip_len(text, tlen);
        } else if (tagc && tagc != '{' && sign != '+') {
            size_t lpos = tlen;
            while (lpos > 0 && text[lpos - 1] != '\n') lpos--;
            if (lpos > 0 || line_starting) {
                size_t j = lpos;
                while (j < tlen && (text[j] == ' ' || text[j] == '\t')) j++;
                if (j == tlen) tlen = lpos;
            }
        }
        if (tlen) {
            tpl_token *t = push(&L, TK_TEXT);
            if (!t) return -1;
            t->s = text;
            t->n = (uint32_t)tlen;
        }
        if (!tagc) {
            adv(&L, L.n);
            break;
        }
        adv(&L, k + 2 + (sign ? 1 : 0));
        if (tagc == '#') {
            size_t e = L.pos;
            while (e + 1 < L.n && !(L.s[e] == '#' && L.s[e + 1] == '}')) e++;
            if (e + 1 >= L.n) return lfail(&L, "missing end of comment tag");
            size_t after = e + 2;
            if (e > L.pos && L.s[e - 1] == '-') after = skip_space(L.s, L.n, after);
            else if (after < L.n && L.s[after] == '\n') after++;
            adv(&L, after);
        } else {
            L.pos = k; /* the begin token's position */
            if (!push(&L, tagc == '%' ? TK_BBEGIN : TK_VBEGIN)) return -1;
            adv(&L, k + 2 + (sign ? 1 : 0));
            if (lex_tag(&L, tagc == '%')) return -1;
        }
        line_starting = L.pos > 0 && L.s[L.pos - 1] == '\n';
        if (L.status) return -1;
    }
    if (!push(&L, TK_EOF)) return -1;
    *out = L.toks;
    return L.ntoks;
}
