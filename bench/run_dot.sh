#!/bin/sh
# Builds libhone and the dot-kernel micro-benchmark, then runs it.
# usage: bench/run_dot.sh [type-name ...]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_dot" \
    bench/bench_dot.c "$BUILD/libhone.a" -lpthread -lm
exec "$BUILD/bench/bench_dot" "$@"
