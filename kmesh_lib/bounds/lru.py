"""Reference model of vLLM v1's exact-prefix KV cache with LRU eviction.

The yardstick the offline ideal bound (``bounds.ideal``) must never exceed. It
replays an ``AccessTrace`` one request at a time, so there are no concurrent
requests and active-request pins are ignored, matching the ideal's relaxation.

Recency order kept for one request whose blocks b0..b3 are written:

    LRU end  <-- ... older blocks ... b3  b2  b1  b0 -->  MRU end
                                     (evicted first)

vLLM frees a request's blocks tail-first onto the free queue, so the deepest
block is evicted first and a parent always outlives its children; the resident
set therefore stays ancestor-closed and leading-run hits lose nothing to it.
"""

from collections import OrderedDict

from kmesh_lib.bounds.access import AccessTrace


def lru_hit_blocks(trace: AccessTrace, num_blocks: int) -> list[int]:
    """Per-request reused blocks under exact-prefix matching and LRU eviction.

    Per request: hits are the longest run of leading read blocks that are
    resident (vLLM stops matching at the first missing block hash); then every
    written block, hit or computed, moves to most-recently-used, deepest first;
    then least-recently-used blocks are evicted down to ``num_blocks``.

    Args:
        trace: from ``bounds.access.build_access_trace``.
        num_blocks: usable pool blocks (the caller subtracts vLLM's null block).
    Returns:
        ``num_hit_blocks[r]`` for each request r, each ``<= trace.num_read_blocks[r]``.
    """
    capacity = max(num_blocks, 0)
    recency: OrderedDict[int, None] = OrderedDict()  # least recently used first
    num_hit_blocks = [0] * trace.num_requests
    for request_index in range(trace.num_requests):
        start = trace.access_start[request_index]
        end = trace.access_start[request_index + 1]
        num_reads = trace.num_read_blocks[request_index]
        num_hits = 0
        for block_hash in trace.block_hash[start:start + num_reads]:
            if block_hash not in recency:
                break  # exact prefix: nothing after the first miss is reused
            num_hits += 1
        num_hit_blocks[request_index] = num_hits
        for block_hash in reversed(trace.block_hash[start + num_reads:end]):
            recency[block_hash] = None
            recency.move_to_end(block_hash)
        while len(recency) > capacity:
            recency.popitem(last=False)
    return num_hit_blocks
