/* chat.c: chat messages -> normalised messages -> rendered prompt -> tokens.
 *
 * A chat_template is a compiled template plus what probe renders told us
 * about it (chat_caps). Probes are tiny conversations rendered once at load:
 * does a leading / later system message come out, and where; are text parts
 * rendered; are tool-call arguments printed as a string or used as a mapping;
 * must tool-call ids be 9 alphanumerics. chat_normalize turns a request's
 * messages into the shape the template handles best (see chat.h for every
 * choice and why), chat_render renders them, chat_tokenize tokenizes. */
#include <string.h>

#include "../core/alloc.h"
#include "chat.h"

#define PROBE_MAX_OUTPUT ((size_t)1 << 20)
#define REMINDER_OPEN "<system-reminder>\n"
#define REMINDER_CLOSE "\n</system-reminder>"
#define BILLING_PREFIX "x-anthropic-billing-header:"

struct chat_template {
    tpl_template *tpl;
    char *src, *bos, *eos;
    tc_detection det;
    chat_caps caps;
    /* control-token texts that request strings must not produce, sorted by
     * their first two bytes, longest first within those; texts of one byte
     * apart; a bitmap of the two-byte starts that occur */
    char **ctl;
    size_t *ctl_len, n_ctl;
    uint16_t *ctl_pair;
    unsigned char ctl_one[256];
    uint8_t ctl_pairs[8192];
};

/* ---- small helpers ---- */

static char *dup_n(const char *s, size_t n) {
    char *d = hn_malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static const char *role_of(const json_t *m) { return json_string_value(json_object_get(m, "role")); }

static bool is_role(const json_t *m, const char *role) {
    const char *r = role_of(m);
    return r && !strcmp(r, role);
}

/* ".NAME", "['NAME']" or "[\"NAME\"]" in src, not followed by an identifier character. */
static bool reads_attr(const char *src, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(src, name); p; p = strstr(p + 1, name)) {
        char after = p[n];
        if ((after >= 'a' && after <= 'z') || (after >= 'A' && after <= 'Z') || (after >= '0' && after <= '9') ||
            after == '_')
            continue;
        if (p > src && p[-1] == '.') return true;
        if (p - src >= 2 && (p[-1] == '\'' || p[-1] == '"') && p[-2] == '[') return true;
    }
    return false;
}

/* The text of a content value: a string as is, text parts joined with "\n",
 * anything else "". Returns a new jansson string (NULL on allocation failure). */
static json_t *content_as_string(const json_t *content) {
    if (json_is_string(content)) return json_stringn(json_string_value(content), json_string_length(content));
    if (!json_is_array(content)) return json_string("");
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *tx = json_is_string(part) ? part : json_object_get(part, "text");
        if (json_is_string(tx)) total += json_string_length(tx) + 1;
    }
    char *buf = hn_malloc(total + 1);
    if (!buf) return NULL;
    size_t n = 0;
    json_array_foreach(content, i, part) {
        const json_t *tx = json_is_string(part) ? part : json_object_get(part, "text");
        if (!json_is_string(tx)) continue;
        if (n) buf[n++] = '\n';
        memcpy(buf + n, json_string_value(tx), json_string_length(tx));
        n += json_string_length(tx);
    }
    json_t *s = json_stringn(buf, n);
    hn_free(buf);
    return s;
}

/* JSON text of v (json.dumps's default separators ", " and ": ", key order
 * kept) in an hn_malloc'd string; NULL on allocation failure. */
static char *dump(const json_t *v, size_t *len) {
    size_t n = json_dumpb(v, NULL, 0, JSON_ENCODE_ANY);
    char *s = n ? hn_malloc(n + 1) : NULL;
    if (!s) return NULL;
    json_dumpb(v, s, n, JSON_ENCODE_ANY);
    s[n] = 0;
    if (len) *len = n;
    return s;
}

/* ---- Claude Code's billing line ---- */

char *chat_strip_billing(const char *text, size_t len, size_t *out_len, bool *nomem) {
    if (nomem) *nomem = false;
    size_t plen = strlen(BILLING_PREFIX);
    bool found = false;
    for (size_t i = 0; i < len && !found; i++) {
        if (i && text[i - 1] != '\n') continue;
        size_t j = i;
        while (j < len && (text[j] == ' ' || text[j] == '\t')) j++;
        if (len - j >= plen && !strncmp(text + j, BILLING_PREFIX, plen)) found = true;
    }
    if (!found) return NULL;
    char *out = hn_malloc(len + 1);
    if (!out) {
        if (nomem) *nomem = true;
        return NULL;
    }
    size_t n = 0;
    bool after = false; /* right after a billing line: its blank separator lines go too */
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        size_t j = i;
        while (j < end && (text[j] == ' ' || text[j] == '\t')) j++;
        bool billing = end - j >= plen && !strncmp(text + j, BILLING_PREFIX, plen);
        bool blank = j == end || text[j] == '\n';
        if (!billing && !(after && blank)) {
            memcpy(out + n, text + i, end - i);
            n += end - i;
        }
        after = billing || (after && blank);
        i = end;
    }
    out[n] = 0;
    if (out_len) *out_len = n;
    return out;
}

/* Strips the billing line from a system message's content in place (string or
 * text parts; parts left empty are removed). Returns -1 on allocation failure,
 * else 1 when the message has no text left, 0 otherwise. */
static int strip_billing_content(json_t *msg) {
    json_t *content = json_object_get(msg, "content");
    bool nomem;
    size_t n;
    if (json_is_string(content)) {
        char *s = chat_strip_billing(json_string_value(content), json_string_length(content), &n, &nomem);
        if (nomem) return -1;
        if (!s) return 0;
        int rc = json_object_set_new(msg, "content", json_stringn(s, n)) ? -1 : n == 0;
        hn_free(s);
        return rc;
    }
    if (!json_is_array(content)) return 0;
    bool stripped = false;
    for (size_t i = 0; i < json_array_size(content);) {
        json_t *part = json_array_get(content, i);
        json_t *tx = json_object_get(part, "text");
        if (!json_is_string(tx)) {
            i++;
            continue;
        }
        char *s = chat_strip_billing(json_string_value(tx), json_string_length(tx), &n, &nomem);
        if (nomem) return -1;
        if (!s) {
            i++;
            continue;
        }
        stripped = true;
        int bad = n ? json_object_set_new(part, "text", json_stringn(s, n)) : json_array_remove(content, i);
        hn_free(s);
        if (bad) return -1;
        if (n) i++;
    }
    return stripped && json_array_size(content) == 0;
}

