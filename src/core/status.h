/* status.h: hone's error codes and the error handle.
 *
 * Every fallible function returns an hn_status and, when given a non-NULL
 * hn_err, writes a human-readable message naming what went wrong. Codes come
 * from one X-macro list so that names and messages cannot drift. Bad input is
 * never a reason to abort: only programmer bugs assert. */
#ifndef HN_STATUS_H
#define HN_STATUS_H

#include <stdarg.h>

#define HN_STATUS_LIST(X)                                        \
    X(HN_OK, "ok")                                               \
    X(HN_ERR_NOMEM, "out of memory")                             \
    X(HN_ERR_IO, "i/o error")                                    \
    X(HN_ERR_FORMAT, "malformed input")                          \
    X(HN_ERR_UNSUPPORTED, "unsupported")                         \
    X(HN_ERR_INVALID, "invalid argument")                        \
    X(HN_ERR_RANGE, "value out of range")                        \
    X(HN_ERR_NOT_FOUND, "not found")                             \
    X(HN_ERR_FULL, "capacity exhausted")                         \
    X(HN_ERR_CANCELLED, "cancelled")                             \
    X(HN_ERR_INTERNAL, "internal error")

typedef enum {
#define HN_X_ENUM(name, msg) name,
    HN_STATUS_LIST(HN_X_ENUM)
#undef HN_X_ENUM
    HN_STATUS_COUNT
} hn_status;

/* Error handle: the code and message of the last hn_errf on it. A later error
 * replaces an earlier one; a caller that adds context to a callee's error
 * passes the callee a local handle and formats its message into err (e.g.
 * gguf_open: "PATH: MESSAGE"), never err->msg into err itself. */
typedef struct hn_err {
    hn_status code;
    char msg[512];
} hn_err;

/* Returns the static description of a status code (never NULL). */
const char *hn_status_str(hn_status s);
/* Returns the enum name ("HN_ERR_FORMAT") of a status code (never NULL). */
const char *hn_status_name(hn_status s);

/* Records code and a printf-style message on err (err may be NULL), replacing
 * what it held; returns code, so callers can write
 * `return hn_errf(err, HN_ERR_FORMAT, "...", ...)`. The arguments must not
 * point into err->msg. */
hn_status hn_errf(hn_err *err, hn_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears an error handle to HN_OK with an empty message. */
void hn_err_clear(hn_err *err);

#endif
