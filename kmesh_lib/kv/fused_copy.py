"""The restore copy as one kernel launch: buffer rows -> every plane of vLLM's blocks (Triton).

A restore scatters rows: row ``src_row0 + i`` of the buffer, cut at the planes' offsets, goes to row
``block_ids[i]`` of each of vLLM's planes. Done per plane (``index_copy_``) that is one launch per
plane, 48 for Qwen2.5-0.5B, each moving 4 KiB per block: too little per launch to keep the GPU's
copy engines of SMs busy. Here program ``(i, p, c)`` moves chunk ``c`` of plane ``p`` of row ``i``,
and one launch moves them all:

    src  buffer + (src_row0 + i) * row_lines + src_off[p]      (a row holds every plane, in plane order)
    dst  buffer + delta[p] + block_ids[i] * stride[p]           (plane p lives in vLLM's own allocation)

The call's arguments travel as one int32 array on the device, ``[src_row0, n, block_ids...]``, and the
kernel reads the row count from it: its programs step over rows (``i``, ``i + grid``, ...), so one grid
serves any count up to it. The launch route sizes the grid to the restore (one row per program up to
``MAX_PROGRAMS``); a captured graph (``kv.copy_graph``) fixes it once per size bucket.

A launch may cover planes ``[p0, p1)`` only (``p = p0 + program_id(1)``): a group of layers, so the
forward pass can start on the first layers while later groups still copy (``wait_at == "layer"``).

Addresses: the kernel takes one pointer, the buffer, and reaches each plane at a signed offset from
it (``delta``, from ``data_ptr``s), so it needs no int-to-pointer cast, and Triton's interpreter
(``TRITON_INTERPRET=1``, whose pointers are real host addresses) runs the same kernel on CPU tensors.

The table is counted in *lines* of ``line_bytes``, the widest power of two up to 16 that divides every
address, stride, offset and size; the kernel multiplies by ``VEC = line_bytes // word_bytes``, a
constant, so Triton can prove 16-byte alignment and emit 128-bit loads and stores.

Host time: a restore waits for this call's own Python (the GPU is idle before the forward step), so a
call does only what changes per restore. The arguments go through one pinned and one device buffer
made once (no allocator per call), and the kernel is launched through the handle Triton compiled at
``warmup`` (``launch_route == "handle"``), not its JIT dispatcher, which binds and specializes every
argument anew on each call. The handle is checked once, byte for byte, by a copy into vLLM's null block
(block 0, which no request reads); if it fails, calls go through the dispatcher (``"jit"``, and why).

Invariants: the planes and the buffer never move (vLLM allocates its KV once; the buffer is one
allocation made once), so the table is built once per arena; only the arguments travel per call. The
argument buffers are reused: a call waits until the previous call's transfer has left the pinned buffer
(an event, long done when restores are a forward step apart), and every call queues on the stream its
predecessor used, so the device arguments are not overwritten under a kernel still reading them.
"""
from __future__ import annotations

import functools
import struct

import torch

from kmesh_lib.kv.cuda_streams import current_stream

