"""Reference model of vLLM v1's exact-prefix KV cache with LRU eviction, compiled.

The yardstick the offline ideal bound (``bounds.ideal``) must never exceed. It
replays an ``AccessTrace`` one request at a time, so there are no concurrent
requests and active-request pins are ignored, matching the ideal's relaxation.

Recency order kept for one request whose blocks b0..b3 are written:

    LRU end  <-- ... older blocks ... b3  b2  b1  b0 -->  MRU end
                                     (evicted first)

vLLM frees a request's blocks tail-first onto the free queue, so the deepest
block is evicted first and a parent always outlives its children; the resident
set therefore stays ancestor-closed and leading-run hits lose nothing to it.

Per request: hits are the longest run of leading read blocks that are resident
(vLLM stops matching at the first missing block hash); then every written block,
hit or computed, moves to most-recently-used, deepest first; then least-recently-
used blocks are evicted down to the pool's capacity, less the slots the request
holds that cache nothing (``num_reserved``: section 23's partial last block).

Why compiled: a production trace is tens of millions of block accesses (Mooncake's
conversation trace: 18.3M at 16-token blocks) and a table takes one pass per pool
size; an ``OrderedDict`` pass took about 8 s of Python, this one a fraction of a
second. The pools are doubly linked lists over the trace's dense block ids (numba,
already in the stack through vLLM and LMCache): ``resident[p, b]`` says whether block
``b`` is in pool ``p``, and only then are its ``prev``/``next`` links set; those of the
sentinel ``num_ids`` are the MRU and LRU ends. ``tests/test_lru_passes.py`` holds every
pass to a plain ``OrderedDict`` model on random traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kmesh_lib.bounds.access import AccessTrace, block_order


@dataclass(frozen=True)
class LruArrays:
    """An ``AccessTrace`` as the compiled passes read it: each access's dense block id (0..num_ids-1),
    where each request's accesses start (``num_requests + 1`` entries) and how many of them are reads."""

    block_id: np.ndarray  # int32, one per access
    access_start: np.ndarray  # int64
    num_read_blocks: np.ndarray  # int64
    num_ids: int

    @property
    def num_requests(self) -> int:
        return len(self.num_read_blocks)


def lru_arrays(trace: AccessTrace) -> LruArrays:
    """The dense-id arrays of ``trace`` (block hashes of any size map to 0..num_ids-1, order kept), once per trace."""
    return trace.derived("lru_arrays", lambda: _lru_arrays(trace))


def _lru_arrays(trace: AccessTrace) -> LruArrays:
    order = block_order(trace)
    return LruArrays(order.block_id, np.asarray(trace.access_start, dtype=np.int64),
                     np.asarray(trace.num_read_blocks, dtype=np.int64), order.num_ids)


# -- the linked lists (one row per pool) --

@njit(cache=True)
def new_pools(num_pools, num_ids):
    """(prev, next, resident, size) of ``num_pools`` empty pools over ``num_ids`` block ids (int32 links: 8 bytes
    per id and pool; Mooncake's conversation trace has 5.9M ids at 16-token blocks).

    Only ``resident`` (a byte per id) is cleared: the links are left unset (``np.empty``), so a pass touches,
    and the system zeroes, only the pages of the blocks its pool holds at some time (an engine's pool sees its
    own requests': section 23's engine table makes 28 pools over all the ids)."""
    prev = np.empty((num_pools, num_ids + 1), dtype=np.int32)
    nxt = np.empty((num_pools, num_ids + 1), dtype=np.int32)
    resident = np.zeros((num_pools, num_ids), dtype=np.bool_)
    for pool in range(num_pools):
        prev[pool, num_ids] = num_ids
        nxt[pool, num_ids] = num_ids
    return prev, nxt, resident, np.zeros(num_pools, dtype=np.int64)


@njit(cache=True)
def leading_run(resident, pool, block_id, lo, hi):
    """How many of ``block_id[lo:hi]`` are in ``pool`` before the first that is not."""
    n = 0
    for i in range(lo, hi):
        if not resident[pool, block_id[i]]:
            break
        n += 1
    return n


@njit(cache=True)
def write(prev, nxt, resident, size, pool, block_id, lo, hi):
    """``block_id[lo:hi]`` to the pool's most-recently-used end, the last (deepest) first."""
    end = prev.shape[1] - 1
    for i in range(hi - 1, lo - 1, -1):
        b = block_id[i]
        if resident[pool, b]:  # unlink
            nxt[pool, prev[pool, b]] = nxt[pool, b]
            prev[pool, nxt[pool, b]] = prev[pool, b]
        else:
            resident[pool, b] = True
            size[pool] += 1
        last = prev[pool, end]
        nxt[pool, last] = b
        prev[pool, b] = last
        nxt[pool, b] = end
        prev[pool, end] = b


@njit(cache=True)
def evict(prev, nxt, resident, size, pool, limit):
    """Least-recently-used blocks out of ``pool`` until it holds at most ``limit``."""
    end = prev.shape[1] - 1
    while size[pool] > limit and size[pool] > 0:
        b = nxt[pool, end]
        nxt[pool, end] = nxt[pool, b]
        prev[pool, nxt[pool, b]] = end
        resident[pool, b] = False
        size[pool] -= 1


@njit(cache=True)
def _pool_pass(block_id, access_start, num_read_blocks, num_reserved, start_at, capacity, num_ids):
    prev, nxt, resident, size = new_pools(1, num_ids)
    num_requests = len(num_read_blocks)
    hits = np.zeros(num_requests, dtype=np.int64)
    for r in range(num_requests):
        start, end = access_start[r], access_start[r + 1]
        reads_end = start + num_read_blocks[r]
        hits[r] = leading_run(resident, 0, block_id, start + start_at[r], reads_end)
        write(prev, nxt, resident, size, 0, block_id, reads_end, end)
        evict(prev, nxt, resident, size, 0, capacity - num_reserved[r])
    return hits


def pool_hit_blocks(arrays: LruArrays, capacity: int, num_reserved=None, start_at=None) -> np.ndarray:
    """Per request: blocks reused from an LRU pool of ``capacity`` blocks -- the leading run of its reads from
    ``start_at[r]`` on (0: from its first read) -- while request r holds ``num_reserved[r]`` slots that cache
    nothing (0: none)."""
    zeros = np.zeros(arrays.num_requests, dtype=np.int64)
    reserved = zeros if num_reserved is None else np.asarray(num_reserved, dtype=np.int64)
    starts = zeros if start_at is None else np.asarray(start_at, dtype=np.int64)
    return _pool_pass(arrays.block_id, arrays.access_start, arrays.num_read_blocks, reserved, starts,
                      max(int(capacity), 0), arrays.num_ids)


def lru_hit_blocks(trace: AccessTrace, num_blocks: int) -> list[int]:
    """Per-request reused blocks under exact-prefix matching and LRU eviction.

    Args:
        trace: from ``bounds.access.build_access_trace``.
        num_blocks: usable pool blocks (the caller subtracts vLLM's null block).
    Returns:
        ``num_hit_blocks[r]`` for each request r, each ``<= trace.num_read_blocks[r]``.
    """
    if not trace.num_requests:
        return []
    return pool_hit_blocks(lru_arrays(trace), num_blocks).tolist()


__all__ = ["LruArrays", "evict", "leading_run", "lru_arrays", "lru_hit_blocks", "new_pools",
           "pool_hit_blocks", "write"]
