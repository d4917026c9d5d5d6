/* methods.c: Python methods of str, list and dict values as templates call
 * them (message.content.strip(), tool.get('x'), '{}'.format(y), ...), and the
 * immutable sandbox's refusal of the mutating ones (list.append, dict.update). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tpl_int.h"

static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper",
    "lower", "title", "capitalize", "format", "join", "find", "rfind", "count", "isdigit", "isalpha",
    "isalnum", "isspace", "islower", "isupper", "splitlines", "casefold", "index", "rindex", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "sort",
                                          "reverse", "clear", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const dict_unsafe[] = {"update", "pop", "popitem", "setdefault", "clear", NULL};

static bool in_set(const char *const *set, const char *name, size_t n) {
    for (int i = 0; set[i]; i++)
        if (strlen(set[i]) == n && !memcmp(set[i], name, n)) return true;
    return false;
}

bool tpl_has_method(tv obj, const char *name, size_t n, bool *unsafe) {
    *unsafe = false;
    if (obj.t == TV_STR) return in_set(str_methods, name, n);
    if (obj.t == TV_LIST) {
        if (obj.u.l->kind == TL_GEN) return false;
        if (obj.u.l->kind == TL_LIST && in_set(list_unsafe, name, n)) return *unsafe = true;
        return in_set(list_methods, name, n) && !(obj.u.l->kind == TL_TUPLE && n == 4);
    }
    if (obj.t == TV_DICT && obj.u.d->kind == TD_DICT) {
        if (in_set(dict_unsafe, name, n)) return *unsafe = true;
        return in_set(dict_methods, name, n);
    }
    return false;
}

/* ---- string helpers ---- */

static int oom(tpl_rt *rt) { return tpl_fail(rt, TPL_E_NOMEM, "out of memory"); }

static bool cp_in(uint32_t cp, tv chars) {
    size_t i = 0;
    while (i < chars.n)
        if (tpl_utf8_next(chars.u.s, chars.n, &i) == cp) return true;
    return false;
}

/* Python str.strip/lstrip/rstrip; chars.t != TV_STR means whitespace. */
tv tpl_strip(tv s, tv chars, bool left, bool right) {
    size_t a = 0, b = s.n;
    bool ws = chars.t != TV_STR;
    if (left)
        while (a < b) {
            size_t i = a;
            uint32_t cp = tpl_utf8_next(s.u.s, b, &i);
            if (ws ? !tpl_py_isspace(cp) : !cp_in(cp, chars)) break;
            a = i;
        }
    if (right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s.u.s[k] & 0xc0) == 0x80) k--;
            size_t i = k;
            uint32_t cp = tpl_utf8_next(s.u.s, b, &i);
            if (ws ? !tpl_py_isspace(cp) : !cp_in(cp, chars)) break;
            b = k;
        }
    tv r = tv_strn(s.u.s + a, b - a);
    r.k = s.k;
    return r;
}

/* Case mapping: mode 0 lower, 1 upper, 2 title, 3 capitalize. */
int tpl_case(tpl_rt *rt, tv s, int mode, tv *out) {
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    size_t i = 0;
    bool prev_cased = false, first = true;
    while (i < s.n) {
        uint32_t cp = tpl_utf8_next(s.u.s, s.n, &i);
        uint32_t r = cp;
        if (cp <= 0x10ffff) {
            if (mode == 0) r = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            else if (mode == 1) r = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
            else if (mode == 2) {
                r = prev_cased ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)
                               : (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
                const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
                prev_cased = p->category == UTF8PROC_CATEGORY_LU || p->category == UTF8PROC_CATEGORY_LL ||
                             p->category == UTF8PROC_CATEGORY_LT;
            } else {
                r = first ? (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp)
                          : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            }
        }
        first = false;
        tpl_utf8_put(&b, r);
    }
    if (b.failed) return oom(rt);
    *out = tpl_sb_value(&b);
    out->k = s.k;
    return 0;
}

static int push(tpl_rt *rt, tlist *l, tv v) { return tpl_list_push(tpl_rt_arena(rt), l, v) ? oom(rt) : 0; }

