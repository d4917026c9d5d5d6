#!/bin/sh
# Builds libhone and the gemm-kernel micro-benchmark, then runs it.
# usage: bench/run_dot.sh [type-name ...]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_gemm" \
    bench/bench_gemm.c "$BUILD/libhone.a" -lpthread -lm
exec "$BUILD/bench/bench_gemm" "$@"
