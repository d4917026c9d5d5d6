/* test_server_e2e.c: `hone serve` end to end with the official SDKs.
 *
 * Starts $HONE_BIN serve on a free port on the real Qwen3 tokenizer and chat
 * template (scripted test engine; and the real engine too once the build has
 * one), runs tests/server/e2e.mjs with node (the `openai` and
 * `@anthropic-ai/sdk` npm packages, installed by `make setup` into
 * tests/server/node_modules), adds its "N passed, N failed" to ours, and
 * checks that the server then shuts down cleanly on SIGTERM. Skips (with a
 * note) only when node or node_modules is missing. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t l = sizeof a;
    int port = -1;
    if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &l)) port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static bool up(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static bool have_node(void) { return system("node --version > /dev/null 2>&1") == 0; }

/* One pass: serve, run the node script, stop. */
static void pass(const char *hone, const char *model, bool test_engine) {
    int port = free_port();
    char sport[16];
    snprintf(sport, sizeof sport, "%d", port);
    pid_t srv = fork();
    if (srv == 0) {
        const char *argv[] = {hone, "serve", "-m", model, "--port", sport, "--api-key", "e2e-key", "--ctx", "32768",
                              "--max-tokens", test_engine ? "96" : "200", test_engine ? "--test-engine" : NULL, NULL};
        execv(hone, (char **)argv);
        _exit(127);
    }
    bool ready = false;
    for (int i = 0; i < 600 && !ready; i++) { /* loading a real model may take a while under ASan */
        ready = up(port);
        if (!ready) usleep(50000);
        int st;
        if (!ready && waitpid(srv, &st, WNOHANG) == srv) break;
    }
    CHECKF(ready, "hone serve %s listens on %d", test_engine ? "--test-engine" : "(real engine)", port);
    if (!ready) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
        return;
    }
    char url[64], shared[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    test_data_path(shared, sizeof shared, "");
    int pfd[2];
    if (pipe(pfd)) return;
    pid_t node = fork();
    if (node == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        setenv("HONE_URL", url, 1);
        setenv("HONE_API_KEY", "e2e-key", 1);
        setenv("HONE_SHARED", shared, 1);
        setenv("HONE_ENGINE", test_engine ? "test" : "real", 1);
        setenv("HONE_E2E_CTX", "8000", 1);
        /* a real model prefills every replayed prompt: keep to the smaller ones */
        if (!test_engine) setenv("HONE_E2E_REPLAY_MAX", getenv("HONE_SANITIZED") ? "8000" : "16000", 1);
        execlp("node", "node", "tests/server/e2e.mjs", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    FILE *f = fdopen(pfd[0], "r");
    char line[4096];
    int p = -1, fl = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%d passed, %d failed", &p, &fl) == 2 && strstr(line, "passed, ")) continue;
        fputs(line, stdout); /* ok / FAIL lines */
    }
    if (f) fclose(f);
    int st = 0;
    waitpid(node, &st, 0);
    CHECKF(p >= 0, "node printed its result (exit status %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (p > 0) test_passed_ += p;
    if (fl > 0) test_failed_ += fl;
    kill(srv, SIGTERM);
    int sst = 0;
    pid_t w = 0;
    for (int i = 0; i < 200 && (w = waitpid(srv, &sst, WNOHANG)) == 0; i++) usleep(50000);
    if (w == 0) {
        kill(srv, SIGKILL);
        waitpid(srv, &sst, 0);
    }
    CHECKF(w == srv && WIFEXITED(sst) && WEXITSTATUS(sst) == 0, "hone serve stops cleanly on SIGTERM");
}

int main(void) {
    const char *hone = getenv("HONE_BIN");
    if (!hone || !*hone) hone = "./hone";
    struct stat sb;
    if (stat("tests/server/node_modules/openai", &sb) || stat("tests/server/node_modules/@anthropic-ai/sdk", &sb) ||
        !have_node()) {
        printf("SKIP: node or tests/server/node_modules missing (run `make setup`): SDK end-to-end tests not run\n");
        TEST_DONE();
    }
    char model[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    pass(hone, model, true);
    pass(hone, model, false);
    TEST_DONE();
}