/* ---- tool-call ids and arguments ---- */

static bool short_id_shape(const char *id) {
    size_t n = 0;
    for (; id[n]; n++)
        if (!((id[n] >= 'a' && id[n] <= 'z') || (id[n] >= 'A' && id[n] <= 'Z') || (id[n] >= '0' && id[n] <= '9')))
            return false;
    return n == 9;
}

/* Replaces the string under key with its 9-alphanumeric form (FNV-1a, base 62),
 * unless it already has that shape. Returns -1 on allocation failure. */
static int shorten_id(json_t *obj, const char *key) {
    const char *id = json_string_value(json_object_get(obj, key));
    if (!id || short_id_shape(id)) return 0;
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) h = (h ^ *p) * 1099511628211ull;
    char out[10];
    for (int i = 0; i < 9; i++) {
        out[i] = digits[h % 62];
        h /= 62;
        if (i == 4) h ^= h * 0x9e3779b97f4a7c15ull + (uint64_t)i;
    }
    out[9] = 0;
    return json_object_set_new(obj, key, json_string(out)) ? -1 : 0;
}

/* Puts one call's function.arguments in the form the template uses. */
static int fix_arguments(const chat_caps *caps, json_t *call) {
    json_t *fn = json_object_get(call, "function");
    json_t *args = json_object_get(fn, "arguments");
    if (!args) return 0;
    if (json_is_string(args)) {
        if (caps->args_string || !caps->args_object) return 0;
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            return 0; /* not JSON: the template gets the text as sent */
        }
        return json_object_set_new(fn, "arguments", parsed) ? -1 : 0;
    }
    if (caps->args_object || !caps->args_string) return 0;
    /* a string-only template: json.dumps's default separators, key order kept */
    size_t n;
    char *s = dump(args, &n);
    if (!s) return -1;
    int rc = json_object_set_new(fn, "arguments", json_stringn(s, n)) ? -1 : 0;
    hn_free(s);
    return rc;
}

/* ---- normalisation ---- */

/* Appends (at_end) or prepends text to a user message's content, joined by "\n\n". */
static int join_text(json_t *user, const char *text, size_t tlen, bool at_end) {
    json_t *cur = content_as_string(json_object_get(user, "content"));
    if (!cur) return -1;
    size_t clen = json_string_length(cur);
    size_t sep = clen ? 2 : 0;
    char *buf = hn_malloc(clen + tlen + sep + 1);
    if (!buf) {
        json_decref(cur);
        return -1;
    }
    const char *a = at_end ? json_string_value(cur) : text, *b = at_end ? text : json_string_value(cur);
    size_t alen = at_end ? clen : tlen, blen = at_end ? tlen : clen;
    memcpy(buf, a, alen);
    memcpy(buf + alen, "\n\n", sep);
    memcpy(buf + alen + sep, b, blen);
    int rc = json_object_set_new(user, "content", json_stringn(buf, alen + sep + blen)) ? -1 : 0;
    hn_free(buf);
    json_decref(cur);
    return rc;
}

/* Text appended (joined by "\n\n") to the content of a message of the list
 * being built, kept here until another message follows: a run of demoted
 * system messages copies each text once instead of the content each time. */
typedef struct tail_text {
    json_t *of; /* the message, or NULL */
    char *d;
    size_t n, cap;
} tail_text;

static int tail_put(tail_text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n + 1) cap *= 2;
        char *d = hn_realloc(t->d, cap);
        if (!d) return -1;
        t->d = d;
        t->cap = cap;
    }
    memcpy(t->d + t->n, s, n);
    t->n += n;
    return 0;
}

/* Sets the message's content to the text so far. */
static int tail_flush(tail_text *t) {
    if (!t->of) return 0;
    int rc = json_object_set_new(t->of, "content", json_stringn(t->d ? t->d : "", t->n)) ? -1 : 0;
    t->of = NULL;
    t->n = 0;
    return rc;
}

/* join_text(msg, text, tlen, true), msg being the last message of the list. */
static int tail_join(tail_text *t, json_t *msg, const char *text, size_t tlen) {
    if (t->of != msg) {
        if (tail_flush(t)) return -1;
        json_t *cur = content_as_string(json_object_get(msg, "content"));
        int rc = cur ? tail_put(t, json_string_value(cur), json_string_length(cur)) : -1;
        json_decref(cur);
        if (rc) return -1;
        t->of = msg;
    }
    if (t->n && tail_put(t, "\n\n", 2)) return -1;
    return tail_put(t, text, tlen);
}

/* Appends m to the list (stealing it), the text joined to the last one set first. */
static int list_append(json_t *res, tail_text *t, json_t *m) {
    if (tail_flush(t)) {
        json_decref(m);
        return -1;
    }
    return json_array_append_new(res, m) ? -1 : 0;
}

/* "<system-reminder>\nTEXT\n</system-reminder>" for a system message's content. */
static char *reminder_text(const json_t *msg, size_t *len) {
    json_t *s = content_as_string(json_object_get(msg, "content"));
    if (!s) return NULL;
    size_t o = strlen(REMINDER_OPEN), c = strlen(REMINDER_CLOSE), n = json_string_length(s);
    char *buf = hn_malloc(o + n + c + 1);
    if (buf) {
        memcpy(buf, REMINDER_OPEN, o);
        memcpy(buf + o, json_string_value(s), n);
        memcpy(buf + o + n, REMINDER_CLOSE, c + 1);
        *len = o + n + c;
    }
    json_decref(s);
    return buf;
}

