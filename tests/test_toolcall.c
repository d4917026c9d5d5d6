/* test_toolcall.c: the streaming tool-call / reasoning parser.
 *
 * Every case is fed (a) whole, (b) split in two at every byte boundary and (c)
 * one byte at a time; after coalescing adjacent deltas all runs must give the
 * same events, equal to the expected ones (argument text compared as JSON).
 * Structural checks on every run: calls are numbered 0,1,2.., each start is
 * followed by argument fragments and one end, the fragments of a call
 * concatenate to a JSON object, no delta splits a UTF-8 sequence, ids are
 * "call_" + 24 alphanumerics and unique across the whole process. */
#include <ctype.h>
#include <time.h>
#include <jansson.h>

#include "core/alloc.h"
#include "template/toolcall.h"
#include "test.h"

/* ---- recorder ---- */

#define MAXEV 64
#define MAXIDS 200000

typedef struct {
    char kind; /* C content, R reasoning, T call (known tool), U call (unknown tool), A arguments */
    char *text;
    size_t len;
} rev;

typedef struct {
    rev ev[MAXEV];
    int n;
    int open;   /* index of the open call, -1 none */
    int ncalls; /* starts seen */
    int bad;    /* structural errors seen */
    char why[200];
} rec;

static char **g_ids;
static size_t g_nids;

static void rec_bad(rec *r, const char *why) {
    if (!r->bad) snprintf(r->why, sizeof r->why, "%s", why);
    r->bad++;
}

static void rec_add(rec *r, char kind, const char *s, size_t n, int merge) {
    if (merge && r->n && r->ev[r->n - 1].kind == kind) {
        rev *e = &r->ev[r->n - 1];
        e->text = realloc(e->text, e->len + n + 1);
        memcpy(e->text + e->len, s, n);
        e->len += n;
        e->text[e->len] = 0;
        return;
    }
    if (r->n == MAXEV) {
        rec_bad(r, "too many events");
        return;
    }
    rev *e = &r->ev[r->n++];
    e->kind = kind;
    e->text = malloc(n + 1);
    memcpy(e->text, s, n);
    e->text[n] = 0;
    e->len = n;
}

static int utf8_complete_end(const char *s, size_t n) {
    /* 1 when s does not end inside a multi-byte sequence */
    for (size_t j = 1; j <= 3 && j <= n; j++) {
        unsigned char c = (unsigned char)s[n - j];
        if ((c & 0xC0) == 0x80) continue;
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len <= j;
    }
    return 1;
}

static int g_utf8_check = 1;

static void on_event(void *u, const tc_event *e) {
    rec *r = u;
    switch (e->kind) {
    case TC_EV_CONTENT:
    case TC_EV_REASONING:
        if (r->open >= 0) rec_bad(r, "text inside a call");
        if (e->len == 0) rec_bad(r, "empty delta");
        if (g_utf8_check && !utf8_complete_end(e->text, e->len)) rec_bad(r, "delta splits UTF-8");
        rec_add(r, e->kind == TC_EV_CONTENT ? 'C' : 'R', e->text, e->len, 1);
        break;
    case TC_EV_CALL_START: {
        if (r->open >= 0) rec_bad(r, "start inside a call");
        if (e->index != r->ncalls) rec_bad(r, "call index not sequential");
        size_t idl = e->id ? strlen(e->id) : 0;
        int okid = idl == 29 && !strncmp(e->id, "call_", 5);
        for (size_t i = 5; okid && i < idl; i++) okid = isalnum((unsigned char)e->id[i]) != 0;
        if (!okid) rec_bad(r, "bad id");
        else if (g_nids < MAXIDS) g_ids[g_nids++] = strdup(e->id);
        r->open = e->index;
        r->ncalls++;
        rec_add(r, e->known_tool ? 'T' : 'U', e->name, strlen(e->name), 0);
        rec_add(r, 'A', "", 0, 0);
        break;
    }
    case TC_EV_CALL_ARGS:
        if (r->open != e->index) rec_bad(r, "args outside their call");
        if (e->len == 0) rec_bad(r, "empty args delta");
        if (g_utf8_check && !utf8_complete_end(e->text, e->len)) rec_bad(r, "args delta splits UTF-8");
        rec_add(r, 'A', e->text, e->len, 1);
        break;
    case TC_EV_CALL_END:
        if (r->open != e->index) rec_bad(r, "end of a call not open");
        r->open = -1;
        break;
    }
}

