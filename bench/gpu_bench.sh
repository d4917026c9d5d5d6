#!/bin/bash
# bench/gpu_bench.sh: hone on a GPU on the Qwen3-8B shape of llama.cpp's reference table
# (../shared/reference/h200-llamacpp.md): makes the f16 random-weight model with mkgguf.py,
# quantizes it to Q4_K_M and Q8_0 with hone, and runs `hone bench` (pp2048, tg128, tg at 32K).
#
#   bench/gpu_bench.sh [HONE] [MKGGUF.py] [VOCAB.gguf] [WORKDIR] [N_LAYER]
#
# Defaults: ./hone, ../shared/tools/mkgguf.py, ../shared/data/vocab/ggml-vocab-qwen3-npm.gguf,
# a temporary folder, all 36 layers (N_LAYER=8 makes the 8-layer cut of bench/README.md).
# Needs python3 with numpy and about 15 GB of disk; the generation takes ~3 minutes.
# GEN_MOE=path/to/gen_moe.py (PyTorch with a GPU) writes the model as Q8_0 on the GPU instead
# (seconds; seed 9 rather than mkgguf's 7), and Q4_K_M is quantized from that Q8_0.
set -euo pipefail
HONE=${1:-./hone}
MK=${2:-../shared/tools/mkgguf.py}
VOCAB=${3:-../shared/data/vocab/ggml-vocab-qwen3-npm.gguf}
W=${4:-$(mktemp -d)}
NL=${5:-}
mkdir -p "$W"
SRC="$W/f16.gguf"
if [ -n "${GEN_MOE:-}" ]; then
  [ -z "$NL" ] || { echo "gpu_bench.sh: GEN_MOE makes all the layers (no N_LAYER)" >&2; exit 2; }
  SRC="$W/Q8_0.gguf"
  [ -f "$SRC" ] || python3 "$GEN_MOE" "$SRC" qwen3-8b "$VOCAB"
elif [ ! -f "$SRC" ]; then
  python3 "$MK" model --preset qwen3-8b --seed 7 --vocab-gguf "$VOCAB" --dtype f16 ${NL:+--n-layer $NL} -o "$SRC"
fi
for t in Q4_K_M Q8_0; do
  [ -f "$W/$t.gguf" ] || "$HONE" quantize "$SRC" "$W/$t.gguf" $t | tail -1
  "$HONE" bench -m "$W/$t.gguf" -p 2048 -n 128 -r 3 --device cuda
  [ $t = Q4_K_M ] && "$HONE" bench -m "$W/$t.gguf" -p 0 -n 32 -r 1 -d 32768 --device cuda | grep tg
done
echo "models in $W"
