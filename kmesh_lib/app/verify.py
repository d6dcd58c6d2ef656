"""``kmesh verify``: re-check a finished run from what it wrote, not from what it printed.

Two kinds of checks: the checks the notebook recorded (``results["checks"]``), and checks
recomputed here from the raw captures, which catch a notebook that recorded a pass wrongly:

- every ``raw/*block_events.jsonl`` nets to zero references per block (the drain check, replayed
  from the events: alloc + touch + hold == free + release for every block);
- the section's own ``verify(run_dir) -> list[Check]`` hook, where it has one.
"""
from __future__ import annotations

import json
from pathlib import Path

from kmesh_lib.app import registry as sections
from kmesh_lib.base.checks import Check
from kmesh_lib.base.records import read_jsonl
from kmesh_lib.kv.capture import drain_checks_from_events


def capture_drain_checks(run_dir: Path) -> list[Check]:
    checks = []
    for path in sorted((run_dir / "raw").glob("*block_events.jsonl")):
        checks += drain_checks_from_events(path.name, read_jsonl(path))
    return checks


def verify_run(run_dir: Path) -> list[Check]:
    results_path = run_dir / "results.json"
    if not results_path.exists():
        return [Check("results.json exists", False, f"{results_path} is missing: the run did not start")]
    results = json.loads(results_path.read_text())
    checks = [Check("run finished", "finished_utc" in results, "the notebook's last cell records finished_utc")]
    recorded = results.get("checks", {})
    checks.append(Check("recorded checks present", bool(recorded), f"{len(recorded)} recorded"))
    checks += [Check(f"recorded: {name}", bool(c["ok"]), c.get("detail", "")) for name, c in recorded.items()]
    checks += capture_drain_checks(run_dir)
    section = sections.get(results.get("section", run_dir.parent.name))
    if hasattr(section, "checks"):
        checks += section.checks(run_dir)
    return checks
