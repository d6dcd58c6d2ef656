"""The fused restore copy (``kv.fused_copy``) against the per-plane torch copies it replaces.

On CPU the kernel runs under Triton's interpreter in a child process (``TRITON_INTERPRET=1`` must be
set before the kernel is defined): for several KV layouts, planes of unequal sizes, and shuffled,
consecutive and mixed block ids, every KV byte must equal what the torch path writes. The table the
kernel reads is checked directly, and the CUDA run (``gpu`` marker) compares the compiled kernel.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kmesh_lib.kv.fused_copy import RowScatter, triton_status
from kmesh_lib.kv.gpu_buffer_arena import BufferArena, block_planes

CHILD = Path(__file__).parent / "helpers" / "fused_copy_child.py"
CHUNKS = (16 << 10, 512)  # 512 bytes: each plane split over several programs
LAYOUTS = ("flash-attn-bf16", "block-outermost-f32", "heads-before-tokens", "unequal-planes")
CASES = ("shuffled", "consecutive", "mixed", "one")


@pytest.fixture(scope="module")
def interpreted():
    """(layout, case, chunk_bytes) -> the child's record of one restore through both paths."""
    if triton_status() is not None:
        pytest.skip(triton_status())
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    out = subprocess.run([sys.executable, str(CHILD), *map(str, CHUNKS)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["layout"], r["case"], r["chunk_bytes"]): r for r in records}


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fused_copy_writes_the_same_bytes_as_the_torch_path(interpreted, layout, case, chunk_bytes):
    r = interpreted[(layout, case, chunk_bytes)]
    assert r["equal"], f"{layout}/{case}: the fused copy's KV differs from the torch path's"
    assert r["equal_by_layer"], f"{layout}/{case}: the copy by layer groups differs from the torch path's"
    assert r["equal_stepping"], f"{layout}/{case}: programs stepping over rows copy other bytes than the torch path"
    assert r["stepping_grid"][0] == min(3, len(r["block_ids"]))  # the stepping case did step (3 programs a plane)
    assert r["num_groups"][0] == r["num_groups"][1] > 1  # one launch, and one end, per group
    assert r["blocks_changed"] == r["block_ids"]  # the copy wrote every block asked for, and no other
    assert r["restored_bytes"][0] == r["restored_bytes"][1] > 0  # counters as before, whichever path


def test_the_cases_reach_the_masked_and_the_split_kernel(interpreted):
    """The cases above are only worth their names if they run every variant of the kernel."""
    unequal = interpreted[("unequal-planes", "shuffled", 16 << 10)]
    assert (unequal["even"], unequal["vec"]) == (False, 1)  # masked; an 18-byte plane: 2-byte lines
    flash = interpreted[("flash-attn-bf16", "shuffled", 16 << 10)]
    assert (flash["even"], flash["vec"], flash["num_chunks"]) == (True, 2, 1)  # unmasked 16-byte lines
    assert interpreted[("flash-attn-bf16", "shuffled", 512)]["num_chunks"] == 2048 // 512
    # the interpreter has no compiled handle: calls go through the dispatcher, and the run says so
    assert {r["launch_route"] for r in interpreted.values()} == {"jit (Triton's interpreter)"}


