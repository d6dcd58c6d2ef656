"""The bytes an in-process LMCache restore copies into vLLM's blocks: the component probe's hook on the LMCache engine's
GPU connector (``lmcache.probes.ComponentProbe``) and section 21's check of them (``copied_context_check``).

bbf8 (H100, 6 Dec 2026) timed 28 of 64 in-process DRAM restores of a 7B 16,384-token context at ~14 ms by CUDA
events around ``start_load_kv``, against a 17.1 ms copy of the context's 939,524,096 bytes: more than PCIe carries.
Either the span misses part of the copy or fewer bytes moved; the rows could not tell which. Here too: where the copy's
objects lived (``placed``), and the KV digest (``lmcache.probes.KvDigest``) with section 21's check that every restore
wrote the context's KV into vLLM's blocks as it was computed (``kv_digest_check``)."""
from __future__ import annotations

import types
from unittest import mock

import pytest
from crossover_records import as_children, as_grid_rows, as_pair_rows

from kmesh_lib.lmcache import probes
from kmesh_lib.sections.crossover.checks import (
    COPIES_SINCE,
    DIGESTS_SINCE,
    KV_DIGEST_CHECK,
    KV_DIGEST_CHECK_INPROC,
    copied_context_check,
    kv_digest_check,
)

KVT, CHUNK = 1024, 256  # KV bytes per token, LMCache's chunk in tokens


class Chunk:
    """An LMCache memory object: ``get_size()`` its bytes, as 0.5.3's and 0.5.6's ``TensorMemoryObj``."""

    def __init__(self, num_tokens: int) -> None:
        self.num_bytes = num_tokens * KVT

    def get_size(self) -> int:
        return self.num_bytes


class BatchedConnector:
    """The CUDA connectors' shape (``VLLMPagedMemGPUConnectorV2``): ``batched_to_gpu`` loops ``to_gpu`` over its
    objects."""

    def __init__(self) -> None:
        self.copied = []

    def to_gpu(self, memory_obj, start, end, **kwargs):
        self.copied.append((start, end))

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)


class SingleConnector:
    """A connector without a batched copy: the engine calls ``to_gpu`` per chunk."""

    def to_gpu(self, memory_obj, start, end, **kwargs):
        pass


def chunks_of(num_tokens: int) -> tuple[list[Chunk], list[int], list[int]]:
    starts = list(range(0, num_tokens, CHUNK))
    ends = [min(s + CHUNK, num_tokens) for s in starts]
    return [Chunk(e - s) for s, e in zip(starts, ends, strict=True)], starts, ends


class Adapter:
    """LMCache's ``LMCacheConnectorV1Impl``: ``lmcache_engine`` (a property in 0.5.6) holds the engine."""

    def __init__(self, engine) -> None:
        self._engine = engine

    @property
    def lmcache_engine(self):
        return self._engine


class Worker:
    """vLLM's ``LMCacheConnectorV1`` on the worker side: ``start_load_kv`` is the retrieve, which copies ``num_tokens``
    (``retrieve`` says how) unless ``retrieve`` is None."""

    def __init__(self, engine, retrieve=None) -> None:
        self._lmcache_engine = Adapter(engine)
        self.retrieve = retrieve
        self.num_tokens = 0

    def start_load_kv(self, forward_context):
        if self.retrieve is not None and self.num_tokens:
            self.retrieve(self._lmcache_engine.lmcache_engine.gpu_connector, self.num_tokens)

    def wait_for_save(self):
        pass


def batched(gpu, num_tokens: int) -> None:
    gpu.batched_to_gpu(*chunks_of(num_tokens), kvcaches=None)


def one_by_one(gpu, num_tokens: int) -> None:
    for obj, start, end in zip(*chunks_of(num_tokens), strict=True):
        gpu.to_gpu(obj, start, end)


def probe_on(worker):
    """A ComponentProbe over a fake engine whose worker-side connector is ``worker``."""
    executor = types.SimpleNamespace(execute_model=lambda *a: None)
    engine = types.SimpleNamespace(_engine=types.SimpleNamespace(engine_core=types.SimpleNamespace(
        engine_core=types.SimpleNamespace(model_executor=executor))), params=types.SimpleNamespace(DEVICE="cpu"))
    with mock.patch("vllm.distributed.kv_transfer.has_kv_transfer_group", return_value=True), \
            mock.patch("vllm.distributed.kv_transfer.get_kv_transfer_group", return_value=worker):
        return probes.ComponentProbe(engine)


def follow_up(probe, worker, num_tokens: int) -> dict:
    worker.num_tokens = num_tokens
    probe.start()
    worker.start_load_kv(None)
    return probe.stop(0.0)


