/* server.c: the libmicrohttpd daemon, routing, limits, authentication and
 * the small endpoints (see server.h). Generation lives in srv_generate.c. */
#include "srv_int.h"

#include <arpa/inet.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "metrics.h"

srv_config srv_default_config(void) {
    srv_config c = {0};
    c.host = "127.0.0.1";
    c.port = 8080;
    c.model_name = "hone";
    c.max_body = 32u << 20;
    c.max_inflight = 256u << 20;
    c.max_json_nodes = 200000;
    c.max_header = 64u << 10;
    c.max_connections = 1024;
    c.max_conn_per_ip = -1;
    c.cache_isolation = -1;
    c.idle_timeout_s = 15;
    c.header_timeout_s = 10;
    c.http_threads = 4;
    c.shutdown_grace_ms = 5000;
    c.default_max_tokens = 8192;
    c.ping_ms = 5000;
    c.sampling = smp_default_params();
    return c;
}

bool srv_key_equal(const char *given, size_t given_len, const char *want) {
    size_t wl = strlen(want);
    /* every byte of the longer input is looked at; no early exit */
    size_t n = given_len > wl ? given_len : wl;
    unsigned diff = (unsigned)(given_len ^ wl);
    for (size_t i = 0; i < n; i++) {
        unsigned char a = i < given_len ? (unsigned char)given[i] : 0;
        unsigned char b = i < wl ? (unsigned char)want[i] : 0;
        diff |= (unsigned)(a ^ b);
    }
    return diff == 0 && wl > 0;
}

size_t srv_json_containers(const char *s, size_t n, size_t limit) {
    size_t k = 0;
    bool in_str = false;
    for (size_t i = 0; i < n && k <= limit; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            k++;
        }
    }
    return k;
}

/* Counts n more body bytes against max_inflight; false (nothing counted) if over. */
static bool hold_bytes(srv_conn *c, size_t n) {
    srv_server *s = c->s;
    size_t cur = atomic_load(&s->inflight);
    do {
        if (cur + n > s->cfg.max_inflight) return false;
    } while (!atomic_compare_exchange_weak(&s->inflight, &cur, cur + n));
    c->held += n;
    return true;
}

bool srv_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned cp, min;
        if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
        else return false;
        if (i + (size_t)len > n) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += (size_t)len;
    }
    return true;
}

size_t srv_log_escape(const char *s, size_t n, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[4];
        size_t k = 0;
        if (ch == '\\') tmp[k++] = '\\', tmp[k++] = '\\';
        else if (ch >= 0x20 && ch < 0x7f) tmp[k++] = (char)ch;
        else tmp[k++] = '\\', tmp[k++] = 'x', tmp[k++] = hex[ch >> 4], tmp[k++] = hex[ch & 15];
        if (w + k >= cap) break;
        memcpy(out + w, tmp, k);
        w += k;
    }
    out[w] = 0;
    return w;
}

static FILE *log_out(const srv_server *s) { return s->cfg.log_file ? (FILE *)s->cfg.log_file : stderr; }

/* ---- suspension: nothing blocks an HTTP thread ---- */

static void unlink_parked(srv_server *s, srv_conn *c) {
    if (c->pprev) c->pprev->pnext = c->pnext;
    else s->parked = c->pnext;
    if (c->pnext) c->pnext->pprev = c->pprev;
    c->pnext = c->pprev = NULL;
}

bool srv_park(srv_conn *c) {
    srv_server *s = c->s;
    pthread_mutex_lock(&s->park_mu);
    bool park = !c->wake_pending && !atomic_load(&s->stopping);
    c->wake_pending = false;
    if (park) {
        c->parked = true;
        c->pprev = NULL;
        c->pnext = s->parked;
        if (s->parked) s->parked->pprev = c;
        s->parked = c;
        MHD_suspend_connection(c->mc);
    }
    pthread_mutex_unlock(&s->park_mu);
    return park;
}

static void wake_locked(srv_server *s, srv_conn *c) {
    if (c->parked) {
        c->parked = false;
        unlink_parked(s, c);
        MHD_resume_connection(c->mc);
    } else {
        c->wake_pending = true;
    }
}

void srv_wake(srv_conn *c) {
    pthread_mutex_lock(&c->s->park_mu);
    wake_locked(c->s, c);
    pthread_mutex_unlock(&c->s->park_mu);
}

