#!/usr/bin/env bash
# run_long.sh: long libFuzzer runs of the harnesses that `make fuzz` builds
# (build-fuzz/fuzz/), with a summary table.
#
#   tests/fuzz/run_long.sh [-n RUNS] [-t SECONDS] [-j JOBS] [-d DIR] [-b BIN] [-m] [HARNESS...] [-- FLAGS...]
#
#   -n RUNS     executions per harness, all jobs together (default 10000000
#               unless -t is given); each job runs its share (-runs)
#   -t SECONDS  a wall-time bound per harness (-max_total_time); with -n too,
#               whichever comes first
#   -j JOBS     processes per harness, fuzzing one shared corpus (default 1;
#               0: one per online CPU)
#   -d DIR      work directory, outside the repository: DIR/corpus/<h> (what
#               the runs find; a later run with the same DIR goes on from it),
#               DIR/log/<h>.<job>.log, DIR/artifacts/<h>/ (crash-, leak-,
#               timeout-, oom- inputs), DIR/summary.md (one row per harness
#               run, appended). Default $HONE_FUZZ_DIR, else
#               ${TMPDIR:-/tmp}/hone-fuzz-long
#   -b BIN      the harness binaries' directory (default build-fuzz/fuzz; a
#               copy keeps a long run on its binaries while the tree is rebuilt)
#   -m          afterwards, merge what the runs found into
#               tests/fuzz/corpus/<h> (-merge=1: only inputs that add
#               coverage; not for template, whose finds are large)
#   HARNESS     gguf tokenizer template grammar api_chat api_completions
#               api_responses api_messages; default all, fastest first
#   FLAGS       more libFuzzer flags, after the defaults (a later flag wins)
#
# Each job is a harness process of its own (not libFuzzer's -jobs), reading
# the shared corpus DIR/corpus/<h> (libFuzzer reloads it, so the jobs see
# each other's finds) and the seeds in tests/fuzz/corpus/<h> (template: also
# the shared chat templates, read in place). A job that finds something
# stops there (libFuzzer does), the others go on. Ctrl-C or SIGTERM stops
# every job cleanly: libFuzzer prints its final statistics, the table shows
# what was done, and no harness after it starts.
#
# The table: executions (libFuzzer's number_of_executed_units, summed over
# the jobs, the seed corpus's first pass included), wall time, CPU time of
# the jobs (user + system), executions per CPU second and the CPU hours 10
# million would take at that rate, new corpus inputs (files added to
# DIR/corpus/<h>), and the findings: crash, leak, timeout and out-of-memory
# inputs written (slow-unit- inputs are not findings). Timeouts are wall
# time, so each new timeout input is replayed once and its time printed: a
# job starved by a busy machine can time out on a fast input. The exit status
# is 0 when every run ended without a finding, 1 when one found something, 2
# on a usage error, 130 when stopped.
set -u
# (in braces: bash reads all of it before running any, so that editing the
# file under a long run cannot change what that run does next)
{

usage() {
    sed -n '4,26p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
ALL="api_completions gguf api_chat api_responses api_messages template grammar tokenizer"
runs='' secs='' jobs=1 merge=0 bin=build-fuzz/fuzz
dir=${HONE_FUZZ_DIR:-${TMPDIR:-/tmp}/hone-fuzz-long}
harnesses=()
extra=()
while [ $# -gt 0 ]; do
    case $1 in
    -n) runs=${2:?}; shift 2 ;;
    -t) secs=${2:?}; shift 2 ;;
    -j) jobs=${2:?}; shift 2 ;;
    -d) dir=${2:?}; shift 2 ;;
    -b) bin=${2:?}; shift 2 ;;
    -m) merge=1; shift ;;
    -h | --help) usage ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "run_long.sh: unknown option $1" >&2; usage ;;
    *) harnesses+=("$1"); shift ;;
    esac
done
[ ${#harnesses[@]} -eq 0 ] && read -r -a harnesses <<< "$ALL"
[ -z "$runs" ] && [ -z "$secs" ] && runs=10000000
case $jobs in '' | *[!0-9]*) echo "run_long.sh: -j wants a number" >&2; exit 2 ;; esac
[ "$jobs" -eq 0 ] && jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc)
for v in "$runs" "$secs"; do
    case $v in *[!0-9]*) echo "run_long.sh: -n and -t want numbers" >&2; exit 2 ;; esac
done
for h in "${harnesses[@]}"; do
    case " $ALL " in *" $h "*) ;; *) echo "run_long.sh: no harness $h (one of: $ALL)" >&2; exit 2 ;; esac
    [ -x "$bin/$h" ] || { echo "run_long.sh: $bin/$h missing: make fuzz first" >&2; exit 2; }