static int fix_message(const chat_caps *caps, json_t *m) {
    json_t *content = json_object_get(m, "content");
    if (!content || json_is_null(content)) {
        if (json_object_set_new(m, "content", json_string(""))) return -1;
    } else if (json_is_array(content) && !caps->parts) {
        json_t *s = content_as_string(content);
        if (!s || json_object_set_new(m, "content", s)) return -1;
    }
    if (is_role(m, "developer") && !caps->developer_role && json_object_set_new(m, "role", json_string("system")))
        return -1;
    if (is_role(m, "assistant")) {
        json_t *calls = json_object_get(m, "tool_calls"), *call;
        size_t i;
        json_array_foreach(calls, i, call) {
            if (!json_is_object(call)) continue;
            if (fix_arguments(caps, call)) return -1;
            if (caps->short_ids && shorten_id(call, "id")) return -1;
        }
        json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc)) {
            if (caps->alias_thinking && !json_object_get(m, "thinking") && json_object_set(m, "thinking", rc))
                return -1;
            if (caps->alias_reasoning && !json_object_get(m, "reasoning") && json_object_set(m, "reasoning", rc))
                return -1;
        }
    }
    if (is_role(m, "tool") && caps->short_ids && shorten_id(m, "tool_call_id")) return -1;
    return 0;
}

hn_status chat_normalize(const chat_template *t, const json_t *messages, bool demote_all, json_t **out,
                         int *n_demoted, hn_err *err) {
    *out = NULL;
    if (n_demoted) *n_demoted = 0;
    if (!json_is_array(messages)) return hn_errf(err, HN_ERR_INVALID, "messages must be an array");
    const chat_caps *caps = &t->caps;
    json_t *res = json_array();
    char *lead = NULL, *pending = NULL; /* a refused leading system text; a reminder for the next user */
    size_t lead_len = 0, pending_len = 0;
    tail_text tail = {0};
    int demoted = 0;
    hn_status st = HN_OK;
    size_t n = json_array_size(messages);
    if (!res) goto nomem;
    for (size_t i = 0; i < n; i++) {
        const json_t *src = json_array_get(messages, i);
        if (!json_is_object(src) || !role_of(src)) {
            st = hn_errf(err, HN_ERR_INVALID, "messages[%zu] must be an object with a string role", i);
            goto fail;
        }
        json_t *m = json_deep_copy(src);
        if (!m || fix_message(caps, m)) {
            json_decref(m);
            goto nomem;
        }
        if (is_role(m, "system") && i == 0) {
            int empty = strip_billing_content(m);
            if (empty < 0) {
                json_decref(m);
                goto nomem;
            }
            if (empty) { /* only the billing line: as if there were no system message */
                json_decref(m);
                continue;
            }
            if (!caps->system_role) { /* merged into the first user message */
                json_t *s = content_as_string(json_object_get(m, "content"));
                json_decref(m);
                if (!s) goto nomem;
                lead = dup_n(json_string_value(s), json_string_length(s));
                lead_len = json_string_length(s);
                json_decref(s);
                if (!lead) goto nomem;
                continue;
            }
        } else if (is_role(m, "system") && (demote_all || !caps->system_in_place)) {
            size_t tl = 0;
            char *text = reminder_text(m, &tl);
            json_decref(m);
            if (!text) goto nomem;
            demoted++;
            json_t *prev = json_array_size(res) ? json_array_get(res, json_array_size(res) - 1) : NULL;
            const json_t *next = i + 1 < n ? json_array_get(messages, i + 1) : NULL;
            int rc = 0;
            if (prev && (is_role(prev, "user") || is_role(prev, "tool")) && !pending) {
                rc = tail_join(&tail, prev, text, tl);
            } else if (next && is_role(next, "user")) {
                char *np = hn_realloc(pending, pending_len + tl + 3);
                if (!np) rc = -1;
                else {
                    if (pending_len) memcpy(np + pending_len, "\n\n", 2), pending_len += 2;
                    memcpy(np + pending_len, text, tl);
                    pending_len += tl;
                    np[pending_len] = 0;
                    pending = np;
                }
            } else {
                json_t *u = json_pack("{s:s,s:s%}", "role", "user", "content", text, tl);
                rc = !u || list_append(res, &tail, u) ? -1 : 0;
            }
            hn_free(text);
            if (rc) goto nomem;
            continue;
        }
        if (is_role(m, "user")) {
            int rc = 0;
            if (pending) rc = join_text(m, pending, pending_len, false);
            if (!rc && lead) rc = join_text(m, lead, lead_len, false);
            hn_free(pending);
            hn_free(lead);
            pending = lead = NULL;
            if (rc) {
                json_decref(m);
                goto nomem;
            }
        }
        if (list_append(res, &tail, m)) goto nomem;
    }
    if (lead || pending) { /* nothing to merge into: the text stands as a user message */
        json_t *u = json_pack("{s:s,s:s%}", "role", "user", "content", lead ? lead : pending,
                              lead ? lead_len : pending_len);
        if (!u || list_append(res, &tail, u)) goto nomem;
    }
    if (tail_flush(&tail)) goto nomem;
    hn_free(tail.d);
    hn_free(lead);
    hn_free(pending);
    *out = res;
    if (n_demoted) *n_demoted = demoted;
    return HN_OK;
nomem:
    st = hn_errf(err, HN_ERR_NOMEM, "out of memory normalising messages");
fail:
    hn_free(tail.d);
    hn_free(lead);
    hn_free(pending);
    json_decref(res);
    return st;
}

/* ---- literal control-token text in request strings ---- */

/* U+FDD0, a noncharacter: put before control-token text found in request
 * strings, found again in the rendered text and removed there; requests
 * cannot smuggle one in (removed from their strings first). */
#define LIT_MARK "\xEF\xB7\x90"
#define LIT_MARK_LEN 3

