"""The retention protocol: one engine per (path, group size), paired groups in alternating order.

One group (external arms)::

    reset vLLM's prefix cache; LMCache back to disk-only; retention switch set      (not timed)
    snapshot ─ warm-up = context + 1 token, max_tokens=1 ─ snapshot ─ wait out the head start
    follow-ups A..N submitted by the arrival pattern (context + own suffix, MAX_TOKENS each) ─ drain ─ snapshot
              ^ both stopwatches start here: A's first token, and every request's last token

Arrival patterns (``ArrivalPattern``; parameter ``FOLLOWUP_ARRIVALS``): ``together`` submits A..N
in one go; ``<x>ms`` submits follow-up i at i*x ms after A; ``<k>step`` submits follow-up i once
the engine has run i*k steps that produced tokens since A (``1step``: a full decode step apart).
The engine is stepped in this process, so a submission lands between steps; the server stamps
when each lookup actually arrived, and on the MP path each group records what every lookup did
(``lmcache.lookups``: read the disk tier, or joined / waited for an in-flight load, or found L1).

The preparation phase is the warm-up; the follow-up phase starts at the follow-ups' submission.
A group is ``ok`` when its warm-up finished within the head start having loaded the whole context
(``not_warm`` otherwise), every chunk found arena space (``arena_short`` otherwise) and the disk
tier still had every chunk (``disk_missing`` otherwise). A pair
with a group that is not ``ok`` is recorded and replaced, up to MAX_RETRY_PAIRS times; only ``ok``
measured groups enter the tables. A disk tier that cannot take the context (``DiskTierFull``)
ends the block before any group: it is reported as such, with no latency.
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import string
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import Field

from kmesh_lib.base import topology
from kmesh_lib.base.params import PathText, check, params_dataclass
from kmesh_lib.base.processes import RUNTIME_ROOT, RuntimeDir, group_alive, listening_sockets
from kmesh_lib.base.records import read_jsonl
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.engine.requests import RequestResult, RequestSpec, group_makespan_s, record_step, run_group
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.disk_tier import DiskTierFull, check_disk_tier
from kmesh_lib.lmcache.connect import InprocTier, MPTier, TierError, keep_engine_rendezvous_local
from kmesh_lib.lmcache.disk_accounting import MIB, NullMeter, PhaseReads
from kmesh_lib.lmcache.lookups import READS, summarize
from kmesh_lib.workloads.context_arms import ARMS, CONTROL_ARMS, EXTERNAL_ARMS, pair_order

DISK_HEADROOM_BYTES = 64 * MIB


@dataclass(frozen=True)
class ArrivalPattern:
    """When follow-up i (0 = A) is submitted: i * ``spacing_ms`` after A, or after i * ``spacing_steps``
    engine steps that produced tokens. Both 0: together."""

    spacing_ms: float = 0.0
    spacing_steps: int = 0

    SYNTAX = "'together', '<x>ms' (x >= 0, e.g. 2ms) or '<k>step' (k >= 1, e.g. 1step)"

    @classmethod
    def parse(cls, text: str) -> ArrivalPattern:
        """``together`` | ``<x>ms`` | ``<k>step(s)``; ValueError names the text and the syntax."""
        t = str(text).strip().lower()
        if t == "together":
            return cls()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*ms", t)
        if m:
            return cls(spacing_ms=float(m.group(1)))
        m = re.fullmatch(r"(\d+)\s*steps?", t)
        if m and int(m.group(1)) >= 1:
            return cls(spacing_steps=int(m.group(1)))
        raise ValueError(f"follow-up arrival {text!r}: expected {cls.SYNTAX}")

    @property
    def label(self) -> str:
        if self.spacing_steps:
            return f"{self.spacing_steps}step"
        return "together" if self.spacing_ms == 0 else f"{self.spacing_ms:g}ms"


@params_dataclass
class ContextGroupParams(EngineParams):
    """The shared-context group's LMCache-path parameters (sections 16 and 20 inherit these)."""

    FOLLOWUP_ARRIVALS: list[str] = Field(
        default_factory=lambda: ["together"], min_length=1,
        description="follow-up submission spacing per group: together, <x>ms or <k>step (see ArrivalPattern)")
    SINGLEFLIGHT: bool = Field(
        False, description="MP: a lookup overlapping an in-flight load of the same chunks waits for it")
    LMCACHE_SERVER: Literal["launcher", "stock"] = Field(
        "launcher", description="launcher: the stock server with kmesh hooks; stock: one server per arm, stock policies")
    STRIPED_STORE_ROOT: PathText = Field(
        "", description="an existing RAID 0 mount over >= 2 NVMe drives for the striped row (empty: none)")

    def check_rules(self) -> None:
        super().check_rules()
        for text in self.FOLLOWUP_ARRIVALS:
            try:
                ArrivalPattern.parse(text)
            except ValueError as e:
                check(False, f"FOLLOWUP_ARRIVALS: {e}")
        check(not (self.SINGLEFLIGHT and self.LMCACHE_SERVER == "stock"),
              "SINGLEFLIGHT=true needs LMCACHE_SERVER=launcher (the singleflight lives in the launcher's server hooks)")


