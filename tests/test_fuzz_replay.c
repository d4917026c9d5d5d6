/* test_fuzz_replay.c: every input of the fuzz corpora (tests/fuzz/corpus/
 * api_<name>, kept by `make fuzz-run` merges) through the API-mapping
 * harness of tests/fuzz/fuzz_api.c, in the ordinary (and the ASan+UBSan)
 * suite: each must end in a request and a prompt or in a 4xx error; the
 * harness aborts otherwise. Also checks that each corpus is there. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz/fuzz_api.c"
#include "test.h"

static int replay(const char *dir, api_kind api) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        fuzz_one(api, buf, len);
        n++;
    }
    closedir(d);
    return n;
}

int main(void) {
    char model[512];
    test_data_path(model, sizeof model, "data/models/qwen3-real-q8_0.gguf");
    setenv("HONE_FUZZ_MODEL", model, 0);
    fuzz_init();
    CHECKF(g_have_pm, "the harness loaded %s", model);
    const char *names[] = {"chat", "completions", "responses", "messages"};
    api_kind apis[] = {API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES};
    for (int i = 0; i < 4; i++) {
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
