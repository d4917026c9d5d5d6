/* grammar_build.c: compiling JSON schemas and tool lists into grammars.
 *
 * A builder collects rules (each its own growable code run, so a rule can be
 * filled while others are being built) and deduplicated byte sets, then
 * flattens them into a gr_grammar (grammar_int.h). Errors are sticky: after
 * the first failure every builder call is a no-op and compilation returns it.
 *
 * The JSON layout is fixed (", " and ": ", as in json.dumps) so that the
 * grammar stays small and a weak model cannot spin on whitespace. Objects
 * follow the schema's property order; for properties p0..pn-1 the rules
 *   F_i ::= KV_i T_i+1 | F_i+1 (optional p_i)      nothing written yet
 *   T_i ::= ", " KV_i T_i+1 | T_i+1 (optional p_i)  something written
 * give every subset containing the required ones, in order, with no comma
 * ambiguity, in linear size. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../core/alloc.h"
#include "grammar_int.h"

#define GB_MAX_DEPTH 64     /* schema nesting followed while compiling */
#define GB_MAX_BOUND 256    /* minItems/maxItems expanded up to this */
#define GB_MAX_RULES 200000

typedef struct {
    int32_t *v;
    int32_t n, cap;
} ivec;

/* A g_text_not rule, by its stop list (the same list, the same rule). */
typedef struct {
    const char *const *stops;
    int n, json;
    int32_t rule;
} gb_text_not;

typedef struct gb {
    ivec *rules;
    int32_t n_rules, cap_rules;
    gr_set *sets;
    int32_t n_sets, cap_sets;
    int32_t *set_ht; /* set ids + 1 by set_hash, 0 empty */
    int32_t set_ht_cap;
    hn_status st;
    hn_err *err;
    const json_t *root; /* schema that $ref paths resolve against */
    json_t *refs;       /* "$ref string" -> rule id, for the current root */
    int depth;
    int32_t r_str, r_num, r_int, r_bool, r_null, r_any, r_anyobj, r_chars, r_esc;
    gb_text_not text_not[4]; /* g_text_not's rules made so far */
    int n_text_not;
} gb;

static void gb_fail(gb *b, hn_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void gb_fail(gb *b, hn_status code, const char *fmt, ...) {
    if (b->st != HN_OK) return;
    b->st = code;
    if (b->err) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        hn_errf(b->err, code, "grammar: %s", msg);
    }
}

static void iv_push(gb *b, ivec *v, int32_t x) {
    if (b->st != HN_OK) return;
    if (v->n == v->cap) {
        int32_t nc = v->cap ? v->cap * 2 : 8;
        int32_t *nv = hn_realloc(v->v, (size_t)nc * sizeof *nv);
        if (!nv) {
            gb_fail(b, HN_ERR_NOMEM, "out of memory");
            return;
        }
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

/* A new empty rule; returns its id (0 after an error, harmless). */
static int32_t gb_rule(gb *b) {
    if (b->st != HN_OK) return 0;
    if (b->n_rules >= GB_MAX_RULES) {
        gb_fail(b, HN_ERR_RANGE, "grammar too large (more than %d rules)", GB_MAX_RULES);
        return 0;
    }
    if (b->n_rules == b->cap_rules) {
        int32_t nc = b->cap_rules ? b->cap_rules * 2 : 64;
        ivec *nr = hn_realloc(b->rules, (size_t)nc * sizeof *nr);
        if (!nr) {
            gb_fail(b, HN_ERR_NOMEM, "out of memory");
            return 0;
        }
        b->rules = nr;
        b->cap_rules = nc;
    }
    b->rules[b->n_rules] = (ivec){0};
    return b->n_rules++;
}

static void gb_emit(gb *b, int32_t r, int32_t x) {
    if (b->st != HN_OK) return;
    iv_push(b, &b->rules[r], x);
}

static void gb_end(gb *b, int32_t r) { gb_emit(b, r, GR_ALT_END); }
static void gb_ref(gb *b, int32_t r, int32_t t) { gb_emit(b, r, GR_REF(t)); }

static uint32_t set_hash(const gr_set *s) {
    uint32_t h = 0x811c9dc5u ^ s->literal;
    for (int k = 0; k < 8; k++) h = (h ^ s->w[k]) * 0x01000193u, h ^= h >> 15;
    return h;
}

/* Emits set s into rule r, as the id of an equal set made before, if any
 * (found through set_ht: set ids + 1, open addressing, at most half full). */
static void gb_set(gb *b, int32_t r, const gr_set *s) {
    if (b->st != HN_OK) return;
    uint32_t h = set_hash(s), mask = (uint32_t)b->set_ht_cap - 1, j = h & mask;
    if (b->set_ht_cap)
        for (; b->set_ht[j]; j = (j + 1) & mask)
            if (!memcmp(&b->sets[b->set_ht[j] - 1], s, sizeof *s)) {
                gb_emit(b, r, b->set_ht[j] - 1);
                return;
            }
    if (b->n_sets == b->cap_sets) {
        int32_t nc = b->cap_sets ? b->cap_sets * 2 : 32;
        gr_set *ns = hn_realloc(b->sets, (size_t)nc * sizeof *ns);
        if (!ns) {
            gb_fail(b, HN_ERR_NOMEM, "out of memory");
            return;
        }
        b->sets = ns;
        b->cap_sets = nc;
    }
    if ((b->n_sets + 1) * 2 > b->set_ht_cap) {
        int32_t nc = b->set_ht_cap ? b->set_ht_cap * 2 : 64;
        int32_t *nh = hn_calloc((size_t)nc, sizeof *nh);
        if (!nh) {
            gb_fail(b, HN_ERR_NOMEM, "out of memory");
            return;
        }
        for (int32_t i = 0; i < b->n_sets; i++) {
            uint32_t k = set_hash(&b->sets[i]) & (uint32_t)(nc - 1);
            while (nh[k]) k = (k + 1) & (uint32_t)(nc - 1);
            nh[k] = i + 1;
        }
        hn_free(b->set_ht);
        b->set_ht = nh;
        b->set_ht_cap = nc;
        mask = (uint32_t)nc - 1;
        for (j = h & mask; b->set_ht[j]; j = (j + 1) & mask) {}
    }
    b->set_ht[j] = b->n_sets + 1;
    b->sets[b->n_sets] = *s;
    gb_emit(b, r, b->n_sets++);
}

static void set_add(gr_set *s, unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi && c < 256; c++) s->w[c >> 5] |= 1u << (c & 31);
}

/* A class (non-literal) set of the bytes in [lo, hi]. */
static void gb_range(gb *b, int32_t r, unsigned lo, unsigned hi) {
    gr_set s = {0};
    set_add(&s, lo, hi);
    gb_set(b, r, &s);
}

/* Class set from a list of characters and ranges: "a-zA-Z_". */
static void gb_class(gb *b, int32_t r, const char *spec) {
    gr_set s = {0};
    for (const unsigned char *p = (const unsigned char *)spec; *p; p++) {
        if (p[1] == '-' && p[2]) {
            set_add(&s, p[0], p[2]);
            p += 2;
        } else {
            set_add(&s, p[0], p[0]);
        }
    }
    gb_set(b, r, &s);
}

/* Literal text (each byte a literal set). */
static void gb_lit(gb *b, int32_t r, const char *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        gr_set s = {0};
        set_add(&s, (unsigned char)t[i], (unsigned char)t[i]);
        s.literal = 1;
        gb_set(b, r, &s);
    }
}
static void gb_lits(gb *b, int32_t r, const char *t) { gb_lit(b, r, t, strlen(t)); }

