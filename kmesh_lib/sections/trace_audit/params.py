"""Section 17's parameters: the corpus root and the audit's limits."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.params import RunParams, check
from kmesh_lib.base.paths import REPO_ROOT

DEFAULT_TRACE_ROOT = "../shared/data/lmcache-agent-trace"  # relative to the repo root
# Measured: the 27.8 MB shared corpus audits in 0.31 s on the 2-core dev box (90 MB/s, page cache
# warm); plan() assumes a third of that so a cold cache does not make the estimate a promise.
AUDIT_MB_PER_S = 30.0
UNIT_SCALE = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def resolve_root(value: str) -> Path:
    """TRACE_ROOT as a path: a relative value is relative to the repo root (papermill runs the
    notebook from notebooks/, so the working directory is no anchor)."""
    path = Path(value).expanduser()
    return (path if path.is_absolute() else REPO_ROOT / path).resolve()


@dataclass(frozen=True)
class TraceAuditParams(RunParams):
    TRACE_ROOT: str = DEFAULT_TRACE_ROOT  # the corpus; relative paths are relative to the repo
    MAX_LINE_MB: float = 8.0  # longer lines are counted malformed ("oversize"), never parsed
    MAX_DEPTH: int = 16  # directories deeper than this below TRACE_ROOT are reported, not walked

    def __post_init__(self) -> None:
        super().__post_init__()
        root = resolve_root(self.TRACE_ROOT)
        check(root.exists(), f"TRACE_ROOT={self.TRACE_ROOT!r}: {root} does not exist; point it "
                             "at a directory of JSONL traces (the shared corpus is "
                             f"{DEFAULT_TRACE_ROOT} from the repo root)")
        check(root.is_dir(), f"TRACE_ROOT={self.TRACE_ROOT!r}: {root} is not a directory")
        check(self.MAX_LINE_MB > 0, f"MAX_LINE_MB={self.MAX_LINE_MB}: must be > 0")
        check(self.MAX_DEPTH >= 0, f"MAX_DEPTH={self.MAX_DEPTH}: must be >= 0")

    @property
    def trace_root(self) -> Path:
        return resolve_root(self.TRACE_ROOT)

    @property
    def max_line_bytes(self) -> int:
        return int(self.MAX_LINE_MB * (1 << 20))
