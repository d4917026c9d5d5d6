/* api.c: error bodies per API, status codes and ids (see api.h). */
#include "api.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

api_error *api_seterr(api_error *e, api_errkind kind, const char *param, const char *fmt, ...) {
    e->kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return e;
}

int api_http_status(api_kind api, api_errkind kind) {
    switch (kind) {
    case APIE_INVALID:
    case APIE_CONTEXT: return 400;
    case APIE_AUTH: return 401;
    case APIE_FORBIDDEN: return 403;
    case APIE_MEDIA_TYPE: return 415;
    case APIE_NOT_FOUND: return 404;
    case APIE_METHOD: return 405;
    case APIE_TOO_LARGE: return 413;
    case APIE_OVERLOADED: return api == API_MESSAGES ? 529 : 503;
    case APIE_INTERNAL: return 500;
    }
    return 500;
}

static const char *anthropic_type(api_errkind k) {
    switch (k) {
    case APIE_INVALID:
    case APIE_CONTEXT:
    case APIE_METHOD:
    case APIE_MEDIA_TYPE: return "invalid_request_error";
    case APIE_FORBIDDEN: return "permission_error";
    case APIE_AUTH: return "authentication_error";
    case APIE_NOT_FOUND: return "not_found_error";
    case APIE_TOO_LARGE: return "request_too_large";
    case APIE_OVERLOADED: return "overloaded_error";
    case APIE_INTERNAL: return "api_error";
    }
    return "api_error";
}

static const char *openai_type(api_errkind k) {
    switch (k) {
    case APIE_INVALID:
    case APIE_CONTEXT:
    case APIE_METHOD:
    case APIE_TOO_LARGE:
    case APIE_MEDIA_TYPE: return "invalid_request_error";
    case APIE_FORBIDDEN: return "permission_error";
    case APIE_AUTH: return "authentication_error";
    case APIE_NOT_FOUND: return "not_found_error";
    case APIE_OVERLOADED: return "server_error";
    case APIE_INTERNAL: return "server_error";
    }
    return "server_error";
}

static const char *openai_code(api_errkind k) {
    switch (k) {
    case APIE_CONTEXT: return "context_length_exceeded";
    case APIE_AUTH: return "invalid_api_key";
    case APIE_TOO_LARGE: return "request_too_large";
    case APIE_NOT_FOUND: return "not_found";
    case APIE_METHOD: return "method_not_allowed";
    case APIE_FORBIDDEN: return "forbidden";
    case APIE_MEDIA_TYPE: return "unsupported_media_type";
    case APIE_OVERLOADED: return "server_overloaded";
    case APIE_INVALID:
    case APIE_INTERNAL: return NULL;
    }
    return NULL;
}

void api_error_json(api_kind api, const api_error *e, sbuf *out) {
    if (api == API_MESSAGES) {
        sb_addf(out, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", anthropic_type(e->kind));
        sb_add_jstr(out, e->message, strlen(e->message));
        sb_adds(out, "}}");
        return;
    }
    sb_adds(out, "{\"error\":{\"message\":");
    sb_add_jstr(out, e->message, strlen(e->message));
    sb_addf(out, ",\"type\":\"%s\",\"param\":", openai_type(e->kind));
    if (e->param[0])
        sb_add_jstr(out, e->param, strlen(e->param));
    else
        sb_adds(out, "null");
    const char *code = openai_code(e->kind);
    if (code)
        sb_addf(out, ",\"code\":\"%s\"}}", code);
    else
        sb_adds(out, ",\"code\":null}}");
}

/* ids: a per-process random key mixed with a counter (splitmix64), so ids are
 * unique in the process and unpredictable across restarts. */
static pthread_mutex_t id_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t id_state;
static int id_seeded;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void api_make_id(char *out, size_t cap, const char *prefix, int n) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t p = strlen(prefix);
    if (cap == 0) return;
    if (p >= cap) p = cap - 1;
    memcpy(out, prefix, p);
    pthread_mutex_lock(&id_mu);
    if (!id_seeded) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
            seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&seed;
        id_state = seed;
        id_seeded = 1;
    }
    uint64_t r = splitmix(&id_state);
    int left = 10;
    for (int i = 0; i < n && p + 1 < cap; i++) {
        if (left == 0) {
            r = splitmix(&id_state);
            left = 10;
        }
        out[p++] = al[r % 62];
        r /= 62;
        left--;
    }
    pthread_mutex_unlock(&id_mu);
    out[p] = 0;
}
