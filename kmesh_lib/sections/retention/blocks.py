"""Which engine runs (blocks) section 16 plans, in the order they run, from the params alone.

    block            one engine (and one tier) for one path and group size: every arrival pattern,
                     every singleflight setting (MP) and both external arms on it
    engine-N<n>      the control arms (recompute, resident) on a plain engine
    <path>-N<n>-<arm>  with a stock lmcache server (LMCACHE_SERVER=stock) each arm has its own server

Order: the MP paths first, then the controls, then the in-process path, vLLM's own tiers (``native``),
then the GPU buffer (``gpubuf``) -- so a failure of the GPU buffer's CUDA code, which runs last and in its own engine,
cannot cost the rows before it. The checks (``planned_blocks``) and both measuring drivers (the
notebook and ``sections.retention.gpu``) read the plan from here, so they cannot disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

from kmesh_lib.workloads.context_params import MP_PATHS

RUN_ORDER = {"mp": 0, "mp-striped": 1, "engine": 2, "inproc": 3, "native": 4, "gpubuf": 5}


@dataclass(frozen=True)
class PlannedBlock:
    name: str
    path: str
    group_size: int
    arms: tuple[str, ...] | None = None  # None: the block's default arms


def plan_blocks(cfg) -> list[PlannedBlock]:
    """Every block the params (``RetentionParams``) ask for (before any is found unavailable on this machine),
    in run order."""
    sizes = list(cfg.GROUP_SIZES)
    stock = cfg.LMCACHE_SERVER == "stock"
    out = []
    for path in sorted(set(cfg.PATHS), key=lambda p: RUN_ORDER.get(p, 9)):
        for n in sizes:
            if path in MP_PATHS and stock:
                out += [PlannedBlock(f"{path}-N{n}-{arm}", path, n, (arm,)) for arm in ("retain", "discard")]
            else:
                out.append(PlannedBlock(f"{path}-N{n}", path, n))
    if cfg.CONTROL_ARMS:
        out += [PlannedBlock(f"engine-N{n}", "engine", n) for n in sizes]
    return sorted(out, key=lambda b: (RUN_ORDER.get(b.path, 9), b.group_size, b.name))
