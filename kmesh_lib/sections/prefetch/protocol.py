"""Section 20's engine run: one engine + one tier, pilot, singleflight contrast and confirmation pairs.

Arms (the tier keeps its copy in every arm: retention on, so a group reads the disk tier once)::

    arm          the context at T (scheduled arrival)                   preparation
    on_arrival   the tier's disk tier only                              none: the follow-ups' lookups load it
    early        prepared from T - lead (readiness recorded)            MP: HTTP prefetch + warm-up; GPU buffer: the
                                                                        tier's prefetch + warm-up; in-process and
                                                                        vLLM's own tiers (native): warm-up only
    early_fixed  the same, from T - FIXED_LEAD_MS (section 16's start)  the same
    dram         the tier's memory copy (LMCache's; vLLM's CPU tier)    warm-up, settle, vLLM prefix cache reset (not timed)
    buffer       the GPU buffer's copy (``dram`` on the gpubuf path)    the same
    resident     vLLM's prefix cache (already in vLLM's KV)             warm-up, settle (not timed)

MP paths: every group runs with the singleflight setting SINGLEFLIGHT[0] (on: a lookup that overlaps
an in-flight load of the same chunks waits for it, so an on-arrival group reads the context once);
the first engine run of each group size also runs CONTRAST_GROUPS on-arrival groups under each
further setting (phase ``contrast``, never paired). MP servers run with the warm-store guard set to
WARM_STORE_GUARD (``lmcache.server_plugin.WarmStoreGuard``: LMCache 0.5.3 would hand a warm
prefetch's keys to its store controller, which under skip_l1 drops them from L1; the engine run's
``lmcache_server.hooks`` says whether it installed). MP groups record the server-side lookup trace
(``lookups``, per phase summaries, each lookup's mechanism); GPU-buffer groups record every restore
and prefetch, split (``restores``: lookup, disk read, staging, copy, to the first token). Every group
records the disk-tier bytes it wrote (``disk_write_bytes``) beside those it read.

Before every group (not timed): vLLM's prefix cache is reset, the tier's memory copy dropped (the
context back to disk-only), the singleflight set, the tier settled. Arms of a pair share the
suffixes and run back to back, in alternating order. The engine, tier and context store are
``workloads.context_groups.Block``'s.

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
from kmesh_lib.lmcache.lookups import READS, summarize
from kmesh_lib.sections.prefetch.captures import PrefetchGroup, as_groups
from kmesh_lib.sections.prefetch.driver import BufferPrefetcher, MPPrefetcher, drive, readiness
from kmesh_lib.sections.prefetch.params import PrefetchParams
from kmesh_lib.sections.prefetch.stats import choose_lead, placement_arm
from kmesh_lib.workloads.context_arms import pair_order
from kmesh_lib.workloads.context_groups import Block, restore_split
from kmesh_lib.workloads.context_params import MP_PATHS

EARLY_ARMS = ("early", "early_fixed")
PLACEMENT_ARMS = ("dram", "buffer", "resident")
PREP_LABEL = {"mp": "http_prefetch+warmup", "mp-striped": "http_prefetch+warmup", "inproc": "warmup_only",
              "gpubuf": "buffer_prefetch+warmup", "native": "warmup_only"}


def engine_model_name(engine) -> str:
    """The model path vLLM registered with LMCache (the MP prefetch API's ``model_name``)."""
    eng = engine.llm.llm_engine
    cfg = getattr(eng, "model_config", None) or eng.vllm_config.model_config
    return cfg.model


class PrefetchRun(Block):
    """One fresh engine run: ``pilot(leads)``, ``contrast(...)`` then ``confirm(arms, pairs)``, records to ``raw/``.

    Retention is on in every arm, so its tier is a ``retain`` one (a stock server: ``--l2-prefetch-policy retain``).
    """

    def __init__(self, cfg, path: str, group_size: int, run_index: int, log=print) -> None:
        super().__init__(cfg, path, group_size, log, arms=("retain",), name=f"{path}-N{group_size}-r{run_index}")
        self.run_index = run_index
        self.summary.update(run_index=run_index)
        self._pair = 0

    def begin(self) -> None:
        """The tier (``Block.begin``), with the warm-store guard set before its server is started."""
        super().begin()
        if self.path in MP_PATHS:
            self.tier.set_warm_store_guard(self.cfg.WARM_STORE_GUARD)

    def prefetcher(self):
        if self.path in MP_PATHS:
            return MPPrefetcher(self.tier.server, engine_model_name(self.engine), poll_s=self.cfg.PREFETCH_POLL_MS / 1e3)
        if self.path == "gpubuf":
            return BufferPrefetcher(self.tier)
        return None

    def reset(self, singleflight: bool | None) -> None:
        if not self.engine.reset_prefix_cache():
            raise TierError("vLLM refused to reset its prefix cache between groups")
        self.tier.drop_memory_copy()
        self.tier.set_retention(True)
        if singleflight is not None:
            self.tier.set_singleflight(singleflight)
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

    def contrast(self, settings: list[bool], groups: int, record=None) -> list[dict]:
        """On-arrival groups under each further singleflight setting (phase ``contrast``, never paired):
        what the confirmation's setting changes about the reads and the recomputes."""
        recs = []
        for sf in settings:
            for g in range(groups):
                recs.append(self.group("on_arrival", 0.0, self.next_pair(), 0, "contrast", singleflight=sf))
                r = recs[-1]
                self.log(f"{self.name} contrast singleflight {'on' if sf else 'off'} {g}: A {r['wait_a_s'] * 1e3:.0f} ms, "
                         f"{r['disk_bytes'] / r['context_bytes']:.2f} context reads, cached {r['num_cached_tokens']}")
                if record is not None:
                    record.append_jsonl("groups.jsonl", [r])
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
    def group(self, arm: str, lead_s: float, pair: int, order: int, phase: str, singleflight: bool | None = None) -> dict:
        engine, tier, cfg, wl = self.engine, self.tier, self.cfg, self.workload
        tag = f"{self.name}-p{pair}-{arm}-{int(lead_s * 1e3)}"
        if self.path in MP_PATHS:
            singleflight = cfg.SINGLEFLIGHT[0] if singleflight is None else singleflight
        self.reset(singleflight)
        s0 = tier.meter.snapshot()
        placed, warm = {}, None
        if arm in PLACEMENT_ARMS:
            warm = run_group(engine, [wl.warm_up(tag, pair)])[0]
            engine.drain()
            tier.settle()
            if arm != "resident" and not engine.reset_prefix_cache():
                raise TierError(f"vLLM refused to reset its prefix cache for the {arm} control")
            placed = {"warmup_cached_tokens": warm.num_cached_tokens, "memory_tier_bytes_at_arrival": tier.memory_bytes()}
        s_arrival = tier.meter.snapshot()
        placed_restores = tier.take_restores() if self.path == "gpubuf" else []
        follow = wl.followups(tag, pair, self.group_size)
        pattern = cfg.arrivals[0]
        spacing = {"spacing_ms": pattern.spacing_ms, "spacing_steps": pattern.spacing_steps}
        prefetcher = self.prefetcher() if arm in EARLY_ARMS else None
        if arm in EARLY_ARMS:
            warm_spec = wl.warm_up(tag, pair)
            timing = drive(engine, follow, lead_s, warm_spec, prefetcher, wl.context,
                           poll_s=cfg.DRIVER_POLL_MS / 1e3, **spacing)
        else:
            warm_spec = None
            timing = drive(engine, follow, poll_s=cfg.DRIVER_POLL_MS / 1e3, **spacing)
        engine.drain()
        tier.settle()
        s1 = tier.meter.snapshot()
        reads = PhaseReads.between(s0, s1, self.chunk_bytes)
        expected = self.expected_warm_cached()
        ready = None
        if arm in EARLY_ARMS:
            ready = readiness(lead_s, timing.t_arrival_ns, expected, timing.prefetch, timing.warmup, PREP_LABEL[self.path])
        status, detail = "ok", ""
        if arm == "resident" and placed["warmup_cached_tokens"] != expected:
            status, detail = "not_placed", f"warm-up found {placed['warmup_cached_tokens']} of {expected} tokens"
        if arm in ("dram", "buffer") and placed["memory_tier_bytes_at_arrival"] < self.context_bytes:
            status, detail = "not_placed", f"memory tier held {placed['memory_tier_bytes_at_arrival']} bytes at T"
        if reads.oom_chunks or reads.missing_chunks:
            status, detail = "tier_error", f"{reads.oom_chunks} chunks without arena space, {reads.missing_chunks} missing"
        cached = [r.num_cached_tokens for r in timing.results]
        if status == "ok" and min(cached) < expected:
            status = "recomputed"
            detail = f"{sum(c < expected for c in cached)} follow-up(s) found {min(cached)} of {expected} context tokens cached"
        rel = timing.t_arrival_ns
        extra = self.lookup_phases(s0, s_arrival, s1, follow, warm_spec, rel)
        if self.path == "gpubuf":
            extra.update(self.buffer_records(placed_restores, prefetcher, timing, follow, warm_spec, rel))
        return {
            "block": self.name, "path": self.path, "group_size": self.group_size, "run_index": self.run_index,
            "arm": arm, "lead_ms": round(lead_s * 1e3, 3), "pair": pair, "order": order, "phase": phase,
            "measured": phase == "confirm", "status": status, "detail": detail, "singleflight": singleflight,
            "warm_store_guard": cfg.WARM_STORE_GUARD if self.path in MP_PATHS else None,
            "arrival": pattern.label, "lookup": tier.lookup,
            "prep": PREP_LABEL[self.path] if arm in EARLY_ARMS else ("none" if arm == "on_arrival" else "placed, untimed"),
            "ready": None if ready is None else ready.ready, "readiness": None if ready is None else ready.to_dict(),
            "prefetch": None if timing.prefetch is None else vars(timing.prefetch) | {
                "submit_s": (timing.prefetch.submit_ns - rel) / 1e9 if timing.prefetch.submit_ns else None,
                "done_s": (timing.prefetch.done_ns - rel) / 1e9 if timing.prefetch.done_ns else None},
            **placed,
            "wait_a_s": timing.wait_a_s(), "makespan_s": timing.makespan_s(cfg.MAX_TOKENS),
            "submit_delay_s": timing.submit_delay_s(),
            "submit_ms": [round((r.t_submit_ns - rel) / 1e6, 3) for r in timing.results],
            "first_token_s": [(r.t_first_token_ns - rel) / 1e9 for r in timing.results],
            "num_cached_tokens": cached, "expected_cached_tokens": expected,
            "num_output_tokens": [len(r.output_token_ids) for r in timing.results],
            "loop_iterations": timing.loop_iterations, "idle_waits": timing.idle_waits, "stamps": timing.stamps,
            "disk_bytes": reads.hook_bytes if reads.hook_bytes is not None else reads.device_bytes,
            "disk_write_bytes": reads.written_bytes,
            "reads": reads.to_dict(), "chunk_bytes": self.chunk_bytes,
            "context_bytes": self.context_bytes, "context_tokens": cfg.CONTEXT_TOKENS, **extra,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def lookup_phases(self, s0, s_arrival, s1, follow, warm_spec, t0_ns: int) -> dict:
        """MP launcher servers: the lookups of the placement (before T) and of the group (from T), classified."""
        if not hasattr(self.tier, "lookups") or not getattr(self.tier.meter, "hooked", False):
            return {}
        roles = {s.request_id: s.request_id.rsplit("-", 1)[-1] for s in follow}
        if warm_spec is not None:
            roles[warm_spec.request_id] = "warmup"
        placement, group = self.tier.lookups(s0, s_arrival, roles), self.tier.lookups(s_arrival, s1, roles)
        letters = [s.request_id.rsplit("-", 1)[-1] for s in follow]
        return {"placement_lookup_summary": summarize(placement), "lookups": [lk.to_dict(t0_ns) for lk in group],
                "lookup_summary": summarize(group), "store_events": self.tier.store_events(s0, s1),
                "followup_disk_reads": {x: sum(lk.role == x and lk.mechanism in READS for lk in group) for x in letters}}

    def buffer_records(self, placed_restores, prefetcher, timing, follow, warm_spec, t0_ns: int) -> dict:
        """The GPU buffer: every restore (placement, group) and the prefetch, split (``restore_split``)."""
        roles = {s.request_id: s.request_id.rsplit("-", 1)[-1] for s in follow}
        if warm_spec is not None:
            roles[warm_spec.request_id] = "warmup"
        first = {r.request_id: r.t_first_token_ns for r in timing.results}
        if timing.warmup is not None:
            first[timing.warmup.request_id] = timing.warmup.t_first_token_ns
        group = [restore_split(r, t0_ns, first, roles) for r in self.tier.take_restores()]
        handle = getattr(prefetcher, "handle", None)
        if handle is not None and handle.timeline is not None:
            group.insert(0, restore_split(handle.record()["timeline"], t0_ns, first, roles))
        return {"placement_restores": [restore_split(r, t0_ns, {}, {}) for r in placed_restores], "restores": group}


def run_engine(cfg, path: str, n: int, run_index: int, lead_ms, record=None,
               log=print, before_gpu=None) -> tuple[list[dict], dict]:
    """One fresh engine run. ``lead_ms`` None: the pilot runs first and picks the early arm's lead
    (``stats.choose_lead``), then the singleflight contrast (MP); otherwise the confirmation uses
    ``lead_ms`` (a callable is asked after ``before_gpu``). ``before_gpu`` runs once the tier began
    (its server spawns) and before the engine starts."""

    run = PrefetchRun(cfg, path, n, run_index, log=log)
    t0 = time.monotonic()
    pilot_only = run_index < cfg.pilot_only_runs
    try:
        run.begin()
        if before_gpu is not None:
            before_gpu()
            t0 = time.monotonic()
        if callable(lead_ms):
            lead_ms = lead_ms()
        run.start()
        if pilot_only:  # LEAD_RULE=lower_bound: the pilot alone, its share of PILOT_GROUPS per lead
            run.pilot(cfg.LEADS_MS, cfg.PILOT_GROUPS // cfg.PILOT_ENGINE_RUNS, record)
            if run_index == 0 and path in MP_PATHS and cfg.CONTRAST_GROUPS:
                run.contrast(list(cfg.SINGLEFLIGHT[1:]), cfg.CONTRAST_GROUPS, record)
            run.summary.update(pilot_only=True, lead_ms=None, status="ok")
            return run.groups, run.summary
        if lead_ms is None:
            if cfg.pilot_only_runs:
                raise RuntimeError(f"{path} N={n} run {run_index}: the confirmation needs the lead its pilot runs chose")
            lead_ms = choose_lead(as_groups(run.pilot(cfg.LEADS_MS, cfg.PILOT_GROUPS, record)), cfg.LEADS_MS, cfg.LEAD_RULE)
            if path in MP_PATHS and cfg.CONTRAST_GROUPS:
                run.contrast(list(cfg.SINGLEFLIGHT[1:]), cfg.CONTRAST_GROUPS, record)
        run.summary["lead_ms"] = lead_ms
        run.confirm(confirm_arms(cfg, lead_ms, path), cfg.pairs_per_run, cfg.WARMUP_PAIRS, record)
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


def confirm_arms(cfg: PrefetchParams, lead_ms: float, path: str = "mp") -> list[tuple[str, float]]:
    """(arm, lead_s) in pair order; ``early_fixed`` only when the chosen lead is not the fixed one."""
    arms = [("on_arrival", 0.0), ("early", lead_ms / 1e3)]
    if lead_ms != cfg.FIXED_LEAD_MS:
        arms.append(("early_fixed", cfg.FIXED_LEAD_MS / 1e3))
    return arms + [(placement_arm(path, c), 0.0) for c in cfg.CONTROLS]


def lead_from_pilot(cfg, groups: list[PrefetchGroup], path: str, n: int) -> float | None:
    """The lead the pilot-only runs of ``path`` and ``n`` chose (LEAD_RULE), once all of them recorded their groups;
    None while the pilot is incomplete."""
    pilot = [g for g in groups if g.phase == "pilot" and g.path == path and g.group_size == n]
    per_lead = {lead: sum(g.lead_ms == round(lead, 3) for g in pilot) for lead in cfg.LEADS_MS}
    if any(v < cfg.PILOT_GROUPS for v in per_lead.values()):
        return None
    return choose_lead(pilot, cfg.LEADS_MS, cfg.LEAD_RULE)
