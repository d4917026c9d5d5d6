/* test_template.c: the chat-template renderer against the shared corpus (every
 * template x conversation pair rendered by Python jinja2: the output must match
 * byte for byte, or rendering must fail where jinja2 failed, with the same
 * message for raise_exception), plus unit tests of evaluator pieces and limits. */
#include <jansson.h>
#include <stdbool.h>
#include <time.h>

#include "core/alloc.h"
#include "template/template.h"
#include "test.h"

static int64_t fixed_now(void) {
    struct tm tm = {0};
    tm.tm_year = 2025 - 1900;
    tm.tm_mon = 5;
    tm.tm_mday = 15;
    tm.tm_hour = 10;
    tm.tm_min = 30;
    tm.tm_isdst = -1;
    return (int64_t)mktime(&tm);
}

/* Renders src with vars (JSON text); returns 0 ok (out filled) or the error kind. */
static int render(const char *src, const char *vars_json, const tpl_options *opt, char **out, hn_err *err) {
    tpl_template *t;
    *out = NULL;
    if (tpl_compile(src, strlen(src), &t, err) != HN_OK) return TPL_E_SYNTAX;
    json_t *vars = vars_json ? json_loads(vars_json, 0, NULL) : NULL;
    tpl_buf b = {0};
    tpl_errkind kind = TPL_E_NONE;
    tpl_render(t, vars, opt, &b, &kind, err);
    if (kind == TPL_E_NONE) *out = strdup(b.data ? b.data : "");
    tpl_buf_free(&b);
    json_decref(vars);
    tpl_free(t);
    return kind;
}

static void expect(const char *src, const char *vars, const char *want) {
    char *got;
    hn_err err = {0};
    int k = render(src, vars, NULL, &got, &err);
    CHECKF(k == 0 && got && !strcmp(got, want), "%s\n  want [%s]\n  got  [%s] (kind %d: %s)", src, want,
           got ? got : "", k, err.msg);
    free(got);
}

static void expect_err(const char *src, const char *vars, int kind) {
    char *got;
    hn_err err = {0};
    int k = render(src, vars, NULL, &got, &err);
    CHECKF(k == kind, "%s: want error kind %d, got %d (%s) output [%s]", src, kind, k, err.msg, got ? got : "");
    free(got);
}

