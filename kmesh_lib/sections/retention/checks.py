"""Section 16's checks, computed from the run's raw records."""
from __future__ import annotations

from kmesh_lib.base.checks import Check
from kmesh_lib.base.records import read_jsonl
from kmesh_lib.sections.retention.report import read_invariants


def checks(run_dir) -> list:
    """Recomputes the read invariants from ``raw/groups.jsonl`` (not from what the notebook printed)."""
    from pathlib import Path


    path = Path(run_dir) / "raw" / "groups.jsonl"
    if not path.exists():
        return [Check("raw/groups.jsonl exists", False, "no groups were recorded")]
    return [Check(f"raw: {name}", ok, detail)
            for name, ok, detail, required in read_invariants(read_jsonl(path)) if required]
