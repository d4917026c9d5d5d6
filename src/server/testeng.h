/* testeng.h: a scripted stand-in for the engine, for protocol tests.
 *
 * It implements the srv_engine calls (submit / cancel with the events of
 * engine.h, delivered from its own thread) without a model: the "generated"
 * text is chosen from the prompt by directives a test writes into a user
 * message, then tokenized with the real vocabulary and delivered token by
 * token:
 *   (none)                   "Hello from the hone test engine."
 *   MOCK:TOOL name {json}    one Hermes tool call <tool_call>{"name":..,"arguments":json}</tool_call>
 *   MOCK:TOOL2 name {json}   two calls to name with json
 *   MOCK:THINK               <think>..</think> then an answer
 *   MOCK:LONG                words until max_tokens (finish: length)
 *   MOCK:STOP                "alpha beta STOPHERE gamma delta"
 *   MOCK:SLOW                long text at 200 ms per token (disconnect tests)
 *   MOCK:UTF8                multi-byte text split across tokens
 *   MOCK:KVFULL              no token: ends with the engine's error for a request its
 *                            KV cache can never hold (HN_ERR_FULL)
 * Once a "<tool_response>" follows the last directive, it answers
 * "Done: the tool ran." It also imitates the prefix cache: n_cached is the
 * longest block-aligned (16) common prefix with a recent prompt, always
 * leaving the last prompt token uncached. `hone serve --test-engine` uses it;
 * it is never a substitute for the real engine. */
#ifndef HN_SERVER_TESTENG_H
#define HN_SERVER_TESTENG_H

#include "../tokenizer/tokenizer.h"
#include "server.h"

typedef struct teng teng;

/* Starts the scripted engine over vocab (borrowed); n_ctx bounds prompt + output. */
hn_status teng_create(const tok_vocab *vocab, int32_t n_ctx, teng **out, hn_err *err);
/* Cancels everything (each request gets DONE), stops the thread, frees. */
void teng_free(teng *t);
/* Requests submitted and not yet ended (for tests). */
int teng_active(teng *t);
/* The srv_engine calls bound to t. */
srv_engine teng_engine(teng *t);

#endif
