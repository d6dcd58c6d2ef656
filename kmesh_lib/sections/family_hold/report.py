"""Section 18's summaries, computed from recorded arm-samples (``recorded.ArmRecord``), and the
writers that put a run's arm-samples into ``raw/`` (``experiment`` runs the arms).

The notebook writes raw records, reads them back and summarizes them here; ``checks`` reads the
same files and calls the same functions, so a summary in results.json is a figure raw/ repeats.

The exact parent-to-child edges come from the block capture: the parent's hashed blocks are the
first ``floor((P + O - 1) / B)`` ids it allocated, the child's reused blocks are the ids it
touched when scheduled, and an edge is a leading position where both name the same physical block.
"""
from __future__ import annotations

from kmesh_lib.kv.capture_contract import record_from_result, write_capture
from kmesh_lib.sections.family_hold.captures import FamilyHoldRequest
from kmesh_lib.sections.family_hold.params import ARMS, hashed_blocks
from kmesh_lib.sections.family_hold.recorded import ArmRecord

CLOCK_DOMAIN = "time.monotonic_ns"
HELD_REF_CNTS = {"parent hold": [2], "parent free": [1], "child touch": [2], "child release": [1], "child free": [0]}


def _ids(a: ArmRecord, role: str, op: str) -> list[int]:
    return [b for e in a.events_of(role) if e.op == op for b in e.block_ids]


def parent_block_ids(a: ArmRecord) -> list[int]:
    """The parent's hashed blocks, in block-table order: the first ``floor((P + O - 1) / B)`` it allocated."""
    parent = a.request("parent")
    return _ids(a, "parent", "alloc")[:hashed_blocks(parent.num_prompt_tokens, parent.num_output_tokens, a.block_size)]


def evicted_between_parent_and_child(a: ArmRecord) -> set[int]:
    first, last = a.roles.index("parent"), a.roles.index("child")
    return {b for events in a.request_events[first + 1:last] for e in events if e.op == "evict" for b in e.block_ids}


def edges(a: ArmRecord) -> dict:
    """Parent-to-child block edges from the capture, and what happened to the parent's blocks."""
    parent_ids, held, touched = parent_block_ids(a), _ids(a, "parent", "hold"), _ids(a, "child", "touch")
    n_edges = next((i for i, (p, c) in enumerate(zip(parent_ids, touched)) if p != c), min(len(parent_ids), len(touched)))
    return {"parent_hashed_blocks": len(parent_ids), "held_blocks": len(held), "child_hit_blocks": len(touched),
            "edges": n_edges, "edge_block_ids": parent_ids[:n_edges],
            "parent_blocks_evicted": len(evicted_between_parent_and_child(a) & set(parent_ids)),
            "child_reuses_held_blocks": bool(held) and touched[:len(held)] == held == parent_ids[:len(held)]}


def ref_trace(a: ArmRecord) -> dict[str, list[int]]:
    """ref_cnt values of the parent's held blocks after each operation on them (held arm)."""
    held = set(_ids(a, "parent", "hold"))
    out: dict[str, set] = {}
    for role, ops in (("parent", ("hold", "free")), ("child", ("touch", "release", "free"))):
        for e in a.events_of(role):
            if e.op in ops:
                vals = {r for b, r in zip(e.block_ids, e.ref_cnts) if b in held}
                if vals:
                    out.setdefault(f"{role} {e.op}", set()).update(vals)
    return {k: sorted(v) for k, v in out.items()}


def request_rows(arms: list[ArmRecord]) -> list[dict]:
    return [{"mode": a.mode, "block_size": a.block_size, "sample": a.sample, "arm": a.arm, "request": role,
             "prompt_tokens": row.num_prompt_tokens, "num_cached_tokens": row.num_cached_tokens,
             "output_tokens": row.num_output_tokens}
            for a in arms for role, row in zip(a.roles, a.requests)]


def pairs(arms: list[ArmRecord]) -> list[tuple[ArmRecord, ArmRecord]]:
    """(stock, held) per sample, for the samples that ran both arms."""
    by = {(a.sample, a.arm): a for a in arms}
    return [(by[(s, "stock")], by[(s, "held")]) for s in sorted({a.sample for a in arms})
            if (s, "stock") in by and (s, "held") in by]


