"""The restore arms: where one follow-up finds the shared context, measured one way.

Every arm belongs to one external tier; each (tier, model) is one engine (``RestoreBench``):

    tier     arm              kind       the context before the follow-up              expected cached
    lmcache  recompute        recompute  nowhere: no external cache, APC reset         0
             dram             memory     LMCache's memory tier (L1 arena/LocalCPU)     the whole context
             disk             disk       LMCache's disk tier only (O_DIRECT)           the whole context
             resident         resident   vLLM's prefix cache (already in vLLM's KV)    the whole context
    gpubuf   gpubuf_recompute recompute  nowhere, on the GPU-buffer engine (tier off)   0
             gpubuf_retained  memory     the host-staged GPU buffer (``kv.gpu_buffer``) the whole context
             gpubuf_layered   memory     the same, the copy waited for layer by layer   the whole context
             gpubuf_offthread memory     gpubuf_layered, its graph launched by a native the whole context
                                         thread off the engine's (``kv.launch_thread``; CUDA)
             gpubuf_disk      disk       its disk tier only; the restore frees the copy the whole context
             gpubuf_resident  resident   vLLM's prefix cache, on the GPU-buffer engine the whole context
    native   native_recompute recompute  nowhere, on the offloading engine (tier off)  0
             native_offload   memory     vLLM's own CPU tier (``kv.offloading``; CUDA)  the whole context
             native_resident  resident   vLLM's prefix cache, on the offloading engine the whole context
    lmcache_mp lmcache_mp_recompute recompute nowhere, on the MP engine (tier off)      0
             lmcache_mp       memory     LMCache's server (MP): its L1 DRAM arena, read  the whole context
                                         through LMCacheMPConnector on cpu and cuda alike
             lmcache_mp_resident resident vLLM's prefix cache, on the MP engine          the whole context

Preparation by kind (not timed): ``recompute`` switches the tier off (``ExternalSwitch``) and resets
vLLM's prefix cache; ``resident`` does the same, then prefills context + 1 token; ``memory`` empties
the tier's memory copy, turns retention on and runs a warm-up (the LMCache and GPU-buffer tiers load
the stored context from disk and keep their copy; vLLM's CPU tier stores the prefill), then resets
vLLM's prefix cache; ``disk`` turns retention off and empties the memory copy. The follow-up is the
context plus SUFFIX_TOKENS own tokens, MAX_TOKENS out; both stopwatches start at its submission:
first token (``ttft_s``) and the group's last token (``makespan_s``). On the GPU buffer's engine every
follow-up, the resident one included, also records the span of the forward pass that gave its first token,
from its first attention layer to its end (``forward_step_s``: events on CUDA), so a restore's effect on
the forward pass has a control in the same engine.

Invariants:
    - before any follow-up is submitted the engine has no request and the tier no I/O in flight
      (``drain`` + ``settle``), so an arm's time is its own;
    - a context is a whole number of LMCache chunks and vLLM blocks, so a restore can cover all of it;
    - every row carries ``num_cached_tokens`` per follow-up and the arm's expected value; a row whose
      follow-ups did not hit exactly that is ``status: cache_miss`` and enters no table. What else a
      row must show (restores, vLLM's external hits, bytes in the tier) is recorded and checked by
      ``checks``, not folded into the status.

After a restore's follow-up (outside its stopwatches) the bench digests vLLM's blocks of the context and compares them
with the blocks ``store`` computed it into (``_kv_check``, ``lmcache.probes.KvDigest``): the restore wrote the KV as
it was computed, or the row says it did not.

``bench.run(arm, context, tag)`` is one row (section 21 is its only user).
"""
from __future__ import annotations

import random
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kmesh_lib.engine.gpu_clocks import GpuClocks
from kmesh_lib.engine.requests import RequestSpec, group_makespan_s, run_group
from kmesh_lib.kv.offloading import VllmConnectorMeter
from kmesh_lib.kv.offloading import request_split as offload_split
from kmesh_lib.kv.restore_timeline import request_split as gpu_buffer_split
from kmesh_lib.lmcache.disk_accounting import wait_for_written
from kmesh_lib.lmcache.probes import ComponentProbe, ExternalSwitch, KvDigest, compare_kv

