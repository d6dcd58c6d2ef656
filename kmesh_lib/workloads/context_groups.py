"""The retention protocol: one engine per (path, group size), paired groups in alternating order.

One group (external arms)::

    reset vLLM's prefix cache; LMCache back to disk-only; retention switch set      (not timed)
    snapshot ─ warm-up = context + 1 token, max_tokens=1 ─ snapshot ─ wait out the head start
    follow-ups A..N submitted together (context + own suffix, MAX_TOKENS each) ─ drain ─ snapshot
              ^ both stopwatches start here: A's first token, and every request's last token

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
from pathlib import Path

from kmesh_lib.base.processes import RUNTIME_ROOT, RuntimeDir, group_alive, listening_sockets
from kmesh_lib.base.records import read_jsonl
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.engine.requests import RequestSpec, group_makespan_s, run_group
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.disk_tier import DiskTierFull, check_disk_tier
from kmesh_lib.lmcache.connect import InprocTier, MPTier, TierError, keep_engine_rendezvous_local
from kmesh_lib.lmcache.disk_accounting import MIB, NullMeter, PhaseReads
from kmesh_lib.workloads.context_arms import ARMS, CONTROL_ARMS, EXTERNAL_ARMS, pair_order

DISK_HEADROOM_BYTES = 64 * MIB


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


def make_tier(cfg, path: str, runtime: RuntimeDir):
    if path == "mp":
        return MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime)
    if path == "inproc":
        return InprocTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, cfg.DISK_TIER_MIB, runtime)
    raise ValueError(f"unknown path {path!r}")


class Block:
    """One engine (and, for an external path, one tier) running every group of one group size."""

    def __init__(self, cfg, path: str, group_size: int, log=print) -> None:
        self.cfg, self.path, self.group_size, self.log = cfg, path, group_size, log
        self.name = f"{path}-N{group_size}"
        self.arms = EXTERNAL_ARMS if path != "engine" else tuple(a for a in CONTROL_ARMS if a in cfg.CONTROL_ARMS)
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
            self.tier = make_tier(cfg, self.path, runtime)
            self.summary["disk_tier"] = check_disk_tier(self.tier.disk_dir, self.chunk_bytes,
                                                        self.context_bytes + DISK_HEADROOM_BYTES)
            self.tier.start()
            self.summary["connector"] = self.tier.connector
            if self.path == "mp":
                self.summary["listeners"] = [f"{a}:{p}" for a, p in self.tier.server.listeners()]
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

    def run_group(self, arm, pair: int, order: int, measured: bool) -> dict:
        engine, tier, cfg = self.engine, self.tier, self.cfg
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
        if arm.warm_up:
            warm_cached = run_group(engine, [self.workload.warm_up(tag, pair)])[0].num_cached_tokens
        prep_s = time.monotonic() - t0
        if arm.external:
            tier.settle()
        s1 = meter.snapshot()
        if arm.head_start_bound:
            time.sleep(max(0.0, t0 + cfg.HEAD_START_S - time.monotonic()))
        results = run_group(engine, self.workload.followups(tag, pair, self.group_size))
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
            "prep_reads": prep.to_dict(), "followup_reads": follow.to_dict(),
            "memory_tier_bytes_before": s0.memory_tier_bytes, "memory_tier_bytes_at_followups": s1.memory_tier_bytes,
            "memory_tier_bytes_after": s2.memory_tier_bytes,
            "disk_tier_bytes_before": s0.disk_tier_bytes, "disk_tier_bytes_after": s2.disk_tier_bytes,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_1m": round(os.getloadavg()[0], 2),  # the machine's run queue: other work competing for cores
        }

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
