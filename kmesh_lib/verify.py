"""``kmesh verify``: re-check a finished run from what it wrote, not from what it printed.

Two kinds of checks: the checks the notebook recorded (``results["checks"]``), and checks
recomputed here from the raw captures, which catch a notebook that recorded a pass wrongly:

- every ``raw/*block_events.jsonl`` nets to zero references per block (the drain check, replayed
  from the events: alloc + touch + hold == free + release for every block);
- the section's own ``verify(run_dir) -> list[Check]`` hook, where it has one.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

TAKES = {"alloc": 1, "touch": 1, "hold": 1, "free": -1, "release": -1}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def net_references(events: list[dict]) -> Counter:
    """Per block id: references taken minus references dropped over the whole capture."""
    net: Counter = Counter()
    for event in events:
        delta = TAKES.get(event["op"], 0)
        for block_id in event["block_ids"]:
            net[block_id] += delta
    return net


def capture_drain_checks(run_dir: Path) -> list[Check]:
    checks = []
    for path in sorted((run_dir / "raw").glob("*block_events.jsonl")):
        events = read_jsonl(path)
        by_arm: dict[str, list[dict]] = {}
        for e in events:
            by_arm.setdefault(e.get("arm", ""), []).append(e)
        for arm, arm_events in sorted(by_arm.items()):
            leaked = {b: n for b, n in net_references(arm_events).items() if n != 0}
            name = f"capture drains: {path.name}" + (f" [{arm}]" if arm else "")
            checks.append(Check(name, not leaked, f"{len(arm_events)} events; leaked blocks {sorted(leaked)[:10]}"))
    return checks


def verify_run(run_dir: Path) -> list[Check]:
    from . import sections

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
    hook = section.hook("verify")
    if hook is not None:
        checks += hook(run_dir)
    return checks