static void rec_free(rec *r) {
    for (int i = 0; i < r->n; i++) free(r->ev[i].text);
    r->n = 0;
}

/* ---- cases ---- */

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"location\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","
    "\"fahrenheit\"]}},\"required\":[\"location\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search_files\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"query\":{\"type\":\"string\"},\"filters\":{\"type\":\"object\",\"properties\":{"
    "\"extensions\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"include_hidden\":{\"type\":"
    "\"boolean\"},\"size\":{\"type\":\"object\",\"properties\":{\"min\":{\"type\":\"integer\"}}}}},"
    "\"min_score\":{\"type\":\"number\"},\"max_results\":{\"type\":\"integer\"}},\"required\":[\"query\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"send_message\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"recipients\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"text\":{\"type\":"
    "\"string\"},\"urgent\":{\"type\":[\"boolean\",\"null\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"path\":{\"type\":\"string\"},\"content\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"list_files\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{}}}}]";

#define H TC_FORMAT_HERMES
#define X TC_FORMAT_QWEN_XML
#define L TC_FORMAT_LLAMA3
#define NO TC_FORMAT_NONE
#define RF TC_FLAG_REASONING

typedef struct {
    const char *name;
    tc_format fmt;
    unsigned flags;
    int start_reason;
    int no_tools;
    const char *in;
    const char *want[12]; /* "C:text", "R:text", "T:name" / "U:name" then "A:{json}" */
} tcase;

