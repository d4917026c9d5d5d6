#!/bin/sh
# Builds libhone and the gemm-kernel micro-benchmark, then runs it: every gemm
# variant against the dot kernel, 1 and 8 activation rows, weights from DRAM
# and from cache (q4_0 q8_0 q4_K q6_K q5_K iq4_xs f16 bf16 by default).
# usage: bench/run_gemm.sh [type-name ...]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_gemm" \
    bench/bench_gemm.c "$BUILD/libhone.a" -lpthread -lm
exec "$BUILD/bench/bench_gemm" "$@"
