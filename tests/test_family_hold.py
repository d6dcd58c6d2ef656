"""FamilyHoldController against vLLM's real BlockPool (and the replay engine's live manager).

Every scenario ends with the drain check: each non-null block has ref_cnt 0 and is back in the
free queue. Blocks are hashed as vLLM caches them, then freed tail first as vLLM frees a
finished request, after the controller has taken its family reference (the order of the hook).
"""
import pytest
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

from kmesh_lib.kv.capture import BlockPoolCapture, drain_check, net_references
from kmesh_lib.kv.family_hold import FamilyHoldController

B = 16


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_pool(num_gpu_blocks=11):
    return BlockPool(num_gpu_blocks=num_gpu_blocks, enable_caching=True, hash_block_size=B)


def cached_blocks(pool, tag, n):
    """n freshly allocated blocks with prefix-cache hashes, still referenced by their 'request'."""
    blocks = pool.get_new_blocks(n)
    for i, block in enumerate(blocks):
        pool._insert_block_hash(make_block_hash_with_group_id(BlockHash(f"{tag}/{i}".encode()), 0), block, B * (i + 1))
    return blocks


def finish(pool, blocks):
    pool.free_blocks(reversed(blocks))  # what vLLM does when the request finishes


def controller(pool, **kw):
    kw.setdefault("max_held_blocks", 8)
    kw.setdefault("max_families", 4)
    return FamilyHoldController(pool, **kw)


def ids(blocks):
    return [b.block_id for b in blocks]


def test_held_parent_blocks_survive_pressure_and_drain_after_release():
    pool = make_pool()  # blocks 1..10 usable
    ctl = controller(pool)
    parent = cached_blocks(pool, "p", 3)  # [1, 2, 3]
    gen = ctl.hold("fam", parent)
    finish(pool, parent)
    assert [b.ref_cnt for b in parent] == [1, 1, 1]  # the family reference alone
    # Pressure: every free block is taken; none of the held ones can be evicted.
    pressure = pool.get_new_blocks(pool.get_num_free_blocks())
    assert set(ids(pressure)).isdisjoint(ids(parent)) and len(pressure) == 7
    assert all(b.block_hash is not None for b in parent)
    assert ctl.check_invariants() == []
    finish(pool, pressure)
    assert ctl.release("fam", gen) == 3
    # Released blocks go to the free queue's tail, chain tail first (evicted before the prefix).
    assert ids(pool.free_block_queue.get_all_free_blocks())[-3:] == [3, 2, 1]
    assert drain_check(pool).ok


def test_overlapping_families_count_shared_blocks_once_and_release_correctly():
    pool = make_pool()
    ctl = controller(pool, max_held_blocks=4)
    a = cached_blocks(pool, "a", 3)  # [1, 2, 3]
    b_own = cached_blocks(pool, "b", 1)  # [4]
    gen_a = ctl.hold("A", a)
    gen_b = ctl.hold("B", a[:2] + b_own)  # shares blocks 1 and 2 with A
    assert gen_a != gen_b
    finish(pool, a)
    finish(pool, b_own)
    # 4 unique blocks against a cap of 4, one pool reference each however many families hold it.
    assert ctl.num_held_blocks == 4 and ctl.num_refused_blocks_cap == 0
    assert [blk.ref_cnt for blk in a + b_own] == [1, 1, 1, 1]
    assert ctl.release("A", gen_a) == 1  # only block 3 was A's alone
    assert [blk.ref_cnt for blk in a + b_own] == [1, 1, 0, 1]
    assert ctl.check_invariants() == []
    assert ctl.release("B", gen_b) == 3
    assert ctl.num_held_blocks == 0 and drain_check(pool).ok


