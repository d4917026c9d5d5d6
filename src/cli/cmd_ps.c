/* cmd_ps.c: `hone ps` - what a running `hone serve` holds, from its
 * GET /v1/hone/status (server/metrics.h):
 *   hone ps [--host H] [--port P] [--api-key K] [--json]
 * Plain HTTP/1.0 over a socket (no client library); the key defaults to
 * $HONE_API_KEY. Prints the model and its fixed cost, the KV pool, the token
 * counters, then one line per live request: state, context, cached and
 * computed tokens, own and shared KV bytes, tokens per second. --json prints
 * the status object as the server sent it. */
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "cli.h"

#define PS_MAX_RESPONSE (64u << 20)

static void usage(void) {
    fprintf(stderr, "usage: hone ps [--host H] [--port P] [--api-key K] [--json]\n"
                    "  talks to a running `hone serve` (default 127.0.0.1:8080; key from $HONE_API_KEY)\n");
}

/* GET path from host:port; returns the HTTP status (body in *body, hn_malloc'd) or -1 with a message on stderr. */
static int http_get(const char *host, const char *port, const char *path, const char *key, char **body) {
    *body = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
        fprintf(stderr, "hone ps: %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        fprintf(stderr, "hone ps: cannot connect to %s:%s (%s): is `hone serve` running there?\n", host, port,
                strerror(errno));
        return -1;
    }
    char req[1024];
    bool v6 = strchr(host, ':') != NULL;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s%s%s:%s\r\n%s%s%sConnection: close\r\n\r\n", path,
                     v6 ? "[" : "", host, v6 ? "]" : "", port, key ? "Authorization: Bearer " : "", key ? key : "",
                     key ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof req || strpbrk(key ? key : "", "\r\n")) {
        fprintf(stderr, "hone ps: the host or API key is too long or holds a line break\n");
        close(fd);
        return -1;
    }
    for (int off = 0; off < n;) {
        ssize_t w = send(fd, req + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w <= 0) {
            fprintf(stderr, "hone ps: sending the request failed: %s\n", strerror(errno));
            close(fd);
            return -1;
        }
        off += (int)w;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = hn_malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        if (len == cap) {
            if (cap >= PS_MAX_RESPONSE) {
                hn_free(buf);
                buf = NULL;
                break;
            }
            char *nb = hn_realloc(buf, cap * 2 + 1);
            if (!nb) {
                hn_free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fprintf(stderr, "hone ps: reading the response failed: %s\n", strerror(errno));
            hn_free(buf);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    if (!buf) {
        fprintf(stderr, "hone ps: the response is too large or memory ran out\n");
        return -1;
    }
    buf[len] = 0;
    int status = 0;
    char *hdr_end = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || !hdr_end) {
        fprintf(stderr, "hone ps: %s:%s did not answer with HTTP\n", host, port);
        hn_free(buf);
        return -1;
    }
    hdr_end += 4;
    memmove(buf, hdr_end, len + 1 - (size_t)(hdr_end - buf));
    *body = buf;
    return status;
}

static const char *bytes(double b, char *out, size_t cap) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    if (i == 0) snprintf(out, cap, "%.0f B", b);
    else snprintf(out, cap, "%.*f %s", b < 10 ? 2 : 1, b, u[i]);
    return out;
}

static double num(const json_t *o, const char *path) {
    /* "a.b" walks objects */
    char key[64];
    const char *dot = strchr(path, '.');
    if (dot) {
        size_t l = (size_t)(dot - path) < sizeof key - 1 ? (size_t)(dot - path) : sizeof key - 1;
        memcpy(key, path, l);
        key[l] = 0;
        return num(json_object_get(o, key), dot + 1);
    }
    return json_number_value(json_object_get(o, path));
}