ARMS_OF_TIER = {"lmcache": ("recompute", "dram", "disk", "resident"),
                "gpubuf": ("gpubuf_recompute", "gpubuf_retained", "gpubuf_layered", "gpubuf_offthread", "gpubuf_disk",
                           "gpubuf_resident"),
                "native": ("native_recompute", "native_offload", "native_resident"),
                "lmcache_mp": ("lmcache_mp_recompute", "lmcache_mp", "lmcache_mp_resident")}
ARM_NAMES = tuple(a for arms in ARMS_OF_TIER.values() for a in arms)
TIER_OF = {a: tier for tier, arms in ARMS_OF_TIER.items() for a in arms}
KIND = {"recompute": "recompute", "dram": "memory", "disk": "disk", "resident": "resident",
        "gpubuf_recompute": "recompute", "native_recompute": "recompute", "lmcache_mp_recompute": "recompute",
        "gpubuf_retained": "memory", "gpubuf_layered": "memory", "gpubuf_offthread": "memory", "gpubuf_disk": "disk",
        "gpubuf_resident": "resident",
        "native_offload": "memory", "native_resident": "resident",
        "lmcache_mp": "memory", "lmcache_mp_resident": "resident"}
RESIDENT_OF = {"dram": "resident", "disk": "resident", "gpubuf_retained": "gpubuf_resident",
               "gpubuf_layered": "gpubuf_resident", "gpubuf_offthread": "gpubuf_resident", "gpubuf_disk": "gpubuf_resident",
               "native_offload": "native_resident",
               "lmcache_mp": "lmcache_mp_resident"}  # each restore against the engine-resident follow-up of its engine
RESTORE_ARMS = tuple(RESIDENT_OF)
# each tier's engine's own recompute (the LMCache engine's is ``recompute``, the section's required control)
RECOMPUTE_OF_TIER = {tier: next(a for a in arms if KIND[a] == "recompute") for tier, arms in ARMS_OF_TIER.items()}
# each tier's engine's resident follow-up (the context already in vLLM's KV): what its recompute's prefill is above
RESIDENT_OF_TIER = {tier: next(a for a in arms if KIND[a] == "resident") for tier, arms in ARMS_OF_TIER.items()}
OWN_RECOMPUTES = tuple(a for a in RECOMPUTE_OF_TIER.values() if a != "recompute")  # the other engines' controls
GPUBUF_RESTORES = tuple(a for a in ARMS_OF_TIER["gpubuf"] if a in RESIDENT_OF)  # the GPU buffer's restore arms
# what the forward pass waits for in an arm's follow-up (``GpuBufferTier.set_wait_at``); others: the tier's own
WAIT_AT_OF = {"gpubuf_layered": "layer", "gpubuf_offthread": "layer"}
HANDOFF_ARMS = ("gpubuf_offthread",)  # arms whose copies' graph launches go to the launch thread (``set_launch_thread``)
STORED_TIERS = ("lmcache", "gpubuf", "lmcache_mp")  # tiers whose contexts are stored on a disk tier before the arms run
TIMED_TIERS = ("gpubuf", "native")  # tiers whose restores record their own timeline (a row's ``split``)
WARM_OWN_TOKENS = [6, 7]  # a warm-up's tokens after the context (``RestoreBench.warm`` says why two)


def control_of(path: str, measured_at: Mapping[int, Collection[str]]) -> str:
    """The recompute arm every speed-up of one (model, ``path``) row is over, one decision for the whole row:
    ``measured_at`` maps each context length to the arms measured there (for that model). Its own engine's
    recompute where that arm was measured at every length ``path`` was, so restore and recompute run in one engine
    all along the row; else the LMCache engine's ``recompute`` at every length, another engine where ``path`` is
    not LMCache's (one engine per tier: their speeds at rest differ, review finding of 6 Dec 2026). Never one
    control at some lengths and the other at the rest: a row's crossover compares its lengths' speed-ups, and a
    change of control between two lengths would move the ratio by the engines' difference, not the restore's."""
    own = RECOMPUTE_OF_TIER[TIER_OF[path]]
    lengths = [n for n, arms in measured_at.items() if path in arms]
    return own if lengths and all(own in measured_at[n] for n in lengths) else "recompute"