def test_the_table_holds_each_planes_offset_stride_and_size_in_lines(tmp_path):
    num_blocks = 8
    kv = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 32, dtype=torch.bfloat16) for i in range(2)}
    arena = BufferArena(kv, num_blocks, 4, tmp_path)
    s = RowScatter(arena.buffer.view(arena.planes[0].dtype), arena.planes)
    lb = s.line_bytes
    assert lb == 16 and s.vec == 16 // arena.word_bytes
    planes = [p for t in kv.values() for p in block_planes(t, num_blocks)]  # K then V of each layer
    plane_bytes = 16 * 2 * 32 * 2
    table = s.table.view(4, -1).tolist()
    assert table[0] == [(p.data_ptr() - arena.buffer.data_ptr()) // lb for p in planes]
    assert table[1] == [p.stride(0) * p.element_size() // lb for p in planes]
    assert table[2] == [k * plane_bytes // lb for k in range(4)]  # planes in buffer-row order
    assert table[3] == [plane_bytes // lb] * 4
    assert s.row_lines * lb == arena.bytes_per_block == 4 * plane_bytes
    assert s.chunk_words * arena.word_bytes == plane_bytes and s.num_chunks == 1 and s.even
    assert s.num_warps == plane_bytes // (32 * 64)  # 64 bytes per thread


def test_the_cpu_build_keeps_the_torch_path(tmp_path):
    kv = {"l0": torch.zeros(2, 8, 16, 2, 32, dtype=torch.bfloat16)}
    arena = BufferArena(kv, 8, 4, tmp_path)
    assert arena.scatter is None and arena.copy_route == "torch (no CUDA device)"


@pytest.mark.gpu
def test_the_compiled_kernel_matches_the_torch_path_on_cuda(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.restore_timeline import RestoreTimeline

    if triton_status() is not None:
        pytest.skip(triton_status())
    num_blocks = 300
    kv_a = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for i in range(4)}
    kv_b = {k: torch.zeros_like(v) for k, v in kv_a.items()}
    a, b = BufferArena(kv_a, num_blocks, 256, tmp_path), BufferArena(kv_b, num_blocks, 256, tmp_path)
    assert b.copy_route == "fused", b.copy_route
    assert b.scatter.launch_route == "handle", b.scatter.launch_route  # checked by a copy into block 0
    a.scatter = None
    noise = torch.randint(0, 256, a.buffer.shape, dtype=torch.uint8, device="cuda")
    a.buffer.copy_(noise)
    b.buffer.copy_(noise)
    block_ids = torch.randperm(num_blocks - 1)[:200].add(1).tolist()
    decoy = list(range(num_blocks - 1, 0, -1))[:250]  # longer: the reused id buffers must not leak it
    b.copy_into_vllm(0, 0, decoy, RestoreTimeline("restore", "decoy", 0, "buffer", 250, 0, "cuda"))
    for t in (*kv_a.values(), *kv_b.values()):  # also block 0, where each warm-up checked its handle
        t.zero_()
    for arena in (a, b):
        arena.copy_into_vllm(10, 3, block_ids, RestoreTimeline("restore", "r", 0, "buffer", 200, 0, "cuda"))
    torch.cuda.synchronize()
    # bytes, not values: random bytes in bfloat16 hold NaNs, which no value comparison finds equal
    assert all(torch.equal(kv_a[k].view(torch.uint8), kv_b[k].view(torch.uint8)) for k in kv_a)
    assert b.read_back(block_ids).equal(b.extent(13, 200))
    from kmesh_lib.kv.id_pack import IdRange

    for arena, graphs in ((b, b.graphs), (b, None)):  # ids unread: the graph route, then the launch route read them
        for t in kv_b.values():
            t.zero_()
        arena.graphs = graphs
        arena.copy_into_vllm(10, 3, IdRange([0, *block_ids, 0], 1, 200),
                             RestoreTimeline("restore", "u", 0, "buffer", 200, 0, "cuda"))
        torch.cuda.synchronize()
        assert all(torch.equal(kv_a[k].view(torch.uint8), kv_b[k].view(torch.uint8)) for k in kv_a), graphs


def test_the_copy_probe_runs_its_smoke_size_and_checks_the_bytes(tmp_path):
    """``benchmarks/bench_gpubuf_copy.py --smoke`` (CPU; the fused path in the interpreter when Triton
    imports): prints its table, writes its JSON, and every path it ran put the buffer's rows back."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    out = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "benchmarks" / "bench_gpubuf_copy.py"),
                          "--smoke", "--out", str(tmp_path / "copy.json")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "path" in out.stdout and "x floor" in out.stdout and "equal" in out.stdout
    rows = json.loads((tmp_path / "copy.json").read_text())["rows"]
    paths = {(r["order"], r["path"]) for r in rows if "error" not in r}
    want = {"floor", "torch"} | ({"fused"} if triton_status() is None else set())
    assert paths == {(order, p) for order in ("shuffled", "consecutive") for p in want}
    assert all(r["equal"] is True for r in rows if r["path"] != "floor")
    assert all(r["bytes"] == r["num_blocks"] * r["num_planes"] * r["plane_bytes"] for r in rows)


@pytest.mark.parametrize("even", [True, False])
def test_the_kernel_compiles_for_hopper_with_16_byte_loads_and_stores(even):
    """Compiled ahead of time for sm_90 (no GPU needed): every data load and store is 128-bit, which
    holds only while the table's line units let Triton prove 16-byte alignment."""
    if triton_status() is not None:
        pytest.skip(triton_status())
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kmesh_lib.kv.fused_copy import _kernel

    sig = {"buf_ptr": "*i64", "table_ptr": "*i64", "args_ptr": "*i32", "plane0": "i32", "row_lines": "i32",
           "num_planes": "i32", "VEC": "constexpr", "CHUNK": "constexpr", "EVEN": "constexpr"}
    aligned = [["tt.divisibility", 16]]  # what Triton's launcher specializes 16-byte-aligned pointers to
    src = ASTSource(fn=_kernel(), signature=sig, constexprs={"VEC": 2, "CHUNK": 512, "EVEN": even},
                    attrs={(0,): aligned, (1,): aligned, (2,): aligned})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2}).asm["ptx"]
    # the 8-byte and 4-byte loads are the table's and the arguments' scalars (source row, count, block id)
    data_loads = [m for m in re.findall(r"ld\.global[.\w]*", ptx) if m not in ("ld.global.b64", "ld.global.b32")]
    stores = re.findall(r"st\.global[.\w]*", ptx)
    assert data_loads and set(data_loads) == {"ld.global.v2.b64"}
    assert stores and set(stores) == {"st.global.v2.b64"}


@pytest.mark.parametrize("num_ids", [1, 3, 1024])
def test_ids_packed_ahead_write_the_arguments_a_list_writes(num_ids):
    """``pack_ids`` on the scheduler side, then ``write_args`` at the copy: the same int32 words as
    packing the list there; bytes past the restore's ids are left as they were."""
    from kmesh_lib.kv.fused_copy import NUM_HEADER, pack_ids, write_args

    ids = [(7919 * i + 13) % 50_000 for i in range(num_ids)]
    words = NUM_HEADER + num_ids + 4
    from_list, from_packed = (torch.full((words,), -1, dtype=torch.int32) for _ in range(2))
    write_args(memoryview(from_list.numpy()).cast("B"), 42, ids)
    write_args(memoryview(from_packed.numpy()).cast("B"), 42, ids, pack_ids(ids))
    assert from_packed.tolist() == from_list.tolist() == [42, num_ids, *ids, -1, -1, -1, -1]


@pytest.mark.parametrize("first, num", [(0, None), (0, 5), (3, 4), (7, 3), (9, 1), (10, 0)])
def test_ids_packed_from_a_whole_table_are_the_slice_packed(first, num):
    """``pack_ids(table, first, num)`` (the connector packs a request's whole block table and cuts the bytes)
    gives the words of ``table[first:first + num]`` packed alone."""
    from kmesh_lib.kv.fused_copy import pack_ids

    table = [(7919 * i + 13) % 50_000 for i in range(10)]
    end = len(table) if num is None else first + num
    assert pack_ids(table, first, num) == pack_ids(table[first:end])
    assert len(pack_ids(table, first, num)) == 4 * (end - first)


def test_a_check_block_unlike_its_row_fails_until_the_row_is_copied_and_the_buffer_is_untouched(tmp_path):
    """``unlike_row``: the graph checks' setup (``copy_graph.CopyGraphs._check``), which may run while the buffer
    holds contexts: it flips the check block's bits against the row, so only a copy that ran makes them equal."""
    num_blocks = 8
    kv = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 32, dtype=torch.bfloat16) for i in range(2)}
    arena = BufferArena(kv, num_blocks, 4, tmp_path)
    arena.buffer.copy_(torch.randint(0, 256, arena.buffer.shape, dtype=torch.uint8))
    arena.buffer[arena.bytes_per_block:2 * arena.bytes_per_block].zero_()  # row 1 all zeros: still told apart
    before = arena.buffer.clone()
    s = RowScatter(arena.buffer.view(arena.planes[0].dtype), arena.planes)
    s.unlike_row(1, 0)
    assert not s.row_landed(1, 0) and torch.equal(arena.buffer, before)
    assert all(bool((p[0].view(torch.uint8) == 255).all()) for p in arena.planes)  # every bit of a zero row, flipped
    arena._copy_per_plane(1, [0])  # the copy the check replays
    assert s.row_landed(1, 0) and torch.equal(arena.buffer, before)