static void unit_tests(void) {
    /* printing Python values */
    expect("{{ 1 }} {{ 1.0 }} {{ 0.75 }} {{ 1e100 }} {{ 10/4 }} {{ 10/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }}", NULL,
           "1 1.0 0.75 1e+100 2.5 5.0 3 -4 2");
    expect("{{ none }} {{ true }} {{ [1, 'a', none, {'k': false}] }} {{ (1,) }} {{ 'it\\'s' }}", NULL,
           "None True [1, 'a', None, {'k': False}] (1,) it's");
    expect("{{ ['it\\'s', 'a\"b\\'c', 'x\\ny'] }}", NULL, "[\"it's\", 'a\"b\\'c', 'x\\ny']");
    expect("{{ 1e-5 }} {{ 123456789.0 }} {{ 1e16 }} {{ 0.1 + 0.2 }}", NULL, "1e-05 123456789.0 1e+16 0.30000000000000004");
    /* whitespace control */
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
    expect("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    expect("{# c #}\nx {{- ' y ' -}} z\n", NULL, "x y z");
    /* tojson */
    expect("{{ {'a': [1, 2.5, none, true], 'b': 'é\"\\n'} | tojson }}", NULL, "{\"a\": [1, 2.5, null, true], \"b\": \"é\\\"\\n\"}");
    expect("{{ {'a': [], 'b': {}, 'c': [1]} | tojson(indent=2) }}", NULL, "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1\n  ]\n}");
    expect("{{ 'é😀' | tojson(ensure_ascii=true) }}", NULL, "\"\\u00e9\\ud83d\\ude00\"");
    /* strings and slices */
    expect("{{ 'abcdef'[1:3] }}{{ 'abc'[::-1] }}{{ [1,2,3][-1] }}{{ 'héllo'[1] }}{{ 'héllo'|length }}", NULL, "bccba3é5");
    expect("{{ '  a b  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'xxaxx'.strip('x') }}", NULL,
           "a b|['a', 'b', '', 'c']|['a', 'b']|a");
    expect("{{ 'Hello'.upper() }}{{ 'Hello'.lower() }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}", NULL,
           "HELLOhelloTrueTrue");
    expect("{{ '{} and {}'.format(1, 'b') }} {{ 'a-b-c'.replace('-', '+') }} {{ '-' * 3 }}", NULL, "1 and b a+b+c ---");
    /* undefined */
    expect("[{{ nope }}]{{ nope is defined }}{{ nope | default('d') }}{{ (nope ~ 'x') }}{{ nope|length }}", NULL,
           "[]Falsedx0");
    expect_err("{{ nope.attr }}", NULL, TPL_E_UNDEFINED);
    expect_err("{{ nope + 1 }}", NULL, TPL_E_UNDEFINED);
    expect("{{ d.missing is defined }}{{ d.get('missing') }}{{ d['k'] }}", "{\"d\": {\"k\": 1}}", "FalseNone1");
    /* operators and type errors */
    expect_err("{{ 'a' + 1 }}", NULL, TPL_E_TYPE);
    expect_err("{{ 'a' in none }}", NULL, TPL_E_TYPE);
    expect("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'abc' }}{{ 1 < 2 < 3 }}", NULL,
           "TrueTrueTrueTrueTrue");
    /* loops, scoping, namespace, macros */
    expect("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.first }}{{ loop.last }};{% endfor %}", NULL,
           "1TrueFalse;2FalseFalse;3FalseTrue;");
    expect("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    expect("{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", NULL, "4");
    expect("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", NULL, "2242");
    expect("{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, "1");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}", NULL, "a=1 b=2 ");
    expect("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", NULL, "<1B><23>");
    expect("{% set s %}x{{ 1 }}y{% endset %}[{{ s }}]{% filter upper %}abc{% endfilter %}", NULL, "[x1y]ABC");
    expect("{{ [3,1,2]|sort|list }}{{ [{'a':2},{'a':1}]|map(attribute='a')|list }}{{ ['a','b']|join(',') }}", NULL,
           "[1, 2, 3][2, 1]a,b");
    expect("{{ [1,2,3]|select('odd')|list }}{{ [{'t':'x'},{'t':'y'}]|selectattr('t','equalto','y')|list }}", NULL,
           "[1, 3][{'t': 'y'}]");
    expect("{{ {'b': 1, 'A': 2}|dictsort }}{{ {'x': 1}|items|list }}", NULL, "[('A', 2), ('b', 1)][('x', 1)]");
    expect("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}", NULL, "a\n  b|  a\n  b");
    expect("{{ ('<a>'|safe) + '<b>' }}", NULL, "<a>&lt;b&gt;");
    /* errors from the template and the sandbox */
    char *got;
    hn_err err = {0};
    int k = render("{{ raise_exception('boom: ' ~ 1) }}", NULL, NULL, &got, &err);
    CHECKF(k == TPL_E_RAISE && !strcmp(err.msg, "boom: 1"), "raise_exception: kind %d msg %s", k, err.msg);
    free(got);
    expect_err("{% set l = [] %}{{ l.append(1) }}", NULL, TPL_E_SECURITY);
    expect_err("{% if %}", NULL, TPL_E_SYNTAX);
    expect_err("{% for x in y %}", NULL, TPL_E_SYNTAX);
    expect_err("{{ 1 +* }}", NULL, TPL_E_SYNTAX);
    expect_err("{% foo %}", NULL, TPL_E_SYNTAX);
    /* limits */
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, TPL_E_LIMIT);
    expect_err("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, TPL_E_LIMIT);
    tpl_options small = {0};
    small.max_output = 1000;
    k = render("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", NULL, &small, &got, &err);
    CHECKF(k == TPL_E_LIMIT, "output limit: kind %d", k);
    free(got);
    expect_err("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
               NULL, TPL_E_LIMIT);
    expect_err("{{ 'x' * 100000000000 }}", NULL, TPL_E_LIMIT);
    /* deep nesting in the source is a clean syntax error, not a stack overflow */
    char deep[20000];
    strcpy(deep, "{{ ");
    for (int i = 0; i < 5000; i++) strcat(deep, "(");
    expect_err(deep, NULL, TPL_E_SYNTAX);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 4000; i++) strcat(deep, "-");
    strcat(deep, "1 }}");
    expect_err(deep, NULL, TPL_E_SYNTAX);
}

/* ---- the corpus ---- */

static void corpus(void) {
    char path[1024];
    json_error_t jerr;
    json_t *index = json_load_file(test_data_path(path, sizeof path, "data/templates/index.json"), 0, &jerr);
    json_t *convs = json_load_file(test_data_path(path, sizeof path, "data/templates/conversations.json"), 0, &jerr);
    CHECKF(index && convs, "cannot load the template corpus (%s)", path);
    if (!index || !convs) return;
    json_t *pairs = json_object_get(index, "pairs"), *tinfo = json_object_get(index, "templates");
    json_t *clist = json_object_get(convs, "conversations");
    size_t npairs = json_array_size(pairs), matched = 0;
    tpl_options opt = {0};
    opt.now = fixed_now();
    const char *last_name = NULL;
    tpl_template *t = NULL;
    hn_err cerr = {0};
    for (size_t i = 0; i < npairs; i++) {
        json_t *p = json_array_get(pairs, i);
        const char *tname = json_string_value(json_object_get(p, "template"));
        const char *cid = json_string_value(json_object_get(p, "conversation"));
        const char *outcome = json_string_value(json_object_get(p, "outcome"));
        const char *ofile = json_string_value(json_object_get(p, "output_file"));
        const char *ekind = json_string_value(json_object_get(p, "error_kind"));
        if (!last_name || strcmp(last_name, tname)) {
            tpl_free(t);
            t = NULL;
            snprintf(path, sizeof path, "%s/data/templates/templates/%s",
                     getenv("HONE_SHARED") && *getenv("HONE_SHARED") ? getenv("HONE_SHARED") : "../shared", tname);
            size_t len;
            char *src = test_slurp(path, &len);
            if (!src || tpl_compile(src, len, &t, &cerr) != HN_OK) t = NULL;
            free(src);
            last_name = tname;
        }
        json_t *conv = NULL;
        for (size_t c = 0; c < json_array_size(clist); c++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(clist, c), "id")), cid))
                conv = json_array_get(clist, c);
        json_t *ti = json_object_get(tinfo, tname);
        json_t *vars = json_object();
        json_object_set(vars, "messages", json_object_get(conv, "messages"));
        json_t *tools = json_object_get(conv, "tools");
        json_object_set(vars, "tools", tools ? tools : json_null());
        json_object_set(vars, "documents", json_null());
        json_object_set(vars, "add_generation_prompt", json_object_get(conv, "add_generation_prompt"));
        json_object_set(vars, "bos_token", json_object_get(ti, "bos_token"));
        json_object_set(vars, "eos_token", json_object_get(ti, "eos_token"));
        json_t *extra = json_object_get(conv, "extra_variables");
        if (extra) json_object_update(vars, extra);

        size_t elen = 0;
        char *expected;
        snprintf(path, sizeof path, "%s/data/templates/%s",
                 getenv("HONE_SHARED") && *getenv("HONE_SHARED") ? getenv("HONE_SHARED") : "../shared", ofile);
        expected = test_slurp(path, &elen);
        bool ok = false;
        char why[600] = "";
        if (!t) {
            snprintf(why, sizeof why, "compile failed: %s", cerr.msg);
            ok = false;
        } else {
            tpl_buf out = {0};
            tpl_errkind kind;
            hn_err err = {0};
            hn_status st = tpl_render(t, vars, &opt, &out, &kind, &err);
            if (!strcmp(outcome, "ok")) {
                ok = st == HN_OK && expected && out.len == elen && !memcmp(out.data, expected, elen);
                if (!ok) {
                    if (st != HN_OK) snprintf(why, sizeof why, "render failed: %s", err.msg);
                    else {
                        size_t d = 0;
                        while (d < out.len && d < elen && out.data[d] == expected[d]) d++;
                        snprintf(why, sizeof why, "differs at byte %zu (got %zu bytes, want %zu): got [%.60s] want [%.60s]",
                                 d, out.len, elen, out.data + d, expected + d);
                    }
                }
            } else {
                /* jinja2's error kinds: raise_exception, undefined (UndefinedError),
                 * sandbox (SecurityError), runtime (TypeError and friends) */
                int want = !strcmp(ekind, "raise_exception") ? TPL_E_RAISE
                           : !strcmp(ekind, "undefined")     ? TPL_E_UNDEFINED
                           : !strcmp(ekind, "sandbox")       ? TPL_E_SECURITY
                                                             : TPL_E_TYPE;
                ok = st != HN_OK && (int)kind == want;
                if (ok && want == TPL_E_RAISE) ok = expected && !strcmp(err.msg, expected);
                if (!ok) snprintf(why, sizeof why, "want %s error [%s], got %s (kind %d: %s)", ekind,
                                  expected ? expected : "", st == HN_OK ? "success" : "error", kind, err.msg);
            }
            tpl_buf_free(&out);
        }
        if (ok) matched++;
        else fprintf(stderr, "MISMATCH %s__%s: %s\n", tname, cid, why);
        free(expected);
        json_decref(vars);
    }
    tpl_free(t);
    printf("%zu/%zu match\n", matched, npairs);
    CHECKF(matched == npairs && npairs == 884, "corpus: %zu/%zu pairs match", matched, npairs);
    json_decref(index);
    json_decref(convs);
}

int main(void) {
    unit_tests();
    corpus();
    TEST_DONE();
}