static const tcase CASES[] = {
    /* ---- Hermes / Qwen ---- */
    {"h content", H, RF, 0, 0, "Hello! How can I help you today?", {"C:Hello! How can I help you today?"}},
    {"h reasoning+content", H, RF, 0, 0, "<think>\nThe user greets me.\n</think>\n\nHi there.",
     {"R:The user greets me.", "C:Hi there."}},
    {"h one call", H, RF, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": "
     "\"celsius\"}}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Paris, France\",\"unit\":\"celsius\"}"}},
    {"h parallel", H, RF, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Tokyo\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"New York\", \"unit\": "
     "\"fahrenheit\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search_files\", \"arguments\": {\"query\": "
     "\"trip\", \"min_score\": 0.75, \"max_results\": 5}}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Tokyo\"}", "T:get_weather",
      "A:{\"location\":\"New York\",\"unit\":\"fahrenheit\"}", "T:search_files",
      "A:{\"query\":\"trip\",\"min_score\":0.75,\"max_results\":5}"}},
    {"h call after text", H, RF, 0, 0,
     "Let me check the weather for you.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"location\": \"Paris\"}}\n</tool_call>",
     {"C:Let me check the weather for you.", "T:get_weather", "A:{\"location\":\"Paris\"}"}},
    {"h reasoning text call", H, RF, 0, 0,
     "<think>\nNeed weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"location\": \"Oslo\"}}\n</tool_call>",
     {"R:Need weather.", "C:Checking.", "T:get_weather", "A:{\"location\":\"Oslo\"}"}},
    {"h trailing garbage", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\"}}}}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Rome\"}"}},
    {"h single quotes", H, 0, 0, 0,
     "<tool_call>\n{'name': 'get_weather', 'arguments': {'location': 'Lyon', 'unit': 'celsius'}}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Lyon\",\"unit\":\"celsius\"}"}},
    {"h args as string", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"location\\\": \\\"Bern\\\"}\"}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Bern\"}"}},
    {"h unknown keys", H, 0, 0, 0,
     "<tool_call>\n{\"id\": 7, \"type\": \"function\", \"name\": \"get_weather\", \"arguments\": {\"location\": "
     "\"Kyiv\"}, \"extra\": true}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Kyiv\"}"}},
    {"h coercion", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"search_files\", \"arguments\": {\"query\": 42, \"min_score\": \"0.5\", "
     "\"max_results\": \"7\", \"filters\": \"{\\\"include_hidden\\\": \\\"true\\\", \\\"extensions\\\": "
     "\\\".c\\\", \\\"size\\\": {\\\"min\\\": 10.0}}\"}}\n</tool_call>",
     {"T:search_files", "A:{\"query\":\"42\",\"min_score\":0.5,\"max_results\":7,\"filters\":{\"include_hidden\":"
                        "true,\"extensions\":[\".c\"],\"size\":{\"min\":10}}}"}},
    {"h no close tag at end", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}",
     {"T:get_weather", "A:{\"location\":\"Lima\"}"}},
    {"h unterminated json", H, 0, 0, 0, "Sure. <tool_call>\n{\"name\": \"get_weather\", \"argu",
     {"C:Sure. <tool_call>\n{\"name\": \"get_weather\", \"argu"}},
    {"h unknown tool", H, 0, 0, 0, "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {\"path\": \"/\"}}\n</tool_call>",
     {"U:rm_rf", "A:{\"path\":\"/\"}"}},
    {"h missing brace", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Cairo\"}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Cairo\"}"}},
    {"h python literals", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"search_files\", \"arguments\": {\"query\": \"x\", \"filters\": {\"include_hidden\": "
     "True, \"extensions\": [\".h\",],}, }}\n</tool_call>",
     {"T:search_files", "A:{\"query\":\"x\",\"filters\":{\"include_hidden\":true,\"extensions\":[\".h\"]}}"}},
    {"h bare json call", H, 0, 0, 0, "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Quito\"}}",
     {"T:get_weather", "A:{\"location\":\"Quito\"}"}},
    {"h json content", H, 0, 0, 0, "{\"a\": 1} is a JSON object.", {"C:{\"a\": 1} is a JSON object."}},
    {"h raw newline in string", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.txt\", \"content\": \"l1\nl2\t\"}}\n"
     "</tool_call>",
     {"T:write_file", "A:{\"path\":\"a.txt\",\"content\":\"l1\\nl2\\t\"}"}},
    {"h unicode", H, RF, 0, 0,
     "<think>Température ≈ 22 °C 🌤</think>Tokyo: 22 °C ☀️ <tool_call>{\"name\": \"send_message\", \"arguments\": "
     "{\"recipients\": [\"zoë\"], \"text\": \"日本 🗾\"}}</tool_call>",
     {"R:Température ≈ 22 °C 🌤", "C:Tokyo: 22 °C ☀️", "T:send_message",
      "A:{\"recipients\":[\"zoë\"],\"text\":\"日本 🗾\"}"}},
    {"h tag in prose", H, 0, 0, 0, "Wrap calls in <tool_call> tags.", {"C:Wrap calls in <tool_call> tags."}},
    {"h implicit close", H, 0, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"A\"}}\n<tool_call>\n{\"name\": "
     "\"get_weather\", \"arguments\": {\"location\": \"<tool_call>B\"}}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"A\"}", "T:get_weather", "A:{\"location\":\"<tool_call>B\"}"}},
    {"h array body", H, 0, 0, 0,
     "<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"A\"}}, {\"name\": \"list_files\"}]"
     "</tool_call>",
     {"T:get_weather", "A:{\"location\":\"A\"}", "T:list_files", "A:{}"}},
    {"h text after call", H, 0, 0, 0,
     "<tool_call>{\"name\": \"list_files\", \"arguments\": {}}</tool_call>\n\nDone.",
     {"T:list_files", "A:{}", "C:Done."}},
    {"h not a call object", H, 0, 0, 0, "<tool_call>\n{\"foo\": 1}\n</tool_call> ok",
     {"C:<tool_call>\n{\"foo\": 1}\n</tool_call> ok"}},
    {"h think prefix content", H, RF, 0, 0, "<thinking is fun", {"C:<thinking is fun"}},
    {"h reasoning unterminated", H, RF, 0, 0, "<think>\nstill going", {"R:still going"}},
    {"h trailing newline", H, 0, 0, 0, "Answer.\n", {"C:Answer.\n"}},
    {"h think open in prompt", H, RF, 1, 0,
     "I should call.\n</think>\n\n<tool_call>\n{\"name\": \"list_files\", \"arguments\": {}}\n</tool_call>",
     {"R:I should call.", "T:list_files", "A:{}"}},

    /* ---- Qwen3-Coder / Qwen3.5 XML ---- */
    {"x content", X, 0, 0, 0, "Sure, here is the plan.", {"C:Sure, here is the plan."}},
    {"x one call", X, 0, 0, 0,
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n<parameter=unit>\n"
     "celsius\n</parameter>\n</function>\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Paris, France\",\"unit\":\"celsius\"}"}},
    {"x parallel", X, 0, 0, 0,
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nTokyo\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=search_files>\n<parameter=query>\ntrip\n</parameter>\n<parameter=filters>\n"
     "{\"extensions\": [\".md\"], \"include_hidden\": false}\n</parameter>\n<parameter=min_score>\n0.75\n"
     "</parameter>\n<parameter=max_results>\n5\n</parameter>\n</function>\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Tokyo\"}", "T:search_files",
      "A:{\"query\":\"trip\",\"filters\":{\"extensions\":[\".md\"],\"include_hidden\":false},\"min_score\":0.75,"
      "\"max_results\":5}"}},
    {"x call after text", X, 0, 0, 0,
     "Let me look.\n\n<tool_call>\n<function=list_files>\n</function>\n</tool_call>",
     {"C:Let me look.", "T:list_files", "A:{}"}},
    {"x multiline string", X, 0, 0, 0,
     "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.c\n</parameter>\n<parameter=content>\n"
     "int main(void) {\n    puts(\"hi \\\\ there\");\n\treturn 0;\n}\n\n</parameter>\n</function>\n</tool_call>",
     {"T:write_file", "A:{\"path\":\"src/a.c\",\"content\":\"int main(void) {\\n    puts(\\\"hi \\\\\\\\ there\\\");"
                      "\\n\\treturn 0;\\n}\\n\"}"}},
    {"x coercion", X, 0, 0, 0,
     "<tool_call>\n<function=send_message>\n<parameter=recipients>\nalice\n</parameter>\n<parameter=text>\n42\n"
     "</parameter>\n<parameter=urgent>\nTrue\n</parameter>\n</function>\n</tool_call>",
     {"T:send_message", "A:{\"recipients\":[\"alice\"],\"text\":\"42\",\"urgent\":true}"}},
    {"x missing </parameter>", X, 0, 0, 0,
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n<parameter=unit>\ncelsius\n</parameter>\n"
     "</function>\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Paris\",\"unit\":\"celsius\"}"}},
    {"x closed by </function>", X, 0, 0, 0,
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</function>\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Paris\"}"}},
    {"x unterminated value", X, 0, 0, 0,
     "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.txt\n</parameter>\n<parameter=content>\nhalf a li",
     {"T:write_file", "A:{\"path\":\"notes.txt\",\"content\":\"half a li\"}"}},
    {"x unterminated name", X, 0, 0, 0, "Plan: <tool_call>\n<function=get_wea",
     {"C:Plan: <tool_call>\n<function=get_wea"}},
    {"x bare function known", X, 0, 0, 0,
     "Reading.\n<function=get_weather>\n<parameter=location>\nRiga\n</parameter>\n</function>",
     {"C:Reading.", "T:get_weather", "A:{\"location\":\"Riga\"}"}},
    {"x bare function unknown", X, 0, 0, 0, "Use <function=example_name> like this.",
     {"C:Use <function=example_name> like this."}},
    {"x hermes body", X, 0, 0, 0,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Bonn\"}}\n</tool_call>",
     {"T:get_weather", "A:{\"location\":\"Bonn\"}"}},
    {"x think open in prompt", X, RF, 1, 0,
     "The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNice\n"
     "</parameter>\n</function>\n</tool_call>",
     {"R:The user wants weather.", "T:get_weather", "A:{\"location\":\"Nice\"}"}},
    {"x think repeated", X, RF, 1, 0, "<think>\nhmm\n</think>\nOK.", {"R:hmm", "C:OK."}},
    {"x unknown tool", X, 0, 0, 0,
     "<tool_call>\n<function=mystery>\n<parameter=n>\n5\n</parameter>\n<parameter=s>\nhello world\n</parameter>\n"
     "<parameter=o>\n{\"k\": [1, 2]}\n</parameter>\n</function>\n</tool_call>",
     {"U:mystery", "A:{\"n\":5,\"s\":\"hello world\",\"o\":{\"k\":[1,2]}}"}},
    {"x eof after param", X, 0, 0, 0,
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nOslo\n</parameter>\n",
     {"T:get_weather", "A:{\"location\":\"Oslo\"}"}},
    {"x blank lines kept", X, 0, 0, 0,
     "<tool_call>\n<function=write_file>\n<parameter=content>\n\n\nx\n\n\n</parameter>\n</function>\n</tool_call>",
     {"T:write_file", "A:{\"content\":\"\\n\\nx\\n\\n\"}"}},
    {"x text after call", X, 0, 0, 0,
     "<tool_call>\n<function=list_files>\n</function>\n</tool_call>\nDone.", {"T:list_files", "A:{}", "C:Done."}},
    {"x two functions one tag", X, 0, 0, 0,
     "<tool_call>\n<function=list_files>\n</function>\n<function=get_weather>\n<parameter=location>\nX\n"
     "</parameter>\n</function>\n</tool_call>",
     {"T:list_files", "A:{}", "T:get_weather", "A:{\"location\":\"X\"}"}},
    {"x unicode value", X, 0, 0, 0,
     "<tool_call>\n<function=send_message>\n<parameter=text>\nπ ≈ 3.14159 — ok 👍\n</parameter>\n</function>\n"
     "</tool_call>",
     {"T:send_message", "A:{\"text\":\"π ≈ 3.14159 — ok 👍\"}"}},
    {"x tag in prose", X, 0, 0, 0, "The <tool_call> tag wraps calls.", {"C:The <tool_call> tag wraps calls."}},

    /* ---- Llama 3.x JSON ---- */
    {"l content", L, 0, 0, 0, "The capital of France is Paris.", {"C:The capital of France is Paris."}},
    {"l bare call", L, 0, 0, 0, "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
     {"T:get_weather", "A:{\"location\":\"Paris\"}"}},
    {"l python tag", L, 0, 0, 0,
     "<|python_tag|>{\"type\": \"function\", \"name\": \"search_files\", \"parameters\": {\"query\": \"a\", "
     "\"max_results\": \"3\"}}",
     {"T:search_files", "A:{\"query\":\"a\",\"max_results\":3}"}},
    {"l semicolons", L, 0, 0, 0,
     "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"A\"}}; {\"name\": \"get_weather\", "
     "\"parameters\": {\"location\": \"B\"}}",
     {"T:get_weather", "A:{\"location\":\"A\"}", "T:get_weather", "A:{\"location\":\"B\"}"}},
    {"l json content", L, 0, 0, 0, "{\"answer\": 42}", {"C:{\"answer\": 42}"}},
    {"l incomplete", L, 0, 0, 0, "{\"name\": \"get_weather\", \"parameters\": {\"loc",
     {"C:{\"name\": \"get_weather\", \"parameters\": {\"loc"}},
    {"l builtin", L, 0, 0, 0, "<|python_tag|>brave_search.call(query=\"weather in Paris\", count=3)",
     {"U:brave_search", "A:{\"query\":\"weather in Paris\",\"count\":3}"}},
    {"l code", L, 0, 0, 0, "<|python_tag|>print(1 + 1)", {"U:python", "A:{\"code\":\"print(1 + 1)\"}"}},
    {"l no tools", L, 0, 0, 1, "{\"name\": \"get_weather\", \"parameters\": {}}",
     {"C:{\"name\": \"get_weather\", \"parameters\": {}}"}},
    {"l text then json", L, 0, 0, 0, "Here: {\"name\": \"x\"}", {"C:Here: {\"name\": \"x\"}"}},
    {"l unicode", L, 0, 0, 0, "{\"name\": \"send_message\", \"parameters\": {\"text\": \"héllo ✓\"}}",
     {"T:send_message", "A:{\"text\":\"héllo ✓\"}"}},

    /* ---- no tool format, reasoning only ---- */
    {"n reasoning", NO, RF, 0, 0, "<think>a</think>b <tool_call>", {"R:a", "C:b <tool_call>"}},
    {"n start in reasoning", NO, RF, 1, 0, "thinking forever", {"R:thinking forever"}},
    {"n no reasoning flag", NO, 0, 0, 0, "<think>x</think>y", {"C:<think>x</think>y"}},
};

