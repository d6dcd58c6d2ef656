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

Every block runs each arrival pattern in ``FOLLOWUP_ARRIVALS`` and, on the MP paths, each setting
in ``SINGLEFLIGHT`` (a lookup overlapping an in-flight load waits for it) on the same engine and
server: WARMUP_GROUPS unmeasured pairs first (per engine, cycling through the combinations), then
measured *rounds*, each one pair per combination, the arm order alternating from pair to pair.

Paths: ``mp`` (LMCacheMPConnector + ``lmcache server``, the disk tier under DISK_TIER_ROOT),
``mp-striped`` (the same on STRIPED_STORE_ROOT, an existing RAID 0 mount over two or more NVMe
drives), ``inproc`` (LMCacheConnectorV1), ``gpubuf`` (``kv.gpu_buffer``: kmesh's host-staged GPU
buffer, a vLLM connector; its restores record where their time went, ``restore_split``) and ``native``
(``kv.offloading``: vLLM's own OffloadingConnector, its CPU tier over its filesystem tier; CUDA only).

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
import shutil
import string
import time
from datetime import datetime, timezone

import numpy as np

from kmesh_lib.base.processes import RuntimeDir, group_alive, listening_sockets, runtime_root
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.engine.requests import RequestResult, RequestSpec, group_makespan_s, record_step, run_group
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.disk_tier import DiskTierFull, check_disk_tier
from kmesh_lib.kv.gpu_buffer import GpuBufferTier
from kmesh_lib.kv.offloading import NativeOffloadTier
from kmesh_lib.lmcache.connect import InprocTier, MPTier, TierError, keep_engine_rendezvous_local
from kmesh_lib.lmcache.disk_accounting import MIB, NullMeter, PhaseReads, wait_for_written
from kmesh_lib.lmcache.lookups import READS, summarize
from kmesh_lib.workloads.context_arms import ARMS, CONTROL_ARMS, EXTERNAL_ARMS, pair_order
from kmesh_lib.workloads.context_params import MP_PATHS, ArrivalPattern

DISK_HEADROOM_BYTES = 64 * MIB
STORE_TIMEOUT_S = 60.0  # a store that has not reached the disk tier by then is reported, not waited for
DROP_WAIT_S = 5.0  # a discarded copy still in memory by then is recorded, and fails the group's discard check


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

    def store_request(self, whole_blocks: bool = False) -> RequestSpec:
        """The context and a tail (SUFFIX_TOKENS; one token with ``whole_blocks``, for a tier that stores
        every full block of a prompt: then it stores the context's blocks and nothing else)."""
        tail = [self._rng(-1).randrange(4, self.vocab_size) for _ in range(1 if whole_blocks else self.cfg.SUFFIX_TOKENS)]
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
    """The external tier of ``path``. MP: the server mode and the first SINGLEFLIGHT setting from
    ``cfg``; ``stock_retain`` picks a stock server's fixed policy. gpubuf: a GPU buffer of ARENA_MIB
    that saves nothing until the store step turns saving on (``Block.store_context``). native: vLLM's
    CPU tier of ARENA_MIB over its filesystem tier, both storing whole CHUNK_SIZE chunks as LMCache does."""
    if path in MP_PATHS:
        return MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime, device=cfg.DEVICE, server_mode=cfg.LMCACHE_SERVER,
                      stock_retain=stock_retain, singleflight=cfg.SINGLEFLIGHT[0])
    if path == "inproc":
        return InprocTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, cfg.DISK_TIER_MIB, runtime)
    if path == "gpubuf":
        return GpuBufferTier(cfg.ARENA_MIB, runtime.subdir("gpubuf"), retain=True, saving=False)
    if path == "native":
        return NativeOffloadTier(cfg.ARENA_MIB / 1024, disk_dir=runtime.subdir("native"), block_tokens=cfg.CHUNK_SIZE)
    raise ValueError(f"unknown path {path!r}")