/* Whether the template knows any control-token text. */
static bool chat_has_controls(const chat_template *t) {
    if (t->n_ctl) return true;
    for (int i = 0; i < 256; i++)
        if (t->ctl_one[i]) return true;
    return false;
}

/* The longest control text at s[0..n), or 0. */
static size_t ctl_at(const chat_template *t, const char *s, size_t n) {
    if (!n) return 0;
    size_t one = t->ctl_one[(unsigned char)s[0]];
    if (n < 2) return one;
    uint16_t pair = (uint16_t)((unsigned char)s[0] << 8 | (unsigned char)s[1]);
    if (!(t->ctl_pairs[pair >> 3] & (1u << (pair & 7)))) return one;
    size_t lo = 0, hi = t->n_ctl; /* the first text starting with pair */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->ctl_pair[mid] < pair) lo = mid + 1;
        else hi = mid;
    }
    for (size_t k = lo; k < t->n_ctl && t->ctl_pair[k] == pair; k++)
        if (t->ctl_len[k] <= n && !memcmp(s, t->ctl[k], t->ctl_len[k])) return t->ctl_len[k];
    return one;
}

/* s with LIT_MARK before each control text (and marks it had dropped), as a
 * new string; NULL with *nomem false when nothing changes. */
static char *mark_str(const chat_template *t, const char *s, size_t n, size_t *out_n, bool *nomem) {
    *nomem = false;
    size_t extra = 0;
    bool change = false;
    for (size_t i = 0; i < n; i++) {
        if (n - i >= LIT_MARK_LEN && !memcmp(s + i, LIT_MARK, LIT_MARK_LEN)) change = true;
        else if (ctl_at(t, s + i, n - i)) change = true, extra += LIT_MARK_LEN;
    }
    if (!change) return NULL;
    char *d = hn_malloc(n + extra + 1);
    if (!d) {
        *nomem = true;
        return NULL;
    }
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        if (n - i >= LIT_MARK_LEN && !memcmp(s + i, LIT_MARK, LIT_MARK_LEN)) {
            i += LIT_MARK_LEN;
        } else if ((l = ctl_at(t, s + i, n - i))) {
            memcpy(d + w, LIT_MARK, LIT_MARK_LEN);
            memcpy(d + w + LIT_MARK_LEN, s + i, l);
            w += LIT_MARK_LEN + l;
            i += l;
        } else {
            d[w++] = s[i++];
        }
    }
    d[w] = 0;
    *out_n = w;
    return d;
}

/* Marks every string in v (keys included), in place. 0, or -1 out of memory. */
static int mark_value(const chat_template *t, json_t *v, int depth) {
    if (depth > 256) return 0;
    bool nomem;
    size_t n;
    if (json_is_string(v)) {
        char *d = mark_str(t, json_string_value(v), json_string_length(v), &n, &nomem);
        if (nomem) return -1;
        if (!d) return 0;
        int r = json_string_setn_nocheck(v, d, n);
        hn_free(d);
        return r ? -1 : 0;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) if (mark_value(t, x, depth + 1)) return -1;
        return 0;
    }
    if (!json_is_object(v)) return 0;
    const char *k;
    json_t *x;
    bool keys = false;
    json_object_foreach(v, k, x) {
        char *d = mark_str(t, k, strlen(k), &n, &nomem);
        if (nomem) return -1;
        if (d) keys = true;
        hn_free(d);
        if (mark_value(t, x, depth + 1)) return -1;
    }
    if (!keys) return 0;
    /* a key spells a control token: rebuild the object in order */
    json_t *o = json_object();
    if (!o) return -1;
    json_object_foreach(v, k, x) {
        char *d = mark_str(t, k, strlen(k), &n, &nomem);
        if (nomem || json_object_set(o, d ? d : k, x)) {
            hn_free(d);
            json_decref(o);
            return -1;
        }
        hn_free(d);
    }
    json_object_clear(v);
    int r = json_object_update(v, o);
    json_decref(o);
    return r ? -1 : 0;
}

/* Removes the marks from rendered text, recording where marked control text
 * survived as spans. 0, or -1 out of memory. */
static int strip_marks(const chat_template *t, char *text, size_t *len, chat_prompt *out) {
    size_t n = *len, w = 0, cap = 0;
    for (size_t r = 0; r < n;) {
        if (n - r >= LIT_MARK_LEN && !memcmp(text + r, LIT_MARK, LIT_MARK_LEN)) {
            r += LIT_MARK_LEN;
            size_t l = ctl_at(t, text + r, n - r);
            if (!l) continue;
            if (out->n_spans == cap) {
                size_t nc = cap ? cap * 2 : 8;
                size_t *ns = hn_realloc(out->spans, nc * 2 * sizeof *ns);
                if (!ns) return -1;
                out->spans = ns;
                cap = nc;
            }
            out->spans[2 * out->n_spans] = w;
            out->spans[2 * out->n_spans + 1] = w + l;
            out->n_spans++;
            memmove(text + w, text + r, l);
            w += l;
            r += l;
            continue;
        }
        text[w++] = text[r++];
    }
    text[w] = 0;
    *len = w;
    return 0;
}

/* ---- rendering ---- */

/* The variables of one render; NULL on allocation failure. */
static json_t *make_vars(const chat_template *t, json_t *msgs, const json_t *tools, const chat_options *opt) {
    json_t *v = json_object();
    if (!v) return NULL;
    if (opt && json_is_object(opt->kwargs)) {
        json_t *kw = json_deep_copy(opt->kwargs); /* marked below: not the caller's */
        int r = kw ? json_object_update(v, kw) : -1;
        json_decref(kw);
        if (r) goto fail;
    }
    bool no_tools = !tools || json_is_null(tools) || (json_is_array(tools) && json_array_size(tools) == 0);
    if (json_object_set(v, "messages", msgs) ||
        json_object_set_new(v, "tools", no_tools ? json_null() : json_deep_copy(tools)))
        goto fail;
    /* everything so far came from the request; what follows is the template's */
    if (chat_has_controls(t) && mark_value(t, v, 0)) goto fail;
    if (json_object_set_new(v, "add_generation_prompt", json_boolean(opt && opt->add_generation_prompt))) goto fail;
    if (!json_object_get(v, "documents") && json_object_set_new(v, "documents", json_null())) goto fail;
    if (!json_object_get(v, "bos_token") && json_object_set_new(v, "bos_token", json_string(t->bos))) goto fail;
    if (!json_object_get(v, "eos_token") && json_object_set_new(v, "eos_token", json_string(t->eos))) goto fail;
    if (opt && opt->thinking != CHAT_THINK_DEFAULT &&
        json_object_set_new(v, "enable_thinking", json_boolean(opt->thinking == CHAT_THINK_ON)))
        goto fail;
    return v;
fail:
    json_decref(v);
    return NULL;
}

