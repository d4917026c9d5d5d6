/* stopstr.c: stop-string matching with hold-back (see stopstr.h). */
#include "stopstr.h"

#include <string.h>

void ss_init(ss_matcher *m, char *const *stops, int n) {
    memset(m, 0, sizeof *m);
    m->stops = stops;
    m->n = n;
    m->matched = -1;
}

/* Does some stop string start with the last k bytes of h? */
static bool tail_is_prefix(const ss_matcher *m, const char *h, size_t len, size_t k) {
    for (int i = 0; i < m->n; i++) {
        size_t sl = strlen(m->stops[i]);
        if (sl > k && !memcmp(h + len - k, m->stops[i], k)) return true;
    }
    return false;
}

int ss_feed(ss_matcher *m, const char *s, size_t n, sbuf *out) {
    if (m->matched >= 0) return m->matched;
    if (m->n == 0) {
        sb_add(out, s, n);
        return -1;
    }
    sb_add(&m->hold, s, n);
    const char *h = m->hold.data ? m->hold.data : "";
    size_t len = m->hold.len;
    /* the earliest complete match wins */
    size_t best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < m->n; i++) {
        size_t sl = strlen(m->stops[i]);
        if (!sl || sl > len) continue;
        const char *p = memmem(h, len, m->stops[i], sl);
        if (p && (size_t)(p - h) < best) {
            best = (size_t)(p - h);
            which = i;
        }
    }
    if (which >= 0) {
        sb_add(out, h, best);
        sb_reset(&m->hold);
        m->matched = which;
        return which;
    }
    /* keep the longest tail that may still grow into a stop string */
    size_t keep = 0;
    for (size_t k = len; k > 0; k--)
        if (tail_is_prefix(m, h, len, k)) {
            keep = k;
            break;
        }
    sb_add(out, h, len - keep);
    sb_consume(&m->hold, len - keep);
    return -1;
}

void ss_flush(ss_matcher *m, sbuf *out) {
    if (m->matched < 0 && m->hold.len) sb_add(out, m->hold.data, m->hold.len);
    sb_reset(&m->hold);
}

void ss_free(ss_matcher *m) { sb_free(&m->hold); }
