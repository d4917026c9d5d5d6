#!/bin/sh
# spec.sh: speculative decoding on the trained test model, --spec auto vs off,
# alternating, greedy; checks that both give the same output and prints the
# median decode tokens/s of each and their ratio, per task:
#   repeat       a ~1,000-token passage (spec_data/passage.txt, an excerpt of
#                DESIGN.md frozen so that editing DESIGN.md does not change the task),
#                then "Repeat it." (the form under which this model copies)
#   repeat-half  the same with the passage's first ~480 tokens
#   edit         a source file (spec_data/status.h.txt, a frozen copy of
#                src/core/status.h) and a request to rename one function
#   free         a free-form prose opening, no chat template, where drafts mostly miss:
#                sampled (temperature 0.8, seed 3), since this small model's greedy
#                text falls into loops that drafts catch, and in the chat template it
#                answers a free request in a few dozen tokens; a seeded run gives the
#                same tokens with and without drafts
# For the repeat and edit tasks it also prints how much of the passage or file the
# (greedy) reply reproduces: characters in common runs of 8 or more, over the source's.
# usage: bench/spec.sh [HONE] [MODEL] [THREADS]
# env:   ROUNDS (default 5) alternations; TASKS (default "repeat repeat-half edit free");
#        SPEC (default auto) the mode compared with off; DRAFT a draft model (--draft) for it;
#        BASE (default off) the mode it is compared with (e.g. BASE=auto SPEC=auto DRAFT=x: a drafter's effect)
set -eu
HONE=${1:-./hone}
MODEL=${2:-../shared/data/models/qwen3-agent-q8_0.gguf}
T=${3:-2}
ROUNDS=${ROUNDS:-5}
TASKS=${TASKS:-repeat repeat-half edit free}
SPEC=${SPEC:-auto}
BASE=${BASE:-off}
DRAFT=${DRAFT:-}
DATA=$(dirname "$0")/spec_data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

chat() { # user text -> prompt in the Qwen3 template (ends in "assistant\n")
    printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$1"
}
# the source each task's reply should reproduce, and the prompt
cp "$DATA/passage.txt" "$TMP/src.repeat"
head -c 2000 "$DATA/passage.txt" | sed '$d' > "$TMP/src.repeat-half"
sed 's/\bhn_status_str\b/hn_status_text/' "$DATA/status.h.txt" > "$TMP/src.edit"
for t in repeat repeat-half; do
    chat "$(cat "$TMP/src.$t")

Repeat it." > "$TMP/$t.txt"
done
chat "Here is the file src/core/status.h:

$(cat "$DATA/status.h.txt")

Rename the function hn_status_str to hn_status_text (keep everything else) and write the whole file again." > "$TMP/edit.txt"
printf '%s' "The lighthouse keeper had lived alone on the island for eleven years when" > "$TMP/free.txt"

rate() { # task mode(a|b) n -> tok/s (stderr line of hone run), output in $TMP/out.<task>.<a|b>
    case $1 in free) SAMPLING="--temp 0.8 --seed 3" ;; *) SAMPLING="--temp 0" ;; esac
    if [ "$2" = a ]; then MODE=$BASE; else MODE=$SPEC; fi
    DR=""
    if [ "$2" = b ] && [ -n "$DRAFT" ]; then DR="--draft $DRAFT"; fi
    # the prompt exactly as written: $(cat) alone would drop the newline after "assistant"
    # (the model then starts its reply with ":" and writes looping code)
    P=$(cat "$TMP/$1.txt"; printf .)
    # shellcheck disable=SC2086
    "$HONE" run -m "$MODEL" -t "$T" --no-tune $SAMPLING -n "$3" --spec "$MODE" $DR -p "${P%.}" \
        > "$TMP/out.$1.$2" 2> "$TMP/err.$1.$2"
    sed -n 's/.*generated \([0-9]*\) tokens in .* s (\([0-9.]*\) tok\/s).*/\2 \1/p' "$TMP/err.$1.$2"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
copied() { # source reply -> percent of the source's characters in common runs of >= 8
    python3 -c 'import sys, difflib
a, b = open(sys.argv[1]).read(), open(sys.argv[2]).read()
m = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
print("%.0f%%" % (100.0 * sum(x.size for x in m if x.size >= 8) / max(1, len(a))))' "$1" "$2" 2>/dev/null || echo "?"
}

echo "task        round  $BASE tok/s  $SPEC${DRAFT:+ +draft} tok/s  tokens  same  drafted/accepted"
for task in $TASKS; do
    case $task in repeat|repeat-half|edit) N=1200 ;; *) N=300 ;; esac
    : > "$TMP/r.$task.a"
    : > "$TMP/r.$task.b"
    for r in $(seq 1 "$ROUNDS"); do
        a=$(rate "$task" a "$N")
        b=$(rate "$task" b "$N")
        echo "${a%% *}" >> "$TMP/r.$task.a"
        echo "${b%% *}" >> "$TMP/r.$task.b"
        same=$(cmp -s "$TMP/out.$task.a" "$TMP/out.$task.b" && echo yes || echo NO)
        sp=$(sed -n 's/.*drafted \([0-9]*\) tokens, accepted \([0-9]*\).*/\1\/\2/p' "$TMP/err.$task.b")
        printf '%-11s %5d  %9s  %10s  %6s  %4s  %s\n' "$task" "$r" "${a%% *}" "${b%% *}" "${a#* }" "$same" "${sp:--}"
    done
    mo=$(median < "$TMP/r.$task.a")
    ma=$(median < "$TMP/r.$task.b")
    rep=""
    if [ -f "$TMP/src.$task" ]; then rep=", reply reproduces $(copied "$TMP/src.$task" "$TMP/out.$task.a") of the source"; fi
    echo "$task: median $BASE $mo tok/s, $SPEC${DRAFT:+ +draft} $ma tok/s, ratio $(echo "$ma $mo" | awk '{printf "%.2f", $1 / $2}')$rep"
done