static bool has_system_after_first(const json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) if (i > 0 && is_role(m, "system")) return true;
    return false;
}

hn_status chat_render(const chat_template *t, const json_t *messages, const json_t *tools,
                      const chat_options *opt, chat_prompt *out, hn_err *err) {
    memset(out, 0, sizeof *out);
    tpl_options topt = {0};
    if (opt) topt.now = opt->now;
    for (int attempt = 0; attempt < 2; attempt++) {
        json_t *msgs;
        int nd = 0;
        hn_status st = chat_normalize(t, messages, attempt == 1, &msgs, &nd, err);
        if (st != HN_OK) return st;
        bool in_place = has_system_after_first(msgs);
        json_t *vars = make_vars(t, msgs, tools, opt);
        json_decref(msgs);
        if (!vars) return hn_errf(err, HN_ERR_NOMEM, "out of memory building template variables");
        tpl_buf b = {0};
        tpl_errkind kind = TPL_E_NONE;
        st = tpl_render(t->tpl, vars, &topt, &b, &kind, err);
        json_decref(vars);
        if (st == HN_OK) {
            if (!b.data && !(b.data = hn_calloc(1, 1))) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
            if (chat_has_controls(t) && strip_marks(t, b.data, &b.len, out)) {
                tpl_buf_free(&b);
                chat_prompt_free(out);
                return hn_errf(err, HN_ERR_NOMEM, "out of memory");
            }
            out->text = b.data;
            out->len = b.len;
            out->n_demoted = nd;
            out->opens_think = tc_prompt_opens_think(b.data, b.len) != 0;
            return HN_OK;
        }
        tpl_buf_free(&b);
        out->errkind = kind;
        if (kind == TPL_E_NOMEM) return hn_errf(err, HN_ERR_NOMEM, "out of memory rendering the chat template");
        if (!(kind == TPL_E_RAISE && in_place && attempt == 0)) break;
        /* the template refused a system message where it stood: demote them all */
    }
    if (err && err->code == HN_OK) hn_errf(err, HN_ERR_INVALID, "chat template failed");
    if (err) err->code = HN_ERR_INVALID;
    return HN_ERR_INVALID;
}

void chat_prompt_free(chat_prompt *p) {
    if (!p) return;
    hn_free(p->text);
    hn_free(p->spans);
    memset(p, 0, sizeof *p);
}

/* ---- probes ---- */

static const char PROBE_TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"probe_tool\",\"description\":\"A probe.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"probe_arg\":{\"type\":\"string\"}},"
    "\"required\":[\"probe_arg\"]}}}]";
#define PROBE_ARGS "{\"probe_arg\": \"probe-value-91\"}"

/* Renders a probe conversation (JSON text) with the raw template; returns the
 * output (hn_malloc'd) or NULL when it fails. */
static char *probe(const chat_template *t, const char *msgs_json, const json_t *tools, bool gen) {
    json_t *msgs = json_loads(msgs_json, 0, NULL);
    if (!msgs) return NULL;
    chat_options o = {0};
    o.add_generation_prompt = gen;
    json_t *vars = make_vars(t, msgs, tools, &o);
    json_decref(msgs);
    if (!vars) return NULL;
    tpl_options topt = {0};
    topt.max_output = PROBE_MAX_OUTPUT;
    topt.now = 1750000000;
    tpl_buf b = {0};
    hn_status st = tpl_render(t->tpl, vars, &topt, &b, NULL, NULL);
    json_decref(vars);
    if (st != HN_OK) {
        tpl_buf_free(&b);
        return NULL;
    }
    return b.data ? b.data : hn_calloc(1, 1);
}

static const char *find(const char *hay, const char *needle) { return hay ? strstr(hay, needle) : NULL; }

/* A tool-call exchange with the given id and arguments (JSON text of the value). */
static char *call_conv(const char *id, const char *args_json) {
    static const char fmt[] =
        "[{\"role\":\"user\",\"content\":\"probe-user-1\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"%s\",\"type\":\"function\","
        "\"function\":{\"name\":\"probe_tool\",\"arguments\":%s}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"%s\",\"name\":\"probe_tool\",\"content\":\"probe-result\"},"
        "{\"role\":\"assistant\",\"content\":\"probe-reply-2\"},"
        "{\"role\":\"user\",\"content\":\"probe-user-2\"}]";
    size_t n = sizeof fmt + 2 * strlen(id) + strlen(args_json);
    char *s = hn_malloc(n);
    if (s) snprintf(s, n, fmt, id, args_json, id);
    return s;
}

static char *probe_calls(const chat_template *t, const json_t *tools, const char *id, const char *args_json) {
    char *conv = call_conv(id, args_json);
    char *r = conv ? probe(t, conv, tools, true) : NULL;
    hn_free(conv);
    return r;
}