int tpl_split(tpl_rt *rt, tv s, tv sep, int64_t maxsplit, tv *out) {
    tpl_arena *ar = tpl_rt_arena(rt);
    tlist *l = tpl_list_new(ar, TL_LIST, 0);
    if (!l) return oom(rt);
    if (sep.t != TV_STR) {
        size_t i = 0;
        while (i < s.n) {
            size_t j = i;
            uint32_t cp = tpl_utf8_next(s.u.s, s.n, &j);
            if (tpl_py_isspace(cp)) {
                i = j;
                continue;
            }
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                tv rest = tpl_strip(tv_strn(s.u.s + i, s.n - i), tv_none(), false, true);
                if (push(rt, l, rest)) return -1;
                break;
            }
            size_t st = i;
            while (i < s.n) {
                j = i;
                cp = tpl_utf8_next(s.u.s, s.n, &j);
                if (tpl_py_isspace(cp)) break;
                i = j;
            }
            if (push(rt, l, tv_strn(s.u.s + st, i - st))) return -1;
        }
    } else {
        if (sep.n == 0) return tpl_fail(rt, TPL_E_TYPE, "empty separator");
        size_t st = 0;
        for (size_t i = 0; i + sep.n <= s.n;) {
            if ((maxsplit < 0 || (int64_t)l->n < maxsplit) && !memcmp(s.u.s + i, sep.u.s, sep.n)) {
                if (push(rt, l, tv_strn(s.u.s + st, i - st))) return -1;
                i += sep.n;
                st = i;
            } else {
                i++;
            }
        }
        if (push(rt, l, tv_strn(s.u.s + st, s.n - st))) return -1;
    }
    if (tpl_step(rt, l->n)) return -1;
    *out = tpl_mklist(l);
    return 0;
}

static int rsplit(tpl_rt *rt, tv s, tv sep, int64_t maxsplit, tv *out) {
    if (maxsplit < 0 || sep.t != TV_STR) return tpl_split(rt, s, sep, maxsplit, out);
    if (sep.n == 0) return tpl_fail(rt, TPL_E_TYPE, "empty separator");
    tpl_arena *ar = tpl_rt_arena(rt);
    tlist *l = tpl_list_new(ar, TL_LIST, 0);
    if (!l) return oom(rt);
    size_t end = s.n;
    int64_t k = 0;
    for (size_t i = s.n; i >= sep.n && k < maxsplit;) {
        if (!memcmp(s.u.s + i - sep.n, sep.u.s, sep.n)) {
            if (push(rt, l, tv_strn(s.u.s + i, end - i))) return -1;
            i -= sep.n;
            end = i;
            k++;
        } else {
            i--;
        }
    }
    if (push(rt, l, tv_strn(s.u.s, end))) return -1;
    for (uint32_t a = 0, b = l->n - 1; a < b; a++, b--) {
        tv t = l->v[a];
        l->v[a] = l->v[b];
        l->v[b] = t;
    }
    *out = tpl_mklist(l);
    return 0;
}

int tpl_replace(tpl_rt *rt, tv s, tv old, tv new_, int64_t count, tv *out) {
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    int64_t done = 0;
    if (old.n == 0) {
        size_t i = 0;
        while (true) {
            if (count < 0 || done < count) {
                tpl_sb_put(&b, new_.u.s, new_.n);
                done++;
            }
            if (i >= s.n) break;
            size_t st = i;
            tpl_utf8_next(s.u.s, s.n, &i);
            tpl_sb_put(&b, s.u.s + st, i - st);
        }
    } else {
        size_t i = 0;
        while (i < s.n) {
            if ((count < 0 || done < count) && i + old.n <= s.n && !memcmp(s.u.s + i, old.u.s, old.n)) {
                tpl_sb_put(&b, new_.u.s, new_.n);
                i += old.n;
                done++;
            } else {
                tpl_sb_putc(&b, s.u.s[i++]);
            }
        }
    }
    if (b.failed) return b.over_limit ? tpl_fail(rt, TPL_E_LIMIT, "string too long") : oom(rt);
    *out = tpl_sb_value(&b);
    return 0;
}

