#!/bin/sh
# spec.sh: speculative decoding on the trained test model, --spec auto vs off,
# alternating, greedy; checks that both give the same output and prints the
# median decode tokens/s of each and their ratio, per task:
#   repeat  a ~1,100-token passage (DESIGN.md's engine prose), then "repeat it"
#   edit    a source file (src/spec/suffix.h) and a request to change one function
#   free    a free-form story, where drafts mostly miss: sampled (temperature 0.8,
#           seed 3), since this small model's greedy prose falls into loops that
#           drafts catch; a seeded run gives the same tokens with and without drafts
# usage: bench/spec.sh [HONE] [MODEL] [THREADS]
# env:   ROUNDS (default 5) alternations; TASKS (default "repeat edit free");
#        SPEC (default auto) the mode compared with off; DRAFT a draft model (--draft) for it;
#        BASE (default off) the mode it is compared with (e.g. BASE=auto SPEC=auto DRAFT=x: a drafter's effect)
set -eu
HONE=${1:-./hone}
MODEL=${2:-../shared/data/models/qwen3-agent-q8_0.gguf}
T=${3:-2}
ROUNDS=${ROUNDS:-5}
TASKS=${TASKS:-repeat edit free}
SPEC=${SPEC:-auto}
BASE=${BASE:-off}
DRAFT=${DRAFT:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

chat() { # user text -> prompt in the Qwen3 template
    printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$1"
}
passage=$(sed -n '/^- \*\*Threads.\*\* `eng_submit`/,$p' DESIGN.md | head -c 4400)
chat "Repeat the following text exactly:

$passage" > "$TMP/repeat.txt"
chat "Here is the file src/spec/suffix.h:

$(cat src/spec/suffix.h)

Rename the function sfx_propose to sfx_draft (keep everything else) and write the whole file again." > "$TMP/edit.txt"
chat "Write a long story about a lighthouse keeper who finds a message in a bottle." > "$TMP/free.txt"

rate() { # task mode(a|b) n -> tok/s (stderr line of hone run), output in $TMP/out.<task>.<a|b>
    case $1 in free) SAMPLING="--temp 0.8 --seed 3" ;; *) SAMPLING="--temp 0" ;; esac
    if [ "$2" = a ]; then MODE=$BASE; else MODE=$SPEC; fi
    DR=""
    if [ "$2" = b ] && [ -n "$DRAFT" ]; then DR="--draft $DRAFT"; fi
    # shellcheck disable=SC2086
    "$HONE" run -m "$MODEL" -t "$T" --no-tune $SAMPLING -n "$3" --spec "$MODE" $DR -p "$(cat "$TMP/$1.txt")" \
        > "$TMP/out.$1.$2" 2> "$TMP/err.$1.$2"
    sed -n 's/.*generated \([0-9]*\) tokens in .* s (\([0-9.]*\) tok\/s).*/\2 \1/p' "$TMP/err.$1.$2"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "task    round  $BASE tok/s  $SPEC${DRAFT:+ +draft} tok/s  tokens  same  drafted/accepted"
for task in $TASKS; do
    case $task in repeat) N=1200 ;; edit) N=1200 ;; *) N=300 ;; esac
    : > "$TMP/r.$task.a"
    : > "$TMP/r.$task.b"
    for r in $(seq 1 "$ROUNDS"); do
        a=$(rate "$task" a "$N")
        b=$(rate "$task" b "$N")
        echo "${a%% *}" >> "$TMP/r.$task.a"
        echo "${b%% *}" >> "$TMP/r.$task.b"
        same=$(cmp -s "$TMP/out.$task.a" "$TMP/out.$task.b" && echo yes || echo NO)
        sp=$(sed -n 's/.*drafted \([0-9]*\) tokens, accepted \([0-9]*\).*/\1\/\2/p' "$TMP/err.$task.b")
        printf '%-7s %5d  %9s  %10s  %6s  %4s  %s\n' "$task" "$r" "${a%% *}" "${b%% *}" "${a#* }" "$same" "${sp:--}"
    done
    mo=$(median < "$TMP/r.$task.a")
    ma=$(median < "$TMP/r.$task.b")
    echo "$task: median $BASE $mo tok/s, $SPEC${DRAFT:+ +draft} $ma tok/s, ratio $(echo "$ma $mo" | awk '{printf "%.2f", $1 / $2}')"
done
