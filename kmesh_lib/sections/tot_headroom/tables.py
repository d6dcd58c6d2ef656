"""Section 19's declared result (``base.declared``): every table results.json holds, from ``raw/`` and the params.

- ``policy``: the policy's label (``params.policy_label``);
- ``search``: the search replayed on the captured outputs (its counters), the outcomes, each call's
  seconds from the capture's stamps, the engine's block operations and the events no invocation
  claimed; ``partial``, ``limit_hit`` (a run-ceiling or time limit is met only live),
  ``engine_start_s``, ``search_s`` (wall-clock) and ``drain_ok`` (the live pool's report) are ``live``;
- ``bound`` and ``sweep``: the ideal bound and LRU at the run's pool and at every bound pool size,
  from the capture (``bound``);
- ``stock_sweep`` and ``scale_searches``: the stock-versus-ideal rows from the replay arms, with
  each scale trace re-derived from the script (``checks.arm_tables``);
- ``arms_s``: the replay arms' wall-clock seconds, recorded only.

The search and the scale traces need the model's tokenizer; where it is not on this machine those
tables are ``NotRecomputable`` (listed recorded only, with why).
"""
from __future__ import annotations

from kmesh_lib.base.declared import NotRecomputable, Table, recorded_only
from kmesh_lib.base.records import RunFiles
from kmesh_lib.engine.model_spec import resolve, tokenizer_for
from kmesh_lib.sections.tot_headroom import bound
from kmesh_lib.sections.tot_headroom.captures import TotInvocation
from kmesh_lib.sections.tot_headroom.checks import arm_tables_of, replay_search
from kmesh_lib.sections.tot_headroom.params import (
    BLOCK_EVENTS,
    CAPTURE,
    ENGINE_TRACE,
    OUTCOMES,
    STOCK_SWEEP,
    bound_pool_sizes,
    policy_label,
)
from kmesh_lib.workloads.tot_search import COUNT_NAMES

OPS = ("alloc", "touch", "free", "evict", "hold", "release")
LIVE_SEARCH = ("partial", "limit_hit", "engine_start_s", "search_s", "drain_ok")


def policy_table(run: RunFiles) -> str:
    return policy_label(run.params)


def invocation_seconds(records: list[TotInvocation]) -> dict:
    """Median and longest call, submission to finish (to submission for a call that never finished)."""
    seconds = sorted((r.t_finish_ns or r.t_submit_ns) - r.t_submit_ns for r in records)
    return {"median": round(seconds[len(seconds) // 2] / 1e9, 1) if seconds else None,
            "max": round(seconds[-1] / 1e9, 1) if seconds else None}


def search_table(run: RunFiles) -> dict:
    """The engine run's search, from its capture, outcomes and block events (its ``LIVE_SEARCH`` fields recorded)."""
    replay = replay_search(run, run.params)
    if replay.search is None:
        if replay.error:
            raise ValueError(f"the search does not replay on the capture: {replay.error}")
        raise NotRecomputable(replay.why)
    records, whole = run.records(CAPTURE), run.records(BLOCK_EVENTS)
    return {"invocation_s": invocation_seconds(records),
            "counts": {k: replay.search.counts[k] for k in COUNT_NAMES},
            "block_ops": {op: sum(len(e.block_ids) for e in whole if e.op == op) for op in OPS},
            "num_unattributed_block_events": len(whole) - sum(len(r.block_events or []) for r in records),
            "outcomes": [o.table_row() for o in run.records(OUTCOMES)]}


def bound_table(run: RunFiles) -> dict:
    cfg = run.params
    return bound.compare_bound(run.records(CAPTURE), cfg.BLOCK_SIZE, cfg.NUM_GPU_BLOCKS - 1)


def sweep_table(run: RunFiles) -> list[dict]:
    cfg = run.params
    observed = bound_table(run)["observed_prefill_tokens"]
    return bound.sweep(run.records(CAPTURE), cfg.BLOCK_SIZE, bound_pool_sizes(cfg), {cfg.NUM_GPU_BLOCKS - 1: observed})


def _arm_tables(run: RunFiles):
    cfg = run.params
    arms = run.records(STOCK_SWEEP)
    tokenizer = None
    if any(a.trace != ENGINE_TRACE for a in arms):
        try:
            tokenizer = tokenizer_for(resolve(cfg.MODEL))
        except ValueError as e:
            raise NotRecomputable(f"the scale traces are re-derived with the model's tokenizer, not here: {e}") from None
    return arm_tables_of(run, cfg, tokenizer)


def stock_sweep_table(run: RunFiles) -> list[dict]:
    return _arm_tables(run).stock_sweep


def scale_searches_table(run: RunFiles) -> list[dict]:
    return _arm_tables(run).scale_searches


TABLES = {
    "policy": Table(policy_table),
    "search": Table(search_table, live=LIVE_SEARCH),
    "bound": Table(bound_table),
    "sweep": Table(sweep_table),
    "stock_sweep": Table(stock_sweep_table),
    "scale_searches": Table(scale_searches_table),
    "arms_s": recorded_only("wall-clock seconds of every replay arm"),
}

__all__ = ["LIVE_SEARCH", "TABLES", "invocation_seconds", "search_table"]
