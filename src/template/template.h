/* template.h: a Jinja interpreter for chat templates (tokenizer.chat_template).
 *
 * Written for what real chat templates use, with the semantics of Hugging Face
 * transformers' apply_chat_template: Python Jinja2's ImmutableSandboxedEnvironment
 * with trim_blocks and lstrip_blocks, the loopcontrols extension, the
 * {% generation %} tag, a json.dumps-style `tojson`, and the globals
 * raise_exception(msg), strftime_now(fmt), namespace(...) and range(...).
 * Values follow Python: None/bool/int/float/str/list/tuple/dict with
 * insertion order, Python str()/repr() printing, Jinja's lenient Undefined.
 *
 * Templates are untrusted: compiling and rendering never crash; nesting depth,
 * loop iterations, output size and render memory are bounded (tpl_options), and
 * exceeding a bound is a clean error of kind TPL_E_LIMIT.
 *
 * Usage:
 *     tpl_template *t;
 *     if (tpl_compile(src, len, &t, &err) != HN_OK) ...   // err says "line L, column C: ..."
 *     tpl_buf out = {0};
 *     if (tpl_render(t, vars, NULL, &out, &kind, &err) != HN_OK) ...
 *     ... out.data (NUL-terminated), out.len ...
 *     tpl_buf_free(&out); tpl_free(t);
 *
 * `vars` is a JSON object (jansson); each key becomes a top-level variable
 * (messages, tools, add_generation_prompt, bos_token, eos_token, ...). JSON
 * null is Python None (so `tools is defined` and `tools is none`); a name not
 * given is undefined. Integers stay int, reals stay float. */
#ifndef HN_TEMPLATE_H
#define HN_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

typedef struct tpl_template tpl_template;

/* What kind of failure a compile or render reported. */
typedef enum {
    TPL_E_NONE = 0,
    TPL_E_SYNTAX,    /* the template does not parse (jinja2 TemplateSyntaxError) */
    TPL_E_RAISE,     /* the template called raise_exception(msg); err->msg is msg exactly */
    TPL_E_UNDEFINED, /* use of an undefined value (jinja2 UndefinedError) */
    TPL_E_SECURITY,  /* refused by the immutable sandbox (list.append, dict.update, ...) */
    TPL_E_TYPE,      /* a Python TypeError/ValueError, or a Jinja runtime error */
    TPL_E_LIMIT,     /* a bound of tpl_options was exceeded */
    TPL_E_NOMEM      /* out of memory */
} tpl_errkind;

/* Bounds and environment of one render. Zero fields take the defaults. */
typedef struct tpl_options {
    size_t max_output;      /* bytes of output (default 64 MiB) */
    size_t max_memory;      /* bytes of render-time values (default 512 MiB) */
    uint64_t max_steps;     /* loop iterations + macro calls + filter items (default 10M) */
    int max_depth;          /* nested macro calls / evaluation depth (default 200) */
    int64_t now;            /* strftime_now's time as seconds since the epoch (local time);
                               0 = the current time */
} tpl_options;

/* A growing output buffer owned by the caller; data is NUL-terminated when non-NULL. */
typedef struct tpl_buf {
    char *data;
    size_t len, cap;
} tpl_buf;

/* Compiles `len` bytes of template source. On success *out owns the template
 * (free with tpl_free); on failure returns HN_ERR_FORMAT (or HN_ERR_NOMEM) and
 * err says "line L, column C: what". */
hn_status tpl_compile(const char *src, size_t len, tpl_template **out, hn_err *err);

/* Renders t with the variables of the JSON object `vars` (may be NULL), appending
 * the output to *out (grown with hn_realloc). opt may be NULL. On failure returns
 * non-OK, sets *kind (if non-NULL) and err: for TPL_E_RAISE err->msg is the
 * template's message exactly, otherwise "line L: what". out may hold partial
 * output after a failure. */
hn_status tpl_render(const tpl_template *t, const json_t *vars, const tpl_options *opt,
                     tpl_buf *out, tpl_errkind *kind, hn_err *err);

/* Frees a compiled template (NULL is fine). */
void tpl_free(tpl_template *t);

/* Frees a buffer's memory and zeroes it. */
void tpl_buf_free(tpl_buf *b);

#endif
