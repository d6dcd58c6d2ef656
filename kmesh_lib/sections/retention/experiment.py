"""Section 16: does keeping LMCache's copy stop repeat SSD reads?

A shared context sits on LMCache's disk tier. A one-token warm-up, started HEAD_START_S before a
group of follow-ups (A..N: the context plus an own suffix, MAX_TOKENS each), loads it into vLLM.
Two arms differ only in whether LMCache keeps its in-memory copy outside vLLM after that load
(``retain``) or discards it (``discard``), so that the follow-ups' lookups reread the disk tier.
``recompute`` and ``floor`` (``workloads.context_arms``) bracket them on a plain engine.

Modules: ``workloads.context_groups`` (groups, blocks), ``app.registry.retention.report`` (tables, read invariants),
``lmcache.connect`` / ``lmcache.server`` (the tiers), ``lmcache.disk_accounting`` (bytes per phase).
"""
from __future__ import annotations

from kmesh_lib.lmcache.connect import gpu_tier_support, inproc_support
from kmesh_lib.sections.retention.child import run_block_in_child
from kmesh_lib.sections.retention.params import MIB, RetentionParams
from kmesh_lib.workloads.context_groups import Block, kv_bytes_per_token


def plan(cfg: RetentionParams) -> dict:
    """What ``kmesh plan 16`` prints: no engine or server is started."""

    kv = kv_bytes_per_token(cfg)
    ctx = cfg.CONTEXT_TOKENS * kv
    chunk = cfg.CHUNK_SIZE * kv
    block_bytes = cfg.BLOCK_SIZE * kv
    pairs = cfg.WARMUP_GROUPS + cfg.MEASURED_GROUPS
    out = {
        "question": "Does keeping LMCache's copy stop repeat SSD reads?",
        "shared context": f"{cfg.CONTEXT_TOKENS} tokens of {cfg.MODEL} ({cfg.DTYPE}) = {ctx / MIB:.1f} MiB of KV, "
                          f"{cfg.CONTEXT_TOKENS // cfg.CHUNK_SIZE} LMCache chunks of {chunk / MIB:.2f} MiB",
        "engine KV pool": f"{cfg.NUM_GPU_BLOCKS} blocks of {cfg.BLOCK_SIZE} tokens = "
                          f"{cfg.NUM_GPU_BLOCKS * block_bytes / MIB:.0f} MiB",
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
    in ``isolate`` run in a child process (``app.registry.retention.child``; needs ``record``): in-process LMCache
    keeps process-wide state. A path the installed LMCache does not support on this device is
    skipped with a note (``app.registry.retention.report.unavailable_rows``), as is an external tier in GPU memory.
    """

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


