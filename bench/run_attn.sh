#!/bin/sh
# Builds libhone and the paged-attention micro-benchmark (block size x KV
# type x context), then runs it.
# usage: bench/run_attn.sh [threads]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_attn" \
    bench/bench_attn.c "$BUILD/libhone.a" -lxxhash -lpthread -lm
exec "$BUILD/bench/bench_attn" "$@"
