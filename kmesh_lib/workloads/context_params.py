"""The parameters of the shared-context sections (16 and 20) and the machine rows they report.

    path_support         whether a path's tier runs on the device (in-process LMCache, vLLM's own tiers)
    parse_arrivals       FOLLOWUP_ARRIVALS' one parser (``ContextGroupParams.arrivals``)
    ContextGroupParams   MEASURED_GROUPS (declared here once for both), FOLLOWUP_ARRIVALS (``ArrivalPattern``),
                         SINGLEFLIGHT (the settings to measure),
                         LMCACHE_SERVER (launcher or stock), STRIPED_STORE_ROOT; both sections inherit it
    striped_store_row    whether the striped two-NVMe disk tier can run here, and why not
    topology_row         what a run's topology table shows (NVMe drives, block devices, RAID, PCIe links)

The paths: ``MP_PATHS`` (LMCacheMPConnector + an lmcache server: ``mp``, and ``mp-striped`` on a
RAID 0 mount) and ``TIER_PATHS`` (every path with an external tier: + ``inproc``, ``gpubuf``, ``native``:
vLLM's own offloading, its CPU tier over its filesystem tier).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from kmesh_lib.base import topology
from kmesh_lib.base.params import MAX_COUNT, MAX_MS, PositiveCount, WriteRoot, check, params_dataclass
from kmesh_lib.engine.config import SourceRunParams
from kmesh_lib.kv.offloading import offloading_support
from kmesh_lib.lmcache.connect import inproc_support

MP_PATHS = ("mp", "mp-striped")  # LMCacheMPConnector + an lmcache server
TIER_PATHS = MP_PATHS + ("inproc", "gpubuf", "native")  # every path with an external tier


def path_support(path: str, device: str) -> tuple[bool, str]:
    """Whether ``path``'s tier runs on ``device`` with the installed stack, and why not: in-process LMCache
    needs a GPU connector, vLLM's own offloading CUDA. The striped store's verdict needs the machine's
    topology (``striped_store_row``); every other path runs."""
    if path == "inproc":
        return inproc_support(device)
    if path == "native":
        return offloading_support(device)
    return True, ""


@dataclass(frozen=True)
class ArrivalPattern:
    """When follow-up i (0 = A) is submitted: i * ``spacing_ms`` after A, or after i * ``spacing_steps``
    engine steps that produced tokens. Both 0: together."""

    spacing_ms: float = 0.0
    spacing_steps: int = 0

    SYNTAX = f"'together', '<x>ms' (0 <= x <= {MAX_MS}, e.g. 2ms) or '<k>step' (1 <= k <= {MAX_COUNT}, e.g. 1step)"

    @classmethod
    def parse(cls, text: str) -> ArrivalPattern:
        """``together`` | ``<x>ms`` | ``<k>step(s)``; ValueError names the text and the syntax."""
        t = str(text).strip().lower()
        if t == "together":
            return cls()
        m = re.fullmatch(r"(\d{1,12}(?:\.\d{1,12})?)\s*ms", t)
        if m and float(m.group(1)) <= MAX_MS:
            return cls(spacing_ms=float(m.group(1)))
        m = re.fullmatch(r"(\d{1,12})\s*steps?", t)
        if m and 1 <= int(m.group(1)) <= MAX_COUNT:
            return cls(spacing_steps=int(m.group(1)))
        raise ValueError(f"follow-up arrival {str(text)[:40]!r}: expected {cls.SYNTAX}")

    @property
    def label(self) -> str:
        if self.spacing_steps:
            return f"{self.spacing_steps}step"
        return "together" if self.spacing_ms == 0 else f"{self.spacing_ms:g}ms"


@params_dataclass
class ContextGroupParams(SourceRunParams):
    """The shared-context group's LMCache-path parameters (sections 16 and 20 inherit these)."""

    MEASURED_GROUPS: PositiveCount = Field(
        5, description="measured groups per arm: section 16, per arrival pattern and singleflight setting on each engine "
                       "(pairs, one group per arm each, alternating); section 20, per path and group size over ENGINE_RUNS "
                       "(the paper's 200: params/prefetch.yaml)")
    FOLLOWUP_ARRIVALS: list[str] = Field(
        default_factory=lambda: ["together"], min_length=1,
        description="follow-up submission spacing per group: together, <x>ms or <k>step (see ArrivalPattern)")
    SINGLEFLIGHT: list[bool] = Field(
        default_factory=lambda: [False], min_length=1, max_length=2,
        description="MP singleflight settings (a lookup overlapping an in-flight load of the same chunks waits for "
                    "it); 16 runs each, 20 confirms with the first and contrasts on-arrival groups with the others")
    LMCACHE_SERVER: Literal["launcher", "stock"] = Field(
        "launcher", description="launcher: the stock server with kmesh hooks; stock: one server per arm, stock policies")
    STRIPED_STORE_ROOT: WriteRoot = Field(
        "", description="an existing RAID 0 mount over two or more NVMe drives, for the striped row (empty: none)")

    def check_rules(self) -> None:
        super().check_rules()
        try:
            parse_arrivals(self.FOLLOWUP_ARRIVALS)
        except ValueError as e:
            check(False, str(e))
        check(len(set(self.SINGLEFLIGHT)) == len(self.SINGLEFLIGHT),
              f"SINGLEFLIGHT={self.SINGLEFLIGHT}: a setting is given twice")
        check(not (any(self.SINGLEFLIGHT) and self.LMCACHE_SERVER == "stock"),
              "SINGLEFLIGHT=[true] needs LMCACHE_SERVER=launcher (the singleflight lives in the launcher's server hooks)")
        largest = max(getattr(self, "GROUP_SIZES", None) or [0])  # a group's engine runs the warm-up and its follow-ups
        check(largest + 1 <= MAX_COUNT, f"GROUP_SIZES: a group of {largest:,} needs an engine of {largest + 1:,} "
                                        f"sequences (MAX_NUM_SEQS at most {MAX_COUNT:,})")

    @property
    def arrivals(self) -> list[ArrivalPattern]:
        """FOLLOWUP_ARRIVALS as patterns (``parse_arrivals``, the one parser of the parameter)."""
        return parse_arrivals(self.FOLLOWUP_ARRIVALS)


