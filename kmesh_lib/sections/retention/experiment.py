"""Section 16: does keeping LMCache's copy stop repeat SSD reads?

A shared context sits on LMCache's disk tier. A one-token warm-up, started HEAD_START_S before a
group of follow-ups (A..N: the context plus an own suffix, MAX_TOKENS each), loads it into vLLM.
Two arms differ only in whether LMCache keeps its in-memory copy outside vLLM after that load
(``retain``) or discards it (``discard``), so that the follow-ups' lookups reread the disk tier.
``recompute`` and ``floor`` (``workloads.context_arms``) bracket them on a plain engine.

A run is one folder. On the CPU the notebook measures into it. On a GPU, ``sections.retention.gpu``
(the driver, no notebook stack) writes the complete folder on the measuring machine -- params,
``env.json``, raw records, results and checks -- and ``kmesh run 16 --source-run DIR`` later renders
the notebook *into that same folder* (``SOURCE_RUN``): nothing is measured or copied again,
``env.json`` stays the GPU machine's, and the rendering machine is recorded as ``render_environment``.

Modules: ``workloads.context_groups`` (groups, blocks), ``sections.retention.report`` (tables),
``sections.retention.checks`` (checks, counts), ``sections.retention.summary`` (headline, answer,
public results), ``lmcache.connect`` / ``lmcache.server`` (the tiers), ``lmcache.disk_accounting``.
"""
from __future__ import annotations

from pathlib import Path

from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import RunRecord
from kmesh_lib.lmcache.connect import gpu_tier_support, inproc_support
from kmesh_lib.sections.retention.child import run_block_in_child
from kmesh_lib.sections.retention.params import MIB, RetentionParams
from kmesh_lib.sections.retention.report import arm_rows, ratio_rows, rereads_by_block, unavailable_rows
from kmesh_lib.workloads.context_groups import Block, kv_bytes_per_token

# Seconds per group and per engine start (low, high), read off the published runs' raw records (group
# timestamps, engine_start_s) by profile; the smoke figures from the golden runs on the 2-core CPU machine.
# Per group size N: an external group (retain or discard), a control group (recompute or floor).
TIMING = {
    "smoke": {"external_s": {4: (1.2, 2.0)}, "control_s": {4: (0.5, 1.5)}, "start_s": (13.0, 45.0),
              "source": "the smoke goldens (tiny shape, 2 CPU cores)"},
    "cpu": {"external_s": {4: (1.2, 1.6), 8: (1.4, 1.9)}, "control_s": {4: (0.6, 0.9), 8: (0.7, 1.0)},
            "start_s": (12.0, 20.0), "source": "outputs/retention/cpu-20261129-201843"},
    "gpu": {"external_s": {4: (0.35, 0.5), 8: (0.4, 0.55)}, "control_s": {4: (0.05, 0.15), 8: (0.05, 0.15)},
            "start_s": (25.0, 45.0), "source": "outputs/retention/gpu-20261129-203231-device (H200, one child per block)"},
}


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
    out["expected duration"] = expected_duration(cfg)
    if cfg.SOURCE_RUN:
        out["source"] = f"renders {cfg.SOURCE_RUN} in place (no engine starts)"
    return out


def _nearest(table: dict[int, tuple], n: int) -> tuple[float, float]:
    return table[min(table, key=lambda k: abs(k - n))]


def expected_duration(cfg: RetentionParams) -> str:
    """From the sizes: engine starts x start time + groups x time per group, low to high.

    Times per group come from the profile's published run (``TIMING``) and scale with the number
    of groups only; a changed context size or model moves them, so the range is a guide.
    """
    timing = TIMING.get(cfg.PROFILE)
    if timing is None:
        return f"no timing recorded for profile {cfg.PROFILE!r}"
    low = high = 0.0
    for n in cfg.GROUP_SIZES:
        for path in cfg.PATHS:
            if path == "inproc" and not inproc_support(cfg.DEVICE)[0]:
                continue
            groups = 2 * (cfg.WARMUP_GROUPS + cfg.MEASURED_GROUPS)
            per = _nearest(timing["external_s"], n)
            low, high = low + timing["start_s"][0] + groups * per[0], high + timing["start_s"][1] + groups * per[1]
        if cfg.CONTROL_ARMS:
            groups = len(cfg.CONTROL_ARMS) * (cfg.CONTROL_WARMUP_GROUPS + cfg.CONTROL_MEASURED_GROUPS)
            per = _nearest(timing["control_s"], n)
            low, high = low + timing["start_s"][0] + groups * per[0], high + timing["start_s"][1] + groups * per[1]
    mid = (low + high) / 2
    return (f"about {_minutes(mid)} ({_minutes(low)} to {_minutes(high)}; retried pairs add to it), from the times per "
            f"group and engine start of {timing['source']}")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def run_folder(path: str) -> Path:
    """A run folder named in the params: absolute, or relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def open_record(cfg: RetentionParams) -> RunRecord:
    """A new run folder, or (``SOURCE_RUN``) the measured run's own folder, rendered in place."""
    if cfg.SOURCE_RUN:
        return RunRecord.render("retention", run_folder(cfg.SOURCE_RUN))
    return RunRecord.open("retention", cfg)


def recorded(record: RunRecord) -> tuple[list[dict], list[dict]]:
    """The groups and engine-run summaries the measurement wrote to ``raw/`` (read, never copied)."""
    run = record.files()
    return run.raw("groups.jsonl"), run.raw("blocks.jsonl")


def measure(cfg: RetentionParams, record=None, log=print, isolate=("inproc",)) -> tuple[list[dict], list[dict]]:
    """Runs every block: each external path per group size, then the control arms per group size.

    Returns (groups, block summaries); both also go to ``raw/`` as they finish. Blocks of the paths
    in ``isolate`` run in a child process (``sections.retention.child``; needs ``record``): in-process LMCache
    keeps process-wide state. A path the installed LMCache does not support on this device is
    skipped with a note (``sections.retention.report.unavailable_rows``), as is an external tier in GPU memory.
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




def save_tables(record: RunRecord, groups: list[dict], blocks: list[dict]) -> dict[str, list | dict]:
    """The tables results.json states, from the group records (the notebook and the GPU driver alike)."""
    arms = arm_rows(groups)
    tables = {"blocks": blocks, "arms": arms, "discard_to_retain": ratio_rows(arms), "not_run": unavailable_rows(blocks),
              "rereads": rereads_by_block(groups)}
    for name, value in tables.items():
        record.save(name, value)
    return tables
