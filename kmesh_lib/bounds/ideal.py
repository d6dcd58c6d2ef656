"""Offline ideal bound on prefill tokens for an exact-prefix KV cache (section 19).

Given the captured request order and a pool of ``num_blocks`` usable KV blocks,
how few prefill tokens (input tokens whose KV is not reused) could *any*
exact-prefix cache compute? Stock vLLM's observed prefill is compared to it.

Each request reads R = (P-1)//B blocks, then writes W = (P+O-1)//B blocks
(``bounds.access`` draws the accounting; P prompt, O output tokens, block size B).

* Invariant: per request ``num_prefill_tokens = P - num_hit_blocks * B``, so
  ``num_compulsory_tokens <= num_prefill_tokens <= P``.

Relaxations that favour the ideal: it knows the future, may bypass any write,
drops a block at no cost and takes it back at any later write of it, ignores
active-request pins, and counts a resident block as a hit even if an ancestor block
missed. That last one never lowers the optimum: ``simulate_min`` holds a parent
whenever it holds a child, so its hits are leading runs (its docstring says why; the
tests check it against an independent exhaustive optimum).
"""

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from kmesh_lib.bounds.access import (
    AccessTrace,
    block_hashes,
    block_order,
    build_access_trace,
    request_field,
    request_token_ids,
)
from kmesh_lib.bounds.lru import lru_hit_blocks

__all__ = [
    "AccessTrace", "BoundResult", "RequestPrefill", "block_hashes", "build_access_trace",
    "count_exact_prefix_edges", "ideal_prefill_tokens", "lru_prefill_tokens",
    "next_read_positions", "next_use_positions", "simulate_lru", "simulate_min", "sweep_pool_sizes"]


@dataclass
class RequestPrefill:
    """One request's share; ``num_prefill_tokens = num_prompt_tokens - num_hit_blocks * B``."""
    num_prompt_tokens: int
    num_read_blocks: int
    num_hit_blocks: int
    num_prefill_tokens: int
    num_compulsory_tokens: int


@dataclass
class BoundResult:
    """Prefill totals of one policy on one trace at one pool size.

    Invariants: ``num_read_hits + num_read_misses == trace.num_reads`` and
    ``num_prefill_tokens == num_prompt_tokens - num_read_hits * block_size``.
    """
    policy: str
    block_size: int
    num_blocks: int
    num_prompt_tokens: int
    num_prefill_tokens: int
    num_compulsory_tokens: int
    num_read_hits: int
    num_read_misses: int
    per_request: list[RequestPrefill]


def _bound_result(trace: AccessTrace, policy: str, num_blocks: int,
                  num_hit_blocks: list[int]) -> BoundResult:
    block_size = trace.block_size
    per_request = [
        RequestPrefill(num_prompt_tokens=prompt_len, num_read_blocks=num_reads,
                       num_hit_blocks=num_hits,
                       num_prefill_tokens=prompt_len - num_hits * block_size,
                       num_compulsory_tokens=prompt_len - num_reads * block_size)
        for prompt_len, num_reads, num_hits in zip(
            trace.num_prompt_tokens, trace.num_read_blocks, num_hit_blocks)]
    num_read_hits = sum(num_hit_blocks)
    return BoundResult(
        policy=policy, block_size=block_size, num_blocks=num_blocks,
        num_prompt_tokens=sum(trace.num_prompt_tokens),
        num_prefill_tokens=sum(row.num_prefill_tokens for row in per_request),
        num_compulsory_tokens=sum(row.num_compulsory_tokens for row in per_request),
        num_read_hits=num_read_hits, num_read_misses=trace.num_reads - num_read_hits,
        per_request=per_request)


def next_read_positions(trace: AccessTrace) -> list[int]:
    """For each position t, where ``block_hash[t]`` is next read; ``num_accesses`` = never."""
    never = trace.num_accesses
    next_read = [never] * never
    upcoming: dict[int, int] = {}
    for pos in range(never - 1, -1, -1):
        block_hash = trace.block_hash[pos]
        next_read[pos] = upcoming.get(block_hash, never)
        if trace.is_read[pos]:
            upcoming[block_hash] = pos
    return next_read


def next_use_positions(trace: AccessTrace) -> list[int]:
    """For each position t, the read that the copy of ``block_hash[t]`` in hand at t is kept for.

    That is the block's next access if it is a read. If it is a write, or there is
    none, the answer is ``num_accesses`` = never: holding the block until that write
    buys nothing, since the write brings it back. After a read it is always never:
    the request that reads a block writes it next (``bounds.access``), so between two
    writes of a block there is at most one read of it.
    """
    never = trace.num_accesses
    next_use = [never] * never
    next_access: dict[int, int] = {}
    for pos in range(never - 1, -1, -1):
        block_hash = trace.block_hash[pos]
        following = next_access.get(block_hash, never)
        if trace.is_read[pos]:
            assert following < never and not trace.is_read[following], (
                f"the read at {pos} is not followed by its request's write of the block")
        elif following < never and trace.is_read[following]:
            next_use[pos] = following
        next_access[block_hash] = pos
    return next_use


