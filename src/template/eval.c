/* eval.c: the tree-walking evaluator and the public compile/render API.
 *
 * Scoping follows jinja2: `if` opens no scope; `for` bodies and macro calls get
 * their own frame (one frame per loop, kept across iterations); a name is looked
 * up through the frame chain (a macro's chain starts at the frame it was defined
 * in), then the globals, else it is undefined. Work is bounded by
 * tpl_options: steps (loop iterations, macro calls), depth, output and memory. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../core/alloc.h"
#include "tpl_int.h"

struct tpl_template {
    tpl_arena ar;
    tpl_node *root;
};

typedef struct tpl_frame {
    struct tpl_frame *parent;
    tdict *vars;
} tpl_frame;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

struct tpl_rt {
    tpl_arena ar;
    tpl_options opt;
    tpl_sb *out;
    int line;
    int depth;
    uint64_t steps;
    int ctl;
    tv bodyval;
    bool failed;
    tpl_errkind kind;
    char msg[512];
};

tpl_arena *tpl_rt_arena(tpl_rt *rt) { return &rt->ar; }
int64_t tpl_rt_now(tpl_rt *rt) { return rt->opt.now; }

int tpl_fail(tpl_rt *rt, tpl_errkind kind, const char *fmt, ...) {
    if (rt->failed) return -1;
    rt->failed = true;
    rt->kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->msg, sizeof rt->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int tpl_step(tpl_rt *rt, uint64_t n) {
    rt->steps += n;
    if (rt->steps > rt->opt.max_steps)
        return tpl_fail(rt, TPL_E_LIMIT, "template exceeded %llu steps (loop iterations and calls)",
                        (unsigned long long)rt->opt.max_steps);
    return 0;
}

static int nomem(tpl_rt *rt) {
    if (rt->ar.hit_limit)
        return tpl_fail(rt, TPL_E_LIMIT, "template exceeded its memory limit (%zu bytes)", rt->opt.max_memory);
    return tpl_fail(rt, TPL_E_NOMEM, "out of memory");
}

static int sb_check(tpl_rt *rt, tpl_sb *b) {
    if (!b->failed) return 0;
    if (b->over_limit)
        return tpl_fail(rt, TPL_E_LIMIT, "template output exceeded %zu bytes", rt->opt.max_output);
    return nomem(rt);
}

static tpl_frame *frame_new(tpl_rt *rt, tpl_frame *parent) {
    tpl_frame *f = tpl_arena_alloc(&rt->ar, sizeof *f);
    if (!f || !(f->vars = tpl_dict_new(&rt->ar, TD_DICT))) {
        nomem(rt);
        return NULL;
    }
    f->parent = parent;
    return f;
}

static int frame_set(tpl_rt *rt, tpl_frame *f, tv name, tv val) {
    if (tpl_dict_set(&rt->ar, f->vars, name, val)) return nomem(rt);
    return 0;
}

static tv lookup(tpl_rt *rt, tpl_frame *f, tv name) {
    for (; f; f = f->parent) {
        tdict *d = f->vars;
        for (uint32_t i = 0; i < d->n; i++)
            if (d->k[i].n == name.n && !memcmp(d->k[i].u.s, name.u.s, name.n)) return d->v[i];
    }
    tv g;
    if (tpl_global(name.u.s, name.n, &g, &rt->ar)) return g;
    tv u = tv_undef();
    u.u.s = name.u.s;
    u.n = name.n;
    return u;
}

static int undef_error(tpl_rt *rt, tv u) {
    if (u.k == TU_UNSAFE)
        return tpl_fail(rt, TPL_E_SECURITY, "access to attribute '%.*s' of object is unsafe.", (int)u.n,
                        u.u.s ? u.u.s : "");
    if (u.u.s) return tpl_fail(rt, TPL_E_UNDEFINED, "'%.*s' is undefined", (int)u.n, u.u.s);
    return tpl_fail(rt, TPL_E_UNDEFINED, "undefined value used");
}

static tv undef_named(const char *s, size_t n) {
    tv u = tv_undef();
    u.u.s = s;
    u.n = (uint32_t)n;
    return u;
}

/* ---- attribute and item access ---- */

static int loop_attr(tpl_rt *rt, tdict *d, const char *name, size_t n, tv *out) {
    tlist *items = d->k[0].u.l;
    int64_t i = d->v[0].u.i, len = items->n;
#define IS(s) (n == strlen(s) && !memcmp(name, s, n))
    if (IS("index")) *out = tv_int(i + 1);
    else if (IS("index0")) *out = tv_int(i);
    else if (IS("revindex")) *out = tv_int(len - i);
    else if (IS("revindex0")) *out = tv_int(len - i - 1);
    else if (IS("first")) *out = tv_bool(i == 0);
    else if (IS("last")) *out = tv_bool(i == len - 1);
    else if (IS("length")) *out = tv_int(len);
    else if (IS("depth")) *out = tv_int(1);
    else if (IS("depth0")) *out = tv_int(0);
    else if (IS("previtem")) *out = i > 0 ? items->v[i - 1] : undef_named("previtem", 8);
    else if (IS("nextitem")) *out = i + 1 < len ? items->v[i + 1] : undef_named("nextitem", 8);
    else *out = undef_named(name, n);
#undef IS
    (void)rt;
    return 0;
}