def test_caps_refuse_admission_count_it_and_change_nothing():
    pool = make_pool()
    ctl = controller(pool, max_held_blocks=3, max_families=2)
    a, b, c = cached_blocks(pool, "a", 3), cached_blocks(pool, "b", 2), cached_blocks(pool, "c", 1)
    assert ctl.hold("A", a) is not None
    refs_before = [blk.ref_cnt for blk in pool.blocks[1:]]
    assert ctl.hold("B", b) is None  # 3 + 2 unique blocks > 3
    assert (ctl.num_refused_blocks_cap, ctl.num_refused_blocks) == (1, 2)
    assert ctl.hold("B", a[:1]) is not None  # shares A's block: still 3 unique, admitted
    assert ctl.hold("C", a[:1]) is None  # a third family > 2
    assert ctl.expect_child("c-parent", "C") is None
    assert ctl.num_refused_families_cap == 2
    assert [blk.ref_cnt for blk in pool.blocks[1:]] == refs_before
    assert ctl.check_invariants() == []
    ctl.close()
    for blocks in (a, b, c):
        finish(pool, blocks)
    assert drain_check(pool).ok


def test_stale_release_from_an_earlier_generation_never_drops_a_newer_hold():
    pool = make_pool()
    ctl = controller(pool)
    turn1 = cached_blocks(pool, "t", 2)
    gen1 = ctl.hold("fam", turn1)
    turn2 = turn1 + cached_blocks(pool, "t2", 2)  # the next turn extends the first
    gen2 = ctl.expect_child("turn2-parent", "fam")
    assert ctl.hold("fam", turn2) == gen2 > gen1  # the expected hold keeps its generation
    finish(pool, turn2)
    assert ctl.release("fam", gen1) == 0 and ctl.num_stale_releases == 1
    assert ctl.num_held_blocks == 4 and all(b.ref_cnt == 1 for b in turn2)
    assert ctl.release("fam", gen2) == 4
    assert ctl.release("fam", gen2) == 0 and ctl.num_stale_releases == 2  # already ended
    assert drain_check(pool).ok


def test_expiry_is_checked_at_invocation_boundaries():
    pool = make_pool()
    clock = FakeClock()
    ctl = controller(pool, expiry_s=60.0, clock=clock)
    parent = cached_blocks(pool, "p", 2)
    ctl.hold("old", parent)
    finish(pool, parent)
    clock.now = 59.9
    assert ctl.expire() == 0 and ctl.num_held_blocks == 2
    clock.now = 60.0
    other = cached_blocks(pool, "o", 1)
    ctl.hold("new", other)  # an invocation boundary: the old family expires first
    assert ctl.num_expired == 1 and "old" not in ctl.families
    assert [b.ref_cnt for b in parent] == [0, 0]
    finish(pool, other)
    assert ctl.expire(now=1e9) == 1 and ctl.num_expired == 2
    assert drain_check(pool).ok


def test_cancel_ends_a_family_whatever_its_generation():
    pool = make_pool()
    ctl = controller(pool)
    parent = cached_blocks(pool, "p", 2)
    ctl.hold("fam", parent)
    finish(pool, parent)
    assert ctl.cancel("fam") == 2 and ctl.num_cancelled == 1
    assert ctl.cancel("fam") == 0 and ctl.num_cancelled == 1
    assert drain_check(pool).ok


def test_close_drains_everything_and_refuses_later_holds():
    pool = make_pool()
    ctl = controller(pool)
    a, b = cached_blocks(pool, "a", 2), cached_blocks(pool, "b", 3)
    ctl.hold("A", a)
    ctl.hold("B", b[:2] + a[:1])
    ctl.expect_child("pending-parent", "C")
    finish(pool, a)
    finish(pool, b)
    ctl.close()
    assert ctl.num_closed == 3 and not ctl.families and ctl.num_held_blocks == 0
    assert drain_check(pool).ok
    with pytest.raises(RuntimeError, match="closed"):
        ctl.hold("D", [])


@pytest.mark.parametrize("kw", [dict(max_held_blocks=0), dict(max_families=0), dict(expiry_s=0)])
def test_zero_caps_and_expiry_are_rejected(kw):
    with pytest.raises(ValueError, match="must be > 0"):
        controller(make_pool(), **kw)


