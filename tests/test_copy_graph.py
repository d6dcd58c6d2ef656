"""Captured restore copies (``kv.copy_graph``): which graph a restore replays, when an instance may be
replayed again, and (``gpu`` marker) that a replay writes the bytes the launch route writes, times its
copy, and hands over to the launch route when every instance of its size is still in use."""
import time

import pytest
import torch

from kmesh_lib.kv.copy_graph import NUM_INSTANCES, GraphInstance, bucket_of, graph_launchers, size_buckets
from kmesh_lib.kv.restore_timeline import RestoreTimeline, Span
from kmesh_lib.sections.crossover.checks import REFERENCE_AGREE_US


@pytest.mark.parametrize("max_rows, buckets", [(1, [1]), (2, [1, 2]), (5, [1, 2, 4, 8]), (1024, [1 << k for k in range(11)])])
def test_buckets_are_powers_of_two_up_to_the_first_that_holds_the_pool(max_rows, buckets):
    assert size_buckets(max_rows) == buckets


@pytest.mark.parametrize("num_rows, bucket", [(1, 1), (2, 2), (3, 4), (1024, 1024), (1025, 2048), (2032, 2048), (4097, None)])
def test_a_restore_replays_the_smallest_bucket_that_holds_it(num_rows, bucket):
    assert bucket_of(num_rows, size_buckets(4096)) == bucket


class FakeEvent:
    """An event the test ends by hand; elapsed times are from its ``t_ms`` (the reference's is 0)."""

    def __init__(self, t_ms: float, done: bool = False) -> None:
        self.t_ms, self.done = t_ms, done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        assert self.done, "a span must not be resolved before its event completes"

    def elapsed_time(self, other) -> float:
        return other.t_ms - self.t_ms


def test_an_instance_is_reused_only_once_its_last_spans_are_read():
    start, end = FakeEvent(0.001), FakeEvent(0.003)
    inst = GraphInstance(None, None, None, None, start, [end])
    ref = (1_000_000, FakeEvent(0.0), False)
    copy = Span().gpu(start, end)
    inst.hold([copy], ref)
    assert not inst.free() and not copy.resolved  # its copy has not ended: the events still belong to it
    start.done = end.done = True
    assert inst.free() and copy.resolved and inst.pending == []  # ended: read now, then free
    assert (copy.t0_ns, copy.t1_ns) == (1_001_000, 1_003_000)
    done = Span().gpu(start, end)
    done.resolve(ref)
    inst.hold([done], ref)
    end.done = False  # a span already read frees the instance without asking the GPU
    assert inst.free()


