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


def published_root() -> Path:
    """The published set: ``outputs/``, or ``KMESH_PUBLISHED_ROOT`` (tests)."""
    return Path(os.environ.get("KMESH_PUBLISHED_ROOT", OUTPUTS))


def published_folder(path: str | Path) -> Path | None:
    """The published root ``path`` lies in (``outputs/`` or ``KMESH_PUBLISHED_ROOT``), or None.

    Published runs are read-only to every command but ``kmesh publish`` and ``kmesh withdraw``: a
    run, a render or a run folder given by path must not be one of them or inside one.
    """
    try:
        p = in_repo(path).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop: not a folder anything can be written to
        return None
    for root in dict.fromkeys((OUTPUTS, published_root())):
        root = in_repo(root).resolve()
        if p == root or p.is_relative_to(root):
            return root
    return None
