#!/bin/sh
# The agent workload through the engine, with the prefix cache and without:
# `hone bench agents` at its defaults (see `hone bench agents --help`), then
# the same with --no-prefix-cache. Extra arguments go to both runs.
# usage: bench/agents.sh MODEL.gguf [hone bench agents options]   (from the project root)
set -e
if [ $# -lt 1 ]; then
    echo "usage: $0 MODEL.gguf [options]" >&2
    exit 2
fi
MODEL=$1
shift
HONE=${HONE_BIN:-./hone}
[ -x "$HONE" ] || make -s -j2 hone
echo "== prefix cache on"
"$HONE" bench agents -m "$MODEL" "$@"
echo "== prefix cache off"
"$HONE" bench agents -m "$MODEL" --no-prefix-cache "$@"