@pytest.mark.gpu
def test_graph_replays_write_the_launch_routes_bytes_and_hand_over_when_busy(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.fused_copy import triton_status
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena

    if triton_status() is not None:
        pytest.skip(triton_status())
    num_blocks, num_layers = 600, 6
    kv_a = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for i in range(num_layers)}
    kv_b = {k: torch.zeros_like(v) for k, v in kv_a.items()}
    a = BufferArena(kv_a, num_blocks, 520, tmp_path, copy_graphs=False)
    b = BufferArena(kv_b, num_blocks, 520, tmp_path)
    assert (a.graph_route, b.graph_route) == ("off (copy_graphs=False)", "on")
    launchers, why = graph_launchers()
    # the preferred launcher passes its check on a working device (libcuda's, through ctypes)
    assert b.graphs.launch_via == (launchers[0].label if launchers else f"CUDAGraph.replay ({'; '.join(why)})")
    assert b.graphs.buckets[-1] == 1024 and len(b.graphs.instances[("layer", 256)][0].ends) == len(b.plane_groups)
    noise = torch.randint(0, 256, a.buffer.shape, dtype=torch.uint8, device="cuda")
    a.buffer.copy_(noise)
    b.buffer.copy_(noise)
    gen = torch.Generator().manual_seed(0)
    for n, by_layer in ((1, False), (3, True), (256, False), (257, True), (500, False), (500, True)):
        block_ids = torch.randperm(num_blocks - 1, generator=gen)[:n].add(1).tolist()
        for t in (*kv_a.values(), *kv_b.values()):
            t.zero_()
        timelines = []
        for arena in (a, b):
            ref = arena.reference()
            tl = RestoreTimeline("restore", "r", 0, "buffer", n, 0, "cuda", ref=ref, t_start_ns=time.monotonic_ns())
            ends = arena.copy_into_vllm(7, 2, block_ids, tl, by_layer=by_layer)
            assert len(ends) == (len(arena.plane_groups) if by_layer else 0)
            timelines.append(tl)
        torch.cuda.synchronize()
        assert [tl.copy_launch for tl in timelines] == ["handle", "graph"], (n, by_layer)
        # bytes, not values: random bytes in bfloat16 hold NaNs, which no value comparison finds equal
        assert all(torch.equal(kv_a[k].view(torch.uint8), kv_b[k].view(torch.uint8)) for k in kv_a), (n, by_layer)
        assert b.read_back(block_ids).equal(b.extent(9, n))
        rec = timelines[1].record()
        # the copy starts after its restore did (a few us of event latency aside) and takes some time
        assert rec["copy_s"] > 0 and rec["t_copy_start_ns"] > rec["t_start_ns"] - 20_000
    # busy instances: the stream sleeps, so NUM_INSTANCES replays of one size stay in flight; the next
    # restore of that size takes the launch route, and once they end the graph is free again
    block_ids = list(range(1, 33))
    ref = b.reference()  # taken now: on a busy stream it would wait for the sleep
    torch.cuda._sleep(50_000_000)
    routes = []
    for _ in range(NUM_INSTANCES + 1):
        tl = RestoreTimeline("restore", "r", 0, "buffer", 32, 0, "cuda", ref=ref)
        b.copy_into_vllm(0, 0, block_ids, tl)
        routes.append(tl.copy_launch)
    assert routes == ["graph"] * NUM_INSTANCES + ["handle"]
    torch.cuda.synchronize()
    tl = RestoreTimeline("restore", "r", 0, "buffer", 32, 0, "cuda", ref=b.reference())
    b.copy_into_vllm(0, 0, block_ids, tl)
    assert tl.copy_launch == "graph"
    # a reference kept from before a step: the GPU's clock and the host's agree over it to microseconds, beyond
    # the time each reference's record call took on the host (its window, longer on a loaded host)
    b.keep_reference()
    kept = b.standing_reference
    assert kept is not None and b.last_kept_reference is kept
    time.sleep(0.02)
    drift = b.reference_drift()
    assert b.standing_reference is None and b.last_kept_reference is None and b.reference_drift() is None
    kept_window_us, now_window_us = drift["windows_us"]
    assert drift["interval_ms"] >= 20, drift
    assert -kept_window_us - REFERENCE_AGREE_US <= drift["drift_us"] <= now_window_us + REFERENCE_AGREE_US, drift


def test_without_the_bindings_route_a_graph_is_replayed_between_stream_switches(monkeypatch):
    monkeypatch.delattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec", raising=False)
    launchers, why = graph_launchers()
    assert launchers == [] and "raw_cuda_graph_exec" in why[0]


@pytest.mark.gpu
def test_a_launcher_whose_check_fails_gives_way_to_the_next(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.fused_copy import triton_status
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena

    if triton_status() is not None:
        pytest.skip(triton_status())
    launchers, _ = graph_launchers()
    if not launchers:
        pytest.skip("no direct launcher to sabotage")
    first = type(launchers[0])
    monkeypatch.setattr(first, "__call__", lambda self, exec_handle, stream_handle: 1)  # an error code
    kv = {f"l{i}": torch.zeros(2, 64, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for i in range(2)}
    b = BufferArena(kv, 64, 40, tmp_path)
    assert b.graph_route == "on"
    if len(launchers) > 1:
        assert b.graphs.launch_via == launchers[1].label
    else:
        assert b.graphs.launch_via.startswith("CUDAGraph.replay") and f"{first.label} failed its check" in b.graphs.launch_via


class Holder:
    def __init__(self) -> None:
        self.resolved = False


def test_a_pooled_event_is_recorded_again_only_once_its_holders_are_resolved(monkeypatch):
    from kmesh_lib.kv import cuda_streams

    made = []
    monkeypatch.setattr(cuda_streams.torch.cuda, "Event", lambda **kw: made.append(object()) or made[-1])
    pool = cuda_streams.EventPool(size=2)
    step1, step2 = [], []
    a = pool.take(step1)
    assert pool.take(step2) is not a  # step 1's list is still empty: held until filled and resolved
    step1.append(Holder())
    assert pool.take([]) not in (a,) and len(pool.slots) == 2 and len(made) == 3  # full: made outside the pool
    step1[0].resolved = True
    assert pool.take([Holder()]) is a  # step 1 read its times: its event is recorded again


def test_the_kept_reference_is_the_narrowest_of_its_tries(monkeypatch):
    from kmesh_lib.kv import cuda_streams

    windows = iter([13_000, 69_000, 9_000, 15_000, 12_000])
    monkeypatch.setattr(cuda_streams, "stream_reference", lambda stream=None: (0, object(), False, next(windows)))
    assert cuda_streams.narrowest_reference(tries=5)[3] == 9_000  # a slow record call's window is never kept
