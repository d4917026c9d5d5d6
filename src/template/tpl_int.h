/* tpl_int.h: internals of the template module shared by its files (lexer,
 * parser, values, evaluator, builtins). Not for other modules.
 *
 * Memory: everything a compile or render creates lives in an arena (tpl_arena)
 * that is freed as a whole, so values can share freely (strings are immutable
 * views, lists/dicts are immutable except namespace attributes). The render
 * arena counts its bytes against tpl_options.max_memory.
 *
 * Values (tv) are 16-byte tagged unions: immediates for undefined/None/bool/
 * int/float, (pointer, length) views for strings, pointers for list/tuple/
 * generator, dict/namespace/loop and callables. */
#ifndef HN_TPL_INT_H
#define HN_TPL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "template.h"

/* ---- arena ---- */
typedef struct tpl_ablock tpl_ablock;
typedef struct tpl_arena {
    tpl_ablock *head;
    size_t used, limit; /* limit 0 = none */
    bool hit_limit;     /* an allocation was refused by the limit */
} tpl_arena;

void *tpl_arena_alloc(tpl_arena *a, size_t n); /* zeroed; NULL on limit/nomem */
void tpl_arena_free(tpl_arena *a);

/* ---- values ---- */
typedef enum { TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT, TV_FUNC } tv_type;
enum { TL_LIST, TL_TUPLE, TL_GEN };        /* tlist.kind */
enum { TD_DICT, TD_NS, TD_LOOP };          /* tdict.kind */
enum { TS_PLAIN = 0, TS_MARKUP = 1 };      /* tv.k for strings */
enum { TU_PLAIN = 0, TU_UNSAFE = 1 };      /* tv.k for undefined: unsafe attribute (sandbox) */

struct tlist;
struct tdict;
struct tfunc;
typedef struct tv {
    uint8_t t, k;
    uint32_t n; /* string length in bytes */
    union {
        int64_t i;
        double f;
        const char *s; /* strings (not NUL-terminated); undefined: hint name (may be NULL) */
        struct tlist *l;
        struct tdict *d;
        struct tfunc *fn;
    } u;
} tv;

typedef struct tlist {
    uint8_t kind;
    uint32_t n, cap;
    tv *v;
} tlist;

typedef struct tdict {
    uint8_t kind;
    uint32_t n, cap;
    tv *k, *v;
} tdict;

struct tpl_node;
struct tpl_frame;
enum { FN_MACRO, FN_BUILTIN, FN_METHOD };
typedef struct tfunc {
    uint8_t kind;
    int id;                        /* builtin id */
    const struct tpl_node *macro;  /* FN_MACRO */
    struct tpl_frame *closure;     /* FN_MACRO: frame where it was defined */
    tv self;                       /* FN_METHOD: the bound object */
    const char *name;              /* method or builtin name, NUL-terminated */
} tfunc;

static inline tv tv_undef(void) { tv v = {0}; v.t = TV_UNDEF; return v; }
static inline tv tv_none(void) { tv v = {0}; v.t = TV_NONE; return v; }
static inline tv tv_bool(bool b) { tv v = {0}; v.t = TV_BOOL; v.u.i = b; return v; }
static inline tv tv_int(int64_t i) { tv v = {0}; v.t = TV_INT; v.u.i = i; return v; }
static inline tv tv_float(double f) { tv v = {0}; v.t = TV_FLOAT; v.u.f = f; return v; }
static inline tv tv_strn(const char *s, size_t n) { tv v = {0}; v.t = TV_STR; v.u.s = s; v.n = (uint32_t)n; return v; }
static inline bool tv_is_num(tv v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }

/* ---- string builder (arena-backed) ---- */
typedef struct tpl_sb {
    tpl_arena *ar;
    char *p;
    size_t n, cap;
    size_t limit; /* 0 = none */
    bool failed;  /* allocation or limit failure happened */
    bool over_limit;
} tpl_sb;

