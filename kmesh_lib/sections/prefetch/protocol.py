"""Section 20's engine run: one engine + one LMCache tier, pilot and/or confirmation pairs.

Arms (LMCache keeps its copy in every arm: retention on, so a group reads the disk tier once)::

    arm          the context at T (scheduled arrival)                   preparation
    on_arrival   LMCache's disk tier only                               none: the follow-ups' lookups load it
    early        prepared from T - lead (readiness recorded)             MP: HTTP prefetch + warm-up; in-process: warm-up only
    early_fixed  the same, from T - FIXED_LEAD_MS (section 16's start)  the same
    dram         LMCache's memory tier (restored into vLLM after T)     warm-up, settle, vLLM prefix cache reset (not timed)
    engine       vLLM's prefix cache (the floor)                        warm-up, settle (not timed)

Before every group (not timed): vLLM's prefix cache is reset, LMCache's memory copy dropped (the
context back to disk-only), the tier settled. Arms of a pair share the suffixes and run back to
back, in alternating order. The engine, tier and context store are ``workloads.context_groups.Block``'s.

A group's status: ``tier_error`` (a chunk found no arena space or was gone from the disk tier),
``not_placed`` (a placement control did not hold the context at T), ``recomputed`` (a follow-up
found fewer than ``expected_cached_tokens`` -- the context's full blocks -- cached, so it recomputed
what the arm was to provide; the group leaves the paired tables), else ``ok``.

An engine run's summary (``raw/blocks.jsonl``) is ``running`` until its last statement: ``ok``
when every group ran, ``failed`` with the error when it raised (recorded, then re-raised). Only an
``ok`` run is finished; a resumed driver runs any other again (``sections.prefetch.gpu``).
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

from kmesh_lib.engine.requests import run_group
from kmesh_lib.lmcache.connect import TierError
from kmesh_lib.lmcache.disk_accounting import PhaseReads
from kmesh_lib.sections.prefetch.driver import MPPrefetcher, drive, readiness
from kmesh_lib.sections.prefetch.params import PrefetchParams
from kmesh_lib.sections.prefetch.stats import choose_lead
from kmesh_lib.workloads.context_arms import pair_order
from kmesh_lib.workloads.context_groups import Block

EARLY_ARMS = ("early", "early_fixed")
PLACEMENT_ARMS = ("dram", "engine")
PREP_LABEL = {"mp": "http_prefetch+warmup", "inproc": "warmup_only"}


def engine_model_name(engine) -> str:
    """The model path vLLM registered with LMCache (the MP prefetch API's ``model_name``)."""
    eng = engine.llm.llm_engine
    cfg = getattr(eng, "model_config", None) or eng.vllm_config.model_config
    return cfg.model


class PrefetchRun(Block):
    """One fresh engine run: ``pilot(leads)`` then ``confirm(arms, pairs)``, records to ``raw/``."""

    def __init__(self, cfg, path: str, group_size: int, run_index: int, log=print) -> None:
        super().__init__(cfg, path, group_size, log)
        self.run_index = run_index
        self.name = f"{path}-N{group_size}-r{run_index}"
        self.summary.update(block=self.name, run_index=run_index)
        self._pair = 0

    def prefetcher(self):
        if self.path != "mp":
            return None
        return MPPrefetcher(self.tier.server, engine_model_name(self.engine), poll_s=self.cfg.PREFETCH_POLL_MS / 1e3)

    def reset(self) -> None:
        if not self.engine.reset_prefix_cache():
            raise TierError("vLLM refused to reset its prefix cache between groups")
        self.tier.drop_memory_copy()
        self.tier.set_retention(True)
        self.tier.settle()

    def next_pair(self) -> int:
        self._pair += 1
        return self.run_index * 10_000 + self._pair

    # -- phases --
    def pilot(self, leads_ms: list[float], groups: int, record=None) -> list[dict]:
        recs = []
        for g in range(groups):
            pair = self.next_pair()
            for lead in (leads_ms if g % 2 == 0 else list(reversed(leads_ms))):
                recs.append(self.group("early", lead / 1e3, pair, 0, "pilot"))
            self.log(f"{self.name} pilot {g}: " + ", ".join(
                f"{r['lead_ms']:.0f} ms {'ready' if r['ready'] else 'late'} A {r['wait_a_s'] * 1e3:.0f} ms"
                for r in recs[-len(leads_ms):]))
            if record is not None:
                record.append_jsonl("groups.jsonl", recs[-len(leads_ms):])
        self.groups += recs
        return recs

    def confirm(self, arms: list[tuple[str, float]], pairs: int, warmup_pairs: int, record=None) -> list[dict]:
        """``arms``: (arm, lead_s) in pair order; ``warmup_pairs`` unmeasured pairs first."""
        recs = []
        for p in range(warmup_pairs + pairs):
            pair = self.next_pair()
            order = pair_order([f"{a}@{lead}" for a, lead in arms], p)
            out = []
            for i, key in enumerate(order):
                arm, lead = key.split("@")
                out.append(self.group(arm, float(lead), pair, i, "confirm" if p >= warmup_pairs else "warmup"))
            self.log(f"{self.name} pair {p}{'' if p >= warmup_pairs else ' (warm-up)'}: " + ", ".join(
                f"{r['arm']} A {r['wait_a_s'] * 1e3:.0f} ms" + ("" if r["ready"] in (None, True) else " late")
                for r in out))
            if record is not None:
                record.append_jsonl("groups.jsonl", out)
            recs += out
        self.groups += recs
        return recs

    # -- one group --
    def group(self, arm: str, lead_s: float, pair: int, order: int, phase: str) -> dict:
        engine, tier, cfg, wl = self.engine, self.tier, self.cfg, self.workload
        tag = f"{self.name}-p{pair}-{arm}-{int(lead_s * 1e3)}"
        self.reset()
        s0 = tier.meter.snapshot()
        placed = {}
        if arm in PLACEMENT_ARMS:
            warm = run_group(engine, [wl.warm_up(tag, pair)])[0]
            engine.drain()
            tier.settle()
            if arm == "dram" and not engine.reset_prefix_cache():
                raise TierError("vLLM refused to reset its prefix cache for the dram control")
            placed = {"warmup_cached_tokens": warm.num_cached_tokens, "memory_tier_bytes_at_arrival": tier.memory_bytes()}
        follow = wl.followups(tag, pair, self.group_size)
        if arm in EARLY_ARMS:
            timing = drive(engine, follow, lead_s, wl.warm_up(tag, pair), self.prefetcher(), wl.context,
                           poll_s=cfg.DRIVER_POLL_MS / 1e3)
        else:
            timing = drive(engine, follow, poll_s=cfg.DRIVER_POLL_MS / 1e3)
        engine.drain()
        tier.settle()
        reads = PhaseReads.between(s0, tier.meter.snapshot(), self.chunk_bytes)
        expected = self.expected_warm_cached()
        ready = None
        if arm in EARLY_ARMS:
            ready = readiness(lead_s, timing.t_arrival_ns, expected, timing.prefetch, timing.warmup, PREP_LABEL[self.path])
        status, detail = "ok", ""
        if arm == "engine" and placed["warmup_cached_tokens"] != expected:
            status, detail = "not_placed", f"warm-up found {placed['warmup_cached_tokens']} of {expected} tokens"
        if arm == "dram" and placed["memory_tier_bytes_at_arrival"] < self.context_bytes:
            status, detail = "not_placed", f"memory tier held {placed['memory_tier_bytes_at_arrival']} bytes at T"
        if reads.oom_chunks or reads.missing_chunks:
            status, detail = "tier_error", f"{reads.oom_chunks} chunks without arena space, {reads.missing_chunks} missing"
        cached = [r.num_cached_tokens for r in timing.results]
        if status == "ok" and min(cached) < expected:
            status = "recomputed"
            detail = f"{sum(c < expected for c in cached)} follow-up(s) found {min(cached)} of {expected} context tokens cached"
        rel = timing.t_arrival_ns
        return {
            "block": self.name, "path": self.path, "group_size": self.group_size, "run_index": self.run_index,
            "arm": arm, "lead_ms": round(lead_s * 1e3, 3), "pair": pair, "order": order, "phase": phase,
            "measured": phase == "confirm", "status": status, "detail": detail,
            "prep": PREP_LABEL[self.path] if arm in EARLY_ARMS else ("none" if arm == "on_arrival" else "placed, untimed"),
            "ready": None if ready is None else ready.ready, "readiness": None if ready is None else ready.to_dict(),
            "prefetch": None if timing.prefetch is None else vars(timing.prefetch) | {
                "submit_s": (timing.prefetch.submit_ns - rel) / 1e9 if timing.prefetch.submit_ns else None,
                "done_s": (timing.prefetch.done_ns - rel) / 1e9 if timing.prefetch.done_ns else None},
            **placed,
            "wait_a_s": timing.wait_a_s(), "makespan_s": timing.makespan_s(cfg.MAX_TOKENS),
            "submit_delay_s": timing.submit_delay_s(),
            "first_token_s": [(r.t_first_token_ns - rel) / 1e9 for r in timing.results],
            "num_cached_tokens": cached, "expected_cached_tokens": expected,
            "num_output_tokens": [len(r.output_token_ids) for r in timing.results],
            "loop_iterations": timing.loop_iterations, "idle_waits": timing.idle_waits, "stamps": timing.stamps,
            "disk_bytes": reads.hook_bytes if reads.hook_bytes is not None else reads.device_bytes,
            "context_bytes": self.context_bytes, "context_tokens": cfg.CONTEXT_TOKENS,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }


def run_engine(cfg, path: str, n: int, run_index: int, lead_ms: float | None, record=None,
               log=print) -> tuple[list[dict], dict]:
    """One fresh engine run. ``lead_ms`` None: the pilot runs first and picks the early arm's lead
    (``stats.choose_lead``); otherwise the confirmation uses ``lead_ms``."""

    run = PrefetchRun(cfg, path, n, run_index, log=log)
    t0 = time.monotonic()
    try:
        run.start()
        if lead_ms is None:
            lead_ms = choose_lead(run.pilot(cfg.LEADS_MS, cfg.PILOT_GROUPS, record), cfg.LEADS_MS)
        run.summary["lead_ms"] = lead_ms
        run.confirm(confirm_arms(cfg, lead_ms), cfg.pairs_per_run, cfg.WARMUP_PAIRS, record)
        run.summary["status"] = "ok"
    except Exception as e:
        run.summary.update(status="failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        run.close()
        run.summary["seconds"] = round(time.monotonic() - t0, 1)
        if record is not None:
            record.append_jsonl("blocks.jsonl", run.summary)
    return run.groups, run.summary


def confirm_arms(cfg: PrefetchParams, lead_ms: float) -> list[tuple[str, float]]:
    """(arm, lead_s) in pair order; ``early_fixed`` only when the chosen lead is not the fixed one."""
    arms = [("on_arrival", 0.0), ("early", lead_ms / 1e3)]
    if lead_ms != cfg.FIXED_LEAD_MS:
        arms.append(("early_fixed", cfg.FIXED_LEAD_MS / 1e3))
    return arms + [(c, 0.0) for c in cfg.CONTROLS]
