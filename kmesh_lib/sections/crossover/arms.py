"""The standard restore arms: where one follow-up finds the shared context, measured one way.

    arm         the context before the follow-up            preparation (not timed)                          expected cached
    recompute   nowhere: no external cache, APC reset       reset vLLM's prefix cache; LMCache switched off   0
    dram        LMCache's memory tier (L1 arena/LocalCPU)   disk-only; a warm-up loads it and LMCache keeps    the whole context
                                                            its copy; reset vLLM's prefix cache
    disk        LMCache's disk tier only (O_DIRECT)         reset vLLM's prefix cache; drop LMCache's memory  the whole context
                                                            copy
    floor       vLLM's prefix cache (engine-resident)       LMCache off; a full prefill of context + 1 token  the whole context

All four run on one engine with an LMCache connector (``RestoreBench``): the control arms turn
LMCache off with ``ExternalSwitch`` rather than starting a second engine. The follow-up is the
context plus SUFFIX_TOKENS own tokens, MAX_TOKENS out; both stopwatches start at its
submission: first token (``ttft_s``) and the group's last token (``makespan_s``).

Invariants:
    - before any follow-up is submitted the engine has no request and LMCache no I/O in flight
      (``drain`` + ``settle``), so an arm's time is its own;
    - a context is a whole number of LMCache chunks and vLLM blocks, so a restore can cover all of it;
    - every row carries ``num_cached_tokens`` per follow-up and the arm's expected value; a row whose
      follow-ups did not hit exactly that is ``status: cache_miss`` and enters no table.

Sections 16 and 20 import ``ARMS`` and ``RestoreBench``; ``bench.run(arm, context, tag)`` is one row.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from kmesh_lib.engine.requests import RequestSpec, group_makespan_s, run_group
from kmesh_lib.lmcache.probes import ComponentProbe, ExternalSwitch

ARM_NAMES = ("recompute", "dram", "disk", "floor")
RESTORE_ARMS = ("dram", "disk")


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


class RestoreBench:
    """One engine, its LMCache tier (``lmcache.connect``), the off switch and the component probe."""

    def __init__(self, engine, tier, new_tokens: int = 32, output_tokens: int = 1, followups: int = 1) -> None:
        self.engine, self.tier = engine, tier
        self.new_tokens, self.output_tokens, self.followups = new_tokens, output_tokens, followups
        self.probe = ComponentProbe(engine)
        self.switch = ExternalSwitch(engine, self.probe)
        self.vocab = engine.spec.config["vocab_size"]

    # -- states --
    def quiet(self) -> None:
        """No request in the engine, no LMCache I/O in flight."""
        self.engine.drain()
        self.tier.settle()

    def reset_engine(self) -> None:
        self.quiet()
        if not self.engine.reset_prefix_cache():
            raise ArmError("vLLM refused to reset its prefix cache")

    def store(self, ctx: Context) -> dict:
        """Computes ``ctx`` once with LMCache on; LMCache writes it to the disk tier and keeps no memory copy."""
        meter = self.tier.meter
        self.switch.set(True)
        self.tier.set_retention(False)
        self.reset_engine()
        before, t0 = meter.snapshot(), time.monotonic()
        run_group(self.engine, [RequestSpec(f"store-{ctx.name}", ctx.tokens + [5], max_tokens=1)])
        self.quiet()
        self.tier.drop_memory_copy()
        after = meter.snapshot()
        return {"context": ctx.name, "bytes_written": after.hook_write_bytes - before.hook_write_bytes,
                "write_errors": after.hook_write_errors - before.hook_write_errors, "seconds": time.monotonic() - t0}

    def _warm(self, ctx: Context, tag: str) -> int:
        return run_group(self.engine, [RequestSpec(f"{tag}-warm", ctx.tokens + [6], max_tokens=1)])[0].num_cached_tokens

    def prepare(self, arm: str, ctx: Context, tag: str) -> dict:
        """Puts the context where ``arm`` wants it; returns what the preparation saw."""
        prep: dict = {}
        if arm in ("recompute", "floor"):
            self.switch.set(False)
            self.reset_engine()
            if arm == "floor":
                prep["warm_cached_tokens"] = self._warm(ctx, tag)
        elif arm == "dram":
            self.switch.set(True)
            self.reset_engine()
            self.tier.drop_memory_copy()
            self.tier.set_retention(True)
            prep["warm_cached_tokens"] = self._warm(ctx, tag)  # loaded from disk, kept in memory
            self.reset_engine()
        elif arm == "disk":
            self.switch.set(True)
            self.tier.set_retention(False)
            self.reset_engine()
            self.tier.drop_memory_copy()
        else:
            raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARM_NAMES)}")
        self.quiet()
        prep["memory_tier_bytes"] = self.tier.memory_bytes()
        return prep

    def expected_cached(self, arm: str, ctx: Context) -> int:
        return 0 if arm == "recompute" else len(ctx.tokens)

    # -- one measured row --
    def run(self, arm: str, ctx: Context, tag: str) -> dict:
        t0 = time.monotonic()
        prep = self.prepare(arm, ctx, tag)
        prep_s = time.monotonic() - t0
        rng = random.Random(f"followup-{tag}")
        specs = [RequestSpec(f"{tag}-f{i}", ctx.tokens + [rng.randrange(4, self.vocab) for _ in range(self.new_tokens)],
                             max_tokens=self.output_tokens) for i in range(self.followups)]
        meter = self.tier.meter
        s0 = meter.snapshot()
        self.probe.start()
        results = run_group(self.engine, specs)
        a = results[0]
        parts = self.probe.stop(a.first_token_s())
        self.quiet()
        s1 = meter.snapshot()
        self.switch.set(True)
        cached = [r.num_cached_tokens for r in results]
        want = self.expected_cached(arm, ctx)
        return {"arm": arm, "context": ctx.name, "context_tokens": len(ctx.tokens), "tag": tag,
                "status": "ok" if all(c == want for c in cached) else "cache_miss",
                "ttft_s": a.first_token_s(), "makespan_s": group_makespan_s(results, self.output_tokens),
                "num_cached_tokens": cached, "expected_cached_tokens": want,
                "disk_read_bytes": s1.hook_read_bytes - s0.hook_read_bytes,
                "device_read_bytes": (s1.device_read_bytes - s0.device_read_bytes
                                      if s0.device_read_bytes is not None and s1.device_read_bytes is not None else None),
                "prep_s": prep_s, **prep, "components": parts}
