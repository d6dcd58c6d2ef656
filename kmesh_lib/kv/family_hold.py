"""Family hold: keep a finished parent's cached KV blocks for its child, on stock vLLM.

vLLM frees a finished request's blocks at once; hashed ones stay reusable at the free queue's
tail only until allocation pressure evicts them. A family hold adds a reference to each of the
parent's full cached blocks just before vLLM drops the request's own, so they never reach the
free queue and a child extending the parent's input and output hits the same physical blocks
(no second copy). It ends once the child is scheduled, on expiry, cancellation or close.

Hooks, instance attributes on the live ``KVCacheManager`` (no vLLM source change):
``free(request)`` holds a finished parent's hashed blocks before vLLM frees them;
``allocate_slots(request)`` releases the hold once the child's prefix hits are touched.

Invariants (``check_invariants`` returns every violation):

* The controller owns exactly one pool reference per unique held block, however many families
  hold it, so ``block.ref_cnt >= 1`` for every held block and none of them is in the free queue.
* ``num_held_blocks <= max_held_blocks`` and ``len(families) <= max_families`` at all times:
  an admission that would break a cap is refused, counted, and changes nothing.
* Each hold or expectation carries a controller-wide unique generation. ``release(family_id,
  generation)`` acts only on the family's current generation, so a stale release never drops a
  newer hold.
* Family references bypass the capture's ``touch``/``free_blocks`` wrappers and are logged as
  ``hold``/``release`` instead, so a capture counts every pool reference exactly once.
"""
from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass, field

COUNTERS = ("num_families_admitted", "num_holds", "num_released", "num_stale_releases", "num_expired",
            "num_cancelled", "num_closed", "num_parents_aborted", "num_refused_families_cap",
            "num_refused_blocks_cap", "num_refused_blocks", "peak_held_blocks")


@dataclass
class Family:
    family_id: str
    generation: int
    deadline: float
    parent_request_id: str | None = None  # waiting for this request to finish
    child_request_id: str | None = None  # release once this request is scheduled
    blocks: list = field(default_factory=list)  # held KVCacheBlocks, block-table order
    fulfilled: bool = False  # this generation has taken its hold


@dataclass(frozen=True)
class FamilyEdge:
    """What a child found when it was scheduled: its first blocks against the family's hold."""
    family_id: str
    generation: int
    parent_request_id: str | None
    child_request_id: str
    held_block_ids: tuple[int, ...]
    child_block_ids: tuple[int, ...]  # the child's block table, first len(held) entries

    @property
    def aliased(self) -> bool:  # the child reuses the parent's exact physical blocks
        return bool(self.held_block_ids) and self.child_block_ids == self.held_block_ids


