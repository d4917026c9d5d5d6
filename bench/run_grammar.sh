#!/bin/sh
# Builds libhone and the constrained-decoding benchmark, then runs it.
# usage: bench/run_grammar.sh [vocab.gguf] [tokens]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_grammar" \
    bench/bench_grammar.c "$BUILD/libhone.a" -lpcre2-8 -lutf8proc -ljansson -lxxhash -lpthread -lm
exec "$BUILD/bench/bench_grammar" "$@"