def measured_at(points) -> dict[str, dict[int, set[str]]]:
    """model -> context length -> the arms measured there, from (model, context tokens, arm) triples: what
    ``control_of`` decides a row's control from."""
    out: dict[str, dict[int, set[str]]] = {}
    for model, n, arm in points:
        out.setdefault(model, {}).setdefault(n, set()).add(arm)
    return out


def tiers_of(arm_names) -> list[str]:
    """The external tiers ``arm_names`` need, in ``ARMS_OF_TIER`` order: one engine per tier and model."""
    return [t for t, arms in ARMS_OF_TIER.items() if any(a in arm_names for a in arms)]


class ArmError(RuntimeError):
    """The engine or LMCache is not in the state an arm needs (reported, never timed)."""


@dataclass(frozen=True)
class Context:
    name: str
    tokens: list[int]

    @classmethod
    def random(cls, name: str, n_tokens: int, vocab_size: int, seed: int) -> Context:
        rng = random.Random(f"context-{seed}-{name}")
        return cls(name, [rng.randrange(4, vocab_size) for _ in range(n_tokens)])


def host_state(clocks: GpuClocks | None = None) -> dict:
    """What a streak of slow requests ran beside, read now (psutil, os): the CPU this process's thread is on, the
    1-minute load average, and counters a reader differences between rows: the host's CPU time stolen by other guests
    (``cpu_steal_s``, a VM's noisy neighbour), this process's CPU time and its involuntary context switches (its
    threads preempted), and the current clock of its CPU (``cpu_mhz``) where the host says; on a GPU also the compute
    processes NVML lists on it (``GpuClocks.read_with_processes``), where it can say. A counter the platform lacks is
    left out, never zero."""
    import os

    import psutil

    me = psutil.Process()
    cpu = me.cpu_num()
    times = me.cpu_times()
    state = {"cpu_num": cpu, "load_avg_1m": round(os.getloadavg()[0], 2),
             "process_cpu_s": round(times.user + times.system, 3),
             "ctx_switches_involuntary": me.num_ctx_switches().involuntary}
    steal = getattr(psutil.cpu_times(), "steal", None)
    if steal is not None:
        state["cpu_steal_s"] = round(steal, 2)
    try:
        freqs = psutil.cpu_freq(percpu=True) or []
    except (OSError, NotImplementedError):  # no cpufreq in this VM or container
        freqs = []
    if 0 <= cpu < len(freqs) and freqs[cpu].current:
        state["cpu_mhz"] = round(freqs[cpu].current)
    gpu = clocks.read_with_processes() if clocks is not None else None
    if gpu and "num_processes" in gpu:
        state["gpu_processes"] = gpu["num_processes"]
    return state


STORE_BYTES_TIMEOUT_S = 120.0  # the longest store (7B, 32,512 tokens: 1.86 GB) writes in about 1.3 s on the H100