class FamilyHoldController:
    """Bounded family holds on a live vLLM block pool.

    Args:
        target: an engine (``.kv_cache_manager``), a ``KVCacheManager``, or a bare ``BlockPool``
            (no hooks then: call ``hold``/``release`` yourself).
        capture: optional ``BlockPoolCapture``; holds and releases are logged on it.
        max_held_blocks: cap on unique held blocks (>= 1).
        max_families: cap on families expecting or holding (>= 1).
        expiry_s: a family expires this long after its last admission or hold.
        clock: seconds, monotonic; tests pass a fake.
        random_id_suffix: the engine appends ``-<8 chars>`` to request ids (real vLLM does);
            None reads it from ``target.mode == "real"``.
    """

    def __init__(self, target, capture=None, *, max_held_blocks: int, max_families: int,
                 expiry_s: float = 60.0, clock=time.monotonic, random_id_suffix: bool | None = None) -> None:
        if max_held_blocks < 1 or max_families < 1 or expiry_s <= 0:
            raise ValueError(f"max_held_blocks={max_held_blocks}, max_families={max_families} and "
                             f"expiry_s={expiry_s} must be > 0")
        kvm = getattr(target, "kv_cache_manager", None) or (target if hasattr(target, "coordinator") else None)
        self.kv_cache_manager = kvm
        self.block_pool = kvm.block_pool if kvm is not None else target
        self.capture = capture
        self.max_held_blocks, self.max_families, self.expiry_s, self.clock = max_held_blocks, max_families, expiry_s, clock
        self.closed = False
        self.random_id_suffix = (getattr(target, "mode", None) == "real") if random_id_suffix is None else random_id_suffix
        self.families: dict[str, Family] = {}
        self.edges: list[FamilyEdge] = []
        self._refs: dict[int, int] = {}  # block_id -> families holding it
        self._blocks: dict[int, object] = {}  # block_id -> KVCacheBlock
        self._parents: dict[str, str] = {}  # parent request id -> family_id
        self._children: dict[str, str] = {}  # child request id -> family_id
        self._next_generation = 1
        self.__dict__.update(dict.fromkeys(COUNTERS, 0))
        # NOTE: call the class methods so the capture's touch/free wrappers do not also log the
        # family reference; it is logged once, as hold/release.
        pool_cls = type(self.block_pool)
        self._pool_touch = pool_cls.touch.__get__(self.block_pool)
        self._pool_free = pool_cls.free_blocks.__get__(self.block_pool)
        self._hooked: dict[str, object] = {}
        if kvm is not None:
            self._hook("free", self._free_hook)
            self._hook("allocate_slots", self._allocate_hook)

    # -- public API --
    @property
    def num_held_blocks(self) -> int:
        return len(self._refs)

    def expect_child(self, parent_request_id: str, family_id: str, child_request_id: str | None = None) -> int | None:
        """Admits ``family_id``: hold ``parent_request_id``'s cached blocks when it finishes.

        Returns the new generation, or None when the family cap refuses a new family. An active
        family keeps its current hold until the new parent's hold replaces it.
        """
        if self.closed:
            raise RuntimeError("FamilyHoldController is closed")
        self.expire()
        fam = self.families.get(family_id)
        if fam is not None:  # an active family: a new generation; its hold stays until replaced
            fam.generation, fam.deadline, fam.fulfilled = self._new_generation(), self.clock() + self.expiry_s, False
            self._forget_requests(fam)
        elif (fam := self._admit(family_id)) is None:
            return None
        fam.parent_request_id, fam.child_request_id = parent_request_id, child_request_id
        self._parents[parent_request_id] = family_id
        if child_request_id is not None:
            self._children[child_request_id] = family_id
        return fam.generation

    def hold(self, family_id: str, blocks) -> int | None:
        """Takes family references on ``blocks`` (block-table order), replacing the family's hold.

        Returns the hold's generation, or None when a cap refuses it (nothing changes then).
        """
        if self.closed:
            raise RuntimeError("FamilyHoldController is closed")
        self.expire()
        return self._hold(family_id, [b for b in blocks if not b.is_null])

    def release(self, family_id: str, generation: int) -> int:
        """Ends ``family_id`` if ``generation`` is its current one; returns blocks returned to the pool."""
        fam = self.families.get(family_id)
        if fam is None or fam.generation != generation:
            self.num_stale_releases += 1
            return 0
        self.num_released += 1
        return self._drop(fam)

    def cancel(self, family_id: str) -> int:
        """Ends ``family_id`` whatever its generation; returns blocks returned to the pool."""
        fam = self.families.get(family_id)
        if fam is None:
            return 0
        self.num_cancelled += 1
        return self._drop(fam)

    def expire(self, now: float | None = None) -> int:
        """Ends every family past its deadline; returns how many. Runs at invocation boundaries."""
        now = self.clock() if now is None else now
        late = [self._drop(f) for f in list(self.families.values()) if f.deadline <= now]
        self.num_expired += len(late)
        return len(late)

    def close(self) -> None:
        """Ends every family, returns every held block and removes the hooks."""
        for fam in list(self.families.values()):
            self.num_closed += 1
            self._drop(fam)
        for name, previous in self._hooked.items():
            if previous is None:
                self.kv_cache_manager.__dict__.pop(name, None)
            else:
                setattr(self.kv_cache_manager, name, previous)
        self._hooked.clear()
        self.closed = True

    def stats(self) -> dict[str, int]:
        return {**{n: getattr(self, n) for n in COUNTERS}, "num_held_blocks": len(self._refs), "num_families": len(self.families)}

    def check_invariants(self) -> list[str]:
        """Every violation of the class invariants (empty when they hold)."""
        want = Counter(b.block_id for fam in self.families.values() for b in fam.blocks)
        queued = {b.block_id for b in self.block_pool.free_block_queue.get_all_free_blocks()}
        return ([f"family references {self._refs} != the families' blocks {dict(want)}"] * (want != self._refs)
                + [f"held block {i}: ref_cnt {b.ref_cnt}, in free queue {i in queued}"
                   for i, b in self._blocks.items() if b.ref_cnt < 1 or i in queued]
                + [f"{self.num_held_blocks} held blocks > cap {self.max_held_blocks}"]
                * (self.num_held_blocks > self.max_held_blocks)
                + [f"{len(self.families)} families > cap {self.max_families}"] * (len(self.families) > self.max_families))

    # -- internals --
    def _new_generation(self) -> int:
        self._next_generation += 1
        return self._next_generation - 1

    def _admit(self, family_id: str) -> Family | None:
        if len(self.families) >= self.max_families:
            self.num_refused_families_cap += 1
            return None
        fam = self.families[family_id] = Family(family_id, self._new_generation(), self.clock() + self.expiry_s)
        self.num_families_admitted += 1
        return fam

    def _hold(self, family_id: str, blocks: list) -> int | None:
        fam = self.families.get(family_id)
        if fam is None and len(self.families) >= self.max_families:
            return self._admit(family_id)  # refused and counted there
        old_ids = {b.block_id for b in fam.blocks} if fam else set()
        new_ids = {b.block_id for b in blocks}
        dropped = {i for i in old_ids - new_ids if self._refs[i] == 1}
        if len((set(self._refs) | new_ids) - dropped) > self.max_held_blocks:
            self.num_refused_blocks_cap += 1
            self.num_refused_blocks += len(new_ids - set(self._refs))
            return None
        if fam is None:
            fam = self._admit(family_id)
        elif fam.fulfilled:  # a second hold of one generation is a new generation
            fam.generation = self._new_generation()
        fresh = [b for b in blocks if b.block_id not in self._refs]
        self._pool_touch(fresh)
        if self.capture is not None:
            self.capture.log("hold", fresh)
        for b in blocks:
            self._refs[b.block_id] = self._refs.get(b.block_id, 0) + 1
            self._blocks[b.block_id] = b
        self._unref(fam.blocks)
        fam.blocks, fam.deadline, fam.fulfilled = list(blocks), self.clock() + self.expiry_s, True
        self.num_holds += 1
        self.peak_held_blocks = max(self.peak_held_blocks, self.num_held_blocks)
        return fam.generation

    def _forget_requests(self, fam: Family) -> None:
        for table, request_id in ((self._parents, fam.parent_request_id), (self._children, fam.child_request_id)):
            if table.get(request_id) == fam.family_id:
                del table[request_id]

    def _unref(self, blocks) -> list:
        """Drops one family reference per block; frees the last ones, chain tail first."""
        freed = []
        for b in reversed(blocks):
            self._refs[b.block_id] -= 1
            if self._refs[b.block_id] == 0:
                del self._refs[b.block_id], self._blocks[b.block_id]
                freed.append(b)
        self._pool_free(freed)
        if self.capture is not None:
            self.capture.log("release", freed)
        return freed

    def _drop(self, fam: Family) -> int:
        self._forget_requests(fam)
        del self.families[fam.family_id]
        return len(self._unref(fam.blocks))

    def _key(self, request_id: str) -> str:
        return request_id.rsplit("-", 1)[0] if self.random_id_suffix else request_id

    def _hook(self, name: str, wrapper) -> None:
        self._hooked[name] = self.kv_cache_manager.__dict__.get(name)  # None: the class method
        setattr(self.kv_cache_manager, name, functools.partial(wrapper, getattr(self.kv_cache_manager, name)))

    def _cached_blocks(self, request_id: str) -> list:
        """The request's full, hashed blocks: ``req_to_blocks[rid][:num_cached_block[rid]]``."""
        return [b for m in self.kv_cache_manager.coordinator.single_type_managers
                for b in m.req_to_blocks.get(request_id, [])[:m.num_cached_block.get(request_id, 0)]
                if not b.is_null and b.block_hash is not None]

    def _free_hook(self, original, request) -> None:
        # NOTE: preemption frees blocks too, while the request is RUNNING: only a finished
        # parent is held. At this point req_to_blocks still has its table.
        if request.is_finished() and self._parents:
            self.expire()  # a request finishing is an invocation boundary
            family_id = self._parents.pop(self._key(request.request_id), None)
            fam = self.families.get(family_id)
            if fam is not None and request.status.name == "FINISHED_ABORTED":
                self.num_parents_aborted += 1
                self._drop(fam)
            elif fam is not None and self._hold(family_id, self._cached_blocks(request.request_id)) is None \
                    and not fam.blocks:
                self._drop(fam)  # refused by the block cap: the family ends
        original(request)

    def _allocate_hook(self, original, request, *args, **kwargs):
        new_blocks = original(request, *args, **kwargs)
        family_id = self._children.get(self._key(request.request_id)) if new_blocks is not None else None
        if family_id is not None:
            # The child has touched its prefix hits inside allocate_slots: dropping the family
            # reference now cannot send a shared block back to the free queue.
            fam = self.families[family_id]
            held = tuple(b.block_id for b in fam.blocks)
            table = self.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(request.request_id, [])
            self.edges.append(FamilyEdge(family_id, fam.generation, fam.parent_request_id, fam.child_request_id,
                                         held, tuple(b.block_id for b in table[:len(held)])))
            self.release(family_id, fam.generation)
        return new_blocks
