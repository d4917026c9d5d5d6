#!/bin/sh
# ab_hone.sh: two hone binaries (before and after a change) on the same GGUF
# and thread count, alternating, untuned (--no-tune: the built-in kernel
# choices, so that only the change differs).
#
# usage: bench/ab_hone.sh OLD_HONE NEW_HONE MODEL.gguf [THREADS]
# env:   ROUNDS (default 3) alternations; REPS (default 3) repetitions inside each run
#        PP (512) prompt tokens; TG (128) generated tokens
#        DEPTH (4096; 0 skips) context depth of the decode-at-depth test; DEPTH_TG (32)
# Prints each round, then per test the median over rounds of each binary's
# medians and the ratio new / old.
set -eu
OLD=${1:?usage: bench/ab_hone.sh OLD NEW MODEL [THREADS]}
NEW=${2:?}
MODEL=${3:?}
T=${4:-2}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-4096}
DEPTH_TG=${DEPTH_TG:-32}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

run() { # bin p n depth -> "name tok/s"
    "$1" bench -m "$MODEL" -t "$T" -r "$REPS" -p "$2" -n "$3" --depth "$4" --csv --no-tune 2>/dev/null |
        awk -F, '{print $1 "@" $2, $4}'
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    for b in old new; do
        bin=$OLD
        [ $b = new ] && bin=$NEW
        run "$bin" "$PP" "$TG" 0 >>"$TMP/$b"
        [ "$DEPTH" -gt 0 ] && run "$bin" 0 "$DEPTH_TG" "$DEPTH" >>"$TMP/$b"
    done
    k=2
    [ "$DEPTH" -gt 0 ] && k=3
    echo "round $r: old $(tail -n $k "$TMP/old" | tr '\n' ' ') | new $(tail -n $k "$TMP/new" | tr '\n' ' ')"
    r=$((r + 1))
done

med() { # test file
    grep "^$1 " "$2" | awk '{print $2}' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
echo "| test | old t/s | new t/s | new/old |"
echo "| --- | --- | --- | --- |"
for t in $(awk '{print $1}' "$TMP/old" | sort -u); do
    o=$(med "$t" "$TMP/old")
    n=$(med "$t" "$TMP/new")
    echo "| $t | $o | $n | $(awk -v a="$n" -v b="$o" 'BEGIN {printf "%.3f", a / b}') |"
done
