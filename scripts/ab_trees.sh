#!/bin/sh
# Two (or more) commits' library side by side, for an A/B on one host in one session (the H200 machine's host
# runs the engine's Python 30-50% slower in some sessions than in others: docs/notes/gpu-restore-paths.md).
#   sh scripts/ab_trees.sh REV_A REV_B        -> .ab/<short rev>/ per commit (git archive: kmesh_lib, benchmarks,
#                                                 params, pyproject.toml), .ab/ git-ignored; carry ".ab" to the device
# Then, on the device after the usual install (README "Running on the H200"), the same bench from each, back to back:
#   for t in .ab/*/; do (cd "$t" && PYTHONPATH="$PWD:/tmp/site" timeout 240 python3 benchmarks/bench_gpubuf_restore_parts.py \
#     --profile gpu --out "$OUT/$(basename "$t").json"); done
# Each tree runs its own commit's bench_gpubuf_restore_parts.py, which commits from 459c2aa on have.
set -eu
[ $# -ge 2 ] || { echo "usage: sh scripts/ab_trees.sh REV_A REV_B [REV ...]" >&2; exit 2; }
rm -rf .ab
for rev in "$@"; do
  short=$(git rev-parse --short "$rev")
  git cat-file -e "$rev:benchmarks/bench_gpubuf_restore_parts.py" 2>/dev/null \
    || { echo "$rev ($short) has no benchmarks/bench_gpubuf_restore_parts.py (from 459c2aa on)" >&2; exit 2; }
  mkdir -p ".ab/$short"
  git archive "$rev" kmesh_lib benchmarks params pyproject.toml | tar -x -C ".ab/$short"
done
du -sh .ab/*