def test_the_probe_counts_the_bytes_chunks_and_tokens_the_engine_hands_its_batched_copy_once():
    """``batched_to_gpu`` is wrapped, not the ``to_gpu`` it loops over: a context of 1,000 tokens (3 whole chunks and a
    tail of 232) is 1,024,000 bytes in 4 chunks, counted once; the copy ran inside ``start_load_kv``."""
    gpu = BatchedConnector()
    worker = Worker(types.SimpleNamespace(gpu_connector=gpu), batched)
    probe = probe_on(worker)
    assert probe.copy_hook == "BatchedConnector.batched_to_gpu"
    parts = follow_up(probe, worker, 1000)
    assert (parts["load_bytes"], parts["load_chunks"], parts["load_tokens"], parts["load_skipped_tokens"]) == (
        1000 * KVT, 4, 1000, 0), parts
    assert parts["to_gpu_in_load"] is True and parts["to_gpu_s"] >= 0
    assert gpu.copied == [(0, 256), (256, 512), (512, 768), (768, 1000)]  # the original still ran, whole
    # the next follow-up counts its own copy only; one that copies nothing records 0, not None
    assert follow_up(probe, worker, 512)["load_bytes"] == 512 * KVT
    none = follow_up(probe, worker, 0)
    assert (none["load_bytes"], none["load_chunks"], none["to_gpu_s"], none["to_gpu_in_load"]) == (0, 0, 0.0, None)


def test_the_probe_counts_a_connector_without_a_batched_copy_by_its_to_gpu_calls():
    worker = Worker(types.SimpleNamespace(gpu_connector=SingleConnector()), one_by_one)
    probe = probe_on(worker)
    assert probe.copy_hook == "SingleConnector.to_gpu"
    parts = follow_up(probe, worker, 768)
    assert (parts["load_bytes"], parts["load_chunks"], parts["load_tokens"]) == (768 * KVT, 3, 768), parts


def test_a_copy_outside_start_load_kv_is_said_to_be_outside():
    gpu = BatchedConnector()
    worker = Worker(types.SimpleNamespace(gpu_connector=gpu))  # start_load_kv copies nothing itself
    probe = probe_on(worker)
    probe.start()
    worker.start_load_kv(None)
    batched(gpu, 256)  # as a copy LMCache ran after the load returned would be
    parts = probe.stop(0.0)
    assert parts["load_bytes"] == 256 * KVT and parts["to_gpu_in_load"] is False


def test_the_probe_counts_nothing_and_says_why_where_no_in_process_engine_copies():
    """The MP path (no LMCache engine behind vLLM's connector), an engine without a GPU connector, a layerwise
    retrieve and a connector whose lookup raises: every count None, the reason recorded, the run never stopped."""
    mp = types.SimpleNamespace(start_load_kv=lambda fc: None, wait_for_save=lambda: None)
    no_gpu = Worker(types.SimpleNamespace(gpu_connector=None))
    layerwise = Worker(types.SimpleNamespace(gpu_connector=BatchedConnector()))
    layerwise._lmcache_engine.use_layerwise = True

    class Broken:
        @property
        def gpu_connector(self):
            raise RuntimeError("connector torn down")

    for worker, why in [(mp, "no in-process LMCache engine"), (no_gpu, "has none of batched_to_gpu, to_gpu"),
                        (layerwise, "layerwise"), (Worker(Broken()), "RuntimeError: connector torn down")]:
        probe = probe_on(worker)
        assert why in probe.copy_hook and not probe.has_copies, probe.copy_hook
        parts = follow_up(probe, worker, 256) if isinstance(worker, Worker) else probe.stop(0.0)
        assert all(parts[k] is None for k in ("load_bytes", "load_chunks", "load_tokens", "load_skipped_tokens",
                                              "load_device", "load_pinned", "to_gpu_s", "to_gpu_in_load")), parts


def test_an_engine_built_after_the_probe_is_hooked_at_the_next_follow_up():
    worker = Worker(None, batched)
    probe = probe_on(worker)
    assert probe.copy_hook == "the in-process LMCache engine is not built yet"
    worker._lmcache_engine._engine = types.SimpleNamespace(gpu_connector=BatchedConnector())
    assert follow_up(probe, worker, 256)["load_bytes"] == 256 * KVT
    assert probe.copy_hook == "BatchedConnector.batched_to_gpu"


def test_a_call_without_memory_objects_leaves_the_follow_ups_bytes_unknown():
    """A layerwise connector's ``batched_to_gpu(starts, ends)`` hands no objects: its bytes are not 0 but unknown."""
    assert probes.copied("batched_to_gpu", ([0], [256]), {}) is None
    assert probes.copied("batched_to_gpu", ([Chunk(256)], [0], [256]), {}) == (256 * KVT, 1, 256, 0)
    assert probes.copied("to_gpu", (Chunk(100),), {"start": 256, "end": 356}) == (100 * KVT, 1, 100, 0)
    # the tokens vLLM holds are skipped chunk by chunk, as VLLMPagedMemGPUConnectorV2.to_gpu skips them
    assert probes.copied("batched_to_gpu", chunks_of(768), {"vllm_cached_tokens": 300}) == (768 * KVT, 3, 768, 300)


class FreedChunk(Chunk):
    """An object whose size cannot be read after the copy (a version that frees it, or shapes it otherwise)."""

    def get_size(self) -> int:
        raise RuntimeError("memory object already freed")


