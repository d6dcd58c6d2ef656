"""The GPU buffer's restore copy (buffer rows -> vLLM's blocks) next to its floor, per path (issue 13).

    python3 benchmarks/bench_gpubuf_copy.py [--out copy.json] [--smoke]      (PYTHONPATH at the repo root)

For each model shape (``engine.model_spec.SHAPES``: Qwen2.5 0.5B, 1.5B, 7B; bfloat16, 16-token blocks)
and context (16,384 and 32,512 tokens) it builds vLLM's per-layer KV tensors in FlashAttention's layout
``(2, num_blocks, 16, num_kv_heads, head_dim)`` (a pool of POOL_FACTOR x the context's blocks), a
``BufferArena`` over them, random bytes in the context's extent, and destination block ids drawn
shuffled from the pool (what a restore into a used pool gets) or consecutive. Then, WARMUPS + REPEATS
times each, medians of REPEATS:

    torch    the per-plane path (``index_copy_`` per plane; narrow copies per run when ids form <= 8 runs)
    fused    one Triton launch (``kv.fused_copy.RowScatter``), at each chunk size in CHUNKS that differs,
             through Triton's compiled handle (``fused-jit``: the same kernel through its dispatcher)
    graph    the default kernel queued by one replay of a captured CUDA graph (``kv.copy_graph``; CUDA)
    floor    one contiguous device->device copy of the same bytes (``kv.floors``' way: ``dst.copy_(src)``)

Two device figures per path, from CUDA events: ``idle`` starts on an idle GPU, as a restore's copy span
does, so host launch time the GPU waits for is in it; ``queued`` starts behind a GPU spin long enough for
every launch to queue, so it is the GPU's own time. ``host_us`` is the wall clock of the call itself,
before any synchronize (Python and launch overhead, paid on the restore's critical path); ``host-parts``
splits it (CUDA only): the ids to the device, a CUDA event, the launch by handle and by dispatcher. Every path's
result is read back and compared with the buffer's rows: ``equal`` must be True for a figure to count.

Prints figures; asserts no timing. Without CUDA it runs ``--smoke`` (a tiny shape, CPU clocks; the
fused path only under ``TRITON_INTERPRET=1``, where it checks bytes, not speed).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")
CONTEXTS = (16_384, 32_512)
BLOCK_SIZE = 16
POOL_FACTOR = 2  # vLLM's pool: twice the context's blocks, so shuffled ids spread over a used pool
CHUNKS = (4 << 10, 8 << 10, 16 << 10)  # bytes per program of the fused kernel
WARMUPS, REPEATS = 3, 20
SPIN_CYCLES = 5_000_000  # ~2.5 ms at H200 clocks: longer than any path's host launches


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the rows as JSON here (default: print only)")
    ap.add_argument("--smoke", action="store_true", help="tiny shape and context (what CPU tests run)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS))
    return ap.parse_args()


class Clock:
    """Times one call: device ms from CUDA events (idle or queued start) or CPU stamps, host us."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.torch, self.cuda = torch, cuda

    def once(self, fn, queued: bool) -> tuple[float, float]:
        torch = self.torch
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            return (t1 - t0) * 1e3, (t1 - t0) * 1e6
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(SPIN_CYCLES)  # the launches below queue behind it
        start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), (t1 - t0) * 1e6

    def medians(self, fn, warmups: int, repeats: int) -> dict:
        out = {}
        for queued in ((False, True) if self.cuda else (False,)):
            runs = [self.once(fn, queued) for _ in range(warmups + repeats)][warmups:]
            key = "queued" if queued else "idle"
            out[f"{key}_ms"] = statistics.median(r[0] for r in runs)
            if not queued:
                out["host_us"] = statistics.median(r[1] for r in runs)
        return out


