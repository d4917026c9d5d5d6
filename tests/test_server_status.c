/* test_server_status.c: what a running server shows about itself, against a
 * scripted workload on the real engine (`$HONE_BIN serve` on qwen3-real with
 * an API key):
 *   - /metrics and /v1/hone/status refuse a missing key; the dashboard page
 *     at / is served without one (it holds no data);
 *   - three completions sharing a long prefix, then a long streaming one
 *     left running: `hone ps` lists it decoding, with the pool, the model
 *     and the cached tokens; without the key it fails with a clear message;
 *   - /metrics counts the requests, the cached tokens and the TTFT
 *     histogram, and the running request's KV bytes equal the pool's used
 *     blocks;
 *   - a dense model shows no recurrent-state metrics; a hybrid one
 *     (qwen35-tiny) shows its state memory, the slot size, the checkpoints
 *     and each live request's state bytes (/metrics and /v1/hone/status);
 *   - `hone serve --host 0.0.0.0` (the scripted engine) without a key warns that anyone who can
 *     reach the port can use the model, and does not with one;
 *   - a KV pool far smaller than six concurrent sessions: every request
 *     completes, with preemptions counted and no block left in use;
 *   - the dashboard in headless Chromium (Debian's `chromium`) shows the live
 *     session and the pool; the screenshot is kept in
 *     $BUILD/artifacts/dashboard.png (skipped, with a note, when chromium is
 *     not installed). */
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static const char *KEY = "status-key";
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

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_req(int fd, const char *method, const char *path, bool key, const char *body) {
    char h[512];
    int n = snprintf(h, sizeof h, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%s%s%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, key ? "Authorization: Bearer " : "", key ? KEY : "", key ? "\r\n" : "",
                     body ? strlen(body) : 0);
    if (write(fd, h, (size_t)n) != n || (body && write(fd, body, strlen(body)) != (ssize_t)strlen(body)))
        fprintf(stderr, "short write\n");
}

/* One request, read to the end; returns the status, body in buf. */
static int http(const char *method, const char *path, bool key, const char *body, char *buf, size_t cap) {
    int fd = dial();
    if (fd < 0) return -1;
    send_req(fd, method, path, key, body);
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

/* The value of a metric line "name value" (name with labels as written), or -1. */
static double metric(const char *text, const char *name) {
    size_t l = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p += l)
        if ((p == text || p[-1] == '\n') && p[l] == ' ') return atof(p + l + 1);
    return -1;
}

/* hone serve on model with the key (and up to 4 more arguments); the child's pid (-1: it did not come up) */
static pid_t start_server_args(const char *hone, const char *model, const char *a1, const char *a2) {
    port = free_port();
    char sport[16];
    snprintf(sport, sizeof sport, "%d", port);
    pid_t srv = fork();
    if (srv == 0) {
        setenv("HONE_NO_TUNE", "1", 1);
        const char *argv[] = {hone, "serve", "-m", model, "--port", sport, "--api-key", KEY, "--ctx", "8192", a1, a2, NULL};
        execv(hone, (char **)argv);
        _exit(127);
    }
    static char b[4096];
    int st = -1;
    for (int i = 0; i < 600 && st != 200; i++) {
        st = http("GET", "/health", false, NULL, b, sizeof b);
        if (st != 200) usleep(50000);
    }
    if (st != 200) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
        return -1;
    }
    return srv;
}

static pid_t start_server(const char *hone, const char *model) { return start_server_args(hone, model, NULL, NULL); }

typedef struct {
    int k, status, tokens;
} pressure_req;

static void *pressure_one(void *arg) {
    pressure_req *q = arg;
    char body[8192], *buf = malloc(1 << 16);
    int n = snprintf(body, sizeof body, "{\"prompt\": \"Session %d. ", q->k);
    for (int i = 0; i < 30 && n < 6000; i++) n += snprintf(body + n, sizeof body - (size_t)n, "The agent %d reads the file and edits line %d. ", q->k, i);
    snprintf(body + n, sizeof body - (size_t)n, "\", \"max_tokens\": 200, \"temperature\": 0}");
    q->status = buf ? http("POST", "/v1/completions", true, body, buf, 1 << 16) : -1;
    const char *ct = buf ? strstr(buf, "\"completion_tokens\":") : NULL;
    q->tokens = ct ? atoi(ct + strlen("\"completion_tokens\":")) : -1;
    free(buf);
    return NULL;
}

