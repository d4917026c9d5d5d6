#!/bin/sh
# Builds libhone and the packed-kernel micro-benchmark, then runs it.
# usage: bench/run_pack.sh [type-name ...]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_pack" \
    bench/bench_pack.c "$BUILD/libhone.a" -lpcre2-8 -lutf8proc -ljansson -lxxhash -lmicrohttpd -lpthread -lm
exec "$BUILD/bench/bench_pack" "$@"
