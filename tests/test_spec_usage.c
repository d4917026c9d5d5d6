/* test_spec_usage: a response's final usage carries the speculative counters
 * (drafted, accepted, steps saved) in every API, as valid JSON, and only when
 * the request drafted something (so responses without speculation keep their
 * exact shape). */
#include <jansson.h>

#include "../src/server/writer.h"
#include "test.h"

/* The last JSON object in out that has a "usage" (a body, or an SSE data line). */
static json_t *usage_of(const char *s) {
    json_t *found = NULL;
    for (const char *p = s; (p = strchr(p, '{'));) {
        json_error_t je;
        json_t *v = json_loads(p, JSON_DISABLE_EOF_CHECK, &je);
        if (v) {
            json_t *u = json_object_get(v, "usage");
            if (!u && json_object_get(v, "response")) u = json_object_get(json_object_get(v, "response"), "usage");
            if (!u && json_object_get(v, "message")) u = json_object_get(json_object_get(v, "message"), "usage");
            if (u && json_is_object(u)) {
                json_decref(found);
                found = json_incref(u);
            }
            json_decref(v);
            p += je.position > 0 ? (size_t)je.position : 1;
        } else {
            p++;
        }
    }
    return found;
}

int main(void) {
    const api_kind kinds[4] = {API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES};
    const char *names[4] = {"chat", "completions", "responses", "messages"};
    for (int k = 0; k < 4; k++)
        for (int stream = 0; stream < 2; stream++)
            for (int drafted = 0; drafted < 2; drafted++) {
                wr_meta m = {.api = kinds[k], .stream = stream, .include_usage = true, .model = "m"};
                wr_writer *w = wr_new(&m);
                sbuf out = {0};
                api_usage u = {.prompt_tokens = 10, .completion_tokens = 7,
                               .drafted_tokens = drafted ? 9 : 0, .accepted_tokens = drafted ? 5 : 0};
                wr_begin(w, &out, 10);
                wr_text(w, &out, "hello", 5);
                wr_end(w, &out, API_FIN_STOP, NULL, &u);
                sb_add(&out, "", 1); /* NUL */
                json_t *uj = out.data ? usage_of(out.data) : NULL;
                CHECKF(uj != NULL, "%s stream %d: no usage", names[k], stream);
                json_t *sp = uj ? json_object_get(uj, "speculative") : NULL;
                if (drafted)
                    CHECKF(sp && json_integer_value(json_object_get(sp, "drafted_tokens")) == 9 &&
                               json_integer_value(json_object_get(sp, "accepted_tokens")) == 5 &&
                               json_integer_value(json_object_get(sp, "steps_saved")) == 5,
                           "%s stream %d: speculative counters missing", names[k], stream);
                else
                    CHECKF(!sp, "%s stream %d: speculative counters without drafts", names[k], stream);
                json_decref(uj);
                sb_free(&out);
                wr_free(w);
            }
    TEST_DONE();
}