static int method_or_undef(tpl_rt *rt, tv obj, const char *name, size_t n, tv *out) {
    bool unsafe = false;
    if ((obj.t == TV_STR || obj.t == TV_LIST || (obj.t == TV_DICT && obj.u.d->kind == TD_DICT)) &&
        tpl_has_method(obj, name, n, &unsafe)) {
        if (unsafe) {
            *out = undef_named(name, n);
            out->k = TU_UNSAFE;
            return 0;
        }
        tfunc *fn = tpl_arena_alloc(&rt->ar, sizeof *fn);
        char *nm = tpl_arena_alloc(&rt->ar, n + 1);
        if (!fn || !nm) return nomem(rt);
        memcpy(nm, name, n);
        fn->kind = FN_METHOD;
        fn->self = obj;
        fn->name = nm;
        out->t = TV_FUNC;
        out->u.fn = fn;
        return 0;
    }
    *out = undef_named(name, n);
    return 0;
}

int tpl_getattr(tpl_rt *rt, tv obj, const char *name, size_t n, tv *out) {
    switch (obj.t) {
    case TV_UNDEF: return undef_error(rt, obj);
    case TV_DICT:
        if (obj.u.d->kind == TD_LOOP) return loop_attr(rt, obj.u.d, name, n, out);
        if (obj.u.d->kind == TD_NS) {
            if (!tpl_dict_get(obj.u.d, tv_strn(name, n), out)) *out = undef_named(name, n);
            return 0;
        }
        {
            bool unsafe;
            if (!tpl_has_method(obj, name, n, &unsafe) && tpl_dict_get(obj.u.d, tv_strn(name, n), out))
                return 0;
        }
        return method_or_undef(rt, obj, name, n, out);
    default: return method_or_undef(rt, obj, name, n, out);
    }
}

/* Python index normalisation; false when out of range. */
static bool norm_index(int64_t i, int64_t len, int64_t *out) {
    if (i < 0) i += len;
    if (i < 0 || i >= len) return false;
    *out = i;
    return true;
}

/* Byte offset of code point `cp` in s (cp may equal the count). */
static size_t cp_offset(const char *s, size_t n, int64_t cp) {
    size_t i = 0;
    for (int64_t k = 0; k < cp && i < n; k++) tpl_utf8_next(s, n, &i);
    return i;
}

int tpl_getitem(tpl_rt *rt, tv obj, tv key, tv *out) {
    if (obj.t == TV_UNDEF) return undef_error(rt, obj);
    bool intkey = key.t == TV_INT || key.t == TV_BOOL;
    if (obj.t == TV_DICT && obj.u.d->kind == TD_DICT) {
        if (tpl_dict_get(obj.u.d, key, out)) return 0;
    } else if (obj.t == TV_LIST && obj.u.l->kind != TL_GEN && intkey) {
        int64_t i;
        if (norm_index(key.u.i, obj.u.l->n, &i)) {
            *out = obj.u.l->v[i];
            return 0;
        }
    } else if (obj.t == TV_STR && intkey) {
        int64_t len = (int64_t)tpl_utf8_len(obj.u.s, obj.n), i;
        if (norm_index(key.u.i, len, &i)) {
            size_t a = cp_offset(obj.u.s, obj.n, i), b = a;
            tpl_utf8_next(obj.u.s, obj.n, &b);
            *out = tv_strn(obj.u.s + a, b - a);
            return 0;
        }
    }
    if (key.t == TV_STR) return tpl_getattr(rt, obj, key.u.s, key.n, out);
    *out = tv_undef();
    return 0;
}

/* Python slice bounds (start/stop/step already validated as ints or None). */
static void slice_bounds(int64_t len, tv s0, tv s1, int64_t step, int64_t *start, int64_t *stop) {
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
    if (s0.t == TV_NONE) *start = step < 0 ? hi : lo;
    else {
        *start = s0.u.i;
        if (*start < 0) {
            *start += len;
            if (*start < lo) *start = lo;
        } else if (*start > hi) *start = hi;
    }
    if (s1.t == TV_NONE) *stop = step < 0 ? lo : hi;
    else {
        *stop = s1.u.i;
        if (*stop < 0) {
            *stop += len;
            if (*stop < lo) *stop = lo;
        } else if (*stop > hi) *stop = hi;
    }
}

static int do_slice(tpl_rt *rt, tv obj, tv s0, tv s1, tv s2, tv *out) {
    if (obj.t == TV_UNDEF) return undef_error(rt, obj);
    tv *parts[3] = {&s0, &s1, &s2};
    for (int k = 0; k < 3; k++) {
        if (parts[k]->t == TV_UNDEF) parts[k]->t = TV_NONE;
        if (parts[k]->t == TV_BOOL) parts[k]->t = TV_INT;
        if (parts[k]->t != TV_NONE && parts[k]->t != TV_INT) {
            *out = tv_undef(); /* TypeError, swallowed by jinja's getitem */
            return 0;
        }
    }
    int64_t step = s2.t == TV_NONE ? 1 : s2.u.i;
    if (step == 0) return tpl_fail(rt, TPL_E_TYPE, "slice step cannot be zero");
    bool is_str = obj.t == TV_STR;
    if (!is_str && !(obj.t == TV_LIST && obj.u.l->kind != TL_GEN)) {
        *out = tv_undef();
        return 0;
    }
    int64_t len = is_str ? (int64_t)tpl_utf8_len(obj.u.s, obj.n) : obj.u.l->n;
    int64_t start, stop;
    slice_bounds(len, s0, s1, step, &start, &stop);
    if (is_str && step == 1) {
        if (stop < start) stop = start;
        size_t a = cp_offset(obj.u.s, obj.n, start);
        size_t b = a + cp_offset(obj.u.s + a, obj.n - a, stop - start);
        *out = tv_strn(obj.u.s + a, b - a);
        return 0;
    }
    tlist *src = NULL;
    if (is_str) {
        if (tpl_iterate(rt, obj, &src)) return -1;
    } else {
        src = obj.u.l;
    }
    tlist *l = tpl_list_new(&rt->ar, is_str ? TL_LIST : src->kind, 0);
    if (!l) return nomem(rt);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        if (tpl_list_push(&rt->ar, l, src->v[i])) return nomem(rt);
    if (!is_str) {
        *out = tpl_mklist(l);
        return 0;
    }
    tpl_sb b;
    tpl_sb_init(&b, &rt->ar, 0);
    for (uint32_t i = 0; i < l->n; i++) tpl_sb_put(&b, l->v[i].u.s, l->v[i].n);
    if (sb_check(rt, &b)) return -1;
    *out = tpl_sb_value(&b);
    return 0;
}