def _copy_events(trace: AccessTrace) -> np.ndarray:
    """``simulate_min``'s events (the same at every pool size): each copy's start as its end e, its end as ~e,
    in trace order. A copy starts at a write whose block's next access is a read (``next_use_positions``),
    found from each position's next access of its block (``access.block_order``: one stable sort of the
    names, shared with the LRU passes)."""
    is_read = np.asarray(trace.is_read, dtype=bool)
    events, bad = _copy_events_pass(block_order(trace).next_access, is_read)
    assert bad < 0, f"the read at {bad} is not followed by its request's write of the block"
    return events


@njit(cache=True)
def _copy_events_pass(next_access, is_read):
    """(events, the first read not followed by a write of its block, or -1), in one walk of the trace: a
    write starts a copy when the next access of its block is a read, which then ends it. Starts are writes
    and ends reads, so no position holds two events."""
    never = len(next_access)
    events = np.empty(never, dtype=np.int64)
    num_events = 0
    ends_a_copy = np.zeros(never, dtype=np.bool_)
    bad = -1
    for pos in range(never):
        following = next_access[pos]
        if is_read[pos]:
            if bad < 0 and (following == never or is_read[following]):
                bad = pos
            if ends_a_copy[pos]:
                events[num_events] = ~pos
                num_events += 1
        elif following < never and is_read[following]:
            events[num_events] = following
            num_events += 1
            ends_a_copy[following] = True
    return events[:num_events].copy(), bad


@njit(cache=True)
def _max_open_copies(events):
    """The most copies open at one position (started, not yet read): a pool of that many never overflows."""
    num_open = most = 0
    for event in events:
        num_open += 1 if event >= 0 else -1
        most = max(most, num_open)
    return most


@njit(cache=True)
def _min_pass(events, never, num_blocks):
    """``simulate_min``'s loop over its events, compiled (a production trace has tens of millions); the
    ends of the copies that were read while held (read hits), in trace order."""
    held = np.zeros(never, dtype=np.uint8)  # held[e]: the copy that ends at e is resident
    num_held = 0
    farthest_first = [np.int64(0)]  # max-heap (negated) of resident copies' ends, lazily deleted
    farthest_first.pop()  # (numba types the list from its first element)
    hit_ends = np.empty(len(events), dtype=np.int64)
    num_hits = 0
    for event in events:
        if event < 0:  # a read: a hit iff its copy is still held
            if held[~event]:
                held[~event] = 0
                num_held -= 1
                hit_ends[num_hits] = ~event
                num_hits += 1
            continue
        if num_held >= num_blocks:
            while not held[-farthest_first[0]]:
                heapq.heappop(farthest_first)
            if -farthest_first[0] < event:
                continue  # bypass: every resident copy is read sooner
            held[-heapq.heappop(farthest_first)] = 0
            num_held -= 1
        held[event] = 1
        num_held += 1
        heapq.heappush(farthest_first, -event)
    return hit_ends[:num_hits]


def simulate_min(trace: AccessTrace, num_blocks: int) -> BoundResult:
    """Belady's MIN for a cache that only writes fill: the fewest read misses ``num_blocks`` allow.

    A block gets in only when a request writes it, and leaves at no cost. Between two
    writes of a block it is read at most once (``next_use_positions``), so a read hit
    is one *copy*: the block held from its last write before the read (the copy's
    start) to that read (its end). Holding it from an earlier write gains nothing and
    takes room; keeping a block across its own re-write equals dropping it and taking
    it back there. The rule, at each write: a copy that is never read is not admitted;
    any other is, and if that makes ``num_blocks + 1`` the copy read farthest in the
    future is dropped (the new one itself: a bypass). A read ends its copy.

    Why optimal: hits are copies, intervals [write, read] of which at most
    ``num_blocks`` may overlap at any position (interval scheduling on ``num_blocks``
    machines, where this greedy by start is the classic optimum). Exchange: let an
    optimal S agree with MIN until an overflow where MIN drops copy f and S drops g
    (g ends before f). S' holds g in place of f, until g's read or until S drops f,
    and otherwise copies S: it never holds more than S and trades at most f's read
    hit for g's. So S' is optimal too and agrees with MIN one drop longer.

    Why counting a resident block whose ancestor missed is harmless: a request that
    reads or writes block c reads or writes its parent p just before. So p's copy for
    the read just before c's starts at c's start minus one (the same request's write of
    p) or later, at a re-write of p while c is held. In the first case p is admitted
    unless every held copy ends before p's, and then c, up one write later with
    nothing ended in between, is bypassed too; in the second, held c ends after p, so
    p is admitted. From then on an overflow drops c before p. So p is held whenever c is:
    MIN's hits are leading runs, an exact-prefix cache can make them, and the
    relaxation does not lower the bound.

    Args:
        trace: from ``build_access_trace``.
        num_blocks: usable pool blocks (the caller subtracts vLLM's null block).
    Returns:
        ``BoundResult`` with ``policy="ideal"``.
    """
    never = trace.num_accesses
    num_hit_blocks = [0] * trace.num_requests
    if num_blocks <= 0 or not never:
        return _bound_result(trace, "ideal", num_blocks, num_hit_blocks)
    # Only copies matter: a write whose block is read next (its start) and that read (its end). A copy is
    # named by its end, a position no other copy ends at; events run in trace order, a start as its
    # end e, an end as ~e (negative), so the loop touches nothing else of the trace.
    events = trace.derived("copy_events", lambda: _copy_events(trace))
    if num_blocks >= trace.derived("max_open_copies", lambda: _max_open_copies(events)):
        # the pool never overflows: every copy is held until its read
        hit_ends = trace.derived("copy_ends", lambda: ~events[events < 0])
    else:
        hit_ends = _min_pass(events, never, num_blocks)
    if len(hit_ends):  # in trace order, so request r's are those in [access_start[r], access_start[r+1])
        access_start = trace.derived("access_start", lambda: np.asarray(trace.access_start, dtype=np.int64))
        num_hit_blocks = np.diff(np.searchsorted(hit_ends, access_start)).tolist()
    return _bound_result(trace, "ideal", num_blocks, num_hit_blocks)


