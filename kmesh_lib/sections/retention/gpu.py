"""Section 16 on a CUDA GPU without the notebook stack: the measuring half, self-contained.

Two ways to run section 16 on the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3, the in-process
LMCacheConnectorV1; the stage's two steps are in ../shared/device/README.md):

1. the notebook, like every section: ``sh scripts/device_run.sh 16`` (papermill travels as wheels),
   then ``sh scripts/import_device_run.sh <fetched>/retention-gpu.tgz``;
2. this script, which needs only the stage (no papermill, pandas or matplotlib), from the repo root:

       sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
           timeout 540 python3 benchmarks/gpu_retention.py --out $OUT/retention-gpu [--set KEY=VALUE ...]

   It runs every block in its own child process (``kmesh_lib.sections.retention.child``), then writes what
   the notebook's table and checks cells would: params.resolved.yaml, env.json, results.json,
   raw/groups.jsonl, raw/blocks.jsonl, blocks.log -- six files (the device returns at most eight).
   Back on the CPU machine, the notebook renders and publishes it without starting an engine:

       cp -r <fetched>/retention-gpu outputs/retention/gpu-<date>
       .venv/bin/kmesh verify 16 --run-dir outputs/retention/gpu-<date>
       .venv/bin/kmesh run 16 --profile gpu --set SOURCE_RUN=outputs/retention/gpu-<date>

On any GPU box with ``pip install vllm==0.26.0 lmcache==0.5.3`` the same command works without the stage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def analyse(record, groups: list[dict], blocks: list[dict]) -> bool:
    """The notebook's table and checks cells (``notebooks/16_retention.ipynb``), printed."""
    from kmesh_lib.sections.retention import report as rr

    record.save("blocks", blocks)
    arms = record.save("arms", rr.arm_rows(groups))
    record.save("discard_to_retain", rr.ratio_rows(arms))
    record.save("not_run", rr.unavailable_rows(blocks))
    ran = [b for b in blocks if b["status"] != "not available"]
    external = [b for b in ran if b["path"] != "engine"]
    lines = rr.read_invariants(groups)
    checks = {name: (ok, detail) for name, ok, detail, required in lines if required}
    checks["external blocks ran"] = (bool(external), f"{len(external)} blocks")
    checks["every lmcache server and engine process listened on 127.0.0.1 only"] = (all(
        a.startswith("127.0.0.1:") for b in ran for a in b.get("listeners", []) + b.get("engine_listeners", [])), "")
    checks["no server process or disk-tier file left behind"] = (all(
        b.get("cleanup", {}).get("runtime_dir_removed", True) and b.get("cleanup", {}).get("server_gone", True)
        for b in external), "")
    checks["no block ran out of disk"] = (all(b["status"] == "ok" for b in ran), "")
    for name, (ok, detail) in checks.items():
        record.save_check(name, ok, detail)
        print(f"check: {name}: {ok} {detail}")
    for name, _ok, detail, required in lines:
        if not required:
            print(f"measured: {name}: {detail}")
    for row in arms:
        print(json.dumps({k: row.get(k) for k in ("path", "group_size", "arm", "groups_ok", "ttft_a_ms_median",
                                                 "makespan_ms_median", "disk_mib_group", "cross_check")}))
    record.finish()
    return all(ok for ok, _ in checks.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the run directory to write")
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    import yaml

    from kmesh_lib.app import registry as sections
    from kmesh_lib.base import params as params_mod
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.base.records import RunRecord
    from kmesh_lib.sections.retention.experiment import measure

    cfg, _, _ = resolve_params(sections.get("16"), args.profile, [], args.set)
    run_dir = Path(args.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump({**params_mod.to_dict(cfg), "RUN_DIR": str(run_dir)}))
    record = RunRecord.open("retention", cfg, str(run_dir))
    t0 = time.monotonic()
    groups, blocks = measure(cfg, record, log=lambda msg: print(msg, flush=True), isolate=("all",))
    passed = analyse(record, groups, blocks)
    print(f"{'ALL CHECKS PASSED' if passed else 'SOME CHECKS FAILED'} in {time.monotonic() - t0:.0f} s -> {run_dir}")
    return 0 if passed else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # LMCache 0.5.3 leaves non-daemon threads behind