def sample_rows(arms: list[ArmRecord]) -> list[dict]:
    """Per sample: saved, displaced and net cached tokens, and the capture's block operations.

        saved      child's cached tokens (held) - (stock)
        displaced  every other request's cached tokens (stock) - (held)
        net        saved - displaced
    """
    rows = []
    for stock, held in pairs(arms):
        child = {a.arm: a.request("child").num_cached_tokens for a in (stock, held)}
        others = {a.arm: sum(r.num_cached_tokens for role, r in zip(a.roles, a.requests) if role != "child")
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


def arm_rows(arms: list[ArmRecord]) -> list[dict]:
    """Per arm: cached tokens per request and block operations, with whether every sample agrees."""
    rows = []
    for arm in ARMS:
        per_sample = [([r.num_cached_tokens for r in a.requests], a.counts) for a in arms if a.arm == arm]
        if per_sample:
            cached, counts = per_sample[0]
            rows.append({"arm": arm, "cached_tokens_per_request": cached, **counts,
                         "same_in_every_sample": all(p == per_sample[0] for p in per_sample)})
    return rows


def max_logprob_delta(a: FamilyHoldRequest, b: FamilyHoldRequest) -> float:
    return max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0)


def output_mismatches(arms: list[ArmRecord], logprob_tolerance: float = 0.0) -> list[str]:
    """Requests whose tokens differ between the arms of a sample, or whose chosen-token logprobs
    differ by more than ``logprob_tolerance`` (0: exactly equal)."""
    bad = []
    for stock, held in pairs(arms):
        for role, a, b in zip(stock.roles, stock.requests, held.requests):
            if a.output_token_ids != b.output_token_ids:
                bad.append(f"sample {stock.sample} {role}: tokens differ")
            elif len(a.logprobs) != len(b.logprobs) or max_logprob_delta(a, b) > logprob_tolerance:
                bad.append(f"sample {stock.sample} {role}: logprobs differ by {max_logprob_delta(a, b):.3g} "
                           f"(cached {a.num_cached_tokens} vs {b.num_cached_tokens} tokens)")
    return bad


def summarize_mode(arms: list[ArmRecord], logprob_tolerance: float) -> dict:
    """The figures results.json keeps for a run mode, all from its recorded arm-samples."""
    held = [a for a in arms if a.arm == "held"]
    return {"arms": arm_rows(arms), "samples": sample_rows(arms),
            "edges": [{"arm": a.arm, "sample": a.sample, **edges(a)} for a in arms],
            "ref_cnts_of_held_blocks": ref_trace(held[0]) if held else {},
            "token_mismatches": output_mismatches(arms, float("inf")),
            "logprob_mismatches": output_mismatches(arms, logprob_tolerance),
            "capture_records": sum(len(a.requests) for a in arms),
            "max_logprob_delta": max((max_logprob_delta(x, y) for s, h in pairs(arms)
                                      for x, y in zip(s.requests, h.requests)), default=0.0)}


def same_counts(a_arms: list[ArmRecord], b_arms: list[ArmRecord]) -> list[dict]:
    """Per arm-sample: do two engines give the same cached tokens and block operations?"""
    return [{"arm": a.arm, "sample": a.sample,
             "cached_equal": [r.num_cached_tokens for r in a.requests] == [r.num_cached_tokens for r in b.requests],
             "block_ops_equal": a.counts == b.counts} for a, b in zip(a_arms, b_arms)]


# -- the sweep --
def sweep_rows(pools: list[list[ArmRecord]]) -> list[dict]:
    """One row per pool of the sweep, by rising parent share of the usable pool."""
    rows = []
    for arms in pools:
        if not pairs(arms):
            continue
        stock, held = pairs(arms)[0]
        parent = stock.request("parent")
        n = hashed_blocks(parent.num_prompt_tokens, parent.num_output_tokens, stock.block_size)
        s = sample_rows(arms)[0]
        rows.append({"num_gpu_blocks": stock.num_gpu_blocks, "parent_share": round(n / (stock.num_gpu_blocks - 1), 4),
                     **{k: s[k] for k in ("child_cached_stock", "child_cached_held", "saved", "displaced", "net")},
                     "refused": held.controller.num_refused_blocks_cap if held.controller else None,
                     "evict_stock": s["evict_stock"], "evict_held": s["evict_held"]})
    return sorted(rows, key=lambda r: r["parent_share"])


def crossing(rows: list[dict]) -> float | None:
    """The parent share where saved first overtakes displaced (linear between sweep points)."""
    for a, b in zip(rows, rows[1:]):
        if a["net"] <= 0 < b["net"] or a["net"] > 0 >= b["net"]:
            t = a["net"] / (a["net"] - b["net"])
            return round(a["parent_share"] + t * (b["parent_share"] - a["parent_share"]), 4)
    return None