class RestoreBench:
    """One engine, its external tier (``lmcache.connect``, ``kv.gpu_buffer`` or ``kv.offloading``),
    the off switch and the component probe. ``tier_name`` is the tier's row in ``ARMS_OF_TIER``."""

    def __init__(self, engine, tier, new_tokens: int = 32, output_tokens: int = 1, followups: int = 1,
                 tier_name: str = "lmcache") -> None:
        self.engine, self.tier, self.tier_name = engine, tier, tier_name
        self.new_tokens, self.output_tokens, self.followups = new_tokens, output_tokens, followups
        self.probe = ComponentProbe(engine)
        self.switch = ExternalSwitch(engine, self.probe)
        self.vocab = engine.spec.config["vocab_size"]
        self.clocks = GpuClocks() if engine.params.DEVICE == "cuda" else None
        # the KV vLLM holds for a context: digested as ``store`` computed it, compared after each restore (``_kv_check``)
        self.kv_digest = KvDigest(engine)
        self.stored_kv: dict = {}  # context name -> its blocks' digest as stored (``lmcache.probes.BlockDigest``)
        if tier_name == "gpubuf":
            tier.time_forward_steps(True)  # every arm's follow-up, the resident one included (the control)

    @property
    def has_disk_tier(self) -> bool:
        return self.tier_name in STORED_TIERS

    # -- states --
    def quiet(self) -> None:
        """No request in the engine, no tier I/O in flight."""
        self.engine.drain()
        self.tier.settle()

    def reset_engine(self) -> None:
        self.quiet()
        if not self.engine.reset_prefix_cache():
            raise ArmError("vLLM refused to reset its prefix cache")

    def store(self, ctx: Context, expected_bytes: int | None = None) -> dict:
        """Computes ``ctx`` once with the tier on; the tier writes it to its disk tier and keeps no memory copy.

        The GPU buffer saves a prompt's full blocks only while saving is on, so it is on for this step. The record
        also says what tells a short store's causes apart (H100, 6 Dec 2026: LMCache's server stored 0 bytes of
        whole contexts and told the engine nothing): ``num_cached_tokens``, what the store request's lookup claimed
        (claimed tokens are not stored again), and a tier's own ``store_diagnostics`` where it has them (the MP
        server: its arena's bytes before, once the store settled and after, its counters, its reservations; and
        ``reached_disk``, whether every chunk it put in its arena reached the disk tier before the copy was dropped)."""
        meter = self.tier.meter
        self.switch.set(True)
        self.tier.set_retention(False)
        self.reset_engine()
        # a tier that tells a finished store by its memory copy emptying by itself (the MP server under skip_l1,
        # ``MPTier.wait_for_store``) starts the store with that copy empty: the last point's retained context goes
        wait_for_store = getattr(self.tier, "wait_for_store", None)
        if wait_for_store is not None:
            self.tier.drop_memory_copy()
        saving = hasattr(self.tier, "set_saving")
        before, t0 = meter.snapshot(), time.monotonic()
        if saving:
            self.tier.set_saving(True)
        try:
            result, = run_group(self.engine, [RequestSpec(f"store-{ctx.name}", ctx.tokens + [5], max_tokens=1)])
            self.quiet()
        finally:
            if saving:
                self.tier.set_saving(False)
        # the blocks the store request computed the context into, after it finished (outside every stopwatch): what
        # every restore of this context must write back (``_kv_check``)
        self.kv_digest.forget_held()
        self.stored_kv[ctx.name] = self.kv_digest.take(f"store-{ctx.name}", len(ctx.tokens))
        # never clear before the store's chunks reached the disk tier: LMCache 0.5.3's clear frees them too. The
        # arena emptying by itself says so only once the store has reserved its chunks there; a store the server
        # takes up after the engine went idle would find it empty at first, so the disk tier's bytes are waited
        # for too (``expected_bytes``: the context's; a store that stays short is recorded short, not waited out)
        if wait_for_store is not None and expected_bytes:
            wait_for_written(meter, before, expected_bytes, STORE_BYTES_TIMEOUT_S)
        stored = wait_for_store() if wait_for_store is not None else None
        diagnose = getattr(self.tier, "store_diagnostics", None)
        settled = meter.snapshot() if diagnose is not None else None  # before the memory copy is dropped
        self.tier.drop_memory_copy()
        self._take_timelines()
        after = meter.snapshot()
        return {"context": ctx.name, "tier": self.tier_name, "bytes_written": after.hook_write_bytes - before.hook_write_bytes,
                "write_errors": after.hook_write_errors - before.hook_write_errors, "seconds": time.monotonic() - t0,
                "num_cached_tokens": result.num_cached_tokens,
                **({"reached_disk": stored} if stored is not None else {}),
                **(diagnose(before, settled, after) if diagnose is not None else {})}

    def warm(self, ctx: Context, tag: str) -> int:
        """The context and two tokens of its own: two, because a step of one new token per request is a
        uniform decode batch, which vLLM 0.26 replays as a full CUDA graph, and there LMCache 0.5.3's
        in-process connector did not load the context (no retrieval logged, its memory tier still empty
        after the warm-up; the failed run crossover/gpu-20261201-171853-0015 records it)."""
        spec = RequestSpec(f"{tag}-warm", ctx.tokens + WARM_OWN_TOKENS, max_tokens=1)
        return run_group(self.engine, [spec])[0].num_cached_tokens

    def prepare(self, arm: str, ctx: Context, tag: str) -> dict:
        """Puts the context where ``arm`` wants it; returns what the preparation saw."""
        if TIER_OF.get(arm) != self.tier_name:
            raise ValueError(f"arm {arm!r} is not an arm of the {self.tier_name} tier: {', '.join(ARMS_OF_TIER[self.tier_name])}")
        kind = KIND[arm]
        if arm in HANDOFF_ARMS:  # the thread starts on first use; without one the arm is not this arm
            state = self.tier.start_launch_thread()
            if not self.tier.has_launch_thread:
                raise ArmError(f"{arm}: the GPU buffer has no launch thread: {state}")
        prep: dict = {}
        if kind in ("recompute", "resident"):
            self.switch.set(False)
            self.reset_engine()
            if kind == "resident":
                prep["warm_cached_tokens"] = self.warm(ctx, tag)
        elif kind == "memory":
            self.switch.set(True)
            self.reset_engine()
            self.tier.drop_memory_copy()
            self.tier.set_retention(True)
            # LMCache and the GPU buffer load the stored context and keep their copy; vLLM's CPU tier
            # stores the prefill (its stores finish in quiet())
            prep["warm_cached_tokens"] = self.warm(ctx, tag)
            if not self.has_disk_tier:
                # vLLM's CPU tier has no store step: what it offloads is what this warm-up computed (from an empty
                # tier), the KV its restore must write back (``_kv_check``); a warm-up that found some of it cached
                # computed less, and leaves the restore uncompared
                self.stored_kv.pop(ctx.name, None)
                if prep["warm_cached_tokens"] == 0:
                    self.stored_kv[ctx.name] = self.kv_digest.take(f"{tag}-warm", len(ctx.tokens))
            self.reset_engine()
        else:  # disk
            self.switch.set(True)
            self.tier.set_retention(False)
            self.reset_engine()
            self.tier.drop_memory_copy()
        self.quiet()
        if arm in RESTORE_ARMS:
            prep["kv_scrubbed"] = self.kv_digest.scrub()
        self._take_timelines()
        prep["memory_tier_bytes"] = self.tier.memory_bytes()
        return prep

    def expected_cached(self, arm: str, ctx: Context) -> int:
        return 0 if KIND[arm] == "recompute" else len(ctx.tokens)

    # -- what a tier records of one follow-up --
    def _take_timelines(self) -> list[dict]:
        if hasattr(self.tier, "take_restores"):
            return self.tier.take_restores()
        if hasattr(self.tier, "take_lookups"):
            return self.tier.take_lookups()
        return []

    def _tier_fields(self, result, timelines: list[dict], stats: dict | None) -> dict:
        """The GPU buffer: its restores and their split; vLLM's CPU tier: its external hits and lookups."""
        if self.tier_name == "gpubuf":
            out: dict = {"num_restores": len(timelines), "memory_tier_bytes_after": self.tier.memory_bytes()}
            # the forward pass that gave the follow-up's first token: its own span on the GPU (host stamps on CPU)
            steps = [s for s in self.tier.take_forward_steps()
                     if result.t_submit_ns <= s["t_start_ns"] <= result.t_first_token_ns]
            out["forward_step_s"] = steps[-1]["forward_s"] if steps else None  # the one that gave the first token
            out["forward_queue_s"] = steps[-1]["queue_s"] if steps else None  # ... and the host's time queueing it
            # ... and the host's path to it from where vLLM starts the step's loads (a resident step: the same point)
            out["forward_to_first_layer_s"] = steps[-1]["to_first_layer_s"] if steps else None
            if timelines:
                out["split"] = split = gpu_buffer_split(timelines[0], result.t_submit_ns, result.t_first_token_ns)
                # the engine thread from the restore's end to its forward pass's first attention layer: where a stall
                # the restore causes after its own windows would show (report.handoff_table)
                launched = timelines[0].get("t_launched_ns")
                after = [s["t_start_ns"] for s in steps if launched is not None and s["t_start_ns"] >= launched]
                split["to_forward_s"] = (after[0] - launched) / 1e9 if after else None
            return out
        if self.tier_name == "native":
            out = {"external_hit_tokens": int(stats.get("external_hits", 0)), "num_lookup_calls": len(timelines),
                   "vllm_stats": stats}
            if timelines and out["external_hit_tokens"]:
                out["split"] = offload_split(timelines, stats, result.t_submit_ns, result.t_first_token_ns)
            return out
        return {}

    def prepare_in_pair(self, arm: str, ctx: Context) -> dict:
        """The light preparation of a follow-up in the paired design (``run_pairs``), where the state the arm needs
        is already there: a restore of kind memory keeps the tier's copy from the last restore (retention on), so
        vLLM's prefix cache is reset and nothing else; a disk restore also empties the memory copy; a resident
        follow-up comes after a restore, whose blocks hold the context in vLLM's prefix cache, so only the tier is
        switched off (no reset, no warm-up prefill). A row whose follow-up did not find the context there is a
        ``cache_miss`` as in the grid."""
        kind = KIND[arm]
        if kind == "resident":
            self.switch.set(False)
            self.quiet()
        elif kind == "memory":
            self.switch.set(True)
            self.reset_engine()
        elif kind == "disk":
            self.switch.set(True)
            self.tier.set_retention(False)
            self.reset_engine()
            self.tier.drop_memory_copy()
        else:
            raise ValueError(f"{arm}: a pair holds a restore and its resident follow-up, not {kind}")
        self.quiet()
        # the restore lands in blocks its pair's last follow-up held: zeroed, so an equal digest shows it wrote them
        scrubbed = {"kv_scrubbed": self.kv_digest.scrub()} if arm in RESTORE_ARMS else {}
        self._take_timelines()
        return {"memory_tier_bytes": self.tier.memory_bytes(), **scrubbed}

    def run_pairs(self, arm: str, ctx: Context, tag: str, num_pairs: int, floor_kind: str | None = None,
                  context_bytes: int = 0, first_pair: int = 0) -> list[dict]:
        """``num_pairs`` pairs of a restore (``arm``) and its engine's resident follow-up (``RESIDENT_OF``), back to
        back on this engine, numbered from ``first_pair``: pair 0 after the arm's full preparation, restore first;
        then the order alternates by the pair's number (restore-resident, resident-restore, ...), so each pair's
        restore and resident follow-up are neighbours in time and neither always goes first. A second stage
        (``first_pair`` > 0: the pairs after a pilot of ``first_pair`` on the same engine, ``report.pair_plan``)
        continues the numbering and the alternation, and prepares nothing in full. Each row names its ``pair``,
        ``role`` and ``pair_position``. With ``floor_kind`` (a memory path's copy floor), each restore row also carries
        ``pair_floor_s``, one copy of the context's ``context_bytes`` timed right before it (``kv.floors.PairFloor``:
        the fastest of its ways, each in ``pair_floor_ways``; a way it could not set up in ``pair_floor_errors``).
        Every row carries ``host`` (``host_state``, read just before it): what a streak of slow requests ran beside."""
        from kmesh_lib.kv.floors import PairFloor

        resident = RESIDENT_OF[arm]
        floor = PairFloor(floor_kind, context_bytes, self.engine.params.DEVICE) if floor_kind else None
        out = []
        try:
            for k in range(first_pair, first_pair + num_pairs):
                order = [(arm, "restore"), (resident, "resident")]
                if k % 2:
                    order.reverse()
                for i, (a, role) in enumerate(order):
                    t0 = time.monotonic()
                    prep = self.prepare(a, ctx, f"{tag}-p{k}") if k == 0 and i == 0 else self.prepare_in_pair(a, ctx)
                    prep_s = time.monotonic() - t0
                    beside = {}
                    if floor is not None and role == "restore":
                        ways = floor.time_ways()
                        beside = {"pair_floor_s": min(ways.values()), "pair_floor_ways": ways,
                                  **({"pair_floor_errors": floor.errors} if floor.errors else {})}
                    beside["host"] = host_state(self.clocks)  # both roles: a streak in both arms is the engine's
                    row = self.measure(a, ctx, f"{tag}-p{k}-{role}", prep, prep_s)
                    row.update(pair=k, role=role, pair_arm=arm, pair_position=i, **beside)
                    out.append(row)
        finally:
            if floor is not None:
                floor.close()
        return out

    # -- one measured row --
    def run(self, arm: str, ctx: Context, tag: str) -> dict:
        t0 = time.monotonic()
        prep = self.prepare(arm, ctx, tag)
        return self.measure(arm, ctx, tag, prep, time.monotonic() - t0)

    def measure(self, arm: str, ctx: Context, tag: str, prep: dict, prep_s: float) -> dict:
        """One follow-up of ``arm`` from the state its preparation (``prep``, ``prep_s`` seconds) left."""
        rng = random.Random(f"followup-{tag}")
        specs = [RequestSpec(f"{tag}-f{i}", ctx.tokens + [rng.randrange(4, self.vocab) for _ in range(self.new_tokens)],
                             max_tokens=self.output_tokens) for i in range(self.followups)]
        meter = self.tier.meter
        s0 = meter.snapshot()
        stats0 = self.tier.stats.snapshot() if self.tier_name == "native" else None  # vLLM's own statistics
        clocks_before = self.clocks.read() if self.clocks else None  # outside the stopwatch
        wait_at = WAIT_AT_OF.get(arm)
        if wait_at:
            self.tier.set_wait_at(wait_at)
        handoff = arm in HANDOFF_ARMS
        if handoff:
            self.tier.set_launch_thread(True)
        if self.tier_name == "gpubuf":
            self.tier.take_forward_steps()  # the preparation's steps are not the follow-up's
            # the restore's events go on the clock by a reference taken here, outside the step (every arm alike)
            self.tier.take_reference()
        self.probe.start()
        try:
            results = run_group(self.engine, specs)
        finally:
            if wait_at:
                self.tier.set_wait_at(self.tier.config.wait_at)
            if handoff:
                self.tier.set_launch_thread(False)
        a = results[0]
        clocks_after = self.clocks.read() if self.clocks else None
        parts = self.probe.stop(a.first_token_s())
        self.quiet()
        clock = self.tier.reference_drift() if self.tier_name == "gpubuf" else None
        s1 = meter.snapshot()
        timelines = self._take_timelines()
        self.switch.set(True)
        cached = [r.num_cached_tokens for r in results]
        want = self.expected_cached(arm, ctx)
        if self.has_disk_tier:
            disk = {"disk_read_bytes": s1.hook_read_bytes - s0.hook_read_bytes,
                    "device_read_bytes": (s1.device_read_bytes - s0.device_read_bytes
                                          if s0.device_read_bytes is not None and s1.device_read_bytes is not None else None)}
        else:  # vLLM's CPU tier has no disk tier
            disk = {"disk_read_bytes": 0, "device_read_bytes": None}
        stats = VllmConnectorMeter.delta(stats0, self.tier.stats.snapshot()) if stats0 is not None else None
        kv = self._kv_check(arm, ctx, specs[0].request_id)
        return {"arm": arm, "tier": self.tier_name, "context": ctx.name, "context_tokens": len(ctx.tokens), "tag": tag,
                "status": "ok" if all(c == want for c in cached) else "cache_miss",
                "ttft_s": a.first_token_s(), "makespan_s": group_makespan_s(results, self.output_tokens),
                "num_cached_tokens": cached, "expected_cached_tokens": want, **disk,
                "prep_s": prep_s, **prep, "components": parts, **self._tier_fields(a, timelines, stats),
                **({"gpu_clocks": {"before": clocks_before, "after": clocks_after}} if self.clocks else {}),
                **({"reference_clock": clock} if clock else {}), **kv}

    def _kv_check(self, arm: str, ctx: Context, request_id: str) -> dict:
        """A restore's content check, after its follow-up finished and every stopwatch stopped: the digest of vLLM's
        blocks of the context in the first follow-up (``lmcache.probes.KvDigest``) against the digest of the blocks the
        context was computed into by ``store``, block by block (``lmcache.probes.compare_kv``: ``kv_digest_equal``, the
        tokens compared, those of differing blocks, those of blocks that held the same place in an earlier request of
        the context, where an equal digest may be the earlier KV left in the block); all None where either digest could
        not be taken (why: the child's ``kv_digest``). Only the restore arms (memory, disk); {} for the rest, which
        write no context into vLLM's blocks (recompute computes it, resident finds it there). The KV compared with is
        the store's, or for vLLM's CPU tier (no store step) the warm-up's that computed what the tier offloaded
        (``prepare``; before 7 Dec 2026 its restores were not compared)."""
        if arm not in RESTORE_ARMS:
            self.kv_digest.take(request_id, 0)  # forget the blocks of what finished meanwhile
            return {}
        return compare_kv(self.kv_digest.take(request_id, len(ctx.tokens)), self.stored_kv.get(ctx.name))
