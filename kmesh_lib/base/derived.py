"""Figures a run's files give, built once per content in a process.

One ``kmesh verify`` builds a section's costly tables several times (its checks, the declared tables, the
public document), and the tamper suite verifies many copies of one run whose captures are unchanged.
``once_per_content`` keys a build by the SHA-256 of what it reads -- the named captures' bytes as stored
and the params as recorded, less ``RUN_DIR`` (where the folder is, which no table reads: a published
copy is not built again) -- so a build runs once per content, and any edit to those files builds afresh.

Invariant: the key names only inputs, never a result. A build handed to ``once_per_content`` reads
nothing but the captures it names and the params (``results.json``, the record under test, is never
among its inputs), so a cached value is exactly what a fresh build would give. Callers get a copy: no
caller can change what the next one reads (a build is kept pickled: unpickling is the copy, several times
faster than ``copy.deepcopy`` for tables of millions of values).
"""
from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable, Iterable
from typing import TypeVar

from cachetools import LRUCache

from kmesh_lib.base.records import RunFiles

T = TypeVar("T")

KEPT = 16  # builds kept: a verify of every published run reads each run's content once, then moves on
_BUILT: LRUCache = LRUCache(maxsize=KEPT)  # key -> the build, pickled; least recently used dropped first


def content_key(run: RunFiles, captures: Iterable[str]) -> str:
    """SHA-256 over the recorded params (less ``RUN_DIR``) and each named capture as stored (an absent file
    counts as absent)."""
    digest = hashlib.sha256()
    params = {k: v for k, v in run.recorded_params.items() if k != "RUN_DIR"}
    digest.update(json.dumps(params, sort_keys=True, default=str).encode() + b"\0")
    for label, path in [(f"raw/{name}", run.raw_path(name)) for name in sorted(set(captures))]:
        digest.update(label.encode() + b"\0")
        if path is not None and path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        else:
            digest.update(b"absent")
    return digest.hexdigest()


def once_per_content(run: RunFiles, name: str, captures: Iterable[str], build: Callable[[], T]) -> T:
    """``build()`` (which reads only ``captures`` and the params of ``run``), once per their content in this
    process; a copy of it. ``name`` tells one section's builds from another's."""
    key = (name, content_key(run, captures))
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = pickle.dumps(build(), protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.loads(built)


def forget() -> None:
    """Drops every kept build (a test that times or counts builds starts from none)."""
    _BUILT.clear()


__all__ = ["content_key", "forget", "once_per_content"]