/* ---- running ---- */

static tc_parser *make(const tcase *c, json_t *tools) {
    tc_options o = {.flags = c->flags, .start_in_reasoning = c->start_reason};
    tc_parser *p = NULL;
    hn_err err;
    if (tc_parser_new(c->fmt, c->no_tools ? NULL : tools, &o, &p, &err) != HN_OK) return NULL;
    return p;
}

/* Feeds in[0..n) cut at the given offsets (ascending). */
static void run_cuts(const tcase *c, json_t *tools, const size_t *cuts, int ncuts, rec *r) {
    memset(r, 0, sizeof *r);
    r->open = -1;
    tc_parser *p = make(c, tools);
    if (!p) {
        rec_bad(r, "parser_new failed");
        return;
    }
    size_t n = strlen(c->in), prev = 0;
    for (int i = 0; i <= ncuts; i++) {
        size_t e = i < ncuts ? cuts[i] : n;
        if (tc_parser_feed(p, c->in + prev, e - prev, on_event, r) != HN_OK) rec_bad(r, "feed failed");
        prev = e;
    }
    if (tc_parser_finish(p, on_event, r) != HN_OK) rec_bad(r, "finish failed");
    if (r->open >= 0) rec_bad(r, "call left open");
    if (tc_parser_ncalls(p) != r->ncalls) rec_bad(r, "ncalls disagrees");
    tc_parser_free(p);
}

