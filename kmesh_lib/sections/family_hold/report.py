"""Section 18 tables, capture records and re-checks (``app.registry.family_hold.experiment`` runs the arms).

Everything here reads ``ArmRun``s or the raw files, never the engine. The exact parent-to-child
edges come from the block capture: the parent's hashed blocks are the first
``floor((P + O - 1) / B)`` ids it allocated, the child's reused blocks are the ids it touched
when scheduled, and an edge is a position where both name the same physical block.
"""
from __future__ import annotations

from kmesh_lib.kv.capture_contract import record_from_result, write_capture
from kmesh_lib.sections.family_hold.experiment import ARMS, ArmRun, hashed_blocks

CLOCK_DOMAIN = "time.monotonic_ns"


def _ids(run: ArmRun, role: str, op: str) -> list[int]:
    first, last = run.spans[run.roles.index(role)]
    return [b for e in run.events if e["op"] == op and first <= e["step"] <= last for b in e["block_ids"]]


def edges(run: ArmRun) -> dict:
    """Parent-to-child block edges from the capture, and what happened to the parent's blocks."""
    parent = run.result("parent")
    n_hashed = hashed_blocks(parent.num_prompt_tokens, len(parent.output_token_ids), run.block_size)
    parent_ids = _ids(run, "parent", "alloc")[:n_hashed]
    held = _ids(run, "parent", "hold")
    touched = _ids(run, "child", "touch")
    n_edges = next((i for i, (p, c) in enumerate(zip(parent_ids, touched)) if p != c), min(len(parent_ids), len(touched)))
    c0, c1 = run.spans[run.roles.index("child")][0], run.spans[run.roles.index("parent")][1]
    evicted = {b for e in run.events if e["op"] == "evict" and c1 < e["step"] < c0 for b in e["block_ids"]}
    return {"parent_hashed_blocks": n_hashed, "held_blocks": len(held), "child_hit_blocks": len(touched),
            "edges": n_edges, "edge_block_ids": parent_ids[:n_edges],
            "parent_blocks_evicted": len(evicted & set(parent_ids)),
            "child_reuses_held_blocks": bool(held) and touched[:len(held)] == held == parent_ids[:len(held)]
                                        and all(e.aliased for e in run.edges)}


def ref_trace(run: ArmRun) -> dict[str, list[int]]:
    """ref_cnt values of the parent's held blocks after each operation on them (held arm)."""
    held = set(_ids(run, "parent", "hold"))
    out: dict[str, set] = {}
    for role, ops in (("parent", ("hold", "free")), ("child", ("touch", "release", "free"))):
        first, last = run.spans[run.roles.index(role)]
        for e in run.events:
            if e["op"] in ops and first <= e["step"] <= last:
                vals = {r for b, r in zip(e["block_ids"], e["ref_cnts"]) if b in held}
                if vals:
                    out.setdefault(f"{role} {e['op']}", set()).update(vals)
    return {k: sorted(v) for k, v in out.items()}


def request_rows(runs: list[ArmRun]) -> list[dict]:
    return [{"mode": r.mode, "block_size": r.block_size, "sample": r.sample, "arm": r.arm, "request": role,
             "prompt_tokens": res.num_prompt_tokens, "num_cached_tokens": res.num_cached_tokens,
             "output_tokens": len(res.output_token_ids)}
            for r in runs for role, res in zip(r.roles, r.results)]


def _pairs(runs: list[ArmRun]):
    by = {(r.sample, r.arm): r for r in runs}
    return [(by[(s, "stock")], by[(s, "held")]) for s in sorted({r.sample for r in runs})]


def sample_rows(runs: list[ArmRun]) -> list[dict]:
    """Per sample: saved, displaced and net cached tokens, and the capture's block operations."""
    rows = []
    for stock, held in _pairs(runs):
        child = {a.arm: a.result("child").num_cached_tokens for a in (stock, held)}
        others = {a.arm: sum(x.num_cached_tokens for role, x in zip(a.roles, a.results) if role != "child")
                  for a in (stock, held)}
        saved, displaced = child["held"] - child["stock"], others["stock"] - others["held"]
        row = {"sample": stock.sample, "child_cached_stock": child["stock"], "child_cached_held": child["held"],
               "saved": saved, "displaced": displaced, "net": saved - displaced}
        for a in (stock, held):
            e = edges(a)
            row |= {f"alloc_{a.arm}": a.counts["alloc"], f"evict_{a.arm}": a.counts["evict"],
                    f"parent_evicted_{a.arm}": e["parent_blocks_evicted"], f"edges_{a.arm}": e["edges"]}
        row |= {"hold": held.counts["hold"], "release": held.counts["release"]}
        rows.append(row)
    return rows


