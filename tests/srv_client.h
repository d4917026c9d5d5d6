/* srv_client.h: a raw-socket HTTP/1.1 client for the server tests (one
 * response at a time, Content-Length or chunked or to EOF). */
#ifndef HN_TESTS_SRV_CLIENT_H
#define HN_TESTS_SRV_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/sbuf.h"

static int g_port;

typedef struct {
    int status;
    char headers[4096];
    sbuf body;
} resp;

/* A connected socket with a receive timeout of timeout_s, or -1. */
static inline int dial_t(int port, int timeout_s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}
static inline int dial(void) { return dial_t(g_port, 20); }

/* Sends a request; extra holds whole header lines; ctype NULL: application/json. */
static inline void send_req_ct(int fd, const char *method, const char *path, const char *extra, const char *ctype, const char *body,
                        size_t blen, bool keep) {
    char head[4096];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s%s%sContent-Length: %zu\r\n\r\n", method,
                     path, keep ? "" : "Connection: close\r\n", extra ? extra : "", ctype && !*ctype ? "" : "Content-Type: ",
                     ctype && !*ctype ? "" : ctype ? ctype : "application/json", ctype && !*ctype ? "" : "\r\n", body ? blen : 0);
    ssize_t w = send(fd, head, (size_t)n, MSG_NOSIGNAL);
    if (body && blen) w = send(fd, body, blen, MSG_NOSIGNAL);
    (void)w;
}
static inline void send_req(int fd, const char *method, const char *path, const char *extra, const char *body, size_t blen, bool keep) {
    send_req_ct(fd, method, path, extra, NULL, body, blen, keep);
}

/* Reads one response. */
static inline bool read_resp(int fd, resp *r) {
    memset(r, 0, sizeof *r);
    sbuf raw = {0};
    char buf[8192];
    size_t hend = 0;
    for (;;) {
        char *p = raw.data ? strstr(raw.data, "\r\n\r\n") : NULL;
        if (p) {
            hend = (size_t)(p - raw.data) + 4;
            break;
        }
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            sb_free(&raw);
            return false;
        }
        sb_add(&raw, buf, (size_t)n);
    }
    snprintf(r->headers, sizeof r->headers, "%.*s", (int)hend, raw.data);
    sscanf(raw.data, "HTTP/1.%*d %d", &r->status);
    bool chunked = strcasestr(r->headers, "transfer-encoding: chunked") != NULL;
    const char *cl = strcasestr(r->headers, "content-length:");
    long want = cl ? atol(cl + 15) : -1;
    sb_consume(&raw, hend);
    if (!chunked) {
        while (want < 0 || (long)raw.len < want) {
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            sb_add(&raw, buf, (size_t)n);
        }
        sb_add(&r->body, raw.data ? raw.data : "", want >= 0 && (size_t)want < raw.len ? (size_t)want : raw.len);
        sb_free(&raw);
        return true;
    }
    for (;;) {
        char *eol = raw.data ? strstr(raw.data, "\r\n") : NULL;
        if (eol) {
            long sz = strtol(raw.data, NULL, 16);
            size_t need = (size_t)(eol - raw.data) + 2 + (size_t)sz + 2;
            if (raw.len >= need) {
                if (sz == 0) break;
                sb_add(&r->body, eol + 2, (size_t)sz);
                sb_consume(&raw, need);
                continue;
            }
        }
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        sb_add(&raw, buf, (size_t)n);
    }
    sb_free(&raw);
    return true;
}

static inline int http_ct(const char *method, const char *path, const char *extra, const char *ctype, const char *body, resp *r) {
    int fd = dial();
    if (fd < 0) return -1;
    send_req_ct(fd, method, path, extra, ctype, body, body ? strlen(body) : 0, false);
    bool ok = read_resp(fd, r);
    close(fd);
    return ok ? r->status : -1;
}
static inline int http(const char *method, const char *path, const char *extra, const char *body, resp *r) {
    return http_ct(method, path, extra, NULL, body, r);
}

/* Whether the server closed fd (EOF) within timeout_s. */
static inline bool closed_by_peer(int fd, int timeout_s) {
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0) return true;
        if (n < 0) return errno == ECONNRESET; /* else a timeout */
    }
}

#endif
