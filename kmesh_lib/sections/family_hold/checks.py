"""Section 18's checks, computed from the run's raw records."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from kmesh_lib.base.checks import Check
from kmesh_lib.base.records import read_jsonl
from kmesh_lib.kv.capture_contract import validate_capture


def checks(run_dir) -> list[Check]:
    """Section 18's checks, recomputed from ``raw/`` (``kmesh verify 18``)."""
    run_dir = Path(run_dir)
    checks = []
    results = json.loads((run_dir / "results.json").read_text())
    params = yaml.safe_load((run_dir / "params.resolved.yaml").read_text()) or {}
    rows = read_jsonl(run_dir / "raw" / "requests.jsonl") if (run_dir / "raw" / "requests.jsonl").exists() else []
    checks.append(Check("raw requests present", bool(rows), f"{len(rows)} rows"))
    for path in sorted((run_dir / "raw").glob("capture.*.jsonl")):
        report = validate_capture(path)
        checks.append(Check(f"{path.name} follows kmesh.capture/1", report.ok, "; ".join(report.errors[:3])))
        label = path.name.split(".")[1]
        recs = read_jsonl(path)
        holds = {r["family_id"]: [b for e in r["block_events"] if e["op"] == "hold" for b in e["block_ids"]]
                 for r in recs if r["kind"] == "parent"}
        reuse = [[b for e in r["block_events"] if e["op"] == "touch" for b in e["block_ids"]][:len(holds[r["family_id"]])]
                 == holds[r["family_id"]] for r in recs if r["kind"] == "child" and r["extra"]["arm"] == "held"]
        checks.append(Check(f"{label}: held children touch the parent's held blocks", bool(reuse) and all(reuse)))
    for label in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == label]
        by = {(r["sample"], r["arm"], r["role"]): r for r in mine}
        pairs = [(by[(s, "stock", role)], r) for (s, arm, role), r in by.items() if arm == "held"]
        checks.append(Check(f"{label}: tokens match between arms", all(a["output_token_ids"] == b["output_token_ids"]
                                                                       for a, b in pairs)))
        delta = max((abs(x - y) for a, b in pairs for x, y in zip(a["logprobs"], b["logprobs"])), default=0.0)
        checks.append(Check(f"{label}: chosen logprobs match between arms within LOGPROB_TOLERANCE",
                            delta <= params.get("LOGPROB_TOLERANCE", 0.0), f"max |delta| {delta:.3g}"))
        done = all(len(r["output_token_ids"]) > 0 and r["finish_reason"] == "length" for r in mine)
        checks.append(Check(f"{label}: every request completed", done))
        saved = [by[(s, "held", "child")]["num_cached_tokens"] - by[(s, "stock", "child")]["num_cached_tokens"]
                 for s in sorted({k[0] for k in by})]
        want = [row["saved"] for row in results.get(label, {}).get("samples", [])]
        checks.append(Check(f"{label}: saved tokens recomputed from raw match results.json", saved == want,
                            f"raw {saved} vs results {want}"))
    return checks