def test_a_count_that_raises_leaves_the_bytes_unknown_and_the_copy_whole():
    """The count runs in the wrapped copy's ``finally``: whatever it raises, the copy returns and the bytes are None."""
    assert probes.copied("batched_to_gpu", ([FreedChunk(256)], [0], [256]), {}) is None
    gpu = BatchedConnector()
    probe = types.SimpleNamespace(active=True, added=[])
    probe._add = lambda kind, t0, t1, counts=None: probe.added.append((kind, counts))
    probes.ComponentProbe._wrap_copy(probe, gpu, "batched_to_gpu")
    gpu.batched_to_gpu([FreedChunk(256), FreedChunk(256)], [0, 256], [256, 512])
    assert gpu.copied == [(0, 256), (256, 512)] and probe.added == [("copy", (None, None))]  # one record: count, place


class Tensor:
    """What ``placed`` reads of a memory object's tensor: its device and ``is_pinned()`` (``pinned`` an exception: it
    raises it)."""

    def __init__(self, device: str, pinned=False) -> None:
        self.device, self.pinned = types.SimpleNamespace(type=device), pinned

    def is_pinned(self) -> bool:
        if isinstance(self.pinned, Exception):
            raise self.pinned
        return self.pinned


class PlacedChunk(Chunk):
    def __init__(self, num_tokens: int, tensor: Tensor) -> None:
        super().__init__(num_tokens)
        self.tensor = tensor


def test_placed_reads_the_first_objects_device_and_pinning_and_never_raises():
    pinned, pageable, device = Tensor("cpu", True), Tensor("cpu", False), Tensor("cuda")
    assert probes.placed("batched_to_gpu", ([PlacedChunk(256, pinned), PlacedChunk(256, device)], [0], [256]), {}) == \
        ("cpu", True)  # the first object's alone
    assert probes.placed("batched_to_gpu", (), {"memory_objs": [PlacedChunk(256, pageable)]}) == ("cpu", False)
    assert probes.placed("to_gpu", (PlacedChunk(256, device), 0, 256), {}) == ("cuda", None)  # pinning is the host's
    assert probes.placed("to_gpu", (PlacedChunk(256, Tensor("cpu", RuntimeError("no accelerator"))),), {}) == ("cpu", None)
    assert probes.placed("batched_to_gpu", ([Chunk(256)], [0], [256]), {}) is None  # no tensor to read
    assert probes.placed("batched_to_gpu", ([], [], []), {}) is None
    assert probes.placed("batched_to_gpu", ([0], [256]), {}) is None  # a layerwise call: no objects


def test_the_probe_records_where_the_copys_objects_lived():
    """One follow-up's calls: every first object in pinned host memory -> cpu, pinned; one call's in pageable memory ->
    not pinned; calls on two devices -> mixed; one that cannot be read -> None (never a guess)."""
    def follow(tensors) -> dict:
        gpu = BatchedConnector()
        worker = Worker(types.SimpleNamespace(gpu_connector=gpu))
        probe = probe_on(worker)
        probe.start()
        for t in tensors:
            gpu.batched_to_gpu([PlacedChunk(256, t) if t is not None else Chunk(256)], [0], [256])
        parts = probe.stop(0.0)
        return parts["load_device"], parts["load_pinned"]

    pinned, pageable, device = Tensor("cpu", True), Tensor("cpu", False), Tensor("cuda")
    assert follow([pinned, pinned]) == ("cpu", True)
    assert follow([pinned, pageable]) == ("cpu", False)
    assert follow([device]) == ("cuda", None)
    assert follow([pinned, device]) == ("mixed", None)
    assert follow([pinned, None]) == (None, None)
    assert follow([]) == (None, None)


# -- the KV digest --

NUM_BLOCKS, BLOCK = 12, 4  # the fake engine's KV pool and its block size in tokens


class Scheduler:
    """vLLM's scheduler as ``KvDigest`` reads it: its KV cache config and its connector, which the scheduler calls
    with a finishing request's block ids."""

    def __init__(self) -> None:
        spec = types.SimpleNamespace(block_size=BLOCK)
        self.kv_cache_config = types.SimpleNamespace(num_blocks=NUM_BLOCKS,
                                                     kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec)])
        self.connector = types.SimpleNamespace(request_finished=lambda request, block_ids: (False, None))

    def finish(self, request_id: str, block_ids: list[int]) -> None:
        self.connector.request_finished(types.SimpleNamespace(request_id=request_id), block_ids)


def digest_engine(torch, layout: str = "flash"):
    """A fake engine with two layers of bf16 KV in a backend's layout (block dim 1, or 0 as FlashInfer's), random
    contents; returns (engine, scheduler, kv_caches, block_dim)."""
    gen = torch.Generator().manual_seed(0)
    shape, dim = ((2, NUM_BLOCKS, BLOCK, 2, 8), 1) if layout == "flash" else ((NUM_BLOCKS, 2, BLOCK, 2, 8), 0)
    caches = [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2)]
    scheduler = Scheduler()
    runner = types.SimpleNamespace(kv_caches=caches)
    core = types.SimpleNamespace(scheduler=scheduler, model_executor=types.SimpleNamespace(
        driver_worker=types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=runner))))
    engine = types.SimpleNamespace(_engine=types.SimpleNamespace(engine_core=types.SimpleNamespace(engine_core=core)))
    return engine, scheduler, caches, dim


