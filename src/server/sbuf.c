/* sbuf.c: the growable byte buffer (see sbuf.h). */
#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../core/alloc.h"

static bool sb_reserve(sbuf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    if (extra > ((size_t)-1) / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = hn_realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void sb_add(sbuf *b, const char *s, size_t n) {
    if (!sb_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sb_adds(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

void sb_addf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sb_add(b, small, (size_t)n);
        return;
    }
    if (!sb_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sb_add_jstr(sbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (!sb_reserve(b, n + 2)) return;
    sb_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[6];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20 || c == 0x7f) {
                u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
                u[4] = hex[c >> 4]; u[5] = hex[c & 15];
                sb_add(b, s + i - run, run);
                run = 0;
                sb_add(b, u, 6);
                continue;
            }
        }
        if (esc) {
            sb_add(b, s + i - run, run);
            run = 0;
            sb_adds(b, esc);
        } else {
            run++;
        }
    }
    sb_add(b, s + n - run, run);
    sb_add(b, "\"", 1);
}

static int sb_dump_cb(const char *buf, size_t size, void *data) {
    sb_add((sbuf *)data, buf, size);
    return ((sbuf *)data)->oom ? -1 : 0;
}

void sb_add_json(sbuf *b, const json_t *v) {
    if (!v || b->oom) return;
    if (json_dump_callback(v, sb_dump_cb, b, JSON_COMPACT | JSON_ENCODE_ANY) != 0) b->oom = true;
}

void sb_consume(sbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = 0;
}

void sb_reset(sbuf *b) {
    b->len = 0;
    b->oom = false;
    if (b->data) b->data[0] = 0;
}

void sb_free(sbuf *b) {
    hn_free(b->data);
    memset(b, 0, sizeof *b);
}

char *sb_take(sbuf *b, size_t *len) {
    if (b->oom) {
        sb_free(b);
        if (len) *len = 0;
        return NULL;
    }
    char *p = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}