static int same(const rec *a, const rec *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->ev[i].kind != b->ev[i].kind || a->ev[i].len != b->ev[i].len ||
            memcmp(a->ev[i].text, b->ev[i].text, a->ev[i].len))
            return 0;
    return 1;
}

static void dump(const rec *r) {
    for (int i = 0; i < r->n; i++) fprintf(stderr, "    %c: [%s]\n", r->ev[i].kind, r->ev[i].text);
}

static int matches_want(const tcase *c, const rec *r) {
    int nw = 0;
    while (nw < 12 && c->want[nw]) nw++;
    if (nw != r->n) return 0;
    for (int i = 0; i < nw; i++) {
        const char *w = c->want[i];
        if (w[0] != r->ev[i].kind) return 0;
        if (w[0] == 'A') {
            json_error_t e;
            json_t *a = json_loads(w + 2, 0, &e), *b = json_loadb(r->ev[i].text, r->ev[i].len, 0, &e);
            int ok = a && json_is_object(b) && json_equal(a, b);
            json_decref(a);
            json_decref(b);
            if (!ok) return 0;
        } else if (strcmp(w + 2, r->ev[i].text) != 0) {
            return 0;
        }
    }
    return 1;
}

static void test_case(const tcase *c, json_t *tools) {
    rec whole, r;
    run_cuts(c, tools, NULL, 0, &whole);
    CHECKF(!whole.bad, "%s: whole: %s", c->name, whole.why);
    int okw = matches_want(c, &whole);
    CHECKF(okw, "%s: events differ from expected", c->name);
    if (!okw) dump(&whole);

    size_t n = strlen(c->in);
    int split_bad = 0;
    for (size_t k = 1; k < n && !split_bad; k++) {
        run_cuts(c, tools, &k, 1, &r);
        if (r.bad || !same(&whole, &r)) {
            split_bad = 1;
            fprintf(stderr, "  %s: split at %zu differs (%s)\n", c->name, k, r.why);
            dump(&r);
        }
        rec_free(&r);
    }
    CHECKF(!split_bad, "%s: every two-way split gives the same events", c->name);

    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    for (size_t k = 0; k + 1 < n; k++) cuts[k] = k + 1;
    run_cuts(c, tools, cuts, n > 0 ? (int)n - 1 : 0, &r);
    int okb = !r.bad && same(&whole, &r);
    CHECKF(okb, "%s: byte-at-a-time gives the same events (%s)", c->name, r.why);
    if (!okb) dump(&r);
    rec_free(&r);
    free(cuts);
    rec_free(&whole);
}