static void run_probes(chat_template *t) {
    chat_caps *c = &t->caps;
    json_t *ptools = json_loads(PROBE_TOOLS, 0, NULL);
    const json_t *tools = NULL;
    static const char base[] = "[{\"role\":\"user\",\"content\":\"probe-user-1\"},"
                               "{\"role\":\"assistant\",\"content\":\"probe-reply-1\"},"
                               "{\"role\":\"user\",\"content\":\"probe-user-2\"}]";
    char *r = probe(t, base, NULL, true);
    if (!r) tools = ptools; /* e.g. Hermes tool_use templates need tools to render at all */
    hn_free(r);

    r = probe(t, "[{\"role\":\"system\",\"content\":\"probe-sys-lead\"},{\"role\":\"user\",\"content\":\"probe-user-1\"}]",
              tools, true);
    c->system_role = find(r, "probe-sys-lead") != NULL;
    hn_free(r);

    r = probe(t, "[{\"role\":\"user\",\"content\":\"probe-user-1\"},{\"role\":\"assistant\",\"content\":\"probe-reply-1\"},"
                 "{\"role\":\"system\",\"content\":\"probe-sys-mid\"},{\"role\":\"user\",\"content\":\"probe-user-2\"}]",
              tools, true);
    const char *sys = find(r, "probe-sys-mid"), *reply = find(r, "probe-reply-1"), *u2 = find(r, "probe-user-2");
    c->system_in_place = sys && reply && u2 && reply < sys && sys < u2;
    hn_free(r);

    r = probe(t, "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"probe-part-1\"}]}]", tools, true);
    c->parts = find(r, "probe-part-1") && !find(r, "'type'") && !find(r, "\"type\"");
    hn_free(r);

    /* arguments: as a mapping, and as the JSON string a client replays */
    r = probe_calls(t, ptools, "Pr0beId01", PROBE_ARGS);
    c->args_object = find(r, "probe-value-91") && !find(r, "'probe_arg'");
    hn_free(r);
    json_t *as_str = json_string(PROBE_ARGS);
    char *str_json = as_str ? dump(as_str, NULL) : NULL;
    json_decref(as_str);
    r = str_json ? probe_calls(t, ptools, "Pr0beId01", str_json) : NULL;
    c->args_string = find(r, PROBE_ARGS) != NULL;
    hn_free(r);

    /* ids: fine as OpenAI-style long ids, or only as 9 alphanumerics (Mistral) */
    if (c->args_object || c->args_string) {
        const char *args = c->args_string ? str_json : PROBE_ARGS;
        r = probe_calls(t, ptools, "call_0123456789abcdefghijklmn", args);
        c->short_ids = r == NULL;
        hn_free(r);
    }
    hn_free(str_json);
    json_decref(ptools);
}

/* ---- creation ---- */