/* str.format with {} / {0} / {name} fields, {{ and }}, !s/!r conversions. */
static int str_format(tpl_rt *rt, tv fmt, tv *args, int nargs, const char **kwn, tv *kwv, int nkw, tv *out) {
    tpl_sb b;
    tpl_sb_init(&b, tpl_rt_arena(rt), 0);
    int autoidx = 0;
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if (c == '}') {
            if (i + 1 < fmt.n && fmt.u.s[i + 1] == '}') i++;
            else return tpl_fail(rt, TPL_E_TYPE, "Single '}' encountered in format string");
            tpl_sb_putc(&b, '}');
            continue;
        }
        if (c != '{') {
            tpl_sb_putc(&b, c);
            continue;
        }
        if (i + 1 < fmt.n && fmt.u.s[i + 1] == '{') {
            tpl_sb_putc(&b, '{');
            i++;
            continue;
        }
        size_t e = i + 1;
        while (e < fmt.n && fmt.u.s[e] != '}') e++;
        if (e >= fmt.n) return tpl_fail(rt, TPL_E_TYPE, "Single '{' encountered in format string");
        const char *f = fmt.u.s + i + 1;
        size_t fl = e - i - 1, nl = 0;
        while (nl < fl && f[nl] != '!' && f[nl] != ':') nl++;
        char conv = nl + 1 < fl && f[nl] == '!' ? f[nl + 1] : 's';
        if (nl < fl && f[nl] == ':' && nl + 1 < fl)
            return tpl_fail(rt, TPL_E_TYPE, "format specs are not supported");
        tv v;
        if (nl == 0) {
            if (autoidx >= nargs) return tpl_fail(rt, TPL_E_TYPE, "Replacement index %d out of range", autoidx);
            v = args[autoidx++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            int idx = atoi(f);
            if (idx >= nargs) return tpl_fail(rt, TPL_E_TYPE, "Replacement index %d out of range", idx);
            v = args[idx];
        } else {
            bool found = false;
            for (int k = 0; k < nkw && !found; k++)
                if (strlen(kwn[k]) == nl && !memcmp(kwn[k], f, nl)) {
                    v = kwv[k];
                    found = true;
                }
            if (!found) return tpl_fail(rt, TPL_E_TYPE, "KeyError: '%.*s'", (int)nl, f);
        }
        if (v.t == TV_UNDEF) return tpl_fail(rt, TPL_E_UNDEFINED, "undefined value in format()");
        if (conv == 'r') {
            if (tpl_repr(rt, &b, v, 0)) return -1;
        } else if (tpl_write_str(rt, &b, v)) {
            return -1;
        }
        i = e;
    }
    if (b.failed) return oom(rt);
    *out = tpl_sb_value(&b);
    return 0;
}

static bool arg(tv *args, int nargs, const char **kwn, tv *kwv, int nkw, int idx, const char *name, tv *out) {
    if (idx < nargs) {
        *out = args[idx];
        return true;
    }
    for (int k = 0; k < nkw; k++)
        if (!strcmp(kwn[k], name)) {
            *out = kwv[k];
            return true;
        }
    return false;
}

static int need_str(tpl_rt *rt, tv v, const char *what) {
    if (v.t == TV_STR) return 0;
    if (v.t == TV_UNDEF) return tpl_fail(rt, TPL_E_UNDEFINED, "undefined value passed to %s()", what);
    return tpl_fail(rt, TPL_E_TYPE, "%s() argument must be str, not %s", what, tpl_type_name(v));
}

static bool prefix_match(tv s, tv p, bool end) {
    if (p.n > s.n) return false;
    return !memcmp(end ? s.u.s + s.n - p.n : s.u.s, p.u.s, p.n);
}

static int64_t cp_index(tv s, size_t byte) { return (int64_t)tpl_utf8_len(s.u.s, byte); }