assert struct.calcsize("i") == 4  # block ids travel as int32
CHUNK_BYTES = 16 << 10  # the most one program moves: a 16 KiB plane (Qwen2.5-7B) in one program
BYTES_PER_THREAD = 64  # four 16-byte vectors in flight per thread
MAX_PROGRAMS = 1 << 16  # per launch; beyond it each program copies several rows (a 32k-token restore of 7B: 2)
NUM_HEADER = 2  # the arguments' array: src_row0, n, then the block ids


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
        self.buffer, self.planes = buffer_words, planes
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
        max_ids = max(p.shape[0] for p in planes)  # a restore fills at most every block of the pool
        self.max_rows = max_ids
        self._args_host = torch.empty(NUM_HEADER + max_ids, dtype=torch.int32, pin_memory=self.pin)
        self._args_host_view = memoryview(self._args_host.numpy()).cast("B")
        self._args_dev = torch.empty(NUM_HEADER + max_ids, dtype=torch.int32, device=buffer_words.device)
        self._args_sent = None  # CUDA event: the last argument transfer has read the pinned buffer
        self._stream = None  # the stream of the last call (the argument buffers are ordered on it)
        self._handle = None  # Triton's compiled kernel, once ``warmup`` has checked it
        self.launch_route = "jit (not warmed up)"

    def grid(self, num_rows: int, planes: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """The launch grid for ``num_rows`` rows of planes ``[p0, p1)`` (all by default): one program
        per row, plane and chunk, at most ``MAX_PROGRAMS`` (then each program steps over rows)."""
        p0, p1 = planes or (0, self.num_planes)
        per_row = (p1 - p0) * self.num_chunks
        return (max(1, min(num_rows, MAX_PROGRAMS // per_row)), p1 - p0, self.num_chunks)

    def _args(self, args: torch.Tensor, plane0: int = 0) -> tuple:
        """Every kernel argument in signature order, the constexprs included (the handle takes them all;
        the dispatcher takes the first six and ``_options``)."""
        return (self.buffer, self.table, args, plane0, self.row_lines, self.num_planes, self.vec, self.chunk_words,
                self.even)

    @property
    def _options(self) -> dict:
        """The constexprs and launch options, by name, as Triton's dispatcher takes them."""
        return {"VEC": self.vec, "CHUNK": self.chunk_words, "EVEN": self.even, "num_warps": self.num_warps}

    def warmup(self) -> None:
        """Compiles the kernel now (the first restore's copy span must not hold Triton's JIT) and, on
        CUDA, checks the compiled handle with one row (row 1) copied into vLLM's null block."""
        # row 1 (a non-zero source row: src_row0 is the one argument that changes per call) -> block 0
        src_row = 1 if self.buffer.numel() >= 2 * self.row_lines * (self.line_bytes // self.word_bytes) else 0
        args = self.prepare(src_row, [0])
        kernel = _kernel()
        handle = kernel.warmup(*self._args(args)[:6], **self._options, grid=(1, 1, 1))
        if not self.buffer.is_cuda:
            self.launch_route = "jit (Triton's interpreter)"
            return
        try:
            handle[self.grid(1)](*self._args(args))
            current_stream().synchronize()
            if not self.row_landed(src_row, 0):
                raise RuntimeError(f"the compiled handle's copy into block 0 differs from buffer row {src_row}")
        except Exception as e:  # an API change in Triton must cost launch time, never bytes
            self.launch_route = f"jit (compiled handle unusable: {type(e).__name__}: {e})"[:300]
            return
        self._handle, self.launch_route = handle, "handle"

    def unlike_row(self, src_row: int, block_id: int) -> None:
        """Block ``block_id`` of every plane := the complement of buffer row ``src_row``'s slice of it, every bit
        flipped; the buffer is not touched (it may hold a stored context). A copy checked after this
        (``row_landed``) is known to have run, not to have found the bytes in place."""
        lw = self.line_bytes // self.word_bytes
        row = self.buffer[src_row * self.row_lines * lw:(src_row + 1) * self.row_lines * lw]
        table = self.table.view(4, self.num_planes).tolist()
        for p, plane in enumerate(self.planes):
            off, size = table[2][p] * lw, table[3][p] * lw
            plane[block_id, :size].view(torch.uint8).copy_(torch.bitwise_not(row[off:off + size].view(torch.uint8)))

    def row_landed(self, src_row: int, block_id: int) -> bool:
        """Whether block ``block_id`` of every plane holds buffer row ``src_row``'s slice of it."""
        lw = self.line_bytes // self.word_bytes
        row = self.buffer[src_row * self.row_lines * lw:(src_row + 1) * self.row_lines * lw]
        table = self.table.view(4, self.num_planes).tolist()
        for p, plane in enumerate(self.planes):
            off, size = table[2][p] * lw, table[3][p] * lw
            if not torch.equal(plane[block_id, :size], row[off:off + size]):
                return False
        return True

    def prepare(self, src_row0: int, block_ids: list[int], packed: bytes | None = None) -> torch.Tensor:
        """Everything of a call before its launch: the stream check and the arguments on the device,
        through the reused pinned buffer, without waiting on CUDA unless the previous call's transfer
        has not left it yet (or the previous kernel, on another stream, may still read the device copy)."""
        n = len(block_ids)
        if self.pin:
            stream = current_stream()
            if self._stream is not None and stream != self._stream:
                self._stream.synchronize()
            self._stream = stream
            if self._args_sent is not None:
                self._args_sent.synchronize()
        write_args(self._args_host_view, src_row0, block_ids, packed)
        if not self.pin:
            return self._args_host[:NUM_HEADER + n].clone()  # CPU (the interpreter): a copy a later call cannot overwrite
        args = self._args_dev[:NUM_HEADER + n]
        args.copy_(self._args_host[:NUM_HEADER + n], non_blocking=True)
        if self._args_sent is None:
            self._args_sent = torch.cuda.Event()  # one event, recorded anew per call (it was waited on above)
        self._args_sent.record(stream)  # record() alone would ask torch for the stream
        return args

    def launch(self, args: torch.Tensor, num_rows: int, planes: tuple[int, int] | None = None) -> None:
        """Queues the copy that ``args`` (from ``prepare``, ``num_rows`` rows; or a graph's device
        arguments) describes, of every plane or of planes ``[p0, p1)`` only (a group of layers,
        ``BufferArena.copy_into_vllm``). ``num_rows`` sizes the grid; the kernel reads the count itself."""
        p0, p1 = planes or (0, self.num_planes)
        if num_rows == 0 or p1 <= p0:
            return
        grid = self.grid(num_rows, (p0, p1))
        if self._handle is not None:
            self._handle[grid](*self._args(args, p0))
        else:
            _kernel()[grid](*self._args(args, p0)[:6], **self._options)

    def __call__(self, src_row0: int, block_ids: list[int]) -> None:
        """Queues buffer rows ``src_row0 ...`` -> vLLM blocks ``block_ids`` on the current stream."""
        self.launch(self.prepare(src_row0, block_ids), len(block_ids))


@functools.lru_cache(maxsize=64)
def _ids_struct(num_rows: int) -> struct.Struct:
    return struct.Struct(f"{num_rows}i")


_HEADER = struct.Struct(f"{NUM_HEADER}i")


def pack_ids(block_ids: list[int], first: int = 0, num: int | None = None) -> bytes:
    """``block_ids[first:first + num]`` (default: all) as the kernel reads them (int32), for ``write_args``:
    packed where the ids were just read (the connector's scheduler side, ``HostStagedGpuBuffer._fill_block_ids``),
    the ints' objects are in the host's caches; at the copy, later in the engine's step, packing them cost the
    H200 machine's host 55 us for 1,024 ids (median, section 21 at b1ac585).

    The whole list is packed and the bytes cut, rather than the list sliced and the slice packed: each pass
    over the ints' objects costs a cache miss per object on a host the step has just evicted, and the slice
    is one more (section 21 at 132e979 on the H200: 31-38 us for slice and pack at 16k and 32k tokens; this
    project's CPU machine, the ints touched once just before as the connector's copy of the scheduler output
    touches them: 31.6 us slice and pack, 19.1 us pack and cut, for 1,024 of 1,030 ids)."""
    packed = _ids_struct(len(block_ids)).pack(*block_ids)
    if first == 0 and (num is None or num == len(block_ids)):
        return packed
    return packed[4 * first:4 * (first + (len(block_ids) - first if num is None else num))]


def write_args(view: memoryview, src_row0: int, block_ids: list[int], packed: bytes | None = None) -> None:
    """The kernel's arguments into a byte ``view`` (of a pinned buffer): int32 ``[src_row0, n, ids...]``;
    ``packed``: the ids already packed (``pack_ids``), copied in as bytes.

    NOTE: a compiled ``struct.Struct`` packs a list of ints about twice as fast as ``array("i", ids)``
    copied into a memoryview (1,024 ids on this project's CPU machine: 6 vs 14 us; the array route took
    36 us on the H200 machine's host; torch.tensor is slower still), and a restore waits for it."""
    _HEADER.pack_into(view, 0, src_row0, len(block_ids))
    if packed is None:
        _ids_struct(len(block_ids)).pack_into(view, _HEADER.size, *block_ids)
    else:
        view[_HEADER.size:_HEADER.size + len(packed)] = packed


_KERNEL = None


def _kernel():
    """The Triton kernel, defined on first use: ``triton.jit`` reads TRITON_INTERPRET when it runs."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    # plane0 changes per launch (a layer group): specializing on it (==1, multiple of 16) would compile anew
    @triton.jit(do_not_specialize=["plane0"])
    def scatter_rows(buf_ptr, table_ptr, args_ptr, plane0, row_lines, num_planes,
                     VEC: tl.constexpr, CHUNK: tl.constexpr, EVEN: tl.constexpr):
        p = plane0 + tl.program_id(1)
        c = tl.program_id(2)
        src_row0 = tl.load(args_ptr).to(tl.int64)
        num_rows = tl.load(args_ptr + 1)
        # the table is in lines; * VEC (a constant) tells Triton every offset is line-aligned
        delta = tl.load(table_ptr + p) * VEC
        stride = tl.load(table_ptr + num_planes + p) * VEC
        src_off = tl.load(table_ptr + 2 * num_planes + p) * VEC
        offs = c * CHUNK + tl.arange(0, CHUNK)
        for i in range(tl.program_id(0), num_rows, tl.num_programs(0)):
            block_id = tl.load(args_ptr + 2 + i).to(tl.int64)
            src = buf_ptr + ((src_row0 + i) * row_lines * VEC + src_off) + offs
            dst = buf_ptr + (delta + block_id * stride) + offs
            if EVEN:
                tl.store(dst, tl.load(src))
            else:
                size = tl.load(table_ptr + 3 * num_planes + p) * VEC
                mask = offs < size
                tl.store(dst, tl.load(src, mask=mask), mask=mask)

    _KERNEL = scatter_rows
    return _KERNEL