hn_status chat_template_new(const char *src, size_t len, const char *bos, const char *eos,
                            tc_has_token_fn has_token, void *user, chat_template **out, hn_err *err) {
    *out = NULL;
    chat_template *t = hn_calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    t->src = dup_n(src ? src : "", src ? len : 0);
    t->bos = dup_n(bos ? bos : "", bos ? strlen(bos) : 0);
    t->eos = dup_n(eos ? eos : "", eos ? strlen(eos) : 0);
    if (!t->src || !t->bos || !t->eos) {
        chat_template_free(t);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    hn_status st = tpl_compile(t->src, len, &t->tpl, err);
    if (st != HN_OK) {
        chat_template_free(t);
        return st;
    }
    t->det = tc_detect(t->src, has_token, user);
    bool rc = strstr(t->src, "reasoning_content") != NULL;
    t->caps.alias_thinking = !rc && reads_attr(t->src, "thinking");
    t->caps.alias_reasoning = !rc && reads_attr(t->src, "reasoning");
    t->caps.developer_role = strstr(t->src, "<|channel|>") != NULL;
    run_probes(t);
    *out = t;
    return HN_OK;
}

/* has_token for tc_detect: the text encodes to exactly one token that renders back as the text. */
static int vocab_has_token(void *user, const char *text) {
    const tok_vocab *v = user;
    int32_t ids[2];
    if (tok_encode(v, text, strlen(text), false, true, ids, 2) != 1) return 0;
    char buf[256];
    int32_t n = tok_piece(v, ids[0], true, buf, (int32_t)sizeof buf);
    return n >= 0 && (size_t)n == strlen(text) && !memcmp(buf, text, (size_t)n);
}

/* The text of a special token (as templates spell it), or "" when absent. */
static char *token_text(const tok_vocab *v, int32_t id) {
    if (id < 0) return dup_n("", 0);
    char small[256];
    int32_t n = tok_piece(v, id, true, small, (int32_t)sizeof small);
    if (n < 0) return dup_n("", 0);
    if (n <= (int32_t)sizeof small) return dup_n(small, (size_t)n);
    char *big = hn_malloc((size_t)n + 1);
    if (big && tok_piece(v, id, true, big, n) == n) big[n] = 0;
    return big;
}

/* Remembers the vocabulary's control-token texts (see chat_template_from_gguf). */
typedef struct ctl_ent {
    const char *s;
    size_t len;
} ctl_ent;

static int cmp_ctl(const void *a, const void *b) {
    const ctl_ent *x = a, *y = b;
    unsigned px = (unsigned char)x->s[0] << 8 | (unsigned char)x->s[1], py = (unsigned char)y->s[0] << 8 | (unsigned char)y->s[1];
    if (px != py) return px < py ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return memcmp(x->s, y->s, x->len);
}

static hn_status set_controls(chat_template *t, const tok_vocab *v, hn_err *err) {
    int32_t nv = tok_n_vocab(v);
    size_t n = 0, l;
    for (int32_t id = 0; id < nv; id++) n += tok_is_control(v, id, &l) && l > 1;
    for (int32_t id = 0; id < nv; id++)
        if (tok_is_control(v, id, &l) && l == 1) t->ctl_one[(unsigned char)tok_text(v, id)[0]] = 1;
    if (!n) return HN_OK;
    ctl_ent *e = hn_malloc(n * sizeof *e);
    t->ctl = hn_calloc(n, sizeof *t->ctl);
    t->ctl_len = hn_calloc(n, sizeof *t->ctl_len);
    t->ctl_pair = hn_calloc(n, sizeof *t->ctl_pair);
    if (!e || !t->ctl || !t->ctl_len || !t->ctl_pair) {
        hn_free(e);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    size_t k = 0;
    for (int32_t id = 0; id < nv; id++)
        if (tok_is_control(v, id, &l) && l > 1) e[k].s = tok_text(v, id), e[k].len = l, k++;
    qsort(e, n, sizeof *e, cmp_ctl);
    for (k = 0; k < n; k++) {
        if (!(t->ctl[k] = dup_n(e[k].s, e[k].len))) {
            hn_free(e);
            return hn_errf(err, HN_ERR_NOMEM, "out of memory");
        }
        t->n_ctl = k + 1;
        t->ctl_len[k] = e[k].len;
        uint16_t pair = (uint16_t)((unsigned char)e[k].s[0] << 8 | (unsigned char)e[k].s[1]);
        t->ctl_pair[k] = pair;
        t->ctl_pairs[pair >> 3] |= (uint8_t)(1u << (pair & 7));
    }
    hn_free(e);
    return HN_OK;
}

hn_status chat_template_from_gguf(const gguf_ctx *g, const tok_vocab *v, chat_template **out, hn_err *err) {
    *out = NULL;
    const gguf_value *val = gguf_get(g, "tokenizer.chat_template");
    if (!val || val->type != GGUF_STRING)
        return hn_errf(err, HN_ERR_NOT_FOUND, "the model has no tokenizer.chat_template");
    char *bos = token_text(v, tok_bos(v)), *eos = token_text(v, tok_eos(v));
    hn_status st;
    if (!bos || !eos) st = hn_errf(err, HN_ERR_NOMEM, "out of memory");
    else
        st = chat_template_new(val->v.str.ptr, (size_t)val->v.str.len, bos, eos, vocab_has_token, (void *)v, out,
                               err);
    hn_free(bos);
    hn_free(eos);
    if (st == HN_OK && (st = set_controls(*out, v, err)) != HN_OK) {
        chat_template_free(*out);
        *out = NULL;
    }
    return st;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    tpl_free(t->tpl);
    hn_free(t->src);
    hn_free(t->bos);
    hn_free(t->eos);
    for (size_t k = 0; k < t->n_ctl; k++) hn_free(t->ctl[k]);
    hn_free(t->ctl);
    hn_free(t->ctl_len);
    hn_free(t->ctl_pair);
    hn_free(t);
}

const chat_caps *chat_template_caps(const chat_template *t) { return &t->caps; }
tc_detection chat_template_format(const chat_template *t) { return t->det; }
const char *chat_template_source(const chat_template *t) { return t->src; }

/* ---- tokenizing ---- */

hn_status chat_tokenize(const tok_vocab *v, const char *prompt, size_t len, int32_t **tokens, int64_t *n,
                        hn_err *err) {
    return chat_tokenize_spans(v, prompt, len, NULL, 0, tokens, n, err);
}

hn_status chat_tokenize_spans(const tok_vocab *v, const char *prompt, size_t len, const size_t *spans_in, size_t n_spans,
                              int32_t **tokens, int64_t *n, hn_err *err) {
    *tokens = NULL;
    *n = 0;
    /* llama.cpp's rule: when the vocabulary adds BOS (EOS) itself, a BOS (EOS)
     * text the template already wrote is dropped, so there is exactly one
     * (not when that text came from the request: it stays text). */
    char *bos = tok_add_bos(v) ? token_text(v, tok_bos(v)) : NULL;
    char *eos = tok_add_eos(v) ? token_text(v, tok_eos(v)) : NULL;
    if ((tok_add_bos(v) && !bos) || (tok_add_eos(v) && !eos)) {
        hn_free(bos);
        hn_free(eos);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    size_t bl = bos ? strlen(bos) : 0, el = eos ? strlen(eos) : 0, shift = 0;
    bool lit_first = n_spans && spans_in[0] == 0, lit_last = n_spans && spans_in[2 * n_spans - 1] == len;
    if (bl && len >= bl && !lit_first && !memcmp(prompt, bos, bl)) prompt += bl, len -= bl, shift = bl;
    if (el && len >= el && !lit_last && !memcmp(prompt + len - el, eos, el)) len -= el;
    hn_free(bos);
    hn_free(eos);
    size_t *spans = NULL;
    if (n_spans) { /* in the trimmed text's offsets */
        spans = hn_malloc(n_spans * 2 * sizeof *spans);
        if (!spans) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < n_spans; i++) {
            size_t a = spans_in[2 * i] > shift ? spans_in[2 * i] - shift : 0;
            size_t b = spans_in[2 * i + 1] > shift ? spans_in[2 * i + 1] - shift : 0;
            if (b > len) b = len;
            if (a < b) spans[2 * k] = a, spans[2 * k + 1] = b, k++;
        }
        n_spans = k;
    }
    int64_t cap = (int64_t)len + 4; /* every token covers at least one byte, plus BOS/EOS */
    int32_t *buf = hn_malloc((size_t)cap * sizeof *buf);
    if (!buf) {
        hn_free(spans);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory tokenizing the prompt");
    }
    int64_t got = tok_encode_spans(v, prompt, len, true, spans, n_spans, buf, cap);
    if (got > cap) { /* cannot happen by the bound above; handled anyway */
        int32_t *nb = hn_realloc(buf, (size_t)got * sizeof *buf);
        if (!nb) {
            hn_free(buf);
            hn_free(spans);
            return hn_errf(err, HN_ERR_NOMEM, "out of memory tokenizing the prompt");
        }
        buf = nb;
        cap = got;
        got = tok_encode_spans(v, prompt, len, true, spans, n_spans, buf, cap);
    }
    hn_free(spans);
    if (got < 0 || got > cap) {
        hn_free(buf);
        return hn_errf(err, HN_ERR_INTERNAL, "tokenizing the prompt failed");
    }
    *tokens = buf;
    *n = got;
    return HN_OK;
}

/* ---- where the next turn stops repeating this prompt ---- */

/* The conversation with a next turn a client may send after this prompt's
 * reply (CHAT_RESUME_*): a user message after a text reply, or a tool result
 * after a call of the first tool, its reasoning dropped or sent back; NULL
 * (with *nomem false) for a tool turn without tools. Shallow: the caller's
 * messages are shared. */
static json_t *next_turn(const json_t *messages, const json_t *tools, int kind, bool *nomem) {
    const char *name = json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "name"));
    *nomem = false;
    if (kind != CHAT_RESUME_USER && !name) return NULL;
    json_t *m = json_array();
    int bad = !m || json_array_extend(m, (json_t *)messages);
    if (!bad && kind != CHAT_RESUME_USER) {
        json_t *a = json_pack("{s:s,s:s,s:[{s:s,s:s,s:{s:s,s:{}}}]}", "role", "assistant", "content", "", "tool_calls",
                              "id", "call_0", "type", "function", "function", "name", name, "arguments");
        if (a && kind == CHAT_RESUME_TOOL_REASONING) bad = json_object_set_new(a, "reasoning_content", json_string("OK"));
        bad |= json_array_append_new(m, a);
        bad |= json_array_append_new(m, json_pack("{s:s,s:s,s:s}", "role", "tool", "tool_call_id", "call_0", "content",
                                                  "OK"));
    } else if (!bad) {
        bad = json_array_append_new(m, json_pack("{s:s,s:s}", "role", "assistant", "content", "OK"));
        bad |= json_array_append_new(m, json_pack("{s:s,s:s}", "role", "user", "content", "OK"));
    }
    if (bad) {
        json_decref(m);
        *nomem = true;
        return NULL;
    }
    return m;
}