/* A rule matching exactly literal t. */
static int32_t gb_lit_rule(gb *b, const char *t) {
    int32_t r = gb_rule(b);
    gb_lits(b, r, t);
    gb_end(b, r);
    return r;
}

/* Adds to rule r one alternative per shape of a multi-byte UTF-8 character,
 * each followed by a reference to tail (if tail >= 0). */
static void gb_utf8_alts(gb *b, int32_t r, int32_t tail) {
    static const struct { unsigned char lo[4], hi[4]; int n; } shapes[] = {
        {{0xC2, 0x80}, {0xDF, 0xBF}, 2},
        {{0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}, 3},
        {{0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}, 3},
        {{0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}, 3},
        {{0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}, 3},
        {{0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}, 4},
        {{0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}, 4},
        {{0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}, 4},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        for (int i = 0; i < shapes[k].n; i++) gb_range(b, r, shapes[k].lo[i], shapes[k].hi[i]);
        if (tail >= 0) gb_ref(b, r, tail);
        gb_end(b, r);
    }
}

/* ---- JSON primitives ---- */

static int32_t g_escape(gb *b);

/* The characters of a JSON string (between the quotes). */
static int32_t g_chars(gb *b) {
    if (b->r_chars) return b->r_chars;
    int32_t s = gb_rule(b), esc = g_escape(b);
    b->r_chars = s;
    gb_end(b, s); /* empty */
    gr_set plain = {0};
    set_add(&plain, 0x20, 0x21);
    set_add(&plain, 0x23, 0x5B);
    set_add(&plain, 0x5D, 0x7F);
    gb_set(b, s, &plain);
    gb_ref(b, s, s);
    gb_end(b, s);
    gb_range(b, s, '\\', '\\');
    gb_ref(b, s, esc);
    gb_ref(b, s, s);
    gb_end(b, s);
    gb_utf8_alts(b, s, s);
    return s;
}

/* What follows a backslash in a JSON string. */
static int32_t g_escape(gb *b) {
    if (b->r_esc) return b->r_esc;
    int32_t esc = gb_rule(b), hex = gb_rule(b), u = gb_rule(b), u0 = gb_rule(b), u00 = gb_rule(b);
    b->r_esc = esc;
    /* escapes: no surrogates, no \u0000 (decoders refuse both) */
    gb_class(b, esc, "\"\\/bfnrt");
    gb_end(b, esc);
    gb_range(b, esc, 'u', 'u');
    gb_ref(b, esc, u);
    gb_end(b, esc);
    gb_class(b, hex, "0-9a-fA-F");
    gb_end(b, hex);
    gb_class(b, u, "1-9a-cA-C");
    gb_ref(b, u, hex), gb_ref(b, u, hex), gb_ref(b, u, hex);
    gb_end(b, u);
    gb_class(b, u, "dD");
    gb_class(b, u, "0-7");
    gb_ref(b, u, hex), gb_ref(b, u, hex);
    gb_end(b, u);
    gb_class(b, u, "eEfF");
    gb_ref(b, u, hex), gb_ref(b, u, hex), gb_ref(b, u, hex);
    gb_end(b, u);
    gb_range(b, u, '0', '0');
    gb_ref(b, u, u0);
    gb_end(b, u);
    gb_class(b, u0, "1-9a-fA-F");
    gb_ref(b, u0, hex), gb_ref(b, u0, hex);
    gb_end(b, u0);
    gb_range(b, u0, '0', '0');
    gb_ref(b, u0, u00);
    gb_end(b, u0);
    gb_class(b, u00, "1-9a-fA-F");
    gb_ref(b, u00, hex);
    gb_end(b, u00);
    gb_range(b, u00, '0', '0');
    gb_class(b, u00, "1-9a-fA-F");
    gb_end(b, u00);
    return esc;
}

