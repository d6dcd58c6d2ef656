"""The live panel's measurement: one lead, one group size, one fresh engine run, in its own run folder.

The panel (``widgets``) writes the folder's ``params.resolved.yaml`` -- the notebook's parameters with
LEADS_MS = [the lead], one path, one group size, one engine run, MEASURED_GROUPS = WIDGET_GROUPS, no
placement controls and no singleflight contrast (CONTRAST_GROUPS = 0: it runs beside the pilot) -- and
starts this module as a child process, its output going to the folder's ``engine.log`` (never into the
notebook):

    python -m kmesh_lib.sections.prefetch.live RUN_DIR

The child runs the confirmation at that lead (on_arrival, early, and early_fixed unless the lead is
FIXED_LEAD_MS), appending each group to ``raw/groups.jsonl`` as it finishes (the panel's progress
bar counts them), then records the tables and the section's checks and finishes the run, so a live
measurement is a run like any other: ``kmesh verify 20 --run-dir RUN_DIR`` re-checks it.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import traceback
from pathlib import Path

import yaml

from kmesh_lib.base import params as params_mod
from kmesh_lib.base.checks import show
from kmesh_lib.base.paths import REPO_ROOT, pythonpath_with_repo, repo_relative
from kmesh_lib.base.records import LIVE_MARK, RunRecord, new_run_id, read_jsonl, run_root
from kmesh_lib.sections import prefetch as section
from kmesh_lib.sections.prefetch.captures import PrefetchGroup, as_groups
from kmesh_lib.sections.prefetch.experiment import PrefetchParams
from kmesh_lib.sections.prefetch.protocol import confirm_arms, run_engine
from kmesh_lib.sections.prefetch.stats import classify


def live_params(cfg: PrefetchParams, path: str, n: int, lead_ms: float) -> PrefetchParams:
    """The notebook's parameters narrowed to one live measurement (validated like any run's)."""
    # The lead is given: no pilot runs, and so neither does the singleflight contrast, which runs beside the pilot
    # (protocol.run_engine): CONTRAST_GROUPS=0 says so, or the section's contrast check fails every live run.
    return dataclasses.replace(cfg, PATHS=[path], GROUP_SIZES=[n], LEADS_MS=[float(lead_ms)], ENGINE_RUNS=1,
                               MEASURED_GROUPS=cfg.WIDGET_GROUPS, CONTROLS=[], SOURCE_RUN=None, RUN_DIR=None,
                               LEAD_RULE="all_ready", PILOT_ENGINE_RUNS=1, CONTRAST_GROUPS=0)


def expected_groups(cfg: PrefetchParams) -> int:
    """Groups the live run records: (warm-up + measured pairs) x arms."""
    return (cfg.WARMUP_PAIRS + cfg.pairs_per_run) * len(confirm_arms(cfg, cfg.LEADS_MS[0]))


def new_folder(cfg: PrefetchParams, parent: str) -> Path:
    """``<run root>/prefetch/<parent run>-live-<lead>ms-<time>``: next to the runs, never inside one."""
    stamp = new_run_id("").lstrip("-")
    out = run_root() / section.KEY / f"{parent}{LIVE_MARK}{cfg.LEADS_MS[0]:g}ms-N{cfg.GROUP_SIZES[0]}-{stamp}"
    (out / "raw").mkdir(parents=True, exist_ok=False)
    values = {**params_mod.to_dict(cfg), "RUN_DIR": repo_relative(out)}
    (out / "params.resolved.yaml").write_text(yaml.safe_dump(values, sort_keys=True))
    return out


def recorded_groups(out: Path, cfg: PrefetchParams) -> list[PrefetchGroup]:
    """The live run's groups as the panel plots them: classified, each engine run named ``live <folder>: ...``."""
    groups_file = out / "raw" / "groups.jsonl"
    recorded = as_groups(read_jsonl(groups_file)) if groups_file.exists() else []
    return [g.model_copy(update={"engine_run": f"live {out.name}: {g.engine_run}"}) for g in classify(recorded)]


def start(cfg: PrefetchParams, parent: str) -> tuple[Path, subprocess.Popen]:
    """A new live run folder and the child measuring into it (output to ``engine.log``)."""
    out = new_folder(cfg, parent)
    with open(out / "engine.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kmesh_lib.sections.prefetch.live", str(out)], stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env={**os.environ, "PYTHONPATH": pythonpath_with_repo()})
    return out, proc


def main(run_dir: str) -> int:
    out = Path(run_dir)
    cfg = params_mod.build(PrefetchParams, params_mod.current_names(yaml.safe_load((out / "params.resolved.yaml").read_text())))
    record = RunRecord.open(section.KEY, cfg, str(out))
    try:
        run_engine(cfg, cfg.PATHS[0], cfg.GROUP_SIZES[0], 0, cfg.LEADS_MS[0], record, log=lambda m: print(m, flush=True))
    finally:  # a run that raised is recorded (its summary says failed) and checked like any other
        record.save_tables(section.TABLES)
        report = section.checks(record.files())
        record.save_checks(report)
        show(report, section.counts(record.files()))
        record.finish(report)
    return 0 if record.results["status"] == "passed" else 1


if __name__ == "__main__":
    try:
        code = main(sys.argv[1])
    except BaseException:  # noqa: BLE001 - report, then exit hard: LMCache threads would keep us alive
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