def simulate_lru(trace: AccessTrace, num_blocks: int) -> BoundResult:
    """vLLM's exact-prefix cache with LRU eviction, pins ignored (see ``bounds.lru``)."""
    return _bound_result(trace, "lru", num_blocks, lru_hit_blocks(trace, num_blocks))


def ideal_prefill_tokens(requests: Iterable[Any], block_size: int,
                         num_blocks: int) -> BoundResult:
    """The offline ideal bound for ``engine.vllm_engine.requests`` with a pool of ``num_blocks`` usable blocks."""
    return simulate_min(build_access_trace(requests, block_size), num_blocks)


def lru_prefill_tokens(requests: Iterable[Any], block_size: int,
                       num_blocks: int) -> BoundResult:
    """The LRU exact-prefix reference for ``engine.vllm_engine.requests`` at ``num_blocks`` usable blocks."""
    return simulate_lru(build_access_trace(requests, block_size), num_blocks)


def sweep_pool_sizes(requests: Iterable[Any], block_size: int, pool_sizes: Iterable[int],
                     observed_prefill_tokens: Mapping[int, int] | None = None) -> list[dict]:
    """One row per pool size: ideal and LRU prefill tokens (and vLLM's, if observed).

    Args:
        pool_sizes: usable block counts (pool minus the null block).
        observed_prefill_tokens: optional ``{num_blocks: prefill tokens}`` from stock vLLM.
    Returns:
        Rows for ``pandas.DataFrame``: ``num_blocks``, ``num_prompt_tokens``,
        ``num_compulsory_tokens``, ``ideal_prefill_tokens``, ``lru_prefill_tokens``
        and, where observed, ``observed_prefill_tokens``.
    """
    trace = build_access_trace(requests, block_size)
    rows = []
    for num_blocks in pool_sizes:
        ideal = simulate_min(trace, num_blocks)
        row = {"num_blocks": num_blocks, "num_prompt_tokens": ideal.num_prompt_tokens,
               "num_compulsory_tokens": ideal.num_compulsory_tokens,
               "ideal_prefill_tokens": ideal.num_prefill_tokens,
               "lru_prefill_tokens": simulate_lru(trace, num_blocks).num_prefill_tokens}
        if observed_prefill_tokens is not None and num_blocks in observed_prefill_tokens:
            row["observed_prefill_tokens"] = observed_prefill_tokens[num_blocks]
        rows.append(row)
    return rows


def count_exact_prefix_edges(requests: Iterable[Any]) -> int:
    """Producer edges whose child prompt starts with the parent's prompt + output exactly.

    An edge is a request whose ``parent_id`` names another request's
    ``invocation_id``; parents absent from ``engine.vllm_engine.requests`` form no edge.

    Raises:
        ValueError: if two requests share an ``invocation_id`` (ambiguous parent).
    """
    requests = list(requests)
    by_invocation_id: dict[Any, Any] = {}
    for request in requests:
        invocation_id = request_field(request, "invocation_id")
        if invocation_id in by_invocation_id:
            raise ValueError(f"duplicate invocation_id {invocation_id!r}")
        if invocation_id is not None:
            by_invocation_id[invocation_id] = request
    num_exact_edges = 0
    for child in requests:
        parent = by_invocation_id.get(request_field(child, "parent_id"))
        if parent is not None:
            kept = (request_token_ids(parent, "prompt_token_ids")
                    + request_token_ids(parent, "output_token_ids"))
            num_exact_edges += request_token_ids(child, "prompt_token_ids")[:len(kept)] == kept
    return num_exact_edges
