"""Offline ideal bound on prefill tokens for an exact-prefix KV cache (section 19).

Given the captured request order and a pool of ``num_blocks`` usable KV blocks,
how few prefill tokens (input tokens whose KV is not reused) could *any*
exact-prefix cache compute? Stock vLLM's observed prefill is compared to it.

Each request reads R = (P-1)//B blocks, then writes W = (P+O-1)//B blocks
(``block_access`` draws the accounting; P prompt, O output tokens, block size B).

* Invariant: per request ``num_prefill_tokens = P - num_hit_blocks * B``, so
  ``num_compulsory_tokens <= num_prefill_tokens <= P``.

Relaxations that favour the ideal: it knows the future, may bypass any write,
ignores active-request pins, and counts a resident block i as a hit even if an
ancestor block missed. That last one never lowers the optimum: MIN's schedule is
ancestor-closed (a child's next read is strictly after its parent's, so a child is
evicted first and bypassed whenever its parent is), so its hits are leading runs
and it is also the best exact-prefix schedule (the tests check against brute force).
"""

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kmesh_lib.block_access import (
    AccessTrace, block_hashes, build_access_trace, request_field, request_token_ids)
from kmesh_lib.prefix_lru import lru_hit_blocks

__all__ = [
    "AccessTrace", "BoundResult", "RequestPrefill", "block_hashes", "build_access_trace",
    "count_exact_prefix_edges", "ideal_prefill_tokens", "lru_prefill_tokens",
    "next_read_positions", "simulate_lru", "simulate_min", "sweep_pool_sizes"]


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


def simulate_min(trace: AccessTrace, num_blocks: int) -> BoundResult:
    """Belady's MIN with bypass: the fewest read misses any cache of ``num_blocks`` allows.

    Reads never change the resident set. A write of a non-resident block (one the
    request just computed) is admitted only if its next read comes before that of
    the resident block read farthest in the future, which it then evicts.

    Why optimal (Belady's exchange argument; writes only add free admissions):
    items are unit-size and each read miss costs one. Let an optimal schedule S
    first differ from MIN by keeping f where MIN keeps g, g being read before f.
    S' keeps g instead and copies S. If S drops f before g's read, S' drops g then
    and both coincide. Otherwise S' hits g's read where S misses, and can trail S
    only at f's read, after which f is written again and S' rejoins S. So S' is
    also optimal and agrees with MIN one step longer. Blocks never read again are
    never admitted: they can only take space.

    Args:
        trace: from ``build_access_trace``.
        num_blocks: usable pool blocks (the caller subtracts vLLM's null block).
    Returns:
        ``BoundResult`` with ``policy="ideal"``.
    """
    never = trace.num_accesses
    next_read = next_read_positions(trace)
    resident: dict[int, int] = {}  # block_hash -> position of its next read
    # Max-heap on next read with lazy deletion: an entry is live iff it matches resident.
    farthest_first: list[tuple[int, int]] = []
    num_hit_blocks = [0] * trace.num_requests
    for pos, block_hash in enumerate(trace.block_hash):
        upcoming = next_read[pos]
        if trace.is_read[pos]:
            if block_hash in resident:
                num_hit_blocks[trace.request_index[pos]] += 1
                resident[block_hash] = upcoming
                heapq.heappush(farthest_first, (-upcoming, block_hash))
            continue
        if block_hash in resident or upcoming == never or num_blocks <= 0:
            continue
        if len(resident) >= num_blocks:
            while resident.get(farthest_first[0][1]) != -farthest_first[0][0]:
                heapq.heappop(farthest_first)
            neg_victim_next_read, victim = farthest_first[0]
            if -neg_victim_next_read < upcoming:
                continue  # bypass: every resident block is read again sooner
            heapq.heappop(farthest_first)
            del resident[victim]
        resident[block_hash] = upcoming
        heapq.heappush(farthest_first, (-upcoming, block_hash))
    return _bound_result(trace, "ideal", num_blocks, num_hit_blocks)


def simulate_lru(trace: AccessTrace, num_blocks: int) -> BoundResult:
    """vLLM's exact-prefix cache with LRU eviction, pins ignored (see ``prefix_lru``)."""
    return _bound_result(trace, "lru", num_blocks, lru_hit_blocks(trace, num_blocks))


def ideal_prefill_tokens(requests: Iterable[Any], block_size: int,
                         num_blocks: int) -> BoundResult:
    """The offline ideal bound for ``requests`` with a pool of ``num_blocks`` usable blocks."""
    return simulate_min(build_access_trace(requests, block_size), num_blocks)


def lru_prefill_tokens(requests: Iterable[Any], block_size: int,
                       num_blocks: int) -> BoundResult:
    """The LRU exact-prefix reference for ``requests`` at ``num_blocks`` usable blocks."""
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
    ``invocation_id``; parents absent from ``requests`` form no edge.

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