def arm_rows(runs: list[ArmRun]) -> list[dict]:
    """Per arm: cached tokens per request and block operations, with whether every sample agrees."""
    rows = []
    for arm in ARMS:
        mine = [r for r in runs if r.arm == arm]
        per_sample = [([x.num_cached_tokens for x in r.results], r.counts) for r in mine]
        cached, counts = per_sample[0]
        rows.append({"arm": arm, "cached_tokens_per_request": cached, **counts,
                     "same_in_every_sample": all(p == per_sample[0] for p in per_sample)})
    return rows


def output_mismatches(runs: list[ArmRun], logprob_tolerance: float = 0.0) -> list[str]:
    """Requests whose tokens differ between the arms of a sample, or whose chosen-token logprobs
    differ by more than ``logprob_tolerance`` (0: exactly equal)."""
    bad = []
    for stock, held in _pairs(runs):
        for role, a, b in zip(stock.roles, stock.results, held.results):
            if a.output_token_ids != b.output_token_ids:
                bad.append(f"sample {stock.sample} {role}: tokens differ")
            elif len(a.logprobs) != len(b.logprobs) or max_logprob_delta(a, b) > logprob_tolerance:
                bad.append(f"sample {stock.sample} {role}: logprobs differ by {max_logprob_delta(a, b):.3g} "
                           f"(cached {a.num_cached_tokens} vs {b.num_cached_tokens} tokens)")
    return bad


def max_logprob_delta(a, b) -> float:
    return max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0)


def engine_info(engine, cfg) -> dict:
    import vllm

    return {"name": "vllm", "version": vllm.__version__, "mode": engine.mode,
            "device": cfg.DEVICE if engine.mode == "real" else "cpu", "block_size": engine.params.BLOCK_SIZE,
            "num_gpu_blocks": engine.params.NUM_GPU_BLOCKS, "model": cfg.MODEL}


def capture_records(runs: list[ArmRun], run_id: str, engine: dict) -> list[dict]:
    """``kmesh.capture/1`` records: one per request, with the block events of its steps."""
    records = []
    for r in runs:
        for role, res, (first, last) in zip(r.roles, r.results, r.spans):
            family = role in ("parent", "child")
            events = [{k: e[k] for k in ("step", "op", "block_ids", "ref_cnts")}
                      for e in r.events if first <= e["step"] <= last]
            records.append(record_from_result(
                res, run_id=run_id, kind=role.split("/")[0].rstrip("0123456789"), engine=engine,
                clock_domain=CLOCK_DOMAIN, family_id=r.family_id if family else None,
                parent_id=r.request_id("parent") if role == "child" else None, block_events=events,
                extra={"arm": r.arm, "sample": r.sample, "role": role}))
    return records


def record_mode(record, label: str, runs: list[ArmRun], engine: dict, *, logprob_tolerance: float) -> dict:
    """Writes raw requests, block events and the invocation capture; saves the summaries.
    ``logprob_mismatches`` lists chosen-token logprobs further apart than ``logprob_tolerance``."""
    record.append_jsonl("requests.jsonl", [
        {"mode": label, "arm": r.arm, "sample": r.sample, "role": role, "request_id": x.request_id,
         "prompt_token_ids": x.prompt_token_ids, "output_token_ids": x.output_token_ids, "logprobs": x.logprobs,
         "num_cached_tokens": x.num_cached_tokens, "finish_reason": x.finish_reason}
        for r in runs for role, x in zip(r.roles, r.results)])
    record.append_jsonl("block_events.jsonl", [{"arm": f"{label}/{r.arm}/s{r.sample}", **e} for r in runs for e in r.events])
    report = write_capture(record.run_dir / "raw" / f"capture.{label}.jsonl",
                           capture_records(runs, record.results["run_id"], engine))
    held = [r for r in runs if r.arm == "held"]
    summary = {"engine": engine, "arms": arm_rows(runs), "samples": sample_rows(runs),
               "edges": [{"arm": r.arm, "sample": r.sample, **edges(r)} for r in runs],
               "ref_cnts_of_held_blocks": ref_trace(held[0]), "controller": [r.controller for r in held],
               "token_mismatches": output_mismatches(runs, float("inf")),
               "logprob_mismatches": output_mismatches(runs, logprob_tolerance), "capture_records": report.num_records,
               "max_logprob_delta": max(max_logprob_delta(a, b) for s, h in _pairs(runs)
                                        for a, b in zip(s.results, h.results)),
               "all_drained": all(r.drain_ok and r.reset_ok and r.clean_start for r in runs)}
    return record.save(label, summary)


