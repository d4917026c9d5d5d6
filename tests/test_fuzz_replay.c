/* test_fuzz_replay.c: every input of the fuzz corpora (tests/fuzz/corpus/
 * api_<name>, kept by `make fuzz-run` merges) through the API-mapping
 * harness of tests/fuzz/fuzz_api.c, in the ordinary (and the ASan+UBSan)
 * suite: each must end in a request and a prompt or in a 4xx error; the
 * harness aborts otherwise. Also checks that each corpus is there. With
 * arguments (API FILE..., API one of chat, completions, responses,
 * messages), replays those files through that API's mapping and prints the
 * time each takes. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

#include "fuzz/fuzz_api.c"
#include "test.h"

static uint8_t g_buf[1 << 22]; /* bodies up to 4 MiB (the fuzzers stop at 64 KiB) */

static bool replay_file(const char *path, api_kind api) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t len = fread(g_buf, 1, sizeof g_buf, f);
    fclose(f);
    fuzz_one(api, g_buf, len);
    return true;
}

static int replay(const char *dir, api_kind api) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        n += replay_file(path, api);
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    char model[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    setenv("HONE_FUZZ_MODEL", model, 0);
    fuzz_init();
    CHECKF(g_have_pm, "the harness loaded %s", model);
    const char *names[] = {"chat", "completions", "responses", "messages"};
    api_kind apis[] = {API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES};
    if (argc > 2) {
        int k = 0;
        while (k < 4 && strcmp(argv[1], names[k])) k++;
        CHECKF(k < 4, "API %s", argv[1]);
        for (int i = 2; k < 4 && i < argc; i++) {
            double t0 = hn_now_ms();
            CHECKF(replay_file(argv[i], apis[k]), "%s", argv[i]);
            printf("%s: %.1f ms\n", argv[i], hn_now_ms() - t0);
        }
        argc = 0;
    }
    for (int i = 0; argc && i < 4; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fuzz/corpus/api_%s", names[i]);
        int n = replay(dir, apis[i]);
        CHECKF(n >= 3, "%s: %d corpus inputs replayed", dir, n);
        printf("%s: %d inputs\n", dir, n);
    }
    prm_model_free(&g_pm);
    tok_free(g_vocab);
    gguf_close(g_gguf);
    TEST_DONE();
}
