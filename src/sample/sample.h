/* sample.h: turning a row of logits into the next token.
 *
 * A sampler owns its parameters, its PRNG state, its recent-token history
 * (for penalties) and all scratch memory, sized for n_vocab at smp_new:
 * sampling a token allocates nothing. Same parameters, same seed, same logits
 * and accepted tokens give the same tokens.
 *
 * Two stages are also exported on their own, in the form a device can run
 * (the host functions below are their reference):
 *   - a constraint as an allowed-token bitmask: (n_vocab + 31) / 32
 *     little-endian uint32 words, bit t (word t / 32, bit t % 32) set = token
 *     t allowed (the grammar's gr_state_allowed, eng_request.allowed, the
 *     backend's mask_logits); smp_apply_allowed applies one to a row;
 *   - the penalty window as a sparse list of its distinct tokens and their
 *     counts (smp_penalty_list, at most penalty_last_n entries);
 *     smp_apply_penalties applies such a list to a row.
 *
 * The chain, in order (llama.cpp's default order for these stages):
 *   1. mask hook (optional: a callback sets disallowed logits to -inf)
 *   2. penalties over the last penalty_last_n accepted tokens: a token seen
 *      c > 0 times gets logit /= repeat_penalty (logit *= repeat_penalty if
 *      logit <= 0), then logit -= c * frequency_penalty + presence_penalty
 *   3. if temp <= 0: greedy, the highest logit (lowest id on ties); stop
 *   4. top-k (k <= 0 or k >= n_vocab: off)
 *   5. top-p over the softmax at temperature 1 (top_p >= 1: off): keep the
 *      most likely tokens until their mass reaches top_p (at least one)
 *   6. min-p (min_p <= 0: off): keep tokens whose probability is at least
 *      min_p times the most likely one's
 *   7. temperature, softmax, then one draw from the seeded PRNG
 * Note that, as in llama.cpp, top-p and min-p see the temperature-1
 * distribution; temperature only reshapes what they kept. Ties between equal
 * logits are always broken towards the lower token id. */
#ifndef HN_SAMPLE_H
#define HN_SAMPLE_H

#include <stdint.h>

typedef struct smp_params {
    float temp;              /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off (must be > 0) */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    int32_t penalty_last_n;  /* tokens of history the penalties look at; 0: off (must be >= 0) */
    uint64_t seed;
} smp_params;

typedef struct smp_sampler smp_sampler;

/* Constraint hook: may set logits[i] = -INFINITY for disallowed tokens (and
 * must not otherwise change them); called once per smp_sample before anything
 * else, on the sampler's own copy of the logits. */
typedef void (*smp_mask_fn)(void *ctx, float *logits, int32_t n_vocab);

/* llama.cpp-like defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, no
 * penalties (repeat 1, last_n 64), seed 0. */
smp_params smp_default_params(void);

/* Creates a sampler for a vocabulary of n_vocab tokens; returns NULL if the
 * parameters are invalid (n_vocab < 1, repeat_penalty <= 0, penalty_last_n < 0,
 * NaN values) or memory runs out. */
smp_sampler *smp_new(const smp_params *p, int32_t n_vocab);
/* Returns the next token for logits[0..n_vocab) (not modified), or -1 if no
 * token is allowed (every logit is -inf or NaN after the mask hook). */
int32_t smp_sample(smp_sampler *s, const float *logits);
/* Speculative verification of one drafted token: returns the token to emit
 * at this position from logits (the same chain as smp_sample) and sets
 * *accepted when it is the draft. At temp <= 0 that is the greedy token. At
 * temp > 0, for a deterministic drafter (the draft is a point mass), the
 * standard rejection rule (accept with probability p(draft), else draw from
 * p with the draft removed, renormalised) has the same law as drawing from p
 * and accepting when the draw is the draft, which is what this does: the
 * token follows p exactly, the draft is accepted with probability p(draft),
 * and the PRNG advances as in plain sampling, so a seeded request gives the
 * same tokens with and without speculation. Returns -1 if no token is
 * allowed. (A drafter with a real distribution q would need the general
 * rule, min(1, p/q) and the residual max(0, p - q).) */
int32_t smp_sample_draft(smp_sampler *s, const float *logits, int32_t draft, int *accepted);
/* Records an accepted token in the penalty history (prompt tokens too, if
 * they should be penalised); ids outside [0, n_vocab) are ignored. */
void smp_accept(smp_sampler *s, int32_t token);
/* Clears the history and restarts the PRNG from the seed. */
void smp_reset(smp_sampler *s);
/* Installs (or, with fn NULL, removes) the mask hook; ctx is passed through. */
void smp_set_mask(smp_sampler *s, smp_mask_fn fn, void *ctx);
/* Returns the parameters the sampler was created with. */
const smp_params *smp_get_params(const smp_sampler *s);
/* The penalty window as a sparse list: sets *tokens and *counts to arrays of
 * the distinct tokens among the last penalty_last_n accepted ones and how
 * often each occurs (every count >= 1; the order is unspecified), owned by the
 * sampler and valid until the next smp_accept or smp_reset; returns their
 * number (0 when the window is empty or penalty_last_n is 0). */
int32_t smp_penalty_list(const smp_sampler *s, const int32_t **tokens, const int32_t **counts);
/* Applies stage 2 of the chain for the n listed tokens: a token t = tokens[i]
 * (must be < the row's length) seen c = counts[i] times gets, in float and in
 * this order, l = logit <= 0 ? logit * repeat_penalty : logit / repeat_penalty,
 * then logit = l - (float)c * frequency_penalty - presence_penalty (a device
 * version must keep the order to give the same bits). Nothing when all three
 * penalties are neutral. Each token is treated on its own, so the list's
 * order does not matter. */
void smp_apply_penalties(float *logits, const smp_params *p, const int32_t *tokens, const int32_t *counts, int32_t n);
/* Sets logits[t] = -INFINITY for every t < n_vocab whose bit is clear in
 * allowed ((n_vocab + 31) / 32 words, the format above); leaves the others
 * unchanged. One pass over the row; allocates nothing. */
void smp_apply_allowed(float *logits, const uint32_t *allowed, int32_t n_vocab);
/* Frees the sampler (NULL is fine). */
void smp_free(smp_sampler *s);

#endif
