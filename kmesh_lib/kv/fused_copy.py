"""The restore copy as one kernel launch: buffer rows -> every plane of vLLM's blocks (Triton).

A restore scatters rows: row ``src_row0 + i`` of the buffer, cut at the planes' offsets, goes to row
``block_ids[i]`` of each of vLLM's planes. Done per plane (``index_copy_``) that is one launch per
plane, 48 for Qwen2.5-0.5B, each moving 4 KiB per block: too little per launch to keep the GPU's
copy engines of SMs busy. Here program ``(i, p, c)`` moves chunk ``c`` of plane ``p`` of row ``i``,
and one launch moves them all:

    src  buffer + (src_row0 + i) * row_lines + src_off[p]      (a row holds every plane, in plane order)
    dst  buffer + delta[p] + block_ids[i] * stride[p]           (plane p lives in vLLM's own allocation)

Addresses: the kernel takes one pointer, the buffer, and reaches each plane at a signed offset from
it (``delta``, from ``data_ptr``s), so it needs no int-to-pointer cast, and Triton's interpreter
(``TRITON_INTERPRET=1``, whose pointers are real host addresses) runs the same kernel on CPU tensors.

The table is counted in *lines* of ``line_bytes``, the widest power of two up to 16 that divides every
address, stride, offset and size; the kernel multiplies by ``VEC = line_bytes // word_bytes``, a
constant, so Triton can prove 16-byte alignment and emit 128-bit loads and stores.

Invariant: the planes and the buffer never move (vLLM allocates its KV once; the buffer is one
allocation made once), so the table is built once per arena; only the block ids travel per call.
"""
from __future__ import annotations

from array import array

import torch

assert array("i").itemsize == 4  # block ids travel as int32
CHUNK_BYTES = 16 << 10  # the most one program moves: a 16 KiB plane (Qwen2.5-7B) in one program
BYTES_PER_THREAD = 64  # four 16-byte vectors in flight per thread