static int str_method(tpl_rt *rt, tv s, const char *m, tv *args, int nargs, const char **kwn, tv *kwv, int nkw,
                      tv *out) {
    tv a0 = tv_none(), a1 = tv_none(), a2 = tv_none();
    bool h0 = arg(args, nargs, kwn, kwv, nkw, 0, "", &a0);
    bool h1 = arg(args, nargs, kwn, kwv, nkw, 1, "", &a1);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        arg(args, nargs, kwn, kwv, nkw, 0, "sep", &a0);
        tv ms = tv_int(-1);
        arg(args, nargs, kwn, kwv, nkw, 1, "maxsplit", &ms);
        if (a0.t != TV_NONE && need_str(rt, a0, m)) return -1;
        if (ms.t != TV_INT) return tpl_fail(rt, TPL_E_TYPE, "maxsplit must be an integer");
        return m[0] == 'r' ? rsplit(rt, s, a0, ms.u.i, out) : tpl_split(rt, s, a0, ms.u.i, out);
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if (h0 && a0.t != TV_NONE && need_str(rt, a0, m)) return -1;
        *out = tpl_strip(s, a0, m[0] != 'r', m[0] != 'l');
        return 0;
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool end = m[0] == 'e';
        tv sub = s;
        if (h1) {
            if (a1.t != TV_INT) return tpl_fail(rt, TPL_E_TYPE, "slice indices must be integers");
            int64_t len = (int64_t)tpl_utf8_len(s.u.s, s.n), st = a1.u.i;
            if (st < 0) st = st + len < 0 ? 0 : st + len;
            if (st > len) {
                *out = tv_bool(false);
                return 0;
            }
            size_t off = 0;
            for (int64_t k = 0; k < st; k++) tpl_utf8_next(s.u.s, s.n, &off);
            sub = tv_strn(s.u.s + off, s.n - off);
        }
        if (a0.t == TV_LIST && a0.u.l->kind == TL_TUPLE) {
            bool r = false;
            for (uint32_t i = 0; i < a0.u.l->n && !r; i++) {
                if (need_str(rt, a0.u.l->v[i], m)) return -1;
                r = prefix_match(sub, a0.u.l->v[i], end);
            }
            *out = tv_bool(r);
            return 0;
        }
        if (need_str(rt, a0, m)) return -1;
        *out = tv_bool(prefix_match(sub, a0, end));
        return 0;
    }
    if (!strcmp(m, "replace")) {
        if (need_str(rt, a0, m) || need_str(rt, a1, m)) return -1;
        tv cnt = tv_int(-1);
        arg(args, nargs, kwn, kwv, nkw, 2, "count", &cnt);
        if (cnt.t != TV_INT) return tpl_fail(rt, TPL_E_TYPE, "count must be an integer");
        return tpl_replace(rt, s, a0, a1, cnt.u.i, out);
    }
    if (!strcmp(m, "upper")) return tpl_case(rt, s, 1, out);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return tpl_case(rt, s, 0, out);
    if (!strcmp(m, "title")) return tpl_case(rt, s, 2, out);
    if (!strcmp(m, "capitalize")) return tpl_case(rt, s, 3, out);
    if (!strcmp(m, "format")) return str_format(rt, s, args, nargs, kwn, kwv, nkw, out);
    if (!strcmp(m, "join")) {
        tlist *items;
        if (!h0) return tpl_fail(rt, TPL_E_TYPE, "join() takes exactly one argument");
        if (tpl_iterate(rt, a0, &items)) return -1;
        tpl_sb b;
        tpl_sb_init(&b, tpl_rt_arena(rt), 0);
        for (uint32_t i = 0; i < items->n; i++) {
            if (items->v[i].t != TV_STR)
                return tpl_fail(rt, TPL_E_TYPE, "sequence item %u: expected str instance, %s found", i,
                                tpl_type_name(items->v[i]));
            if (i) tpl_sb_put(&b, s.u.s, s.n);
            tpl_sb_put(&b, items->v[i].u.s, items->v[i].n);
        }
        if (b.failed) return oom(rt);
        *out = tpl_sb_value(&b);
        return 0;
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") ||
        !strcmp(m, "count")) {
        if (need_str(rt, a0, m)) return -1;
        int64_t found = -1, cnt = 0;
        bool rev = m[0] == 'r';
        if (a0.n <= s.n) {
            for (size_t i = 0; i + a0.n <= s.n;) {
                size_t at = rev ? s.n - a0.n - i : i;
                if (!memcmp(s.u.s + at, a0.u.s, a0.n)) {
                    if (found < 0) found = cp_index(s, at);
                    cnt++;
                    if (m[0] != 'c') break;
                    i += a0.n ? a0.n : 1;
                } else {
                    i++;
                }
            }
        }
        if (m[0] == 'c') *out = tv_int(a0.n == 0 ? cp_index(s, s.n) + 1 : cnt);
        else if (found < 0 && (m[0] == 'i' || m[1] == 'i')) return tpl_fail(rt, TPL_E_TYPE, "substring not found");
        else *out = tv_int(found);
        return 0;
    }
    if (!strcmp(m, "splitlines")) {
        tlist *l = tpl_list_new(tpl_rt_arena(rt), TL_LIST, 0);
        if (!l) return oom(rt);
        size_t st = 0;
        for (size_t i = 0; i < s.n;) {
            size_t j = i;
            uint32_t cp = tpl_utf8_next(s.u.s, s.n, &j);
            bool nl = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
                      cp == 0x85 || cp == 0x2028 || cp == 0x2029;
            if (nl) {
                if (push(rt, l, tv_strn(s.u.s + st, i - st))) return -1;
                if (cp == '\r' && j < s.n && s.u.s[j] == '\n') j++;
                st = j;
            }
            i = j;
        }
        if (st < s.n && push(rt, l, tv_strn(s.u.s + st, s.n - st))) return -1;
        *out = tpl_mklist(l);
        return 0;
    }
    /* predicates */
    bool any = false, all = true, has_cased = false, lower = true, upper = true;
    size_t i = 0;
    while (i < s.n) {
        uint32_t cp = tpl_utf8_next(s.u.s, s.n, &i);
        any = true;
        const utf8proc_property_t *p = utf8proc_get_property(cp <= 0x10ffff ? (utf8proc_int32_t)cp : 0);
        bool alpha = p->category >= UTF8PROC_CATEGORY_LU && p->category <= UTF8PROC_CATEGORY_LO;
        bool digit = p->category == UTF8PROC_CATEGORY_ND;
        if (!strcmp(m, "isdigit")) all &= digit;
        else if (!strcmp(m, "isalpha")) all &= alpha;
        else if (!strcmp(m, "isalnum")) all &= alpha || digit;
        else if (!strcmp(m, "isspace")) all &= tpl_py_isspace(cp);
        if (p->category == UTF8PROC_CATEGORY_LU || p->category == UTF8PROC_CATEGORY_LT) {
            has_cased = true;
            lower = false;
        }
        if (p->category == UTF8PROC_CATEGORY_LL) {
            has_cased = true;
            upper = false;
        }
    }
    if (!strcmp(m, "islower")) *out = tv_bool(has_cased && lower);
    else if (!strcmp(m, "isupper")) *out = tv_bool(has_cased && upper);
    else *out = tv_bool(any && all);
    (void)a2;
    return 0;
}

