"""Section 19's CPU consistency checks: everything recomputed from the run's raw capture.

``consistency_checks(run_dir)`` (the section's ``app.verify`` hook) trusts nothing the notebook
printed. From ``raw/tot_capture.jsonl`` it

* validates the capture against ``kmesh.capture/1``;
* recomputes observed, LRU and ideal prefill and the exact-prefix edges at the run's pool size;
* replays the whole search: ``TotSearch`` runs again with a generator that serves each call's
  captured output, after checking that the call's prompt tokens, producer, kind and seed are
  exactly the captured ones; the replayed counters and outcomes must equal the recorded ones;
* regrades every answer the replay reaches with exact fractions against the puzzle file;
* replays the per-invocation block events: every reference taken is dropped, and together
  they are exactly the run's whole block-pool capture.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import yaml

from kmesh_lib.base.checks import Check
from kmesh_lib.base.params import build
from kmesh_lib.base.records import read_jsonl, sha256_file
from kmesh_lib.engine.model_spec import resolve, tokenizer_for
from kmesh_lib.engine.requests import RequestResult
from kmesh_lib.kv.capture import net_references
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.tot_headroom.bound import compare_bound
from kmesh_lib.sections.tot_headroom.params import CAPTURE, OUTCOMES, TotHeadroomParams, search_config
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import COUNT_NAMES, TotSearch


def capture_generator(records: list[dict]):
    """``generate(calls)`` that serves captured outputs; None once the capture has no such call."""
    by_id = {r["invocation_id"]: r for r in records}

    def generate(calls):
        results = []
        for call in calls:
            rec = by_id.get(call.invocation_id)
            if rec is None:
                return None
            got = (rec["prompt_token_ids"], rec["parent_id"], rec["kind"], rec.get("extra", {}).get("seed"))
            if got != (list(call.prompt_token_ids), call.parent_id, call.kind, call.seed):
                raise ValueError(f"{call.invocation_id}: the replayed call differs from the captured one")
            finish = "timeout" if rec["status"] == "timeout" else rec["status"]
            results.append(RequestResult(call.invocation_id, rec["prompt_token_ids"], rec["output_token_ids"],
                                         num_cached_tokens=rec["num_cached_tokens"], t_submit_ns=rec["t_submit_ns"],
                                         finish_reason=finish))
        return results

    return generate


def replay_search(records: list[dict], cfg):
    """The search run again on the captured outputs (no engine, no clock limit)."""

    puzzles = game24.load_puzzles(cfg.PUZZLES_CSV, cfg.PUZZLE_INDICES)
    # a stopped clock: the replay never reaches the run ceiling; it stops where the capture ends
    return TotSearch(capture_generator(records), tokenizer_for(resolve(cfg.MODEL)), search_config(cfg),
                     clock=lambda: 0.0).run(puzzles)


def load_run(run_dir: Path):

    values = yaml.safe_load((run_dir / "params.resolved.yaml").read_text())
    cfg = build(TotHeadroomParams, values, where=str(run_dir / "params.resolved.yaml"))
    results = json.loads((run_dir / "results.json").read_text())
    records = read_jsonl(run_dir / "raw" / CAPTURE) if (run_dir / "raw" / CAPTURE).exists() else []
    outcomes = read_jsonl(run_dir / "raw" / OUTCOMES) if (run_dir / "raw" / OUTCOMES).exists() else []
    return cfg, results, records, outcomes


def consistency_checks(run_dir: Path) -> list[Check]:

    cfg, results, records, outcomes = load_run(run_dir)
    search = results.get("search", {})
    checks = []
    report = validate_capture(run_dir / "raw" / CAPTURE) if records else None
    checks.append(Check("capture validates against kmesh.capture/1", bool(report and report.ok),
                        "; ".join((report.errors if report else ["no capture"])[:3])))
    checks.append(Check("one capture record per invocation", len(records) == search.get("counts", {}).get("num_calls"),
                        f"{len(records)} records, {search.get('counts', {}).get('num_calls')} calls"))
    csv_path = game24.repo_path(cfg.PUZZLES_CSV)
    want_hash = results.get("inputs", {}).get(f"puzzles:{csv_path.name}")
    checks.append(Check("puzzle file unchanged since the run", want_hash == sha256_file(csv_path), str(csv_path)))

    bound = compare_bound(records, cfg.BLOCK_SIZE, cfg.NUM_GPU_BLOCKS - 1) if records else None
    checks.append(Check("bound recomputed from the capture matches", bound == results.get("bound"),
                        f"recomputed {bound}, recorded {results.get('bound')}"))
    checks.append(Check("ideal <= observed prefill at the run's pool size",
                        bool(bound) and bound["ideal_prefill_tokens"] <= bound["observed_prefill_tokens"]))
    checks.append(Check("partial run does not qualify", search.get("qualifies") == (not search.get("partial", True))))

    try:
        replayed = replay_search(records, cfg)
        replay_error = ""
    except ValueError as e:
        replayed, replay_error = None, str(e)
    same_counts = bool(replayed) and {k: replayed.counts[k] for k in COUNT_NAMES} == search.get("counts")
    got = [(o.puzzle_index, o.status, o.expression, list(o.steps), o.num_calls)
           for o in replayed.outcomes] if replayed else None
    want = [(o["puzzle_index"], o["status"], o["expression"], o["steps"], o["num_calls"]) for o in outcomes]
    checks.append(Check("search replayed from the capture matches", same_counts and got == want,
                        replay_error or f"replayed {got}, recorded {want}"))
    puzzles = {p.index: p for p in game24.load_puzzles(csv_path)}
    regraded = [(game24.grade(puzzles[o["puzzle_index"]].numbers, o["expression"]).ok, o["status"] == "solved")
                for o in outcomes if o["status"] in ("solved", "failed") and o["expression"] is not None]
    numbers_ok = all(tuple(o["numbers"]) == puzzles[o["puzzle_index"]].numbers for o in outcomes)
    checks.append(Check("grades recomputed from the capture match", numbers_ok and all(a == b for a, b in regraded),
                        f"{len(regraded)} graded answers"))

    per_record = [e for r in records for e in r.get("block_events", [])]
    whole = read_jsonl(run_dir / "raw" / "block_events.jsonl") if (run_dir / "raw" / "block_events.jsonl").exists() else []
    key = lambda e: (e["step"], e["op"], tuple(e["block_ids"]), tuple(e.get("ref_cnts", ())))  # noqa: E731
    leaked = {b: n for b, n in net_references(per_record).items() if n}
    checks.append(Check("per-invocation block events drain and equal the whole capture",
                        not leaked and Counter(map(key, per_record)) == Counter(map(key, whole)),
                        f"{len(per_record)} attributed, {len(whole)} captured, leaked {sorted(leaked)[:5]}"))
    return checks


def checks(run_dir) -> list:
    """Recomputes the bound, regrades every answer and replays the search from ``raw/``."""

    return consistency_checks(Path(run_dir))
