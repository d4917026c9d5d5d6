/* builtins.c: Jinja's filters and tests as chat templates use them, and the
 * globals range(), namespace(), dict(), raise_exception() and strftime_now().
 * Filters follow jinja2 3.1 (filters.py) plus transformers' tojson, which is
 * json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpl_int.h"

static int oom(tpl_rt *rt) { return tpl_fail(rt, TPL_E_NOMEM, "out of memory"); }

typedef struct fargs {
    tv *pos;
    int npos;
    const char **kwn;
    tv *kwv;
    int nkw;
} fargs;

/* Argument `idx` (0-based, after the filtered value) or keyword `name`. */
static bool getarg(const fargs *a, int idx, const char *name, tv *out) {
    if (idx >= 0 && idx < a->npos) {
        *out = a->pos[idx];
        return true;
    }
    for (int k = 0; k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) {
            *out = a->kwv[k];
            return true;
        }
    return false;
}

static bool argbool(const fargs *a, int idx, const char *name, bool def) {
    tv v;
    return getarg(a, idx, name, &v) ? tpl_truthy(v) : def;
}

/* ---- attribute getters (jinja's make_attrgetter: dotted path, digits index) ---- */

static int attr_path(tpl_rt *rt, tv item, tv path, tv *out) {
    if (path.t != TV_STR) return tpl_getitem(rt, item, path, out);
    size_t st = 0;
    tv cur = item;
    for (size_t i = 0; i <= path.n; i++) {
        if (i < path.n && path.u.s[i] != '.') continue;
        const char *p = path.u.s + st;
        size_t n = i - st;
        bool digits = n > 0;
        for (size_t k = 0; k < n; k++) digits &= p[k] >= '0' && p[k] <= '9';
        tv key = digits ? tv_int(strtoll(p, NULL, 10)) : tv_strn(p, n);
        if (n > 18 && digits) key = tv_strn(p, n);
        if (tpl_getitem(rt, cur, key, &cur)) return -1;
        st = i + 1;
    }
    *out = cur;
    return 0;
}

static int lower_key(tpl_rt *rt, tv v, bool case_sensitive, tv *out) {
    if (!case_sensitive && v.t == TV_STR) return tpl_case(rt, v, 0, out);
    *out = v;
    return 0;
}

/* Stable merge sort of idx[0..n) by keys (ascending or descending). */
static int sort_idx(tpl_rt *rt, uint32_t *idx, uint32_t n, const tv *keys, bool reverse) {
    if (n < 2) return 0;
    uint32_t *tmp = tpl_arena_alloc(tpl_rt_arena(rt), sizeof(uint32_t) * n);
    if (!tmp) return oom(rt);
    if (tpl_step(rt, n)) return -1;
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                bool lt;
                /* take from the right only when strictly before the left item */
                if (reverse ? tpl_less(rt, keys[idx[a]], keys[idx[b]], &lt)
                            : tpl_less(rt, keys[idx[b]], keys[idx[a]], &lt))
                    return -1;
                tmp[k++] = lt ? idx[b++] : idx[a++];
            }
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, sizeof(uint32_t) * n);
    }
    return 0;
}

static tlist *new_list(tpl_rt *rt, uint8_t kind, uint32_t cap) {
    tlist *l = tpl_list_new(tpl_rt_arena(rt), kind, cap);
    if (!l) oom(rt);
    return l;
}

static int push(tpl_rt *rt, tlist *l, tv v) { return tpl_list_push(tpl_rt_arena(rt), l, v) ? oom(rt) : 0; }

static int need_iter(tpl_rt *rt, tv v, tlist **out) {
    if (tpl_iterate(rt, v, out)) return -1;
    return tpl_step(rt, (*out)->n);
}

/* select/reject/selectattr/rejectattr */
static int do_select(tpl_rt *rt, tv v, const fargs *a, bool attr, bool want, tv *out) {
    tlist *items, *res;
    if (!tpl_truthy(v)) v = tv_undef(); /* jinja: `if value:` before iterating */
    if (need_iter(rt, v, &items) || !(res = new_list(rt, TL_GEN, 0))) return -1;
    int first = 0;
    tv path = tv_none();
    if (attr) {
        if (!getarg(a, 0, "attribute", &path)) return tpl_fail(rt, TPL_E_TYPE, "selectattr needs an attribute");
        first = 1;
    }
    tv testname = tv_none();
    bool has_test = first < a->npos;
    if (has_test) testname = a->pos[first];
    char tname[64] = "";
    if (has_test) {
        if (testname.t != TV_STR) return tpl_fail(rt, TPL_E_TYPE, "test name must be a string");
        snprintf(tname, sizeof tname, "%.*s", (int)(testname.n < 63 ? testname.n : 63), testname.u.s);
    }
    for (uint32_t i = 0; i < items->n; i++) {
        tv x = items->v[i];
        if (attr && attr_path(rt, x, path, &x)) return -1;
        bool r;
        if (has_test) {
            if (tpl_test(rt, tname, x, a->pos + first + 1, a->npos - first - 1, &r)) return -1;
        } else {
            r = tpl_truthy(x);
        }
        if (r == want && push(rt, res, items->v[i])) return -1;
    }
    *out = tpl_mklist(res);
    return 0;
}