int tpl_call_method(tpl_rt *rt, const tfunc *f, tv *args, int nargs, const char **kwn, tv *kwv, int nkw,
                    tv *out) {
    tv self = f->self;
    const char *m = f->name;
    tpl_arena *ar = tpl_rt_arena(rt);
    if (self.t == TV_STR) return str_method(rt, self, m, args, nargs, kwn, kwv, nkw, out);
    if (self.t == TV_LIST) {
        tlist *l = self.u.l;
        if (!strcmp(m, "copy")) {
            tlist *c = tpl_list_new(ar, TL_LIST, l->n);
            if (!c) return oom(rt);
            if (l->n) memcpy(c->v, l->v, sizeof(tv) * l->n);
            c->n = l->n;
            *out = tpl_mklist(c);
            return 0;
        }
        if (nargs < 1) return tpl_fail(rt, TPL_E_TYPE, "%s() takes exactly one argument", m);
        int64_t cnt = 0, idx = -1;
        for (uint32_t i = 0; i < l->n; i++)
            if (tpl_equal(l->v[i], args[0])) {
                if (idx < 0) idx = i;
                cnt++;
            }
        if (!strcmp(m, "count")) *out = tv_int(cnt);
        else if (idx < 0) return tpl_fail(rt, TPL_E_TYPE, "value is not in list");
        else *out = tv_int(idx);
        return 0;
    }
    if (self.t == TV_DICT) {
        tdict *d = self.u.d;
        if (!strcmp(m, "get")) {
            if (nargs < 1) return tpl_fail(rt, TPL_E_TYPE, "get expected at least 1 argument, got 0");
            if (!tpl_dict_get(d, args[0], out)) *out = nargs > 1 ? args[1] : tv_none();
            return 0;
        }
        if (!strcmp(m, "copy")) {
            tdict *c = tpl_dict_new(ar, TD_DICT);
            if (!c) return oom(rt);
            for (uint32_t i = 0; i < d->n; i++)
                if (tpl_dict_set(ar, c, d->k[i], d->v[i])) return oom(rt);
            *out = tpl_mkdict(c);
            return 0;
        }
        tlist *l = tpl_list_new(ar, TL_LIST, d->n);
        if (!l) return oom(rt);
        for (uint32_t i = 0; i < d->n; i++) {
            if (!strcmp(m, "keys")) l->v[i] = d->k[i];
            else if (!strcmp(m, "values")) l->v[i] = d->v[i];
            else {
                tlist *pair = tpl_list_new(ar, TL_TUPLE, 2);
                if (!pair) return oom(rt);
                pair->v[0] = d->k[i];
                pair->v[1] = d->v[i];
                pair->n = 2;
                l->v[i] = tpl_mklist(pair);
            }
        }
        l->n = d->n;
        *out = tpl_mklist(l);
        return 0;
    }
    return tpl_fail(rt, TPL_E_TYPE, "'%s' object has no method '%s'", tpl_type_name(self), m);
}
