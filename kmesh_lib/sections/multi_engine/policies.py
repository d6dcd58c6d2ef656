"""Routing: which engine gets a request, and what the router knows of each engine's pool.

``PrefixIndex`` mirrors one engine's prefix cache from the engine's own KV events (vLLM's
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, as llm-d's KV-cache indexer consumes
them). A block is keyed by (its parent block's hash, its tokens), so the router never computes
vLLM's block hash itself: it walks a prompt's full blocks from the first and follows the hashes
the engine reported.

    round_robin    engine i, i+1, ... over the live engines, in arrival order
    prefix_aware   the live engine whose index matches the longest prefix of the prompt; ties
                   (no engine holds any of it, for a fresh parent or an unrelated request) go to
                   the engine with the fewest requests in flight, then the lowest index

Invariant: a decision reads only the index and the in-flight counts at the moment of the
decision; the index lags the engine by the events still in the pipe, so a match is a prediction
that the request's own ``num_cached_tokens`` later confirms or not (recorded side by side).
"""
from __future__ import annotations


class PrefixIndex:
    """(parent block hash, block tokens) -> block hash for the blocks one engine reported cached."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.by_key: dict[tuple, object] = {}
        self.key_of: dict[object, tuple] = {}
        self.ref_cnt: dict[object, int] = {}  # a hash cached in more than one block is removed once per block

    def apply(self, event: dict) -> None:
        kind = event["type"]
        if kind == "stored":
            parent, tokens, b = event["parent_block_hash"], event["token_ids"], event["block_size"]
            for i, h in enumerate(event["block_hashes"]):
                key = (parent, tuple(tokens[i * b:(i + 1) * b]))
                self.by_key[key], self.key_of[h] = h, key
                self.ref_cnt[h] = self.ref_cnt.get(h, 0) + 1
                parent = h
        elif kind == "removed":
            for h in event["block_hashes"]:
                n = self.ref_cnt.get(h, 0) - 1
                if n > 0:
                    self.ref_cnt[h] = n
                    continue
                self.ref_cnt.pop(h, None)
                key = self.key_of.pop(h, None)
                if key is not None and self.by_key.get(key) == h:
                    del self.by_key[key]
        elif kind == "cleared":
            self.clear()

    def clear(self) -> None:
        self.by_key.clear()
        self.key_of.clear()
        self.ref_cnt.clear()

    def __len__(self) -> int:
        return len(self.by_key)

    def match_tokens(self, token_ids: list[int]) -> int:
        """Tokens of the longest prefix of ``token_ids`` whose full blocks the engine holds."""
        b, parent, n = self.block_size, None, 0
        for start in range(0, len(token_ids) - b + 1, b):
            h = self.by_key.get((parent, tuple(token_ids[start:start + b])))
            if h is None:
                break
            parent, n = h, n + b
        return n


class RoundRobin:
    name = "round_robin"

    def __init__(self, num_engines: int) -> None:
        self.num_engines = num_engines
        self.next = 0

    def choose(self, matched: list[int], in_flight: list[int], live: list[bool]) -> int:
        for k in range(self.num_engines):
            i = (self.next + k) % self.num_engines
            if live[i]:
                self.next = (i + 1) % self.num_engines
                return i
        raise LookupError("no live engine")


class PrefixAware:
    name = "prefix_aware"

    def __init__(self, num_engines: int) -> None:
        self.num_engines = num_engines

    def choose(self, matched: list[int], in_flight: list[int], live: list[bool]) -> int:
        candidates = [i for i in range(self.num_engines) if live[i]]
        if not candidates:
            raise LookupError("no live engine")
        return min(candidates, key=lambda i: (-matched[i], in_flight[i], i))


ROUTERS = {"round_robin": RoundRobin, "prefix_aware": PrefixAware}
