/* tok_pre.c: the pre-tokenizer of byte-level BPE: splits text into words with
 * the regular expressions of each `tokenizer.ggml.pre` value, using PCRE2.
 *
 * The reference is llama.cpp, which runs a list of regexes one after the other
 * (each one splits the pieces the previous one left, and text between matches
 * becomes a piece of its own). A few of its behaviours are kept on purpose:
 *   - text is decoded leniently first: an invalid UTF-8 byte becomes U+FFFD,
 *     overlong forms decode to their code point (and are re-encoded short);
 *   - `\s` means exactly the Unicode White_Space set (llama.cpp's table), and
 *     the ASCII `\d`/`\b` of ECMAScript (so no PCRE2_UCP);
 *   - `\p{Lu}`/`\p{Ll}`/`\p{Lt}`/`\p{Lm}`/`\p{Lo}` mean any letter (llama.cpp
 *     collapses code points to their major category before matching);
 *   - an empty match yields no word, and the next attempt at that position
 *     must be non-empty (ECMAScript iteration rules);
 *   - `$` matches only at the very end of a piece.
 * The hand-written splitters llama.cpp uses for the GPT-2, Llama-3, Qwen2 and
 * Qwen3.5 patterns are equivalent to running the patterns themselves, so PCRE2
 * runs those too. Patterns are compiled once (with JIT) per vocabulary; the
 * compiled code is shared, match state (and the JIT stack a long match may
 * need) is per call, so splitting is thread-safe. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "../core/alloc.h"
#include "tok_int.h"

#define MAX_RX 6

/* Patterns shared by several pre-tokenizers (from the models' tokenizer.json). */
#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_APOS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_WS_TAIL "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_LLAMA3 RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_WS_TAIL
#define RX_QWEN2 RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_WS_TAIL
#define RX_QWEN35 RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" RX_WS_TAIL
#define RX_CASED(L, SUF) \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))*((?=[" L "])([^A-Z]))+" SUF "|" \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))+((?=[" L "])([^A-Z]))*" SUF
#define RX_CJK_DS "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RX_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
#define RX_NEWLINES "[^\\n]+|[\\n]+"
#define RX_DS3_CJK "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RX_DS3                                                                                  \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+" \
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*" RX_WS_TAIL
/* DeepSeek LLM's letter class (its tokenizer.json lists the ranges explicitly). */
#define RX_DS_LETTERS                                                                           \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}" \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}" \
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"       \
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"    \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"    \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"              \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"             \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"   \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"     \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"              \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"              \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"    \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"   \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                  \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"              \
    "\\x{1E900}-\\x{1E943}]+"
/* DeepSeek LLM's punctuation class (U+3000 in its last range never matches:
 * whitespace reaches the matcher as U+FFFE). */
#define RX_DS_PUNCT "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"

typedef struct pre_def {
    const char *names; /* space-separated `tokenizer.ggml.pre` values */
    const char *rx[MAX_RX];
    tok_pre_flags flags;
} pre_def;

/* flags: clean_spaces, ignore_merges, add_bos, byte_encode, escape_ws, no_bos_default, newline_words */
#define F_STD {true, false, -1, true, false, false, false}
#define F_NOCLEAN {false, false, -1, true, false, false, false}

