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