def restore_split(rec: dict, t0_ns: int, first_token_ns: dict[str, int], roles: dict[str, str]) -> dict:
    """One GPU-buffer restore (``kv.restore_timeline``) as a group records it: where its time went.

    Durations in seconds (lookup, disk read, staging, copy into vLLM, the whole restore) and
    ``to_first_token_s``: from the restore's last copy to its request's first token (the first
    forward step, mostly). Stamps become ms from ``t0_ns`` (the group's origin); request ids become
    roles (``roles``: request id -> follow-up letter or ``warmup``; ``first_token_ns`` by the same ids).
    """
    rel = lambda ns: None if ns is None else round((ns - t0_ns) / 1e6, 3)  # noqa: E731
    # vLLM may append a suffix to a request id ("g-A" must not claim "g-A1", hence the longest match)
    rid = str(rec.get("req_id") or "")
    hits = [k for k in roles if rid.startswith(k)]
    key = max(hits, key=len) if hits else None
    first = first_token_ns.get(key)
    ready = rec.get("t_ready_ns")
    return {"kind": rec["kind"], "role": roles[key] if key else ("prefetch" if rec["kind"] == "prefetch" else "other"),
            "source": rec["source"], "num_blocks": rec["num_blocks"], "bytes": rec["bytes"],
            "disk_bytes": rec["disk_bytes"], "num_lookup_calls": rec["num_lookup_calls"],
            **{k: rec.get(k) for k in ("lookup_s", "disk_read_s", "staging_s", "copy_s", "restore_s")},
            "copy_launch": rec.get("copy_launch"),  # "graph", or a launch route (more restores of a size than graphs)
            "to_first_token_s": None if first is None or ready is None else (first - ready) / 1e9,
            "t_start_ms": rel(rec.get("t_start_ns")), "t_ready_ms": rel(ready)}


SPLIT = ("lookup_s", "disk_read_s", "staging_s", "copy_s", "restore_s", "to_first_token_s")  # a restore's parts


def split_medians(restores: list[dict]) -> dict:
    """The median of each ``SPLIT`` part over ``restores`` (``restore_split`` rows), as ``"<part> ms"`` columns
    (None where none recorded it), and ``"copies by graph"`` where any names its copy's route."""
    row = {}
    for key in SPLIT:
        vals = [r[key] for r in restores if r.get(key) is not None]
        row[key.replace("_s", " ms")] = round(float(np.median(vals)) * 1e3, 3) if vals else None
    if copies_by_graph(restores):
        row["copies by graph"] = copies_by_graph(restores)
    return row


def copies_by_graph(restores: list[dict]) -> str | None:
    """``"k/n"``: of the ``restore_split`` records that name their copy's route (recorded since 2 Dec 2026),
    how many were one graph launch; the rest took the launch route, as a restore does when a step's
    restores of its size outnumber the graph's instances (``kv.copy_graph``). None: none names a route."""
    launched = [r["copy_launch"] for r in restores if r.get("copy_launch")]
    return f"{launched.count('graph')}/{len(launched)}" if launched else None


