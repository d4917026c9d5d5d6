#!/bin/sh
# Runs every test binary in a build directory, each in its own process with a
# timeout, and prints the total as "N passed, N failed".
# usage: scripts/run_tests.sh BUILD_DIR
dir=${1:-build}
# Tests never touch the user's cache: a fresh cache directory for the run
# (tuner results, probe bandwidth, the demo model), removed at the end. Model
# loads keep the built-in kernel parameters (HONE_NO_TUNE=1) so outputs do not
# depend on what a tuning run picked; the tuner's own tests turn it back on.
HONE_CACHE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hone-test-cache-XXXXXX") || exit 1
XDG_CACHE_HOME=$HONE_CACHE_DIR
HONE_TEST_TMP=$HONE_CACHE_DIR   # files the tests write (test.h's test_tmp_path)
HONE_NO_TUNE=1
export HONE_CACHE_DIR XDG_CACHE_HOME HONE_TEST_TMP HONE_NO_TUNE
trap 'rm -rf "$HONE_CACHE_DIR"' EXIT
total_p=0; total_f=0; bad=""
for t in "$dir"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$(timeout "${HONE_TEST_TIMEOUT:-900}" "$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    p=$(printf '%s' "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); p=${p:-0}
    f=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p'); f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crash, timeout, sanitizer report
    if [ "$f" -ne 0 ]; then
        bad="$bad $name"
        printf '%s\n' "$out" | grep -v '^ok ' | tail -n 40
    fi
    printf '%-28s %s (rc=%d)\n' "$name" "${line:-no result line}" "$rc"
    total_p=$((total_p + p)); total_f=$((total_f + f))
done
[ -n "$bad" ] && echo "failing:$bad"
echo "$total_p passed, $total_f failed"
[ "$total_f" -eq 0 ]
