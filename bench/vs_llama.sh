#!/bin/sh
# vs_llama.sh: hone vs llama.cpp on the same GGUF and thread count, side by side.
#
# usage: LLAMA_BENCH=/path/to/llama-bench bench/vs_llama.sh MODEL.gguf [THREADS]
# env:   ROUNDS (default 3)  alternations of the two programs
#        REPS   (default 3)  repetitions inside each program run (its median)
#        PP     (default 512) prompt tokens; TG (default 128) generated tokens
#        DEPTH  (default 16384; 0 skips) context depth for the decode-at-depth test
#        DEPTH_TG (default 32) tokens generated at depth
#        HONE   (default "./hone bench") the hone benchmark command
# The two programs run alternately (hone, llama, hone, llama, ...) so that a
# machine whose load changes affects both alike. Prints each round, then the
# median over rounds of each program's medians and the ratio hone / llama.
# Run it from the project root after `make`.
set -eu
MODEL=${1:?usage: LLAMA_BENCH=... bench/vs_llama.sh MODEL.gguf [THREADS]}
T=${2:-$(nproc)}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-16384}
DEPTH_TG=${DEPTH_TG:-32}
HONE=${HONE:-./hone bench}
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# hone: `test,depth,threads,median,min,max` lines -> "name tok/s"
run_hone() { # p n depth
    $HONE -m "$MODEL" -t "$T" -r "$REPS" -p "$1" -n "$2" --depth "$3" --csv | awk -F, '{print $1 "@" $2, $4}'
}
# llama-bench csv: n_prompt, n_gen, n_depth, avg_ts columns -> "name tok/s"
run_llama() { # p n depth
    "$LLAMA_BENCH" -m "$MODEL" -t "$T" -r "$REPS" -p "$1" -n "$2" -d "$3" -o csv 2>/dev/null | awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); c[$i] = i }; next }
        { gsub(/"/, ""); p = $c["n_prompt"]; g = $c["n_gen"]; d = $c["n_depth"];
          print (p > 0 ? "pp" p : "tg" g) "@" d, $c["avg_ts"] }'
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    : > "$TMP/hone.r"
    : > "$TMP/llama.r"
    if [ "$PP" -gt 0 ] || [ "$TG" -gt 0 ]; then
        run_hone "$PP" "$TG" 0 >> "$TMP/hone.r"
        run_llama "$PP" "$TG" 0 >> "$TMP/llama.r"
    fi
    if [ "$DEPTH" -gt 0 ]; then
        run_hone 0 "$DEPTH_TG" "$DEPTH" >> "$TMP/hone.r"
        run_llama 0 "$DEPTH_TG" "$DEPTH" >> "$TMP/llama.r"
    fi
    echo "round $r:" $(tr '\n' ' ' < "$TMP/hone.r") "| llama:" $(tr '\n' ' ' < "$TMP/llama.r") >&2
    cat "$TMP/hone.r" >> "$TMP/hone"
    cat "$TMP/llama.r" >> "$TMP/llama"
    r=$((r + 1))
done

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo
echo "model: $(basename "$MODEL"), threads: $T, rounds: $ROUNDS x $REPS reps"
echo
echo "| test | hone t/s | llama.cpp t/s | hone / llama |"
echo "| --- | ---: | ---: | ---: |"
for name in $(awk '{print $1}' "$TMP/hone" | sort -u); do
    h=$(awk -v n="$name" '$1 == n {print $2}' "$TMP/hone" | median)
    l=$(awk -v n="$name" '$1 == n {print $2}' "$TMP/llama" | median)
    awk -v n="$name" -v h="$h" -v l="$l" 'BEGIN {printf "| %s | %.2f | %.2f | %.2fx |\n", n, h, l, (l > 0 ? h / l : 0)}'
done
