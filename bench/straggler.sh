#!/bin/sh
# straggler.sh MODEL HONE [HONE ...]: a slow core simulated on a machine
# without P and E cores. Each hone binary runs `hone bench` (untuned defaults,
# HONE_NO_TUNE=1) pinned by taskset to CPUs $CPUS, alone ("idle") and with a
# busy process pinned to the last of them ("busy": that core gives hone about
# half its time, like a core of half the speed, only in time slices), and with
# one thread fewer on the other CPUs beside the busy one ("skip": leaving the
# slow core out). Rounds alternate the binaries; prints the median t/s of each.
#   CPUS=2,3 ROUNDS=3 PP=256 TG=64 bench/straggler.sh model.gguf ./hone-before ./hone
set -e
model=$1
shift
cpus=${CPUS:-0,1}
rounds=${ROUNDS:-3}
pp=${PP:-256}
tg=${TG:-64}
last=${cpus##*,}
rest=${cpus%,*}
n=$(echo "$cpus" | tr ',' '\n' | wc -l)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
busy_start() { taskset -c "$last" sh -c 'while :; do :; done' & busy=$!; sleep 0.2; }
busy_stop() { kill "$busy"; wait "$busy" 2>/dev/null || true; }
bench() { # tag hone cpus threads
    HONE_NO_TUNE=1 taskset -c "$3" "$2" bench -m "$model" -p "$pp" -n "$tg" -t "$4" -r 3 2>/dev/null |
        awk -F'|' -v tag="$1" '$5 ~ /pp|tg/ { gsub(/ /, "", $5); gsub(/ /, "", $6); print tag, $5, $6 }' >>"$tmp/all"
}
for r in $(seq "$rounds"); do
    i=0
    for h in "$@"; do
        i=$((i + 1))
        bench "$i idle" "$h" "$cpus" "$n"
        busy_start
        bench "$i busy" "$h" "$cpus" "$n"
        bench "$i skip" "$h" "$rest" $((n - 1))
        busy_stop
    done
done
i=0
for h in "$@"; do
    i=$((i + 1))
    for mode in idle busy skip; do
        for t in pp$pp tg$tg; do
            grep "^$i $mode $t " "$tmp/all" | awk '{print $4}' | sort -g |
                awk -v h="$h" -v m="$mode" -v t="$t" '{v[NR]=$1} END {
                    med = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2
                    printf "%s %s %s median %.1f t/s over %d rounds:", h, m, t, med, NR
                    for (j = 1; j <= NR; j++) printf " %.1f", v[j]; printf "\n" }'
        done
    done
done
