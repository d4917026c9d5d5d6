/* test_fuzz_corpora.c: every input of the corpora of the single-part fuzz
 * harnesses (tests/fuzz/fuzz_{gguf,tokenizer,template,grammar}.c, corpora
 * in tests/fuzz/corpus/<name>, plus the shared chat templates for the
 * template harness) through the same harness code, in the ordinary (and
 * the ASan+UBSan) suite, so that the corpora and the findings kept in them
 * (tests/fuzz/corpus/<name>/regress-*) are tested without clang. A finding
 * aborts. With arguments (NAME FILE...), replays those files through one
 * harness and prints the time each takes. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#define FUZZ_REPLAY 1
#include "fuzz/fuzz_gguf.c"
#include "fuzz/fuzz_grammar.c"
#include "fuzz/fuzz_template.c"
#include "fuzz/fuzz_tokenizer.c"
#include "test.h"

typedef void (*one_fn)(const uint8_t *, size_t);

static uint8_t g_buf[1 << 18];

static bool replay_file(const char *path, one_fn one) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t len = fread(g_buf, 1, sizeof g_buf, f);
    fclose(f);
    one(g_buf, len);
    return true;
}

static int replay_dir(const char *dir, one_fn one) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        n += replay_file(path, one);
    }
    closedir(d);
    return n;
}

static one_fn by_name(const char *name) {
    return !strcmp(name, "gguf")        ? fuzz_gguf_one
           : !strcmp(name, "tokenizer") ? fuzz_tokenizer_one
           : !strcmp(name, "template")  ? fuzz_template_one
           : !strcmp(name, "grammar")   ? fuzz_grammar_one
                                        : NULL;
}

int main(int argc, char **argv) {
    const char *root = getenv("HONE_SHARED"); /* test.h's data root */
    const char *shared = root && *root ? root : "../shared";
    setenv("HONE_FUZZ_SHARED", shared, 0);
    fuzz_gguf_init();
    fuzz_tokenizer_init();
    fuzz_template_init();
    fuzz_grammar_init();
    if (argc > 2) {
        one_fn one = by_name(argv[1]);
        CHECKF(one != NULL, "harness %s", argv[1]);
        for (int i = 2; one && i < argc; i++) {
            double t0 = hn_now_ms();
            CHECKF(replay_file(argv[i], one), "%s", argv[i]);
            printf("%s: %.1f ms\n", argv[i], hn_now_ms() - t0);
        }
    } else {
        CHECKF(g_ntv >= 4, "the tokenizer harness loaded %d vocabularies", g_ntv);
        const char *names[] = {"gguf", "tokenizer", "template", "grammar"};
        for (int i = 0; i < 4; i++) {
            char dir[256];
            snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", names[i]);
            double t0 = hn_now_ms();
            int n = replay_dir(dir, by_name(names[i]));
            CHECKF(n >= 3, "%s: %d corpus inputs replayed", dir, n);
            printf("%s: %d inputs, %.0f ms\n", dir, n, hn_now_ms() - t0);
        }
        char tdir[1024];
        snprintf(tdir, sizeof tdir, "%s/data/templates/templates", shared);
        int n = replay_dir(tdir, fuzz_template_one);
        CHECKF(n >= 10, "%s: %d templates replayed", tdir, n);
    }
    fuzz_tokenizer_free();
    fuzz_template_free();
    fuzz_grammar_free();
    TEST_DONE();
}