def write_blocks(caches, dim: int, src: list[int], dst: list[int]) -> None:
    """A restore: block ``src[i]``'s KV copied into ``dst[i]`` in every layer."""
    for t in caches:
        t.index_copy_(dim, _ids(dst), t.index_select(dim, _ids(src)))


def _ids(ids):
    import torch

    return torch.tensor(ids, dtype=torch.long)


@pytest.mark.parametrize("layout", ["flash", "flashinfer"])
def test_the_kv_digest_is_equal_exactly_where_the_restore_wrote_the_stored_blocks(layout):
    """A context of 3 blocks stored in blocks 0-2 (its store request held a 4th, its own token's): a restore that
    copies them into 5-7 digests equal over 12 tokens, on blocks no earlier request held, and so does one into 8, 10, 9;
    blocks read as if two held each other's KV, a value changed in one block and blocks that were never written differ
    by exactly those blocks' tokens."""
    torch = pytest.importorskip("torch")
    engine, scheduler, caches, dim = digest_engine(torch, layout)
    digest = probes.KvDigest(engine)
    assert digest.kv_caches is not None and f"on dim {dim}" in digest.how, digest.how
    context_tokens = 3 * BLOCK
    scheduler.finish("store-m-12-abc", [0, 1, 2, 3])  # vLLM may add a suffix to the request's id
    digest.forget_held()
    stored = digest.take("store-m-12", context_tokens)
    assert stored is not None and tuple(stored.digests.shape) == (2, 3, 2) and not any(stored.reused)

    def restore(dst, request, src=(0, 1, 2)) -> dict:
        write_blocks(caches, dim, list(src), list(dst))
        scheduler.finish(request, list(dst) + [11])  # the follow-up's own tokens in a block of their own
        return probes.compare_kv(digest.take(request, context_tokens), stored)

    def compared(equal, differing, reused, by_layer=None, spans=None, zero=0, misplaced=0) -> dict:
        return {"kv_digest_equal": equal, "kv_digest_tokens": context_tokens,
                "kv_digest_differing_tokens": differing * BLOCK, "kv_digest_reused_tokens": reused * BLOCK,
                "kv_digest_differing_by_layer": by_layer or [differing, differing], "kv_digest_differing_spans": spans or [],
                "kv_digest_zero_blocks": zero, "kv_digest_misplaced_blocks": misplaced}

    assert restore([5, 6, 7], "f0") == compared(True, 0, 0)
    assert restore([8, 10, 9], "f1") == compared(True, 0, 0)  # blocks in any order: the ids say which holds which
    assert digest.take("f1", context_tokens) is None  # a request is forgotten once taken
    scheduler.finish("f1-swapped", [8, 9, 10])  # the same blocks read as if 9 and 10 held each other's KV
    # 8 held 0's; 9 and 10 each hold the KV of the other's place
    swapped = probes.compare_kv(digest.take("f1-swapped", context_tokens), stored)
    assert swapped == compared(False, 2, 1, spans=[[1, 2]], misplaced=2)
    caches[1].select(dim, 6)[0, 0, 0, 3] += 1  # one value of one row of one layer
    scheduler.finish("f2", [5, 6, 7])  # ... in blocks f0 held: reused, their equal digests no evidence
    assert probes.compare_kv(digest.take("f2", context_tokens), stored) == compared(False, 1, 3, by_layer=[0, 1], spans=[[1, 1]])
    scheduler.finish("f3", [4, 11, 3])  # a restore that wrote nothing, into blocks that never held those places
    assert probes.compare_kv(digest.take("f3", context_tokens), stored) == compared(False, 3, 0, spans=[[0, 2]])
    for t in caches:  # a copy from memory never written: block 4 all zero in every layer
        t.select(dim, 4).zero_()
    scheduler.finish("f4", [4, 1, 2])  # 1 and 2 are the store's own blocks, 4 held f3's first place
    assert probes.compare_kv(digest.take("f4", context_tokens), stored) == compared(
        False, 1, 3, by_layer=[1, 1], spans=[[0, 0]], zero=1)
    assert probes.compare_kv(None, stored) == dict.fromkeys(probes.KV_FIELDS)