static int32_t g_string(gb *b) {
    if (b->r_str) return b->r_str;
    int32_t r = gb_rule(b);
    b->r_str = r;
    int32_t c = g_chars(b);
    gb_lits(b, r, "\"");
    gb_ref(b, r, c);
    gb_lits(b, r, "\"");
    gb_end(b, r);
    return r;
}

/* Up to n more decimal digits (a chain of tail calls, so no stack growth). */
static int32_t g_digits_upto(gb *b, int n) {
    int32_t prev = gb_rule(b);
    gb_end(b, prev); /* D0 ::= empty */
    for (int k = 1; k <= n; k++) {
        int32_t d = gb_rule(b);
        gb_end(b, d);
        gb_class(b, d, "0-9");
        gb_ref(b, d, prev);
        gb_end(b, d);
        prev = d;
    }
    return prev;
}

static int32_t g_integer(gb *b) {
    if (b->r_int) return b->r_int;
    int32_t r = gb_rule(b), mag = gb_rule(b);
    b->r_int = r;
    int32_t d15 = g_digits_upto(b, 15);
    gb_range(b, mag, '0', '0');
    gb_end(b, mag);
    gb_class(b, mag, "1-9");
    gb_ref(b, mag, d15);
    gb_end(b, mag);
    gb_ref(b, r, mag);
    gb_end(b, r);
    gb_range(b, r, '-', '-');
    gb_ref(b, r, mag);
    gb_end(b, r);
    return r;
}

static int32_t g_number(gb *b) {
    if (b->r_num) return b->r_num;
    int32_t r = gb_rule(b), frac = gb_rule(b), ex = gb_rule(b), sign = gb_rule(b);
    b->r_num = r;
    int32_t in = g_integer(b), d14 = g_digits_upto(b, 14), d1 = g_digits_upto(b, 1);
    gb_end(b, frac);
    gb_range(b, frac, '.', '.');
    gb_class(b, frac, "0-9");
    gb_ref(b, frac, d14);
    gb_end(b, frac);
    gb_end(b, sign);
    gb_class(b, sign, "+-");
    gb_end(b, sign);
    gb_end(b, ex);
    gb_class(b, ex, "eE");
    gb_ref(b, ex, sign);
    gb_class(b, ex, "0-9");
    gb_ref(b, ex, d1);
    gb_end(b, ex);
    gb_ref(b, r, in);
    gb_ref(b, r, frac);
    gb_ref(b, r, ex);
    gb_end(b, r);
    return r;
}

static int32_t g_bool(gb *b) {
    if (b->r_bool) return b->r_bool;
    int32_t r = gb_rule(b);
    b->r_bool = r;
    gb_lits(b, r, "true");
    gb_end(b, r);
    gb_lits(b, r, "false");
    gb_end(b, r);
    return r;
}

static int32_t g_null(gb *b) {
    if (!b->r_null) b->r_null = gb_lit_rule(b, "null");
    return b->r_null;
}

static int32_t g_any(gb *b);

/* "{" (KEY ": " value (", " KEY ": " value)*)? "}" with value rule v. */
static int32_t g_obj_of(gb *b, int32_t v) {
    int32_t r = gb_rule(b), more = gb_rule(b), str = g_string(b);
    gb_end(b, more);
    gb_lits(b, more, ", ");
    gb_ref(b, more, str);
    gb_lits(b, more, ": ");
    gb_ref(b, more, v);
    gb_ref(b, more, more);
    gb_end(b, more);
    gb_lits(b, r, "{}");
    gb_end(b, r);
    gb_lits(b, r, "{");
    gb_ref(b, r, str);
    gb_lits(b, r, ": ");
    gb_ref(b, r, v);
    gb_ref(b, r, more);
    gb_lits(b, r, "}");
    gb_end(b, r);
    return r;
}

static int32_t g_any(gb *b) {
    if (b->r_any) return b->r_any;
    int32_t r = gb_rule(b);
    b->r_any = r;
    int32_t obj = g_obj_of(b, r);
    if (!b->r_anyobj) b->r_anyobj = obj;
    int32_t arr = gb_rule(b), more = gb_rule(b);
    gb_end(b, more);
    gb_lits(b, more, ", ");
    gb_ref(b, more, r);
    gb_ref(b, more, more);
    gb_end(b, more);
    gb_lits(b, arr, "[]");
    gb_end(b, arr);
    gb_lits(b, arr, "[");
    gb_ref(b, arr, r);
    gb_ref(b, arr, more);
    gb_lits(b, arr, "]");
    gb_end(b, arr);
    int32_t alts[] = {obj, arr, g_string(b), g_number(b), g_bool(b), g_null(b)};
    for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++) {
        gb_ref(b, r, alts[i]);
        gb_end(b, r);
    }
    return r;
}

static int32_t g_any_object(gb *b) {
    g_any(b);
    return b->r_anyobj;
}

/* Text (valid UTF-8) that contains none of the ASCII strings stops[0..n).
 * Raw (json 0): tabs, newlines, printable ASCII and any non-ASCII character.
 * JSON string content (json 1): unescaped characters but '"', '\\' and
 * controls, and escapes (which match no stop). States are the prefixes of the
 * stops matched so far (an Aho-Corasick automaton), each a rule that may end
 * the text. Made once per stop list and grammar: every raw XML parameter of a
 * tool list refers to the same rules (they were rebuilt for each, milliseconds
 * apiece). */