/* ---- operators ---- */

static int concat_str(tpl_rt *rt, tv a, tv b, tv *out) {
    tpl_sb sb;
    tpl_sb_init(&sb, &rt->ar, 0);
    tpl_sb_put(&sb, a.u.s, a.n);
    tpl_sb_put(&sb, b.u.s, b.n);
    if (sb_check(rt, &sb)) return -1;
    if ((uint64_t)a.n + b.n > UINT32_MAX) return tpl_fail(rt, TPL_E_LIMIT, "string too long");
    *out = tpl_sb_value(&sb);
    return 0;
}

static int type_error2(tpl_rt *rt, const char *op, tv a, tv b) {
    if (a.t == TV_UNDEF) return undef_error(rt, a);
    if (b.t == TV_UNDEF) return undef_error(rt, b);
    return tpl_fail(rt, TPL_E_TYPE, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                    tpl_type_name(a), tpl_type_name(b));
}

static int repeat(tpl_rt *rt, tv seq, int64_t k, tv *out) {
    if (k < 0) k = 0;
    if (seq.t == TV_STR) {
        if (seq.n && (uint64_t)k > (uint64_t)(UINT32_MAX / 2) / seq.n)
            return tpl_fail(rt, TPL_E_LIMIT, "string repetition too large");
        tpl_sb b;
        tpl_sb_init(&b, &rt->ar, 0);
        for (int64_t i = 0; i < k && !b.failed; i++) tpl_sb_put(&b, seq.u.s, seq.n);
        if (sb_check(rt, &b)) return -1;
        *out = tpl_sb_value(&b);
        out->k = seq.k;
        return 0;
    }
    tlist *s = seq.u.l;
    if (s->n && (uint64_t)k > (uint64_t)(UINT32_MAX / 4) / s->n)
        return tpl_fail(rt, TPL_E_LIMIT, "list repetition too large");
    if (tpl_step(rt, (uint64_t)k * s->n)) return -1;
    tlist *l = tpl_list_new(&rt->ar, s->kind, (uint32_t)(k * s->n));
    if (!l) return nomem(rt);
    for (int64_t i = 0; i < k; i++)
        for (uint32_t j = 0; j < s->n; j++) l->v[l->n++] = s->v[j];
    *out = tpl_mklist(l);
    return 0;
}

static double fnum(tv v) { return v.t == TV_FLOAT ? v.u.f : (double)v.u.i; }

static int py_mod_format(tpl_rt *rt, tv fmt, tv args, tv *out);