static int do_map(tpl_rt *rt, tv v, const fargs *a, tv *out) {
    tlist *items, *res;
    if (!tpl_truthy(v)) v = tv_undef(); /* jinja: `if value:` before iterating */
    if (need_iter(rt, v, &items) || !(res = new_list(rt, TL_GEN, items->n))) return -1;
    tv path, def;
    bool has_def = getarg(a, -1, "default", &def);
    if (getarg(a, -1, "attribute", &path)) {
        for (uint32_t i = 0; i < items->n; i++) {
            tv x;
            if (attr_path(rt, items->v[i], path, &x)) return -1;
            if (x.t == TV_UNDEF && has_def) x = def;
            res->v[res->n++] = x;
        }
    } else {
        if (a->npos < 1 || a->pos[0].t != TV_STR) return tpl_fail(rt, TPL_E_TYPE, "map needs a filter name");
        char fname[64];
        snprintf(fname, sizeof fname, "%.*s", (int)(a->pos[0].n < 63 ? a->pos[0].n : 63), a->pos[0].u.s);
        for (uint32_t i = 0; i < items->n; i++) {
            tv x;
            if (tpl_filter(rt, fname, items->v[i], a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw, &x)) return -1;
            res->v[res->n++] = x;
        }
    }
    *out = tpl_mklist(res);
    return 0;
}

/* sort / unique / min / max share key extraction */
static int keyed(tpl_rt *rt, tlist *items, const fargs *a, int cs_idx, int attr_idx, tv **keys_out) {
    bool cs = argbool(a, cs_idx, "case_sensitive", false);
    tv path;
    bool has_path = getarg(a, attr_idx, "attribute", &path);
    tv *keys = tpl_arena_alloc(tpl_rt_arena(rt), sizeof(tv) * (items->n ? items->n : 1));
    if (!keys) return oom(rt);
    for (uint32_t i = 0; i < items->n; i++) {
        tv k = items->v[i];
        if (has_path && path.t != TV_NONE && attr_path(rt, k, path, &k)) return -1;
        if (lower_key(rt, k, cs, &keys[i])) return -1;
    }
    *keys_out = keys;
    return 0;
}

static int do_sort(tpl_rt *rt, tv v, const fargs *a, tv *out) {
    tlist *items, *res;
    tv *keys;
    if (need_iter(rt, v, &items) || keyed(rt, items, a, 1, 2, &keys)) return -1;
    uint32_t *idx = tpl_arena_alloc(tpl_rt_arena(rt), sizeof(uint32_t) * (items->n ? items->n : 1));
    if (!idx) return oom(rt);
    for (uint32_t i = 0; i < items->n; i++) idx[i] = i;
    if (sort_idx(rt, idx, items->n, keys, argbool(a, 0, "reverse", false))) return -1;
    if (!(res = new_list(rt, TL_LIST, items->n))) return -1;
    for (uint32_t i = 0; i < items->n; i++) res->v[i] = items->v[idx[i]];
    res->n = items->n;
    *out = tpl_mklist(res);
    return 0;
}

static int do_dictsort(tpl_rt *rt, tv v, const fargs *a, tv *out) {
    if (v.t != TV_DICT || v.u.d->kind != TD_DICT)
        return tpl_fail(rt, TPL_E_TYPE, "dictsort: can only sort a mapping");
    tdict *d = v.u.d;
    bool cs = argbool(a, 0, "case_sensitive", false), rev = argbool(a, 2, "reverse", false);
    tv by = tv_strn("key", 3);
    getarg(a, 1, "by", &by);
    bool by_value = tpl_str_eq(by, "value");
    if (!by_value && !tpl_str_eq(by, "key")) return tpl_fail(rt, TPL_E_TYPE, "You can only sort by either \"key\" or \"value\"");
    tv *keys = tpl_arena_alloc(tpl_rt_arena(rt), sizeof(tv) * (d->n ? d->n : 1));
    uint32_t *idx = tpl_arena_alloc(tpl_rt_arena(rt), sizeof(uint32_t) * (d->n ? d->n : 1));
    if (!keys || !idx) return oom(rt);
    for (uint32_t i = 0; i < d->n; i++) {
        idx[i] = i;
        if (lower_key(rt, by_value ? d->v[i] : d->k[i], cs, &keys[i])) return -1;
    }
    if (sort_idx(rt, idx, d->n, keys, rev)) return -1;
    tlist *res = new_list(rt, TL_LIST, d->n);
    if (!res) return -1;
    for (uint32_t i = 0; i < d->n; i++) {
        tlist *p = new_list(rt, TL_TUPLE, 2);
        if (!p) return -1;
        p->v[0] = d->k[idx[i]];
        p->v[1] = d->v[idx[i]];
        p->n = 2;
        res->v[res->n++] = tpl_mklist(p);
    }
    *out = tpl_mklist(res);
    return 0;
}

