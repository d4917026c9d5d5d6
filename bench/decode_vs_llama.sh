#!/bin/sh
# Decode speed of hone against llama.cpp on the same GGUF file, same thread
# count, alternating the two so that machine noise hits both alike.
#
# usage: LLAMA_BENCH=/path/to/llama-bench bench/decode_vs_llama.sh MODEL.gguf [THREADS] [REPS] [N]
# Prints each run's tok/s and the medians and ratio (hone / llama.cpp).
# Both generate N tokens (default 128) after a short prompt, greedy.
set -e
model=$1; threads=${2:-2}; reps=${3:-5}; n=${4:-128}
[ -n "$model" ] && [ -n "$LLAMA_BENCH" ] || { echo "usage: LLAMA_BENCH=llama-bench $0 MODEL [THREADS] [REPS] [N]" >&2; exit 2; }
hone=${HONE_BIN:-./hone}
h=""; l=""
i=0
while [ $i -lt "$reps" ]; do
    a=$("$hone" run -m "$model" --tokens "1 2 3 4" -n "$n" --temp 0 -t "$threads" 2>&1 >/dev/null |
        sed -n 's/.*generated [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p')
    b=$("$LLAMA_BENCH" -m "$model" -t "$threads" -p 0 -n "$n" -r 1 -o csv 2>/dev/null |
        awk -F, 'NR>1 { gsub(/"/, "", $0); print $(NF-1) }' | tail -n 1)
    echo "run $i: hone $a tok/s, llama.cpp $b tok/s"
    h="$h $a"; l="$l $b"
    i=$((i + 1))
done
med() { printf '%s\n' $1 | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mh=$(med "$h"); ml=$(med "$l")
echo "median: hone $mh tok/s, llama.cpp $ml tok/s, ratio $(echo "$mh $ml" | awk '{ printf "%.2f", $1 / $2 }')"
