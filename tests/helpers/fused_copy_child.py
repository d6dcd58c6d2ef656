"""Runs the fused restore copy under Triton's interpreter on CPU tensors and compares it with torch's.

Started by ``tests/test_fused_copy.py`` with ``TRITON_INTERPRET=1`` (``triton.jit`` reads it when the
kernel is defined, so it must be set before this process defines it). For each case it builds two
arenas over identical zeroed KV tensors, fills both buffers with the same random bytes, restores
through ``copy_into_vllm`` (arena A on the per-plane torch path, arena B with a ``RowScatter``, arena C
with one ``RowScatter`` launch per layer group, ``by_layer``, arena D with a grid of at most three
programs per plane and chunk, each copying several rows) and
prints one JSON line per case and chunk size (argv, bytes per program): whether every KV byte
matches, and which blocks the copy changed.
"""
import json
import random
import sys
import tempfile

import torch

from kmesh_lib.kv import fused_copy
from kmesh_lib.kv.fused_copy import MAX_PROGRAMS, RowScatter
from kmesh_lib.kv.gpu_buffer_arena import BufferArena
from kmesh_lib.kv.restore_timeline import RestoreTimeline

NUM_GPU_BLOCKS, NUM_BUFFER_BLOCKS = 40, 24


def layouts(nb):
    """name -> per-layer KV tensors; logical (2, num_blocks, tokens, heads, dim) as vLLM's backends give."""
    return {
        "flash-attn-bf16": lambda: {f"l{i}": torch.zeros(2, nb, 16, 2, 32, dtype=torch.bfloat16) for i in range(3)},
        "block-outermost-f32": lambda: {f"l{i}": torch.zeros(nb, 2, 16, 2, 8).permute(1, 0, 2, 3, 4) for i in range(2)},
        "heads-before-tokens": lambda: {
            f"l{i}": torch.zeros(nb, 2, 2, 16, 8, dtype=torch.float16).permute(1, 0, 3, 2, 4) for i in range(2)},
        # planes of unequal sizes: layers with different head counts, one not a multiple of 16 bytes
        "unequal-planes": lambda: {"l0": torch.zeros(2, nb, 16, 2, 32, dtype=torch.bfloat16),
                                   "l1": torch.zeros(2, nb, 3, 1, 3, dtype=torch.bfloat16),
                                   "l2": torch.zeros(2, nb, 16, 1, 8, dtype=torch.bfloat16)},
    }


def block_id_cases(rng):
    ids = list(range(1, NUM_GPU_BLOCKS))
    return {
        "shuffled": rng.sample(ids, 8),
        "consecutive": list(range(5, 13)),
        "mixed": [30, 31, 32, 3, 17, 18, 2, 9, 10, 11, 12, 38],
        "one": [7],
    }


def kv_bytes(kv_caches):
    return [kv.contiguous().view(torch.uint8) for kv in kv_caches.values()]


def main(chunk_sizes: list[int]) -> None:
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for chunk_bytes, (layout, make) in ((c, lm) for c in chunk_sizes for lm in layouts(NUM_GPU_BLOCKS).items()):
            for case, block_ids in block_id_cases(rng).items():
                kv_a, kv_b, kv_c, kv_d = make(), make(), make(), make()
                a = BufferArena(kv_a, NUM_GPU_BLOCKS, NUM_BUFFER_BLOCKS, tmp)
                b = BufferArena(kv_b, NUM_GPU_BLOCKS, NUM_BUFFER_BLOCKS, tmp)
                c = BufferArena(kv_c, NUM_GPU_BLOCKS, NUM_BUFFER_BLOCKS, tmp)  # the fused copy by layer groups
                d = BufferArena(kv_d, NUM_GPU_BLOCKS, NUM_BUFFER_BLOCKS, tmp)  # programs stepping over rows
                noise = torch.randint(0, 256, a.buffer.shape, dtype=torch.uint8, generator=gen)
                for arena in (a, b, c, d):
                    arena.buffer.copy_(noise)
                c.scatter = RowScatter(c.buffer.view(c.planes[0].dtype), c.planes, chunk_bytes)
                d.scatter = RowScatter(d.buffer.view(d.planes[0].dtype), d.planes, chunk_bytes)
                assert a.scatter is None and a.copy_route.startswith("torch")  # CPU: torch path by default
                b.scatter = RowScatter(b.buffer.view(b.planes[0].dtype), b.planes, chunk_bytes)
                b.scatter.warmup()
                # a longer restore first: the reused id buffers must not leak its ids into the next one. One id
                # longer is enough (a copy reading past its own ids writes that id's block, or block 0 from the
                # zeros beyond, and so differs from the torch path's bytes) and costs the interpreter least
                decoy = list(range(NUM_GPU_BLOCKS - 1, 0, -1))[:len(block_ids) + 1]
                b.copy_into_vllm(0, 0, decoy, RestoreTimeline("restore", "decoy", 0, "buffer", len(decoy), 0, "cpu"))
                for kv in kv_b.values():
                    kv.zero_()
                b.counters["restored_bytes"] = 0
                extent_start, first_block = 2, 1  # rows 3 ...: an offset the kernel must honour
                for arena in (a, b, c):
                    tl = RestoreTimeline("restore", "r", 0, "buffer", len(block_ids), 0, "cpu")
                    ends = arena.copy_into_vllm(extent_start, first_block, block_ids, tl, by_layer=arena is c)
                # a grid of at most 3 programs per plane and chunk: each program copies several rows (a
                # captured graph's fixed grid, or a restore beyond MAX_PROGRAMS)
                d_grid = d.scatter.grid(len(block_ids))
                fused_copy.MAX_PROGRAMS = 3 * d_grid[1] * d_grid[2]
                try:
                    d_grid = d.scatter.grid(len(block_ids))
                    d.copy_into_vllm(extent_start, first_block, block_ids,
                                     RestoreTimeline("restore", "r", 0, "buffer", len(block_ids), 0, "cpu"))
                finally:
                    fused_copy.MAX_PROGRAMS = MAX_PROGRAMS
                bytes_a, bytes_b, bytes_c = kv_bytes(kv_a), kv_bytes(kv_b), kv_bytes(kv_c)
                blocks_changed = {i for kv in kv_a.values() for i in range(NUM_GPU_BLOCKS)
                                  if kv.select(1, i).count_nonzero().item()}
                s = b.scatter
                print(json.dumps({
                    "layout": layout, "case": case, "chunk_bytes": chunk_bytes,
                    "equal": all(torch.equal(x, y) for x, y in zip(bytes_a, bytes_b)),
                    "equal_by_layer": all(torch.equal(x, y) for x, y in zip(bytes_a, bytes_c)),
                    "equal_stepping": all(torch.equal(x, y) for x, y in zip(bytes_a, kv_bytes(kv_d))),
                    "stepping_grid": list(d_grid),
                    "num_groups": [len(c.plane_groups), len(ends)],
                    "blocks_changed": sorted(blocks_changed), "block_ids": sorted(block_ids),
                    "restored_bytes": [a.counters["restored_bytes"], b.counters["restored_bytes"]],
                    "vec": s.vec, "even": s.even, "num_chunks": s.num_chunks,
                    "launch_route": s.launch_route}), flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16 << 10])