static int32_t g_text_not(gb *b, const char *const *stops, int n, int json) {
    enum { MAXS = 64, MAXN = 8 };
    for (int i = 0; i < b->n_text_not; i++)
        if (b->text_not[i].stops == stops && b->text_not[i].n == n && b->text_not[i].json == json)
            return b->text_not[i].rule;
    char st[MAXS][32];
    size_t stl[MAXS], sl[MAXN]; /* the states' and the stops' lengths */
    int ns = 1;
    st[0][0] = 0;
    stl[0] = 0;
    if (n > MAXN) n = MAXN;
    for (int i = 0; i < n; i++) {
        size_t l = sl[i] = strlen(stops[i]);
        for (size_t k = 1; k < l && k < 31; k++) {
            int dup = 0;
            for (int j = 0; j < ns && !dup; j++) dup = stl[j] == k && !memcmp(st[j], stops[i], k);
            if (!dup && ns < MAXS) {
                memcpy(st[ns], stops[i], k);
                st[ns][k] = 0;
                stl[ns++] = k;
            }
        }
    }
    /* the states by their last character: only those can end u below */
    int first_by[128], next_by[MAXS];
    for (int c = 0; c < 128; c++) first_by[c] = -1;
    for (int j = ns - 1; j >= 1; j--) {
        int last = (unsigned char)st[j][stl[j] - 1] & 0x7F;
        next_by[j] = first_by[last];
        first_by[last] = j;
    }
    int32_t base = gb_rule(b);
    for (int i = 1; i < ns; i++) gb_rule(b);
    for (int s = 0; s < ns; s++) {
        int32_t r = base + s;
        gb_end(b, r);
        gr_set to[MAXS];
        memset(to, 0, sizeof to);
        char u[40];
        size_t ul = stl[s] + 1;
        memcpy(u, st[s], stl[s]);
        for (unsigned c = 0x09; c < 0x80; c++) {
            if (json ? (c < 0x20 || c == '"' || c == '\\') : (c < 0x20 && c != 0x09 && c != 0x0A && c != 0x0D))
                continue;
            u[ul - 1] = (char)c;
            int bad = 0;
            for (int i = 0; i < n && !bad; i++) bad = ul >= sl[i] && !memcmp(u + ul - sl[i], stops[i], sl[i]);
            if (bad) continue;
            int best = 0; /* longest suffix of u that is a state */
            for (int j = first_by[c]; j >= 0; j = next_by[j])
                if (stl[j] <= ul && stl[j] > stl[best] && !memcmp(u + ul - stl[j], st[j], stl[j])) best = j;
            set_add(&to[best], c, c);
        }
        for (int j = 0; j < ns; j++) {
            int any = 0;
            for (int k = 0; k < 8; k++) any |= to[j].w[k] != 0;
            if (!any) continue;
            gb_set(b, r, &to[j]);
            gb_ref(b, r, base + j);
            gb_end(b, r);
        }
        gb_utf8_alts(b, r, base);
        if (json) {
            gb_range(b, r, '\\', '\\');
            gb_ref(b, r, g_escape(b));
            gb_ref(b, r, base);
            gb_end(b, r);
        }
    }
    if (b->n_text_not < (int)(sizeof b->text_not / sizeof b->text_not[0]))
        b->text_not[b->n_text_not++] = (gb_text_not){stops, n, json, base};
    return base;
}

/* ---- schemas ---- */

static int32_t g_schema(gb *b, const json_t *s);

/* The JSON text of v in the canonical layout (hn_malloc'd), or NULL. */
static char *dump_json(gb *b, const json_t *v) {
    char *t = json_dumps(v, JSON_ENCODE_ANY);
    if (!t) {
        gb_fail(b, HN_ERR_NOMEM, "cannot serialise a JSON value");
        return NULL;
    }
    char *c = hn_strdup(t);
    free(t);
    if (!c) gb_fail(b, HN_ERR_NOMEM, "out of memory");
    return c;
}

static int32_t g_literal_json(gb *b, const json_t *v) {
    char *t = dump_json(b, v);
    if (!t) return 0;
    int32_t r = gb_lit_rule(b, t);
    hn_free(t);
    return r;
}

static const json_t *resolve_ref(gb *b, const char *ref) {
    const char *p;
    if (!strncmp(ref, "#/$defs/", 8)) p = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) p = ref + 14;
    else if (!strcmp(ref, "#")) return b->root;
    else {
        gb_fail(b, HN_ERR_UNSUPPORTED, "unsupported $ref \"%s\" (only #/$defs/ and #/definitions/)", ref);
        return NULL;
    }
    const json_t *defs = json_object_get(b->root, ref[2] == '$' ? "$defs" : "definitions");
    const json_t *t = defs ? json_object_get(defs, p) : NULL;
    if (!t) gb_fail(b, HN_ERR_INVALID, "$ref \"%s\" not found", ref);
    return t;
}