def triton_status() -> str | None:
    """None when Triton imports, else why not (the torch path is used then)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # ImportError, or a broken install that fails on import
        return f"triton not importable: {type(e).__name__}: {e}"
    return None


def _pow2_divisor(values: list[int], cap: int) -> int:
    """The largest power of two <= ``cap`` dividing every value."""
    d = cap
    while d > 1 and any(v % d for v in values):
        d //= 2
    return d


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class RowScatter:
    """Copies buffer rows into vLLM's planes with one Triton launch per restore.

    Args:
        buffer_words: the buffer as one flat tensor of the planes' word dtype (``BufferArena``).
        planes: vLLM's planes, ``(num_gpu_blocks, words)`` views, in buffer-row order.
        chunk_bytes: the most one program moves (a power of two); a plane larger than it is split.

    Raises:
        ValueError: a plane's address is not a whole number of words away from the buffer's.
    """

    def __init__(self, buffer_words: torch.Tensor, planes: list[torch.Tensor], chunk_bytes: int = CHUNK_BYTES) -> None:
        assert chunk_bytes & (chunk_bytes - 1) == 0, "chunk_bytes must be a power of two"
        self.buffer = buffer_words
        self.word_bytes = buffer_words.element_size()
        assert all(p.dtype == buffer_words.dtype and p.stride(1) == 1 for p in planes)
        wb = self.word_bytes
        plane_bytes = [p.shape[1] * wb for p in planes]
        strides = [p.stride(0) * wb for p in planes]
        offsets = [sum(plane_bytes[:k]) for k in range(len(planes))]
        row_bytes = sum(plane_bytes)
        addrs = [buffer_words.data_ptr()] + [p.data_ptr() for p in planes]
        if any(a % wb for a in addrs):
            raise ValueError(f"a plane or the buffer does not start on a {wb}-byte word")
        self.line_bytes = max(wb, _pow2_divisor(addrs + plane_bytes + strides + offsets + [row_bytes], 16))
        self.vec = self.line_bytes // wb
        lb = self.line_bytes
        self.row_lines = row_bytes // lb
        base = buffer_words.data_ptr()
        # rows: delta, stride, src_off, size (all in lines); planes along the columns
        table = [[(a - base) // lb for a in addrs[1:]], [s // lb for s in strides], [o // lb for o in offsets],
                 [n // lb for n in plane_bytes]]
        self.table = torch.tensor(table, dtype=torch.int64).flatten().to(buffer_words.device)
        self.num_planes = len(planes)
        self.chunk_words = min(_next_pow2(max(plane_bytes) // wb), chunk_bytes // wb)
        self.num_chunks = -(-max(plane_bytes) // (self.chunk_words * wb))
        # unmasked when every plane is a whole number of chunks: no plane ends inside a program
        self.even = all(n % (self.chunk_words * wb) == 0 for n in plane_bytes) and len(set(plane_bytes)) == 1
        self.num_warps = max(1, min(16, self.chunk_words * wb // (32 * BYTES_PER_THREAD)))
        self.pin = buffer_words.is_cuda

    def warmup(self) -> None:
        """Compiles the kernel now, so the first restore's copy span does not hold Triton's JIT."""
        ids = self.block_ids_tensor([0])
        _kernel().warmup(self.buffer, self.table, ids, 0, self.row_lines, self.num_planes, VEC=self.vec,
                         CHUNK=self.chunk_words, EVEN=self.even, num_warps=self.num_warps, grid=(1, 1, 1))

    def block_ids_tensor(self, block_ids: list[int]) -> torch.Tensor:
        """The block ids on the buffer's device, through pinned memory without waiting on CUDA (the
        caching host allocator keeps the pinned copy alive until the transfer has read it)."""
        if not block_ids:
            return torch.empty(0, dtype=torch.int32, device=self.buffer.device)
        # NOTE: array -> frombuffer takes ~25 us for 2,032 ids where torch.tensor(list) takes ~80 us
        host = torch.frombuffer(array("i", block_ids), dtype=torch.int32)
        if not self.pin:
            return host.clone()  # frombuffer shares the array's memory, which dies with this frame
        pinned = torch.empty(len(block_ids), dtype=torch.int32, pin_memory=True)
        pinned.copy_(host)
        return pinned.to(self.buffer.device, non_blocking=True)

    def __call__(self, src_row0: int, block_ids: list[int] | torch.Tensor) -> None:
        """Queues buffer rows ``src_row0 ...`` -> vLLM blocks ``block_ids`` on the current stream."""
        ids = block_ids if isinstance(block_ids, torch.Tensor) else self.block_ids_tensor(block_ids)
        if ids.numel() == 0:
            return
        grid = (ids.numel(), self.num_planes, self.num_chunks)
        _kernel()[grid](self.buffer, self.table, ids, src_row0, self.row_lines, self.num_planes,
                        VEC=self.vec, CHUNK=self.chunk_words, EVEN=self.even, num_warps=self.num_warps)


_KERNEL = None


def _kernel():
    """The Triton kernel, defined on first use: ``triton.jit`` reads TRITON_INTERPRET when it runs."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    # src_row0 changes every restore: specializing on it (==1, multiple of 16) would compile anew
    @triton.jit(do_not_specialize=["src_row0"])
    def scatter_rows(buf_ptr, table_ptr, ids_ptr, src_row0, row_lines, num_planes,
                     VEC: tl.constexpr, CHUNK: tl.constexpr, EVEN: tl.constexpr):
        i = tl.program_id(0)
        p = tl.program_id(1)
        c = tl.program_id(2)
        # the table is in lines; * VEC (a constant) tells Triton every offset is line-aligned
        delta = tl.load(table_ptr + p) * VEC
        stride = tl.load(table_ptr + num_planes + p) * VEC
        src_off = tl.load(table_ptr + 2 * num_planes + p) * VEC
        block_id = tl.load(ids_ptr + i).to(tl.int64)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        src = buf_ptr + ((src_row0 + i).to(tl.int64) * row_lines * VEC + src_off) + offs
        dst = buf_ptr + (delta + block_id * stride) + offs
        if EVEN:
            tl.store(dst, tl.load(src))
        else:
            n = tl.load(table_ptr + 3 * num_planes + p) * VEC
            mask = offs < n
            tl.store(dst, tl.load(src, mask=mask), mask=mask)

    _KERNEL = scatter_rows
    return _KERNEL
