#!/bin/sh
# The agent workload over HTTP against `hone serve` and llama.cpp's llama-server
# on the same GGUF file and thread count: S sessions at once sharing a system
# prompt, T turns each resending the whole conversation (../shared/tools/agent_workload.py).
#
# usage: LLAMA_SERVER=/path/to/llama-server bench/serve_vs_llama.sh MODEL.gguf [THREADS] [S] [T] [SYSTEM_WORDS]
# Prints each server's last line: requests ok, cache share of later turns' prompts, total time.
# llama-server runs with the plain ChatML template (no tool-call parser), because
# with random weights its output parser answers HTTP 500 on much of the output.
set -e
model=$1; threads=${2:-2}; s=${3:-4}; t=${4:-4}; w=${5:-1000}
[ -n "$model" ] && [ -n "$LLAMA_SERVER" ] || { echo "usage: LLAMA_SERVER=llama-server $0 MODEL [THREADS] [S] [T] [WORDS]" >&2; exit 2; }
hone=${HONE_BIN:-./hone}
workload=${AGENT_WORKLOAD:-../shared/tools/agent_workload.py}
wait_up() { i=0; while [ $i -lt 120 ]; do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 1; i=$((i + 1)); done; return 1; }

"$hone" serve -m "$model" --port 18480 -t "$threads" --ctx 16384 2>/dev/null & pid=$!
wait_up 18480
printf 'hone serve:   '; python3 "$workload" 18480 "$s" "$t" "$w" | tail -n 1 || true
kill $pid; wait $pid 2>/dev/null || true

"$LLAMA_SERVER" -m "$model" --port 18481 -t "$threads" -c $((16384 * s)) -np "$s" --no-jinja --chat-template chatml >/dev/null 2>&1 & pid=$!
wait_up 18481
printf 'llama-server: '; python3 "$workload" 18481 "$s" "$t" "$w" | tail -n 1 || true
kill $pid; wait $pid 2>/dev/null || true
