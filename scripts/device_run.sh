#!/bin/sh
# Runs kmesh sections on the lent H200 machine (vLLM 0.26.0 + LMCache 0.5.3 from ../shared/device),
# after `sh .device-stage/call2/install.sh && . /tmp/site/env.sh`. The notebook stack (papermill,
# ipykernel, nbconvert) travels as py3.12 wheels in .whl/ (scripts/fetch_device_wheels.sh).
#   sh scripts/device_run.sh SECTION[:PROFILE] ...      results: $OUT/<section>-<profile>.tgz
#   sh scripts/device_run.sh 21/mp05 21/mp7            two runs of one section in one call, each named: its
#     overrides in KMESH_SET_<name> (KMESH_SET_mp05="MODELS=[qwen2.5-0.5b] ..."), results $OUT/21-gpu-mp05.tgz
#   KMESH_GPU_TESTS=1 sh scripts/device_run.sh 21      the CUDA tests first ($OUT/gpu-tests.txt), then 21
# ../shared does not travel: copy what a section reads into a carried, git-excluded folder and point
# the section at it, e.g. for 19: cp ../shared/data/game24/24.csv .device-data/game24/ and
#   KMESH_SET_19="PUZZLES_CSV=.device-data/game24/24.csv" (carry .device-data). The suffix is the
# section exactly as given on the command line (or the item's /name); a KMESH_SET_* matching none is an error.
set -u
# a named item's name is a shell variable's suffix (KMESH_SET_<name>, read with eval below): letters, digits and _
# only; "21/mp-05" read ${KMESH_SET_mp-05:-} as ${KMESH_SET_mp-...}, the override "05:-", and a quote or $( ran
for item in "$@"; do
  case "$item" in */*) case "${item#*/}" in ""|*[!A-Za-z0-9_]*)
    echo "item $item: a name after / is letters, digits and _ only (it names KMESH_SET_<name>)" >&2; exit 2;; esac;; esac
done
for var in $(env | sed -n 's/^KMESH_SET_\([A-Za-z0-9_]*\)=.*/\1/p'); do
  case " $* " in *" $var "*|*" $var:"*|*"/$var "*) ;; *) echo "KMESH_SET_$var matches no section given ($*)" >&2; exit 2;; esac
done
# every run records the commit it measured (kmesh_lib.base.provenance): the device's copy of the tree has no .git, so it
# carries .kmesh-tree.json (python scripts/tree_manifest.py where the copy is made; carry it), and each run hashes its
# files against it: the commit is recorded only when they match, and dirty is measured
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1 && [ ! -f .kmesh-tree.json ]; then
  echo "no .git and no .kmesh-tree.json: run 'python scripts/tree_manifest.py' where the tree is copied from, and carry .kmesh-tree.json" >&2
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" JUPYTER_PATH=/tmp/kmesh-jupyter/share/jupyter:/tmp/site/share/jupyter
python3 -m ipykernel install --prefix /tmp/kmesh-jupyter --name kmesh >/dev/null || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
status=0
# KMESH_GPU_TESTS=1 first runs the CUDA tests (-m gpu; pytest travels in .whl/): $OUT/gpu-tests.txt
if [ "${KMESH_GPU_TESTS:-0}" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_copy.py tests/test_copy_graph.py tests/test_launch_thread.py tests/test_gpu_buffer.py \
    tests/test_gpu_clocks.py >"$OUT/gpu-tests.txt" 2>&1 || status=1
  tail -3 "$OUT/gpu-tests.txt"
fi
for item in "$@"; do
  name=""; spec=$item
  case "$item" in */*) name=${item#*/}; spec=${item%%/*};; esac
  section=${spec%%:*}; profile=gpu
  [ "$section" != "$spec" ] && profile=${spec#*:}
  label="$section-$profile${name:+-$name}"
  run_dir="runs/device/$label"
  rm -rf "$run_dir"; mkdir -p "$run_dir"
  # KMESH_SET_<section as given>="KEY=VALUE ..." adds --set overrides for that section
  sets=$(eval echo "\${KMESH_SET_${name:-$section}:-}")
  extra=""; for kv in $sets; do extra="$extra --set $kv"; done
  timeout "${KMESH_SECTION_TIMEOUT:-560}" python3 -m kmesh_lib.app.cli run "$section" --profile "$profile" --run-dir "$run_dir" --log-output $extra || status=1
  tar czf "$OUT/$label.tgz" -C runs/device "$label"
done
exit $status
