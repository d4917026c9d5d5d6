/* test_server_isolation.c: the prefix cache per API key (`hone serve
 * --api-key A --api-key B`, issue 12): on the real engine (qwen3-real), a
 * prompt sent under key A is served from the cache when A sends it again
 * (cached_tokens > 0), but not when B sends the very same prompt
 * (cached_tokens == 0: B learns nothing about A's prompts, by its count or
 * its speed); B's own repeat hits B's cache. Either key is accepted, a
 * wrong or missing one is refused. With --cache-isolation off the two keys
 * share the cache again (the control: B then hits A's blocks). */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static int port;

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t l = sizeof a;
    int p = -1;
    if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &l)) p = ntohs(a.sin_port);
    close(fd);
    return p;
}

/* One request (key NULL: none), read to the end; returns the status, body in buf. */
static int http(const char *method, const char *path, const char *key, const char *body, char *buf, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    char h[512];
    int n = snprintf(h, sizeof h,
                     "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%s%s%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, key ? "x-api-key: " : "", key ? key : "", key ? "\r\n" : "", body ? strlen(body) : 0);
    if (write(fd, h, (size_t)n) != n || (body && write(fd, body, strlen(body)) != (ssize_t)strlen(body)))
        fprintf(stderr, "short write\n");
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)r;
    buf[len] = 0;
    close(fd);
    int st = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &st) != 1) return -1;
    char *b = strstr(buf, "\r\n\r\n");
    if (b) memmove(buf, b + 4, strlen(b + 4) + 1);
    return st;
}

static pid_t start(const char *hone, const char *model, bool isolate_off) {
    port = free_port();
    char sport[16];
    snprintf(sport, sizeof sport, "%d", port);
    pid_t srv = fork();
    if (srv == 0) {
        setenv("HONE_NO_TUNE", "1", 1);
        unsetenv("HONE_API_KEY");
        const char *argv[] = {hone, "serve", "-m", model, "--port", sport, "--api-key", "key-a", "--api-key", "key-b",
                              "--ctx", "2048", isolate_off ? "--cache-isolation" : NULL, "off", NULL};
        execv(hone, (char **)argv);
        _exit(127);
    }
    static char buf[4096];
    int st = -1;
    for (int i = 0; i < 1200 && st != 200; i++) {
        st = http("GET", "/health", NULL, NULL, buf, sizeof buf);
        if (st != 200) usleep(50000);
    }
    CHECKF(st == 200, "hone serve listens on %d", port);
    return st == 200 ? srv : -srv;
}

static void stop(pid_t srv) {
    kill(srv, SIGTERM);
    int ws;
    waitpid(srv, &ws, 0);
    CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "hone serve stops cleanly");
}

/* A completion under key; returns its cached_tokens (-1 on failure). */
static long cached(const char *key, const char *prompt) {
    static char body[16384], buf[1 << 16];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 2, \"temperature\": 0}", prompt);
    int st = http("POST", "/v1/completions", key, body, buf, sizeof buf);
    if (st != 200) {
        fprintf(stderr, "completion under %s: %d %.300s\n", key, st, buf);
        return -1;
    }
    json_t *j = json_loads(buf, 0, NULL);
    json_t *c = json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens");
    long v = json_is_integer(c) ? (long)json_integer_value(c) : -1;
    json_decref(j);
    return v;
}

int main(void) {
    const char *hone = getenv("HONE_BIN");
    if (!hone || !*hone) {
        CHECKF(0, "HONE_BIN is not set");
        TEST_DONE();
    }
    char model[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    static char p1[8192], p2[8192], buf[4096];
    p1[0] = p2[0] = 0;
    for (int i = 0; i < 24; i++) strcat(p1, "The tenant's secret plan has many steps. ");
    for (int i = 0; i < 24; i++) strcat(p2, "Another prompt, for the shared control. ");

    pid_t srv = start(hone, model, false);
    if (srv > 0) {
        CHECK(http("POST", "/v1/completions", NULL, "{\"prompt\": \"x\"}", buf, sizeof buf) == 401);
        CHECK(http("POST", "/v1/completions", "key-c", "{\"prompt\": \"x\"}", buf, sizeof buf) == 401);
        long a1 = cached("key-a", p1), a2 = cached("key-a", p1);
        long b1 = cached("key-b", p1), b2 = cached("key-b", p1);
        long a3 = cached("key-a", p1);
        CHECKF(a1 == 0, "key A's first prompt computes everything (cached %ld)", a1);
        CHECKF(a2 >= 128, "key A's repeat is served from A's cache (cached %ld)", a2);
        CHECKF(b1 == 0, "key B's identical prompt does not reuse A's cache (cached %ld)", b1);
        CHECKF(b2 >= 128, "key B's repeat is served from B's own cache (cached %ld)", b2);
        CHECKF(a3 == a2, "A's cache is still there after B's (cached %ld)", a3);
        stop(srv);
    } else if (srv < 0) {
        kill(-srv, SIGKILL);
        waitpid(-srv, NULL, 0);
    }

    srv = start(hone, model, true);
    if (srv > 0) {
        long a1 = cached("key-a", p2), b1 = cached("key-b", p2);
        CHECKF(a1 == 0 && b1 >= 128, "--cache-isolation off: B reuses A's blocks (cached %ld, then %ld)", a1, b1);
        stop(srv);
    } else if (srv < 0) {
        kill(-srv, SIGKILL);
        waitpid(-srv, NULL, 0);
    }
    TEST_DONE();
}