bool srv_client_gone(srv_conn *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char ch;
        return recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

/* The ticker resumes parked connections that have something to do without
 * the engine: a ping is due, the client left, the server stops. */
static void *ticker_main(void *arg) {
    srv_server *s = arg;
    double busy_at = 0; /* when requests were last in progress; 0: trimmed since */
    for (;;) {
        /* two seconds after the last request, give the allocator's free
         * memory back (glibc keeps what many threads freed in its arenas) */
        if (atomic_load(&s->n_gen_conns) > 0) busy_at = hn_now_ms();
        else if (busy_at > 0 && hn_now_ms() - busy_at > 2000) {
            busy_at = 0;
#ifdef __GLIBC__
            malloc_trim(0);
#endif
        }
        pthread_mutex_lock(&s->park_mu);
        bool stop = atomic_load(&s->stopping);
        double now = hn_now_ms();
        for (srv_conn *c = s->parked, *next; c; c = next) {
            next = c->pnext;
            if (stop || (c->streaming && now - c->last_send >= s->cfg.ping_ms) || srv_client_gone(c)) wake_locked(s, c);
        }
        bool done = stop && !s->parked && !s->ticker_on;
        pthread_mutex_unlock(&s->park_mu);
        /* the header deadline: MHD's idle timeout restarts at every byte, so
         * a client trickling a header would hold its slot for ever; the
         * socket is shut down and MHD closes the connection (the entry,
         * and so the descriptor, lives until MHD's CLOSED notice) */
        pthread_mutex_lock(&s->sock_mu);
        for (srv_sock *k = s->socks; k; k = k->next)
            if (!k->in_request && !k->cut && now - k->wait_since > s->cfg.header_timeout_s * 1000.0) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = true;
            }
        pthread_mutex_unlock(&s->sock_mu);
        if (done) return NULL;
        usleep((useconds_t)s->tick_ms * 1000);
    }
}

/* ---- responses ---- */

void srv_common_headers(srv_conn *c, struct MHD_Response *r) {
    if (atomic_load(&c->s->draining)) MHD_add_response_header(r, "Connection", "close");
    if (c->origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", c->origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    if (c->api == API_MESSAGES) {
        char id[40];
        api_make_id(id, sizeof id, "req_", 24);
        MHD_add_response_header(r, "request-id", id);
    }
}

enum MHD_Result srv_send(srv_conn *c, int status, const char *ctype, const char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    srv_common_headers(c, r);
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    if (c->s->cfg.log_requests)
        fprintf(log_out(c->s), "hone serve: %d (%.0f ms)\n", status, hn_now_ms() - c->t_start);
    return ret;
}

enum MHD_Result srv_send_error(srv_conn *c, api_kind api, const api_error *e) {
    sbuf b = {0};
    api_error_json(api, e, &b);
    enum MHD_Result r = b.oom ? MHD_NO : srv_send(c, api_http_status(api, e->kind), "application/json", b.data, b.len);
    sb_free(&b);
    return r;
}

static enum MHD_Result send_json(srv_conn *c, int status, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!s) return MHD_NO;
    enum MHD_Result r = srv_send(c, status, "application/json", s, strlen(s));
    free(s);
    return r;
}

/* ---- browsers: origins, hosts, content types ---- */

/* Whether item (n bytes) is in a comma-separated list (case-insensitive, "*" any). */
static bool in_list(const char *list, const char *item, size_t n) {
    if (!list) return false;
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        size_t l = (size_t)(t - p);
        if ((l == 1 && *p == '*') || (l == n && l && !strncasecmp(p, item, n))) return true;
        p = e;
    }
    return false;
}

/* Whether a Host header names this server: an IP literal, localhost, or an allowed name. */
static bool host_ok(srv_server *s, const char *host) {
    if (!host) return true; /* HTTP/1.0 without Host: no browser sends that */
    char name[256];
    size_t n = strlen(host);
    if (n >= sizeof name) return false;
    memcpy(name, host, n + 1);
    if (name[0] == '[') { /* [v6]:port */
        char *e = strchr(name, ']');
        if (!e || (e[1] && e[1] != ':')) return false;
        *e = 0;
        struct in6_addr a6;
        return inet_pton(AF_INET6, name + 1, &a6) == 1;
    }
    char *colon = strchr(name, ':');
    if (colon) *colon = 0;
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1) return true;
    n = strlen(name);
    if (n && name[n - 1] == '.') name[--n] = 0;
    if (!strcasecmp(name, "localhost")) return true;
    return in_list(s->allowed_hosts, name, n);
}