/* a KV pool far smaller than the load (6 sessions of ~500 positions, room for about 1.5):
 * every request still completes (the engine preempts and recomputes), the
 * preemptions are counted, and afterwards no block is in use */
static void test_pool_pressure(const char *hone) {
    char model[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    pid_t srv = start_server_args(hone, model, "--kv-bytes", "768K");
    CHECKF(srv > 0, "hone serve --kv-bytes 768K");
    if (srv <= 0) return;
    pressure_req q[6];
    pthread_t th[6];
    for (int i = 0; i < 6; i++) {
        q[i] = (pressure_req){.k = i, .status = -1, .tokens = -1};
        pthread_create(&th[i], NULL, pressure_one, &q[i]);
    }
    int ok = 0;
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        ok += q[i].status == 200 && q[i].tokens > 0 && q[i].tokens <= 200;
    }
    CHECKF(ok == 6, "under a small KV pool %d of 6 requests completed", ok);
    static char buf[1 << 18];
    /* the figures are the engine's snapshot after its step: the last reply can reach the client before the
     * step that sent it ends, so read until the blocks are back (a few seconds at most) */
    double pre = 0, used = -1, mx = 0;
    for (int tries = 0; tries < 50 && used != 0; tries++) {
        if (tries) usleep(100 * 1000);
        CHECK(http("GET", "/metrics", true, NULL, buf, sizeof buf) == 200);
        pre = metric(buf, "hone_preemptions_total");
        used = metric(buf, "hone_kv_blocks{state=\"used\"}");
        mx = metric(buf, "hone_kv_blocks_max");
    }
    CHECKF(pre > 0 && used == 0 && mx > 0 && mx < 6 * 500 / 16, "preemptions %g, blocks used after %g, pool %g blocks",
           pre, used, mx);
    CHECK(http("GET", "/health", false, NULL, buf, sizeof buf) == 200);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
}

/* a hybrid model's recurrent state, in /metrics and the status object, while a request decodes */
static void test_hybrid_state(const char *hone) {
    char model[512];
    test_data_path(model, sizeof model, "data/models/qwen35-tiny-q8_0.gguf");
    pid_t srv = start_server(hone, model);
    CHECKF(srv > 0, "hone serve on %s", model);
    if (srv <= 0) return;
    static char buf[1 << 20], body[4096];
    snprintf(body, sizeof body, "{\"prompt\": \"The agent reads the file and edits it.\", \"max_tokens\": 6000, "
                                "\"temperature\": 0, \"stream\": true}");
    int lfd = dial();
    send_req(lfd, "POST", "/v1/completions", true, body);
    CHECK(read(lfd, buf, 4096) > 0);
    bool decoding = false;
    for (int i = 0; i < 600 && !decoding; i++) {
        decoding = http("GET", "/v1/hone/status", true, NULL, buf, sizeof buf) == 200 &&
                   strstr(buf, "\"state\":\"decode\"") && strstr(buf, "\"n_generated\":0,") == NULL;
        if (!decoding) usleep(50000);
    }
    CHECKF(decoding, "the hybrid model's request decodes");
    const char *sb = strstr(buf, "\"state_slot_bytes\":"), *ss = strstr(buf, "\"sessions\":");
    const long slot = sb ? atol(sb + strlen("\"state_slot_bytes\":")) : 0;
    const char *sess_state = ss ? strstr(ss, "\"state_bytes\":") : NULL;
    CHECKF(slot > 0 && sess_state && atol(sess_state + strlen("\"state_bytes\":")) == slot,
           "status: the state slot (%ld bytes) and the decoding session's state bytes", slot);
    CHECK(http("GET", "/metrics", true, NULL, buf, sizeof buf) == 200);
    const double slotm = metric(buf, "hone_state_slot_bytes"), state = metric(buf, "hone_state_bytes");
    CHECKF(slotm == (double)slot && state >= slotm && metric(buf, "hone_state_peak_bytes") >= state &&
               metric(buf, "hone_state_checkpoints") >= 0 && metric(buf, "hone_state_checkpoints_max") > 0 &&
               metric(buf, "hone_state_checkpoint_hits_total") >= 0,
           "metrics: state %g bytes, slot %g, checkpoints %g of %g", state, slotm, metric(buf, "hone_state_checkpoints"),
           metric(buf, "hone_state_checkpoints_max"));
    const char *ps = strstr(buf, "hone_session_state_bytes{id=\"1\"} ");
    CHECKF(ps && atof(strchr(ps, '}') + 2) == slotm, "metrics: the decoding request's state bytes");
    close(lfd);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
}