HELD_REF_CNTS = {"parent hold": [2], "parent free": [1], "child touch": [2], "child release": [1], "child free": [0]}


def mode_checks(cfg, label: str, runs: list[ArmRun], summary: dict) -> dict[str, bool]:
    """The invariants one run mode must meet, by name (the notebook's checks cell prints them)."""
    held = [r for r in runs if r.arm == "held"]
    return {
        f"{label}: every request completed with MAX_TOKENS tokens":
            all(len(x.output_token_ids) == cfg.MAX_TOKENS for r in runs for x in r.results),
        f"{label}: generated tokens match between arms, request by request": not summary["token_mismatches"],
        f"{label}: chosen logprobs match between arms within LOGPROB_TOLERANCE": not summary["logprob_mismatches"],
        f"{label}: every hold lasted until its child was scheduled (none refused or expired)":
            all(r.controller["num_released"] == 1 and r.controller["num_expired"] == 0
                and r.controller["num_refused_blocks_cap"] == r.controller["num_refused_families_cap"] == 0
                for r in held),
        f"{label}: each held child reuses the parent's exact physical blocks":
            all(edges(r)["child_reuses_held_blocks"] and len(r.edges) == 1 for r in held),
        f"{label}: no held block was evicted": all(edges(r)["parent_blocks_evicted"] == 0 for r in held),
        f"{label}: held blocks' ref_cnt 2, 1, 2, 1, 0 through hold, parent free, child hit, release, child free":
            all(ref_trace(r) == HELD_REF_CNTS for r in held),
        f"{label}: counts identical in every sample": all(a["same_in_every_sample"] for a in summary["arms"]),
        f"{label}: every arm-sample started clean, drained and reset": summary["all_drained"],
    }


def same_counts(a_runs: list[ArmRun], b_runs: list[ArmRun]) -> list[dict]:
    """Per arm-sample: do two engines give the same cached tokens and block operations?"""
    return [{"arm": a.arm, "sample": a.sample,
             "cached_equal": [x.num_cached_tokens for x in a.results] == [x.num_cached_tokens for x in b.results],
             "block_ops_equal": a.counts == b.counts} for a, b in zip(a_runs, b_runs)]


# -- the sweep --
def sweep_rows(sweep_runs: list[list[ArmRun]]) -> list[dict]:
    rows = []
    for runs in sweep_runs:
        stock, held = _pairs(runs)[0]
        usable = stock.num_gpu_blocks - 1
        parent = stock.result("parent")
        n = hashed_blocks(parent.num_prompt_tokens, len(parent.output_token_ids), stock.block_size)
        s = sample_rows(runs)[0]
        rows.append({"num_gpu_blocks": stock.num_gpu_blocks, "parent_share": round(n / usable, 4),
                     **{k: s[k] for k in ("child_cached_stock", "child_cached_held", "saved", "displaced", "net")},
                     "refused": held.controller["num_refused_blocks_cap"], "evict_stock": s["evict_stock"],
                     "evict_held": s["evict_held"]})
    return sorted(rows, key=lambda r: r["parent_share"])


def crossing(rows: list[dict]) -> float | None:
    """The parent share where saved first overtakes displaced (linear between sweep points)."""
    for a, b in zip(rows, rows[1:]):
        if a["net"] <= 0 < b["net"] or a["net"] > 0 >= b["net"]:
            t = a["net"] / (a["net"] - b["net"])
            return round(a["parent_share"] + t * (b["parent_share"] - a["parent_share"]), 4)
    return None
