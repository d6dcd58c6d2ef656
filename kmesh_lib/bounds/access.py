"""Block accesses of a request sequence: what each request reads from and writes to an exact-prefix KV cache.

The shared input of the offline ideal bound (``bounds.ideal``) and the LRU reference (``bounds.lru``).

Block accounting for one request (P prompt tokens, O output tokens, block size B):

    tokens: |<--------------- prompt (P) -------------->|<---- output (O) ---->|
    blocks: [ b0 ] ... [ b(R-1) ][ final prompt fragment ]  R = (P-1)//B reads
            [ b0 ] ... [ b(R-1) ][ bR ] ... [ b(W-1) ]      W = (P+O-1)//B writes

* Block i is named by the chained hash of tokens[0:(i+1)*B], as in vLLM: a hash
  implies its whole prefix, and only full blocks are cacheable.
* Reads: vLLM reuses at most R blocks; the last prompt token is recomputed for
  next-token scores, so the final fragment (P - R*B tokens, 1..B) is compulsory.
* Writes, after the reads: every full block the request holds KV for, prompt or
  generated; the last sampled token never gets KV, hence P+O-1.
* Invariant: W >= R, so every block a request reads is written again by that same
  request, after all of its reads and before any later request's accesses.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

# Chain seed for block 0; an int because str hashes are salted per process.
_ROOT_BLOCK_HASH = 0x6B6D657368


def request_field(request: Any, name: str) -> Any:
    """Read ``name`` from a dict-like record or an object with attributes, else None."""
    if isinstance(request, Mapping):
        return request.get(name)
    return getattr(request, name, None)


def request_token_ids(request: Any, name: str) -> list[int]:
    """``request_field`` as a list of token ids; a missing field is empty."""
    return list(request_field(request, name) or [])


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a partial tail is dropped).

    ``block_hash[i] = hash((block_hash[i-1], tuple(token_ids[i*B:(i+1)*B])))``,
    so equal hashes mean equal whole prefixes (up to 64-bit collisions).
    """
    hashes: list[int] = []
    parent_hash = _ROOT_BLOCK_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash((parent_hash, tuple(token_ids[start:start + block_size])))
        hashes.append(parent_hash)
    return hashes


@dataclass
class AccessTrace:
    """Block accesses of a request sequence, flattened in trace order.

    Request r owns positions ``[access_start[r], access_start[r+1])``: first its
    ``num_read_blocks[r]`` reads (blocks 0..R-1), then its writes (blocks 0..W-1).
    """
    block_size: int
    block_hash: list[int] = field(default_factory=list)
    is_read: list[bool] = field(default_factory=list)
    request_index: list[int] = field(default_factory=list)
    num_prompt_tokens: list[int] = field(default_factory=list)
    num_read_blocks: list[int] = field(default_factory=list)
    access_start: list[int] = field(default_factory=lambda: [0])
    # arrays and passes computed from the accesses above, by name (``derived``); a trace is not changed once built
    derived_values: dict = field(default_factory=dict, repr=False, compare=False)

    def derived(self, key, compute):
        """``compute()``, once per ``key`` for this trace (the arrays the passes read, the passes themselves)."""
        if key not in self.derived_values:
            self.derived_values[key] = compute()
        return self.derived_values[key]

    @property
    def num_requests(self) -> int:
        return len(self.num_prompt_tokens)

    @property
    def num_accesses(self) -> int:
        return len(self.block_hash)

    @property
    def num_reads(self) -> int:
        return sum(self.num_read_blocks)


@dataclass(frozen=True)
class BlockOrder:
    """Each access's block among the trace's distinct blocks, from one stable sort of the names.

    ``block_id[t]`` numbers ``block_hash[t]`` densely in name order (0..num_ids-1: ``np.unique``'s inverse);
    ``next_access[t]`` is the next position that accesses the same block (``num_accesses``: none).
    """
    block_id: np.ndarray  # int32, one per access
    next_access: np.ndarray  # int64, one per access
    num_ids: int


def block_order(trace: AccessTrace) -> BlockOrder:
    """``BlockOrder`` of ``trace``, once per trace (the ideal's next uses and the LRU passes' ids share it)."""
    return trace.derived("block_order", lambda: _block_order(trace))


def _block_order(trace: AccessTrace) -> BlockOrder:
    try:
        names = np.asarray(trace.block_hash, dtype=np.int64)
    except OverflowError:  # names past int64 (Python's hash() is 64-bit signed; other names may not be)
        first_seen: dict[int, int] = {}  # numbered as first seen instead: the ids then keep that order
        names = np.fromiter((first_seen.setdefault(h, len(first_seen)) for h in trace.block_hash),
                            dtype=np.int64, count=len(trace.block_hash))
    block_id, next_access, num_ids = _group_by_block(names, _stable_order(names))
    return BlockOrder(block_id, next_access, num_ids)


def _stable_order(names: np.ndarray) -> np.ndarray:
    """``np.argsort(names, kind="stable")``. Small non-negative names (section 23 numbers its blocks 0, 1, ...)
    are counted instead, in O(n): a stable sort's order is unique, so the two agree exactly."""
    if len(names) and names.min() >= 0 and names.max() < 2 * len(names):
        return _counting_order(names, int(names.max()) + 1)
    return np.argsort(names, kind="stable")


@njit(cache=True)
def _counting_order(names, num_names):
    first = np.zeros(num_names + 1, dtype=np.int64)  # first[name]: where name's positions go in the order
    for name in names:
        first[name + 1] += 1
    for name in range(num_names):
        first[name + 1] += first[name]
    order = np.empty(len(names), dtype=np.int64)
    for pos in range(len(names)):
        order[first[names[pos]]] = pos
        first[names[pos]] += 1
    return order


@njit(cache=True)
def _group_by_block(names, by_name):
    """One walk of the positions in name order (stable: a block's accesses stay in trace order), so a
    position's next access is its neighbour there and a block's id counts the names before it."""
    never = len(names)
    block_id = np.empty(never, dtype=np.int32)
    next_access = np.full(never, never, dtype=np.int64)
    num_ids = 0
    for k in range(never):
        pos = by_name[k]
        if k and names[pos] == names[by_name[k - 1]]:
            next_access[by_name[k - 1]] = pos
        else:
            num_ids += 1
        block_id[pos] = num_ids - 1
    return block_id, next_access, num_ids


def build_access_trace(requests: Iterable[Any], block_size: int) -> AccessTrace:
    """Flatten requests (``prompt_token_ids``, ``output_token_ids``) into block accesses.

    Args:
        requests: records in captured order; dicts or objects.
        block_size: tokens per KV block (B).
    Returns:
        The trace; per request R = (P-1)//B reads, then W = (P+O-1)//B writes.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    trace = AccessTrace(block_size=block_size)
    for request_index, request in enumerate(requests):
        prompt = request_token_ids(request, "prompt_token_ids")
        output = request_token_ids(request, "output_token_ids")
        num_read_blocks = max(len(prompt) - 1, 0) // block_size
        num_written_tokens = max(len(prompt) + len(output) - 1, 0)
        written = block_hashes((prompt + output)[:num_written_tokens], block_size)
        accesses = written[:num_read_blocks] + written
        trace.block_hash.extend(accesses)
        trace.is_read.extend([True] * num_read_blocks + [False] * len(written))
        trace.request_index.extend([request_index] * len(accesses))
        trace.num_prompt_tokens.append(len(prompt))
        trace.num_read_blocks.append(num_read_blocks)
        trace.access_start.append(len(trace.block_hash))
    return trace
