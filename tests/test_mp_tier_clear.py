"""``drop_memory_copy`` of both LMCache tiers against a clear that skips a locked object: the server's unforced
``/cache/clear`` (MPTier) and LocalCPUBackend's ``clear`` of objects it cannot evict yet (InprocTier)."""
import pytest

from kmesh_lib.lmcache.connect import InprocTier, MPTier, TierError

IDLE = {"storage_manager": {
    "prefetch_controller": {"in_flight_request_count": 0, "pending_queue_size": 0, "submission_queue_size": 0},
    "store_controller": {"pending_keys_count": 0, "in_flight_task_count": 0}}}


class LockedUntil:
    """An L1 arena of one object whose read lock is released after ``num_locked_clears`` clears
    (a clear sent while the lock is held skips it, as LMCache's ``force=False`` does)."""

    def __init__(self, num_locked_clears: int) -> None:
        self.num_locked_clears, self.num_clears, self.used = num_locked_clears, 0, 4096

    def status(self) -> dict:
        return IDLE

    def clear_l1(self) -> None:
        self.num_clears += 1
        if self.num_clears > self.num_locked_clears:
            self.used = 0

    def l1_usage(self) -> tuple[int, int]:
        return self.used, 1 << 20


def tier_on(server) -> MPTier:
    tier = object.__new__(MPTier)
    tier.server = server
    return tier


@pytest.mark.cpu
def test_the_clear_is_sent_again_until_a_locked_object_is_gone():
    server = LockedUntil(num_locked_clears=3)
    tier_on(server).drop_memory_copy(timeout_s=5.0)
    assert server.used == 0 and server.num_clears == 4


@pytest.mark.cpu
def test_an_object_locked_for_good_is_a_named_timeout():
    with pytest.raises(TierError, match="L1 arena to empty"):
        tier_on(LockedUntil(num_locked_clears=10**9)).drop_memory_copy(timeout_s=0.3)


class PinnedEngine:
    """An in-process LMCache engine whose one memory object cannot be evicted for its first ``num_locked_clears``."""

    def __init__(self, num_locked_clears: int) -> None:
        self.arena = LockedUntil(num_locked_clears)

    def clear(self, locations: list[str]) -> None:
        assert locations == ["LocalCPUBackend"]
        self.arena.clear_l1()


@pytest.mark.cpu
def test_the_inproc_clear_is_sent_again_until_a_pinned_object_is_gone(monkeypatch):
    engine = PinnedEngine(num_locked_clears=2)
    tier = object.__new__(InprocTier)
    monkeypatch.setattr(tier, "engine", lambda: engine, raising=False)
    monkeypatch.setattr(tier, "memory_bytes", lambda: engine.arena.used, raising=False)
    tier.drop_memory_copy(timeout_s=5.0)
    assert engine.arena.used == 0 and engine.arena.num_clears == 3


class StoreInFlight:
    """LMCache 0.5.3's server right after a store returned to the engine (H100, 6 Dec 2026): the store's chunks sit in
    the L1 arena, their ``finish_write`` still queued on the dispatcher thread, so the status shows nothing in flight.
    It runs after ``num_polls`` more polls of the server (status or usage); the store controller then writes the
    chunks to the disk tier and deletes them from L1 (skip_l1). A clear is 0.5.3's, forced: every object goes, and a
    ``finish_write`` after it finds nothing to store."""

    def __init__(self, num_polls: int) -> None:
        from kmesh_lib.lmcache.server import ServerConfig

        self.cfg = ServerConfig()
        self.num_polls, self.polls, self.in_l1, self.written, self.pending = num_polls, 0, 0, 0, False

    def store(self, nbytes: int) -> None:
        self.in_l1, self.pending, self.polls = nbytes, True, 0

    def _poll(self) -> None:
        self.polls += 1
        if self.pending and self.polls >= self.num_polls:
            self.pending = False
            self.written, self.in_l1 = self.written + self.in_l1, 0

    def status(self) -> dict:
        self._poll()
        return IDLE

    def l1_usage(self) -> tuple[int, int]:
        self._poll()
        return self.in_l1, 1 << 30

    def clear_l1(self) -> None:
        self.in_l1 = 0

    def set_retention(self, retain: bool) -> None:
        pass


class ServerBytes:
    """The meter's view: bytes the server wrote to its disk tier and holds in L1 (no trace, no counters)."""

    def __init__(self, server: StoreInFlight) -> None:
        self.server = server

    def snapshot(self):
        from kmesh_lib.lmcache.disk_accounting import Snapshot

        return Snapshot(hook_write_bytes=self.server.written, memory_tier_bytes=self.server.in_l1)

    def trace_between(self, a, b) -> list:
        return []