def in_words(values: dict) -> str:
    """A record's fields as a line a reader scans, ``dtype bfloat16; BATCH_INVARIANT True`` (a notebook's print of
    the dict showed its repr, braces and quotes, in the report)."""
    def word(v) -> str:
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple, set)) else str(v)

    return "; ".join(f"{k} {word(v)}" for k, v in values.items())


# -- writing raw/ --
def engine_info(engine, cfg) -> dict:
    import vllm

    return {"name": "vllm", "version": vllm.__version__, "mode": engine.mode,
            "device": cfg.DEVICE if engine.mode == "real" else "cpu", "block_size": engine.params.BLOCK_SIZE,
            "num_gpu_blocks": engine.params.NUM_GPU_BLOCKS, "model": cfg.MODEL}


def engine_settings(engine, cfg) -> dict:
    """The numerics the real engine ran with: dtype, the attention backends its layers use, batch invariance."""
    from kmesh_lib.engine.vllm_engine import engine_attention

    out = {"dtype": cfg.DTYPE, "ATTENTION_BACKEND": cfg.ATTENTION_BACKEND, "BATCH_INVARIANT": cfg.BATCH_INVARIANT,
           "BATCH_INVARIANT_NORM": cfg.BATCH_INVARIANT_NORM}
    if engine.mode == "real":
        out.update(engine_attention(engine.llm))
    return out


def _spans_events(r) -> list[list[dict]]:
    return [[{k: e[k] for k in ("step", "op", "block_ids", "ref_cnts")} for e in r.events if first <= e["step"] <= last]
            for first, last in r.spans]


def capture_records(runs, run_id: str, engine: dict) -> list[dict]:
    """``kmesh.capture/1`` records: one per request, with the block events of its steps."""
    records = []
    for r in runs:
        for role, res, events in zip(r.roles, r.results, _spans_events(r)):
            family = role in ("parent", "child")
            records.append(record_from_result(
                res, run_id=run_id, kind=role.split("/")[0].rstrip("0123456789"), engine=engine,
                clock_domain=CLOCK_DOMAIN, family_id=r.family_id if family else None,
                parent_id=r.request_id("parent") if role == "child" else None, block_events=events,
                extra={"arm": r.arm, "sample": r.sample, "role": role}))
    return records


def record_mode(record, label: str, runs, engine: dict) -> dict:
    """Writes a run mode's requests, block events and capture (which names the engine) to ``raw/``, and
    saves what only the live run knew (``tables.LIVE_MODE``: the controller's counters, the live drain
    checks) under the mode's name, where ``record.save_tables(section.TABLES)`` keeps them beside the
    table it builds from raw/."""
    record.append_jsonl("requests.jsonl", [
        {"mode": label, "arm": r.arm, "sample": r.sample, "role": role, "request_id": x.request_id,
         "prompt_token_ids": x.prompt_token_ids, "output_token_ids": x.output_token_ids, "logprobs": x.logprobs,
         "num_cached_tokens": x.num_cached_tokens, "finish_reason": x.finish_reason}
        for r in runs for role, x in zip(r.roles, r.results)])
    record.append_jsonl("block_events.jsonl", [{"arm": f"{label}/{r.arm}/s{r.sample}", **e} for r in runs for e in r.events])
    write_capture(record.run_dir / "raw" / f"capture.{label}.jsonl", capture_records(runs, record.results["run_id"], engine))
    return record.save(label, {"controller": [r.controller for r in runs if r.arm == "held"],
                               "all_drained": all(r.drain_ok and r.reset_ok and r.clean_start for r in runs)})


def record_sweep(record, pools: list) -> None:
    """Writes the sweep's arm-samples to ``raw/sweep.jsonl`` (token counts, no token ids); its rows and
    crossing are ``record.save_tables(section.TABLES)``'s, built from what the file holds."""
    record.append_jsonl("sweep.jsonl", [
        {"num_gpu_blocks": r.num_gpu_blocks, "block_size": r.block_size, "arm": r.arm, "sample": r.sample,
         "controller": r.controller or None, "live_drain_ok": r.drain_ok and r.reset_ok,
         "requests": [{"role": role, "request_id": x.request_id, "num_prompt_tokens": x.num_prompt_tokens,
                       "num_output_tokens": len(x.output_token_ids), "num_cached_tokens": x.num_cached_tokens,
                       "finish_reason": x.finish_reason, "block_events": events}
                      for role, x, events in zip(r.roles, r.results, _spans_events(r))]}
        for runs in pools for r in runs])