static int32_t g_object(gb *b, const json_t *s) {
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) props = NULL;
    size_t n = props ? json_object_size(props) : 0;
    if (!n && !addl) return g_any_object(b);
    int32_t addv = -1;
    if (json_is_true(addl)) addv = g_any(b);
    else if (json_is_object(addl)) addv = g_schema(b, addl);
    int32_t tn = gb_rule(b), fn = gb_rule(b);
    gb_end(b, tn);
    gb_end(b, fn);
    if (addv >= 0) {
        int32_t str = g_string(b);
        gb_lits(b, tn, ", ");
        gb_ref(b, tn, str);
        gb_lits(b, tn, ": ");
        gb_ref(b, tn, addv);
        gb_ref(b, tn, tn);
        gb_end(b, tn);
        gb_ref(b, fn, str);
        gb_lits(b, fn, ": ");
        gb_ref(b, fn, addv);
        gb_ref(b, fn, tn);
        gb_end(b, fn);
    }
    /* keys in schema order, built from the last one back */
    const char **keys = n ? hn_malloc(n * sizeof *keys) : NULL;
    if (n && !keys) {
        gb_fail(b, HN_ERR_NOMEM, "out of memory");
        return 0;
    }
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) keys[i++] = k;
    int32_t t_next = tn, f_next = fn;
    for (size_t j = n; j-- > 0 && b->st == HN_OK;) {
        const json_t *ps = json_object_get(props, keys[j]);
        bool required = false;
        size_t ri;
        json_t *rv;
        json_array_foreach(req, ri, rv) if (json_is_string(rv) && !strcmp(json_string_value(rv), keys[j])) required = true;
        int32_t val = g_schema(b, ps);
        json_t *ks = json_string(keys[j]);
        char *kt = ks ? dump_json(b, ks) : NULL;
        json_decref(ks);
        if (!kt) {
            gb_fail(b, HN_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t kv = gb_rule(b);
        gb_lits(b, kv, kt);
        gb_lits(b, kv, ": ");
        gb_ref(b, kv, val);
        gb_end(b, kv);
        hn_free(kt);
        int32_t ti = gb_rule(b), fi = gb_rule(b);
        gb_lits(b, ti, ", ");
        gb_ref(b, ti, kv);
        gb_ref(b, ti, t_next);
        gb_end(b, ti);
        gb_ref(b, fi, kv);
        gb_ref(b, fi, t_next);
        gb_end(b, fi);
        if (!required) {
            gb_ref(b, ti, t_next);
            gb_end(b, ti);
            gb_ref(b, fi, f_next);
            gb_end(b, fi);
        }
        t_next = ti;
        f_next = fi;
    }
    hn_free(keys);
    int32_t r = gb_rule(b);
    gb_lits(b, r, "{");
    gb_ref(b, r, f_next);
    gb_lits(b, r, "}");
    gb_end(b, r);
    return r;
}

static int64_t get_count(const json_t *s, const char *key, int64_t dflt) {
    const json_t *v = json_object_get(s, key);
    if (json_is_integer(v)) return json_integer_value(v);
    if (json_is_real(v)) return (int64_t)json_real_value(v);
    return dflt;
}

static int32_t g_array(gb *b, const json_t *s) {
    const json_t *items = json_object_get(s, "items");
    int64_t lo = get_count(s, "minItems", 0), hi = get_count(s, "maxItems", -1);
    if (lo < 0) lo = 0;
    if (lo > GB_MAX_BOUND) {
        gb_fail(b, HN_ERR_UNSUPPORTED, "minItems %lld is above %d", (long long)lo, GB_MAX_BOUND);
        return 0;
    }
    if (hi > GB_MAX_BOUND) hi = -1;
    if (hi >= 0 && hi < lo) {
        gb_fail(b, HN_ERR_INVALID, "maxItems below minItems");
        return 0;
    }
    int32_t r = gb_rule(b);
    if (hi == 0) {
        gb_lits(b, r, "[]");
        gb_end(b, r);
        return r;
    }
    int32_t it = json_is_object(items) || json_is_boolean(items) ? g_schema(b, items) : g_any(b);
    /* the optional items after the first max(lo, 1) */
    int32_t rest;
    int64_t first = lo ? lo : 1;
    if (hi < 0) {
        rest = gb_rule(b);
        gb_end(b, rest);
        gb_lits(b, rest, ", ");
        gb_ref(b, rest, it);
        gb_ref(b, rest, rest);
        gb_end(b, rest);
    } else {
        rest = gb_rule(b);
        gb_end(b, rest);
        for (int64_t k = first; k < hi; k++) {
            int32_t nx = gb_rule(b);
            gb_end(b, nx);
            gb_lits(b, nx, ", ");
            gb_ref(b, nx, it);
            gb_ref(b, nx, rest);
            gb_end(b, nx);
            rest = nx;
        }
    }
    if (!lo) {
        gb_lits(b, r, "[]");
        gb_end(b, r);
    }
    gb_lits(b, r, "[");
    gb_ref(b, r, it);
    for (int64_t k = 1; k < first; k++) {
        gb_lits(b, r, ", ");
        gb_ref(b, r, it);
    }
    gb_ref(b, r, rest);
    gb_lits(b, r, "]");
    gb_end(b, r);
    return r;
}

static int32_t g_type(gb *b, const char *t, const json_t *s) {
    if (!strcmp(t, "string")) return g_string(b);
    if (!strcmp(t, "number")) return g_number(b);
    if (!strcmp(t, "integer")) return g_integer(b);
    if (!strcmp(t, "boolean")) return g_bool(b);
    if (!strcmp(t, "null")) return g_null(b);
    if (!strcmp(t, "object")) return g_object(b, s);
    if (!strcmp(t, "array")) return g_array(b, s);
    gb_fail(b, HN_ERR_UNSUPPORTED, "unknown schema type \"%s\"", t);
    return 0;
}

/* allOf of several members: their object parts merged (properties, required). */
static int32_t g_allof(gb *b, const json_t *s, const json_t *all) {
    json_t *m = json_object();
    json_t *props = json_object(), *req = json_array();
    if (!m || !props || !req) {
        json_decref(m), json_decref(props), json_decref(req);
        gb_fail(b, HN_ERR_NOMEM, "out of memory");
        return 0;
    }
    size_t i;
    json_t *it;
    json_array_foreach(all, i, it) {
        const json_t *x = it;
        for (int hop = 0; hop < 8 && json_is_string(json_object_get(x, "$ref")); hop++)
            x = resolve_ref(b, json_string_value(json_object_get(x, "$ref")));
        if (!x) break;
        json_object_update(props, json_object_get(x, "properties"));
        json_array_extend(req, json_object_get(x, "required"));
        const json_t *ap = json_object_get(x, "additionalProperties");
        if (ap) json_object_set(m, "additionalProperties", (json_t *)ap);
    }
    json_object_update(props, json_object_get(s, "properties"));
    json_array_extend(req, json_object_get(s, "required"));
    json_object_set_new(m, "type", json_string("object"));
    json_object_set_new(m, "properties", props);
    json_object_set_new(m, "required", req);
    int32_t r = g_object(b, m);
    json_decref(m);
    return r;
}

static int32_t g_schema(gb *b, const json_t *s) {
    if (b->st != HN_OK) return 0;
    if (!s || json_is_true(s)) return g_any(b);
    if (!json_is_object(s)) {
        gb_fail(b, HN_ERR_UNSUPPORTED, "a schema must be an object or true");
        return 0;
    }
    if (b->depth >= GB_MAX_DEPTH) {
        gb_fail(b, HN_ERR_RANGE, "schema nested deeper than %d", GB_MAX_DEPTH);
        return 0;
    }
    b->depth++;
    int32_t r = 0;
    const json_t *v;
    if ((v = json_object_get(s, "$ref")) && json_is_string(v)) {
        const char *ref = json_string_value(v);
        json_t *memo = json_object_get(b->refs, ref);
        if (memo) {
            r = (int32_t)json_integer_value(memo);
        } else {
            r = gb_rule(b);
            json_object_set_new(b->refs, ref, json_integer(r));
            const json_t *t = resolve_ref(b, ref);
            int32_t inner = t ? g_schema(b, t) : 0;
            gb_ref(b, r, inner);
            gb_end(b, r);
        }
    } else if ((v = json_object_get(s, "const"))) {
        r = g_literal_json(b, v);
    } else if ((v = json_object_get(s, "enum")) && json_is_array(v) && json_array_size(v)) {
        r = gb_rule(b);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            gb_ref(b, r, g_literal_json(b, e));
            gb_end(b, r);
        }
    } else if (((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf"))) && json_is_array(v) &&
               json_array_size(v)) {
        r = gb_rule(b);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            gb_ref(b, r, g_schema(b, e));
            gb_end(b, r);
        }
    } else if ((v = json_object_get(s, "allOf")) && json_is_array(v) && json_array_size(v)) {
        r = json_array_size(v) == 1 && !json_object_get(s, "properties") ? g_schema(b, json_array_get(v, 0))
                                                                           : g_allof(b, s, v);
    } else if ((v = json_object_get(s, "type")) && json_is_string(v)) {
        r = g_type(b, json_string_value(v), s);
    } else if (v && json_is_array(v) && json_array_size(v)) {
        r = gb_rule(b);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e)) {
                gb_fail(b, HN_ERR_UNSUPPORTED, "schema type list holds a non-string");
                break;
            }
            gb_ref(b, r, g_type(b, json_string_value(e), s));
            gb_end(b, r);
        }
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties")) {
        r = g_object(b, s);
    } else if (json_object_get(s, "items")) {
        r = g_array(b, s);
    } else {
        r = g_any(b);
    }
    b->depth--;
    return r;
}

