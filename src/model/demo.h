/* demo.h: the demo model hone makes itself.
 *
 * `hone run` with no model file runs this: a small, complete qwen3 GGUF with
 * seeded random weights (so its output is meaningless but reproducible) and a
 * real byte-level BPE tokenizer (256 byte symbols, a few hundred merges learned
 * from a short embedded English text, Qwen-style special tokens and a ChatML
 * chat template). Shape: 4 layers, width 256, 4 heads / 2 KV heads of 64,
 * feed-forward 768, context 4096, tied output embedding, F32 weights. The bytes
 * written are the same on every run and every machine. */
#ifndef HN_MODEL_DEMO_H
#define HN_MODEL_DEMO_H

#include "../core/status.h"

#define DEMO_N_LAYER 4
#define DEMO_N_EMBD 256
#define DEMO_N_HEAD 4
#define DEMO_N_HEAD_KV 2
#define DEMO_HEAD_DIM 64
#define DEMO_N_FF 768
#define DEMO_N_CTX 4096
#define DEMO_MAX_MERGES 480 /* merge learning stops earlier if no pair repeats */

/* Writes the demo model to path (atomically: a temporary file, then rename). */
hn_status demo_model_write(const char *path, hn_err *err);

#endif