void tpl_sb_init(tpl_sb *b, tpl_arena *ar, size_t limit);
void tpl_sb_put(tpl_sb *b, const char *s, size_t n);
void tpl_sb_putc(tpl_sb *b, char c);
void tpl_sb_puts(tpl_sb *b, const char *s);
void tpl_sb_printf(tpl_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tv tpl_sb_value(tpl_sb *b); /* the built string as a value (shares memory) */

/* ---- errors during render ---- */
typedef struct tpl_rt tpl_rt; /* render state, see eval.c */

/* Reports an error of `kind` at the current line; returns -1. */
int tpl_fail(tpl_rt *rt, tpl_errkind kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
tpl_arena *tpl_rt_arena(tpl_rt *rt);
/* Counts one unit of work; returns -1 (with error) past max_steps. */
int tpl_step(tpl_rt *rt, uint64_t n);

/* ---- value helpers (value.c) ---- */
const char *tpl_type_name(tv v);            /* Python type name: 'str', 'list', 'NoneType', ... */
bool tpl_truthy(tv v);
int tpl_str_of(tpl_rt *rt, tv v, tv *out); /* Python str(); undefined -> "" */
int tpl_repr(tpl_rt *rt, tpl_sb *b, tv v, int depth);
int tpl_write_str(tpl_rt *rt, tpl_sb *b, tv v); /* appends str(v) */
/* json.dumps: indent < 0 = none; item_sep/key_sep NULL = defaults. */
int tpl_tojson(tpl_rt *rt, tpl_sb *b, tv v, int indent, bool ensure_ascii, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth);
bool tpl_equal(tv a, tv b);
/* Python ordering a<b: sets *lt; returns -1 (TypeError) when not comparable. */
int tpl_less(tpl_rt *rt, tv a, tv b, bool *lt);
tlist *tpl_list_new(tpl_arena *ar, uint8_t kind, uint32_t cap);
int tpl_list_push(tpl_arena *ar, tlist *l, tv v);   /* -1 on nomem */
tdict *tpl_dict_new(tpl_arena *ar, uint8_t kind);
int tpl_dict_set(tpl_arena *ar, tdict *d, tv k, tv v); /* replaces an existing key */
bool tpl_dict_get(const tdict *d, tv k, tv *out);
bool tpl_dict_getc(const tdict *d, const char *key, tv *out); /* key as C string */
tv tpl_mklist(tlist *l);
tv tpl_mkdict(tdict *d);
tv tpl_cstr(tpl_arena *ar, const char *s); /* copies */
bool tpl_str_eq(tv s, const char *c);       /* s is a string equal to C string c */
size_t tpl_utf8_len(const char *s, size_t n); /* code points */
/* Decodes one UTF-8 code point at s[*i] (advancing *i); invalid bytes decode as themselves. */
uint32_t tpl_utf8_next(const char *s, size_t n, size_t *i);
void tpl_utf8_put(tpl_sb *b, uint32_t cp);
bool tpl_py_isspace(uint32_t cp);
/* Converts a jansson value into a template value; -1 on failure. */
int tpl_from_json(tpl_rt *rt, const json_t *j, tv *out, int depth);
/* Iterates v into a fresh list (strings → chars, dict → keys, undefined → empty);
 * -1 with a TypeError when not iterable. */
int tpl_iterate(tpl_rt *rt, tv v, tlist **out);
/* Python len(); -1 on TypeError. */
int tpl_len(tpl_rt *rt, tv v, int64_t *n);
/* HTML-escapes str(v) for Markup concatenation (markupsafe.escape); Markup passes through. */
int tpl_escape(tpl_rt *rt, tv v, tv *out);

/* ---- lexer / parser ---- */
typedef enum {
    TK_EOF, TK_TEXT, TK_VBEGIN, TK_VEND, TK_BBEGIN, TK_BEND,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP
} tpl_tokkind;

typedef struct tpl_token {
    uint8_t kind;
    uint16_t op; /* TK_OP: see OP_* in lexer.c/parser.c */
    int line, col;
    const char *s; /* text / name / decoded string value */
    uint32_t n;
    int64_t i;
    double f;
} tpl_token;

enum {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_ASSIGN, OP_DOT, OP_COLON,
    OP_PIPE, OP_COMMA, OP_SEMI,
    /* not lexer tokens: */
    OP_IN, OP_NOTIN, OP_NEG, OP_POS
};

/* Tokenizes normalised source; returns the count or -1 with err set. */
int tpl_lex(tpl_arena *ar, const char *src, size_t len, tpl_token **out, hn_err *err);

typedef enum {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_PAIR, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_KWARG,
    N_FILTER, N_TEST, N_UNARY, N_BIN, N_AND, N_OR, N_NOT, N_COND, N_CMP, N_CONCAT, N_BODYVAL,
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_FILTERBLOCK, S_BREAK, S_CONTINUE,
    S_BLOCK
} tpl_nodekind;

typedef struct tpl_node {
    uint8_t kind;
    uint16_t op;
    int line;
    tv lit; /* literal value, or name (string) */
    struct tpl_node *a, *b, *c, *d;
    struct tpl_node **kids, **kids2;
    uint32_t nkids, nkids2;
} tpl_node;

/* Parses tokens into a statement list (the template body, an S_BLOCK node). */
int tpl_parse(tpl_arena *ar, const tpl_token *toks, int ntoks, tpl_node **out, hn_err *err);

/* ---- evaluator entry points used by builtins ---- */
int tpl_eval(tpl_rt *rt, const tpl_node *n, tv *out);
int tpl_call_value(tpl_rt *rt, tv fn, tv *args, int nargs, const char **kwnames, tv *kwvals,
                   int nkw, tv *out);
int tpl_getattr(tpl_rt *rt, tv obj, const char *name, size_t nlen, tv *out);
int tpl_getitem(tpl_rt *rt, tv obj, tv key, tv *out);

/* ---- builtins (builtins.c, filters.c) ---- */
/* Applies filter `name` to v with arguments; -1 on error (unknown filter included). */
int tpl_filter(tpl_rt *rt, const char *name, tv v, tv *args, int nargs, const char **kwnames,
               tv *kwvals, int nkw, tv *out);
/* Runs test `name`; -1 on error (unknown test included). */
int tpl_test(tpl_rt *rt, const char *name, tv v, tv *args, int nargs, bool *res);
/* Looks up a global function (range, namespace, raise_exception, strftime_now, dict). */
bool tpl_global(const char *name, size_t n, tv *out, tpl_arena *ar);
int tpl_call_builtin(tpl_rt *rt, const tfunc *f, tv *args, int nargs, const char **kwnames,
                     tv *kwvals, int nkw, tv *out);
/* Whether type of obj has a Python method `name` (str/list/dict); sets *unsafe for mutators. */
bool tpl_has_method(tv obj, const char *name, size_t n, bool *unsafe);
int tpl_call_method(tpl_rt *rt, const tfunc *f, tv *args, int nargs, const char **kwnames,
                    tv *kwvals, int nkw, tv *out);
int64_t tpl_rt_now(tpl_rt *rt);

/* ---- string operations shared by methods and filters (methods.c) ---- */
/* Python strip; chars not a string = whitespace. Returns a view of s. */
tv tpl_strip(tv s, tv chars, bool left, bool right);
/* Case mapping: 0 lower, 1 upper, 2 title, 3 capitalize. */
int tpl_case(tpl_rt *rt, tv s, int mode, tv *out);
/* Python str.split(sep, maxsplit); sep not a string = whitespace split. */
int tpl_split(tpl_rt *rt, tv s, tv sep, int64_t maxsplit, tv *out);
int tpl_replace(tpl_rt *rt, tv s, tv old, tv new_, int64_t count, tv *out);

#endif
