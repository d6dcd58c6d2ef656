"""Section 21's checks, computed from the run's raw records."""
from __future__ import annotations

from pathlib import Path

from kmesh_lib.base.checks import Check
from kmesh_lib.base.records import read_jsonl


def checks(run_dir) -> list:
    """Re-checks from ``raw/rows.jsonl``: every measured row hit its expected cached tokens."""

    path = Path(run_dir) / "raw" / "rows.jsonl"
    if not path.exists():
        return [Check("raw/rows.jsonl exists", False, "no rows were recorded")]
    rows = [r for r in read_jsonl(path) if r.get("measured")]
    bad = [r["tag"] for r in rows if any(c != r["expected_cached_tokens"] for c in r["num_cached_tokens"])]
    arms = sorted({r["arm"] for r in rows})
    return [Check("raw: measured rows recorded", bool(rows), f"{len(rows)} rows, arms {arms}"),
            Check("raw: every follow-up hit its expected cached tokens", not bad, f"misses: {bad[:5]}")]

