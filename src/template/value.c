/* value.c: the template module's arena, string builder and Python-like values:
 * str()/repr() printing, json.dumps, equality and ordering, len() and
 * iteration, UTF-8 helpers, and conversion from jansson JSON. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../core/alloc.h"
#include "tpl_int.h"

/* ---- arena ---- */

struct tpl_ablock {
    tpl_ablock *next;
    size_t used, cap;
    max_align_t align_[]; /* data follows */
};

#define ABLOCK_SIZE (64 * 1024)

void *tpl_arena_alloc(tpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tpl_ablock *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ABLOCK_SIZE / 4 ? n : ABLOCK_SIZE;
        if (a->limit && a->used + cap > a->limit) {
            a->hit_limit = true;
            return NULL;
        }
        if (cap > SIZE_MAX - sizeof(tpl_ablock)) return NULL;
        tpl_ablock *nb = hn_malloc(sizeof(tpl_ablock) + cap);
        if (!nb) return NULL;
        nb->used = 0;
        nb->cap = cap;
        a->used += cap;
        if (cap == n && b) { /* big one-off block: keep the current block as head */
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            a->head = nb;
        }
        b = nb;
    }
    void *p = (char *)(b + 1) + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_ablock *b = a->head;
    while (b) {
        tpl_ablock *n = b->next;
        hn_free(b);
        b = n;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- string builder ---- */

void tpl_sb_init(tpl_sb *b, tpl_arena *ar, size_t limit) {
    memset(b, 0, sizeof *b);
    b->ar = ar;
    b->limit = limit;
}

static bool sb_reserve(tpl_sb *b, size_t extra) {
    if (b->failed) return false;
    if ((b->limit && b->n + extra > b->limit) || extra > UINT32_MAX - 16 || b->n + extra > UINT32_MAX - 16) {
        b->failed = b->over_limit = true;
        return false;
    }
    if (b->n + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = tpl_arena_alloc(b->ar, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
    return true;
}

void tpl_sb_put(tpl_sb *b, const char *s, size_t n) {
    if (!n || !sb_reserve(b, n)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tpl_sb_putc(tpl_sb *b, char c) { tpl_sb_put(b, &c, 1); }
void tpl_sb_puts(tpl_sb *b, const char *s) { tpl_sb_put(b, s, strlen(s)); }

void tpl_sb_printf(tpl_sb *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k >= sizeof tmp) k = sizeof tmp - 1;
    tpl_sb_put(b, tmp, (size_t)k);
}

tv tpl_sb_value(tpl_sb *b) { return tv_strn(b->p ? b->p : "", b->n); }

/* ---- small constructors ---- */

tlist *tpl_list_new(tpl_arena *ar, uint8_t kind, uint32_t cap) {
    tlist *l = tpl_arena_alloc(ar, sizeof *l);
    if (!l) return NULL;
    l->kind = kind;
    if (cap) {
        l->v = tpl_arena_alloc(ar, sizeof(tv) * (size_t)cap);
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

int tpl_list_push(tpl_arena *ar, tlist *l, tv v) {
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 4;
        if (cap < l->cap) return -1;
        tv *nv = tpl_arena_alloc(ar, sizeof(tv) * (size_t)cap);
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, sizeof(tv) * l->n);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

tdict *tpl_dict_new(tpl_arena *ar, uint8_t kind) {
    tdict *d = tpl_arena_alloc(ar, sizeof *d);
    if (d) d->kind = kind;
    return d;
}

bool tpl_dict_get(const tdict *d, tv k, tv *out) {
    for (uint32_t i = 0; i < d->n; i++)
        if (tpl_equal(d->k[i], k)) {
            if (out) *out = d->v[i];
            return true;
        }
    return false;
}

bool tpl_dict_getc(const tdict *d, const char *key, tv *out) {
    size_t n = strlen(key);
    for (uint32_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].n == n && !memcmp(d->k[i].u.s, key, n)) {
            if (out) *out = d->v[i];
            return true;
        }
    return false;
}

int tpl_dict_set(tpl_arena *ar, tdict *d, tv k, tv v) {
    for (uint32_t i = 0; i < d->n; i++)
        if (tpl_equal(d->k[i], k)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 4;
        tv *nk = tpl_arena_alloc(ar, sizeof(tv) * (size_t)cap);
        tv *nv = tpl_arena_alloc(ar, sizeof(tv) * (size_t)cap);
        if (!nk || !nv) return -1;
        if (d->n) {
            memcpy(nk, d->k, sizeof(tv) * d->n);
            memcpy(nv, d->v, sizeof(tv) * d->n);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

tv tpl_mklist(tlist *l) {
    tv v = {0};
    v.t = TV_LIST;
    v.u.l = l;
    return v;
}

tv tpl_mkdict(tdict *d) {
    tv v = {0};
    v.t = TV_DICT;
    v.u.d = d;
    return v;
}

tv tpl_cstr(tpl_arena *ar, const char *s) {
    size_t n = strlen(s);
    char *p = tpl_arena_alloc(ar, n + 1);
    if (!p) return tv_strn("", 0);
    memcpy(p, s, n);
    return tv_strn(p, n);
}

bool tpl_str_eq(tv s, const char *c) {
    size_t n = strlen(c);
    return s.t == TV_STR && s.n == n && !memcmp(s.u.s, c, n);
}

/* ---- UTF-8 ---- */

uint32_t tpl_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t p = *i;
    unsigned c = u[p];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len <= 1 || p + (size_t)len > n) {
        *i = p + 1;
        return c;
    }
    uint32_t cp = c & (0x7f >> len);
    for (int k = 1; k < len; k++) {
        if ((u[p + k] & 0xc0) != 0x80) {
            *i = p + 1;
            return c;
        }
        cp = (cp << 6) | (u[p + k] & 0x3f);
    }
    *i = p + (size_t)len;
    return cp;
}

size_t tpl_utf8_len(const char *s, size_t n) {
    size_t i = 0, k = 0;
    while (i < n) {
        tpl_utf8_next(s, n, &i);
        k++;
    }
    return k;
}

void tpl_utf8_put(tpl_sb *b, uint32_t cp) {
    char t[4];
    if (cp < 0x80) {
        t[0] = (char)cp;
        tpl_sb_put(b, t, 1);
    } else if (cp < 0x800) {
        t[0] = (char)(0xc0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3f));
        tpl_sb_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[2] = (char)(0x80 | (cp & 0x3f));
        tpl_sb_put(b, t, 3);
    } else {
        t[0] = (char)(0xf0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[3] = (char)(0x80 | (cp & 0x3f));
        tpl_sb_put(b, t, 4);
    }
}

bool tpl_py_isspace(uint32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 ||
        cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return true;
    return false;
}

static bool py_isprintable(uint32_t cp) {
    if (cp == ' ') return true;
    if (cp > 0x10ffff) return false;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

/* ---- printing ---- */

const char *tpl_type_name(tv v) {
    switch (v.t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return v.k == TS_MARKUP ? "Markup" : "str";
    case TV_LIST:
        return v.u.l->kind == TL_TUPLE ? "tuple" : v.u.l->kind == TL_GEN ? "generator" : "list";
    case TV_DICT:
        return v.u.d->kind == TD_NS ? "Namespace" : v.u.d->kind == TD_LOOP ? "LoopContext" : "dict";
    case TV_FUNC:
        return v.u.fn->kind == FN_MACRO ? "Macro" : "builtin_function_or_method";
    }
    return "object";
}

/* Python float repr (shortest round-trip, 'r' format rules). */
static void fmt_float(char *out, size_t cap, double d) {
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char buf[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    const char *q = buf;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    char dig[24];
    int nd = 0;
    while (*q && *q != 'e') {
        if (*q >= '0' && *q <= '9' && nd < 23) dig[nd++] = *q;
        q++;
    }
    int e = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    char *o = out;
    char *end = out + cap - 1;
#define PUT(c) do { if (o < end) *o++ = (c); } while (0)
    if (neg) PUT('-');
    if (e < -4 || e >= 16) {
        PUT(dig[0]);
        if (nd > 1) {
            PUT('.');
            for (int i = 1; i < nd; i++) PUT(dig[i]);
        }
        PUT('e');
        PUT(e < 0 ? '-' : '+');
        int ae = e < 0 ? -e : e;
        char eb[16];
        snprintf(eb, sizeof eb, "%02d", ae);
        for (char *c = eb; *c; c++) PUT(*c);
    } else if (e >= 0) {
        for (int i = 0; i <= e; i++) PUT(i < nd ? dig[i] : '0');
        PUT('.');
        if (nd > e + 1)
            for (int i = e + 1; i < nd; i++) PUT(dig[i]);
        else
            PUT('0');
    } else {
        PUT('0');
        PUT('.');
        for (int i = 0; i < -e - 1; i++) PUT('0');
        for (int i = 0; i < nd; i++) PUT(dig[i]);
    }
#undef PUT
    *o = 0;
}

static void repr_str(tpl_sb *b, tv s) {
    bool has_sq = memchr(s.u.s, '\'', s.n) != NULL, has_dq = memchr(s.u.s, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tpl_sb_putc(b, q);
    size_t i = 0;
    while (i < s.n) {
        size_t st = i;
        uint32_t cp = tpl_utf8_next(s.u.s, s.n, &i);
        if (cp == (uint32_t)q || cp == '\\') {
            tpl_sb_putc(b, '\\');
            tpl_sb_putc(b, (char)cp);
        } else if (cp == '\t') {
            tpl_sb_puts(b, "\\t");
        } else if (cp == '\n') {
            tpl_sb_puts(b, "\\n");
        } else if (cp == '\r') {
            tpl_sb_puts(b, "\\r");
        } else if (cp < 0x20 || cp == 0x7f) {
            tpl_sb_printf(b, "\\x%02x", cp);
        } else if (cp < 0x7f) {
            tpl_sb_putc(b, (char)cp);
        } else if (py_isprintable(cp)) {
            tpl_sb_put(b, s.u.s + st, i - st);
        } else if (cp <= 0xff) {
            tpl_sb_printf(b, "\\x%02x", cp);
        } else if (cp <= 0xffff) {
            tpl_sb_printf(b, "\\u%04x", cp);
        } else {
            tpl_sb_printf(b, "\\U%08x", cp);
        }
    }
    tpl_sb_putc(b, q);
}

int tpl_repr(tpl_rt *rt, tpl_sb *b, tv v, int depth) {
    if (depth > 200) return tpl_fail(rt, TPL_E_LIMIT, "value nested too deeply to print");
    char fb[64];
    switch (v.t) {
    case TV_STR:
        if (v.k == TS_MARKUP) {
            tpl_sb_puts(b, "Markup(");
            repr_str(b, v);
            tpl_sb_putc(b, ')');
        } else {
            repr_str(b, v);
        }
        return 0;
    case TV_LIST: {
        tlist *l = v.u.l;
        if (l->kind == TL_GEN) {
            tpl_sb_puts(b, "<generator object at 0x0>");
            return 0;
        }
        tpl_sb_putc(b, l->kind == TL_TUPLE ? '(' : '[');
        for (uint32_t i = 0; i < l->n; i++) {
            if (i) tpl_sb_puts(b, ", ");
            if (tpl_repr(rt, b, l->v[i], depth + 1)) return -1;
        }
        if (l->kind == TL_TUPLE && l->n == 1) tpl_sb_putc(b, ',');
        tpl_sb_putc(b, l->kind == TL_TUPLE ? ')' : ']');
        return 0;
    }
    case TV_DICT: {
        tdict *d = v.u.d;
        if (d->kind == TD_LOOP) {
            tpl_sb_puts(b, "<LoopContext>");
            return 0;
        }
        if (d->kind == TD_NS) tpl_sb_puts(b, "<Namespace ");
        tpl_sb_putc(b, '{');
        for (uint32_t i = 0; i < d->n; i++) {
            if (i) tpl_sb_puts(b, ", ");
            if (tpl_repr(rt, b, d->k[i], depth + 1)) return -1;
            tpl_sb_puts(b, ": ");
            if (tpl_repr(rt, b, d->v[i], depth + 1)) return -1;
        }
        tpl_sb_putc(b, '}');
        if (d->kind == TD_NS) tpl_sb_putc(b, '>');
        return 0;
    }
    case TV_UNDEF:
        tpl_sb_puts(b, "Undefined");
        return 0;
    case TV_FUNC:
        if (v.u.fn->kind == FN_MACRO)
            tpl_sb_printf(b, "<Macro '%s'>", v.u.fn->name ? v.u.fn->name : "");
        else
            tpl_sb_printf(b, "<built-in method %s>", v.u.fn->name ? v.u.fn->name : "");
        return 0;
    case TV_NONE: tpl_sb_puts(b, "None"); return 0;
    case TV_BOOL: tpl_sb_puts(b, v.u.i ? "True" : "False"); return 0;
    case TV_INT: tpl_sb_printf(b, "%lld", (long long)v.u.i); return 0;
    case TV_FLOAT:
        fmt_float(fb, sizeof fb, v.u.f);
        tpl_sb_puts(b, fb);
        return 0;
    }
    return 0;
}

int tpl_write_str(tpl_rt *rt, tpl_sb *b, tv v) {
    if (v.t == TV_STR) {
        tpl_sb_put(b, v.u.s, v.n);
        return 0;
    }
    if (v.t == TV_UNDEF) return 0;
    return tpl_repr(rt, b, v, 0);
}

int tpl_str_of(tpl_rt *rt, tv v, tv *out) {
    if (v.t == TV_STR) {
        *out = v;
        out->k = TS_PLAIN;
        return 0;
    }
    if (v.t == TV_UNDEF) {
        *out = tv_strn("", 0);
        return 0;
    }
    if (v.t == TV_BOOL) {
        *out = v.u.i ? tv_strn("True", 4) : tv_strn("False", 5);
        return 0;
    }
    if (v.t == TV_NONE) {
        *out = tv_strn("None", 4);
        return 0;
    }
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    if (tpl_repr(rt, &b, v, 0)) return -1;
    if (b.failed) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
    *out = tpl_sb_value(&b);
    return 0;
}

/* ---- json.dumps ---- */

static void json_str(tpl_sb *b, const char *s, size_t n, bool ascii) {
    tpl_sb_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t cp = tpl_utf8_next(s, n, &i);
        switch (cp) {
        case '"': tpl_sb_puts(b, "\\\""); continue;
        case '\\': tpl_sb_puts(b, "\\\\"); continue;
        case '\n': tpl_sb_puts(b, "\\n"); continue;
        case '\r': tpl_sb_puts(b, "\\r"); continue;
        case '\t': tpl_sb_puts(b, "\\t"); continue;
        case '\b': tpl_sb_puts(b, "\\b"); continue;
        case '\f': tpl_sb_puts(b, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (ascii && cp > 0x7e)) {
            if (cp >= 0x10000) {
                uint32_t c = cp - 0x10000;
                tpl_sb_printf(b, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
            } else {
                tpl_sb_printf(b, "\\u%04x", cp);
            }
        } else {
            tpl_sb_put(b, s + st, i - st);
        }
    }
    tpl_sb_putc(b, '"');
}

static void json_nl(tpl_sb *b, int indent, int level) {
    tpl_sb_putc(b, '\n');
    for (int i = 0; i < indent * level; i++) tpl_sb_putc(b, ' ');
}

typedef struct jopt {
    int indent;
    bool ascii, sort;
    const char *isep, *ksep;
} jopt;

static int json_val(tpl_rt *rt, tpl_sb *b, tv v, const jopt *o, int level);

static int json_key(tpl_rt *rt, tpl_sb *b, tv k, const jopt *o) {
    char fb[64];
    switch (k.t) {
    case TV_STR: json_str(b, k.u.s, k.n, o->ascii); return 0;
    case TV_INT: tpl_sb_printf(b, "\"%lld\"", (long long)k.u.i); return 0;
    case TV_FLOAT: fmt_float(fb, sizeof fb, k.u.f); tpl_sb_printf(b, "\"%s\"", fb); return 0;
    case TV_BOOL: tpl_sb_puts(b, k.u.i ? "\"true\"" : "\"false\""); return 0;
    case TV_NONE: tpl_sb_puts(b, "\"null\""); return 0;
    default:
        return tpl_fail(rt, TPL_E_TYPE, "keys must be str, int, float, bool or None, not %s",
                        tpl_type_name(k));
    }
}

static int json_val(tpl_rt *rt, tpl_sb *b, tv v, const jopt *o, int level) {
    char fb[64];
    if (level > 200) return tpl_fail(rt, TPL_E_LIMIT, "value nested too deeply for tojson");
    switch (v.t) {
    case TV_NONE: tpl_sb_puts(b, "null"); return 0;
    case TV_BOOL: tpl_sb_puts(b, v.u.i ? "true" : "false"); return 0;
    case TV_INT: tpl_sb_printf(b, "%lld", (long long)v.u.i); return 0;
    case TV_FLOAT:
        if (isnan(v.u.f)) tpl_sb_puts(b, "NaN");
        else if (isinf(v.u.f)) tpl_sb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float(fb, sizeof fb, v.u.f);
            tpl_sb_puts(b, fb);
        }
        return 0;
    case TV_STR: json_str(b, v.u.s, v.n, o->ascii); return 0;
    case TV_LIST: {
        tlist *l = v.u.l;
        if (l->kind == TL_GEN) break;
        if (!l->n) {
            tpl_sb_puts(b, "[]");
            return 0;
        }
        tpl_sb_putc(b, '[');
        for (uint32_t i = 0; i < l->n; i++) {
            if (i) tpl_sb_puts(b, o->isep);
            if (o->indent >= 0) json_nl(b, o->indent, level + 1);
            if (json_val(rt, b, l->v[i], o, level + 1)) return -1;
        }
        if (o->indent >= 0) json_nl(b, o->indent, level);
        tpl_sb_putc(b, ']');
        return 0;
    }
    case TV_DICT: {
        tdict *d = v.u.d;
        if (d->kind != TD_DICT) break;
        if (!d->n) {
            tpl_sb_puts(b, "{}");
            return 0;
        }
        uint32_t *ord = tpl_arena_alloc(tpl_rt_arena(rt), sizeof(uint32_t) * d->n);
        if (!ord) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
        for (uint32_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort) { /* insertion sort by key (stable) */
            for (uint32_t i = 1; i < d->n; i++) {
                uint32_t x = ord[i], j = i;
                while (j > 0) {
                    bool lt;
                    if (tpl_less(rt, d->k[x], d->k[ord[j - 1]], &lt)) return -1;
                    if (!lt) break;
                    ord[j] = ord[j - 1];
                    j--;
                }
                ord[j] = x;
            }
        }
        tpl_sb_putc(b, '{');
        for (uint32_t i = 0; i < d->n; i++) {
            if (i) tpl_sb_puts(b, o->isep);
            if (o->indent >= 0) json_nl(b, o->indent, level + 1);
            if (json_key(rt, b, d->k[ord[i]], o)) return -1;
            tpl_sb_puts(b, o->ksep);
            if (json_val(rt, b, d->v[ord[i]], o, level + 1)) return -1;
        }
        if (o->indent >= 0) json_nl(b, o->indent, level);
        tpl_sb_putc(b, '}');
        return 0;
    }
    default: break;
    }
    return tpl_fail(rt, TPL_E_TYPE, "Object of type %s is not JSON serializable", tpl_type_name(v));
}

int tpl_tojson(tpl_rt *rt, tpl_sb *b, tv v, int indent, bool ensure_ascii, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth) {
    jopt o;
    o.indent = indent;
    o.ascii = ensure_ascii;
    o.sort = sort_keys;
    o.isep = item_sep ? item_sep : indent >= 0 ? "," : ", ";
    o.ksep = key_sep ? key_sep : ": ";
    return json_val(rt, b, v, &o, depth);
}

/* ---- comparisons ---- */

static double num_of(tv v) { return v.t == TV_FLOAT ? v.u.f : (double)v.u.i; }

bool tpl_equal(tv a, tv b) {
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT) return a.u.i == b.u.i;
        return num_of(a) == num_of(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case TV_UNDEF:
    case TV_NONE: return true;
    case TV_STR: return a.n == b.n && (a.n == 0 || !memcmp(a.u.s, b.u.s, a.n));
    case TV_LIST: {
        tlist *x = a.u.l, *y = b.u.l;
        if (x == y) return true;
        if (x->kind != y->kind || x->kind == TL_GEN || x->n != y->n) return false;
        for (uint32_t i = 0; i < x->n; i++)
            if (!tpl_equal(x->v[i], y->v[i])) return false;
        return true;
    }
    case TV_DICT: {
        tdict *x = a.u.d, *y = b.u.d;
        if (x == y) return true;
        if (x->kind != TD_DICT || y->kind != TD_DICT || x->n != y->n) return false;
        for (uint32_t i = 0; i < x->n; i++) {
            tv o;
            if (!tpl_dict_get(y, x->k[i], &o) || !tpl_equal(x->v[i], o)) return false;
        }
        return true;
    }
    case TV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

int tpl_less(tpl_rt *rt, tv a, tv b, bool *lt) {
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT) *lt = a.u.i < b.u.i;
        else *lt = num_of(a) < num_of(b);
        return 0;
    }
    if (a.t == TV_UNDEF || b.t == TV_UNDEF)
        return tpl_fail(rt, TPL_E_UNDEFINED, "comparison with an undefined value");
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t m = a.n < b.n ? a.n : b.n;
        int c = m ? memcmp(a.u.s, b.u.s, m) : 0;
        *lt = c < 0 || (c == 0 && a.n < b.n);
        return 0;
    }
    if (a.t == TV_LIST && b.t == TV_LIST && a.u.l->kind == b.u.l->kind && a.u.l->kind != TL_GEN) {
        tlist *x = a.u.l, *y = b.u.l;
        for (uint32_t i = 0; i < x->n && i < y->n; i++) {
            if (tpl_equal(x->v[i], y->v[i])) continue;
            return tpl_less(rt, x->v[i], y->v[i], lt);
        }
        *lt = x->n < y->n;
        return 0;
    }
    return tpl_fail(rt, TPL_E_TYPE, "'<' not supported between instances of '%s' and '%s'",
                    tpl_type_name(a), tpl_type_name(b));
}

bool tpl_truthy(tv v) {
    switch (v.t) {
    case TV_UNDEF:
    case TV_NONE: return false;
    case TV_BOOL:
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.n != 0;
    case TV_LIST: return v.u.l->kind == TL_GEN || v.u.l->n != 0;
    case TV_DICT: return v.u.d->kind != TD_DICT || v.u.d->n != 0;
    default: return true;
    }
}

/* ---- len / iteration ---- */

int tpl_len(tpl_rt *rt, tv v, int64_t *n) {
    switch (v.t) {
    case TV_UNDEF: *n = 0; return 0;
    case TV_STR: *n = (int64_t)tpl_utf8_len(v.u.s, v.n); return 0;
    case TV_LIST:
        if (v.u.l->kind == TL_GEN) break;
        *n = v.u.l->n;
        return 0;
    case TV_DICT:
        if (v.u.d->kind != TD_DICT) break;
        *n = v.u.d->n;
        return 0;
    default: break;
    }
    return tpl_fail(rt, TPL_E_TYPE, "object of type '%s' has no len()", tpl_type_name(v));
}

int tpl_iterate(tpl_rt *rt, tv v, tlist **out) {
    tpl_arena *ar = tpl_rt_arena(rt);
    switch (v.t) {
    case TV_UNDEF:
        *out = tpl_list_new(ar, TL_LIST, 0);
        break;
    case TV_LIST:
        *out = v.u.l;
        return 0;
    case TV_DICT:
        if (v.u.d->kind != TD_DICT) goto bad;
        *out = tpl_list_new(ar, TL_LIST, v.u.d->n);
        if (!*out) break;
        for (uint32_t i = 0; i < v.u.d->n; i++) (*out)->v[i] = v.u.d->k[i];
        (*out)->n = v.u.d->n;
        break;
    case TV_STR: {
        size_t cnt = tpl_utf8_len(v.u.s, v.n);
        if (cnt > UINT32_MAX / 2) return tpl_fail(rt, TPL_E_LIMIT, "string too long to iterate");
        *out = tpl_list_new(ar, TL_LIST, (uint32_t)cnt);
        if (!*out) break;
        size_t i = 0;
        while (i < v.n) {
            size_t st = i;
            tpl_utf8_next(v.u.s, v.n, &i);
            (*out)->v[(*out)->n++] = tv_strn(v.u.s + st, i - st);
        }
        if (tpl_step(rt, cnt)) return -1;
        break;
    }
    default:
    bad:
        return tpl_fail(rt, TPL_E_TYPE, "'%s' object is not iterable", tpl_type_name(v));
    }
    if (!*out) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
    return 0;
}

int tpl_escape(tpl_rt *rt, tv v, tv *out) {
    if (v.t == TV_STR && v.k == TS_MARKUP) {
        *out = v;
        return 0;
    }
    tv s;
    if (tpl_str_of(rt, v, &s)) return -1;
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    for (uint32_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        switch (c) {
        case '&': tpl_sb_puts(&b, "&amp;"); break;
        case '<': tpl_sb_puts(&b, "&lt;"); break;
        case '>': tpl_sb_puts(&b, "&gt;"); break;
        case '\'': tpl_sb_puts(&b, "&#39;"); break;
        case '"': tpl_sb_puts(&b, "&#34;"); break;
        default: tpl_sb_putc(&b, c);
        }
    }
    if (b.failed) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
    *out = tpl_sb_value(&b);
    out->k = TS_MARKUP;
    return 0;
}

/* ---- JSON input ---- */

int tpl_from_json(tpl_rt *rt, const json_t *j, tv *out, int depth) {
    tpl_arena *ar = tpl_rt_arena(rt);
    if (depth > 512) return tpl_fail(rt, TPL_E_LIMIT, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = tv_none(); return 0;
    case JSON_TRUE: *out = tv_bool(true); return 0;
    case JSON_FALSE: *out = tv_bool(false); return 0;
    case JSON_INTEGER: *out = tv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return 0;
    case JSON_STRING: {
        size_t n = json_string_length(j);
        if (n > UINT32_MAX) return tpl_fail(rt, TPL_E_LIMIT, "string too long");
        char *p = tpl_arena_alloc(ar, n + 1);
        if (!p) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
        memcpy(p, json_string_value(j), n);
        *out = tv_strn(p, n);
        return 0;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (n > UINT32_MAX / 2) return tpl_fail(rt, TPL_E_LIMIT, "array too long");
        tlist *l = tpl_list_new(ar, TL_LIST, (uint32_t)n);
        if (!l) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            if (tpl_from_json(rt, json_array_get(j, i), &l->v[i], depth + 1)) return -1;
        l->n = (uint32_t)n;
        *out = tpl_mklist(l);
        return 0;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        if (n > UINT32_MAX / 2) return tpl_fail(rt, TPL_E_LIMIT, "object too big");
        tdict *d = tpl_dict_new(ar, TD_DICT);
        if (!d) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
        if (n) {
            d->k = tpl_arena_alloc(ar, sizeof(tv) * n);
            d->v = tpl_arena_alloc(ar, sizeof(tv) * n);
            if (!d->k || !d->v) return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
            d->cap = (uint32_t)n;
        }
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            if (d->n >= d->cap) break;
            d->k[d->n] = tpl_cstr(ar, key);
            if (tpl_from_json(rt, val, &d->v[d->n], depth + 1)) return -1;
            d->n++;
        }
        *out = tpl_mkdict(d);
        return 0;
    }
    }
    *out = tv_none();
    return 0;
}
