"""Scheduler-side bookkeeping of the host-staged GPU buffer: which contexts it holds, and where.

An *entry* is one external copy of a context: the KV of its first ``num_blocks`` full vLLM blocks,
named by vLLM's own chained block hashes (``Request.block_hashes``), so a hash at position i names
the whole prefix up to block i. An entry lives on the disk tier (one file) and, while resident, in
one *extent* of the buffer: ``num_blocks`` consecutive buffer blocks of ``bytes_per_block`` bytes
each (every layer's KV of one vLLM block), inside the buffer's single allocation.

    buffer blocks  | entry 3 (resident) |  free  | entry 7 (staging) | pending free (entry 5) | free |

Entry states:

    absent      on disk only
    staging     a restore in this step's connector metadata reads it from disk into its extent
    prefetching a background prefetch reads it from disk into its extent; lookups answer "later"
    resident    its extent holds a complete copy; a hit is a device-to-device copy into vLLM

Invariants (``check_invariants`` asserts them; the tests call it after every step):
    - extents of entries and pending frees never overlap, and with the free extents they tile the
      buffer exactly: ``num_allocated_blocks + num_free_blocks == num_buffer_blocks`` (never over
      capacity);
    - an entry has an extent iff its state is staging, prefetching or resident;
    - ``ref_cnt`` counts restores scheduled in the current step that read the entry's extent; an
      extent with ``ref_cnt > 0`` is never evicted or freed;
    - discard: an extent a restore read is released one step later (``pending_free``), once the
      worker has queued every copy that reads it (vLLM runs a step's worker side before the next
      ``build_connector_meta``), so a new writer never overtakes an old reader.

Nothing here touches a tensor: it runs on the CPU against vLLM's real scheduler in the tests.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

ABSENT, STAGING, PREFETCHING, RESIDENT = "absent", "staging", "prefetching", "resident"
_STATE_ORDER = {RESIDENT: 0, STAGING: 1, PREFETCHING: 2, ABSENT: 3}  # a lookup prefers the readiest of a hash's entries
_NUM_TOP_PROBES = 4  # a lookup's first asks, from the request's last full block down (``BufferIndex._last_held``)


class BufferFull(RuntimeError):
    """The buffer has no extent of the size asked for, even after evicting every unreferenced copy."""


@dataclass(slots=True)
class Entry:
    entry_id: int
    block_hashes: tuple
    token_ids: tuple[int, ...]
    on_disk: bool = True
    state: str = ABSENT
    extent_start: int | None = None
    ref_cnt: int = 0
    last_used: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes)


class Match(NamedTuple):
    """What a lookup found: ``num_blocks`` leading blocks of ``entry``, read from ``source``. (A named tuple: a
    lookup makes one on the engine's step, and a frozen dataclass sets each field through ``object.__setattr__``.)"""

    entry_id: int
    num_blocks: int
    source: str  # "buffer" (resident or staging this step) or "disk"


@dataclass(slots=True)
class LoadOp:
    """One restore: copy blocks [first_block, first_block + num_blocks) of an entry into vLLM's
    ``block_ids``; ``stage_from_disk`` first reads the whole entry from disk into its extent.

    ``block_ids`` is None until the step's metadata is built: the connector takes them from the
    scheduler's output then (vLLM lists a new request's blocks there for its runner anyway), rather
    than walking vLLM's block objects for them when it records the load; a list, or, where the launch
    thread packs them, their range of the request's table unread (``id_pack.IdRange``)."""

    req_id: str
    entry_id: int
    source: str
    extent_start: int
    entry_num_blocks: int
    first_block: int
    num_blocks: int
    block_ids: list[int] | None  # or an ``id_pack.IdRange`` (see above)
    stage_from_disk: bool
    retain: bool
    t_lookup_first_ns: int = 0  # first lookup call for this request (a lookup answered "later" is retried)
    t_lookup_end_ns: int = 0  # the call that answered
    num_lookup_calls: int = 0
    t_allocated_ns: int = 0  # vLLM had allocated the request's blocks (``update_state_after_alloc``)
    schedule_ns: int = 0  # the connector's own scheduler-side time on it (``RestoreTimeline.schedule_ns``)
    packed_ids: bytes | None = None  # ``block_ids`` as the copy kernel reads them (``fused_copy.pack_ids``)
    pack_ns: int = 0  # the part of ``schedule_ns`` that took ``block_ids`` from the scheduler output and packed them


@dataclass
class SaveOp:
    """Write vLLM's ``block_ids`` (an entry's blocks, in order) to the entry's file on the disk tier."""

    entry_id: int
    block_ids: list[int]


@dataclass
class _Extents:
    """First-fit allocator of consecutive buffer blocks; free extents kept sorted and merged."""

    num_blocks: int
    free: list[tuple[int, int]] = field(default_factory=list)  # (start, length)

    def __post_init__(self) -> None:
        self.free = [(0, self.num_blocks)] if self.num_blocks > 0 else []

    @property
    def num_free_blocks(self) -> int:
        return sum(n for _, n in self.free)

    def largest(self) -> int:
        return max((n for _, n in self.free), default=0)

    def allocate(self, n: int) -> int | None:
        for i, (start, length) in enumerate(self.free):
            if length >= n:
                self.free[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        return None

    def release(self, start: int, n: int) -> None:
        self.free.append((start, n))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for s, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.free = merged


class BufferIndex:
    """Entries, the buffer's extents and the restores and saves of the step being scheduled.

    Args:
        num_buffer_blocks: buffer capacity in vLLM blocks (every layer's KV of one block each).
        bytes_per_block: KV bytes of one vLLM block over all layers (the buffer's block size).
        block_size: vLLM's BLOCK_SIZE in tokens.
    """

    def __init__(self, num_buffer_blocks: int, bytes_per_block: int, block_size: int) -> None:
        self.num_buffer_blocks = num_buffer_blocks
        self.bytes_per_block = bytes_per_block
        self.block_size = block_size
        self.extents = _Extents(num_buffer_blocks)
        self.entries: dict[int, Entry] = {}
        self._by_hash: dict[object, list[int]] = {}
        self._ids = itertools.count()
        self._tick = itertools.count(1)
        self.pending_free: list[tuple[int, int, int]] = []  # (entry_id, start, num_blocks): freed next step
        self.loads: list[LoadOp] = []
        self.saves: list[SaveOp] = []
        self.retain = True
        self.stats = {"num_lookups": 0, "num_hits_buffer": 0, "num_hits_disk": 0, "num_misses": 0,
                      "num_lookups_later": 0, "num_misses_buffer_full": 0, "num_evictions": 0,
                      "num_saves": 0, "num_saves_deduplicated": 0, "num_restores": 0,
                      "num_restored_blocks": 0, "num_discards": 0}

    # -- accounting --
    @property
    def num_allocated_blocks(self) -> int:
        return self.num_buffer_blocks - self.extents.num_free_blocks

    @property
    def num_resident_blocks(self) -> int:
        """Blocks holding a copy a lookup can hit now or once its load finishes."""
        return sum(e.num_blocks for e in self.entries.values() if e.extent_start is not None)

    @property
    def num_pending_free_blocks(self) -> int:
        return sum(n for _, _, n in self.pending_free)

    def resident_bytes(self) -> int:
        return self.num_resident_blocks * self.bytes_per_block

    def allocated_bytes(self) -> int:
        return self.num_allocated_blocks * self.bytes_per_block

    def capacity_bytes(self) -> int:
        return self.num_buffer_blocks * self.bytes_per_block

    def check_invariants(self) -> None:
        spans = [(e.extent_start, e.num_blocks) for e in self.entries.values() if e.extent_start is not None]
        spans += [(s, n) for _, s, n in self.pending_free] + list(self.extents.free)
        spans.sort()
        pos = 0
        for start, n in spans:
            assert start == pos, f"buffer extents overlap or leave a gap at block {pos} (next extent at {start})"
            pos += n
        assert pos == self.num_buffer_blocks, f"extents cover {pos} of {self.num_buffer_blocks} buffer blocks"
        for e in self.entries.values():
            assert (e.extent_start is not None) == (e.state != ABSENT), f"entry {e.entry_id}: {e.state} vs extent"
            assert e.ref_cnt >= 0 and (e.ref_cnt == 0 or e.extent_start is not None)

    # -- entries --
    def add_entry(self, block_hashes, token_ids) -> Entry:
        entry = Entry(next(self._ids), tuple(block_hashes), tuple(token_ids), last_used=next(self._tick))
        self.entries[entry.entry_id] = entry
        for h in entry.block_hashes:
            self._by_hash.setdefault(h, []).append(entry.entry_id)
        return entry

    def covers(self, block_hashes) -> bool:
        """An entry already holds this whole chain (its last hash names the whole prefix)."""
        return bool(block_hashes) and bool(self._by_hash.get(block_hashes[-1]))

    def drop_entry(self, entry_id: int) -> None:
        entry = self.entries.pop(entry_id)
        for h in entry.block_hashes:
            ids = self._by_hash.get(h, [])
            if entry_id in ids:
                ids.remove(entry_id)
            if not ids:
                self._by_hash.pop(h, None)
        if entry.extent_start is not None:
            self.extents.release(entry.extent_start, entry.num_blocks)

    def find_by_tokens(self, token_ids) -> Entry | None:
        """The entry whose tokens are the longest prefix of ``token_ids``."""
        token_ids = tuple(token_ids)
        best = None
        for e in self.entries.values():
            if token_ids[:len(e.token_ids)] == e.token_ids and (best is None or e.num_blocks > best.num_blocks):
                best = e
        return best

    # -- lookups (side-effect free except for counters) --
    def lookup(self, block_hashes, num_computed_tokens: int, num_tokens: int) -> Match | None | str:
        """The longest stored prefix of ``block_hashes`` beyond ``num_computed_tokens``.

        Returns a ``Match``, ``None`` (nothing to load) or ``"later"`` (its copy is being prefetched).
        At most ``(num_tokens - 1) // block_size`` blocks: vLLM must compute the last token itself.
        """
        self.stats["num_lookups"] += 1
        first = num_computed_tokens // self.block_size
        max_blocks = min(len(block_hashes), (num_tokens - 1) // self.block_size)
        for j in range(self._last_held(block_hashes, first, max_blocks), first - 1, -1):
            ids = self._by_hash.get(block_hashes[j])
            if not ids:
                continue
            entry = self.entries[ids[0]] if len(ids) == 1 else \
                min((self.entries[i] for i in ids), key=lambda e: (_STATE_ORDER[e.state], -e.num_blocks))
            if entry.state == PREFETCHING:
                self.stats["num_lookups_later"] += 1
                return "later"
            if entry.state in (RESIDENT, STAGING):
                return Match(entry.entry_id, j + 1, "buffer")
            if not entry.on_disk:
                continue
            if not self._can_allocate(entry.num_blocks):
                self.stats["num_misses_buffer_full"] += 1
                return None
            return Match(entry.entry_id, j + 1, "disk")
        self.stats["num_misses"] += 1
        return None

    def _last_held(self, block_hashes, lo: int, hi: int) -> int:
        """The last index in ``[lo, hi)`` whose block hash an entry holds (``lo - 1``: none): vLLM's block
        hashes are chained and every entry holds a chain from block 0, so an entry holding block j's hash
        holds every earlier one, and the held indices form a prefix. A follow-up usually adds a few blocks
        of its own to a stored context, so the top ``_NUM_TOP_PROBES`` indices are asked first, downwards
        (the first held one is the last); then bisection (~log2 of the rest; the walk down asks every one).
        Each ask is a dict probe that misses the host's caches on the engine's step."""
        for _ in range(min(_NUM_TOP_PROBES, hi - lo)):
            hi -= 1
            if self._by_hash.get(block_hashes[hi]):
                return hi
        lo -= 1  # invariant: index lo is held (or before the range), index hi is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._by_hash.get(block_hashes[mid]):
                lo = mid
            else:
                hi = mid
        return lo

    def _evictable(self) -> list[Entry]:
        return sorted((e for e in self.entries.values() if e.state == RESIDENT and e.ref_cnt == 0),
                      key=lambda e: e.last_used)

    def _can_allocate(self, n: int) -> bool:
        """Whether ``allocate`` would find ``n`` consecutive blocks (a dry run of its evictions, in its order)."""
        extents = _Extents(self.num_buffer_blocks)
        extents.free = list(self.extents.free)
        for victim in [None] + self._evictable():
            if victim is not None:
                extents.release(victim.extent_start, victim.num_blocks)
            if extents.largest() >= n:
                return True
        return False

    def allocate(self, entry: Entry, state: str) -> int:
        """Gives ``entry`` an extent, evicting least recently used unreferenced copies if needed.

        Raises:
            BufferFull: no extent of ``entry.num_blocks`` blocks even after every eviction.
        """
        assert entry.extent_start is None
        start = self.extents.allocate(entry.num_blocks)
        for victim in self._evictable():
            if start is not None:
                break
            self._evict(victim)
            start = self.extents.allocate(entry.num_blocks)
        if start is None:
            raise BufferFull(f"no {entry.num_blocks}-block extent in a {self.num_buffer_blocks}-block buffer "
                             f"({self.extents.num_free_blocks} free, largest {self.extents.largest()})")
        entry.extent_start, entry.state = start, state
        entry.last_used = next(self._tick)
        return start

    def _evict(self, entry: Entry) -> None:
        self.extents.release(entry.extent_start, entry.num_blocks)
        entry.extent_start, entry.state = None, ABSENT
        self.stats["num_evictions"] += 1
        if not entry.on_disk:
            self.drop_entry(entry.entry_id)

    def free_copy(self, entry: Entry) -> None:
        """Drops ``entry``'s buffer copy now (nothing may read it: ``ref_cnt == 0``)."""
        assert entry.ref_cnt == 0, f"entry {entry.entry_id} is read by {entry.ref_cnt} scheduled restores"
        if entry.extent_start is not None:
            self.extents.release(entry.extent_start, entry.num_blocks)
            entry.extent_start, entry.state = None, ABSENT
        if not entry.on_disk:
            self.drop_entry(entry.entry_id)

    # -- the step being scheduled --
    def schedule_load(self, req_id: str, match: Match, num_computed_tokens: int, block_ids: list[int] | None,
                      stamps: tuple[int, int, int] = (0, 0, 0)) -> LoadOp:
        """Records a restore of ``match`` into ``block_ids`` (the request's blocks after its local hit;
        None: set on the returned op before the step's ops are taken, ``take_step``)."""
        entry = self.entries[match.entry_id]
        stage = False
        if entry.state == ABSENT:
            self.allocate(entry, STAGING)
            stage = True
        first = num_computed_tokens // self.block_size
        n = match.num_blocks - first
        assert n > 0 and (block_ids is None or n == len(block_ids)), \
            f"restore of {n} blocks into {'?' if block_ids is None else len(block_ids)} vLLM blocks"
        entry.ref_cnt += 1
        entry.last_used = next(self._tick)
        op = LoadOp(req_id, entry.entry_id, match.source, entry.extent_start, entry.num_blocks, first, n,
                    None if block_ids is None else list(block_ids), stage, self.retain, *stamps)
        self.loads.append(op)
        self.stats["num_restores"] += 1
        self.stats["num_restored_blocks"] += n
        self.stats["num_hits_buffer" if match.source == "buffer" else "num_hits_disk"] += 1
        return op

    def schedule_save(self, block_hashes, token_ids, block_ids: list[int]) -> SaveOp | None:
        """Records a save of a request's full prompt blocks, unless an entry already holds that chain."""
        if self.covers(block_hashes):
            self.stats["num_saves_deduplicated"] += 1
            return None
        entry = self.add_entry(block_hashes, token_ids)
        op = SaveOp(entry.entry_id, list(block_ids))
        self.saves.append(op)
        self.stats["num_saves"] += 1
        return op

    def take_step(self) -> tuple[list[LoadOp], list[SaveOp]]:
        """Ends the step being scheduled: returns its ops and settles each entry's copy.

        Extents released at the previous step return to the free list first (the worker queued
        every read of them during that step). A staged copy becomes resident; with discard, every
        copy this step reads goes to ``pending_free`` and is released at the next step.
        """
        self.release_pending()
        loads, saves, self.loads, self.saves = self.loads, self.saves, [], []
        for entry_id in dict.fromkeys(op.entry_id for op in loads):
            entry = self.entries[entry_id]
            entry.ref_cnt = 0
            entry.state = RESIDENT
            if not self.retain:
                self.pending_free.append((entry.entry_id, entry.extent_start, entry.num_blocks))
                entry.extent_start, entry.state = None, ABSENT
                self.stats["num_discards"] += 1
        return loads, saves

    def release_pending(self) -> None:
        """Returns every extent awaiting release to the free list; call only while no step runs."""
        for _, start, n in self.pending_free:
            self.extents.release(start, n)
        self.pending_free = []

    def drop_copies(self) -> int:
        """Frees every unreferenced buffer copy (entries stay on disk); returns the blocks freed."""
        self.release_pending()
        freed = 0
        for entry in list(self.entries.values()):
            if entry.extent_start is not None and entry.ref_cnt == 0 and entry.state == RESIDENT:
                freed += entry.num_blocks
                self.free_copy(entry)
        return freed

    def reset(self) -> list[int]:
        """Forgets every entry (vLLM's ``reset_connector``); returns their ids (their files go too)."""
        ids = list(self.entries)
        for entry_id in ids:
            self.entries[entry_id].ref_cnt = 0
            self.drop_entry(entry_id)
        self.release_pending()
        return ids