def group_setting(cfg, name: str):
    """``cfg.<name>``, or ``ContextGroupParams``'s default for a config that does not inherit it yet."""
    return getattr(cfg, name) if hasattr(cfg, name) else getattr(ContextGroupParams(), name)


def striped_store_row(cfg, topo: dict | None = None) -> dict:
    """The striped-flash row: runs only on an existing RAID 0 mount over two or more NVMe drives.

    Returns ``{"path": "mp-striped", "status": "available" | "not available", "detail", "root"}``;
    the detail names the NVMe count and what is missing (``base.topology.striped_store``).
    """
    topo = topo if topo is not None else topology.describe()
    verdict = topology.striped_store(topo, group_setting(cfg, "STRIPED_STORE_ROOT") or None)
    return {"path": "mp-striped", "status": "available" if verdict["available"] else "not available",
            "detail": verdict["reason"], "root": verdict["root"], "nvme_count": topo.get("nvme_count", 0)}


def run_arrivals(engine, specs: list[RequestSpec], pattern: ArrivalPattern, clock=time.monotonic_ns,
                 sleep=time.sleep) -> list[RequestResult]:
    """Submits ``specs`` by ``pattern`` (A first) and steps ``engine`` until all of them finished.

    Stamps like ``engine.requests.run_group``: every token with ``clock()`` when its step returned.
    A step-spaced follow-up whose turn comes while the engine is idle (the earlier ones finished
    first) is submitted at once.
    """
    ids = [s.request_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate request ids in group: {ids}")
    results = {s.request_id: RequestResult(s.request_id, list(s.prompt_token_ids)) for s in specs}
    unfinished, submitted, token_steps = set(ids), 0, 0
    t0 = clock()

    def due(i: int) -> bool:
        if pattern.spacing_steps:
            return token_steps >= i * pattern.spacing_steps or not engine.has_unfinished()
        return clock() >= t0 + int(i * pattern.spacing_ms * 1e6)

    while unfinished:
        while submitted < len(specs) and due(submitted):
            spec = specs[submitted]
            results[spec.request_id].t_submit_ns = clock()
            engine.submit(spec)
            submitted += 1
        if not engine.has_unfinished():
            if submitted < len(specs):  # ms spacing: nothing to step until the next one is due
                sleep(max(0.0, (t0 + submitted * pattern.spacing_ms * 1e6 - clock()) / 1e9))
                continue
            raise RuntimeError(f"engine idle with unfinished requests {sorted(unfinished)}")
        outputs = engine.step()
        record_step(results, outputs, clock(), unfinished)
        token_steps += any(o.new_token_ids for o in outputs)
    return [results[i] for i in ids]


def letters(n: int) -> list[str]:
    """A, B, ... Z, then A1, B1, ...: the follow-ups in submission order (A is submitted first)."""
    return [string.ascii_uppercase[i % 26] + (str(i // 26) if i >= 26 else "") for i in range(n)]


@dataclasses.dataclass
class Workload:
    """The shared context and, per pair, the follow-ups' suffixes and the warm-up token."""

    cfg: object
    vocab_size: int

    def __post_init__(self) -> None:
        rng = random.Random(f"context-{self.cfg.SEED}")
        self.context = [rng.randrange(4, self.vocab_size) for _ in range(self.cfg.CONTEXT_TOKENS)]

    def _rng(self, pair: int) -> random.Random:
        return random.Random(f"pair-{self.cfg.SEED}-{pair}")

    def store_request(self) -> RequestSpec:
        tail = [self._rng(-1).randrange(4, self.vocab_size) for _ in range(self.cfg.SUFFIX_TOKENS)]
        return RequestSpec("store", self.context + tail, max_tokens=1)

    def warm_up(self, tag: str, pair: int) -> RequestSpec:
        return RequestSpec(f"{tag}-warmup", self.context + [self._rng(pair).randrange(4, self.vocab_size)], max_tokens=1)

    def followups(self, tag: str, pair: int, n: int) -> list[RequestSpec]:
        rng = self._rng(pair)
        rng.randrange(4, self.vocab_size)  # the warm-up's token
        return [RequestSpec(f"{tag}-{name}", self.context + [rng.randrange(4, self.vocab_size)
                                                             for _ in range(self.cfg.SUFFIX_TOKENS)],
                            max_tokens=self.cfg.MAX_TOKENS) for name in letters(n)]


def make_tier(cfg, path: str, runtime: RuntimeDir, stock_retain: bool = False):
    """The external tier of ``path``. MP: the server mode and singleflight from ``cfg``
    (``ContextGroupParams``); ``stock_retain`` picks a stock server's fixed policy."""
    if path == "mp":
        return MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime, device=cfg.DEVICE,
                      server_mode=group_setting(cfg, "LMCACHE_SERVER"), stock_retain=stock_retain,
                      singleflight=group_setting(cfg, "SINGLEFLIGHT"))
    if path == "inproc":
        return InprocTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, cfg.DISK_TIER_MIB, runtime)
    raise ValueError(f"unknown path {path!r}")


class Block:
    """One engine (and, for an external path, one tier) running every group of one group size.

    ``arrival``: the follow-ups' arrival pattern (default: the first of ``FOLLOWUP_ARRIVALS``;
    ``run_group`` takes another per group). ``arms``: the external arms to alternate (default both);
    a stock LMCache server (``LMCACHE_SERVER=stock``) has one fixed retention policy, so its block
    runs one external arm and its server is started with that arm's policy.
    """

    def __init__(self, cfg, path: str, group_size: int, log=print, arrival: ArrivalPattern | str | None = None,
                 arms: tuple[str, ...] | None = None) -> None:
        self.cfg, self.path, self.group_size, self.log = cfg, path, group_size, log
        self.name = f"{path}-N{group_size}"
        self.arms = EXTERNAL_ARMS if path != "engine" else tuple(a for a in CONTROL_ARMS if a in cfg.CONTROL_ARMS)
        if arms is not None:
            self.arms = tuple(arms)
        if path == "mp" and group_setting(cfg, "LMCACHE_SERVER") == "stock" and len(self.arms) != 1:
            raise ValueError(f"LMCACHE_SERVER=stock fixes one retention policy per server: run one block per arm "
                             f"(arms={self.arms})")
        text = arrival if arrival is not None else group_setting(cfg, "FOLLOWUP_ARRIVALS")[0]
        self.arrival = text if isinstance(text, ArrivalPattern) else ArrivalPattern.parse(text)
        self.tier = None
        self.engine = None
        # ``running`` until run() ends: ``ok``, ``disk_full``, or ``failed`` with the error it raised
        self.summary: dict = {"block": self.name, "path": path, "group_size": group_size, "status": "running"}
        self.groups: list[dict] = []

    # -- set-up --
    def start(self) -> None:
        cfg = self.cfg
        llm_kwargs = {}
        if self.path != "engine":
            root = cfg.DISK_TIER_ROOT or RUNTIME_ROOT
            runtime = RuntimeDir.create(f"retention-{self.path}", root=Path(root))
            self.tier = make_tier(cfg, self.path, runtime, stock_retain=bool(ARMS[self.arms[0]].retain))
            self.summary["disk_tier"] = check_disk_tier(self.tier.disk_dir, self.chunk_bytes,
                                                        self.context_bytes + DISK_HEADROOM_BYTES)
            self.tier.start()
            self.summary["connector"] = self.tier.connector
            if self.path == "mp":
                self.summary["listeners"] = [f"{a}:{p}" for a, p in self.tier.server.listeners()]
                self.summary["lmcache_server"] = self.tier.describe()
            llm_kwargs = self.tier.llm_kwargs(cfg.DEVICE)
        keep_engine_rendezvous_local()
        self.engine = make_engine(dataclasses.replace(cfg, MAX_NUM_SEQS=max(cfg.MAX_NUM_SEQS, self.group_size + 1)),
                                  **llm_kwargs)
        self.summary["engine_start_s"] = round(self.engine.start_s, 2)
        self.summary["engine_listeners"] = [f"{a}:{p}" for a, p in listening_sockets(pids=[os.getpid()])]
        self.workload = Workload(cfg, self.engine.spec.config["vocab_size"])
        if self.tier is not None:
            self.summary["store"] = self.store_context()

    @property
    def kv_bytes_per_token(self) -> int:

        return resolve(self.cfg.MODEL).kv_bytes_per_token(self.cfg.DTYPE)

    @property
    def chunk_bytes(self) -> int:
        return self.cfg.CHUNK_SIZE * self.kv_bytes_per_token

    @property
    def context_bytes(self) -> int:
        return self.cfg.CONTEXT_TOKENS * self.kv_bytes_per_token

    def store_context(self) -> dict:
        """Computes the context once; LMCache stores it to the disk tier (and keeps no memory copy)."""
        meter, n_chunks = self.tier.meter, self.cfg.CONTEXT_TOKENS // self.cfg.CHUNK_SIZE
        self.tier.set_retention(False)
        before = meter.snapshot()
        t0 = time.monotonic()
        run_group(self.engine, [self.workload.store_request()])
        self.engine.drain()
        self.tier.settle()
        self.tier.drop_memory_copy()
        after = meter.snapshot()
        written = after.hook_write_bytes - before.hook_write_bytes
        store = {"chunks": n_chunks, "bytes_written": written, "write_errors": after.hook_write_errors - before.hook_write_errors,
                 "disk_tier_bytes": after.disk_tier_bytes, "memory_tier_bytes": after.memory_tier_bytes,
                 "seconds": round(time.monotonic() - t0, 2)}
        if store["write_errors"] or written < self.context_bytes:
            free = shutil.disk_usage(self.tier.disk_dir).free
            raise DiskTierFull(f"the disk tier took {written / MIB:.1f} of {self.context_bytes / MIB:.1f} MiB of the shared "
                               f"context ({store['write_errors']} write errors, {free / MIB:.0f} MiB free at "
                               f"{self.tier.disk_dir})")
        return store

    # -- groups --
    def run(self, record=None) -> Block:
        try:
            self.start()
            self.run_pairs(record)
            self.summary["status"] = "ok"
        except DiskTierFull as e:
            self.summary.update(status="disk_full", detail=str(e))
            self.log(f"{self.name}: disk tier full: {e}")
        except Exception as e:
            self.summary.update(status="failed", error=f"{type(e).__name__}: {e}")
            raise
        finally:
            self.close()
            if record is not None:  # a raised run is recorded too, as failed (its groups so far are in raw/)
                record.append_jsonl("blocks.jsonl", self.summary)
        return self

    def run_pairs(self, record) -> None:
        cfg = self.cfg
        control = self.path == "engine"
        warmups = cfg.CONTROL_WARMUP_GROUPS if control else cfg.WARMUP_GROUPS
        measured = cfg.CONTROL_MEASURED_GROUPS if control else cfg.MEASURED_GROUPS
        done = retries = pair = 0
        while done < measured:
            is_measured = pair >= warmups
            recs = [self.run_group(ARMS[a], pair, order, is_measured) for order, a in enumerate(pair_order(self.arms, pair))]
            if record is not None:
                record.append_jsonl("groups.jsonl", recs)
            self.groups += recs
            ok = all(r["status"] == "ok" for r in recs)
            self.log(f"{self.name} pair {pair} ({'measured' if is_measured else 'warm-up'}): " + ", ".join(
                f"{r['arm']} A {r['ttft_a_s'] * 1e3:.0f} ms, all {r['makespan_s'] * 1e3:.0f} ms, "
                f"{r['status']}" for r in recs))
            pair += 1
            if is_measured:
                if ok:
                    done += 1
                elif retries < cfg.MAX_RETRY_PAIRS:
                    retries += 1
                else:
                    done += 1  # keep the not-ok pair: the table reports how many groups were usable
        self.summary.update(pairs=pair, retried_pairs=retries)

    def run_group(self, arm, pair: int, order: int, measured: bool, arrival: ArrivalPattern | None = None) -> dict:
        engine, tier, cfg = self.engine, self.tier, self.cfg
        arrival = arrival or self.arrival
        tag = f"{self.name}-p{pair}-{arm.name}"
        if not engine.reset_prefix_cache():
            raise TierError("vLLM refused to reset its prefix cache between groups")
        meter = tier.meter if arm.external else NullMeter()
        if arm.external:
            tier.drop_memory_copy()
            tier.set_retention(arm.retain)
            tier.settle()
        s0 = meter.snapshot()
        t0 = time.monotonic()
        warm_cached = None
        warm_spec = self.workload.warm_up(tag, pair)
        if arm.warm_up:
            warm_cached = run_group(engine, [warm_spec])[0].num_cached_tokens
        prep_s = time.monotonic() - t0
        if arm.external:
            tier.settle()
        s1 = meter.snapshot()
        if arm.head_start_bound:
            time.sleep(max(0.0, t0 + cfg.HEAD_START_S - time.monotonic()))
        follow_specs = self.workload.followups(tag, pair, self.group_size)
        results = run_arrivals(engine, follow_specs, arrival)
        engine.drain()
        if arm.external:
            tier.settle()
        s2 = meter.snapshot()
        prep = PhaseReads.between(s0, s1, self.chunk_bytes)
        follow = PhaseReads.between(s1, s2, self.chunk_bytes)
        status, detail = "ok", ""
        expected_warm = self.expected_warm_cached()
        if arm.head_start_bound and (prep_s > cfg.HEAD_START_S or warm_cached != expected_warm):
            status, detail = "not_warm", f"warm-up {prep_s:.3f} s, {warm_cached} of {expected_warm} tokens loaded"
        if prep.oom_chunks or follow.oom_chunks:
            status, detail = "arena_short", f"{prep.oom_chunks + follow.oom_chunks} chunk(s) found no arena space"
        if prep.missing_chunks or follow.missing_chunks:
            status, detail = "disk_missing", f"{prep.missing_chunks + follow.missing_chunks} chunk(s) gone from the disk tier"
        a = results[0]
        traced = self.lookup_records(s0, s1, s2, warm_spec, follow_specs, a.t_submit_ns) if arm.external else {}
        return {
            "block": self.name, "path": self.path, "group_size": self.group_size, "arm": arm.name, "pair": pair,
            "order": order, "measured": measured, "status": status, "detail": detail, **arm.describe(tier),
            "lookup": tier.lookup if arm.external else None,
            "context_tokens": cfg.CONTEXT_TOKENS, "context_bytes": self.context_bytes, "chunk_bytes": self.chunk_bytes,
            "chunk_tokens": cfg.CHUNK_SIZE,
            "prep_s": round(prep_s, 4), "warmup_cached_tokens": warm_cached,
            "ttft_a_s": a.first_token_s(), "makespan_s": group_makespan_s(results, cfg.MAX_TOKENS),
            "first_token_s": [r.first_token_s() for r in results],
            "last_token_s": [(r.nth_token_ns(cfg.MAX_TOKENS) - a.t_submit_ns) / 1e9 for r in results],
            "num_cached_tokens": [r.num_cached_tokens for r in results],
            "num_output_tokens": [len(r.output_token_ids) for r in results], "output_tokens": cfg.MAX_TOKENS,
            "arrival": arrival.label, "submit_ms": [round((r.t_submit_ns - a.t_submit_ns) / 1e6, 3) for r in results],
            "prep_reads": prep.to_dict(), "followup_reads": follow.to_dict(), **traced,
            "memory_tier_bytes_before": s0.memory_tier_bytes, "memory_tier_bytes_at_followups": s1.memory_tier_bytes,
            "memory_tier_bytes_after": s2.memory_tier_bytes,
            "disk_tier_bytes_before": s0.disk_tier_bytes, "disk_tier_bytes_after": s2.disk_tier_bytes,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_1m": round(os.getloadavg()[0], 2),  # the machine's run queue: other work competing for cores
        }

    def lookup_records(self, s0, s1, s2, warm_spec: RequestSpec, follow_specs: list[RequestSpec], t0_ns: int) -> dict:
        """MP launcher servers: every lookup of the preparation and follow-up phases, classified.

        ``followup_lookups``: one dict per lookup (role = follow-up letter, mechanism, bytes its load
        reserved, server-side times in ms from A's submission); ``followup_disk_reads``: per
        follow-up letter, how many of its lookups read the disk tier; summaries per phase.
        """
        if not hasattr(self.tier, "lookups") or not getattr(self.tier.meter, "hooked", False):
            return {}
        roles = {warm_spec.request_id: "warmup"}
        roles.update({s.request_id: s.request_id.rsplit("-", 1)[-1] for s in follow_specs})
        prep, follow = self.tier.lookups(s0, s1, roles), self.tier.lookups(s1, s2, roles)
        letters_ = [s.request_id.rsplit("-", 1)[-1] for s in follow_specs]
        return {"prep_lookups": [lk.to_dict(t0_ns) for lk in prep], "prep_lookup_summary": summarize(prep),
                "followup_lookups": [lk.to_dict(t0_ns) for lk in follow], "followup_lookup_summary": summarize(follow),
                "followup_disk_reads": {x: sum(lk.role == x and lk.mechanism in READS for lk in follow) for x in letters_}}

    def expected_warm_cached(self) -> int:
        """Context tokens a warm-up of CONTEXT_TOKENS + 1 finds cached: every full block of the context."""
        return (self.cfg.CONTEXT_TOKENS // self.cfg.BLOCK_SIZE) * self.cfg.BLOCK_SIZE

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.tier is not None:
            server = getattr(self.tier, "server", None)
            pgid = server.proc.pid if server is not None and server.proc is not None else None
            self.tier.close()
            self.summary["cleanup"] = {"runtime_dir_removed": not self.tier.runtime.path.exists(),
                                       "server_gone": pgid is None or not group_alive(pgid)}
            self.tier = None


def kv_bytes_per_token(cfg) -> int:

    return resolve(cfg.MODEL).kv_bytes_per_token(cfg.DTYPE)


def blocks_for_group(cfg, n: int) -> int:
    """Blocks a group holds at once when it shares the context: context blocks + each request's tail."""
    ctx_blocks = cfg.CONTEXT_TOKENS // cfg.BLOCK_SIZE
    tail = cfg.CONTEXT_TOKENS % cfg.BLOCK_SIZE + cfg.SUFFIX_TOKENS + cfg.MAX_TOKENS
    return ctx_blocks + n * -(-tail // cfg.BLOCK_SIZE)


def load_source_run(source: str, record=None) -> tuple[list[dict], list[dict]]:
    """Groups and blocks of a finished run (e.g. the GPU run), copied into this run's ``raw/``."""
    import json
    import shutil
    from pathlib import Path

    import yaml


    src = Path(source)
    groups, blocks = read_jsonl(src / "raw" / "groups.jsonl"), read_jsonl(src / "raw" / "blocks.jsonl")
    if record is not None:
        for name in ("groups.jsonl", "blocks.jsonl"):
            shutil.copyfile(src / "raw" / name, record.run_dir / "raw" / name)
        env, params = src / "env.json", src / "params.resolved.yaml"
        record.save("source_run", {"run_id": src.name,
                                   "environment": json.loads(env.read_text()) if env.exists() else None,
                                   "params": yaml.safe_load(params.read_text()) if params.exists() else None})
    return groups, blocks
