"""Section 20's checks, computed from the run's raw records."""
from __future__ import annotations

from kmesh_lib.base.checks import Check
from kmesh_lib.base.records import read_jsonl
from kmesh_lib.sections.prefetch.stats import invariants


def checks(run_dir) -> list:
    """Recomputes readiness and the read-once invariant from ``raw/groups.jsonl``."""
    from pathlib import Path


    path = Path(run_dir) / "raw" / "groups.jsonl"
    if not path.exists():
        return [Check("raw/groups.jsonl exists", False, "no groups were recorded")]
    return [Check(f"raw: {name}", ok, detail) for name, ok, detail in invariants(read_jsonl(path))]