/* Arguments stream before the call ends: a long Qwen XML string value arrives
 * in many fragments, and the content of a long answer arrives before the end. */
static void test_incremental(json_t *tools) {
    tc_options o = {0};
    tc_parser *p = NULL;
    CHECK(tc_parser_new(X, tools, &o, &p, NULL) == HN_OK);
    rec r;
    memset(&r, 0, sizeof r);
    r.open = -1;
    const char *head = "<tool_call>\n<function=write_file>\n<parameter=content>\n";
    tc_parser_feed(p, head, strlen(head), on_event, &r);
    CHECKF(r.n == 2 && r.ev[0].kind == 'T' && !strcmp(r.ev[1].text, "{\"content\":\""),
           "call start and key emitted before the value");
    size_t before = r.n ? r.ev[r.n - 1].len : 0;
    tc_parser_feed(p, "line one\nline two", 17, on_event, &r);
    CHECKF(r.n && r.ev[r.n - 1].len > before + 10, "string value streams as it is generated");
    tc_parser_finish(p, on_event, &r);
    tc_parser_free(p);
    rec_free(&r);

    /* content held back only at a possible tag */
    CHECK(tc_parser_new(H, tools, &o, &p, NULL) == HN_OK);
    memset(&r, 0, sizeof r);
    r.open = -1;
    tc_parser_feed(p, "Hello world <tool_", 18, on_event, &r);
    CHECKF(r.n == 1 && !strcmp(r.ev[0].text, "Hello world"), "content up to a possible tag is emitted");
    tc_parser_feed(p, "box> done", 9, on_event, &r);
    tc_parser_finish(p, on_event, &r);
    CHECKF(r.n == 1 && !strcmp(r.ev[0].text, "Hello world <tool_box> done"), "held-back text not lost");
    tc_parser_free(p);
    rec_free(&r);
}

