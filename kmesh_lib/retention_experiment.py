"""Section 16: does keeping LMCache's copy stop repeat SSD reads?

A shared context sits on LMCache's disk tier. A one-token warm-up, started HEAD_START_S before a
group of follow-ups (A..N: the context plus an own suffix, OUTPUT_TOKENS each), loads it into vLLM.
Two arms differ only in whether LMCache keeps its in-memory copy outside vLLM after that load
(``retain``) or discards it (``discard``), so that the follow-ups' lookups reread the disk tier.
``recompute`` and ``floor`` (``retention_arms``) bracket them on a plain engine.

Modules: ``retention_protocol`` (groups, blocks), ``retention_report`` (tables, read invariants),
``lmcache_connect`` / ``lmcache_server`` (the tiers), ``disk_accounting`` (bytes per phase).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine_config import EngineParams
from .params import check
from .retention_arms import CONTROL_ARMS

PATHS = ("mp", "inproc")
MIB = 1 << 20


@dataclass(frozen=True)
class RetentionParams(EngineParams):
    PATHS: list[str] = field(default_factory=lambda: ["mp"])  # external-tier paths: mp, inproc
    CONTROL_ARMS: list[str] = field(default_factory=lambda: ["recompute", "floor"])  # [] skips the plain engine
    GROUP_SIZES: list[int] = field(default_factory=lambda: [4, 8])  # follow-ups per group
    CONTEXT_TOKENS: int = 4096  # the shared context (a multiple of CHUNK_SIZE)
    SUFFIX_TOKENS: int = 32  # each follow-up's own tokens after the context
    OUTPUT_TOKENS: int = 8  # tokens each follow-up generates (the makespan waits for the last)
    HEAD_START_S: float = 0.25  # the warm-up's lead over the follow-ups; it must finish within it
    WARMUP_GROUPS: int = 3  # unmeasured pairs first
    MEASURED_GROUPS: int = 5  # measured pairs (one group per arm each, alternating order)
    CONTROL_WARMUP_GROUPS: int = 1  # the same for the recompute/floor pairs
    CONTROL_MEASURED_GROUPS: int = 3
    MAX_RETRY_PAIRS: int = 5  # extra pairs allowed to replace pairs with a group that was not ok
    CHUNK_SIZE: int = 256  # LMCache chunk, tokens
    ARENA_MIB: int = 512  # LMCache's memory tier outside vLLM (MP: L1 DRAM arena; in-process: LocalCPU)
    DISK_TIER_MIB: int = 2048  # in-process LocalDiskBackend capacity
    DISK_TIER_ROOT: str = ""  # where run-scoped disk tiers go ("" = $KMESH_LMCACHE_RUNTIME or /tmp/kmesh-lmcache)
    SOURCE_RUN: str | None = None  # a finished run dir (e.g. the GPU run) to analyse instead of measuring

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.PATHS and set(self.PATHS) <= set(PATHS), f"PATHS={self.PATHS}: choose from {', '.join(PATHS)}")
        check(set(self.CONTROL_ARMS) <= set(CONTROL_ARMS),
              f"CONTROL_ARMS={self.CONTROL_ARMS}: choose from {', '.join(CONTROL_ARMS)} (or [])")
        check(self.GROUP_SIZES and all(n >= 1 for n in self.GROUP_SIZES), f"GROUP_SIZES={self.GROUP_SIZES}: each >= 1")
        check(self.CHUNK_SIZE > 0 and self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.CONTEXT_TOKENS >= self.CHUNK_SIZE and self.CONTEXT_TOKENS % self.CHUNK_SIZE == 0,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must be a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE} "
              "(LMCache stores whole chunks only)")
        check(self.SUFFIX_TOKENS >= 1 and self.OUTPUT_TOKENS >= 1, "SUFFIX_TOKENS and OUTPUT_TOKENS must be >= 1")
        check(self.SUFFIX_TOKENS + self.OUTPUT_TOKENS < self.CHUNK_SIZE,
              f"SUFFIX_TOKENS + OUTPUT_TOKENS = {self.SUFFIX_TOKENS + self.OUTPUT_TOKENS}: must stay below "
              f"CHUNK_SIZE={self.CHUNK_SIZE}, so no follow-up completes (and stores) a chunk of its own")
        longest = self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.OUTPUT_TOKENS
        check(longest <= self.MAX_MODEL_LEN, f"CONTEXT_TOKENS + SUFFIX_TOKENS + OUTPUT_TOKENS = {longest} "
                                             f"exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        check(self.HEAD_START_S > 0, f"HEAD_START_S={self.HEAD_START_S}: must be > 0")
        check(self.WARMUP_GROUPS >= 0 and self.CONTROL_WARMUP_GROUPS >= 0 and self.MAX_RETRY_PAIRS >= 0,
              "WARMUP_GROUPS, CONTROL_WARMUP_GROUPS and MAX_RETRY_PAIRS must be >= 0")
        check(self.MEASURED_GROUPS >= 1 and self.CONTROL_MEASURED_GROUPS >= 1,
              "MEASURED_GROUPS and CONTROL_MEASURED_GROUPS must be >= 1")
        need = blocks_for_group(self, max(self.GROUP_SIZES))
        check(need <= self.NUM_GPU_BLOCKS - 1,
              f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: a group of {max(self.GROUP_SIZES)} sharing the context needs "
              f"{need} blocks (+1 null block)")
        ctx_mib = self.CONTEXT_TOKENS * kv_bytes_per_token(self) / MIB
        check(self.ARENA_MIB >= ctx_mib,
              f"ARENA_MIB={self.ARENA_MIB}: the arena is too small for the shared context ({ctx_mib:.1f} MiB of KV)")
        if "inproc" in self.PATHS:
            check(self.DISK_TIER_MIB >= ctx_mib, f"DISK_TIER_MIB={self.DISK_TIER_MIB}: smaller than the shared "
                                                 f"context ({ctx_mib:.1f} MiB)")


def kv_bytes_per_token(cfg) -> int:
    from .model_spec import resolve

    return resolve(cfg.MODEL).kv_bytes_per_token(cfg.DTYPE)


def blocks_for_group(cfg, n: int) -> int:
    """Blocks a group holds at once when it shares the context: context blocks + each request's tail."""
    ctx_blocks = cfg.CONTEXT_TOKENS // cfg.BLOCK_SIZE
    tail = cfg.CONTEXT_TOKENS % cfg.BLOCK_SIZE + cfg.SUFFIX_TOKENS + cfg.OUTPUT_TOKENS
    return ctx_blocks + n * -(-tail // cfg.BLOCK_SIZE)


def plan(cfg: RetentionParams) -> dict:
    """What ``kmesh plan 16`` prints: no engine or server is started."""
    from .lmcache_connect import inproc_support

    kv = kv_bytes_per_token(cfg)
    ctx = cfg.CONTEXT_TOKENS * kv
    chunk = cfg.CHUNK_SIZE * kv
    block_bytes = cfg.BLOCK_SIZE * kv
    pairs = cfg.WARMUP_GROUPS + cfg.MEASURED_GROUPS
    out = {
        "question": "Does keeping LMCache's copy stop repeat SSD reads?",
        "shared context": f"{cfg.CONTEXT_TOKENS} tokens of {cfg.MODEL} ({cfg.DTYPE}) = {ctx / MIB:.1f} MiB of KV, "
                          f"{cfg.CONTEXT_TOKENS // cfg.CHUNK_SIZE} LMCache chunks of {chunk / MIB:.2f} MiB",
        "engine KV pool": f"{cfg.NUM_GPU_BLOCKS} blocks of {cfg.BLOCK_SIZE} tokens = {cfg.NUM_GPU_BLOCKS * block_bytes / MIB:.0f} MiB",
        "external arena": f"{cfg.ARENA_MIB} MiB",
        "groups": f"sizes {cfg.GROUP_SIZES}; {cfg.WARMUP_GROUPS} warm-up + {cfg.MEASURED_GROUPS} measured pairs "
                  f"(retain, discard alternating); warm-up head start {cfg.HEAD_START_S} s",
        "expected disk reads per group": f"discard {(1 + max(cfg.GROUP_SIZES)) * ctx / MIB:.0f} MiB at N={max(cfg.GROUP_SIZES)} "
                                         f"(1 + N x context); retain {ctx / MIB:.0f} MiB (once)",
    }
    for path in cfg.PATHS:
        ok, why = inproc_support(cfg.DEVICE) if path == "inproc" else (True, "LMCacheMPConnector + lmcache server")
        out[f"path {path}"] = ("runs: " if ok else "not available: ") + why
        out[f"engines for {path}"] = f"{len(cfg.GROUP_SIZES)} x {pairs * 2}+ groups" if ok else "none"
        if path == "mp" and ok:
            staging = max(cfg.GROUP_SIZES) * ctx / MIB
            out["MP discard staging"] = (f"up to {staging:.0f} MiB of L1 when {max(cfg.GROUP_SIZES)} lookups reread at once"
                                         + ("" if staging <= 0.8 * cfg.ARENA_MIB else
                                            " -- above the 80 % eviction watermark: expect arena_short groups"))
    if cfg.CONTROL_ARMS:
        out["control arms"] = (f"{', '.join(cfg.CONTROL_ARMS)} on a plain engine per group size; "
                               f"{cfg.CONTROL_WARMUP_GROUPS} warm-up + {cfg.CONTROL_MEASURED_GROUPS} measured pairs")
    out["external tier in GPU memory"] = "a separate arm where the installed LMCache has one (checked at run time)"
    if cfg.SOURCE_RUN:
        out["source"] = f"analyses {cfg.SOURCE_RUN} (no engine starts)"
    return out


def measure(cfg: RetentionParams, record=None, log=print, isolate=("inproc",)) -> tuple[list[dict], list[dict]]:
    """Runs every block: each external path per group size, then the control arms per group size.

    Returns (groups, block summaries); both also go to ``raw/`` as they finish. Blocks of the paths
    in ``isolate`` run in a child process (``retention_child``; needs ``record``): in-process LMCache
    keeps process-wide state. A path the installed LMCache does not support on this device is
    skipped with a note (``retention_report.unavailable_rows``), as is an external tier in GPU memory.
    """
    from .lmcache_connect import gpu_tier_support, inproc_support
    from .retention_child import run_block_in_child
    from .retention_protocol import Block

    groups, blocks = [], []

    def not_available(path: str, why: str, n=None) -> None:
        blocks.append({"block": f"{path}" + (f"-N{n}" if n else ""), "path": path, "group_size": n,
                       "status": "not available", "detail": why})
        if record is not None:
            record.append_jsonl("blocks.jsonl", blocks[-1])
        log(f"{blocks[-1]['block']}: not available: {why}")

    runs = [(p, n) for p in cfg.PATHS for n in cfg.GROUP_SIZES]
    runs += [("engine", n) for n in cfg.GROUP_SIZES] if cfg.CONTROL_ARMS else []
    for path, n in runs:
        if path == "inproc" and not inproc_support(cfg.DEVICE)[0]:
            not_available(path, inproc_support(cfg.DEVICE)[1], n)
            continue
        if record is not None and (path in isolate or "all" in isolate):
            summary, block_groups = run_block_in_child(record.run_dir, path, n, log=log)
        else:
            block = Block(cfg, path, n, log=log).run(record)
            summary, block_groups = block.summary, block.groups
        groups += block_groups
        blocks.append(summary)
    has_tier, why = gpu_tier_support()
    if not has_tier:  # a separate arm; never the host path relabelled
        not_available("gpu-tier", why)
    return groups, blocks


def load_source_run(source: str, record=None) -> tuple[list[dict], list[dict]]:
    """Groups and blocks of a finished run (e.g. the GPU run), copied into this run's ``raw/``."""
    import json
    import shutil
    from pathlib import Path

    import yaml

    from .verify import read_jsonl

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


def verify(run_dir) -> list:
    """Recomputes the read invariants from ``raw/groups.jsonl`` (not from what the notebook printed)."""
    from pathlib import Path

    from .retention_report import read_invariants
    from .verify import Check, read_jsonl

    path = Path(run_dir) / "raw" / "groups.jsonl"
    if not path.exists():
        return [Check("raw/groups.jsonl exists", False, "no groups were recorded")]
    return [Check(f"raw: {name}", ok, detail)
            for name, ok, detail, required in read_invariants(read_jsonl(path)) if required]