def test_capture_sees_each_family_reference_once_as_hold_and_release():
    pool = make_pool()
    capture = BlockPoolCapture(pool)
    ctl = controller(pool, capture=capture)
    parent = cached_blocks(pool, "p", 3)
    gen = ctl.hold("fam", parent)
    finish(pool, parent)
    ctl.release("fam", gen)
    capture.close()
    assert capture.counts() == {"alloc": 3, "touch": 0, "free": 3, "evict": 0, "hold": 3, "release": 3}
    assert [e.ref_cnts for e in capture.events if e.op == "hold"] == [(2, 2, 2)]
    assert not any(net_references(capture.to_records()).values())
    assert drain_check(pool).ok


# -- the hooks, on the replay engine's live KVCacheManager (vLLM's scheduler, no forward pass) --
@pytest.fixture(scope="module")
def replay_engine():
    from kmesh_lib.engine.config import EngineParams
    from kmesh_lib.engine.vllm_engine import make_engine

    engine = make_engine(EngineParams(ENGINE="replay", MODEL="tiny", BLOCK_SIZE=B, NUM_GPU_BLOCKS=17, MAX_MODEL_LEN=256))
    yield engine
    engine.close()


def family_under_pressure(engine, ctl, tag):
    """Parent (64 + 4 tokens), three 100-token requests (7 blocks each), then the child."""
    from kmesh_lib.engine.requests import RequestSpec, run_group

    if ctl is not None:
        ctl.expect_child(f"{tag}-p", "fam", f"{tag}-c")
    parent = run_group(engine, [RequestSpec(f"{tag}-p", list(range(100, 164)), max_tokens=4)])[0]
    held = ctl.num_held_blocks if ctl is not None else 0
    for i in range(3):
        run_group(engine, [RequestSpec(f"{tag}-n{i}", [200 + i] * 100, max_tokens=4)])
    prompt = parent.prompt_token_ids + parent.output_token_ids + [7] * 8
    child = run_group(engine, [RequestSpec(f"{tag}-c", prompt, max_tokens=4)])[0]
    if ctl is not None:
        ctl.close()
    assert drain_check(engine.block_pool).ok and engine.reset_prefix_cache()
    return held, child.num_cached_tokens


def test_hooks_hold_a_finished_parent_until_its_child_is_scheduled(replay_engine):
    assert family_under_pressure(replay_engine, None, "stock")[1] < 64  # the pressure evicts the parent
    ctl = FamilyHoldController(replay_engine, max_held_blocks=8, max_families=2)
    held, child_cached = family_under_pressure(replay_engine, ctl, "held")
    assert held == 4  # floor((64 + 4 - 1) / 16) hashed blocks
    assert child_cached == 64
    assert len(ctl.edges) == 1 and ctl.edges[0].aliased and ctl.num_released == 1
    kvm = vars(replay_engine.kv_cache_manager)
    assert "free" not in kvm and "allocate_slots" not in kvm  # close removed the hooks


def test_an_aborted_parent_is_not_held(replay_engine):
    from vllm.v1.request import RequestStatus

    from kmesh_lib.engine.requests import RequestSpec

    engine = replay_engine
    ctl = FamilyHoldController(engine, max_held_blocks=8, max_families=2)
    ctl.expect_child("q", "fam", "q-child")
    engine.submit(RequestSpec("q", list(range(10, 74)), max_tokens=4))
    engine.step()  # the prefill: 4 blocks cached
    engine.scheduler.finish_requests("q", RequestStatus.FINISHED_ABORTED)
    assert ctl.num_parents_aborted == 1 and not ctl.families and ctl.num_held_blocks == 0
    ctl.close()
    assert drain_check(engine.block_pool).ok and engine.reset_prefix_cache()


def test_a_record_prints_in_words_not_as_a_dict():
    from kmesh_lib.sections.family_hold.report import in_words

    settings = {"dtype": "bfloat16", "BATCH_INVARIANT": True, "attention_backends": ["TRITON_ATTN", "FLEX"]}
    assert in_words(settings) == "dtype bfloat16; BATCH_INVARIANT True; attention_backends TRITON_ATTN, FLEX"