static int binop(tpl_rt *rt, int op, tv a, tv b, tv *out) {
    bool nums = tv_is_num(a) && tv_is_num(b), ints = nums && a.t != TV_FLOAT && b.t != TV_FLOAT;
    switch (op) {
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(a.u.i, b.u.i, &out->u.i)) goto overflow;
            out->t = TV_INT;
            return 0;
        }
        if (nums) {
            *out = tv_float(fnum(a) + fnum(b));
            return 0;
        }
        if (a.t == TV_STR && b.t == TV_STR) {
            if (a.k == TS_MARKUP && b.k != TS_MARKUP) {
                if (tpl_escape(rt, b, &b)) return -1;
            } else if (b.k == TS_MARKUP && a.k != TS_MARKUP) {
                if (tpl_escape(rt, a, &a)) return -1;
            }
            bool mk = a.k == TS_MARKUP || b.k == TS_MARKUP;
            if (concat_str(rt, a, b, out)) return -1;
            out->k = mk ? TS_MARKUP : TS_PLAIN;
            return 0;
        }
        if (a.t == TV_LIST && b.t == TV_LIST && a.u.l->kind == b.u.l->kind && a.u.l->kind != TL_GEN) {
            uint64_t n = (uint64_t)a.u.l->n + b.u.l->n;
            if (n > UINT32_MAX / 4) return tpl_fail(rt, TPL_E_LIMIT, "list too long");
            tlist *l = tpl_list_new(&rt->ar, a.u.l->kind, (uint32_t)n);
            if (!l) return nomem(rt);
            if (a.u.l->n) memcpy(l->v, a.u.l->v, sizeof(tv) * a.u.l->n);
            if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, sizeof(tv) * b.u.l->n);
            l->n = (uint32_t)n;
            *out = tpl_mklist(l);
            return 0;
        }
        if (a.t == TV_STR && b.t != TV_UNDEF)
            return tpl_fail(rt, TPL_E_TYPE, "can only concatenate str (not \"%s\") to str", tpl_type_name(b));
        return type_error2(rt, "+", a, b);
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(a.u.i, b.u.i, &out->u.i)) goto overflow;
            out->t = TV_INT;
            return 0;
        }
        if (nums) {
            *out = tv_float(fnum(a) - fnum(b));
            return 0;
        }
        return type_error2(rt, "-", a, b);
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(a.u.i, b.u.i, &out->u.i)) goto overflow;
            out->t = TV_INT;
            return 0;
        }
        if (nums) {
            *out = tv_float(fnum(a) * fnum(b));
            return 0;
        }
        if ((a.t == TV_STR || (a.t == TV_LIST && a.u.l->kind != TL_GEN)) && (b.t == TV_INT || b.t == TV_BOOL))
            return repeat(rt, a, b.u.i, out);
        if ((b.t == TV_STR || (b.t == TV_LIST && b.u.l->kind != TL_GEN)) && (a.t == TV_INT || a.t == TV_BOOL))
            return repeat(rt, b, a.u.i, out);
        return type_error2(rt, "*", a, b);
    case OP_DIV:
        if (!nums) return type_error2(rt, "/", a, b);
        if (fnum(b) == 0) return tpl_fail(rt, TPL_E_TYPE, "division by zero");
        *out = tv_float(fnum(a) / fnum(b));
        return 0;
    case OP_FLOORDIV:
    case OP_MOD:
        if (op == OP_MOD && a.t == TV_STR) return py_mod_format(rt, a, b, out);
        if (!nums) return type_error2(rt, op == OP_MOD ? "%" : "//", a, b);
        if (fnum(b) == 0) return tpl_fail(rt, TPL_E_TYPE, "integer division or modulo by zero");
        if (ints) {
            if (a.u.i == INT64_MIN && b.u.i == -1) goto overflow;
            int64_t q = a.u.i / b.u.i, r = a.u.i % b.u.i;
            if (r != 0 && ((r < 0) != (b.u.i < 0))) {
                q--;
                r += b.u.i;
            }
            *out = tv_int(op == OP_MOD ? r : q);
            return 0;
        }
        {
            double x = fnum(a), y = fnum(b), m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            *out = tv_float(op == OP_MOD ? m : floor((x - m) / y + 0.5 * 0) );
            if (op == OP_FLOORDIV) *out = tv_float(floor(x / y));
            return 0;
        }
    case OP_POW:
        if (!nums) return type_error2(rt, "**", a, b);
        if (ints && b.u.i >= 0) {
            int64_t r = 1, base = a.u.i;
            for (int64_t e = b.u.i; e > 0; e--) {
                if (__builtin_mul_overflow(r, base, &r)) goto overflow;
                if (r == 0 || r == 1) break;
            }
            *out = tv_int(r);
            return 0;
        }
        *out = tv_float(pow(fnum(a), fnum(b)));
        return 0;
    }
    return tpl_fail(rt, TPL_E_TYPE, "unknown operator");
overflow:
    return tpl_fail(rt, TPL_E_TYPE, "integer overflow");
}

/* printf-style `str % args` for %s %d %i %r %%. */
static int py_mod_format(tpl_rt *rt, tv fmt, tv args, tv *out) {
    tlist one = {TL_TUPLE, 1, 1, &args};
    tlist *al = args.t == TV_LIST && args.u.l->kind == TL_TUPLE ? args.u.l : &one;
    uint32_t ai = 0;
    tpl_sb b;
    tpl_sb_init(&b, &rt->ar, 0);
    for (uint32_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if (c != '%') {
            tpl_sb_putc(&b, c);
            continue;
        }
        if (++i >= fmt.n) return tpl_fail(rt, TPL_E_TYPE, "incomplete format");
        c = fmt.u.s[i];
        if (c == '%') {
            tpl_sb_putc(&b, '%');
            continue;
        }
        if (ai >= al->n) return tpl_fail(rt, TPL_E_TYPE, "not enough arguments for format string");
        tv v = al->v[ai++];
        if (c == 's') {
            if (tpl_write_str(rt, &b, v)) return -1;
        } else if (c == 'r') {
            if (tpl_repr(rt, &b, v, 0)) return -1;
        } else if (c == 'd' || c == 'i') {
            if (!tv_is_num(v)) return tpl_fail(rt, TPL_E_TYPE, "%%d format: a real number is required");
            tpl_sb_printf(&b, "%lld", (long long)(v.t == TV_FLOAT ? (int64_t)v.u.f : v.u.i));
        } else {
            return tpl_fail(rt, TPL_E_TYPE, "unsupported format character '%c'", c);
        }
    }
    if (ai < al->n) return tpl_fail(rt, TPL_E_TYPE, "not all arguments converted during string formatting");
    if (sb_check(rt, &b)) return -1;
    *out = tpl_sb_value(&b);
    return 0;
}

static int contains(tpl_rt *rt, tv container, tv item, bool *res) {
    switch (container.t) {
    case TV_STR:
        if (item.t != TV_STR)
            return tpl_fail(rt, TPL_E_TYPE, "'in <string>' requires string as left operand, not %s",
                            tpl_type_name(item));
        *res = item.n == 0 || (item.n <= container.n && memmem(container.u.s, container.n, item.u.s, item.n));
        return 0;
    case TV_LIST:
        *res = false;
        for (uint32_t i = 0; i < container.u.l->n && !*res; i++) *res = tpl_equal(container.u.l->v[i], item);
        return 0;
    case TV_DICT:
        if (container.u.d->kind != TD_DICT) break;
        *res = tpl_dict_get(container.u.d, item, NULL);
        return 0;
    case TV_UNDEF: *res = false; return 0;
    default: break;
    }
    return tpl_fail(rt, TPL_E_TYPE, "argument of type '%s' is not iterable", tpl_type_name(container));
}

/* ---- evaluation ---- */

static int eval(tpl_rt *rt, tpl_frame *f, const tpl_node *n, tv *out);
static int exec_list(tpl_rt *rt, tpl_frame *f, tpl_node *const *v, uint32_t n);

