"""Where kmesh's own files are: one definition of each location in the checkout."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PARAMS_DIR = REPO_ROOT / "params"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
OUTPUTS = REPO_ROOT / "outputs"  # the published runs (tracked)
RUNS = REPO_ROOT / "runs"  # local runs (ignored); KMESH_RUN_ROOT moves them
CACHE_DIR = Path(os.environ.get("KMESH_CACHE", REPO_ROOT / ".kmesh-cache"))


def pythonpath_with_repo() -> str:
    """``PYTHONPATH`` for a child process that must import this checkout's ``kmesh_lib``."""
    return os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def in_repo(path: str | Path) -> Path:
    """A path named in params or a run record: absolute, or relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def repo_relative(path: str | Path) -> str | None:
    """``path`` relative to the repository root, or None outside it: run records name no machine paths."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else None