/* the startup lines of `hone serve --test-engine --host HOST [--api-key K]` (stopped after they are out) */
static void serve_banner(const char *hone, const char *model, const char *host, const char *key, char *out, size_t cap) {
    int fds[2];
    out[0] = 0;
    if (pipe(fds)) return;
    char sport[16];
    snprintf(sport, sizeof sport, "%d", free_port());
    pid_t p = fork();
    if (p == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        const char *argv[] = {hone, "serve", "-m", model, "--test-engine", "--host", host, "--port", sport,
                              key ? "--api-key" : NULL, key, NULL};
        setenv("HONE_API_KEY", "", 1);
        execv(hone, (char **)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    /* until the listening line is out, then what follows it within half a second (the warning) */
    for (int waited_ms = 0; waited_ms < 60000 && n + 1 < cap;) {
        const char *on = strstr(out, " on http://");
        const bool listening = on && strchr(on, '\n');
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        const int r = poll(&pf, 1, listening ? 500 : 100);
        if (r == 0) {
            if (listening) break;
            waited_ms += 100;
            continue;
        }
        ssize_t k = r > 0 ? read(fds[0], out + n, cap - 1 - n) : -1;
        if (k <= 0) break;
        n += (size_t)k;
        out[n] = 0;
    }
    kill(p, SIGTERM);
    waitpid(p, NULL, 0);
    close(fds[0]);
}

static void test_keyless_warning(const char *hone) {
    char out[4096], model[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    serve_banner(hone, model, "0.0.0.0", NULL, out, sizeof out);
    CHECKF(strstr(out, " on http://0.0.0.0:") && strstr(out, "WARNING: listening on 0.0.0.0 without an API key"),
           "hone serve --host 0.0.0.0 without a key warns: %s", out);
    serve_banner(hone, model, "0.0.0.0", "k", out, sizeof out);
    CHECKF(strstr(out, " on http://0.0.0.0:") && !strstr(out, "WARNING"), "with a key it does not: %s", out);
    serve_banner(hone, model, "127.0.0.1", NULL, out, sizeof out);
    CHECKF(strstr(out, " on http://127.0.0.1:") && !strstr(out, "WARNING"), "nor on loopback: %s", out);
}

static int run_capture(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *find_chromium(void) {
    static const char *const c[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"};
    for (int i = 0; i < 3; i++)
        if (access(c[i], X_OK) == 0) return c[i];
    return NULL;
}

static void test_dashboard(const char *build) {
    const char *chrome = find_chromium();
    if (!chrome) {
        printf("skip: the dashboard browser test needs chromium (apt-get install chromium)\n");
        return;
    }
    static char cmd[4096], out[1 << 20];
    char profile[] = "/tmp/hone-chromium-XXXXXX";
    if (!mkdtemp(profile)) {
        CHECK(0);
        return;
    }
    const char *flags = "--headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run "
                        "--disable-component-update --disable-sync --disable-dev-shm-usage";
    /* virtual time runs the page's polling (every 300 ms) for a few seconds */
    snprintf(cmd, sizeof cmd,
             "%s %s --user-data-dir=%s --virtual-time-budget=4000 --dump-dom 'http://127.0.0.1:%d/?interval=300#key=%s' "
             "2>/dev/null",
             chrome, flags, profile, port, KEY);
    int rc = run_capture(cmd, out, sizeof out);
    CHECKF(rc == 0, "chromium --dump-dom exited %d", rc);
    CHECKF(strstr(out, "id=\"state\">live") != NULL, "the page polled the status endpoint with the key");
    CHECKF(strstr(out, "<tr data-id=\"") != NULL && strstr(out, "<td>decode</td>") != NULL,
           "the page lists the decoding session");
    CHECKF(strstr(out, "used, ") && strstr(out, "KV f16"), "the page shows the pool and the model");
    const char *hit = strstr(out, "id=\"hit\">");
    CHECKF(hit && hit[9] >= '1' && hit[9] <= '9', "the page shows a cache hit rate (%.12s)", hit ? hit + 9 : "");
    char art[1024];
    snprintf(art, sizeof art, "%s/artifacts", build);
    mkdir(art, 0755);
    snprintf(cmd, sizeof cmd,
             "%s %s --user-data-dir=%s --virtual-time-budget=4000 --window-size=1200,1100 --screenshot=%s/dashboard.png "
             "'http://127.0.0.1:%d/?interval=300#key=%s' > /dev/null 2>&1",
             chrome, flags, profile, art, port, KEY);
    rc = run_capture(cmd, out, sizeof out);
    snprintf(cmd, sizeof cmd, "%s/dashboard.png", art);
    struct stat sb;
    CHECKF(rc == 0 && stat(cmd, &sb) == 0 && sb.st_size > 10000, "screenshot kept in %s", cmd);
    printf("dashboard screenshot: %s\n", cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", profile);
    if (system(cmd)) {}
}

int main(void) {
    const char *hone = getenv("HONE_BIN");
    if (!hone || !*hone) {
        CHECKF(0, "HONE_BIN is not set");
        TEST_DONE();
    }
    char model[512], build[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    snprintf(build, sizeof build, "%s", hone);
    char *slash = strrchr(build, '/');
    if (slash) *slash = 0;
    else snprintf(build, sizeof build, ".");
    port = free_port();
    char sport[16];
    snprintf(sport, sizeof sport, "%d", port);
    pid_t srv = fork();
    if (srv == 0) {
        setenv("HONE_NO_TUNE", "1", 1);
        const char *argv[] = {hone, "serve", "-m", model, "--port", sport, "--api-key", KEY, "--ctx", "8192", NULL};
        execv(hone, (char **)argv);
        _exit(127);
    }
    static char buf[1 << 20], out[1 << 16], cmd[2048];
    int st = -1;
    for (int i = 0; i < 600 && st != 200; i++) {
        st = http("GET", "/health", false, NULL, buf, sizeof buf);
        if (st != 200) usleep(50000);
    }
    CHECKF(st == 200, "hone serve listens on %d", port);
    if (st != 200) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
        TEST_DONE();
    }
    CHECK(http("GET", "/metrics", false, NULL, buf, sizeof buf) == 401);
    CHECK(http("GET", "/v1/hone/status", false, NULL, buf, sizeof buf) == 401);
    CHECK(http("GET", "/", false, NULL, buf, sizeof buf) == 200 && strstr(buf, "Memory per agent"));

    /* three turns sharing a ~250-token prefix */
    static char prefix[4096], body[8192];
    prefix[0] = 0;
    for (int i = 0; i < 40; i++) strcat(prefix, "The agent reads the file and edits it. ");
    for (int k = 0; k < 3; k++) {
        snprintf(body, sizeof body, "{\"prompt\": \"%sTurn %d asks something new.\", \"max_tokens\": 6, \"temperature\": 0}",
                 prefix, k);
        st = http("POST", "/v1/completions", true, body, buf, sizeof buf);
        CHECKF(st == 200, "completion %d: %d %.200s", k, st, buf);
    }
    /* a long one left running */
    int lfd = dial();
    snprintf(body, sizeof body, "{\"prompt\": \"%sThe long turn.\", \"max_tokens\": 6000, \"temperature\": 0, \"stream\": true}", prefix);
    send_req(lfd, "POST", "/v1/completions", true, body);
    ssize_t got = read(lfd, buf, 4096); /* headers and the first events */
    CHECK(got > 0);
    /* until it decodes (its first token is out), slower under a sanitizer */
    bool decoding = false;
    for (int i = 0; i < 600 && !decoding; i++) {
        decoding = http("GET", "/v1/hone/status", true, NULL, buf, sizeof buf) == 200 &&
                   strstr(buf, "\"state\":\"decode\"") && strstr(buf, "\"n_generated\":0,") == NULL;
        if (!decoding) usleep(50000);
    }
    CHECKF(decoding, "the long request decodes");

    snprintf(cmd, sizeof cmd, "%s ps --port %d --api-key %s 2>&1", hone, port, KEY);
    int rc = run_capture(cmd, out, sizeof out);
    printf("%s", out);
    CHECKF(rc == 0, "hone ps exits 0 (%d)", rc);
    CHECK(strstr(out, "KV f16") && strstr(out, "POOL") && strstr(out, "TOKENS"));
    CHECKF(strstr(out, " decode ") != NULL, "hone ps lists the running request decoding");
    const char *c = strstr(out, "cached ");
    CHECKF(c && atoi(c + 7) >= 3 * 16 * 10, "hone ps reports the prefix's cached tokens (%d)", c ? atoi(c + 7) : -1);
    snprintf(cmd, sizeof cmd, "HONE_API_KEY= %s ps --port %d 2>&1", hone, port);
    rc = run_capture(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "API key"), "hone ps without the key: %d %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s ps --port %d --api-key %s --json", hone, port, KEY);
    rc = run_capture(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "\"sessions\":[{"));
    CHECK(strstr(out, "\"scratch_bytes\":") != NULL); /* the model's scratch, in the status object */
    CHECK(strstr(out, "\"moe_apart_layers\":0") && strstr(out, "\"moe_apart_bytes\":0")); /* no --cpu-moe */

    st = http("GET", "/metrics", true, NULL, buf, sizeof buf);
    CHECK(st == 200);
    CHECKF(metric(buf, "hone_requests_total") == 4, "4 requests (%g)", metric(buf, "hone_requests_total"));
    CHECK(metric(buf, "hone_requests_finished_total{reason=\"length\"}") == 3);
    CHECK(metric(buf, "hone_cached_tokens_total") >= 3 * 16 * 10);
    CHECK(metric(buf, "hone_ttft_seconds_count") == 4 && metric(buf, "hone_ttft_seconds_bucket{le=\"+Inf\"}") == 4);
    CHECK(metric(buf, "hone_inter_token_seconds_count") >= 3 * 5);
    CHECK(metric(buf, "hone_requests_running") == 1 && metric(buf, "hone_queue_length") == 0);
    double used = metric(buf, "hone_kv_blocks{state=\"used\"}"), bb = metric(buf, "hone_kv_block_bytes");
    CHECKF(used > 0 && metric(buf, "hone_kv_blocks{state=\"cached\"}") >= 0 && metric(buf, "hone_kv_bytes") >= used * bb,
           "KV blocks used %g", used);
    CHECK(metric(buf, "hone_engine_bytes") > 0 && metric(buf, "hone_model_file_bytes") > 0);
    CHECK(metric(buf, "hone_model_moe_apart_bytes") == 0);
    /* the scratch, sized for the steps run: some, at most its peak */
    CHECKF(metric(buf, "hone_scratch_bytes") > 0 &&
               metric(buf, "hone_scratch_bytes") <= metric(buf, "hone_scratch_peak_bytes"),
           "scratch bytes %g (peak %g)", metric(buf, "hone_scratch_bytes"), metric(buf, "hone_scratch_peak_bytes"));
    /* speculation (the serve default, auto): its mode and counters, consistent with each other */
    double drafted = metric(buf, "hone_spec_drafted_tokens_total"), accepted = metric(buf, "hone_spec_accepted_tokens_total");
    CHECK(metric(buf, "hone_spec_mode{mode=\"auto\"}") == 1);
    CHECKF(drafted >= accepted && accepted >= 0 && metric(buf, "hone_spec_verify_steps_total") >= 0 &&
               metric(buf, "hone_spec_verify_steps_total") <= metric(buf, "hone_steps_total"),
           "speculative counters: drafted %g accepted %g", drafted, accepted);
    /* the one live request holds every used block, alone */
    const char *own = strstr(buf, "hone_session_kv_bytes{id=\"4\",kind=\"own\"} ");
    const char *shr = strstr(buf, "hone_session_kv_bytes{id=\"4\",kind=\"shared\"} ");
    CHECKF(own && shr && atof(strchr(own, '}') + 2) + atof(strchr(shr, '}') + 2) == used * bb,
           "the running request's KV bytes are the pool's used blocks");

    /* a dense model has no recurrent state to show */
    CHECK(metric(buf, "hone_state_bytes") == -1 && !strstr(buf, "hone_session_state_bytes"));

    test_dashboard(build);

    close(lfd); /* cancels the long generation */
    kill(srv, SIGTERM);
    int ws;
    waitpid(srv, &ws, 0);
    CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "hone serve stops cleanly on SIGTERM");
    test_hybrid_state(hone);
    test_keyless_warning(hone);
    test_pool_pressure(hone);
    TEST_DONE();
}