static bool json_ctype(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "application/json", 16)) return false;
    ct += 16;
    while (*ct == ' ') ct++;
    return !*ct || *ct == ';';
}

/* Answers a preflight: the origin, methods and headers when the origin is allowed. */
static enum MHD_Result preflight(srv_conn *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (c->origin) {
        srv_common_headers(c, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
        const char *want = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        bool plain = want != NULL && *want;
        for (const char *p = want; plain && *p; p++)
            if (!(((*p | 32) >= 'a' && (*p | 32) <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == ',' || *p == ' '))
                plain = false;
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                plain ? want : "authorization, x-api-key, content-type, anthropic-version, anthropic-beta, "
                                               "anthropic-dangerous-direct-browser-access, openai-organization, openai-project");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ret = MHD_queue_response(c->mc, 204, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- routing ---- */

/* Whether path[0..n) is exactly lit. */
static bool path_is(const char *path, size_t n, const char *lit) { return strlen(lit) == n && !memcmp(path, lit, n); }

static int route_of(const char *url, const char *method, api_kind *api, bool *known_path) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    /* the whole URL, however long (nothing is cut before matching); a
     * trailing slash is tolerated */
    size_t l = strlen(url);
    while (l > 1 && url[l - 1] == '/') l--;
    const char *path = url, *p = url;
    size_t pl = l;
    if (l >= 4 && !memcmp(p, "/v1/", 4)) p += 3, pl -= 3;
    *known_path = true;
    *api = API_CHAT;
    if (path_is(path, l, "/")) return get ? R_ROOT : R_NONE;
    if (path_is(p, pl, "/health")) return get ? R_HEALTH : R_NONE;
    if (path_is(path, l, "/metrics")) return get ? R_METRICS : R_NONE;
    if (path_is(p, pl, "/hone/status")) return get ? R_STATUS : R_NONE;
    if (path_is(p, pl, "/models")) return get ? R_MODELS : R_NONE;
    if (pl > 8 && !memcmp(p, "/models/", 8)) return get ? R_MODEL_ONE : R_NONE;
    if (path_is(path, l, "/api/version")) return get ? R_OLLAMA_VERSION : R_NONE;
    if (path_is(path, l, "/api/tags")) return get ? R_OLLAMA_TAGS : R_NONE;
    if (path_is(p, pl, "/chat/completions")) return post ? R_CHAT : R_NONE;
    if (path_is(p, pl, "/chat/completions/input_tokens")) return post ? R_CHAT_COUNT : R_NONE;
    if (path_is(p, pl, "/responses/input_tokens")) return *api = API_RESPONSES, post ? R_RESPONSES_COUNT : R_NONE;
    if (path_is(p, pl, "/completions")) return *api = API_COMPLETIONS, post ? R_COMPLETIONS : R_NONE;
    if (path_is(p, pl, "/responses")) return *api = API_RESPONSES, post ? R_RESPONSES : R_NONE;
    if (path_is(p, pl, "/messages")) return *api = API_MESSAGES, post ? R_MESSAGES : R_NONE;
    if (path_is(p, pl, "/messages/count_tokens")) return *api = API_MESSAGES, post ? R_COUNT_TOKENS : R_NONE;
    if (path_is(p, pl, "/debug/render") || path_is(path, l, "/apply-template")) return post ? R_RENDER : R_NONE;
    *known_path = false;
    if (memmem(path, l, "messages", 8)) *api = API_MESSAGES;
    return R_NONE;
}

/* The index of the accepted key equal to t, or -1: every key is compared
 * (each in constant time), so the time does not tell which one matched. */
static int key_index(const srv_server *s, const char *t) {
    int found = -1;
    size_t n = strlen(t);
    for (int i = 0; i < s->n_keys; i++)
        if (srv_key_equal(t, n, s->keys[i]) && found < 0) found = i;
    return found;
}

/* Checks the request's key and sets its prefix-cache namespace: key i's is
 * i + 1 when keys are isolated, else 0 (shared). */
static bool authorized(srv_conn *c) {
    srv_server *s = c->s;
    c->cache_ns = 0;
    if (!s->n_keys) return true;
    if (c->route == R_ROOT || c->route == R_HEALTH) return true;
    int k = -1;
    const char *auth = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncasecmp(auth, "Bearer ", 7)) {
        const char *t = auth + 7;
        while (*t == ' ') t++;
        k = key_index(s, t);
    }
    const char *x = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key");
    if (k < 0 && x) k = key_index(s, x);
    if (k < 0) return false;
    if (s->isolate) c->cache_ns = (uint64_t)k + 1;
    return true;
}

static json_t *model_obj(srv_server *s) {
    return json_pack("{s:s,s:s,s:i,s:s,s:s,s:i}", "id", s->model_name, "object", "model", "created", (json_int_t)0,
                     "owned_by", "hone", "display_name", s->model_name, "context_length", (json_int_t)s->cfg.n_ctx);
}

static enum MHD_Result simple_get(srv_conn *c) {
    srv_server *s = c->s;
    switch (c->route) {
    case R_ROOT: return srv_dashboard(c);
    case R_METRICS: return srv_metrics(c);
    case R_STATUS: return srv_status(c);
    case R_HEALTH: {
        json_t *h = json_pack("{s:s,s:b,s:i}", "status", "ok", "constrained_decoding", cst_available(), "running",
                              (json_int_t)atomic_load(&s->n_running));
        if (h && s->eng.stats) {
            eng_stats es;
            s->eng.stats(s->eng.ctx, &es);
            json_object_set_new(h, "kv", json_pack("{s:i,s:i,s:i,s:i}", "blocks_used", (json_int_t)es.blocks_used, "blocks_cached",
                                                   (json_int_t)es.blocks_cached, "blocks_total", (json_int_t)es.blocks_total,
                                                   "blocks_max", (json_int_t)es.blocks_max));
        }
        return send_json(c, 200, h);
    }
    case R_MODELS: {
        json_t *m = model_obj(s);
        return send_json(c, 200, m ? json_pack("{s:s,s:[o],s:b}", "object", "list", "data", m, "has_more", 0) : NULL);
    }
    case R_MODEL_ONE: return send_json(c, 200, model_obj(s));
    case R_OLLAMA_VERSION: return send_json(c, 200, json_pack("{s:s}", "version", "0.0.0-hone"));
    case R_OLLAMA_TAGS:
        return send_json(c, 200, json_pack("{s:[{s:s,s:s}]}", "models", "name", s->model_name, "model", s->model_name));
    }
    return MHD_NO;
}

static bool is_generation(int route) {
    return route == R_CHAT || route == R_COMPLETIONS || route == R_RESPONSES || route == R_MESSAGES ||
           route == R_COUNT_TOKENS || route == R_RENDER || route == R_CHAT_COUNT || route == R_RESPONSES_COUNT;
}

/* The API a render request describes: ?api=, else guessed from the body. */
static api_kind render_api(srv_conn *c, const json_t *body) {
    const char *q = MHD_lookup_connection_value(c->mc, MHD_GET_ARGUMENT_KIND, "api");
    if (q) {
        if (!strcmp(q, "messages") || !strcmp(q, "anthropic")) return API_MESSAGES;
        if (!strcmp(q, "responses")) return API_RESPONSES;
        if (!strcmp(q, "completions")) return API_COMPLETIONS;
        return API_CHAT;
    }
    if (json_object_get(body, "input")) return API_RESPONSES;
    if (json_object_get(body, "prompt")) return API_COMPLETIONS;
    if (MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "anthropic-version") || json_is_array(json_object_get(body, "system")) ||
        json_is_string(json_object_get(body, "system")))
        return API_MESSAGES;
    return API_CHAT;
}

static enum MHD_Result finish_body(srv_conn *c) {
    api_error e;
    if (c->overloaded) {
        api_seterr(&e, APIE_OVERLOADED, NULL, "too many request bytes in progress (over %zu); retry later", c->s->cfg.max_inflight);
        return srv_send_error(c, c->api, &e);
    }
    if (c->too_large) {
        api_seterr(&e, APIE_TOO_LARGE, NULL, "request body is larger than %zu bytes", c->s->cfg.max_body);
        return srv_send_error(c, c->api, &e);
    }
    const char *data = c->body.data ? c->body.data : "";
    if (!srv_utf8_valid(data, c->body.len)) {
        api_seterr(&e, APIE_INVALID, NULL, "request body is not valid UTF-8");
        return srv_send_error(c, c->api, &e);
    }
    /* the parser's memory is many times the text's for small values: count first */
    size_t lim = (size_t)c->s->cfg.max_json_nodes;
    if (srv_json_containers(data, c->body.len, lim) > lim) {
        api_seterr(&e, APIE_TOO_LARGE, NULL, "request body has more than %zu JSON objects and arrays", lim);
        return srv_send_error(c, c->api, &e);
    }
    json_error_t je;
    json_t *body = json_loadb(data, c->body.len, 0, &je);
    sb_free(&c->body); /* the parsed form is what is kept (its bytes stay counted) */
    if (!body) {
        api_seterr(&e, APIE_INVALID, NULL, "malformed JSON in request body: %s (line %d, column %d)", je.text, je.line,
                   je.column);
        return srv_send_error(c, c->api, &e);
    }
    if (!json_is_object(body)) {
        json_decref(body);
        api_seterr(&e, APIE_INVALID, NULL, "the request body must be a JSON object");
        return srv_send_error(c, c->api, &e);
    }
    bool render = c->route == R_RENDER;
    if (render) c->api = render_api(c, body);
    bool count = c->route == R_COUNT_TOKENS || c->route == R_CHAT_COUNT || c->route == R_RESPONSES_COUNT;
    enum MHD_Result r = srv_generate(c, body, count, render);
    json_decref(body);
    return r;
}

static srv_sock *sock_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A request's headers are in (true) or its response is done (false). */
static void sock_request(srv_server *s, struct MHD_Connection *mc, bool in) {
    srv_sock *k = sock_of(mc);
    if (!k) return;
    pthread_mutex_lock(&s->sock_mu);
    k->in_request = in;
    if (!in) k->wait_since = hn_now_ms();
    pthread_mutex_unlock(&s->sock_mu);
}

/* What the request headers say about framing and size. */
typedef struct hdr_scan {
    size_t bytes;
    const char *cl;
    int n_cl;
    bool cl_conflict, te;
} hdr_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    hdr_scan *h = cls;
    h->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;
    if (!strcasecmp(key, "Content-Length")) {
        if (h->n_cl && (!value || !h->cl || strcmp(h->cl, value))) h->cl_conflict = true;
        h->cl = value;
        h->n_cl++;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        h->te = true;
    }
    return MHD_YES;
}

