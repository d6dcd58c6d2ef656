"""Block-pool capture: every allocation, touch, free and eviction, with reference counts.

The capture wraps four methods of a live ``vllm.v1.core.block_pool.BlockPool`` instance (no
vLLM source change) and logs one event per call:

    alloc  get_new_blocks(n)          blocks popped from the free queue, ref_cnt 0 -> 1
    touch  touch(blocks)              prefix hits and family holds take a reference
    free   free_blocks(ordered)       a reference dropped; ref_cnt 0 returns a block to the queue
    evict  _maybe_evict_cached_block  a cached block's hash dropped as it is reused

Each event carries the index of the engine step it happened in (``mark_step``, run after every
step, counts them over the capture's life) and the ``ref_cnt`` of its blocks after the call.
Block 0 is vLLM's null block: it is never in the free queue and its
``ref_cnt`` is not maintained, so every check here excludes it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockEvent:
    step: int
    op: str  # alloc | touch | free | evict | hold | release
    block_ids: tuple[int, ...]
    ref_cnts: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"step": self.step, "op": self.op, "block_ids": list(self.block_ids), "ref_cnts": list(self.ref_cnts)}


@dataclass
class DrainReport:
    """After every request finished and every hold is released, the pool must be whole again."""

    num_usable_blocks: int
    num_free_blocks: int
    num_queue_blocks: int
    referenced_block_ids: list[int] = field(default_factory=list)  # non-null blocks with ref_cnt != 0

    @property
    def ok(self) -> bool:
        return (not self.referenced_block_ids and self.num_free_blocks == self.num_usable_blocks
                and self.num_queue_blocks == self.num_usable_blocks)

    def __str__(self) -> str:
        return (f"drain ok: {self.ok} (free {self.num_free_blocks}/{self.num_usable_blocks}, "
                f"queue {self.num_queue_blocks}, referenced {len(self.referenced_block_ids)})")


def drain_check(block_pool) -> DrainReport:
    """Every non-null reference released and every usable block back in the free queue."""
    usable = block_pool.num_gpu_blocks - 1
    return DrainReport(
        num_usable_blocks=usable,
        num_free_blocks=block_pool.get_num_free_blocks(),
        num_queue_blocks=len(block_pool.free_block_queue.get_all_free_blocks()),
        referenced_block_ids=[b.block_id for b in block_pool.blocks if not b.is_null and b.ref_cnt != 0],
    )


class BlockPoolCapture:
    """Wraps a live block pool; ``close()`` restores the original methods."""

    def __init__(self, block_pool) -> None:
        self.block_pool = block_pool
        self.events: list[BlockEvent] = []
        self.num_free_by_step: list[tuple[int, int]] = []  # (step, free blocks after it)
        self.step = 0
        self._originals = {}
        self._wrap("get_new_blocks", self._after_alloc)
        self._wrap("touch", self._after_touch, materialize=True)
        self._wrap("free_blocks", self._after_free, materialize=True)
        self._wrap("_maybe_evict_cached_block", self._after_evict)

    def mark_step(self, step: int) -> None:
        """Call after each engine step (``run_group(on_step=...)``); later events get ``step + 1``."""
        self.num_free_by_step.append((self.step, self.block_pool.get_num_free_blocks()))
        self.step += 1

    def log(self, op: str, blocks) -> None:
        """Logs an event for ``blocks`` (controllers use it for hold/release)."""
        blocks = [b for b in blocks if not b.is_null]
        if blocks:
            self.events.append(BlockEvent(self.step, op, tuple(b.block_id for b in blocks),
                                          tuple(b.ref_cnt for b in blocks)))

    def _wrap(self, name: str, after, materialize: bool = False) -> None:
        original = getattr(self.block_pool, name)
        self._originals[name] = original

        def wrapper(arg, *args, **kwargs):
            if materialize:  # free_blocks gets a reversed() iterator; read it once
                arg = list(arg)
            result = original(arg, *args, **kwargs)
            after(arg, result)
            return result

        setattr(self.block_pool, name, wrapper)

    def _after_alloc(self, num_blocks, blocks) -> None:
        self.log("alloc", blocks)

    def _after_touch(self, blocks, _result) -> None:
        self.log("touch", blocks)

    def _after_free(self, blocks, _result) -> None:
        self.log("free", blocks)

    def _after_evict(self, block, evicted) -> None:
        if evicted:
            self.log("evict", [block])

    def close(self) -> None:
        for name in self._originals:
            # the wrappers are instance attributes; deleting them exposes the class methods again
            self.block_pool.__dict__.pop(name, None)
        self._originals.clear()

    # -- summaries --
    def count(self, op: str) -> int:
        """Number of block-level operations of kind ``op`` (a touch of 3 blocks counts 3)."""
        return sum(len(e.block_ids) for e in self.events if e.op == op)

    def counts(self) -> dict[str, int]:
        return {op: self.count(op) for op in ("alloc", "touch", "free", "evict", "hold", "release")}

    def evicted_block_ids(self) -> list[int]:
        return [b for e in self.events if e.op == "evict" for b in e.block_ids]

    def to_records(self) -> list[dict]:
        return [e.to_dict() for e in self.events]



# How each logged op changes a block's reference count (``hold``/``release``: the family hold's own).
TAKES = {"alloc": 1, "touch": 1, "hold": 1, "free": -1, "release": -1}


def net_references(events: list[dict]) -> Counter:
    """Per block id: references taken minus references dropped over the whole capture."""
    net: Counter = Counter()
    for event in events:
        delta = TAKES.get(event["op"], 0)
        for block_id in event["block_ids"]:
            net[block_id] += delta
    return net


def replay_references(events: list[dict]) -> tuple[Counter, list[str]]:
    """Replays one capture's events from a drained pool and returns (references per block, errors).

    Invariant checked at every event: the ``ref_cnt`` the capture logged after the call equals the
    replayed count (alloc takes a block from 0 to 1; touch and hold add one; free and release drop
    one; an evicted block has no reference). An error names the event by its position and step.
    A pool that drained ends with every count at zero.
    """
    refs: Counter = Counter()
    errors = []
    for i, event in enumerate(events):
        op = event["op"]
        if len(event["block_ids"]) != len(event["ref_cnts"]):
            errors.append(f"event {i} (step {event['step']}): {len(event['block_ids'])} blocks, "
                          f"{len(event['ref_cnts'])} ref_cnts")
        for block_id, logged in zip(event["block_ids"], event["ref_cnts"]):
            if op in ("alloc", "evict") and refs[block_id] != 0:
                errors.append(f"event {i} (step {event['step']}): {op} of block {block_id} "
                              f"with {refs[block_id]} references")
            refs[block_id] += TAKES.get(op, 0)
            if refs[block_id] != logged:
                errors.append(f"event {i} (step {event['step']}): {op} left block {block_id} at ref_cnt "
                              f"{logged}, the replay says {refs[block_id]}")
    return refs, errors