static const char *str(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

static void print_status(const json_t *s) {
    char a[32], b[32], c[32], d[32];
    const json_t *m = json_object_get(s, "model");
    printf("MODEL   %s  context %.0f", str(m, "name"), num(m, "n_ctx"));
    if (json_is_true(json_object_get(s, "engine")))
        printf("  KV %s  weights %s (file)  engine %s (of it model %s)", str(m, "kv_type"),
               bytes(num(m, "file_bytes"), a, sizeof a), bytes(num(m, "engine_bytes"), b, sizeof b),
               bytes(num(m, "alloc_bytes"), c, sizeof c));
    printf("  RSS %s\n", bytes(num(s, "process.rss_bytes"), d, sizeof d));
    if (!json_is_true(json_object_get(s, "engine"))) {
        printf("(this server's engine reports no memory or sessions)\n");
        return;
    }
    const json_t *p = json_object_get(s, "pool");
    printf("POOL    KV %s (peak %s)  blocks %.0f used, %.0f cached, %.0f free, %.0f max (%s each)  evictions %.0f  "
           "preemptions %.0f\n",
           bytes(num(p, "kv_bytes"), a, sizeof a), bytes(num(p, "kv_peak_bytes"), b, sizeof b), num(p, "blocks_used"),
           num(p, "blocks_cached"), num(p, "blocks_free"), num(p, "blocks_max"), bytes(num(p, "block_bytes"), c, sizeof c),
           num(p, "evictions"), num(p, "preemptions"));
    double pr = num(s, "tokens.prompt"), ca = num(s, "tokens.cached");
    printf("TOKENS  prompt %.0f  cached %.0f (%.1f%%)  generated %.0f  computed %.0f  requests %.0f (%.0f running, %.0f "
           "queued)\n",
           pr, ca, pr > 0 ? 100 * ca / pr : 0.0, num(s, "tokens.generated"), num(s, "tokens.computed"),
           num(s, "requests.submitted"), num(s, "requests.running"), num(s, "requests.waiting"));
    const json_t *ss = json_object_get(s, "sessions");
    printf("\n%6s  %-8s %8s %8s %9s %6s %11s %11s %7s %8s\n", "ID", "STATE", "CONTEXT", "CACHED", "COMPUTED", "GEN",
           "OWN", "SHARED", "TOK/S", "AGE");
    size_t i;
    const json_t *v;
    json_array_foreach(ss, i, v) {
        printf("%6.0f  %-8s %8.0f %8.0f %9.0f %6.0f %11s %11s %7.1f %7.1fs\n", num(v, "id"), str(v, "state"),
               num(v, "n_ctx"), num(v, "n_cached"), num(v, "n_computed"), num(v, "n_generated"),
               bytes(num(v, "bytes_own"), a, sizeof a), bytes(num(v, "bytes_shared"), b, sizeof b), num(v, "tok_per_s"),
               num(v, "age_ms") / 1000);
    }
    if (!json_array_size(ss)) printf("(no live requests)\n");
}

int cmd_ps(int argc, char **argv) {
    const char *host = "127.0.0.1", *port = "8080", *key = getenv("HONE_API_KEY");
    bool raw = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            raw = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            usage();
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) {
            char *end;
            long pn = strtol(v, &end, 10);
            if (*end || pn < 1 || pn > 65535) {
                fprintf(stderr, "hone ps: bad port '%s'\n", v);
                return 2;
            }
            port = v;
        } else if (!strcmp(a, "--api-key")) key = v;
        else {
            usage();
            return 2;
        }
    }
    if (key && !*key) key = NULL;
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    char *body = NULL;
    int st = http_get(host, port, "/v1/hone/status", key, &body);
    if (st < 0) return 1;
    if (st == 401) {
        fprintf(stderr, "hone ps: the server wants an API key (--api-key K or $HONE_API_KEY)%s\n",
                key ? "; the one given was refused" : "");
        hn_free(body);
        return 1;
    }
    if (st != 200) {
        fprintf(stderr, "hone ps: the server answered %d: %.200s\n", st, body);
        hn_free(body);
        return 1;
    }
    json_error_t je;
    json_t *s = json_loads(body, 0, &je);
    if (!s || !json_is_object(s)) {
        fprintf(stderr, "hone ps: the status is not JSON (%s): is this a hone server?\n", je.text);
        json_decref(s);
        hn_free(body);
        return 1;
    }
    if (raw) printf("%s\n", body);
    else print_status(s);
    json_decref(s);
    hn_free(body);
    return 0;
}