def parse_arrivals(texts: list[str]) -> list[ArrivalPattern]:
    """FOLLOWUP_ARRIVALS' one parser: each text an ``ArrivalPattern``, no pattern twice; a ValueError names the
    parameter and the text that does not parse, or the list that gives a pattern twice."""
    patterns = []
    for text in texts:
        try:
            patterns.append(ArrivalPattern.parse(text))
        except ValueError as e:
            raise ValueError(f"FOLLOWUP_ARRIVALS: {e}") from None
    labels = [p.label for p in patterns]
    if len(set(labels)) != len(labels):
        raise ValueError(f"FOLLOWUP_ARRIVALS={list(texts)}: a pattern is given twice")
    return patterns


def striped_store_row(cfg, topo: dict | None = None) -> dict:
    """The striped-flash row: runs only on an existing RAID 0 mount over two or more NVMe drives.

    Returns ``{"path": "mp-striped", "status": "available" | "not available", "detail", "root"}``;
    the detail names the NVMe count and what is missing (``base.topology.striped_store``).
    """
    topo = topo if topo is not None else topology.describe()
    verdict = topology.striped_store(topo, cfg.STRIPED_STORE_ROOT or None)
    return {"path": "mp-striped", "status": "available" if verdict["available"] else "not available",
            "detail": verdict["reason"], "root": verdict["root"], "nvme_count": topo.get("nvme_count", 0),
            "topology": topology_row(topo)}


def topology_row(topo: dict) -> dict:
    """What a run's topology table shows: NVMe count, the block devices, md/RAID support, the GPUs' PCIe links."""
    md = topo.get("md") or {}
    return {"nvme_count": topo.get("nvme_count", 0),
            "block_devices": [f"{d.get('name')} ({'nvme' if d.get('nvme') else 'md' if d.get('md') else 'disk'}, "
                              f"{(d.get('size_bytes') or 0) / (1 << 30):.1f} GiB)"
                              for d in topo.get("block_devices", []) if not d.get("virtual")],
            "md_raid0": bool(md.get("raid0_personality")), "mdadm": bool(md.get("mdadm")),
            "gpu_pcie": [{k: g.get(k) for k in ("name", "pcie.link.gen.current", "pcie.link.gen.max",
                                                "pcie.link.width.current", "pcie.link.width.max")}
                         for g in (topo.get("gpu_pcie") or {}).get("gpus", [])]}
