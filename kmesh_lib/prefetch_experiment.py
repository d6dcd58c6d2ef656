"""Section 20: does loading shared context early help, once repeat reads are gone?

A shared context sits on LMCache's disk tier; LMCache keeps its copy once loaded (retention on),
so every arm reads the disk tier once per group. A group of follow-ups (context + own suffix,
OUTPUT_TOKENS each) is due at T. ``on_arrival`` loads the context when they arrive; ``early``
starts preparing it LEAD before T (``prefetch``). The pilot runs every lead in LEADS_MS and picks
the shortest lead at which every pilot group was ready; the confirmation compares on_arrival with
early at that lead (and at FIXED_LEAD_MS, section 16's start), beside two placement controls:
the context already in LMCache's memory tier (``dram``) and already in vLLM (``engine``, the floor).

Modules: ``prefetch`` (the driver, readiness), ``prefetch_protocol`` (engine runs, arms),
``prefetch_stats`` (bootstrap, tables), ``prefetch_widgets`` (the interactive panel).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine_config import EngineParams
from .params import check

PATHS = ("mp", "inproc")
CONTROLS = ("dram", "engine")
MIB = 1 << 20


@dataclass(frozen=True)
class PrefetchParams(EngineParams):
    PATHS: list[str] = field(default_factory=lambda: ["mp"])  # mp (LMCacheMPConnector + server), inproc (LMCacheConnectorV1)
    GROUP_SIZES: list[int] = field(default_factory=lambda: [4, 8])  # follow-ups per group
    CONTEXT_TOKENS: int = 4096  # the shared context (a multiple of CHUNK_SIZE)
    SUFFIX_TOKENS: int = 32  # each follow-up's own tokens
    OUTPUT_TOKENS: int = 8  # tokens each follow-up generates
    LEADS_MS: list[float] = field(default_factory=lambda: [0.0, 25.0, 100.0, 250.0])  # pilot lead times
    FIXED_LEAD_MS: float = 250.0  # section 16's fixed start: the savings are also given from it
    PILOT_GROUPS: int = 10  # pilot groups per lead, path and group size
    MEASURED_GROUPS: int = 200  # confirmation groups per arm, path and group size (over ENGINE_RUNS)
    ENGINE_RUNS: int = 10  # fresh engine runs the confirmation is spread over
    WARMUP_PAIRS: int = 1  # unmeasured pairs at the start of each engine run
    CONTROLS: list[str] = field(default_factory=lambda: ["dram", "engine"])  # placement controls; [] skips
    BOOTSTRAP_RESAMPLES: int = 10000  # 95 % percentile intervals, numpy, seeded with SEED
    DRIVER_POLL_MS: float = 0.5  # the driver's idle wait between checks
    PREFETCH_POLL_MS: float = 2.0  # between GET /cache/prefetches/{id} polls (MP)
    CHUNK_SIZE: int = 256  # LMCache chunk, tokens
    ARENA_MIB: int = 512  # LMCache's memory tier
    DISK_TIER_MIB: int = 2048  # in-process LocalDiskBackend capacity
    DISK_TIER_ROOT: str = ""  # "" = $KMESH_LMCACHE_RUNTIME or /tmp/kmesh-lmcache
    WIDGET_GROUPS: int = 2  # groups per lead in the panel's live re-run
    SOURCE_RUN: str | None = None  # a finished run dir (the GPU run) to analyse instead of measuring

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.PATHS and set(self.PATHS) <= set(PATHS), f"PATHS={self.PATHS}: choose from {', '.join(PATHS)}")
        check(set(self.CONTROLS) <= set(CONTROLS), f"CONTROLS={self.CONTROLS}: choose from {', '.join(CONTROLS)} (or [])")
        check(self.GROUP_SIZES and all(n >= 1 for n in self.GROUP_SIZES), f"GROUP_SIZES={self.GROUP_SIZES}: each >= 1")
        check(self.LEADS_MS and all(x >= 0 for x in self.LEADS_MS), f"LEADS_MS={self.LEADS_MS}: non-empty, each >= 0")
        check(list(self.LEADS_MS) == sorted(set(self.LEADS_MS)), f"LEADS_MS={self.LEADS_MS}: ascending, no repeats")
        check(self.FIXED_LEAD_MS > 0, f"FIXED_LEAD_MS={self.FIXED_LEAD_MS}: must be > 0")
        check(self.PILOT_GROUPS >= 1, f"PILOT_GROUPS={self.PILOT_GROUPS}: must be >= 1")
        check(self.ENGINE_RUNS >= 1, f"ENGINE_RUNS={self.ENGINE_RUNS}: must be >= 1")
        check(self.MEASURED_GROUPS >= self.ENGINE_RUNS,
              f"MEASURED_GROUPS={self.MEASURED_GROUPS}: at least one per engine run (ENGINE_RUNS={self.ENGINE_RUNS})")
        check(self.WARMUP_PAIRS >= 0, f"WARMUP_PAIRS={self.WARMUP_PAIRS}: must be >= 0")
        check(self.BOOTSTRAP_RESAMPLES >= 100, f"BOOTSTRAP_RESAMPLES={self.BOOTSTRAP_RESAMPLES}: must be >= 100")
        check(self.DRIVER_POLL_MS > 0 and self.PREFETCH_POLL_MS > 0, "DRIVER_POLL_MS and PREFETCH_POLL_MS must be > 0")
        check(self.CHUNK_SIZE > 0 and self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.CONTEXT_TOKENS >= self.CHUNK_SIZE and self.CONTEXT_TOKENS % self.CHUNK_SIZE == 0,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must be a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE}")
        check(self.SUFFIX_TOKENS >= 1 and self.OUTPUT_TOKENS >= 1, "SUFFIX_TOKENS and OUTPUT_TOKENS must be >= 1")
        check(self.SUFFIX_TOKENS + self.OUTPUT_TOKENS < self.CHUNK_SIZE,
              f"SUFFIX_TOKENS + OUTPUT_TOKENS must stay below CHUNK_SIZE={self.CHUNK_SIZE} (no follow-up stores a chunk)")
        longest = self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.OUTPUT_TOKENS
        check(longest <= self.MAX_MODEL_LEN, f"context + suffix + output = {longest} exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        from .retention_experiment import blocks_for_group, kv_bytes_per_token

        need = blocks_for_group(self, max(self.GROUP_SIZES) + 1)  # + the warm-up
        check(need <= self.NUM_GPU_BLOCKS - 1, f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: a group of "
                                               f"{max(self.GROUP_SIZES)} and the warm-up need {need} blocks (+1 null)")
        ctx_mib = self.CONTEXT_TOKENS * kv_bytes_per_token(self) / MIB
        check(self.ARENA_MIB >= 2 * ctx_mib, f"ARENA_MIB={self.ARENA_MIB}: needs room for twice the context "
                                             f"({ctx_mib:.1f} MiB each: the retained copy and a staging copy)")

    @property
    def pairs_per_run(self) -> int:
        return -(-self.MEASURED_GROUPS // self.ENGINE_RUNS)


def confirm_arms(cfg: PrefetchParams, lead_ms: float) -> list[tuple[str, float]]:
    """(arm, lead_s) in pair order; ``early_fixed`` only when the chosen lead is not the fixed one."""
    arms = [("on_arrival", 0.0), ("early", lead_ms / 1e3)]
    if lead_ms != cfg.FIXED_LEAD_MS:
        arms.append(("early_fixed", cfg.FIXED_LEAD_MS / 1e3))
    return arms + [(c, 0.0) for c in cfg.CONTROLS]


def plan(cfg: PrefetchParams) -> dict:
    """What ``kmesh plan 20`` prints: no engine or server is started."""
    from .lmcache_connect import inproc_support
    from .retention_experiment import kv_bytes_per_token

    kv = kv_bytes_per_token(cfg)
    arms = 3 + len(cfg.CONTROLS)
    per_run = (cfg.WARMUP_PAIRS + cfg.pairs_per_run) * arms
    out = {
        "question": "Does loading shared context early help, once repeat reads are gone?",
        "shared context": f"{cfg.CONTEXT_TOKENS} tokens of {cfg.MODEL} ({cfg.DTYPE}) = {cfg.CONTEXT_TOKENS * kv / MIB:.1f} MiB "
                          f"of KV in {cfg.CONTEXT_TOKENS // cfg.CHUNK_SIZE} chunks; LMCache keeps its copy (read once per group)",
        "pilot": f"leads {cfg.LEADS_MS} ms x {cfg.PILOT_GROUPS} early groups per path and group size (first engine run)",
        "confirmation": f"{cfg.MEASURED_GROUPS} groups per arm over {cfg.ENGINE_RUNS} fresh engine runs "
                        f"({cfg.pairs_per_run} pairs + {cfg.WARMUP_PAIRS} warm-up per run, alternating order); "
                        f"arms on_arrival, early (chosen lead), early_fixed ({cfg.FIXED_LEAD_MS:.0f} ms), {', '.join(cfg.CONTROLS)}",
        "groups per engine run": f"{per_run} (+ {len(cfg.LEADS_MS) * cfg.PILOT_GROUPS} pilot groups in run 0)",
        "group sizes": str(cfg.GROUP_SIZES),
    }
    for path in cfg.PATHS:
        ok, why = inproc_support(cfg.DEVICE) if path == "inproc" else (True, "LMCacheMPConnector + lmcache server")
        prep = "HTTP prefetch (POST /cache/prefetches) + one-token warm-up" if path == "mp" else \
            "one-token warm-up only (no application prefetch API in-process)"
        out[f"path {path}"] = ("runs: " if ok else "not available: ") + why + (f"; early path = {prep}" if ok else "")
    if cfg.SOURCE_RUN:
        out["source"] = f"analyses {cfg.SOURCE_RUN} (no engine starts)"
    return out


def measure(cfg: PrefetchParams, record=None, log=print) -> tuple[list[dict], list[dict]]:
    """Pilot + confirmation for every path and group size. Returns (groups, engine-run summaries)."""
    from .lmcache_connect import inproc_support
    from .prefetch_protocol import run_engine

    groups, runs = [], []
    for path in cfg.PATHS:
        if path == "inproc" and not inproc_support(cfg.DEVICE)[0]:
            runs.append({"block": "inproc", "path": path, "status": "not available", "detail": inproc_support(cfg.DEVICE)[1]})
            if record is not None:
                record.append_jsonl("blocks.jsonl", runs[-1])
            continue
        for n in cfg.GROUP_SIZES:
            lead = None
            for r in range(cfg.ENGINE_RUNS):
                g, s = run_engine(cfg, path, n, r, lead, record, log)
                lead = s.get("lead_ms", lead)
                groups += g
                runs.append(s)
    return groups, runs


def load_source_run(source: str, record=None) -> tuple[list[dict], list[dict]]:
    """Groups and engine runs of a finished run (the GPU run), copied into this run's ``raw/``."""
    from .retention_experiment import load_source_run as load

    return load(source, record)


def verify(run_dir) -> list:
    """Recomputes readiness and the read-once invariant from ``raw/groups.jsonl``."""
    from pathlib import Path

    from .prefetch_stats import invariants
    from .verify import Check, read_jsonl

    path = Path(run_dir) / "raw" / "groups.jsonl"
    if not path.exists():
        return [Check("raw/groups.jsonl exists", False, "no groups were recorded")]
    return [Check(f"raw: {name}", ok, detail) for name, ok, detail in invariants(read_jsonl(path))]