#define MAX_ARGS 32

typedef struct callargs {
    tv pos[MAX_ARGS];
    const char *kwn[MAX_ARGS];
    tv kwv[MAX_ARGS];
    int npos, nkw;
} callargs;

static int eval_args(tpl_rt *rt, tpl_frame *f, const tpl_node *n, callargs *a) {
    a->npos = a->nkw = 0;
    if (n->nkids > MAX_ARGS) return tpl_fail(rt, TPL_E_TYPE, "too many arguments");
    for (uint32_t i = 0; i < n->nkids; i++) {
        const tpl_node *k = n->kids[i];
        if (k->kind == N_KWARG) {
            char *nm = tpl_arena_alloc(&rt->ar, k->lit.n + 1);
            if (!nm) return nomem(rt);
            memcpy(nm, k->lit.u.s, k->lit.n);
            a->kwn[a->nkw] = nm;
            if (eval(rt, f, k->a, &a->kwv[a->nkw])) return -1;
            a->nkw++;
        } else {
            if (eval(rt, f, k, &a->pos[a->npos])) return -1;
            a->npos++;
        }
    }
    return 0;
}

static int call_macro(tpl_rt *rt, const tfunc *fn, tv *args, int nargs, const char **kwn, tv *kwv, int nkw,
                      tv *out) {
    const tpl_node *m = fn->macro;
    if (nargs > (int)m->nkids)
        return tpl_fail(rt, TPL_E_TYPE, "macro '%s' takes not more than %u argument(s)", fn->name, m->nkids);
    if (tpl_step(rt, 1)) return -1;
    if (++rt->depth > rt->opt.max_depth)
        return tpl_fail(rt, TPL_E_LIMIT, "macro calls nested deeper than %d", rt->opt.max_depth);
    tpl_frame *mf = frame_new(rt, fn->closure);
    if (!mf) return -1;
    for (uint32_t i = 0; i < m->nkids; i++) {
        const tpl_node *p = m->kids[i];
        tv v;
        bool have = false;
        if ((int)i < nargs) {
            v = args[i];
            have = true;
        }
        for (int k = 0; k < nkw; k++)
            if (strlen(kwn[k]) == p->lit.n && !memcmp(kwn[k], p->lit.u.s, p->lit.n)) {
                if (have) return tpl_fail(rt, TPL_E_TYPE, "macro '%s' got multiple values for argument '%s'",
                                          fn->name, kwn[k]);
                v = kwv[k];
                have = true;
            }
        if (!have) {
            if (p->a) {
                if (eval(rt, mf, p->a, &v)) return -1;
            } else {
                v = undef_named(p->lit.u.s, p->lit.n);
            }
        }
        if (frame_set(rt, mf, p->lit, v)) return -1;
    }
    for (int k = 0; k < nkw; k++) {
        bool found = false;
        for (uint32_t i = 0; i < m->nkids && !found; i++)
            found = strlen(kwn[k]) == m->kids[i]->lit.n && !memcmp(kwn[k], m->kids[i]->lit.u.s, m->kids[i]->lit.n);
        if (!found) return tpl_fail(rt, TPL_E_TYPE, "macro '%s' takes no keyword argument '%s'", fn->name, kwn[k]);
    }
    tpl_sb sb, *saved = rt->out;
    tpl_sb_init(&sb, &rt->ar, rt->opt.max_output);
    rt->out = &sb;
    int rc = exec_list(rt, mf, m->kids2, m->nkids2);
    rt->out = saved;
    rt->ctl = CTL_NONE;
    if (rc) return -1;
    if (sb_check(rt, &sb)) return -1;
    *out = tpl_sb_value(&sb);
    rt->depth--;
    return 0;
}

int tpl_call_value(tpl_rt *rt, tv fn, tv *args, int nargs, const char **kwnames, tv *kwvals, int nkw, tv *out) {
    if (fn.t == TV_UNDEF) return undef_error(rt, fn);
    if (fn.t != TV_FUNC) return tpl_fail(rt, TPL_E_TYPE, "'%s' object is not callable", tpl_type_name(fn));
    switch (fn.u.fn->kind) {
    case FN_MACRO: return call_macro(rt, fn.u.fn, args, nargs, kwnames, kwvals, nkw, out);
    case FN_BUILTIN: return tpl_call_builtin(rt, fn.u.fn, args, nargs, kwnames, kwvals, nkw, out);
    default: return tpl_call_method(rt, fn.u.fn, args, nargs, kwnames, kwvals, nkw, out);
    }
}