def shaped_arena(model: str, context_tokens: int, device: str):
    """vLLM's per-layer KV tensors of ``model``'s shape (a pool of ``POOL_FACTOR`` x the context's blocks, block 0
    vLLM's null block), a ``BufferArena`` over them with random bytes in the context's extent. Returns
    (arena, kv tensors by layer name, the context's blocks, the pool's blocks)."""
    import torch

    from kmesh_lib.engine.model_spec import resolve
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena

    cfg = resolve(model).config
    heads, head_dim = cfg["num_key_value_heads"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    num_ctx_blocks = -(-context_tokens // BLOCK_SIZE)
    num_gpu_blocks = POOL_FACTOR * num_ctx_blocks + 1  # block 0 is vLLM's null block
    kv = {f"layer.{i}": torch.zeros(2, num_gpu_blocks, BLOCK_SIZE, heads, head_dim, dtype=torch.bfloat16, device=device)
          for i in range(cfg["num_hidden_layers"])}
    with tempfile.TemporaryDirectory() as tmp:
        arena = BufferArena(kv, num_gpu_blocks, num_ctx_blocks, Path(tmp))
    gen = torch.Generator(device=device).manual_seed(0)
    arena.buffer.copy_(torch.randint(0, 256, arena.buffer.shape, dtype=torch.uint8, device=device, generator=gen))
    return arena, kv, num_ctx_blocks, num_gpu_blocks


def measure(model: str, context_tokens: int, order: str, device: str, warmups: int, repeats: int,
            fused_ok: bool) -> list[dict]:
    import torch

    from kmesh_lib.kv.fused_copy import RowScatter
    from kmesh_lib.kv.restore_timeline import RestoreTimeline

    arena, kv, num_ctx_blocks, num_gpu_blocks = shaped_arena(model, context_tokens, device)
    pool = list(range(1, num_gpu_blocks))
    if order == "shuffled":
        block_ids = random.Random(0).sample(pool, num_ctx_blocks)
    else:
        block_ids = pool[num_ctx_blocks // 2:num_ctx_blocks // 2 + num_ctx_blocks]
    nbytes = num_ctx_blocks * arena.bytes_per_block
    clock = Clock(device == "cuda")
    base = {"model": model, "context_tokens": context_tokens, "order": order, "num_blocks": num_ctx_blocks,
            "num_planes": len(arena.planes), "plane_bytes": arena.plane_nbytes[0], "bytes": nbytes}
    rows = []

    def row(path: str, fn, check: bool, **extra) -> None:
        for t in kv.values():
            t.zero_()
        try:
            figures = clock.medians(fn, warmups, repeats)
        except Exception as e:  # a path that cannot run is reported, never allowed to end the probe
            rows.append({**base, "path": path, "error": f"{type(e).__name__}: {e}"[:300], **extra})
            return
        equal = bool(arena.read_back(block_ids).equal(arena.extent(0, num_ctx_blocks))) if check else None
        rows.append({**base, "path": path, **figures, "equal": equal, **extra})

    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src = arena.buffer[:nbytes]
    row("floor", lambda: dst.copy_(src), check=False)

    def via_arena(scatter, graphs=None):
        def fn():
            arena.scatter, arena.graphs = scatter, graphs
            arena.copy_into_vllm(0, 0, block_ids, RestoreTimeline("restore", "bench", 0, "buffer", len(block_ids),
                                                                  nbytes, device))
        return fn

    default, default_graphs = arena.scatter, arena.graphs
    row("torch", via_arena(None), check=True)
    if default_graphs is not None:  # the default kernel, queued by one replay of a captured graph
        row("graph", via_arena(default, default_graphs), check=True, launch_route="graph")
    if default is not None or fused_ok:
        seen = set()
        for chunk in CHUNKS:
            s = RowScatter(arena.buffer.view(arena.planes[0].dtype), arena.planes, chunk)
            if s.chunk_words in seen:
                continue  # a plane smaller than the chunk: the same kernel as a smaller chunk
            seen.add(s.chunk_words)
            s.warmup()
            row("fused", via_arena(s), check=True, chunk_bytes=s.chunk_words * s.word_bytes, num_warps=s.num_warps,
                vec_bytes=s.line_bytes, launch_route=s.launch_route)
            if s.launch_route == "handle":  # the same kernel through Triton's dispatcher: what the handle saves
                handle, s._handle = s._handle, None
                row("fused-jit", via_arena(s), check=True, chunk_bytes=s.chunk_words * s.word_bytes,
                    num_warps=s.num_warps, vec_bytes=s.line_bytes, launch_route="jit (forced)")
                s._handle = handle
        if device == "cuda":
            rows.append({**base, "path": "host-parts", **host_parts(arena.scatter or s, block_ids, repeats)})
    else:
        why = arena.copy_route if device == "cuda" else "the kernel runs on CPU only with TRITON_INTERPRET=1"
        rows.append({**base, "path": "fused", "error": why})
    return rows  # the tensors go with this frame; the caller empties CUDA's cache


def host_parts(scatter, block_ids: list[int], repeats: int) -> dict:
    """Wall time (us, medians) of each host part of one fused restore call, the GPU synchronized
    between calls: the ids to the device, the launch through the handle, through the dispatcher."""
    import torch

    def median_us(fn) -> float:
        runs = []
        for _ in range(repeats + 3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(runs[3:])

    args = scatter.prepare(0, block_ids)
    grid = scatter.grid(len(block_ids))
    out = {"ids_us": median_us(lambda: scatter.prepare(0, block_ids)),
           "event_us": median_us(lambda: torch.cuda.Event(enable_timing=True).record())}
    if scatter._handle is not None:
        out["launch_handle_us"] = median_us(lambda: scatter._handle[grid](*scatter._args(args, 0)))
    from kmesh_lib.kv.fused_copy import _kernel

    out["launch_jit_us"] = median_us(lambda: _kernel()[grid](*scatter._args(args, 0)[:6], **scatter._options))
    return out


def table(rows: list[dict]) -> str:
    floors = {(r["model"], r["context_tokens"], r["order"]): r for r in rows if r["path"] == "floor"}
    head = (f"{'model':<13} {'tokens':>6} {'MiB':>7} {'ids':<11} {'path':<11} {'idle ms':>8} {'queued ms':>9} "
            f"{'x floor':>7} {'host us':>8}  equal")
    lines = [head, "-" * len(head)]
    for r in rows:
        name = r["path"] + (f"/{r['chunk_bytes'] >> 10}K" if "chunk_bytes" in r else "")
        prefix = f"{r['model']:<13} {r['context_tokens']:>6} {r['bytes'] / (1 << 20):>7.1f} {r['order']:<11} {name:<11}"
        if "error" in r:
            lines.append(f"{prefix} n/a: {r['error']}")
            continue
        if r["path"] == "host-parts":
            lines.append(prefix + "  " + ", ".join(f"{k} {v:.0f}" for k, v in r.items() if k.endswith("_us")))
            continue
        f = floors[(r["model"], r["context_tokens"], r["order"])]
        ms = r.get("queued_ms", r["idle_ms"])
        floor_ms = f.get("queued_ms", f["idle_ms"])
        lines.append(f"{prefix} {r['idle_ms']:>8.3f} {r.get('queued_ms', float('nan')):>9.3f} {ms / floor_ms:>7.2f} "
                     f"{r['host_us']:>8.0f}  {'' if r['equal'] is None else r['equal']}")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    import torch

    from kmesh_lib.kv.fused_copy import triton_status

    device = "cuda" if torch.cuda.is_available() else "cpu"
    warmups, repeats = WARMUPS, REPEATS
    if args.smoke or device == "cpu":
        args.models, args.contexts, warmups, repeats = ["tiny"], [256], 1, 3
    # on CPU the kernel runs only in Triton's interpreter: a check of its bytes, not of its speed
    fused_ok = triton_status() is None and (device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    t0 = time.perf_counter()
    env = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
           "triton": _version("triton"), "triton_status": triton_status() or "ok",
           "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1", "warmups": warmups, "repeats": repeats}
    print("gpubuf copy probe: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    rows = []
    for model in args.models:
        for n in args.contexts:
            for order in ("shuffled", "consecutive"):
                rows += measure(model, n, order, device, warmups, repeats, fused_ok)
                if device == "cuda":
                    torch.cuda.empty_cache()
    print("x floor: queued ms / the floor's queued ms (idle ms on CPU); host us: the call's own wall time")
    print(table(rows))
    print(f"probe took {time.perf_counter() - t0:.1f} s", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
        print(f"wrote {args.out}")


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown (CUDA context, Triton's cache threads)