static const pre_def pre_defs[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, F_STD},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", {RX_LLAMA3},
     {true, true, 1, true, false, false, false}},
    {"dbrx smaug-bpe", {RX_LLAMA3}, F_STD},
    {"glm4 chatglm-bpe", {RX_LLAMA3}, {true, false, -1, true, false, true, false}},
    {"deepseek-llm", {"[\r\n]", RX_DS_LETTERS, RX_DS_PUNCT, "\\s+$", RX_CJK_DS, "\\p{N}+"}, F_NOCLEAN},
    {"deepseek-coder", {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK_DS, "\\p{N}"}, F_NOCLEAN},
    {"deepseek-v3 hunyuan-dense joyai-llm", {"\\p{N}{1,3}", RX_DS3_CJK, RX_DS3}, F_NOCLEAN},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]"}, F_STD},
    {"starcoder refact codeshell exaone minerva-7b mellum2", {"\\p{N}", RX_GPT2}, F_STD},
    {"command-r smollm", {"\\p{N}", RX_GPT2}, F_NOCLEAN},
    {"gpt-2 phi-2 mpt olmo jais exaone4 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum "
     "modern-bert jina-v1-en jina-v2-code roberta-bpe",
     {RX_GPT2}, F_STD},
    {"trillion granite-docling", {RX_GPT2}, F_NOCLEAN},
    {"stablelm2 megrez", {RX_QWEN2}, F_STD},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", {RX_QWEN2}, F_NOCLEAN},
    {"qwen35", {RX_QWEN35}, F_NOCLEAN},
    {"poro-chat", {RX_PORO}, F_NOCLEAN},
    {"bloom gpt3-finnish", {RX_PORO}, F_STD},
    {"viking", {RX_PORO, "\\p{N}"}, F_NOCLEAN},
    {"tekken",
     {RX_CASED("\\p{L}", "") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_WS_TAIL},
     {false, true, 1, true, false, false, false}},
    {"gpt-4o llama4 kanana2 talkie minimax-m2", {RX_CASED("\\p{L}", RX_APOS "?") "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_WS_TAIL},
     F_NOCLEAN},
    {"granite-embed-multi-97m",
     {RX_CASED("\\p{L}\\p{M}", RX_APOS "?") "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_WS_TAIL},
     {false, true, -1, true, false, false, false}},
    {"chameleon",
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RX_GPT2},
     {false, false, 1, true, false, false, false}},
    {"superbpe", {"\\p{N}+", "(?=(\\d{3})+(?!\\d))"}, F_NOCLEAN},
    {"bailingmoe bailingmoe2 llada-moe",
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
     F_NOCLEAN},
    {"seed-coder",
     {RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+" RX_WS_TAIL}, F_NOCLEAN},
    {"exaone-moe",
     {RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?"
              "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
     F_STD},
    {"minicpm5",
     {"\\p{N}{1,3}", RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_WS_TAIL},
     {true, true, -1, true, false, false, false}},
    {"jais-2",
     {RX_APOS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
              "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)"
              "|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"},
     F_STD},
    {"laguna", {RX_NEWLINES, RX_QWEN2}, F_NOCLEAN},
    {"gemma4 granite-embed-multi-311m", {RX_NEWLINES}, {true, false, 1, false, true, false, true}},
    {"sarvam-moe", {RX_NEWLINES}, {false, false, -1, false, true, false, false}},
};

/* llama.cpp's whitespace set (Unicode White_Space) as the subject shows it:
 * the 3-byte members arrive as U+FFFE (see tok_pre_split). */
#define WS_CLASS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{FFFE}"

/* The 3-byte members of White_Space. */
static bool is_ws3(uint32_t cp) {
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

struct tok_pre {
    char *name;
    tok_pre_flags flags;
    int n_rx;
    pcre2_code *rx[MAX_RX];
    pcre2_general_context *gctx;
};

static void *pcre_alloc(size_t n, void *ud) {
    (void)ud;
    return hn_malloc(n);
}
static void pcre_free(void *p, void *ud) {
    (void)ud;
    hn_free(p);
}

/* Appends to a bounded buffer; returns false when it would overflow. */
static bool put(char *dst, size_t cap, size_t *n, const char *s, size_t len) {
    if (*n + len >= cap) return false;
    memcpy(dst + *n, s, len);
    *n += len;
    dst[*n] = 0;
    return true;
}

/* Whether the class starting at p ('[') mentions \p{S} but no literal '~'. */
static bool class_needs_tilde_fix(const char *p) {
    bool sym = false, tilde = false;
    for (p++; *p && *p != ']'; p++) {
        if (*p == '\\' && p[1]) {
            if (!strncmp(p, "\\p{S}", 5)) sym = true;
            if (p[1] == '~') tilde = true;
            p++;
        } else if (*p == '~') {
            tilde = true;
        }
    }
    return sym && !tilde;
}

/* Translates a pattern from the ECMAScript dialect llama.cpp feeds std::regex
 * into PCRE2: \s/\S become the explicit whitespace set, \p{Lu} and friends
 * become \p{L}, and capturing groups become non-capturing (nothing reads them).
 * llama.cpp's \p{S} leaves out '~' (its ASCII symbol list lacks it), so a
 * class with \p{S} is wrapped to exclude '~' (or, negated, to admit it). */
static bool rewrite(const char *src, char *dst, size_t cap) {
    size_t n = 0;
    bool in_class = false, close_group = false;
    dst[0] = 0;
    for (const char *p = src; *p; p++) {
        if (*p == '\\' && p[1]) {
            char d = p[1];
            if (d == 's') {
                if (!(in_class ? put(dst, cap, &n, WS_CLASS, strlen(WS_CLASS))
                               : put(dst, cap, &n, "[", 1) && put(dst, cap, &n, WS_CLASS, strlen(WS_CLASS)) &&
                                     put(dst, cap, &n, "]", 1)))
                    return false;
            } else if (d == 'S') {
                if (in_class) return false; /* no pattern needs it; refuse rather than guess */
                if (!(put(dst, cap, &n, "[^", 2) && put(dst, cap, &n, WS_CLASS, strlen(WS_CLASS)) &&
                      put(dst, cap, &n, "]", 1)))
                    return false;
            } else if (d == 'p' && p[2] == '{') {
                const char *end = strchr(p, '}');
                if (!end) return false;
                size_t len = (size_t)(end - p) + 1;
                if (!in_class && len == 5 && p[3] == 'S') {
                    if (!put(dst, cap, &n, "(?:(?!~)\\p{S})", 14)) return false;
                    p = end;
                    continue;
                }
                bool sub_letter = len == 6 && p[3] == 'L' &&
                                  (p[4] == 'u' || p[4] == 'l' || p[4] == 't' || p[4] == 'm' || p[4] == 'o');
                if (!(sub_letter ? put(dst, cap, &n, "\\p{L}", 5) : put(dst, cap, &n, p, len))) return false;
                p = end;
                continue;
            } else if (!put(dst, cap, &n, p, 2)) {
                return false;
            }
            p++;
            continue;
        }
        if (!in_class && *p == '[') {
            in_class = true;
            close_group = class_needs_tilde_fix(p);
            if (close_group && !put(dst, cap, &n, p[1] == '^' ? "(?:~|" : "(?:(?!~)", p[1] == '^' ? 5 : 8))
                return false;
            if (!put(dst, cap, &n, p, 1)) return false;
            if (p[1] == '^') {
                if (!put(dst, cap, &n, "^", 1)) return false;
                p++;
            }
            continue;
        }
        if (in_class && *p == ']') {
            in_class = false;
            if (!put(dst, cap, &n, "]", 1) || (close_group && !put(dst, cap, &n, ")", 1))) return false;
            close_group = false;
            continue;
        }
        if (!in_class && *p == '(' && p[1] != '?') {
            if (!put(dst, cap, &n, "(?:", 3)) return false;
            continue;
        }
        if (!put(dst, cap, &n, p, 1)) return false;
    }
    return !in_class;
}

static const pre_def *find_def(const char *name) {
    size_t nl = strlen(name);
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++) {
        const char *s = pre_defs[i].names;
        while (*s) {
            const char *e = strchr(s, ' ');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            if (len == nl && memcmp(s, name, nl) == 0) return &pre_defs[i];
            s += len;
            while (*s == ' ') s++;
        }
    }
    return NULL;
}

hn_status tok_pre_new(const char *name, tok_pre **out, hn_err *err) {
    *out = NULL;
    if (!name || !*name) name = "default";
    const pre_def *def = find_def(name);
    if (!def)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "tokenizer: unsupported pre-tokenizer '%s'", name);
    tok_pre *p = hn_calloc(1, sizeof *p);
    if (!p) return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    p->flags = def->flags;
    p->name = hn_strdup(name);
    p->gctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    pcre2_compile_context *cctx = p->gctx ? pcre2_compile_context_create(p->gctx) : NULL;
    if (!cctx || !p->name) {
        tok_pre_free(p);
        return hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    }
    enum { RX_CAP = 8192 };
    char *buf = hn_malloc(RX_CAP);
    hn_status st = buf ? HN_OK : hn_errf(err, HN_ERR_NOMEM, "tokenizer: out of memory");
    for (int i = 0; st == HN_OK && i < MAX_RX && def->rx[i]; i++) {
        if (!rewrite(def->rx[i], buf, RX_CAP)) {
            st = hn_errf(err, HN_ERR_INTERNAL, "tokenizer: cannot translate pattern %d of '%s'", i, name);
            break;
        }
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_BACKSLASH_C, &ec, &eo, cctx);
        if (!code) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            st = hn_errf(err, HN_ERR_INTERNAL, "tokenizer: pattern %d of '%s' at %zu: %s", i, name, (size_t)eo,
                         (const char *)msg);
            break;
        }
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
        p->rx[p->n_rx++] = code;
    }
    hn_free(buf);
    pcre2_compile_context_free(cctx);
    if (st != HN_OK) {
        tok_pre_free(p);
        return st;
    }
    *out = p;
    return HN_OK;
}

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    for (int i = 0; i < p->n_rx; i++) pcre2_code_free(p->rx[i]);
    pcre2_general_context_free(p->gctx);
    hn_free(p->name);
    hn_free(p);
}