static int eval(tpl_rt *rt, tpl_frame *f, const tpl_node *n, tv *out) {
    rt->line = n->line;
    if (++rt->depth > rt->opt.max_depth + 400)
        return tpl_fail(rt, TPL_E_LIMIT, "evaluation nested too deeply");
    int rc = 0;
    tv a, b;
    switch (n->kind) {
    case N_LIT: *out = n->lit; break;
    case N_NAME: *out = lookup(rt, f, n->lit); break;
    case N_BODYVAL: *out = rt->bodyval; break;
    case N_LIST:
    case N_TUPLE: {
        tlist *l = tpl_list_new(&rt->ar, n->kind == N_LIST ? TL_LIST : TL_TUPLE, n->nkids);
        if (!l) return nomem(rt);
        for (uint32_t i = 0; i < n->nkids; i++)
            if (eval(rt, f, n->kids[i], &l->v[i])) return -1;
        l->n = n->nkids;
        *out = tpl_mklist(l);
        break;
    }
    case N_DICT: {
        tdict *d = tpl_dict_new(&rt->ar, TD_DICT);
        if (!d) return nomem(rt);
        for (uint32_t i = 0; i < n->nkids; i++) {
            if (eval(rt, f, n->kids[i]->a, &a) || eval(rt, f, n->kids[i]->b, &b)) return -1;
            if (a.t == TV_LIST && a.u.l->kind != TL_TUPLE) return tpl_fail(rt, TPL_E_TYPE, "unhashable type: 'list'");
            if (a.t == TV_DICT) return tpl_fail(rt, TPL_E_TYPE, "unhashable type: 'dict'");
            if (tpl_dict_set(&rt->ar, d, a, b)) return nomem(rt);
        }
        *out = tpl_mkdict(d);
        break;
    }
    case N_ATTR:
        if (eval(rt, f, n->a, &a)) return -1;
        rc = tpl_getattr(rt, a, n->lit.u.s, n->lit.n, out);
        break;
    case N_ITEM:
        if (eval(rt, f, n->a, &a)) return -1;
        if (n->b->kind == N_SLICE) {
            tv s[3] = {tv_none(), tv_none(), tv_none()};
            const tpl_node *p[3] = {n->b->a, n->b->b, n->b->c};
            for (int k = 0; k < 3; k++)
                if (p[k] && eval(rt, f, p[k], &s[k])) return -1;
            rc = do_slice(rt, a, s[0], s[1], s[2], out);
        } else {
            if (eval(rt, f, n->b, &b)) return -1;
            rc = tpl_getitem(rt, a, b, out);
        }
        break;
    case N_CALL: {
        callargs ca;
        if (eval(rt, f, n->a, &a) || eval_args(rt, f, n, &ca)) return -1;
        rt->line = n->line;
        rc = tpl_call_value(rt, a, ca.pos, ca.npos, ca.kwn, ca.kwv, ca.nkw, out);
        break;
    }
    case N_FILTER: {
        callargs ca;
        if (eval(rt, f, n->a, &a) || eval_args(rt, f, n, &ca)) return -1;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n->lit.n < 63 ? n->lit.n : 63), n->lit.u.s);
        rt->line = n->line;
        rc = tpl_filter(rt, name, a, ca.pos, ca.npos, ca.kwn, ca.kwv, ca.nkw, out);
        break;
    }
    case N_TEST: {
        callargs ca;
        if (eval(rt, f, n->a, &a) || eval_args(rt, f, n, &ca)) return -1;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n->lit.n < 63 ? n->lit.n : 63), n->lit.u.s);
        bool res = false;
        rt->line = n->line;
        rc = tpl_test(rt, name, a, ca.pos, ca.npos, &res);
        *out = tv_bool(res);
        break;
    }
    case N_UNARY:
        if (eval(rt, f, n->a, &a)) return -1;
        if (a.t == TV_UNDEF) return undef_error(rt, a);
        if (!tv_is_num(a))
            return tpl_fail(rt, TPL_E_TYPE, "bad operand type for unary %c: '%s'", n->op == OP_NEG ? '-' : '+',
                            tpl_type_name(a));
        if (n->op == OP_POS) *out = a.t == TV_BOOL ? tv_int(a.u.i) : a;
        else if (a.t == TV_FLOAT) *out = tv_float(-a.u.f);
        else if (a.u.i == INT64_MIN) return tpl_fail(rt, TPL_E_TYPE, "integer overflow");
        else *out = tv_int(-a.u.i);
        break;
    case N_BIN:
        if (eval(rt, f, n->a, &a) || eval(rt, f, n->b, &b)) return -1;
        rt->line = n->line;
        rc = binop(rt, n->op, a, b, out);
        break;
    case N_AND:
        if (eval(rt, f, n->a, &a)) return -1;
        if (!tpl_truthy(a)) *out = a;
        else rc = eval(rt, f, n->b, out);
        break;
    case N_OR:
        if (eval(rt, f, n->a, &a)) return -1;
        if (tpl_truthy(a)) *out = a;
        else rc = eval(rt, f, n->b, out);
        break;
    case N_NOT:
        if (eval(rt, f, n->a, &a)) return -1;
        *out = tv_bool(!tpl_truthy(a));
        break;
    case N_COND:
        if (eval(rt, f, n->a, &a)) return -1;
        if (tpl_truthy(a)) rc = eval(rt, f, n->b, out);
        else if (n->c) rc = eval(rt, f, n->c, out);
        else *out = tv_undef();
        break;
    case N_CMP: {
        if (eval(rt, f, n->a, &a)) return -1;
        bool res = true;
        for (uint32_t i = 0; i < n->nkids && res; i++) {
            const tpl_node *o = n->kids[i];
            if (eval(rt, f, o->a, &b)) return -1;
            rt->line = o->line;
            bool lt;
            switch (o->op) {
            case OP_EQ: res = tpl_equal(a, b); break;
            case OP_NE: res = !tpl_equal(a, b); break;
            case OP_LT: if (tpl_less(rt, a, b, &lt)) return -1; res = lt; break;
            case OP_GT: if (tpl_less(rt, b, a, &lt)) return -1; res = lt; break;
            case OP_LE: if (tpl_less(rt, b, a, &lt)) return -1; res = !lt; break;
            case OP_GE: if (tpl_less(rt, a, b, &lt)) return -1; res = !lt; break;
            case OP_IN: if (contains(rt, b, a, &res)) return -1; break;
            case OP_NOTIN: if (contains(rt, b, a, &res)) return -1; res = !res; break;
            }
            a = b;
        }
        *out = tv_bool(res);
        break;
    }
    case N_CONCAT: {
        tpl_sb sb;
        tpl_sb_init(&sb, &rt->ar, rt->opt.max_output);
        for (uint32_t i = 0; i < n->nkids; i++) {
            if (eval(rt, f, n->kids[i], &a) || tpl_write_str(rt, &sb, a)) return -1;
        }
        if (sb_check(rt, &sb)) return -1;
        *out = tpl_sb_value(&sb);
        break;
    }
    default: return tpl_fail(rt, TPL_E_TYPE, "cannot evaluate this node");
    }
    rt->depth--;
    return rc;
}