def test_a_scrub_zeroes_the_kv_so_a_restore_that_wrote_nothing_differs_where_its_blocks_held_the_context_before():
    """Without the scrub a follow-up landing in the blocks an earlier request of the context held matches whether or
    not it wrote (reused: no evidence); after it those blocks hold zeros, so a restore that writes them matches as
    evidence (reused 0) and one that writes nothing differs in every block, all zero."""
    torch = pytest.importorskip("torch")
    engine, scheduler, caches, dim = digest_engine(torch)
    digest = probes.KvDigest(engine)
    context_tokens = 3 * BLOCK
    scheduler.finish("store-m", [0, 1, 2, 3])
    digest.forget_held()
    stored = digest.take("store-m", context_tokens)
    scheduler.finish("unscrubbed", [0, 1, 2, 11])  # wrote nothing, into the store's own blocks
    assert probes.compare_kv(digest.take("unscrubbed", context_tokens), stored)["kv_digest_reused_tokens"] == 3 * BLOCK
    scheduler.finish("untaken", [5, 6])  # finished before the scrub: forgotten with it
    assert digest.scrub() is True and all(not t.any() for t in caches) and not digest.held and not digest.finished
    scheduler.finish("nothing-written", [0, 1, 2, 11])
    nothing = probes.compare_kv(digest.take("nothing-written", context_tokens), stored)
    assert (nothing["kv_digest_equal"], nothing["kv_digest_differing_tokens"], nothing["kv_digest_zero_blocks"]) == \
        (False, 3 * BLOCK, 3)
    assert digest.scrub()
    _, _, computed, _ = digest_engine(torch)  # the KV as the store computed it (the same seed)
    for t, c in zip(caches, computed, strict=True):  # a restore that writes it back into the same blocks
        t.index_copy_(dim, _ids([0, 1, 2]), c.index_select(dim, _ids([0, 1, 2])))
    scheduler.finish("written", [0, 1, 2, 11])
    written = probes.compare_kv(digest.take("written", context_tokens), stored)
    assert (written["kv_digest_equal"], written["kv_digest_reused_tokens"]) == (True, 0)
    assert probes.KvDigest(types.SimpleNamespace()).scrub() is False  # no KV reached: nothing done, no raise
    from kmesh_lib.sections.crossover import summary

    sentence = summary.kv_digest_sentence({"native_offload": {
        "num_compared": 4, "num_differing": 0, "num_all_differing": 0, "num_fresh_equal": 4, "num_scrubbed": 4,
        "num_zero_blocks": None, "num_misplaced_blocks": None}})
    assert "vLLM CPU-tier: all 4 equal, each into KV caches zeroed before it (so each shows a write)." in sentence


def test_the_kv_digest_says_why_it_cannot_be_taken_and_never_raises():
    torch = pytest.importorskip("torch")
    engine, scheduler, caches, _ = digest_engine(torch)
    digest = probes.KvDigest(engine)
    assert digest.take("never-finished", 3 * BLOCK) is None
    scheduler.finish("short", [0])
    assert digest.take("short", 3 * BLOCK) is None  # fewer blocks than the context's
    ambiguous, _, _, _ = digest_engine(torch)
    ambiguous._engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.kv_caches = [
        torch.zeros((NUM_BLOCKS, NUM_BLOCKS, BLOCK))]
    assert "no single dimension of 12 blocks" in probes.KvDigest(ambiguous).how
    broken = types.SimpleNamespace(_engine=None)
    d = probes.KvDigest(broken)
    assert d.how.startswith("not taken: AttributeError") and d.take("x", 4) is None


# -- the check --

