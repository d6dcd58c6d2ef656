"""Section 17's parameters: the corpus root and the audit's limits."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.data import DATA_ROOT_PREFIX, resolve_path
from kmesh_lib.base.params import RunParams, check
from kmesh_lib.traces.scan import DEFAULT_MAX_JSON_DEPTH, MAX_JSON_DEPTH_LIMIT

DEFAULT_TRACE_ROOT = f"{DATA_ROOT_PREFIX}/lmcache-agent-trace"  # the data set of base.data
# Measured: the 27.8 MB shared corpus audits in 0.3 to 0.8 s on the 2-core dev box (35 to 90 MB/s,
# page cache warm); plan() assumes 10 MB/s so a cold cache does not make the estimate a promise.
AUDIT_MB_PER_S = 10.0
MAX_LINE_MB_LIMIT = 1024.0  # a line is held whole and parsed at up to 16x its size
MAX_DEPTH_LIMIT = 4096
UNIT_SCALE = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def resolve_root(value: str) -> Path:
    """TRACE_ROOT as a path: ``$KMESH_DATA_ROOT/...`` under the data root, a relative value
    under the repo root (``base.data.resolve_path``)."""
    return resolve_path(value)


@dataclass(frozen=True)
class TraceAuditParams(RunParams):
    TRACE_ROOT: str = DEFAULT_TRACE_ROOT  # the corpus; $KMESH_DATA_ROOT/... or relative to the repo root
    MAX_LINE_MB: float = 8.0  # longer lines are counted malformed ("oversize"), never parsed
    MAX_DEPTH: int = 16  # directories deeper than this below TRACE_ROOT are reported, not walked
    MAX_JSON_DEPTH: int = DEFAULT_MAX_JSON_DEPTH  # records nested deeper are malformed ("too_deep")

    def __post_init__(self) -> None:
        super().__post_init__()
        root = resolve_root(self.TRACE_ROOT)
        check(root.exists(), f"TRACE_ROOT={self.TRACE_ROOT!r}: {root} does not exist; point it at a directory "
                             f"of JSONL traces, or fetch the corpus ({DEFAULT_TRACE_ROOT}) with `kmesh data fetch`")
        check(root.is_dir(), f"TRACE_ROOT={self.TRACE_ROOT!r}: {root} is not a directory")
        check(math.isfinite(self.MAX_LINE_MB) and 0 < self.MAX_LINE_MB <= MAX_LINE_MB_LIMIT,
              f"MAX_LINE_MB={self.MAX_LINE_MB}: must be > 0 and <= {MAX_LINE_MB_LIMIT:g}")
        check(0 <= self.MAX_DEPTH <= MAX_DEPTH_LIMIT, f"MAX_DEPTH={self.MAX_DEPTH}: must be in 0..{MAX_DEPTH_LIMIT}")
        check(1 <= self.MAX_JSON_DEPTH <= MAX_JSON_DEPTH_LIMIT,
              f"MAX_JSON_DEPTH={self.MAX_JSON_DEPTH}: must be in 1..{MAX_JSON_DEPTH_LIMIT}")

    @property
    def trace_root(self) -> Path:
        return resolve_root(self.TRACE_ROOT)

    @property
    def max_line_bytes(self) -> int:
        return int(self.MAX_LINE_MB * (1 << 20))
