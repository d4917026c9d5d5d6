#!/bin/sh
# compare_outputs.sh OLD_HONE NEW_HONE [MODELS_DIR]: runs both binaries on every
# GGUF model in MODELS_DIR (default ../shared/data/models) and compares, byte for
# byte, the last-position logits of a 40-token prefill (hone logits) and 24
# greedy tokens decoded one step at a time (hone run --print-ids), untuned, at
# 2 threads. Prints one line per model and ends with "N identical, N differ".
# NEW_ARGS (env) are extra `hone run` options for the new binary only, e.g.
# NEW_ARGS="--kv-type f32" when the new one's default KV type differs.
set -u
old=$1 new=$2 dir=${3:-../shared/data/models}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
same=0 diff=0
toks="1 17 42 99 7 300 12 5 81 64 23 11 900 4 18 2 33 71 150 6 9 28 3 60 45 13 8 200 77 19 5 31 14 88 26 110 40 21 15 10"
for m in "$dir"/*.gguf; do
    name=$(basename "$m")
    ok=1
    for b in old new; do
        bin=$old; [ $b = new ] && bin=$new
        HONE_NO_TUNE=1 "$bin" logits -m "$m" --tokens "$toks" -o "$tmp/$b.f32" -t 2 >/dev/null 2>"$tmp/$b.err" || ok=0
        extra=
        [ $b = new ] && extra=${NEW_ARGS:-}
        # shellcheck disable=SC2086
        HONE_NO_TUNE=1 "$bin" run -m "$m" --tokens "$toks" --print-ids -n 24 --temp 0 --ignore-eos -t 2 $extra >"$tmp/$b.ids" 2>>"$tmp/$b.err" || ok=0
    done
    if [ $ok = 0 ]; then
        if cmp -s "$tmp/old.err" "$tmp/new.err" 2>/dev/null || { grep -q unsupported "$tmp/old.err" && grep -q unsupported "$tmp/new.err"; }; then
            echo "$name: not run by either ($(head -c 120 "$tmp/new.err" | tr '\n' ' '))"
        else
            echo "$name: FAILED: old: $(head -c 200 "$tmp/old.err" | tr '\n' ' ') new: $(head -c 200 "$tmp/new.err" | tr '\n' ' ')"
            diff=$((diff + 1))
        fi
        continue
    fi
    if cmp -s "$tmp/old.f32" "$tmp/new.f32" && cmp -s "$tmp/old.ids" "$tmp/new.ids"; then
        echo "$name: identical (logits and greedy tokens)"
        same=$((same + 1))
    else
        echo "$name: DIFFER (logits $(cmp -s "$tmp/old.f32" "$tmp/new.f32" && echo same || echo differ), tokens $(cmp -s "$tmp/old.ids" "$tmp/new.ids" && echo same || echo differ))"
        diff=$((diff + 1))
    fi
done
echo "$same identical, $diff differ"
[ $diff = 0 ]
