#!/bin/sh
# Brings a run made on the GPU machine (scripts/device_run.sh) into runs/ under a fresh run id, renders
# its report and verifies it. Publishing is a separate, deliberate step (the command is printed).
#   sh scripts/import_device_run.sh PATH/TO/<section>-<profile>[-<name>].tgz
set -eu
tgz=$1
name=$(basename "$tgz" .tgz)
# <section>-<profile>.tgz, or <section>-<profile>-<name>.tgz from an item SECTION[:PROFILE]/NAME
section=${name%%-*}; rest=${name#*-}; profile=${rest%%-*}
py=.venv/bin/python
# a new folder made with an exclusive mkdir: runs/<section key>/<profile>-<date>-<time>-<random>
dest=$($py -c "import sys; from kmesh_lib.app import registry; from kmesh_lib.base.records import new_run_dir
print(new_run_dir(registry.get(sys.argv[1]).KEY, sys.argv[2]))" "$section" "$profile")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$tgz" -C "$tmp"
cp -R "$tmp/$name/." "$dest/"
run_id=$(basename "$dest")
# params.resolved.yaml stays as the run wrote it: its hash was recorded as the run finished (capture_sha256), and
# publish rewrites the device's RUN_DIR in the published copy itself (rehashing it there, the measured hash kept)
$py - "$dest" "$run_id" <<'PY'
import json, sys
from pathlib import Path
run_dir, run_id = Path(sys.argv[1]), sys.argv[2]
results = json.loads((run_dir / "results.json").read_text())
results["run_id"] = run_id
(run_dir / "results.json").write_text(json.dumps(results, indent=1))
PY
.venv/bin/kmesh report "$section" "$run_id"
if .venv/bin/kmesh verify "$section" "$run_id"; then
  echo "publish with: .venv/bin/kmesh publish $section $run_id"
else
  echo "verify failed; publish only as a marked failure: .venv/bin/kmesh publish $section $run_id --allow-failed --why \"one sentence: why it failed\""
fi