class IdleEngine:
    def drain(self) -> None:
        pass

    def reset_prefix_cache(self) -> bool:
        return True


def test_a_store_is_dropped_from_memory_only_after_its_chunks_reached_the_disk_tier(monkeypatch):
    """``RestoreBench.store`` on the MP tier waits for the arena to empty by itself (skip_l1) before it drops the
    memory copy: a clear right after the engine's request, as before, freed the chunks before their L2 write and the
    store wrote 0 bytes, which is how whole contexts were lost on the H100 (6 Dec 2026, LMCache 0.5.3, 7B)."""
    from types import SimpleNamespace

    from kmesh_lib.sections.crossover import arms

    server = StoreInFlight(num_polls=3)
    tier = tier_on(server)
    tier.meter = ServerBytes(server)
    bench = object.__new__(arms.RestoreBench)
    bench.engine, bench.tier, bench.tier_name = IdleEngine(), tier, "lmcache_mp"
    bench.switch = SimpleNamespace(set=lambda on: None)
    bench.kv_digest, bench.stored_kv = SimpleNamespace(forget_held=lambda: None, take=lambda *a: None), {}  # no KV here
    context_bytes = 8 * 4096

    def run_group(engine, specs):
        server.store(context_bytes)  # the engine's store request returned: its chunks are in L1, not yet committed
        return [SimpleNamespace(num_cached_tokens=0)]

    monkeypatch.setattr(arms, "run_group", run_group)
    record = bench.store(arms.Context("c", [4] * 16))
    assert record["bytes_written"] == context_bytes and record["reached_disk"] is True
    assert record["l1_bytes_before"] == 0 and record["l1_bytes_after"] == 0 and record["num_cached_tokens"] == 0


class StoreTakenUpLate(StoreInFlight):
    """A store the server reserves in its arena only after ``num_idle_polls`` polls that find the arena empty (its
    request still in the server's socket when the engine went idle): the arena emptying by itself says nothing then."""

    def __init__(self, num_idle_polls: int, num_polls: int) -> None:
        super().__init__(num_polls)
        self.num_idle_polls, self.queued = num_idle_polls, 0

    def store(self, nbytes: int) -> None:
        self.queued, self.polls = nbytes, 0

    def _poll(self) -> None:
        self.polls += 1
        if self.queued and self.polls >= self.num_idle_polls:
            super().store(self.queued)  # reserved now; written and deleted from L1 ``num_polls`` polls later
            self.queued = 0
            return
        super()._poll()


class PollingBytes(ServerBytes):
    """The meter's view of a server that goes on by itself: each look at it is a poll."""

    def snapshot(self):
        self.server._poll()
        return super().snapshot()


@pytest.mark.cpu
def test_a_store_taken_up_after_the_engine_went_idle_is_waited_for_by_its_bytes(monkeypatch):
    """The arena is empty before the store's reservation as well as after its disk write: ``RestoreBench.store`` waits
    for the disk tier to hold the context's bytes before it judges the arena, so the clear never lands between the
    reservation and the write."""
    from types import SimpleNamespace

    from kmesh_lib.sections.crossover import arms

    server = StoreTakenUpLate(num_idle_polls=5, num_polls=3)
    tier = tier_on(server)
    tier.meter = PollingBytes(server)
    bench = object.__new__(arms.RestoreBench)
    bench.engine, bench.tier, bench.tier_name = IdleEngine(), tier, "lmcache_mp"
    bench.switch = SimpleNamespace(set=lambda on: None)
    bench.kv_digest, bench.stored_kv = SimpleNamespace(forget_held=lambda: None, take=lambda *a: None), {}  # no KV here
    context_bytes = 8 * 4096

    def run_group(engine, specs):
        server.store(context_bytes)
        return [SimpleNamespace(num_cached_tokens=0)]

    monkeypatch.setattr(arms, "run_group", run_group)
    record = bench.store(arms.Context("c", [4] * 16), expected_bytes=context_bytes)
    assert record["bytes_written"] == context_bytes and record["reached_disk"] is True
    # a store the server lost is recorded short after the bounded wait, never waited out
    lost = StoreTakenUpLate(num_idle_polls=10**9, num_polls=3)
    tier.server, tier.meter = lost, PollingBytes(lost)
    monkeypatch.setattr(arms, "STORE_BYTES_TIMEOUT_S", 0.2)
    record = bench.store(arms.Context("c", [4] * 16), expected_bytes=context_bytes)
    assert record["bytes_written"] == 0 and record["reached_disk"] is True  # the arena never held it