/* Real agent tools (Claude Code's Anthropic-shaped tools with input_schema). */
static void test_claude_tools(void) {
    char path[512];
    test_data_path(path, sizeof path, "data/clients/claude-tool.jsonl");
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "open %s", path);
    if (!f) return;
    static char line[1 << 20];
    json_t *tools = NULL;
    while (!tools && fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *rq = json_loads(line, 0, &e);
        json_t *t = json_object_get(json_object_get(rq, "body"), "tools");
        if (json_is_array(t)) tools = json_incref(t);
        json_decref(rq);
    }
    fclose(f);
    CHECKF(tools != NULL, "tools found in claude-tool.jsonl");
    if (!tools) return;
    const char *in =
        "I'll run it.\n\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la \"src\"\n</parameter>\n"
        "<parameter=timeout>\n60000\n</parameter>\n<parameter=run_in_background>\nfalse\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=Read>\n<parameter=file_path>\n/tmp/a.c\n"
        "</parameter>\n<parameter=offset>\n10\n</parameter>\n</function>\n</tool_call>";
    tcase c = {"claude tools", X, 0, 0, 0, in,
               {"C:I'll run it.", "T:Bash",
                "A:{\"command\":\"ls -la \\\"src\\\"\",\"timeout\":60000,\"run_in_background\":false}", "T:Read",
                "A:{\"file_path\":\"/tmp/a.c\",\"offset\":10}"}};
    test_case(&c, tools);
    json_decref(tools);
}

/* Allocation failures never crash or leak; the parser reports NOMEM. */
static void test_alloc_failures(json_t *tools) {
    const tcase *c = &CASES[4];
    int failures = 0;
    for (long k = 0; k < 40; k++) {
        rec r;
        memset(&r, 0, sizeof r);
        r.open = -1;
        hn_alloc_fail_after(k);
        tc_options o = {0};
        tc_parser *p = NULL;
        if (tc_parser_new(c->fmt, tools, &o, &p, NULL) == HN_OK) {
            const char *s = c->in;
            hn_status st = tc_parser_feed(p, s, strlen(s), on_event, &r);
            if (st == HN_OK) st = tc_parser_finish(p, on_event, &r);
            if (st != HN_OK) failures++;
            tc_parser_free(p);
        } else {
            failures++;
        }
        hn_alloc_fail_after(-1);
        rec_free(&r);
    }
    CHECKF(failures > 0, "allocation failures were injected and reported");
}

static void test_truncated(json_t *tools) {
    static const struct {
        const char *name;
        int trunc;
    } T[] = {{"x parallel", 0}, {"x unterminated value", 1}, {"x eof after param", 1}, {"x text after call", 0},
             {"h no close tag at end", 0}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        const tcase *c = NULL;
        for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++)
            if (!strcmp(CASES[k].name, T[i].name)) c = &CASES[k];
        CHECKF(c != NULL, "case %s", T[i].name);
        if (!c) continue;
        tc_parser *p = make(c, tools);
        rec r;
        memset(&r, 0, sizeof r);
        r.open = -1;
        tc_parser_feed(p, c->in, strlen(c->in), on_event, &r);
        tc_parser_finish(p, on_event, &r);
        CHECKF(tc_parser_truncated(p) == T[i].trunc, "%s: truncated %d", c->name, T[i].trunc);
        tc_parser_free(p);
        rec_free(&r);
    }
}