static int do_unique(tpl_rt *rt, tv v, const fargs *a, tv *out) {
    tlist *items, *res, *seen;
    tv *keys;
    if (need_iter(rt, v, &items) || keyed(rt, items, a, 0, 1, &keys)) return -1;
    if (!(res = new_list(rt, TL_GEN, 0)) || !(seen = new_list(rt, TL_LIST, 0))) return -1;
    for (uint32_t i = 0; i < items->n; i++) {
        bool dup = false;
        if (tpl_step(rt, seen->n)) return -1;
        for (uint32_t j = 0; j < seen->n && !dup; j++) dup = tpl_equal(seen->v[j], keys[i]);
        if (dup) continue;
        if (push(rt, seen, keys[i]) || push(rt, res, items->v[i])) return -1;
    }
    *out = tpl_mklist(res);
    return 0;
}

static int do_minmax(tpl_rt *rt, tv v, const fargs *a, bool want_max, tv *out) {
    tlist *items;
    tv *keys;
    if (need_iter(rt, v, &items) || keyed(rt, items, a, 0, 1, &keys)) return -1;
    if (!items->n) {
        *out = tv_undef();
        return 0;
    }
    uint32_t best = 0;
    for (uint32_t i = 1; i < items->n; i++) {
        bool lt;
        if (want_max ? tpl_less(rt, keys[best], keys[i], &lt) : tpl_less(rt, keys[i], keys[best], &lt)) return -1;
        if (lt) best = i;
    }
    *out = items->v[best];
    return 0;
}

static int do_indent(tpl_rt *rt, tv v, const fargs *a, tv *out) {
    tv s, width = tv_int(4);
    if (tpl_str_of(rt, v, &s)) return -1;
    getarg(a, 0, "width", &width);
    bool first = argbool(a, 1, "first", false), blank = argbool(a, 2, "blank", false);
    tpl_sb ind;
    tpl_sb_init(&ind, tpl_rt_arena(rt), 0);
    if (width.t == TV_STR) tpl_sb_put(&ind, width.u.s, width.n);
    else if (width.t == TV_INT && width.u.i > 0 && width.u.i < 100000)
        for (int64_t i = 0; i < width.u.i; i++) tpl_sb_putc(&ind, ' ');
    else if (width.t != TV_INT) return tpl_fail(rt, TPL_E_TYPE, "indent width must be an int or str");
    /* lines of s + "\n" via splitlines */
    tpl_sb src;
    tpl_sb_init(&src, tpl_rt_arena(rt), 0);
    tpl_sb_put(&src, s.u.s, s.n);
    tpl_sb_putc(&src, '\n');
    if (src.failed || ind.failed) return oom(rt);
    fargs none = {0};
    tv lines;
    (void)none;
    tfunc f = {0};
    f.kind = FN_METHOD;
    f.self = tpl_sb_value(&src);
    f.name = "splitlines";
    if (tpl_call_method(rt, &f, NULL, 0, NULL, NULL, 0, &lines)) return -1;
    tlist *L = lines.u.l;
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    if (first) tpl_sb_put(&b, ind.p, ind.n);
    for (uint32_t i = 0; i < L->n; i++) {
        if (i) {
            tpl_sb_putc(&b, '\n');
            if (blank || L->v[i].n) tpl_sb_put(&b, ind.p, ind.n);
        }
        tpl_sb_put(&b, L->v[i].u.s, L->v[i].n);
    }
    if (b.failed) return oom(rt);
    *out = tpl_sb_value(&b);
    return 0;
}

