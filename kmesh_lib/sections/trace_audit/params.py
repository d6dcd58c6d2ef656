"""Section 17's parameters: the corpus root and the audit's limits."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from kmesh_lib.base.params import PathText, RunParams, check, params_dataclass
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


@params_dataclass
class TraceAuditParams(RunParams):
    # Every profile audits the whole shared corpus: its 27.8 MB audit in 0.3 s, so even the smoke
    # tier checks the files the published run does.
    TRACE_ROOT: PathText = Field(
        DEFAULT_TRACE_ROOT, description="the corpus, a directory of JSONL traces; relative paths are relative to the repo root")
    # A parsed line costs about 6x its size in memory (issue 18), so a 256 MB line already needs
    # ~1.5 GB; the corpus's longest line is far below 1 MB.
    MAX_LINE_MB: float = Field(
        8.0, gt=0, le=256, description='longer lines are counted malformed ("oversize"), never parsed')
    # Real trace trees are a few levels deep; 256 keeps a recursive walk far from Python's
    # 1000-frame stack limit.
    MAX_DEPTH: int = Field(
        16, ge=0, le=256, description="directories deeper than this below TRACE_ROOT are reported, not walked")

    def check_rules(self) -> None:
        super().check_rules()
        root = resolve_root(self.TRACE_ROOT)
        check(root.exists(), f"TRACE_ROOT={self.TRACE_ROOT!r}: {root} does not exist; point it "
                             "at a directory of JSONL traces (the shared corpus is "
                             f"{DEFAULT_TRACE_ROOT} from the repo root)")
        check(root.is_dir(), f"TRACE_ROOT={self.TRACE_ROOT!r}: {root} is not a directory")

    @property
    def trace_root(self) -> Path:
        return resolve_root(self.TRACE_ROOT)

    @property
    def max_line_bytes(self) -> int:
        return int(self.MAX_LINE_MB * (1 << 20))