static void count_ev(void *u, const tc_event *e) {
    size_t *n = u;
    n[e->kind] += e->kind == TC_EV_CALL_ARGS ? e->len : 1;
}

/* Long calls fed in small pieces stay linear: a 256 KiB Hermes call and a
 * 256 KiB Qwen XML string parameter, 3 bytes per feed. */
static void test_long(json_t *tools) {
    const size_t big = 256 * 1024;
    for (int f = 0; f < 2; f++) {
        char *s = malloc(big + 512);
        const char *head = f ? "<tool_call>\n<function=write_file>\n<parameter=content>\n"
                             : "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"content\": \"";
        const char *tail = f ? "\n</parameter>\n</function>\n</tool_call>" : "\"}}\n</tool_call>";
        size_t n = strlen(head);
        memcpy(s, head, n);
        for (size_t i = 0; i < big; i++) s[n++] = "abc xyz\\n"[i % 9];
        memcpy(s + n, tail, strlen(tail));
        n += strlen(tail);
        tc_parser *p = NULL;
        tc_options o = {0};
        CHECK(tc_parser_new(f ? X : H, tools, &o, &p, NULL) == HN_OK);
        size_t counts[8] = {0};
        clock_t t0 = clock();
        for (size_t i = 0; i < n; i += 3) tc_parser_feed(p, s + i, n - i < 3 ? n - i : 3, count_ev, counts);
        tc_parser_finish(p, count_ev, counts);
        double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
        CHECKF(counts[TC_EV_CALL_START] == 1 && counts[TC_EV_CALL_END] == 1 && counts[TC_EV_CONTENT] == 0 &&
                   counts[TC_EV_CALL_ARGS] > big,
               "long %s call parsed as one call", f ? "xml" : "hermes");
        CHECKF(sec < 2.0, "long %s call in %.2f s", f ? "xml" : "hermes", sec);
        tc_parser_free(p);
        free(s);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_ids(void) {
    /* seeded: deterministic; unseeded: unique over many parsers */
    tc_options o = {.id_seed = 1234};
    const char *s = "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"a\"}</tool_call>";
    rec r1, r2;
    for (int k = 0; k < 2; k++) {
        rec *r = k ? &r2 : &r1;
        memset(r, 0, sizeof *r);
        r->open = -1;
        tc_parser *p = NULL;
        tc_parser_new(H, NULL, &o, &p, NULL);
        tc_parser_feed(p, s, strlen(s), on_event, r);
        tc_parser_finish(p, on_event, r);
        tc_parser_free(p);
    }
    CHECK(r1.n == 4 && r2.n == 4);
    /* the two ids of one seeded parser differ; the same seed repeats them */
    size_t n = g_nids;
    CHECK(n >= 4 && strcmp(g_ids[n - 4], g_ids[n - 3]) != 0);
    CHECK(n >= 4 && strcmp(g_ids[n - 4], g_ids[n - 2]) == 0 && strcmp(g_ids[n - 3], g_ids[n - 1]) == 0);
    rec_free(&r1);
    rec_free(&r2);
    free(g_ids[--g_nids]);
    free(g_ids[--g_nids]);
    free(g_ids[--g_nids]);
    free(g_ids[--g_nids]);

    qsort(g_ids, g_nids, sizeof *g_ids, cmp_str);
    size_t dups = 0;
    for (size_t i = 1; i < g_nids; i++) dups += strcmp(g_ids[i - 1], g_ids[i]) == 0;
    CHECKF(g_nids > 1000 && dups == 0, "%zu ids, %zu duplicates", g_nids, dups);
}

int main(void) {
    g_ids = calloc(MAXIDS, sizeof *g_ids);
    json_error_t e;
    json_t *tools = json_loads(TOOLS, 0, &e);
    CHECKF(tools != NULL, "tools JSON: %s", e.text);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) test_case(&CASES[i], tools);
    test_incremental(tools);
    test_claude_tools();
    test_long(tools);
    test_truncated(tools);
    g_utf8_check = 0;
    test_alloc_failures(tools);
    g_utf8_check = 1;
    test_ids();
    json_decref(tools);
    for (size_t i = 0; i < g_nids; i++) free(g_ids[i]);
    free(g_ids);
    TEST_DONE();
}
