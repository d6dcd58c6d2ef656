"""The LMCache tier's parameters that every section running one declares: one default, one help text.

    CHUNK_TOKENS   tokens per LMCache chunk: ``ServerConfig.chunk_size`` and each section's ``CHUNK_SIZE``
    ChunkTokens    the ``CHUNK_SIZE`` field's type (bounds, help)
    DiskTierRoot   the ``DISK_TIER_ROOT`` field's type; its default, empty, is ``processes.RUNTIME_ROOT``

The sizes of a tier (``ARENA_MIB``, ``DISK_TIER_MIB``) stay with each section: what they must hold differs.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kmesh_lib.base.params import Tokens, WriteRoot

CHUNK_TOKENS = 256  # a multiple of vLLM's block size on every backend kmesh runs
ChunkTokens = Annotated[Tokens, Field(description="LMCache chunk in tokens")]
DiskTierRoot = Annotated[WriteRoot, Field(
    description="the disk tier's parent (a disk, not tmpfs): each run makes its own kmesh-lmcache folder there; "
                "empty: $KMESH_LMCACHE_RUNTIME or the temp dir's kmesh-lmcache")]