const char *tok_pre_name(const tok_pre *p) { return p->name; }

const tok_pre_flags *tok_pre_get_flags(const tok_pre *p) { return &p->flags; }

size_t tok_utf8_put(uint32_t cp, char *o) {
    unsigned char *u = (unsigned char *)o;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (unsigned char)(0xF0 | (cp >> 18));
    u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one code point the lenient way llama.cpp does: the lead byte gives
 * the length, the continuation bytes must be 10xxxxxx, nothing else is
 * checked. Invalid input yields U+FFFD for one byte. */
static uint32_t decode_lenient(const unsigned char *s, size_t len, size_t *adv) {
    unsigned char c = s[0];
    *adv = 1;
    if (c < 0x80) return c;
    if (!(c & 0x40)) return 0xFFFD;
#define CONT(i) ((s[i] & 0xC0) == 0x80)
    if (!(c & 0x20)) {
        if (len < 2 || !CONT(1)) return 0xFFFD;
        *adv = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (!(c & 0x10)) {
        if (len < 3 || !CONT(1) || !CONT(2)) return 0xFFFD;
        *adv = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    if (!(c & 0x08)) {
        if (len < 4 || !CONT(1) || !CONT(2) || !CONT(3)) return 0xFFFD;
        *adv = 4;
        uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                      ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return cp <= 0x10FFFF ? cp : 0xFFFD;
    }
#undef CONT
    return 0xFFFD;
}

typedef struct span_vec {
    tok_span *v;
    size_t n, cap;
    bool oom;
} span_vec;

static void span_push(span_vec *s, size_t off, size_t len) {
    if (!len || s->oom) return;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 256;
        tok_span *v = hn_realloc(s->v, nc * sizeof *v);
        if (!v) {
            s->oom = true;
            return;
        }
        s->v = v;
        s->cap = nc;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
}

/* Splits one piece with one pattern, appending the resulting pieces. */
/* Match state of one split: the JIT runs on 32 KiB of the machine stack
 * (PCRE2's default when no stack is assigned) until a match runs out of it;
 * then an 8 MiB JIT stack is made for the rest of the call and the match is
 * retried. Making that stack up front cost an mmap, page faults and a
 * munmap (with a TLB shootdown in a threaded process) on every call. */
typedef struct {
    pcre2_general_context *gctx;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
} match_ctx;

/* true: the big JIT stack was made just now (retry the match); false: it was
 * there already, or out of memory */
static bool big_jit_stack(match_ctx *m) {
    if (m->js) return false;
    m->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, m->gctx);
    if (!m->js) return false;
    pcre2_jit_stack_assign(m->mctx, NULL, m->js);
    return true;
}

static bool split_piece(const pcre2_code *code, const char *subj_all, tok_span piece, pcre2_match_data *md,
                        match_ctx *m, span_vec *out) {
    const PCRE2_SPTR subj = (PCRE2_SPTR)(subj_all + piece.off);
    const size_t slen = piece.len;
    size_t pos = 0, last = 0;
    uint32_t opts = 0;
    while (pos <= slen) {
        int rc = pcre2_match(code, subj, slen, pos, opts | PCRE2_NO_UTF_CHECK, md, m->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && big_jit_stack(m)) continue;
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!opts) break;
            /* no non-empty match right here after an empty one: step one character */
            opts = 0;
            if (pos >= slen) break;
            pos += tok_utf8_len(subj[pos]);
            continue;
        }
        if (rc < 0) return false;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last) span_push(out, piece.off + last, ms - last);
        span_push(out, piece.off + ms, me - ms);
        last = me;
        pos = me;
        opts = me == ms ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
    }
    if (last < slen) span_push(out, piece.off + last, slen - last);
    return !out->oom;
}