/* ---- finishing ---- */

static void gb_init(gb *b, hn_err *err) {
    memset(b, 0, sizeof *b);
    b->err = err;
    b->refs = json_object();
    if (!b->refs) gb_fail(b, HN_ERR_NOMEM, "out of memory");
    gb_rule(b); /* rule 0 is reserved for the root (so 0 is never a cached helper) */
}

static void gb_release(gb *b) {
    for (int32_t i = 0; i < b->n_rules; i++) hn_free(b->rules[i].v);
    hn_free(b->rules);
    hn_free(b->sets);
    hn_free(b->set_ht);
    json_decref(b->refs);
}

/* Whether some rule can reach itself without consuming a byte (left
 * recursion, e.g. the schema {"$ref":"#"}): the matcher's expansion of
 * such a rule would never end. Nullable rules first (a fixed point), then a
 * depth-first search over the references each alternative can start with. */
static bool gb_left_recursive(gb *b) {
    int32_t n = b->n_rules;
    if (n <= 0) return false;
    bool *nul = hn_calloc((size_t)n, sizeof *nul);
    int32_t *color = hn_calloc((size_t)n, sizeof *color), *stack = hn_malloc((size_t)n * 2 * sizeof *stack);
    bool found = false;
    if (!nul || !color || !stack) {
        gb_fail(b, HN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < n; r++) {
            if (nul[r]) continue;
            bool all = true, nullable = false; /* all: the alternative so far */
            for (int32_t i = 0; i < b->rules[r].n && !nullable; i++) {
                int32_t x = b->rules[r].v[i];
                if (x == GR_ALT_END) nullable = all, all = true;
                else if (x >= 0 || !nul[GR_REF_BASE - x]) all = false;
            }
            if (nullable) nul[r] = changed = true;
        }
    }
    /* iterative DFS: stack of (rule, position in its code) */
    for (int32_t r0 = 0; r0 < n && !found; r0++) {
        if (color[r0]) continue;
        int32_t sp = 0;
        stack[sp++] = r0, stack[sp++] = 0;
        color[r0] = 1;
        while (sp && !found) {
            int32_t r = stack[sp - 2], i = stack[sp - 1];
            const int32_t *v = b->rules[r].v;
            /* the next leftmost reference of r from position i */
            int32_t next = -1;
            while (i < b->rules[r].n && next < 0) {
                int32_t x = v[i++];
                if (x == GR_ALT_END) continue;
                /* here every element before x in its alternative is nullable */
                if (x <= GR_REF_BASE) next = GR_REF_BASE - x;
                if (x >= 0 || !nul[GR_REF_BASE - x]) /* nothing after x starts the alternative */
                    while (i < b->rules[r].n && v[i] != GR_ALT_END) i++;
            }
            stack[sp - 1] = i;
            if (next < 0) {
                color[r] = 2;
                sp -= 2;
            } else if (color[next] == 1) {
                found = true;
            } else if (!color[next]) {
                color[next] = 1;
                stack[sp++] = next, stack[sp++] = 0;
            }
        }
    }
out:
    hn_free(nul);
    hn_free(color);
    hn_free(stack);
    return found;
}