/* Python int(str) (base 10): optional sign, digits with single underscores, surrounding whitespace. */
static bool parse_int(tv s, int64_t *out) {
    tv t = tpl_strip(s, tv_none(), true, true);
    char buf[40];
    size_t k = 0;
    for (uint32_t i = 0; i < t.n; i++) {
        char c = t.u.s[i];
        if (c == '_' && i > 0 && i + 1 < t.n && t.u.s[i - 1] >= '0' && t.u.s[i - 1] <= '9') continue;
        if (k + 1 >= sizeof buf) return false;
        buf[k++] = c;
    }
    buf[k] = 0;
    if (!k) return false;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (*end || buf[0] == ' ' || buf[0] == '\t' || buf[0] == '\n' || (buf[0] == '+' && buf[1] == '-')) return false;
    *out = v;
    return true;
}

static bool parse_float(tv s, double *out) {
    tv t = tpl_strip(s, tv_none(), true, true);
    char buf[64];
    if (!t.n || t.n >= sizeof buf) return false;
    memcpy(buf, t.u.s, t.n);
    buf[t.n] = 0;
    char *end;
    *out = strtod(buf, &end);
    return !*end && !(buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X'));
}

static int do_tojson(tpl_rt *rt, tv v, const fargs *a, tv *out) {
    tv ea = tv_bool(false), ind = tv_none(), seps = tv_none(), sk = tv_bool(false);
    getarg(a, 0, "ensure_ascii", &ea);
    getarg(a, 1, "indent", &ind);
    getarg(a, 2, "separators", &seps);
    getarg(a, 3, "sort_keys", &sk);
    int indent = -1;
    if (ind.t == TV_INT || ind.t == TV_BOOL) indent = ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : (int)ind.u.i;
    else if (ind.t != TV_NONE) return tpl_fail(rt, TPL_E_TYPE, "tojson: indent must be an integer");
    const char *isep = NULL, *ksep = NULL;
    if (seps.t == TV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == TV_STR && seps.u.l->v[1].t == TV_STR) {
        tv x = tpl_cstr(tpl_rt_arena(rt), ""), y;
        (void)x;
        tpl_sb s1, s2;
        tpl_sb_init(&s1, tpl_rt_arena(rt), 0);
        tpl_sb_init(&s2, tpl_rt_arena(rt), 0);
        tpl_sb_put(&s1, seps.u.l->v[0].u.s, seps.u.l->v[0].n);
        tpl_sb_putc(&s1, 0);
        tpl_sb_put(&s2, seps.u.l->v[1].u.s, seps.u.l->v[1].n);
        tpl_sb_putc(&s2, 0);
        if (s1.failed || s2.failed) return oom(rt);
        isep = s1.p;
        ksep = s2.p;
        (void)y;
    } else if (seps.t != TV_NONE) {
        return tpl_fail(rt, TPL_E_TYPE, "tojson: separators must be a pair of strings");
    }
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    if (tpl_tojson(rt, &b, v, indent, tpl_truthy(ea), isep, ksep, tpl_truthy(sk), 0)) return -1;
    if (b.failed) return oom(rt);
    *out = tpl_sb_value(&b);
    return 0;
}

static int as_str(tpl_rt *rt, tv v, tv *s) {
    if (v.t == TV_STR) {
        *s = v;
        return 0;
    }
    return tpl_str_of(rt, v, s);
}

int tpl_filter(tpl_rt *rt, const char *name, tv v, tv *args, int nargs, const char **kwnames, tv *kwvals, int nkw,
               tv *out) {
    fargs a = {args, nargs, kwnames, kwvals, nkw};
    tv s, x, y;
    tlist *items, *res;
#define IS(n) (!strcmp(name, n))
    if (IS("default") || IS("d")) {
        tv def = tv_strn("", 0);
        getarg(&a, 0, "default_value", &def);
        bool boolean = argbool(&a, 1, "boolean", false);
        *out = (v.t == TV_UNDEF || (boolean && !tpl_truthy(v))) ? def : v;
        return 0;
    }
    if (IS("length") || IS("count")) {
        int64_t n;
        if (tpl_len(rt, v, &n)) return -1;
        *out = tv_int(n);
        return 0;
    }
    if (IS("tojson")) return do_tojson(rt, v, &a, out);
    if (IS("string")) return as_str(rt, v, out);
    if (IS("safe")) {
        if (as_str(rt, v, out)) return -1;
        out->k = TS_MARKUP;
        return 0;
    }
    if (IS("escape") || IS("e") || IS("forceescape")) return tpl_escape(rt, v, out);
    if (IS("trim")) {
        tv chars = tv_none();
        getarg(&a, 0, "chars", &chars);
        if (as_str(rt, v, &s)) return -1;
        *out = tpl_strip(s, chars, true, true);
        return 0;
    }
    if (IS("lower") || IS("upper") || IS("title") || IS("capitalize")) {
        if (as_str(rt, v, &s)) return -1;
        return tpl_case(rt, s, IS("lower") ? 0 : IS("upper") ? 1 : IS("title") ? 2 : 3, out);
    }
    if (IS("replace")) {
        tv cnt = tv_none();
        if (!getarg(&a, 0, "old", &x) || !getarg(&a, 1, "new", &y))
            return tpl_fail(rt, TPL_E_TYPE, "replace needs old and new");
        getarg(&a, 2, "count", &cnt);
        if (tpl_str_of(rt, v, &s) || tpl_str_of(rt, x, &x) || tpl_str_of(rt, y, &y)) return -1;
        return tpl_replace(rt, s, x, y, cnt.t == TV_INT ? cnt.u.i : -1, out);
    }
    if (IS("join")) {
        tv sep = tv_strn("", 0), path;
        getarg(&a, 0, "d", &sep);
        bool has_path = getarg(&a, 1, "attribute", &path);
        if (need_iter(rt, v, &items) || tpl_str_of(rt, sep, &sep)) return -1;
        tpl_sb b;
        tpl_sb_init(&b, tpl_rt_arena(rt), 0);
        for (uint32_t i = 0; i < items->n; i++) {
            tv it = items->v[i];
            if (has_path && attr_path(rt, it, path, &it)) return -1;
            if (i) tpl_sb_put(&b, sep.u.s, sep.n);
            if (tpl_write_str(rt, &b, it)) return -1;
        }
        if (b.failed) return oom(rt);
        *out = tpl_sb_value(&b);
        return 0;
    }
    if (IS("items")) {
        if (v.t == TV_UNDEF) {
            if (!(res = new_list(rt, TL_GEN, 0))) return -1;
            *out = tpl_mklist(res);
            return 0;
        }
        if (v.t != TV_DICT || v.u.d->kind != TD_DICT)
            return tpl_fail(rt, TPL_E_TYPE, "Can only get item pairs from a mapping.");
        tfunc f = {0};
        f.kind = FN_METHOD;
        f.self = v;
        f.name = "items";
        return tpl_call_method(rt, &f, NULL, 0, NULL, NULL, 0, out);
    }
    if (IS("list")) {
        if (need_iter(rt, v, &items) || !(res = new_list(rt, TL_LIST, items->n))) return -1;
        if (items->n) memcpy(res->v, items->v, sizeof(tv) * items->n);
        res->n = items->n;
        *out = tpl_mklist(res);
        return 0;
    }
    if (IS("selectattr")) return do_select(rt, v, &a, true, true, out);
    if (IS("rejectattr")) return do_select(rt, v, &a, true, false, out);
    if (IS("select")) return do_select(rt, v, &a, false, true, out);
    if (IS("reject")) return do_select(rt, v, &a, false, false, out);
    if (IS("map")) return do_map(rt, v, &a, out);
    if (IS("sort")) return do_sort(rt, v, &a, out);
    if (IS("dictsort")) return do_dictsort(rt, v, &a, out);
    if (IS("unique")) return do_unique(rt, v, &a, out);
    if (IS("min")) return do_minmax(rt, v, &a, false, out);
    if (IS("max")) return do_minmax(rt, v, &a, true, out);
    if (IS("indent")) return do_indent(rt, v, &a, out);
    if (IS("int")) {
        tv def = tv_int(0);
        getarg(&a, 0, "default", &def);
        int64_t i;
        double d;
        if (v.t == TV_UNDEF) return tpl_fail(rt, TPL_E_UNDEFINED, "undefined value passed to int");
        if (v.t == TV_INT || v.t == TV_BOOL) *out = tv_int(v.u.i);
        else if (v.t == TV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) *out = tv_int((int64_t)v.u.f);
        else if (v.t == TV_STR && parse_int(v, &i)) *out = tv_int(i);
        else if (v.t == TV_STR && parse_float(v, &d) && isfinite(d) && fabs(d) < 9.2e18) *out = tv_int((int64_t)d);
        else *out = def;
        return 0;
    }
    if (IS("float")) {
        tv def = tv_float(0.0);
        getarg(&a, 0, "default", &def);
        double d;
        if (v.t == TV_UNDEF) return tpl_fail(rt, TPL_E_UNDEFINED, "undefined value passed to float");
        if (tv_is_num(v)) *out = tv_float(v.t == TV_FLOAT ? v.u.f : (double)v.u.i);
        else if (v.t == TV_STR && parse_float(v, &d)) *out = tv_float(d);
        else *out = def;
        return 0;
    }
    if (IS("abs")) {
        if (v.t == TV_FLOAT) *out = tv_float(fabs(v.u.f));
        else if ((v.t == TV_INT || v.t == TV_BOOL) && v.u.i != INT64_MIN) *out = tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else return tpl_fail(rt, TPL_E_TYPE, "bad operand type for abs(): '%s'", tpl_type_name(v));
        return 0;
    }
    if (IS("round")) {
        tv prec = tv_int(0), method = tv_strn("common", 6);
        getarg(&a, 0, "precision", &prec);
        getarg(&a, 1, "method", &method);
        if (!tv_is_num(v) || prec.t != TV_INT) return tpl_fail(rt, TPL_E_TYPE, "round needs a number");
        double d = v.t == TV_FLOAT ? v.u.f : (double)v.u.i, m = pow(10.0, (double)prec.u.i);
        if (tpl_str_eq(method, "floor")) d = floor(d * m) / m;
        else if (tpl_str_eq(method, "ceil")) d = ceil(d * m) / m;
        else d = nearbyint(d * m) / m;
        *out = v.t == TV_FLOAT || !tpl_str_eq(method, "common") ? tv_float(d) : tv_int((int64_t)d);
        return 0;
    }
    if (IS("first") || IS("last")) {
        if (need_iter(rt, v, &items)) return -1;
        *out = items->n ? items->v[IS("first") ? 0 : items->n - 1] : tv_undef();
        return 0;
    }
    if (IS("reverse")) {
        if (v.t == TV_STR) {
            if (need_iter(rt, v, &items)) return -1;
            tpl_sb b;
            tpl_sb_init(&b, tpl_rt_arena(rt), 0);
            for (uint32_t i = items->n; i > 0; i--) tpl_sb_put(&b, items->v[i - 1].u.s, items->v[i - 1].n);
            if (b.failed) return oom(rt);
            *out = tpl_sb_value(&b);
            return 0;
        }
        if (need_iter(rt, v, &items) || !(res = new_list(rt, TL_GEN, items->n))) return -1;
        for (uint32_t i = 0; i < items->n; i++) res->v[i] = items->v[items->n - 1 - i];
        res->n = items->n;
        *out = tpl_mklist(res);
        return 0;
    }
    if (IS("sum")) {
        tv path, acc = tv_int(0);
        bool has_path = getarg(&a, 0, "attribute", &path);
        getarg(&a, 1, "start", &acc);
        if (need_iter(rt, v, &items)) return -1;
        for (uint32_t i = 0; i < items->n; i++) {
            tv it = items->v[i];
            if (has_path && attr_path(rt, it, path, &it)) return -1;
            if (!tv_is_num(it) || !tv_is_num(acc)) return tpl_fail(rt, TPL_E_TYPE, "sum of non-numbers");
            if (acc.t == TV_FLOAT || it.t == TV_FLOAT)
                acc = tv_float((acc.t == TV_FLOAT ? acc.u.f : (double)acc.u.i) + (it.t == TV_FLOAT ? it.u.f : (double)it.u.i));
            else if (__builtin_add_overflow(acc.u.i, it.u.i, &acc.u.i))
                return tpl_fail(rt, TPL_E_TYPE, "integer overflow");
            else acc.t = TV_INT;
        }
        *out = acc;
        return 0;
    }
    if (IS("wordcount")) {
        if (tpl_str_of(rt, v, &s) || tpl_split(rt, s, tv_none(), -1, &x)) return -1;
        *out = tv_int(x.u.l->n);
        return 0;
    }
    if (IS("attr")) {
        if (!getarg(&a, 0, "name", &x) || x.t != TV_STR) return tpl_fail(rt, TPL_E_TYPE, "attr needs a name");
        return tpl_getattr(rt, v, x.u.s, x.n, out);
    }
    if (IS("pprint")) {
        tpl_sb b;
        tpl_sb_init(&b, tpl_rt_arena(rt), 0);
        if (tpl_repr(rt, &b, v, 0)) return -1;
        *out = tpl_sb_value(&b);
        return 0;
    }
#undef IS
    return tpl_fail(rt, TPL_E_TYPE, "No filter named '%s'.", name);
}

/* ---- tests ---- */

int tpl_test(tpl_rt *rt, const char *name, tv v, tv *args, int nargs, bool *res) {
    tv a0 = nargs > 0 ? args[0] : tv_undef();
    bool lt;
#define IS(n) (!strcmp(name, n))
    if (IS("defined")) *res = v.t != TV_UNDEF;
    else if (IS("undefined")) *res = v.t == TV_UNDEF;
    else if (IS("none")) *res = v.t == TV_NONE;
    else if (IS("string")) *res = v.t == TV_STR;
    else if (IS("mapping")) *res = v.t == TV_DICT && v.u.d->kind == TD_DICT;
    else if (IS("iterable")) *res = v.t == TV_UNDEF || v.t == TV_STR || v.t == TV_LIST || (v.t == TV_DICT && v.u.d->kind == TD_DICT);
    else if (IS("sequence")) *res = v.t == TV_UNDEF || v.t == TV_STR || (v.t == TV_LIST && v.u.l->kind != TL_GEN) || (v.t == TV_DICT && v.u.d->kind == TD_DICT);
    else if (IS("boolean")) *res = v.t == TV_BOOL;
    else if (IS("false")) *res = v.t == TV_BOOL && !v.u.i;
    else if (IS("true")) *res = v.t == TV_BOOL && v.u.i;
    else if (IS("number")) *res = tv_is_num(v);
    else if (IS("integer")) *res = v.t == TV_INT;
    else if (IS("float")) *res = v.t == TV_FLOAT;
    else if (IS("callable")) *res = v.t == TV_FUNC || v.t == TV_UNDEF;
    else if (IS("escaped")) *res = v.t == TV_STR && v.k == TS_MARKUP;
    else if (IS("equalto") || IS("eq") || IS("==")) *res = tpl_equal(v, a0);
    else if (IS("ne") || IS("!=")) *res = !tpl_equal(v, a0);
    else if (IS("sameas")) *res = v.t == a0.t && (v.t >= TV_STR ? v.u.l == a0.u.l && v.n == a0.n : tpl_equal(v, a0));
    else if (IS("lt") || IS("<") || IS("lessthan")) {
        if (tpl_less(rt, v, a0, &lt)) return -1;
        *res = lt;
    } else if (IS("gt") || IS(">") || IS("greaterthan")) {
        if (tpl_less(rt, a0, v, &lt)) return -1;
        *res = lt;
    } else if (IS("le") || IS("<=")) {
        if (tpl_less(rt, a0, v, &lt)) return -1;
        *res = !lt;
    } else if (IS("ge") || IS(">=")) {
        if (tpl_less(rt, v, a0, &lt)) return -1;
        *res = !lt;
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (v.t != TV_INT && v.t != TV_BOOL) return tpl_fail(rt, TPL_E_TYPE, "test '%s' needs an integer", name);
        int64_t m = IS("divisibleby") ? (a0.t == TV_INT ? a0.u.i : 0) : 2;
        if (m == 0) return tpl_fail(rt, TPL_E_TYPE, "integer division or modulo by zero");
        int64_t r = m == -1 ? 0 : v.u.i % m;
        *res = IS("odd") ? r != 0 : r == 0;
    } else if (IS("in")) {
        *res = false;
        if (a0.t == TV_STR && v.t == TV_STR) *res = v.n == 0 || (v.n <= a0.n && memmem(a0.u.s, a0.n, v.u.s, v.n));
        else if (a0.t == TV_LIST)
            for (uint32_t i = 0; i < a0.u.l->n && !*res; i++) *res = tpl_equal(a0.u.l->v[i], v);
        else if (a0.t == TV_DICT) *res = tpl_dict_get(a0.u.d, v, NULL);
        else if (a0.t != TV_UNDEF) return tpl_fail(rt, TPL_E_TYPE, "argument of type '%s' is not iterable", tpl_type_name(a0));
    } else if (IS("lower") || IS("upper")) {
        tv s, c;
        if (tpl_str_of(rt, v, &s) || tpl_case(rt, s, IS("lower") ? 0 : 1, &c)) return -1;
        bool cased = false;
        for (uint32_t i = 0; i < s.n; i++) cased |= (s.u.s[i] >= 'a' && s.u.s[i] <= 'z') || (s.u.s[i] >= 'A' && s.u.s[i] <= 'Z') || (unsigned char)s.u.s[i] >= 0x80;
        *res = cased && tpl_equal(s, c);
    } else {
        return tpl_fail(rt, TPL_E_TYPE, "No test named '%s'.", name);
    }
#undef IS
    return 0;
}

/* ---- globals ---- */

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };
static tfunc g_funcs[] = {
    {FN_BUILTIN, G_RANGE, NULL, NULL, {0}, "range"},
    {FN_BUILTIN, G_NAMESPACE, NULL, NULL, {0}, "namespace"},
    {FN_BUILTIN, G_DICT, NULL, NULL, {0}, "dict"},
    {FN_BUILTIN, G_RAISE, NULL, NULL, {0}, "raise_exception"},
    {FN_BUILTIN, G_STRFTIME, NULL, NULL, {0}, "strftime_now"},
};