int tpl_eval(tpl_rt *rt, const tpl_node *n, tv *out) { return eval(rt, NULL, n, out); }

/* ---- statements ---- */

static int assign(tpl_rt *rt, tpl_frame *f, const tpl_node *target, tv v) {
    if (target->kind == N_NAME) return frame_set(rt, f, target->lit, v);
    if (target->kind == N_ATTR) {
        tv ns = lookup(rt, f, target->a->lit);
        if (ns.t != TV_DICT || ns.u.d->kind != TD_NS)
            return tpl_fail(rt, TPL_E_TYPE, "cannot assign attribute on non-namespace object");
        if (tpl_dict_set(&rt->ar, ns.u.d, target->lit, v)) return nomem(rt);
        return 0;
    }
    /* tuple unpacking */
    tlist *items;
    if (v.t == TV_UNDEF) return undef_error(rt, v);
    if (tpl_iterate(rt, v, &items)) return -1;
    if (items->n != target->nkids)
        return tpl_fail(rt, TPL_E_TYPE, "%s values to unpack (expected %u, got %u)",
                        items->n < target->nkids ? "not enough" : "too many", target->nkids, items->n);
    for (uint32_t i = 0; i < target->nkids; i++)
        if (frame_set(rt, f, target->kids[i]->lit, items->v[i])) return -1;
    return 0;
}

static int exec_for(tpl_rt *rt, tpl_frame *f, const tpl_node *n) {
    tv it;
    if (eval(rt, f, n->b, &it)) return -1;
    tlist *items;
    if (tpl_iterate(rt, it, &items)) return -1;
    tpl_frame *lf = frame_new(rt, f);
    if (!lf) return -1;
    if (n->c) { /* for x in xs if cond: filter first, so loop.* counts the kept items */
        tlist *kept = tpl_list_new(&rt->ar, TL_LIST, 0);
        if (!kept) return nomem(rt);
        for (uint32_t i = 0; i < items->n; i++) {
            tv c;
            if (tpl_step(rt, 1) || assign(rt, lf, n->a, items->v[i]) || eval(rt, lf, n->c, &c)) return -1;
            if (tpl_truthy(c) && tpl_list_push(&rt->ar, kept, items->v[i])) return nomem(rt);
        }
        items = kept;
    }
    if (items->n == 0) return exec_list(rt, f, n->kids2, n->nkids2);
    tdict *loop = tpl_dict_new(&rt->ar, TD_LOOP);
    if (!loop || tpl_dict_set(&rt->ar, loop, tv_int(-1), tv_int(0))) return nomem(rt);
    loop->k[0] = tpl_mklist(items);
    tv loopv = tpl_mkdict(loop);
    if (frame_set(rt, lf, tv_strn("loop", 4), loopv)) return -1;
    for (uint32_t i = 0; i < items->n; i++) {
        if (tpl_step(rt, 1)) return -1;
        loop->v[0] = tv_int(i);
        if (frame_set(rt, lf, tv_strn("loop", 4), loopv)) return -1;
        if (assign(rt, lf, n->a, items->v[i])) return -1;
        if (exec_list(rt, lf, n->kids, n->nkids)) return -1;
        if (rt->ctl == CTL_BREAK) {
            rt->ctl = CTL_NONE;
            break;
        }
        rt->ctl = CTL_NONE;
    }
    return 0;
}

static int render_body(tpl_rt *rt, tpl_frame *f, tpl_node *const *v, uint32_t nv, tv *out) {
    tpl_sb sb, *saved = rt->out;
    tpl_sb_init(&sb, &rt->ar, rt->opt.max_output);
    rt->out = &sb;
    int rc = exec_list(rt, f, v, nv);
    rt->out = saved;
    if (rc || sb_check(rt, &sb)) return -1;
    *out = tpl_sb_value(&sb);
    return 0;
}

