/* api.h: what the three wire APIs share: which API a request came in on, the
 * usage counters, why a generation ended, and errors in each API's own format.
 *
 * The server speaks OpenAI chat completions and legacy completions, the
 * OpenAI Responses API and the Anthropic Messages API. Every error leaves as
 * that API's JSON with the HTTP status that fits it:
 *   OpenAI/Responses: {"error":{"message","type","param","code"}}
 *   Anthropic:        {"type":"error","error":{"type","message"}}
 * Context overflow is 400 with code "context_length_exceeded" (OpenAI) and
 * invalid_request_error (Anthropic), never a 5xx: clients retry 5xx. */
#ifndef HN_SERVER_API_H
#define HN_SERVER_API_H

#include <stdbool.h>
#include <stdint.h>

#include "sbuf.h"

typedef enum api_kind {
    API_CHAT,        /* POST /v1/chat/completions */
    API_COMPLETIONS, /* POST /v1/completions */
    API_RESPONSES,   /* POST /v1/responses */
    API_MESSAGES,    /* POST /v1/messages (Anthropic) */
} api_kind;

/* Error classes; each maps to a status and a per-API type string. */
typedef enum api_errkind {
    APIE_INVALID,      /* 400 malformed JSON, missing/ill-typed field, bad UTF-8 */
    APIE_CONTEXT,      /* 400 prompt (plus reserved output) longer than the context */
    APIE_AUTH,         /* 401 missing or wrong API key */
    APIE_FORBIDDEN,    /* 403 an Origin or Host the server does not serve */
    APIE_MEDIA_TYPE,   /* 415 a body that is not Content-Type: application/json */
    APIE_NOT_FOUND,    /* 404 unknown route */
    APIE_METHOD,       /* 405 wrong method for a known route */
    APIE_TOO_LARGE,    /* 413 body over the limit */
    APIE_OVERLOADED,   /* 503/529 too many requests queued */
    APIE_INTERNAL,     /* 500 a bug or out of memory */
} api_errkind;

typedef struct api_error {
    api_errkind kind;
    char message[512];
    char param[64]; /* the offending field for OpenAI's "param" (may be empty) */
} api_error;

/* Fills e (kind, printf-style message, param may be NULL) and returns e. */
api_error *api_seterr(api_error *e, api_errkind kind, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The HTTP status for an error class in an API (Anthropic says 529 for overloaded). */
int api_http_status(api_kind api, api_errkind kind);

/* Appends the error's JSON body in the API's format to out. */
void api_error_json(api_kind api, const api_error *e, sbuf *out);

/* Why a generation ended, as the writers see it. */
typedef enum api_finish {
    API_FIN_STOP,       /* end of generation token */
    API_FIN_STOP_SEQ,   /* a stop string matched (text up to it was delivered) */
    API_FIN_LENGTH,     /* max_tokens reached */
    API_FIN_CONTEXT,    /* the context filled up */
    API_FIN_TOOL_CALLS, /* ended after one or more tool calls */
    API_FIN_CANCELLED,  /* client went away or server shutting down */
    API_FIN_ERROR,      /* the engine failed mid-generation */
} api_finish;

typedef struct api_usage {
    int32_t prompt_tokens;    /* all prompt tokens */
    int32_t cached_tokens;    /* of which served from the prefix cache */
    int32_t completion_tokens;
    int32_t reasoning_tokens; /* of the completion, inside reasoning */
    int32_t drafted_tokens;   /* speculative decoding: drafted and verified (0: none; then not reported) */
    int32_t accepted_tokens;  /* of which accepted (= decode steps saved) */
} api_usage;

/* Writes a random id "<prefix><n alphanumerics>" into out (cap bytes). */
void api_make_id(char *out, size_t cap, const char *prefix, int n);

#endif