int64_t tok_pre_split(const tok_pre *p, const char *text, size_t len, char **clean_out, tok_span **spans_out) {
    *clean_out = NULL;
    *spans_out = NULL;
    if (len > ((size_t)1 << 30)) return -1;
    /* 1. lenient decode + re-encode; U+FFFD is 3 bytes, so 3x covers any input */
    char *clean = hn_malloc(len * 3 + 1);
    if (!clean) return -1;
    size_t cn = 0;
    bool proxy_needed = false;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t cp = decode_lenient(s + i, len - i, &adv);
        i += adv;
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || is_ws3(cp)) proxy_needed = true;
        cn += tok_utf8_put(cp, clean + cn);
    }
    clean[cn] = 0;
    /* 2. the subject PCRE2 sees: same length, three substitutions
     *   - surrogates (kept in the words, as llama.cpp does, but not valid
     *     UTF-8 for PCRE2) become U+E000, another "other" code point;
     *   - 3-byte whitespace becomes U+FFFE, which WS_CLASS lists: llama.cpp
     *     turns non-ASCII whitespace into \v before matching, so it must not
     *     fall into literal ranges such as DeepSeek's [\x{800}-\x{4E00}];
     *   - a real U+FFFE becomes U+FFFF (both unassigned: match no class). */
    char *subject = clean;
    if (proxy_needed) {
        subject = hn_malloc(cn + 1);
        if (!subject) {
            hn_free(clean);
            return -1;
        }
        memcpy(subject, clean, cn + 1);
        unsigned char *u = (unsigned char *)subject;
        for (size_t i = 0; i + 2 < cn; i++) {
            if (u[i] < 0xE0 || u[i] > 0xEF) continue;
            uint32_t cp = ((uint32_t)(u[i] & 0x0F) << 12) | ((uint32_t)(u[i + 1] & 0x3F) << 6) | (u[i + 2] & 0x3F);
            uint32_t to = cp >= 0xD800 && cp <= 0xDFFF ? 0xE000 : is_ws3(cp) ? 0xFFFE : cp == 0xFFFE ? 0xFFFF : cp;
            if (to != cp) tok_utf8_put(to, subject + i);
            i += 2;
        }
    }
    /* 3. apply the patterns in order */
    span_vec cur = {0}, next = {0};
    span_push(&cur, 0, cn);
    pcre2_match_data *md = pcre2_match_data_create(1, p->gctx);
    match_ctx m = {p->gctx, pcre2_match_context_create(p->gctx), NULL};
    bool ok = md && m.mctx && !cur.oom;
    for (int r = 0; ok && r < p->n_rx; r++) {
        next.n = 0;
        for (size_t k = 0; ok && k < cur.n; k++) ok = split_piece(p->rx[r], subject, cur.v[k], md, &m, &next);
        span_vec t = cur;
        cur = next;
        next = t;
    }
    if (m.js) pcre2_jit_stack_free(m.js);
    pcre2_match_context_free(m.mctx);
    pcre2_match_data_free(md);
    hn_free(next.v);
    if (subject != clean) hn_free(subject);
    if (!ok) {
        hn_free(cur.v);
        hn_free(clean);
        return -1;
    }
    *clean_out = clean;
    *spans_out = cur.v;
    return (int64_t)cur.n;
}

/* ---- GPT-2 byte <-> code point mapping ----
 * Printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
 * themselves; the other 68 bytes map, in order, to U+0100 onwards. */
static bool byte_is_self(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

/* The 68 in order: 0x00..0x20 (k 0..32), 0x7F..0xA0 (k 33..66), 0xAD (k 67);
 * closed forms of "the k-th byte that is not itself" (test_tokenizer_pre
 * holds them to that count for every byte and code point). */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_self(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (uint32_t)(b - 0x7F);
    return 0x100 + 67; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_self(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    uint32_t k = cp - 0x100;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(0x7F + k - 33);
    return 0xAD;
}
