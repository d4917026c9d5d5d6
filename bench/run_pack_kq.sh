#!/bin/sh
# Builds libhone and the packed K-quant micro-benchmark, then runs it (one
# thread): decode GB/s from DRAM at 1 activation row, prefill GMAC/s in cache
# at 8 and 4 rows, each packed kernel beside the unpacked gemm kernel.
# usage: bench/run_pack_kq.sh [q4_K|q5_K|q6_K ...]    (from the project root)
set -e
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/libhone.a"
mkdir -p "$BUILD/bench"
${CC:-cc} -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o "$BUILD/bench/bench_pack_kq" \
    bench/bench_pack_kq.c "$BUILD/libhone.a" -lpthread -lm
exec "$BUILD/bench/bench_pack_kq" "$@"
