#!/bin/bash
# bench/cpu_scale.sh: hone vs llama.cpp on the CPU at several thread counts, on the
# Qwen3-0.6B shape in Q4_K_M, Q8_0 and Q4_0 (the models of bench/README.md "Results").
#
# Makes the random-weight f16 model with mkgguf.py (skipped when DIR already has it),
# quantizes it with `hone quantize`, then per model and thread count tunes hone
# (`hone tune -m FILE --force -t N`) and runs bench/vs_llama.sh (pp512 and tg128,
# the two programs alternating). Progress and each round go to stderr; the summary
# table (markdown) goes to stdout and to DIR/summary.md.
#
#   HONE=path/to/hone LLAMA_BENCH=path/to/llama-bench MKGGUF=path/to/mkgguf.py \
#   VOCAB=path/to/ggml-vocab-qwen3-npm.gguf DIR=workdir bench/cpu_scale.sh
#
# env (required): HONE         the hone binary
#                 LLAMA_BENCH  the llama-bench binary (or a wrapper that runs it)
#                 DIR          work folder: models, logs, tuning cache (~3.5 GB for 0.6B)
#                 MKGGUF, VOCAB  mkgguf.py and the vocab GGUF it copies the tokenizer from;
#                              only needed while DIR lacks the f16 model and a quantized one
#                              (models made elsewhere can be copied into DIR: NAME-f16.gguf,
#                              NAME-q4_k_m.gguf, ... with NAME the preset, e.g. qwen3-0.6b)
# env (optional): THREADS  (default "8 16")   thread counts
#                 ROUNDS   (default 3)  alternations of the two programs (vs_llama.sh)
#                 REPS     (default 3)  repetitions inside each program run
#                 PP (512), TG (128), DEPTH (0: no decode-at-depth test)
#                 TYPES    (default "Q4_K_M Q8_0 Q4_0")
#                 PRESET   (default qwen3-0.6b) mkgguf preset; N_LAYER cuts its layers
#                 SEED     (default 7)
#                 PYTHON   python3 with numpy (default: the first of python3,
#                          /usr/bin/python3 that imports numpy)
#                 TUNE     (default 1; 0 skips `hone tune`: hone then uses whatever the
#                          cache has, or tunes itself on first load)
#                 HONE_CACHE_DIR (default DIR/hone-cache) where hone keeps tuning results
set -eu -o pipefail

die() { echo "cpu_scale.sh: $*" >&2; exit 1; }
say() { echo "cpu_scale.sh: $*" >&2; }

HERE=$(cd "$(dirname "$0")" && pwd)
VS="$HERE/vs_llama.sh"
[ -f "$VS" ] || die "vs_llama.sh not found beside this script ($VS)"

: "${HONE:?set HONE to the hone binary}"
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}"
: "${DIR:?set DIR to a work folder}"
THREADS=${THREADS:-8 16}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-0}
TYPES=${TYPES:-Q4_K_M Q8_0 Q4_0}
PRESET=${PRESET:-qwen3-0.6b}
N_LAYER=${N_LAYER:-}
SEED=${SEED:-7}
TUNE=${TUNE:-1}

case "$HONE" in *[[:space:]]*) die "HONE must be a path without spaces (vs_llama.sh splits it into words)";; esac
[ -x "$HONE" ] || die "HONE=$HONE is not an executable file"
[ -x "$LLAMA_BENCH" ] || die "LLAMA_BENCH=$LLAMA_BENCH is not an executable file"
for t in $THREADS; do
    case "$t" in '' | *[!0-9]* | 0) die "THREADS must be positive integers, got '$t'";; esac
done
for v in ROUNDS REPS PP TG DEPTH; do
    case "${!v}" in '' | *[!0-9]*) die "$v must be a non-negative integer, got '${!v}'";; esac
done

mkdir -p "$DIR/logs" || die "cannot create $DIR"
DIR=$(cd "$DIR" && pwd)
export HONE_CACHE_DIR=${HONE_CACHE_DIR:-$DIR/hone-cache}
mkdir -p "$HONE_CACHE_DIR"
LOG="$DIR/logs"
NAME=$PRESET${N_LAYER:+-l$N_LAYER}
F16="$DIR/$NAME-f16.gguf"

# hone must run at all (missing shared libraries show here, not halfway through)
"$HONE" quantize --help > "$LOG/hone-help.txt" 2>&1 ||
    die "$HONE does not run: $(head -3 "$LOG/hone-help.txt")"

qfile() { echo "$DIR/$NAME-$(echo "$1" | tr 'A-Z' 'a-z').gguf"; }
need_f16=0
for q in $TYPES; do [ -s "$(qfile "$q")" ] || need_f16=1; done