/* Adds a query argument's bytes (MHD hands the handler the URL without its
 * query string) to the request line's count. */
static enum MHD_Result scan_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    ((hdr_scan *)cls)->bytes += strlen(key) + (value ? strlen(value) : 0) + 2;
    return MHD_YES;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    if (!c) {
        c = hn_calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->s = s;
        c->mc = mc;
        c->refs = 1;
        c->t_start = hn_now_ms();
        pthread_mutex_init(&c->mu, NULL);
        *con_cls = c;
        sock_request(s, mc, true);
        bool known;
        c->route = route_of(url, method, &c->api, &known);
        if (s->cfg.log_requests) {
            char em[64], eu[1024];
            srv_log_escape(method, strlen(method), em, sizeof em);
            srv_log_escape(url, strlen(url), eu, sizeof eu);
            fprintf(log_out(s), "hone serve: %s %s\n", em, eu);
        }
        api_error e;
        const char *origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
        bool origin_ok = origin && in_list(s->cors_origins, origin, strlen(origin));
        if (origin_ok) c->origin = origin;
        /* framing the server and a proxy in front could read differently
         * (request smuggling), and headers over the limit: JSON errors here,
         * before libmicrohttpd's own (HTML) ones at twice the limit */
        hdr_scan hs = {.bytes = strlen(url) + strlen(method) + 12};
        MHD_get_connection_values(mc, MHD_HEADER_KIND, scan_header, &hs);
        MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, scan_arg, &hs);
        if (hs.cl_conflict || (hs.te && hs.n_cl))
            return srv_send_error(c, c->api, api_seterr(&e, APIE_INVALID, NULL, "conflicting Content-Length / Transfer-Encoding headers"));
        if (hs.bytes > s->cfg.max_header)
            return srv_send_error(c, c->api, api_seterr(&e, APIE_TOO_LARGE, NULL, "the request line and headers are larger than %zu bytes",
                                                        s->cfg.max_header));
        if (!strcmp(method, "OPTIONS")) return preflight(c);
        if (atomic_load(&s->draining))
            return srv_send_error(c, c->api, api_seterr(&e, APIE_OVERLOADED, NULL, "the server is shutting down"));
        if (!host_ok(s, MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Host")))
            return srv_send_error(c, c->api, api_seterr(&e, APIE_FORBIDDEN, NULL,
                                                        "the Host header does not name this server (see --allowed-hosts)"));
        if (origin && !origin_ok && c->route != R_HEALTH && c->route != R_ROOT)
            return srv_send_error(c, c->api, api_seterr(&e, APIE_FORBIDDEN, NULL,
                                                        "requests from web pages of this origin are not allowed (see --cors-origins)"));
        if (c->route == R_NONE) {
            if (known) return srv_send_error(c, c->api, api_seterr(&e, APIE_METHOD, NULL, "method %s not allowed on %s", method, url));
            return srv_send_error(c, c->api, api_seterr(&e, APIE_NOT_FOUND, NULL, "no route for %s %s", method, url));
        }
        /* authentication before any body is read */
        if (!authorized(c))
            return srv_send_error(c, c->api,
                                  api_seterr(&e, APIE_AUTH, NULL, "invalid API key (send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY')"));
        if (is_generation(c->route)) {
            if (!json_ctype(MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Type")))
                return srv_send_error(c, c->api, api_seterr(&e, APIE_MEDIA_TYPE, NULL, "the request body must be sent as Content-Type: application/json"));
            const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
            /* a body somewhat over the limit is read and dropped, so that the
             * client, still uploading, gets to read the 413; a huge one is
             * refused at once */
            if (len > 4ull * s->cfg.max_body)
                return srv_send_error(c, c->api,
                                      api_seterr(&e, APIE_TOO_LARGE, NULL, "request body is larger than %zu bytes", s->cfg.max_body));
            if (len > s->cfg.max_body) c->too_large = true;
            else if (len && !hold_bytes(c, (size_t)len))
                return srv_send_error(c, c->api,
                                      api_seterr(&e, APIE_OVERLOADED, NULL,
                                                 "too many request bytes in progress (over %zu); retry later", s->cfg.max_inflight));
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!c->too_large) {
            if (c->body.len + *upload_size > c->s->cfg.max_body) {
                c->too_large = true;
                sb_free(&c->body);
            } else if (c->body.len + *upload_size > c->held && !c->overloaded &&
                       !hold_bytes(c, c->body.len + *upload_size - c->held)) {
                c->overloaded = true; /* a chunked body beyond what was counted */
                sb_free(&c->body);
            } else if (!c->overloaded) {
                sb_add(&c->body, upload_data, *upload_size);
                if (c->body.oom) return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!is_generation(c->route)) return simple_get(c);
    if (c->job) return srv_continue(c); /* resumed while waiting for the engine */
    return finish_body(c);
}

void srv_conn_release(srv_conn *c) {
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left > 0) return;
    pthread_mutex_lock(&c->s->park_mu);
    if (c->parked) unlink_parked(c->s, c); /* not expected: MHD ends no suspended connection */
    pthread_mutex_unlock(&c->s->park_mu);
    if (c->job) {
        pthread_mutex_lock(&c->job->mu);
        c->job->conn = NULL;
        pthread_mutex_unlock(&c->job->mu);
    }
    if (c->job && !c->finished) c->s->eng.cancel(c->s->eng.ctx, c->job->id);
    if (c->counted) atomic_fetch_sub(&c->s->n_running, 1);
    if (c->held) atomic_fetch_sub(&c->s->inflight, c->held);
    if (c->job) {
        srv_job_release(c->job);
        atomic_fetch_sub(&c->s->n_gen_conns, 1);
    }
    gen_free(c->g);
    wr_free(c->w);
    if (c->have_req) creq_free(&c->req);
    prm_prompt_free(&c->prompt);
    sb_free(&c->out);
    sb_free(&c->body);
    pthread_mutex_destroy(&c->mu);
    hn_free(c);
}

static void notify_conn(void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
    srv_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        srv_sock *k = ci ? hn_calloc(1, sizeof *k) : NULL;
        *socket_context = k;
        if (!k) return; /* no deadline for this one; MHD's idle timeout still holds */
        k->fd = ci->connect_fd;
        k->wait_since = hn_now_ms();
        pthread_mutex_lock(&s->sock_mu);
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->sock_mu);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_sock *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&s->sock_mu);
        if (k->prev) k->prev->next = k->next;
        else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&s->sock_mu);
        hn_free(k);
        *socket_context = NULL;
    }
}