/* Flattens the builder into a grammar whose start symbol is rule 0, which
 * must have been filled. Releases the builder. */
static hn_status gb_finish(gb *b, gr_grammar **out) {
    *out = NULL;
    gr_grammar *g = NULL;
    if (b->st == HN_OK) {
        int64_t n_code = 0, n_alts = 0;
        for (int32_t r = 0; r < b->n_rules; r++) {
            n_code += b->rules[r].n + 1;
            int32_t na = 0;
            for (int32_t i = 0; i < b->rules[r].n; i++) {
                int32_t x = b->rules[r].v[i];
                if (x == GR_ALT_END) na++;
                else if (x <= GR_REF_BASE && GR_REF_BASE - x >= b->n_rules) gb_fail(b, HN_ERR_INTERNAL, "bad rule reference");
            }
            if (!na || b->rules[r].v[b->rules[r].n - 1] != GR_ALT_END) gb_fail(b, HN_ERR_INTERNAL, "rule %d is empty", r);
            n_alts += na;
        }
        if (n_code > INT32_MAX / 2) gb_fail(b, HN_ERR_RANGE, "grammar too large");
        if (b->st == HN_OK && gb_left_recursive(b))
            gb_fail(b, HN_ERR_INVALID, "the schema refers to itself before any content (e.g. {\"$ref\":\"#\"}): no JSON value matches it");
        g = hn_calloc(1, sizeof *g);
        if (g) {
            g->code = hn_malloc((size_t)n_code * sizeof *g->code);
            g->alt_off = hn_malloc(((size_t)b->n_rules + 1) * sizeof *g->alt_off);
            g->alts = hn_malloc((size_t)(n_alts ? n_alts : 1) * sizeof *g->alts);
            g->sets = hn_malloc((size_t)(b->n_sets ? b->n_sets : 1) * sizeof *g->sets);
        }
        if (!g || !g->code || !g->alt_off || !g->alts || !g->sets) gb_fail(b, HN_ERR_NOMEM, "out of memory");
        if (b->st == HN_OK) {
            int32_t pc = 0, na = 0;
            for (int32_t r = 0; r < b->n_rules; r++) {
                g->alt_off[r] = na;
                g->alts[na++] = pc;
                for (int32_t i = 0; i < b->rules[r].n; i++) {
                    g->code[pc++] = b->rules[r].v[i];
                    if (b->rules[r].v[i] == GR_ALT_END && i + 1 < b->rules[r].n) g->alts[na++] = pc;
                }
                g->code[pc++] = GR_RULE_END;
            }
            g->alt_off[b->n_rules] = na;
            g->n_code = pc;
            g->n_rules = b->n_rules;
            g->root = 0;
            if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
            g->n_sets = b->n_sets;
        }
    }
    hn_status st = b->st;
    gb_release(b);
    if (st != HN_OK) {
        gr_grammar_free(g);
        return st;
    }
    *out = g;
    return HN_OK;
}

void gr_grammar_free(gr_grammar *g) {
    if (!g) return;
    hn_free(g->code);
    hn_free(g->alt_off);
    hn_free(g->alts);
    hn_free(g->sets);
    hn_free(g);
}

int32_t gr_grammar_rules(const gr_grammar *g) { return g ? g->n_rules : 0; }

hn_status gr_from_schema(const json_t *schema, gr_grammar **out, hn_err *err) {
    gb b;
    gb_init(&b, err);
    b.root = schema;
    int32_t r = g_schema(&b, schema);
    gb_ref(&b, 0, r);
    gb_end(&b, 0);
    return gb_finish(&b, out);
}

hn_status gr_any_object(gr_grammar **out, hn_err *err) {
    gb b;
    gb_init(&b, err);
    gb_ref(&b, 0, g_any_object(&b));
    gb_end(&b, 0);
    return gb_finish(&b, out);
}

/* ---- tools ---- */

/* The name and parameter schema of one tool in any of the accepted shapes. */
static const char *tool_parts(const json_t *t, const json_t **params) {
    const json_t *f = json_object_get(t, "function");
    if (json_is_object(f)) t = f;
    const json_t *name = json_object_get(t, "name");
    *params = json_object_get(t, "parameters");
    if (!*params) *params = json_object_get(t, "input_schema");
    return json_is_string(name) ? json_string_value(name) : NULL;
}

/* Whether a Qwen XML parameter is written as raw text (its schema allows a string). */
static bool xml_raw(gb *b, const json_t *s) {
    for (int hop = 0; hop < 8 && json_is_string(json_object_get(s, "$ref")); hop++) {
        s = resolve_ref(b, json_string_value(json_object_get(s, "$ref")));
        if (!s) return false;
    }
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) return !strcmp(json_string_value(t), "string");
    size_t i;
    json_t *e;
    json_array_foreach(t, i, e) if (json_is_string(e) && !strcmp(json_string_value(e), "string")) return true;
    return false;
}

static const char *const xml_stops[] = {"</parameter>", "</function>", "<parameter=", "</tool_call>"};
static const char *const hermes_stops[] = {"<tool_call>", "</tool_call>"};

