/* status.c: status strings and the error handle. */
#include "status.h"

#include <stdio.h>
#include <string.h>

static const char *const status_msgs[] = {
#define HN_X_MSG(name, msg) msg,
    HN_STATUS_LIST(HN_X_MSG)
#undef HN_X_MSG
};

static const char *const status_names[] = {
#define HN_X_NAME(name, msg) #name,
    HN_STATUS_LIST(HN_X_NAME)
#undef HN_X_NAME
};

const char *hn_status_str(hn_status s) {
    if ((unsigned)s >= HN_STATUS_COUNT) return "unknown status";
    return status_msgs[s];
}

const char *hn_status_name(hn_status s) {
    if ((unsigned)s >= HN_STATUS_COUNT) return "HN_ERR_UNKNOWN";
    return status_names[s];
}

hn_status hn_errf(hn_err *err, hn_status code, const char *fmt, ...) {
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void hn_err_clear(hn_err *err) {
    if (!err) return;
    err->code = HN_OK;
    err->msg[0] = '\0';
}