static int exec_stmt(tpl_rt *rt, tpl_frame *f, const tpl_node *n) {
    tv v;
    rt->line = n->line;
    switch (n->kind) {
    case S_TEXT:
        tpl_sb_put(rt->out, n->lit.u.s, n->lit.n);
        return sb_check(rt, rt->out);
    case S_OUT:
        if (eval(rt, f, n->a, &v) || tpl_write_str(rt, rt->out, v)) return -1;
        return sb_check(rt, rt->out);
    case S_IF:
        if (eval(rt, f, n->a, &v)) return -1;
        if (tpl_truthy(v)) return exec_list(rt, f, n->kids, n->nkids);
        return exec_list(rt, f, n->kids2, n->nkids2);
    case S_FOR: return exec_for(rt, f, n);
    case S_SET:
        if (eval(rt, f, n->b, &v)) return -1;
        return assign(rt, f, n->a, v);
    case S_SETBLOCK:
        if (render_body(rt, f, n->kids, n->nkids, &v)) return -1;
        if (n->c) {
            tv saved = rt->bodyval;
            rt->bodyval = v;
            int rc = eval(rt, f, n->c, &v);
            rt->bodyval = saved;
            if (rc) return -1;
        }
        return assign(rt, f, n->a, v);
    case S_MACRO: {
        tfunc *fn = tpl_arena_alloc(&rt->ar, sizeof *fn);
        char *nm = tpl_arena_alloc(&rt->ar, n->lit.n + 1);
        if (!fn || !nm) return nomem(rt);
        memcpy(nm, n->lit.u.s, n->lit.n);
        fn->kind = FN_MACRO;
        fn->macro = n;
        fn->closure = f;
        fn->name = nm;
        tv m = {0};
        m.t = TV_FUNC;
        m.u.fn = fn;
        return frame_set(rt, f, n->lit, m);
    }
    case S_FILTERBLOCK: {
        if (render_body(rt, f, n->kids, n->nkids, &v)) return -1;
        tv saved = rt->bodyval;
        rt->bodyval = v;
        int rc = eval(rt, f, n->a, &v);
        rt->bodyval = saved;
        if (rc || tpl_write_str(rt, rt->out, v)) return -1;
        return sb_check(rt, rt->out);
    }
    case S_BREAK: rt->ctl = CTL_BREAK; return 0;
    case S_CONTINUE: rt->ctl = CTL_CONTINUE; return 0;
    case S_BLOCK: return exec_list(rt, f, n->kids, n->nkids);
    default: return tpl_fail(rt, TPL_E_TYPE, "cannot execute this node");
    }
}

static int exec_list(tpl_rt *rt, tpl_frame *f, tpl_node *const *v, uint32_t n) {
    if (++rt->depth > rt->opt.max_depth + 400) return tpl_fail(rt, TPL_E_LIMIT, "statements nested too deeply");
    for (uint32_t i = 0; i < n; i++) {
        if (exec_stmt(rt, f, v[i])) return -1;
        if (rt->ctl) break;
    }
    rt->depth--;
    return 0;
}

/* ---- public API ---- */

hn_status tpl_compile(const char *src, size_t len, tpl_template **out, hn_err *err) {
    *out = NULL;
    tpl_template *t = hn_calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    tpl_token *toks;
    int n = tpl_lex(&t->ar, src, len, &toks, err);
    if (n < 0 || tpl_parse(&t->ar, toks, n, &t->root, err)) {
        hn_status s = err ? err->code : HN_ERR_FORMAT;
        tpl_free(t);
        return s == HN_OK ? HN_ERR_FORMAT : s;
    }
    *out = t;
    return HN_OK;
}

void tpl_free(tpl_template *t) {
    if (!t) return;
    tpl_arena_free(&t->ar);
    hn_free(t);
}

void tpl_buf_free(tpl_buf *b) {
    hn_free(b->data);
    memset(b, 0, sizeof *b);
}

hn_status tpl_render(const tpl_template *t, const json_t *vars, const tpl_options *opt, tpl_buf *out,
                     tpl_errkind *kind, hn_err *err) {
    tpl_rt *rt = hn_calloc(1, sizeof *rt);
    if (kind) *kind = TPL_E_NONE;
    if (!rt) {
        if (kind) *kind = TPL_E_NOMEM;
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    if (opt) rt->opt = *opt;
    if (!rt->opt.max_output) rt->opt.max_output = 64u << 20;
    if (!rt->opt.max_memory) rt->opt.max_memory = 512u << 20;
    if (!rt->opt.max_steps) rt->opt.max_steps = 10000000;
    if (rt->opt.max_depth <= 0) rt->opt.max_depth = 200;
    if (!rt->opt.now) rt->opt.now = (int64_t)time(NULL);
    rt->ar.limit = rt->opt.max_memory;
    tpl_sb sb;
    tpl_sb_init(&sb, &rt->ar, rt->opt.max_output);
    rt->out = &sb;
    int rc = 0;
    tpl_frame *root = frame_new(rt, NULL);
    if (!root) rc = -1;
    if (!rc && vars && json_is_object(vars)) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)vars, key, val) {
            tv v;
            if (tpl_from_json(rt, val, &v, 0) || frame_set(rt, root, tpl_cstr(&rt->ar, key), v)) {
                rc = -1;
                break;
            }
        }
    }
    if (!rc) rc = exec_list(rt, root, t->root->kids, t->root->nkids);
    if (!rc && sb.n) {
        if (out->len + sb.n + 1 > out->cap) {
            size_t cap = out->cap ? out->cap : 256;
            while (cap < out->len + sb.n + 1) cap *= 2;
            char *p = hn_realloc(out->data, cap);
            if (!p) {
                rc = tpl_fail(rt, TPL_E_NOMEM, "out of memory");
            } else {
                out->data = p;
                out->cap = cap;
            }
        }
        if (!rc) {
            memcpy(out->data + out->len, sb.p, sb.n);
            out->len += sb.n;
            out->data[out->len] = 0;
        }
    } else if (!rc && !out->data) {
        out->data = hn_malloc(1);
        if (out->data) {
            out->data[0] = 0;
            out->cap = 1;
        }
    }
    hn_status st = HN_OK;
    if (rc) {
        if (!rt->failed) tpl_fail(rt, TPL_E_TYPE, "render failed");
        if (kind) *kind = rt->kind;
        hn_status code = rt->kind == TPL_E_NOMEM ? HN_ERR_NOMEM : rt->kind == TPL_E_LIMIT ? HN_ERR_RANGE : HN_ERR_INVALID;
        if (rt->kind == TPL_E_RAISE) st = hn_errf(err, code, "%s", rt->msg);
        else st = hn_errf(err, code, "line %d: %s", rt->line, rt->msg);
        if (!err) st = code;
    }
    tpl_arena_free(&rt->ar);
    hn_free(rt);
    return st;
}