/* Splits for tail tokenizing: the index of the last control token of tokens
 * (the template's own markup: never matched inside request text) that ends
 * within the first c bytes of text, and its offset in *at; -1 when there is
 * none or the token pieces do not tile the text's end (a SentencePiece space
 * prefix, say): the caller tokenizes everything then. Text split at a control
 * token tokenizes as its two parts do, so the part before it needs no work. */
static int64_t control_before(const tok_vocab *v, const char *text, size_t len, const int32_t *tokens, int64_t n,
                              size_t c, size_t *at) {
    size_t end = len;
    for (int64_t i = n - 1; i >= 1; i--) { /* token 0 may be a BOS the text does not spell */
        int32_t pl = tok_piece(v, tokens[i], true, NULL, 0);
        size_t cl;
        if (pl < 0 || (size_t)pl > end) return -1;
        end -= (size_t)pl;
        if (end + (size_t)pl > c || !tok_is_control(v, tokens[i], &cl)) continue;
        const char *s = tok_text(v, tokens[i]);
        if (cl != (size_t)pl || !s || memcmp(text + end, s, cl)) return -1;
        *at = end;
        return i;
    }
    return -1;
}

/* How many of the prompt's tokens the probe's tokens repeat: the probe
 * tokenized whole (reference), or only from the last control token before
 * the first differing byte. -1: out of memory (tokenizing fails only so). */
static int64_t shared_tokens(const tok_vocab *v, const char *text, size_t len, const int32_t *tokens, int64_t n,
                             const chat_prompt *pr, bool reference) {
    size_t c = 0;
    while (c < len && c < pr->len && text[c] == pr->text[c]) c++;
    size_t at = 0;
    int64_t i0 = reference ? -1 : control_before(v, text, len, tokens, n, c, &at), got;
    int32_t *pt = NULL;
    if (i0 < 0) { /* the whole probe, as the next turn's prompt would be tokenized */
        hn_err err;
        if (chat_tokenize_spans(v, pr->text, pr->len, pr->spans, pr->n_spans, &pt, &got, &err)) return -1;
        i0 = 0;
    } else {
        size_t tl = pr->len - at, *sp = pr->n_spans ? hn_malloc(pr->n_spans * 2 * sizeof *sp) : NULL, ns = 0;
        int64_t cap = (int64_t)tl + 4;
        pt = hn_malloc((size_t)cap * sizeof *pt);
        if (!pt || (pr->n_spans && !sp)) {
            hn_free(pt);
            hn_free(sp);
            return -1;
        }
        for (size_t k = 0; k < pr->n_spans; k++)
            if (pr->spans[2 * k + 1] > at) {
                sp[2 * ns] = pr->spans[2 * k] > at ? pr->spans[2 * k] - at : 0;
                sp[2 * ns + 1] = pr->spans[2 * k + 1] - at;
                ns++;
            }
        got = tok_encode_spans(v, pr->text + at, tl, false, sp, ns, pt, cap);
        hn_free(sp);
        if (got < 0 || got > cap) { /* out of memory (a token covers a byte: never more than cap) */
            hn_free(pt);
            return -1;
        }
    }
    int64_t k = 0;
    while (i0 + k < n && k < got && tokens[i0 + k] == pt[k]) k++;
    hn_free(pt);
    return i0 + k;
}

hn_status chat_resume_points(const chat_template *t, const tok_vocab *v, const json_t *messages, const json_t *tools,
                             const chat_options *opt, const chat_prompt *p, const int32_t *tokens, int64_t n_tokens,
                             bool reference, int64_t out[CHAT_RESUME_MAX], hn_err *err) {
    for (int i = 0; i < CHAT_RESUME_MAX; i++) out[i] = -1;
    chat_options o = {0};
    if (opt) o = *opt;
    o.add_generation_prompt = true; /* as the next turn is rendered */
    for (int i = 0; i < CHAT_RESUME_MAX; i++) {
        bool nomem;
        json_t *m = next_turn(messages, tools, i, &nomem);
        if (nomem) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
        if (!m) continue;
        chat_prompt pr;
        hn_err rerr = {0};
        hn_status st = chat_render(t, m, tools, &o, &pr, &rerr);
        json_decref(m);
        if (st == HN_ERR_NOMEM) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
        if (st == HN_OK) out[i] = shared_tokens(v, p->text, p->len, tokens, n_tokens, &pr, reference);
        chat_prompt_free(&pr);
        if (st == HN_OK && out[i] < 0) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    return HN_OK;
}