static void completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    sock_request(cls, mc, false);
    srv_conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) c->cancelled = true;
    srv_conn_release(c);
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
    srv_server *s = cls;
    if (!s->cfg.log_requests) return;
    char msg[1024], esc[2048];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    while (len && msg[len - 1] == '\n') len--;
    srv_log_escape(msg, len, esc, sizeof esc);
    fprintf(log_out(s), "hone serve (http): %s\n", esc);
}

hn_status srv_start(const srv_config *cfg, const srv_engine *eng, const prm_model *pm, srv_server **out, hn_err *err) {
    *out = NULL;
    srv_server *s = hn_calloc(1, sizeof *s);
    if (!s) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    pthread_mutex_init(&s->park_mu, NULL);
    pthread_mutex_init(&s->sock_mu, NULL);
    s->host = hn_strdup(cfg->host && *cfg->host ? cfg->host : "127.0.0.1");
    bool keys_ok = true;
    int n_keys = (cfg->api_key && *cfg->api_key) + (cfg->n_api_keys > 0 ? cfg->n_api_keys : 0);
    s->keys = n_keys ? hn_calloc((size_t)n_keys, sizeof *s->keys) : NULL;
    if (n_keys && !s->keys) keys_ok = false;
    for (int i = -1; keys_ok && i < cfg->n_api_keys; i++) {
        const char *k = i < 0 ? cfg->api_key : cfg->api_keys[i];
        if (!k || !*k) continue;
        if (!(s->keys[s->n_keys] = hn_strdup(k))) keys_ok = false;
        else s->n_keys++;
    }
    s->isolate = cfg->cache_isolation < 0 ? s->n_keys > 1 : cfg->cache_isolation > 0;
    s->model_name = hn_strdup(cfg->model_name && *cfg->model_name ? cfg->model_name : "hone");
    s->cors_origins = cfg->cors_origins && *cfg->cors_origins ? hn_strdup(cfg->cors_origins) : NULL;
    s->allowed_hosts = cfg->allowed_hosts && *cfg->allowed_hosts ? hn_strdup(cfg->allowed_hosts) : NULL;
    s->eng = *eng;
    s->pm = pm;
    s->cst = cst_shared_new(pm);
    if (!s->cst || !s->host || !s->model_name || !keys_ok ||
        (cfg->cors_origins && *cfg->cors_origins && !s->cors_origins) ||
        (cfg->allowed_hosts && *cfg->allowed_hosts && !s->allowed_hosts)) {
        srv_stop(s);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    if (!s->cfg.max_body) s->cfg.max_body = 32u << 20;
    if (!s->cfg.max_header) s->cfg.max_header = 64u << 10;
    if (s->cfg.max_inflight < s->cfg.max_body) s->cfg.max_inflight = s->cfg.max_body;
    if (s->cfg.max_json_nodes <= 0) s->cfg.max_json_nodes = 200000;
    if (s->cfg.max_connections <= 0) s->cfg.max_connections = 1024;
    if (s->cfg.ping_ms <= 0) s->cfg.ping_ms = 5000;
    if (s->cfg.idle_timeout_s <= 0) s->cfg.idle_timeout_s = 15;
    if (s->cfg.http_threads <= 0) s->cfg.http_threads = 4;
    if (s->cfg.header_timeout_s <= 0) s->cfg.header_timeout_s = 10;
    /* a silent stream must ping before it counts as idle */
    if (s->cfg.ping_ms > s->cfg.idle_timeout_s * 500) s->cfg.ping_ms = s->cfg.idle_timeout_s * 500;
    s->tick_ms = s->cfg.ping_ms / 4 < 10 ? 10 : s->cfg.ping_ms / 4 > 100 ? 100 : s->cfg.ping_ms / 4;
    /* every connection is a file descriptor: stay under the process's limit */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
        long room = (long)rl.rlim_cur - 64;
        if (room < 16) room = 16;
        if (s->cfg.max_connections > room) {
            fprintf(stderr, "hone serve: at most %ld connections (the open-file limit is %ld)\n", room, (long)rl.rlim_cur);
            s->cfg.max_connections = (int)room;
        }
    }

    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    const char *h = !strcmp(s->host, "localhost") ? "127.0.0.1" : s->host;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    const struct sockaddr *sa;
    if (cfg->port < 0 || cfg->port > 65535) {
        srv_stop(s);
        return hn_errf(err, HN_ERR_INVALID, "port %d is out of range", cfg->port);
    }
    if (inet_pton(AF_INET, h, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)cfg->port);
        sa = (const struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, h, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)cfg->port);
        sa = (const struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        srv_stop(s);
        return hn_errf(err, HN_ERR_INVALID, "host '%s' is not an IPv4/IPv6 address (or localhost)", s->host);
    }
    bool loopback = (sa == (const struct sockaddr *)&a4 && (ntohl(a4.sin_addr.s_addr) >> 24) == 127) ||
                    (sa == (const struct sockaddr *)&a6 && IN6_IS_ADDR_LOOPBACK(&a6.sin6_addr));
    if (s->cfg.max_conn_per_ip < 0) s->cfg.max_conn_per_ip = loopback ? 0 : 64;
    s->ticker_on = true;
    if (pthread_create(&s->ticker, NULL, ticker_main, s)) {
        s->ticker_on = false;
        srv_stop(s);
        return hn_errf(err, HN_ERR_NOMEM, "cannot start a thread");
    }
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handler, s,
                            MHD_OPTION_EXTERNAL_LOGGER, log_mhd, s,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, notify_conn, s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->cfg.max_header * 2 + (32u << 10),
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_conn_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.idle_timeout_s,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads,
                            MHD_OPTION_END);
    if (!s->d) {
        srv_stop(s);
        return hn_errf(err, HN_ERR_IO, "cannot listen on %s:%d (in use, or not permitted)", h, cfg->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    *out = s;
    return HN_OK;
}

int srv_port(const srv_server *s) { return s->port; }
int srv_running(const srv_server *s) { return atomic_load(&((srv_server *)s)->n_running); }

static void wait_gen_conns(srv_server *s, int ms) {
    for (double t0 = hn_now_ms(); atomic_load(&s->n_gen_conns) > 0 && hn_now_ms() - t0 < ms;) usleep(10000);
}

void srv_stop(srv_server *s) {
    if (!s) return;
    atomic_store(&s->draining, true);
    if (s->d) {
        /* no new connections; kept-alive ones get 503 */
        MHD_socket fd = MHD_quiesce_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET) close(fd);
        wait_gen_conns(s, s->cfg.shutdown_grace_ms > 0 ? s->cfg.shutdown_grace_ms : 0);
    }
    /* what still runs is cancelled and ended in its API's format (the
     * ticker wakes the parked ones; srv_park refuses from now on) */
    atomic_store(&s->stopping, true);
    if (s->d) wait_gen_conns(s, 3000);
    if (s->ticker_on) {
        /* MHD must not be stopped with suspended connections: the ticker
         * resumes them all (srv_park refuses from now on), then ends */
        pthread_mutex_lock(&s->park_mu);
        s->ticker_on = false;
        pthread_mutex_unlock(&s->park_mu);
        pthread_join(s->ticker, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    /* cancelled requests may still be in the engine, using their grammar
     * state (which uses the shared vocabulary index): wait for their ends */
    for (int i = 0; i < 3000 && atomic_load(&s->n_jobs) > 0; i++) usleep(10000);
    if (atomic_load(&s->n_jobs) == 0) cst_shared_free(s->cst); /* else leak rather than free in use */
    hn_free(s->host);
    for (int i = 0; i < s->n_keys; i++) hn_free(s->keys[i]);
    hn_free(s->keys);
    hn_free(s->model_name);
    hn_free(s->cors_origins);
    hn_free(s->allowed_hosts);
    pthread_mutex_destroy(&s->park_mu);
    pthread_mutex_destroy(&s->sock_mu);
    hn_free(s);
}