def restore(tag: str, load_bytes, *, arm: str = "dram", num_tokens: int = 512, path: str = "inproc",
            **extra) -> dict:
    parts = {} if load_bytes == "absent" else {
        "load_bytes": load_bytes, "load_tokens": None if load_bytes is None else load_bytes // KVT,
        "load_chunks": None if load_bytes is None else -(-load_bytes // (CHUNK * KVT)),
        "load_skipped_tokens": None if load_bytes is None else 0}
    return {"arm": arm, "tag": tag, "tier": "lmcache", "path": path, "context_tokens": num_tokens,
            "context_bytes": num_tokens * KVT, "components": parts, **extra}


def test_the_copied_context_check_holds_every_counted_in_process_restore_to_its_context():
    grid = as_grid_rows([restore("g-dram", 512 * KVT), restore("g-disk", 512 * KVT, arm="disk"),
                         restore("g-recompute", 0, arm="recompute"),  # not a restore: no copy to hold
                         restore("g-mp", None, path="mp")])
    pairs = as_pair_rows([restore("p-dram", 512 * KVT), restore("p-resident", 0, arm="resident", role="resident")])
    ok = copied_context_check(grid + pairs, [])
    assert ok.status == "ok" and ok.detail == "3 of 3", ok
    short = as_pair_rows([restore("p-short", 384 * KVT)])  # a chunk fewer: fewer bytes moved than the context holds
    failed = copied_context_check(grid + short, [])
    assert failed.status == "failed" and "p-short: copied 393216 of 524288 bytes" in failed.detail, failed
    nothing = copied_context_check(as_grid_rows([restore("g-none", 0)]), [])  # a retrieve that copied nothing
    assert nothing.status == "failed", nothing
    # every token handed over, in objects of half the context's bytes (another format or dtype than the rows assume)
    half = as_grid_rows([{**restore("g-half", 256 * KVT), "components": {"load_bytes": 256 * KVT, "load_tokens": 512,
                                                                         "load_chunks": 2, "load_skipped_tokens": 0}}])
    assert copied_context_check(half, []).status == "failed"
    # the context handed over whole, a chunk of it vLLM's own, which the copy does not write
    held = as_grid_rows([{**restore("g-held", 512 * KVT), "components": {"load_bytes": 512 * KVT, "load_tokens": 512,
                                                                         "load_chunks": 2, "load_skipped_tokens": 256}}])
    assert copied_context_check(held, []).status == "failed"


def test_the_copied_context_check_is_left_out_of_runs_that_predate_it_and_skipped_where_nothing_was_counted():
    old = copied_context_check(as_grid_rows([restore("g-dram", "absent")]), [])
    assert old.status == "skipped" and old.predates == COPIES_SINCE
    mp = copied_context_check(as_grid_rows([restore("g-mp", None, path="mp")]), [])
    assert mp.status == "skipped" and not mp.predates and "in-process" in mp.detail
    unhooked = copied_context_check(as_grid_rows([restore("g-dram", None)]),
                                           as_children([{"path": "inproc", "copy_hook": "not hooked: why"}]))
    assert unhooked.status == "skipped" and not unhooked.predates and "not hooked: why" in unhooked.detail


def test_the_probe_counts_what_a_real_lmcache_engines_retrieve_hands_its_gpu_connector():
    """The installed LMCache's own ``LMCacheEngine`` (CPU memory tier, kmesh's in-process settings: save_unfull_chunk
    off) with its ``MockGPUConnector`` (LMCache has no CPU connector that copies: on this build kmesh's in-process path
    does not run, so no smoke run reaches this hook): its retrieve calls ``batched_to_gpu`` once, with memory objects of
    the stored tokens x the KV bytes per token. A context of whole chunks is copied whole; one with a partial tail
    chunk copies its whole chunks alone (the tail was never stored), so the rows' context bytes are the figure only
    because CONTEXT_TOKENS_GRID is a multiple of CHUNK_SIZE."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lmcache.v1.cache_engine")
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector
    from lmcache.v1.metadata import LMCacheMetadata

    num_layers, num_heads, head_size = 2, 2, 8
    kv_shape = (num_layers, 2, CHUNK, num_heads, head_size)
    kvt = 2 * num_layers * num_heads * head_size * 2  # K and V of every layer, bf16
    config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05,
                                               save_unfull_chunk=False, enable_async_loading=False)
    metadata = LMCacheMetadata(model_name="kmesh-test", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=kv_shape)
    name = "kmesh-test-copies"
    engine = LMCacheEngineBuilder.get_or_create(name, config, metadata, MockGPUConnector(kv_shape=kv_shape),
                                                lambda t, r: None, lambda o, r: o)
    try:
        engine.post_init()
        tokens = {}

        class RetrievingWorker(Worker):
            def start_load_kv(self, forward_context):
                # vLLM's adapter passes the tokens vLLM holds with every retrieve, which hands them to the copy
                self._lmcache_engine.lmcache_engine.retrieve(tokens[self.num_tokens], vllm_cached_tokens=self.held)

        worker = RetrievingWorker(engine)
        probe = probe_on(worker)
        assert probe.copy_hook == "MockGPUConnector.batched_to_gpu"
        for num_tokens, num_stored, held in [(512, 512, 0), (1000, 768, 0), (768, 768, 100)]:
            tokens[num_tokens] = torch.randint(4, 1000, (num_tokens,), generator=torch.Generator().manual_seed(num_tokens))
            engine.store(tokens[num_tokens])
            worker.held = held
            parts = follow_up(probe, worker, num_tokens)
            assert (parts["load_bytes"], parts["load_chunks"], parts["load_tokens"], parts["load_skipped_tokens"],
                    parts["to_gpu_in_load"]) == (num_stored * kvt, num_stored // CHUNK, num_stored, held, True), (
                num_tokens, parts)
            # the objects of LMCache's CPU tier, in host memory (pinned or not, as this build's allocator gives it)
            assert parts["load_device"] == "cpu" and isinstance(parts["load_pinned"], bool), parts
    finally:
        LMCacheEngineBuilder.destroy(name)


def digested(tag: str, equal, *, reused: int = 0, differing: int | None = None, arm: str = "dram", **extra) -> dict:
    """A restore row with its content check: 512 tokens compared, ``reused`` of them on reused blocks, ``differing``
    (default: all where not equal) differing."""
    known = equal is not None
    return {**restore(tag, 512 * KVT, arm=arm, **extra), "kv_digest_equal": equal,
            "kv_digest_tokens": 512 if known else None, "kv_digest_reused_tokens": reused if known else None,
            "kv_digest_differing_tokens": (0 if equal else differing if differing is not None else 512) if known else None}


def test_the_kv_digest_check_fails_a_restore_whose_blocks_differ_from_the_context_as_stored():
    grid = as_grid_rows([digested("g-dram", True), digested("g-disk", True, arm="disk"),
                         restore("g-recompute", 0, arm="recompute")])  # not a restore: nothing compared
    pairs = as_pair_rows([digested("p-dram", True), digested("p-mp", True, arm="lmcache_mp", path="mp")])
    ok = kv_digest_check(grid + pairs, [])
    assert ok.status == "ok" and ok.detail == "4 of 4 (2048 of 2048 tokens on fresh blocks)", ok
    assert ok.name == KV_DIGEST_CHECK_INPROC  # in-process restores among them: the name says so
    bad = kv_digest_check(grid + as_pair_rows([digested("p-bad", False)]), [])
    assert bad.status == "failed" and "p-bad: 512 of 512 tokens' KV differs" in bad.detail, bad
    # a differing digest fails wherever it landed; a match on reused blocks is no evidence and is left out
    reused_bad = kv_digest_check(as_grid_rows([digested("g-reused-bad", False, reused=512, differing=16)]), [])
    assert reused_bad.status == "failed", reused_bad
    mixed = kv_digest_check(as_grid_rows([digested("g-fresh", True), digested("g-part", True, reused=32),
                                          digested("g-reused", True, reused=512)]), [])
    assert mixed.status == "ok" and mixed.detail == ("2 of 2 (992 of 1024 tokens on fresh blocks; 1 matching wholly "
                                                     "on reused blocks left out)"), mixed


def test_the_kv_digest_check_names_the_restores_it_did_not_compare():
    """408a and ac1f (7 Dec 2026): vLLM's CPU tier had no store step, so its restores were not digested; the check's
    'every restore' covered the others only, and its detail said nothing of it. Now it names them by arm."""
    rows = as_grid_rows([digested("g-mp", True, arm="lmcache_mp", path="mp"),
                         restore("g-native", 512 * KVT, arm="native_offload", path="native"),  # no digest field
                         digested("g-native-2", None, arm="native_offload", path="native"),  # a digest not taken
                         restore("g-resident", 0, arm="native_resident", path="native")])  # not a restore
    out = kv_digest_check(rows, [])
    assert out.status == "ok", out
    assert out.detail == ("1 of 1 (512 of 512 tokens on fresh blocks); restores not compared (no digest recorded): "
                          "native_offload 2"), out
    # no in-process restore among them (3951, e7c8, 408a): the name no longer claims one (it did until 7 Dec 2026)
    assert out.name == KV_DIGEST_CHECK and "in-process" not in out.name


def test_vllms_cpu_tier_restores_are_compared_with_the_warm_up_that_computed_what_it_offloaded(monkeypatch):
    """vLLM's CPU tier has no store step: a memory arm's warm-up computes the context from an empty tier and the tier
    offloads it, so that warm-up's blocks are what the restore must write back. One that found some of it cached
    computed less: the restore after it is left uncompared (all None), never held to an older warm-up's KV."""
    from types import SimpleNamespace

    from kmesh_lib.sections.crossover import arms

    taken = []
    bench = object.__new__(arms.RestoreBench)
    bench.tier_name, bench.stored_kv = "native", {}
    bench.switch = SimpleNamespace(set=lambda on: None)
    bench.tier = SimpleNamespace(drop_memory_copy=lambda: None, set_retention=lambda keep: None,
                                 memory_bytes=lambda: 0)
    bench.kv_digest = SimpleNamespace(take=lambda request_id, n: taken.append((request_id, n)) or f"digest of {request_id}",
                                      scrub=lambda: taken.append("scrub") or True)
    for name in ("reset_engine", "quiet", "_take_timelines"):
        monkeypatch.setattr(bench, name, lambda: None, raising=False)
    cached = iter([0, 16])
    monkeypatch.setattr(bench, "warm", lambda ctx, tag: next(cached), raising=False)
    ctx = arms.Context("m-32", list(range(32)))
    assert not bench.has_disk_tier
    prep = bench.prepare("native_offload", ctx, "r0")  # the warm-up's KV digested, then every block zeroed
    assert taken == [("r0-warm", 32), "scrub"] and bench.stored_kv == {"m-32": "digest of r0-warm"}
    assert prep["kv_scrubbed"] is True
    bench.prepare("native_offload", ctx, "r1")  # a warm-up that found 16 tokens cached: nothing to compare with
    assert taken == [("r0-warm", 32), "scrub", "scrub"] and bench.stored_kv == {}
    monkeypatch.setattr(arms, "compare_kv", lambda now, stored: {"now": now, "stored": stored})
    assert bench._kv_check("native_offload", ctx, "f1") == {"now": "digest of f1", "stored": None}
    assert bench._kv_check("native_resident", ctx, "f2") == {}  # not a restore: its blocks only forgotten
    assert taken[-1] == ("f2", 0)


def test_the_kv_digest_check_is_left_out_of_runs_that_predate_it_and_skipped_where_nothing_was_judged():
    old = kv_digest_check(as_grid_rows([restore("g-dram", 512 * KVT)]), [])
    assert old.status == "skipped" and old.predates == DIGESTS_SINCE
    unreached = kv_digest_check(as_grid_rows([digested("g-dram", None)]),
                                as_children([{"kv_digest": "not taken: why"}]))
    assert unreached.status == "skipped" and not unreached.predates and "lmcache: not taken: why" in unreached.detail
    reused = kv_digest_check(as_grid_rows([digested("g-reused", True, reused=512)]), [])
    assert reused.status == "skipped" and not reused.predates and "no evidence" in reused.detail


def test_the_answer_names_the_paths_whose_restores_left_kv_other_than_the_computed():
    """4b9b (0.5B, every tier at 1,024-32,512 tokens, H100, c42aebf, KV caches zeroed before every restore; it
    superseded ac1f, the same without the zeroing): the GPU buffer's, vLLM's CPU tier's and LMCache's server's restores
    left the KV as computed, each judged on zeroed blocks, in-process LMCache's DRAM and disk restores did not, most of
    their blocks left all zero. The verdict, the findings, the answer and the public results say so per path, with the
    counts the check judged; a run from before the digest (a47e) reads as it did."""
    from kmesh_lib.base import paths
    from kmesh_lib.base.public import MAX_VERDICT_CHARS
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.crossover import summary

    folder = paths.OUTPUTS / "crossover" / "gpu-20261207-132453-4b9b"
    run = RunFiles(folder)
    digests = summary.kv_digest_by_path(run)
    assert {p: (d["num_compared"], d["num_differing"]) for p, d in digests.items()} == {
        "dram": (292, 292), "disk": (68, 68), "gpubuf_retained": (292, 0), "gpubuf_layered": (292, 0),
        "gpubuf_offthread": (292, 0), "gpubuf_disk": (68, 0), "native_offload": (292, 0), "lmcache_mp": (292, 0)}
    assert sorted(summary.not_as_computed(digests)) == ["disk", "dram"]
    assert (digests["dram"]["num_zero_blocks"], digests["dram"]["num_misplaced_blocks"]) == (220352, 14084)
    verdict = summary.verdict(run)
    assert all(len(s) <= MAX_VERDICT_CHARS for s in verdict)
    assert verdict[-1] == ("But in-process LMCache's DRAM and disk restores left KV other than the computed in vLLM's "
                           "blocks (292 of 292; 68 of 68): those speed-ups are a copy's, not a restore's.")
    cells = {row["restore"]: row["qwen2.5-0.5b"] for row in summary.findings(run)}
    assert cells["DRAM"].endswith("KV not as computed in 292 of 292 restores")
    assert "KV not as computed" not in cells["LMCache server (MP, DRAM)"]
    answer = summary.answer(run)
    assert ("So in-process LMCache's DRAM and disk restores did not restore the context: their times are a copy's, "
            "not a restore's") in answer
    for path in ("LMCache server (MP, DRAM)", "vLLM CPU-tier"):
        assert f"{path}: all 292 equal, each into KV caches zeroed before it (so each shows a write)" in answer
    native = RunFiles(paths.OUTPUTS / "crossover" / "gpu-20261207-042240-e7c8")  # vLLM's CPU tier, digested (7 Dec)
    assert ("vLLM CPU-tier: all 137 equal, 12 of them on fresh blocks (the other 125 landed on blocks that already "
            "held the same KV: equal, but no evidence of a write).") in summary.answer(native)
    public = summary.public_results(run)
    assert public["kv_digest"]["dram"] == {"num_compared": 292, "num_differing": 292}
    assert not public.get("kv_not_compared")  # every path's restores were digested
    before = RunFiles(paths.OUTPUTS / "crossover" / "gpu-20261205-114504-a47e")
    assert summary.kv_digest_by_path(before) == {} and not any("copy's" in s for s in summary.verdict(before))
    older = summary.public_results(before)  # older public documents read as they were
    assert "kv_digest" not in older and "kv_not_compared" not in older
    # the README's line for a47e (which stood until 7 Dec): its DRAM figure is measured on the stack whose in-process
    # copies the digest caught, and the line says so from the other runs' public documents
    from kmesh_lib.app import published

    entries = published.collect(paths.OUTPUTS)
    standing = next(e for e in entries if e["run_id"] == before.run_id)
    assert published.replications_text(standing, entries).endswith(
        "But on the same stack (vLLM 0.26.0, LMCache 0.5.3) in-process LMCache's DRAM restores left KV other than the "
        "computed in vLLM's blocks wherever it was digested (4b9b: 292 of 292; d7bf: 292 of 292; 1727: 292 of 292; 9c33: "
        "292 of 292): that speed-up is a copy's time, not a restore's.")


def test_the_heatmap_marks_the_panels_whose_restores_left_kv_other_than_the_computed(tmp_path):
    """4b9b's heatmap showed in-process LMCache's DRAM panel at 3.36x like a restore's, while the verdict beside it
    said those restores left other KV: the panels of such paths are hatched and their titles say so, with the
    counts; every other panel reads as before."""
    import matplotlib

    matplotlib.use("Agg")
    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.crossover import plots

    run = RunFiles(paths.OUTPUTS / "crossover" / "gpu-20261207-132453-4b9b")
    fig = plots.heatmap(run, run.results, tmp_path / "heatmap.png")
    titles = {ax.get_title().split("\n")[0]: ax for ax in fig.axes if ax.get_title()}
    assert titles["dram restore"].get_title().endswith(
        "KV not as computed in 292 of 292\n(a copy's time, not a restore's)")
    assert "KV not as computed in 68 of 68" in titles["disk restore"].get_title()
    marked = {t for t, ax in titles.items() if any(p.get_hatch() for p in ax.patches)}
    assert marked == {"dram restore", "disk restore"}
    assert not any("not as computed" in ax.get_title() for t, ax in titles.items() if t not in marked)
