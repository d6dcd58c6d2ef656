"""MPTier.drop_memory_copy against a server whose unforced ``/cache/clear`` skips a locked object."""
import pytest

from kmesh_lib.lmcache.connect import MPTier, TierError

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