static int32_t g_xml_params(gb *b, const json_t *params) {
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    int32_t next = gb_rule(b);
    gb_end(b, next);
    size_t n = json_is_object(props) ? json_object_size(props) : 0;
    if (!n) return next;
    const char **keys = hn_malloc(n * sizeof *keys);
    if (!keys) {
        gb_fail(b, HN_ERR_NOMEM, "out of memory");
        return 0;
    }
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) keys[i++] = k;
    for (size_t j = n; j-- > 0 && b->st == HN_OK;) {
        const json_t *ps = json_object_get(props, keys[j]);
        bool required = false;
        size_t ri;
        json_t *rv;
        json_array_foreach(req, ri, rv) if (json_is_string(rv) && !strcmp(json_string_value(rv), keys[j])) required = true;
        int32_t val;
        const json_t *en = json_object_get(ps, "enum");
        if (xml_raw(b, ps) && json_is_array(en) && json_array_size(en)) {
            val = gb_rule(b);
            size_t ei;
            json_t *e;
            json_array_foreach(en, ei, e) {
                if (json_is_string(e)) gb_lits(b, val, json_string_value(e));
                else gb_ref(b, val, g_literal_json(b, e));
                gb_end(b, val);
            }
        } else if (xml_raw(b, ps)) {
            val = g_text_not(b, xml_stops, 4, 0);
        } else {
            val = g_schema(b, ps);
        }
        int32_t p = gb_rule(b);
        gb_lits(b, p, "<parameter=");
        gb_lits(b, p, keys[j]);
        gb_lits(b, p, ">\n");
        gb_ref(b, p, val);
        gb_lits(b, p, "\n</parameter>\n");
        gb_ref(b, p, next);
        gb_end(b, p);
        if (!required) {
            gb_ref(b, p, next);
            gb_end(b, p);
        }
        next = p;
    }
    hn_free(keys);
    return next;
}

hn_status gr_from_tools(const json_t *tools, const gr_tool_opts *opt, gr_grammar **out, hn_err *err) {
    *out = NULL;
    if (!opt || !json_is_array(tools))
        return hn_errf(err, HN_ERR_INVALID, "grammar: tools must be an array");
    if (opt->format != TC_FORMAT_HERMES && opt->format != TC_FORMAT_QWEN_XML && opt->format != TC_FORMAT_LLAMA3)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "grammar: no tool-call grammar for format %d", (int)opt->format);
    gb b;
    gb_init(&b, err);
    /* JSON strings inside a call never hold the format's tags, which the
     * tool-call parser would take for markup */
    if (opt->format == TC_FORMAT_QWEN_XML) b.r_chars = g_text_not(&b, xml_stops, 4, 1);
    else if (opt->format == TC_FORMAT_HERMES) b.r_chars = g_text_not(&b, hermes_stops, 2, 1);
    int32_t call = gb_rule(&b);
    int n_tools = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *params;
        const char *name = tool_parts(t, &params);
        if (!name || (opt->name && strcmp(opt->name, name))) continue;
        n_tools++;
        json_decref(b.refs); /* $refs resolve within this tool's parameters */
        b.refs = json_object();
        b.root = params;
        json_t *ns = json_string(name);
        char *nt = ns ? dump_json(&b, ns) : NULL;
        json_decref(ns);
        if (!nt) {
            gb_fail(&b, HN_ERR_NOMEM, "out of memory");
            break;
        }
        if (opt->format == TC_FORMAT_QWEN_XML) {
            int32_t ps = g_xml_params(&b, params);
            gb_lits(&b, call, "<tool_call>\n<function=");
            gb_lits(&b, call, name);
            gb_lits(&b, call, ">\n");
            gb_ref(&b, call, ps);
            gb_lits(&b, call, "</function>\n</tool_call>");
        } else {
            bool hermes = opt->format == TC_FORMAT_HERMES;
            int32_t args = params ? g_schema(&b, params) : g_any_object(&b);
            gb_lits(&b, call, hermes ? "<tool_call>\n{\"name\": " : "{\"name\": ");
            gb_lits(&b, call, nt);
            gb_lits(&b, call, hermes ? ", \"arguments\": " : ", \"parameters\": ");
            gb_ref(&b, call, args);
            gb_lits(&b, call, hermes ? "}\n</tool_call>" : "}");
        }
        gb_end(&b, call);
        hn_free(nt);
    }
    if (!n_tools) {
        gb_release(&b);
        if (opt->name) return hn_errf(err, HN_ERR_INVALID, "grammar: tool \"%s\" is not offered", opt->name);
        return hn_errf(err, HN_ERR_INVALID, "grammar: no tools offered");
    }
    int32_t calls = call;
    if (opt->parallel) {
        int32_t more = gb_rule(&b);
        gb_end(&b, more);
        gb_lits(&b, more, opt->format == TC_FORMAT_LLAMA3 ? "; " : "\n");
        gb_ref(&b, more, call);
        gb_ref(&b, more, more);
        gb_end(&b, more);
        calls = gb_rule(&b);
        gb_ref(&b, calls, call);
        gb_ref(&b, calls, more);
        gb_end(&b, calls);
    }
    static const char *const think_stop[] = {"</think>"};
    if (opt->think == GR_THINK_OPTIONAL) {
        int32_t txt = g_text_not(&b, think_stop, 1, 0);
        gb_lits(&b, 0, "<think>");
        gb_ref(&b, 0, txt);
        gb_lits(&b, 0, "</think>\n\n");
        gb_ref(&b, 0, calls);
        gb_end(&b, 0);
        gb_ref(&b, 0, calls);
        gb_end(&b, 0);
    } else if (opt->think == GR_THINK_OPEN) {
        int32_t txt = g_text_not(&b, think_stop, 1, 0);
        gb_ref(&b, 0, txt);
        gb_lits(&b, 0, "</think>\n\n");
        gb_ref(&b, 0, calls);
        gb_end(&b, 0);
    } else {
        gb_ref(&b, 0, calls);
        gb_end(&b, 0);
    }
    return gb_finish(&b, out);
}