done
case $dir in "$root" | "$root"/*) echo "run_long.sh: -d must lie outside the repository" >&2; exit 2 ;; esac
mkdir -p "$dir/corpus" "$dir/log" "$dir/artifacts" || exit 2
dir=$(cd "$dir" && pwd)
shared=${HONE_FUZZ_SHARED:-../shared}

# CPU seconds (user + system) of the children this shell has waited for, in
# $cpu (times runs in this shell: a subshell's children are not these)
cpu_children() {
    times > "$dir/.times"
    cpu=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%.1f", t }' "$dir/.times")
}
now() { date +%s.%N; }
count_files() { find "$1" -maxdepth 1 -type f 2>/dev/null | wc -l; }
count_art() { find "$1" -maxdepth 1 -type f -name "$2-*" 2>/dev/null | wc -l; }
# the number after "key:" in a libFuzzer log (0 if absent)
stat_of() { awk -v k="stat::$2:" '$1 == k { v = $2 } END { print v + 0 }' "$1"; }

stop=0
pids=()
# shellcheck disable=SC2317 # called by the trap
on_signal() {
    stop=1
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done
}
trap on_signal INT TERM

summary=$dir/summary.md
if [ ! -s "$summary" ]; then
    {
        echo "| harness | jobs | executions | wall s | CPU s | exec/CPU s | CPU h per 10M | new inputs | crash | leak | timeout | oom | result |"
        echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    } > "$summary"
fi
rows=()
status=0
for h in "${harnesses[@]}"; do
    [ $stop = 1 ] && break
    corpus=$dir/corpus/$h art=$dir/artifacts/$h
    mkdir -p "$corpus" "$art"
    seeds=("tests/fuzz/corpus/$h")
    [ "$h" = template ] && [ -d "$shared/data/templates/templates" ] && seeds+=("$shared/data/templates/templates")
    limit=()
    [ -n "$runs" ] && limit+=("-runs=$(((runs + jobs - 1) / jobs))")
    [ -n "$secs" ] && limit+=("-max_total_time=$secs")
    n0=$(count_files "$corpus")
    k0=$(count_art "$art" crash) l0=$(count_art "$art" leak) m0=$(count_art "$art" timeout) o0=$(count_art "$art" oom)
    cpu_children
    c0=$cpu
    touch "$dir/.start"
    t0=$(now)
    pids=()
    echo "run_long: $h, $jobs job(s), ${runs:+$runs executions}${runs:+${secs:+ or }}${secs:+$secs s}; logs in $dir/log/$h.*.log" >&2
    for ((i = 0; i < jobs; i++)); do
        log=$dir/log/$h.$i.log
        "$bin/$h" "${limit[@]}" -max_len=65536 -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$art/" "${extra[@]}" "$corpus" "${seeds[@]}" > "$log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        while :; do
            wait "$p"
            rc=$?
            [ $rc -gt 128 ] && kill -0 "$p" 2>/dev/null && continue
            break
        done
    done
    pids=()
    t1=$(now)
    cpu_children
    c1=$cpu
    execs=0 logged=0
    for ((i = 0; i < jobs; i++)); do
        log=$dir/log/$h.$i.log
        e=$(stat_of "$log" number_of_executed_units)
        # no final statistics (killed hard): the last progress line
        [ "$e" = 0 ] && e=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
        execs=$((execs + ${e:-0}))
        grep -qE 'ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:|fuzz finding:|ALARM: working on the last Unit|out-of-memory \(|deadly signal' "$log" && logged=$((logged + 1))
    done
    new=$(($(count_files "$corpus") - n0))
    crash=$(($(count_art "$art" crash) - k0)) leak=$(($(count_art "$art" leak) - l0))
    tmo=$(($(count_art "$art" timeout) - m0)) oom=$(($(count_art "$art" oom) - o0))
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
    cpu=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.0f", b - a }')
    rate=$(awk -v e="$execs" -v c="$cpu" 'BEGIN { printf "%.0f", (c > 0 ? e / c : 0) }')
    proj=$(awk -v r="$rate" 'BEGIN { if (r > 0) printf "%.2f", 1e7 / r / 3600; else printf "-" }')
    found=$((crash + leak + tmo + oom))
    if [ $found -gt 0 ] || [ $logged -gt 0 ]; then
        result="FINDING (see $art)"
        status=1
    elif [ $stop = 1 ]; then
        result=stopped
    else
        result=ok
    fi
    row="| $h | $jobs | $execs | $wall | $cpu | $rate | $proj | $new | $crash | $leak | $tmo | $oom | $result |"
    rows+=("$row")
    echo "$row" >> "$summary"
    echo "$row" >&2
    # a timeout is wall time: a starved job (nice, a busy machine) can hit
    # one with a fast input, so each new one is replayed once and timed
    if [ "$tmo" -gt 0 ]; then
        find "$art" -maxdepth 1 -type f -name 'timeout-*' -newer "$dir/.start" | while read -r f; do
            echo "run_long: $h: $f replays in $("$bin/$h" -timeout=600 "$f" 2>&1 | grep -o '[0-9]* ms' | tail -1)" >&2
        done
    fi
    if [ $merge = 1 ] && [ $stop = 0 ] && [ "$h" != template ] && [ "$new" -gt 0 ]; then
        g0=$(count_files "tests/fuzz/corpus/$h")
        "$bin/$h" -merge=1 -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
            "tests/fuzz/corpus/$h" "$corpus" > "$dir/log/$h.merge.log" 2>&1
        echo "run_long: $h: merged $(($(count_files "tests/fuzz/corpus/$h") - g0)) inputs into tests/fuzz/corpus/$h" >&2
    fi
done

echo "| harness | jobs | executions | wall s | CPU s | exec/CPU s | CPU h per 10M | new inputs | crash | leak | timeout | oom | result |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for r in "${rows[@]}"; do echo "$r"; done
[ $stop = 1 ] && exit 130
exit $status
}