class Block:
    """One engine (and, for an external path, one tier) running every group of one group size.

    ``arrival``: the follow-ups' arrival pattern when a caller runs single groups (default: the
    first of ``FOLLOWUP_ARRIVALS``; ``run_pairs`` runs them all, ``run_group`` takes one per group).
    ``arms``: the external arms to alternate (default both); a stock LMCache server
    (``LMCACHE_SERVER=stock``) has one fixed retention policy, so its block runs one external arm
    (named ``<path>-N<n>-<arm>``) and its server is started with that arm's policy.
    """

    def __init__(self, cfg, path: str, group_size: int, log=print, arrival: ArrivalPattern | str | None = None,
                 arms: tuple[str, ...] | None = None, name: str | None = None) -> None:
        self.cfg, self.path, self.group_size, self.log = cfg, path, group_size, log
        self.name = name or f"{path}-N{group_size}"
        self.arms = EXTERNAL_ARMS if path != "engine" else tuple(a for a in CONTROL_ARMS if a in cfg.CONTROL_ARMS)
        if arms is not None:
            self.arms = tuple(arms)
        if path in MP_PATHS and cfg.LMCACHE_SERVER == "stock" and len(self.arms) != 1:
            raise ValueError(f"LMCACHE_SERVER=stock fixes one retention policy per server: run one block per arm "
                             f"(arms={self.arms})")
        text = arrival if arrival is not None else cfg.arrivals[0]
        self.arrival = text if isinstance(text, ArrivalPattern) else ArrivalPattern.parse(text)
        self.runtime: RuntimeDir | None = None
        self.tier = None
        self.engine = None
        # ``running`` until run() ends: ``ok``, ``disk_full``, or ``failed`` with the error it raised
        self.summary: dict = {"block": self.name, "path": path, "group_size": group_size, "status": "running"}
        self.groups: list[dict] = []

    @property
    def singleflights(self) -> list[bool | None]:
        """The singleflight settings this block runs: SINGLEFLIGHT on the MP paths, none (None) elsewhere."""
        return list(self.cfg.SINGLEFLIGHT) if self.path in MP_PATHS else [None]

    # -- set-up --
    def begin(self) -> None:
        """Creates the tier and spawns its server, without waiting (``start`` waits): a caller can
        import vLLM or wait for the GPU meanwhile. Idempotent."""
        if self.path == "engine" or self.tier is not None:
            return
        cfg = self.cfg
        parent = cfg.STRIPED_STORE_ROOT if self.path == "mp-striped" else cfg.DISK_TIER_ROOT
        self.runtime = RuntimeDir.create(f"retention-{self.path}", root=runtime_root(parent))
        self.tier = make_tier(cfg, self.path, self.runtime, stock_retain=bool(ARMS[self.arms[0]].retain))
        if hasattr(self.tier, "begin"):
            self.tier.begin()

    def start(self) -> None:
        cfg = self.cfg
        llm_kwargs = {}
        if self.path != "engine":
            self.begin()
            self.summary["disk_tier"] = check_disk_tier(self.tier.disk_dir, self.chunk_bytes,
                                                        self.context_bytes + DISK_HEADROOM_BYTES)
            t0 = time.monotonic()
            self.tier.start()
            self.summary["tier_ready_s"] = round(time.monotonic() - t0, 2)  # what the server's boot still cost
            server = getattr(self.tier, "server", None)
            if server is not None and getattr(server, "boot_s", None) is not None:
                # NOTE: on the H200 (1 Dec, gpu-20261201-124455-d451) the wait above was 14-15 s even for a
                # server spawned a minute before; in the next run it was 0.03 s in all 20 MP runs (imports
                # took 17-22 s, longer than the boot). Where it recurs, the server's log lines say why.
                self.summary["server_boot_s"] = server.boot_s
                if self.summary["tier_ready_s"] > 5:
                    self.log(f"{self.name}: lmcache server boot {server.boot_s} s from spawn, still "
                             f"{self.summary['tier_ready_s']} s after begin's overlap; its log:\n{server.log_tail(60)}")
            self.summary["connector"] = self.tier.connector
            if self.path in MP_PATHS:
                self.summary["listeners"] = [f"{a}:{p}" for a, p in self.tier.server.listeners()]
                self.summary["lmcache_server"] = self.tier.describe()
            else:
                self.summary["tier"] = self.tier.describe()
            llm_kwargs = self.tier.llm_kwargs(cfg.DEVICE)
        keep_engine_rendezvous_local()
        self.engine = make_engine(dataclasses.replace(cfg, MAX_NUM_SEQS=max(cfg.MAX_NUM_SEQS, self.group_size + 1)),
                                  **llm_kwargs)
        self.summary["engine_start_s"] = round(self.engine.start_s, 2)
        if hasattr(self.tier, "attach"):  # vLLM's own tier: its statistics and lookups read on the live engine
            self.tier.attach(self.engine)
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

    @staticmethod
    def wait_for_drop(tier, timeout_s: float = DROP_WAIT_S) -> float:
        """Seconds until a discarding tier's memory copy is gone, at most ``timeout_s`` (then the
        group records the bytes still there, and its discard check fails on them).

        A discarded chunk leaves LMCache's L1 when the engine's release of its read lock reaches the
        server, which can come after ``settle`` found the queues idle (a smoke test on the 2-core CI box
        once found bytes in L1 at the group's last snapshot, taken without this wait)."""
        t0 = time.monotonic()
        while tier.memory_bytes() and time.monotonic() - t0 < timeout_s:
            time.sleep(0.01)
        return round(time.monotonic() - t0, 3)

    def store_context(self) -> dict:
        """Computes the context once; the tier stores it to the disk tier (and keeps no memory copy).

        The GPU buffer saves a prompt's full blocks, so its store request is the context plus one
        token (nothing beyond the context is stored) and saving is on for this step only.
        """
        meter, n_chunks = self.tier.meter, self.cfg.CONTEXT_TOKENS // self.cfg.CHUNK_SIZE
        buffer = self.path == "gpubuf"
        stock = self.path in MP_PATHS and self.cfg.LMCACHE_SERVER == "stock"
        self.tier.set_retention(bool(ARMS[self.arms[0]].retain) if stock else False)  # a stock server has one policy
        before = meter.snapshot()
        t0 = time.monotonic()
        if buffer:
            self.tier.set_saving(True)
        try:
            run_group(self.engine, [self.workload.store_request(whole_blocks=buffer)])
            self.engine.drain()
            self.tier.settle()
        finally:
            if buffer:
                self.tier.set_saving(False)
        if buffer:
            self.tier.take_restores()
        hooked = getattr(meter, "hooked", True)  # a stock server has no byte hook: its disk tier's files say it

        def written_since(snap) -> int:
            return (snap.hook_write_bytes - before.hook_write_bytes if hooked
                    else snap.disk_tier_bytes - before.disk_tier_bytes)

        # the server's queues can be idle (settle returns) before the last chunks reach them (seen on the H200:
        # 1 of 16 chunks written when settle returned)
        wait_for_written(meter, before, self.context_bytes, STORE_TIMEOUT_S, written_since, self.tier.settle)
        self.tier.drop_memory_copy()
        after = meter.snapshot()
        written = written_since(after)
        store = {"chunks": n_chunks, "bytes_written": written, "written_by": "hook" if hooked else "disk-tier files",
                 "write_errors": after.hook_write_errors - before.hook_write_errors,
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
        t0 = time.monotonic()
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
            self.summary["seconds"] = round(time.monotonic() - t0, 1)
            if record is not None:  # a raised run is recorded too, as failed (its groups so far are in raw/)
                record.append_jsonl("blocks.jsonl", self.summary)
        return self

    def combos(self) -> list[tuple[bool | None, ArrivalPattern]]:
        """(singleflight, arrival pattern) of every combination this block runs, in round order."""
        return [(sf, pattern) for sf in self.singleflights for pattern in self.cfg.arrivals]

    def run_pairs(self, record) -> None:
        """Warm-up pairs first (WARMUP_GROUPS per engine, cycling through the combinations, ``combos``),
        then measured rounds: each round runs one pair per combination still short of MEASURED usable
        pairs (a pair with a group that is not ``ok`` is replaced, up to MAX_RETRY_PAIRS times per
        combination). The arm order alternates from pair to pair within each combination."""
        cfg = self.cfg
        control = self.path == "engine"
        warmups = cfg.CONTROL_WARMUP_GROUPS if control else cfg.WARMUP_GROUPS
        measured = cfg.CONTROL_MEASURED_GROUPS if control else cfg.MEASURED_GROUPS
        combos = self.combos()
        done, retries, ran = [0] * len(combos), [0] * len(combos), [0] * len(combos)
        pair = 0

        def one_pair(i: int, is_measured: bool) -> bool:
            nonlocal pair
            sf, pattern = combos[i]
            recs = [self.run_group(ARMS[a], pair, order, is_measured, arrival=pattern, singleflight=sf)
                    for order, a in enumerate(pair_order(self.arms, ran[i]))]
            ran[i] += 1
            if record is not None:
                record.append_jsonl("groups.jsonl", recs)
            self.groups += recs
            self.log(f"{self.name} pair {pair} [{pattern.label}{'' if sf is None else ', singleflight ' + on_off(sf)}]"
                     f" ({'measured' if is_measured else 'warm-up'}): " + ", ".join(
                         f"{r['arm']} A {r['ttft_a_s'] * 1e3:.0f} ms, all {r['makespan_s'] * 1e3:.0f} ms, "
                         f"{r['status']}" for r in recs))
            pair += 1  # unique per pair of the block: it seeds the follow-ups' suffixes
            return all(r["status"] == "ok" for r in recs)

        for w in range(warmups):
            one_pair(w % len(combos), False)
        while any(d < measured for d in done):
            for i in range(len(combos)):
                if done[i] >= measured:
                    continue
                if one_pair(i, True):
                    done[i] += 1
                elif retries[i] < cfg.MAX_RETRY_PAIRS:
                    retries[i] += 1
                else:
                    done[i] += 1  # keep the not-ok pair: the table reports how many groups were usable
        self.summary.update(pairs=pair, retried_pairs=sum(retries), combinations=len(combos))

    def run_group(self, arm, pair: int, order: int, measured: bool, arrival: ArrivalPattern | None = None,
                  singleflight: bool | None = None) -> dict:
        engine, tier, cfg = self.engine, self.tier, self.cfg
        arrival = arrival or self.arrival
        singleflight = singleflight if arm.external and self.path in MP_PATHS else None
        tag = f"{self.name}-p{pair}-{arm.name}"
        if not engine.reset_prefix_cache():
            raise TierError("vLLM refused to reset its prefix cache between groups")
        meter = tier.meter if arm.external else NullMeter()
        if arm.external:
            tier.drop_memory_copy()
            tier.set_retention(arm.retain)
            if singleflight is not None:
                tier.set_singleflight(singleflight)
            tier.settle()
        s0 = meter.snapshot()
        t0 = time.monotonic()
        warm_cached, warm = None, []
        warm_spec = self.workload.warm_up(tag, pair)
        if arm.warm_up:
            warm = run_group(engine, [warm_spec])
            warm_cached = warm[0].num_cached_tokens
        prep_s = time.monotonic() - t0
        if arm.external:
            tier.settle()
        s1 = meter.snapshot()
        prep_restores = self.tier.take_restores() if arm.external and self.path == "gpubuf" else []
        if arm.head_start_bound:
            time.sleep(max(0.0, t0 + cfg.HEAD_START_S - time.monotonic()))
        follow_specs = self.workload.followups(tag, pair, self.group_size)
        results = run_arrivals(engine, follow_specs, arrival)
        engine.drain()
        if arm.external:
            tier.settle()
        drop_wait_s = self.wait_for_drop(tier) if arm.external and not arm.retain else None
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
        if arm.external and self.path == "gpubuf":
            traced.update(self.restore_records(prep_restores, warm_spec, warm, follow_specs, results, a.t_submit_ns))
        return {
            "block": self.name, "path": self.path, "group_size": self.group_size, "arm": arm.name, "pair": pair,
            "order": order, "measured": measured, "status": status, "detail": detail, **arm.describe(tier),
            "lookup": tier.lookup if arm.external else None, "singleflight": singleflight,
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
            "memory_tier_bytes_after": s2.memory_tier_bytes, "memory_tier_drop_wait_s": drop_wait_s,
            "disk_tier_bytes_before": s0.disk_tier_bytes, "disk_tier_bytes_after": s2.disk_tier_bytes,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_1m": round(os.getloadavg()[0], 2),  # the machine's run queue: other work competing for cores
        }

    def restore_records(self, prep_restores: list[dict], warm_spec: RequestSpec, warm: list[RequestResult],
                        follow_specs: list[RequestSpec], results: list[RequestResult], t0_ns: int) -> dict:
        """GPU buffer: every restore of the preparation and follow-up phases, split (``restore_split``)."""
        roles = {warm_spec.request_id: "warmup", **{s.request_id: s.request_id.rsplit("-", 1)[-1] for s in follow_specs}}
        first = {r.request_id: r.t_first_token_ns for r in [*warm, *results]}
        follow = self.tier.take_restores()
        return {"prep_restores": [restore_split(r, t0_ns, first, roles) for r in prep_restores],
                "followup_restores": [restore_split(r, t0_ns, first, roles) for r in follow]}

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
        t0 = time.monotonic()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.tier is not None:
            server = getattr(self.tier, "server", None)
            pgid = server.proc.pid if server is not None and server.proc is not None else None
            self.tier.close()
            if self.runtime is not None:
                self.runtime.close()  # the disk tier's directory (the MP tier closed it already; idempotent)
            self.summary["cleanup"] = {"runtime_dir_removed": not self.runtime.path.exists(),
                                       # no server on the in-process paths: nothing to outlive the run
                                       "server_gone": pgid is None or not group_alive(pgid)}
            if getattr(self.tier, "leftovers_removed", None):  # what the engine left and the tier removed
                self.summary["cleanup"]["leftovers_removed"] = self.tier.leftovers_removed
            self.tier = None
        self.summary["close_s"] = round(time.monotonic() - t0, 2)


def on_off(flag: bool | None) -> str:
    return "n/a" if flag is None else ("on" if flag else "off")


def kv_bytes_per_token(cfg) -> int:

    return resolve(cfg.MODEL).kv_bytes_per_token(cfg.DTYPE)


def blocks_for_group(cfg, n: int) -> int:
    """Blocks a group holds at once when it shares the context: context blocks + each request's tail."""
    ctx_blocks = cfg.CONTEXT_TOKENS // cfg.BLOCK_SIZE
    tail = cfg.CONTEXT_TOKENS % cfg.BLOCK_SIZE + cfg.SUFFIX_TOKENS + cfg.MAX_TOKENS
    return ctx_blocks + n * -(-tail // cfg.BLOCK_SIZE)
