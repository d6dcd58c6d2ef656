"""Section 17's parameters: the corpus root and the audit's limits."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from kmesh_lib.base.data import DATA_ROOT_PREFIX, resolve_path
from kmesh_lib.base.params import ParamError, PathText, RunParams, check, check_path, params_dataclass
from kmesh_lib.traces.audit import MAX_FIELDS_PER_SOURCE
from kmesh_lib.traces.names import safe_name
from kmesh_lib.traces.scan import DEFAULT_MAX_JSON_DEPTH, MAX_JSON_DEPTH_LIMIT

DEFAULT_TRACE_ROOT = f"{DATA_ROOT_PREFIX}/lmcache-agent-trace"  # the data set of base.data
# Measured: the 27.8 MB shared corpus audits in 0.3 to 0.8 s on the 2-core dev box (35 to 90 MB/s,
# page cache warm); plan() assumes 10 MB/s so a cold cache does not make the estimate a promise.
AUDIT_MB_PER_S = 10.0
# A line is held whole and parsed at up to 16x its size (traces.scan), so 256 MB already asks for
# 4 GB; the corpus's longest line is far below 1 MB.
MAX_LINE_MB_LIMIT = 256.0
MAX_DEPTH_LIMIT = 4096
MIN_LINE_BYTES = 1024  # the shortest record of the corpus is ~100 bytes; a KiB is no limit to anyone
UNIT_SCALE = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def resolve_root(value: str) -> Path:
    """TRACE_ROOT as a path: ``$KMESH_DATA_ROOT/...`` under the data root, a relative value
    under the repo root (``base.data.resolve_path``)."""
    return resolve_path(value)


@params_dataclass
class TraceAuditParams(RunParams):
    # Every profile audits the whole shared corpus (27.8 MB, under a second), so even the smoke tier
    # checks the files the published run does.
    TRACE_ROOT: PathText = Field(
        DEFAULT_TRACE_ROOT, description="the corpus, a directory of JSONL traces: $KMESH_DATA_ROOT/... or relative "
                                        "to the repo root")
    MAX_LINE_MB: float = Field(
        8.0, gt=0, le=MAX_LINE_MB_LIMIT, description='longer lines are counted malformed ("oversize"), never parsed')
    # The walk counts depth explicitly (no recursion), so the limit is about output, not the stack.
    MAX_DEPTH: int = Field(
        16, ge=0, le=MAX_DEPTH_LIMIT, description="directories deeper than this below TRACE_ROOT are reported, not walked")
    MAX_JSON_DEPTH: int = Field(
        DEFAULT_MAX_JSON_DEPTH, ge=1, le=MAX_JSON_DEPTH_LIMIT,
        description='records nested deeper are malformed ("too_deep"), decided before parsing')

    def check_rules(self) -> None:
        super().check_rules()
        check(self.TRACE_ROOT.strip() != "", f"TRACE_ROOT='': empty; name the corpus folder (default {DEFAULT_TRACE_ROOT})")
        check(self.max_line_bytes >= MIN_LINE_BYTES,
              f"MAX_LINE_MB={self.MAX_LINE_MB}: at least {MIN_LINE_BYTES} bytes ({MIN_LINE_BYTES / (1 << 20):g} MB); "
              "a smaller limit calls every record oversize")

    def check_runnable(self) -> None:
        """The corpus must be on this machine to audit it (a run, ``kmesh plan``); a finished run's params
        are read without it (``kmesh verify`` on a clone without the data: the corpus checks say skipped)."""
        super().check_runnable()
        try:
            root = resolve_root(self.TRACE_ROOT)
            exists = root.exists()
        except (OSError, RuntimeError):
            raise ParamError(f"TRACE_ROOT={self.TRACE_ROOT[:60]!r}: cannot be resolved (a symlink loop?)") from None
        check(exists, f"TRACE_ROOT={self.TRACE_ROOT[:60]!r}: {root} does not exist; point it at a directory "
                      f"of JSONL traces, or fetch the corpus ({DEFAULT_TRACE_ROOT}) with `kmesh data fetch`")
        check_path("TRACE_ROOT", self.TRACE_ROOT, "dir")  # a folder, outside /proc, /sys, /dev and /etc

    @property
    def root_name(self) -> str:
        """The corpus's name as the audit records it (``traces.audit.audit_tree``)."""
        return safe_name(self.trace_root.resolve().name, 64)

    @property
    def limits(self) -> dict:
        """The audit's limits as results.json records them."""
        return {"max_line_bytes": self.max_line_bytes, "max_depth": self.MAX_DEPTH, "max_json_depth": self.MAX_JSON_DEPTH,
                "max_fields_per_source": MAX_FIELDS_PER_SOURCE}

    @property
    def trace_root(self) -> Path:
        return resolve_root(self.TRACE_ROOT)

    @property
    def max_line_bytes(self) -> int:
        return int(self.MAX_LINE_MB * (1 << 20))