# 1. the f16 model (only while a quantized file is missing)
if [ "$need_f16" = 1 ] && [ ! -s "$F16" ]; then
    : "${MKGGUF:?DIR has no $NAME-f16.gguf: set MKGGUF to mkgguf.py to make it}"
    : "${VOCAB:?set VOCAB to the vocab GGUF for mkgguf.py (ggml-vocab-qwen3-npm.gguf)}"
    [ -f "$MKGGUF" ] || die "MKGGUF=$MKGGUF not found"
    [ -f "$VOCAB" ] || die "VOCAB=$VOCAB not found"
    if [ -z "${PYTHON:-}" ]; then
        for p in python3 /usr/bin/python3; do
            if command -v "$p" > /dev/null 2>&1 && "$p" -c 'import numpy' > /dev/null 2>&1; then PYTHON=$p; break; fi
        done
        [ -n "${PYTHON:-}" ] || die "no python3 with numpy found: set PYTHON (mkgguf.py needs numpy)"
    else
        "$PYTHON" -c 'import numpy' > /dev/null 2>&1 || die "PYTHON=$PYTHON cannot import numpy"
    fi
    say "making $F16 ($PRESET${N_LAYER:+, $N_LAYER layers}, f16) with $PYTHON"
    t0=$(date +%s)
    "$PYTHON" "$MKGGUF" model --preset "$PRESET" --seed "$SEED" --vocab-gguf "$VOCAB" --dtype f16 \
        ${N_LAYER:+--n-layer "$N_LAYER"} -o "$F16.tmp" > "$LOG/mkgguf.log" 2>&1 ||
        { rm -f "$F16.tmp"; die "mkgguf.py failed; see $LOG/mkgguf.log: $(tail -3 "$LOG/mkgguf.log")"; }
    mv "$F16.tmp" "$F16"
    say "made $F16 in $(( $(date +%s) - t0 )) s"
fi

# 2. the quantized models
MODELS=()
for q in $TYPES; do
    m=$(qfile "$q")
    if [ ! -s "$m" ]; then
        say "quantizing to $q"
        t0=$(date +%s)
        "$HONE" quantize "$F16" "$m.tmp" "$q" > "$LOG/quantize-$q.log" 2>&1 ||
            { rm -f "$m.tmp"; die "hone quantize $q failed; see $LOG/quantize-$q.log: $(tail -3 "$LOG/quantize-$q.log")"; }
        mv "$m.tmp" "$m"
        say "made $m in $(( $(date +%s) - t0 )) s"
    fi
    MODELS+=("$q=$m")
done

# 3. llama-bench must load a model and find a CPU backend (its backend .so files)
first=${MODELS[0]#*=}
"$LLAMA_BENCH" -m "$first" -p 8 -n 0 -r 1 -t 1 -o csv > "$LOG/llama-check.csv" 2> "$LOG/llama-check.err" ||
    die "llama-bench failed on $first; see $LOG/llama-check.err: $(tail -3 "$LOG/llama-check.err")"
grep -q 'CPU' "$LOG/llama-check.csv" ||
    die "llama-bench ran without reporting the CPU backend (are the ggml-cpu-*.so beside it?); see $LOG/llama-check.*"
LLAMA_BUILD=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); c[$i] = i }; next }
    { gsub(/"/, ""); print $c["build_commit"] " (" $c["build_number"] "), " $c["cpu_info"]; exit }' "$LOG/llama-check.csv")

# 4. tune and run, per model and thread count
RES="$DIR/results.txt"
: > "$RES"
for entry in "${MODELS[@]}"; do
    q=${entry%%=*}
    m=${entry#*=}
    for t in $THREADS; do
        if [ "$TUNE" != 0 ]; then
            say "$q, $t threads: hone tune (load average $(cut -d' ' -f1 /proc/loadavg))"
            "$HONE" tune -m "$m" --force -t "$t" > "$LOG/tune-$q-t$t.log" 2>&1 ||
                die "hone tune failed; see $LOG/tune-$q-t$t.log: $(tail -3 "$LOG/tune-$q-t$t.log")"
        fi
        say "$q, $t threads: vs_llama.sh, $ROUNDS rounds x $REPS reps (load average $(cut -d' ' -f1 /proc/loadavg))"
        out="$LOG/vs-$q-t$t.md"
        HONE="$HONE bench" LLAMA_BENCH="$LLAMA_BENCH" ROUNDS=$ROUNDS REPS=$REPS PP=$PP TG=$TG DEPTH=$DEPTH \
            "$VS" "$m" "$t" > "$out" 2> >(tee "$LOG/vs-$q-t$t.rounds" >&2) ||
            die "vs_llama.sh failed for $q at $t threads; see $out and $LOG/vs-$q-t$t.rounds"
        # rows "| pp512@0 | h | l | r |" -> "q t test h l r"
        n=$(awk -F'|' -v q="$q" -v t="$t" '$2 ~ /@/ {
                gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5);
                sub(/@0$/, "", $2); print q, t, $2, $3, $4, $5; n++ } END { print n + 0 > "/dev/stderr" }' \
            "$out" 2>&1 >> "$RES")
        [ "$n" -gt 0 ] || die "no results from vs_llama.sh for $q at $t threads; see $out"
        if awk -v q="$q" -v t="$t" '$1 == q && $2 == t && ($4 + 0 <= 0 || $5 + 0 <= 0) { bad = 1 } END { exit !bad }' "$RES"; then
            die "a zero or missing speed for $q at $t threads (a program failed inside vs_llama.sh?); see $out and $LOG/vs-$q-t$t.rounds"
        fi
    done
done

# 5. summary
{
    echo "## hone vs llama.cpp, CPU, threads: $THREADS"
    echo
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs usable" \
        "($(grep -c ^processor /proc/cpuinfo) online); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "llama.cpp: $LLAMA_BUILD. Model: $NAME (mkgguf seed $SEED). vs_llama.sh: $ROUNDS rounds x $REPS reps," \
        "medians; hone tuned per model and thread count: $([ "$TUNE" != 0 ] && echo yes || echo no)."
    echo
    echo "| model | threads | test | hone t/s | llama.cpp t/s | hone / llama |"
    echo "| --- | ---: | --- | ---: | ---: | ---: |"
    awk '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }' "$RES"
} | tee "$DIR/summary.md"