bool tpl_global(const char *name, size_t n, tv *out, tpl_arena *ar) {
    (void)ar;
    for (size_t i = 0; i < sizeof g_funcs / sizeof g_funcs[0]; i++)
        if (strlen(g_funcs[i].name) == n && !memcmp(g_funcs[i].name, name, n)) {
            memset(out, 0, sizeof *out);
            out->t = TV_FUNC;
            out->u.fn = &g_funcs[i];
            return true;
        }
    return false;
}

static int make_dict(tpl_rt *rt, uint8_t kind, tv *args, int nargs, const char **kwn, tv *kwv, int nkw, tv *out) {
    tpl_arena *ar = tpl_rt_arena(rt);
    tdict *d = tpl_dict_new(ar, kind);
    if (!d) return oom(rt);
    if (nargs > 1) return tpl_fail(rt, TPL_E_TYPE, "expected at most 1 positional argument");
    if (nargs == 1) {
        tv src = args[0];
        if (src.t == TV_DICT && src.u.d->kind != TD_LOOP) {
            for (uint32_t i = 0; i < src.u.d->n; i++)
                if (tpl_dict_set(ar, d, src.u.d->k[i], src.u.d->v[i])) return oom(rt);
        } else {
            tlist *items;
            if (tpl_iterate(rt, src, &items)) return -1;
            for (uint32_t i = 0; i < items->n; i++) {
                tv p = items->v[i];
                if (p.t != TV_LIST || p.u.l->n != 2) return tpl_fail(rt, TPL_E_TYPE, "dictionary update sequence element has wrong length");
                if (tpl_dict_set(ar, d, p.u.l->v[0], p.u.l->v[1])) return oom(rt);
            }
        }
    }
    for (int k = 0; k < nkw; k++)
        if (tpl_dict_set(ar, d, tpl_cstr(ar, kwn[k]), kwv[k])) return oom(rt);
    *out = tpl_mkdict(d);
    return 0;
}

int tpl_call_builtin(tpl_rt *rt, const tfunc *f, tv *args, int nargs, const char **kwn, tv *kwv, int nkw, tv *out) {
    switch (f->id) {
    case G_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (nargs < 1 || nargs > 3 || nkw) return tpl_fail(rt, TPL_E_TYPE, "range expected 1 to 3 arguments");
        for (int i = 0; i < nargs; i++)
            if (args[i].t != TV_INT && args[i].t != TV_BOOL)
                return tpl_fail(rt, TPL_E_TYPE, "'%s' object cannot be interpreted as an integer", tpl_type_name(args[i]));
        if (nargs == 1) stop = args[0].u.i;
        else {
            start = args[0].u.i;
            stop = args[1].u.i;
            if (nargs == 3) step = args[2].u.i;
        }
        if (step == 0) return tpl_fail(rt, TPL_E_TYPE, "range() arg 3 must not be zero");
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                              : ceil(((double)start - (double)stop) / (double)-step);
        if (cnt < 0) cnt = 0;
        if (cnt > 1e8) return tpl_fail(rt, TPL_E_LIMIT, "range() too large");
        if (tpl_step(rt, (uint64_t)cnt)) return -1;
        tlist *l = new_list(rt, TL_LIST, (uint32_t)cnt);
        if (!l) return -1;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) l->v[l->n++] = tv_int(i);
        *out = tpl_mklist(l);
        return 0;
    }
    case G_NAMESPACE: return make_dict(rt, TD_NS, args, nargs, kwn, kwv, nkw, out);
    case G_DICT: return make_dict(rt, TD_DICT, args, nargs, kwn, kwv, nkw, out);
    case G_RAISE: {
        tv s = tv_strn("", 0);
        if (nargs > 0 && tpl_str_of(rt, args[0], &s)) return -1;
        return tpl_fail(rt, TPL_E_RAISE, "%.*s", (int)s.n, s.u.s);
    }
    case G_STRFTIME: {
        if (nargs < 1 || args[0].t != TV_STR) return tpl_fail(rt, TPL_E_TYPE, "strftime_now needs a format string");
        time_t t = (time_t)tpl_rt_now(rt);
        struct tm tm;
        if (!localtime_r(&t, &tm)) return tpl_fail(rt, TPL_E_TYPE, "bad time");
        char fmt[256], buf[512];
        if (args[0].n >= sizeof fmt) return tpl_fail(rt, TPL_E_LIMIT, "strftime format too long");
        memcpy(fmt, args[0].u.s, args[0].n);
        fmt[args[0].n] = 0;
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        if (n == 0 && fmt[0]) buf[0] = 0;
        *out = tpl_cstr(tpl_rt_arena(rt), buf);
        return 0;
    }
    }
    return tpl_fail(rt, TPL_E_TYPE, "unknown builtin");
}
