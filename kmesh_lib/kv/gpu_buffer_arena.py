"""Worker side of the host-staged GPU buffer: vLLM's KV as block planes, the buffer, and the copies.

vLLM hands the connector one KV tensor per attention layer (``register_kv_caches``). Whatever the
backend's logical shape, the bytes of one vLLM block in one layer form one or more *planes*: views
``(num_gpu_blocks, nbytes)`` whose row is one block's bytes (FlashAttention on CUDA stores a block's
K and V together, so a layer is one plane; a layout with all K blocks before all V blocks gives two).
``block_planes`` finds them from the tensor's strides, the way vLLM's own offloading connector views
a layer as ``(num_blocks, page_size_bytes)``.

The buffer is ONE allocation on vLLM's device, outside vLLM's block pool, of ``num_buffer_blocks``
rows of ``bytes_per_block`` bytes; a row holds every plane of one block, in plane order:

    buffer row  | layer 0 plane(s) | layer 1 plane(s) | ... |      (bytes_per_block)
    disk file   the entry's rows in block order, padded to 4 KiB: the same image as its extent

Routes (on vLLM's current stream, so the forward pass that follows sees finished copies; a restore
copied by layer groups runs on a side stream instead, ``copy_into_vllm``):
    save     vLLM blocks -> device gather -> pinned host chunk -> O_DIRECT write
    stage    O_DIRECT read into a pinned host chunk -> host-to-device copy into the entry's extent;
             two chunks in flight, so the disk read of chunk i+1 overlaps the copy of chunk i
    restore  extent rows -> vLLM's blocks, device to device: one Triton launch for every plane and
             block (``fused_copy``) on CUDA, queued by one replay of a captured graph (``copy_graph``),
             else one torch copy per plane and block run
On the CPU build the "device" is host memory: the same code with plain memcpys and CPU stamps.

Layer groups (``layer_groups``): a restore copied ``by_layer`` is one launch per group of consecutive
layers, 1, 4, 16, ... layers each (the last takes the rest; ``GpuBufferConfig.layer_group_growth``), on
a side stream, with an event after each group: the forward pass's layer k needs only its own group,
so it waits for a small first group and the later ones copy while the first layers compute.

Invariant: a read or write that returns short raises ``OSError`` (never a silent partial copy);
every file is written and read with O_DIRECT, so rereads come from the disk, not the page cache.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path

import torch

from kmesh_lib.kv.copy_graph import CopyGraphs
from kmesh_lib.kv.cuda_streams import EventPool, current_stream, narrowest_reference, on_stream, stream_reference
from kmesh_lib.kv.fused_copy import RowScatter, triton_status
from kmesh_lib.kv.gpu_buffer import LAYER_GROUP_GROWTH, check_layer_group_growth, entry_path
from kmesh_lib.kv.id_pack import IdRange
from kmesh_lib.kv.restore_timeline import RestoreTimeline, Span

logger = logging.getLogger(__name__)
ALIGN = 4096  # O_DIRECT: buffer address, file offset and length
_ns = time.monotonic_ns


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def block_dim(shape, num_blocks: int) -> int:
    """The dimension of a KV tensor that indexes vLLM blocks (dim 1 for (2, num_blocks, ...) layouts)."""
    dims = [d for d, size in enumerate(shape) if size == num_blocks]
    if not dims:
        raise ValueError(f"no dimension of a KV tensor of shape {tuple(shape)} has num_blocks={num_blocks}")
    if len(dims) > 1 and 1 in dims and shape[0] == 2:
        return 1
    return dims[0]


def block_planes(kv: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
    """``(num_blocks, nbytes)`` uint8 views of ``kv``, one per physically contiguous part of a block.

    Dimensions with a larger stride than the block dimension lie outside a block (each index of them
    is a plane); the others lie inside, and must form one contiguous run of bytes per block.
    """
    bd = block_dim(kv.shape, num_blocks)
    stride = kv.stride(bd)
    outer = [d for d in range(kv.ndim) if d != bd and kv.stride(d) > stride and kv.shape[d] > 1]
    inner = sorted((d for d in range(kv.ndim) if d != bd and d not in outer), key=lambda d: -kv.stride(d))
    t = kv.permute(*outer, bd, *inner)
    planes = []
    for idx in _product([kv.shape[d] for d in outer]):
        p = t[idx] if idx else t
        if not p[0].is_contiguous():
            raise ValueError(f"a block of a KV tensor of shape {tuple(kv.shape)} and strides {kv.stride()} "
                             "is not one contiguous run of bytes")
        planes.append(p.view(num_blocks, -1).view(torch.uint8))  # view: raises rather than copy
    return planes


def layer_groups(num_layers: int, growth: int = LAYER_GROUP_GROWTH) -> list[tuple[int, int]]:
    """``[start, end)`` layer ranges of sizes 1, ``growth``, ``growth**2``, ... (a group that another of
    its size would not fit after takes the rest): a small first group, the only one the forward pass
    waits for in full when copies outrun its layers, and few launches. Each group must be copied before
    the forward pass reaches its first layer: a larger ``growth`` means fewer launches and waits (host
    time) and less slack."""
    check_layer_group_growth(growth)
    groups, start, size = [], 0, 1
    while start < num_layers:
        end = num_layers if start + 2 * size > num_layers else start + size
        groups.append((start, end))
        start, size = end, growth * size
    return groups


def _product(sizes: list[int]):
    if not sizes:
        yield ()
        return
    for i in range(sizes[0]):
        for rest in _product(sizes[1:]):
            yield (i, *rest)


def _word_dtype(nbytes_list: list[int], tensors: list[torch.Tensor]):
    """The widest integer type every plane size, row stride and offset is a multiple of (fewer elements to copy)."""
    for width, dtype in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if all(n % width == 0 for n in nbytes_list) and all(
                t.stride(0) % width == 0 and t.storage_offset() % width == 0 for t in tensors):
            return width, dtype
    return 1, torch.uint8


def aligned_host(nbytes: int, pin: bool) -> torch.Tensor:
    """A host uint8 tensor whose data starts on a 4 KiB boundary (pinned when ``pin``)."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    off = (-raw.data_ptr()) % ALIGN
    return raw[off:off + nbytes]


def _runs(block_ids: list[int]) -> list[tuple[int, int, int]]:
    """(position in block_ids, first block id, length) of each run of consecutive block ids."""
    runs, i = [], 0
    while i < len(block_ids):
        j = i
        while j + 1 < len(block_ids) and block_ids[j + 1] == block_ids[j] + 1:
            j += 1
        runs.append((i, block_ids[i], j - i + 1))
        i = j + 1
    return runs


class _Stager:
    """Pinned host chunks and their in-flight copies; one per thread that stages (never shared)."""

    def __init__(self, chunk_bytes: int, pin: bool, num_slots: int = 2) -> None:
        self.slots = [aligned_host(chunk_bytes, pin) for _ in range(num_slots)]
        self.views = [memoryview(s.numpy()) for s in self.slots]
        self.done = [None] * num_slots  # CUDA event of the last copy out of each slot


class BufferArena:
    """The buffer's one allocation and every copy into, out of and between it.

    Args:
        kv_caches: vLLM's per-layer KV tensors (``register_kv_caches``), in layer order.
        num_gpu_blocks: vLLM's pool size (the tensors' block dimension).
        num_buffer_blocks: buffer capacity in blocks; the scheduler side allocates extents in it.
        disk_dir: the disk tier's directory (one file per entry).
        chunk_bytes: bytes per O_DIRECT read or write (a multiple of 4 KiB is used).
        layer_group_growth: the layer groups' growth factor (``layer_groups``).
        copy_graphs: capture the restore copies as CUDA graphs (``copy_graph``) where they can be.
    """

    def __init__(self, kv_caches: dict, num_gpu_blocks: int, num_buffer_blocks: int, disk_dir: Path,
                 chunk_bytes: int = 16 << 20, layer_group_growth: int = LAYER_GROUP_GROWTH,
                 copy_graphs: bool = True) -> None:
        planes_of = {name: block_planes(kv, num_gpu_blocks) for name, kv in kv_caches.items()}
        planes = [p for layer in planes_of.values() for p in layer]
        # the copy's layer groups: [p0, p1) planes each, and which group each layer's name reads from
        first_plane, names = [0], list(planes_of)
        for layer in planes_of.values():
            first_plane.append(first_plane[-1] + len(layer))
        self.layer_groups = layer_groups(len(names), layer_group_growth)
        self.plane_groups = [(first_plane[a], first_plane[b]) for a, b in self.layer_groups]
        self.group_of = {name: g for g, (a, b) in enumerate(self.layer_groups) for name in names[a:b]}
        self.plane_nbytes = [p.shape[1] for p in planes]
        self.bytes_per_block = sum(self.plane_nbytes)
        self.word_bytes, dtype = _word_dtype(self.plane_nbytes + [self.bytes_per_block], planes)
        self.planes = [p.view(dtype) for p in planes]
        self.device = planes[0].device
        self.device_name = str(self.device)  # each restore's timeline records it
        self.is_cuda = self.device.type == "cuda"
        self.num_buffer_blocks = num_buffer_blocks
        self.buffer = torch.zeros(num_buffer_blocks * self.bytes_per_block, dtype=torch.uint8, device=self.device)
        self.buffer_blocks = self.buffer.view(num_buffer_blocks, self.bytes_per_block)
        offsets = [0]
        for n in self.plane_nbytes:
            offsets.append(offsets[-1] + n)
        self.buffer_planes = [self.buffer_blocks[:, a:b].view(dtype) for a, b in zip(offsets, offsets[1:])]
        self.disk_dir = Path(disk_dir)
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        step = ALIGN // math.gcd(self.bytes_per_block, ALIGN)  # blocks per 4 KiB-aligned run
        self.blocks_per_chunk = max(step, chunk_bytes // self.bytes_per_block // step * step)
        self.chunk_bytes = _round_up(self.blocks_per_chunk * self.bytes_per_block, ALIGN)
        self._stagers: dict[int, _Stager] = {}
        self.lock = threading.Lock()
        self.counters = {"read_bytes": 0, "reads": 0, "write_bytes": 0, "writes": 0, "write_errors": 0,
                         "staged_bytes": 0, "restored_bytes": 0}
        self.last_read_event = None  # every restore queued so far has read its extent (its copy's stream)
        self.last_read_stream = None  # the stream that event is on
        self._side_stream = None  # restores copied by layer groups (``copy_into_vllm(by_layer=True)``)
        self.step_events = EventPool()  # a step's clock reference and forward-pass event (``event``)
        self.standing_reference = None  # taken before a step (``keep_reference``), for its restores
        self.last_kept_reference = None  # the last one ``keep_reference`` took (``reference_drift``), or the disk
        # restore's that replaced it (``_reference_after_read``): the one that restore's events went on the clock by
        self.last_kept_reference_at: str | None = None  # which: "before_step" or "after_read"
        self.scatter, self.copy_route = self._fused_scatter(dtype)
        self.graphs, self.graph_route = self._copy_graphs(copy_graphs)

    def _copy_graphs(self, wanted: bool) -> tuple[CopyGraphs | None, str]:
        """Captured restore copies (``copy_graph``) where the fused kernel's compiled handle runs, else
        None and why (restores take the launch route then)."""
        if not wanted:
            return None, "off (copy_graphs=False)"
        if self.scatter is None or self.scatter.launch_route != "handle":
            return None, f"off (no compiled fused copy: {self.copy_route})"
        try:
            graphs = CopyGraphs(self.scatter, {"whole": [(0, len(self.planes))], "layer": self.plane_groups})
        except Exception as e:  # a capture failure must cost launch time, never the restore
            logger.warning("kmesh: restore copies are not captured as CUDA graphs: %s", e)
            return None, f"off (capture failed: {type(e).__name__}: {e})"[:300]
        return graphs, "on"

    def _fused_scatter(self, dtype) -> tuple[RowScatter | None, str]:
        """The one-launch restore copy on CUDA when Triton compiles it, else None and why (the
        per-plane torch copies are used then; ``copy_route`` says which ran)."""
        if not self.is_cuda:
            return None, "torch (no CUDA device)"
        why = triton_status()
        if why is not None:
            return None, f"torch ({why})"
        try:
            scatter = RowScatter(self.buffer.view(dtype), self.planes)
            scatter.warmup()
        except Exception as e:  # a compile error must cost speed, never the restore
            logger.warning("kmesh: fused restore copy unavailable, using per-plane copies: %s", e)
            return None, f"torch (fused copy failed: {type(e).__name__}: {e})"
        return scatter, "fused"

    # -- helpers --
    def path_of(self, entry_id: int) -> Path:
        return entry_path(self.disk_dir, entry_id)

    def _stager(self) -> _Stager:
        key = threading.get_ident()
        if key not in self._stagers:
            self._stagers[key] = _Stager(self.chunk_bytes, pin=self.is_cuda)
        return self._stagers[key]

    def _chunks(self, num_blocks: int):
        for b0 in range(0, num_blocks, self.blocks_per_chunk):
            yield b0, min(self.blocks_per_chunk, num_blocks - b0)

    def event(self, stream=None, holders: list | None = None):
        """A timing event recorded now on ``stream`` (the current one by default); None on CPU. With
        ``holders`` (the step's timelines, filled by the caller) a pooled one (``step_events``)."""
        if not self.is_cuda:
            return None
        ev = self.step_events.take(holders) if holders is not None else torch.cuda.Event(enable_timing=True)
        ev.record(stream or current_stream())  # record(None) would ask torch for the stream (``cuda_streams``)
        return ev

    def _count(self, **delta: int) -> None:
        with self.lock:
            for k, v in delta.items():
                self.counters[k] += v

    def reference(self, stream=None, holders: list | None = None):
        """``stream_reference`` on CUDA; None on CPU (whose stamps are on the clock already). With
        ``holders``, its event is a pooled one, as in ``event``."""
        if not self.is_cuda:
            return None
        return stream_reference(stream, self.step_events.take(holders) if holders is not None else None)

    def keep_reference(self) -> None:
        """Takes a reference now, the device synchronized first (between requests: no step is running), the
        narrowest of a few (``narrowest_reference``), for the next step that queues restores, which then takes
        none of its own (``measure`` 0). No-op on CPU. ``reference_drift`` checks it against a later one."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            self.standing_reference = self.last_kept_reference = narrowest_reference()
            self.last_kept_reference_at = "before_step"

    def reference_drift(self) -> dict | None:
        """The last kept reference against one taken now (the device synchronized; the narrowest of a few):
        the host's elapsed time minus the GPU's (``drift_us``: the clocks' drift over the interval plus the
        difference of the two references' pickup latencies), the interval, the two record calls' windows,
        which reference it was (``reference_at``: "before_step", ``keep_reference``'s, or "after_read", a disk
        restore's that replaced it: ``_reference_after_read``) and the drift per second of the interval
        (``drift_us_per_s``, a rate: about -6 on the H100 of 6 Dec 2026); an unused kept reference is dropped.
        None if none was kept."""
        ref, self.last_kept_reference, self.standing_reference = self.last_kept_reference, None, None
        if ref is None:
            return None
        torch.cuda.synchronize(self.device)
        now = narrowest_reference()
        now[1].synchronize()
        host_ns = now[0] - ref[0]
        gpu_ns = ref[1].elapsed_time(now[1]) * 1e6
        return {"interval_ms": round(host_ns / 1e6, 3), "drift_us": round((host_ns - gpu_ns) / 1e3, 3),
                "windows_us": [round(ref[3] / 1e3, 3), round(now[3] / 1e3, 3)],
                "reference_at": self.last_kept_reference_at,
                "drift_us_per_s": round((host_ns - gpu_ns) / host_ns * 1e6, 3) if host_ns > 0 else None}

    def after_read_reference(self, stream=None):
        """A reference taken in a step, on ``stream`` (the staging copies'), right after a disk restore's last read:
        the narrowest of a few (``narrowest_reference``; that stream is idle by then, its last copy having had a
        chunk's read to finish, else the first waits for it). None on CPU."""
        return narrowest_reference(3, stream or current_stream()) if self.is_cuda else None

    def _reference_after_read(self, timeline: RestoreTimeline, stream=None) -> None:
        """Puts ``timeline``'s events on the clock by ``after_read_reference`` (``reference_at`` "after_read"), its
        host time recorded (``reference_after_read_ns``); where a reference was kept for this step
        (``keep_reference``), this one is kept instead, so ``reference_drift`` checks the reference the restore used.
        No-op where none is taken (CPU)."""
        t0 = _ns()
        ref = self.after_read_reference(stream)
        if ref is None:
            return
        timeline.ref, timeline.reference_at, timeline.t_reference_ns = ref, "after_read", ref[0]
        timeline.reference_window_ns, timeline.measure_synced = ref[3], ref[2]
        timeline.reference_after_read_ns = _ns() - t0
        if self.last_kept_reference is not None:
            self.last_kept_reference, self.last_kept_reference_at = ref, "after_read"

    # -- save: vLLM blocks -> disk --
    def save(self, entry_id: int, block_ids: list[int]) -> int:
        """Writes the KV of ``block_ids`` (in order) to the entry's file; returns the bytes written."""
        stager = self._stager()
        for event in stager.done:  # a staging copy out of this chunk may still be in flight
            if event is not None:
                event.synchronize()
        host, view = stager.slots[0], stager.views[0]
        path = self.path_of(entry_id)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
        written = 0
        try:
            for b0, k in self._chunks(len(block_ids)):
                idx = torch.tensor(block_ids[b0:b0 + k], dtype=torch.long, device=self.device)
                rows = torch.empty(k, self.bytes_per_block, dtype=torch.uint8, device=self.device)
                a = 0
                for plane, n in zip(self.planes, self.plane_nbytes):
                    rows[:, a:a + n].view(plane.dtype).copy_(plane.index_select(0, idx))
                    a += n
                nbytes = k * self.bytes_per_block
                host[:nbytes].copy_(rows.view(-1))  # synchronous: the write below reads it
                padded = _round_up(nbytes, ALIGN)
                host[nbytes:padded].zero_()
                n = os.pwritev(fd, [view[:padded]], b0 * self.bytes_per_block)
                if n != padded:
                    raise OSError(f"short O_DIRECT write to {path}: {n} of {padded} bytes")
                written += nbytes
            os.fsync(fd)
        except Exception:
            self._count(write_errors=1)
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self._count(write_bytes=written, writes=1)
        return written

    # -- stage: disk -> buffer extent --
    @staticmethod
    def _read_chunk(fd: int, path: Path, view: memoryview, padded: int, offset: int) -> None:
        """One chunk's O_DIRECT read: ``padded`` bytes of ``path`` at ``offset`` into ``view``, one read in flight."""
        got = 0
        while got < padded:
            n = os.preadv(fd, [view[got:padded]], offset + got)
            if n <= 0:
                raise OSError(f"short O_DIRECT read of {path}: {got} of {padded} bytes at offset {offset}")
            got += n

    def read_seconds(self, path: Path, nbytes: int) -> float:
        """Seconds to read the first ``nbytes`` of ``path`` as ``stage`` reads an entry, without its copies: O_DIRECT,
        in this arena's chunks (``chunk_bytes``), one read in flight, into this thread's staging slots in turn (pinned
        on CUDA), from the first read's start to the last one's end (``stage``'s ``disk_read``; the open before it).
        The disk floor's own way for this tier (``kv.floors.OwnRead``). Call between steps: it waits for any copy
        still reading a slot first."""
        stager = self._stager()
        for event in stager.done:
            if event is not None:
                event.synchronize()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            t0 = _ns()
            for c, offset in enumerate(range(0, nbytes, self.chunk_bytes)):
                padded = _round_up(min(self.chunk_bytes, nbytes - offset), ALIGN)
                self._read_chunk(fd, path, stager.views[c % len(stager.slots)], padded, offset)
            return (_ns() - t0) / 1e9
        finally:
            os.close(fd)

    def stage(self, entry_id: int, num_blocks: int, extent_start: int, timeline: RestoreTimeline,
              stream=None, reference_after_read: bool = False) -> None:
        """Reads the whole entry into its extent: O_DIRECT chunks into pinned memory, each copied on
        to the buffer while the next is read. Queues the copies on ``stream`` (default: current).

        ``reference_after_read`` (CUDA): once the last chunk is read, before its copy is queued, the restore's events
        go on the clock by a reference taken there (``_reference_after_read``), not by the step's: a reference from
        before a step that reads for a second is over a second old at the restore's copy, and the host's clock and the
        GPU's drift apart by about 6 us a second (H100, 6 Dec 2026)."""
        stager = self._stager()
        path = self.path_of(entry_id)
        chunks = list(self._chunks(num_blocks))
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for c, (b0, k) in enumerate(chunks):
                slot = c % len(stager.slots)
                if stager.done[slot] is not None:
                    stager.done[slot].synchronize()  # the copy out of this chunk has finished
                nbytes = k * self.bytes_per_block
                padded = _round_up(nbytes, ALIGN)
                t0 = _ns()
                self._read_chunk(fd, path, stager.views[slot], padded, b0 * self.bytes_per_block)
                timeline.disk_reads.append(Span().cpu(t0, _ns()))
                if reference_after_read and c == len(chunks) - 1:
                    self._reference_after_read(timeline, stream)
                dst = self.buffer_blocks[extent_start + b0:extent_start + b0 + k].view(-1)
                if self.is_cuda:
                    start = self.event(stream)
                    with on_stream(stream):
                        dst.copy_(stager.slots[slot][:nbytes], non_blocking=True)
                    end = self.event(stream)
                    stager.done[slot] = end
                    timeline.staging.append(Span().gpu(start, end))
                else:
                    t1 = _ns()
                    dst.copy_(stager.slots[slot][:nbytes])
                    timeline.staging.append(Span().cpu(t1, _ns()))
                timeline.disk_bytes += padded
                self._count(read_bytes=padded, reads=1, staged_bytes=nbytes)
        finally:
            os.close(fd)

    # -- restore: buffer extent -> vLLM blocks --
    def copy_into_vllm(self, extent_start: int, first_block: int, block_ids: list[int],
                       timeline: RestoreTimeline, by_layer: bool = False, packed_ids: bytes | None = None,
                       handoff: bool = False) -> list[Span]:
        """Copies extent rows ``first_block ...`` into vLLM's ``block_ids``: on CUDA one captured graph
        replay (``copy_route == "fused"`` and ``graph_route == "on"``), else one fused launch per group
        (Triton), else one copy per plane and run; ``timeline.copy_launch`` records which.

        ``packed_ids``: ``block_ids`` packed already (``fused_copy.pack_ids``), for the kernel's arguments.
        ``by_layer``: one launch per layer group (``plane_groups``), on a side stream, which first waits
        for everything queued on the current one where that holds this copy's inputs (staging, the
        launch route's arguments); returns each group's end, a point ``Span`` (a CPU stamp on the CPU
        build, where the copies are done on return), for the forward pass to wait on layer by layer
        (``HostStagedGpuBuffer.wait_for_layer_load``). Else returns []: the copy is on the current
        stream, ahead of the forward pass. Without staging the side stream does not wait: the
        destination blocks are this step's allocation, which no queued work reads or writes.
        ``handoff`` (with ``by_layer``, on the graph route): the graph's launch is made by the launch thread
        (``kv.launch_thread``); ``timeline.launch_ticket`` names it, and every user of the copy's events waits
        for it first (``await_launches``)."""
        timeline.t_copy_call_ns = _ns()
        src0 = extent_start + first_block
        stream = (self._side() if by_layer else current_stream()) if self.is_cuda else None
        inst = None
        if self.graphs is not None:
            if by_layer and timeline.staging:
                stream.wait_stream(current_stream())
            inst = self.graphs.replay("layer" if by_layer else "whole", src0, block_ids, stream, packed=packed_ids,
                                      handoff=handoff and by_layer)
        if inst is not None:
            start, marks, timeline.copy_launch = inst.start, inst.ends, "graph"
            timeline.t_ids_written_ns, timeline.launch_ticket = inst.t_ids_written_ns, inst.ticket
        else:
            groups = self.plane_groups if by_layer else [(0, len(self.planes))]
            start, marks = self._launch(src0, block_ids, groups, stream if by_layer else None, timeline, packed_ids)
        timeline.t_copy_queued_ns = _ns()
        if inst is not None:  # events: the spans made directly (``Span.between`` would ask which kind)
            copy = timeline.copy = Span(None, None, (start, marks[-1]))
            ends = [Span(None, None, (m, m)) for m in marks] if by_layer else []
            inst.hold([copy, *ends], timeline.ref)
        else:
            copy = timeline.copy = Span.between(start, marks[-1])
            ends = [Span.at(m) for m in marks] if by_layer else []
        if self.is_cuda:
            self.last_read_event, self.last_read_stream = marks[-1], stream  # every restore queued so far has read its extent
        # the engine thread alone writes this counter (no lock: the staging threads' keys are others)
        self.counters["restored_bytes"] += len(block_ids) * self.bytes_per_block
        return ends

    def _side(self):
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=self.device)
        return self._side_stream

    def _launch(self, src0: int, block_ids: list[int], groups: list[tuple[int, int]], stream, timeline,
                packed_ids: bytes | None = None):
        """The launch route: the arguments to the device, then per group a launch (the fused kernel,
        else torch's per-plane copies) and a mark at its end, on ``stream`` (None: the current one).
        Returns (start mark, end marks): CUDA events, or CPU stamps on the CPU build (its copies are done
        on return; there the fused kernel runs only under Triton's interpreter, where tests set ``scatter``)."""
        if stream is not None and self.last_read_event is not None:
            # the launch route's device arguments are reused: the previous copy may still read them
            self.await_launches()
            current_stream().wait_event(self.last_read_event)
        # the fused copy's arguments go to the device first: the copy's span starts where the kernel is
        # launched, and the host time before it shows as the restore's ``launch`` part
        if type(block_ids) is IdRange:  # no graph instance took the ids: read here, on the engine thread, once
            if self.scatter is not None:  # the kernel's arguments need them packed (and their length)
                packed_ids = packed_ids or block_ids.packed()
            else:  # torch's per-plane copies index with them
                block_ids = block_ids.to_list()
        args = self.scatter.prepare(src0, block_ids, packed_ids) if self.scatter is not None else None
        if stream is not None:
            stream.wait_stream(current_stream())
        timeline.copy_launch = self.scatter.launch_route.split(" ")[0] if args is not None else "torch"
        start, ends = self._mark(stream), []
        with on_stream(stream):
            for planes in groups:
                if args is not None:
                    self.scatter.launch(args, len(block_ids), planes)
                else:
                    self._copy_per_plane(src0, block_ids, planes)
                ends.append(self._mark(stream))
        return start, ends

    def _mark(self, stream=None):
        """Now, on ``stream``: a timing event on CUDA, a CPU stamp on the CPU build."""
        return self.event(stream) if self.is_cuda else _ns()

    def _copy_per_plane(self, src0: int, block_ids: list[int], planes: tuple[int, int] | None = None) -> None:
        """Buffer rows ``src0 ...`` -> ``block_ids`` with torch: per plane (of ``[p0, p1)``, default all),
        one ``index_copy_`` or, for at most 8 runs of consecutive ids, one narrow copy per run."""
        runs = _runs(block_ids)
        idx = None
        if len(runs) > 8:
            idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        p0, p1 = planes or (0, len(self.planes))
        for plane, buf in zip(self.planes[p0:p1], self.buffer_planes[p0:p1]):
            if idx is not None:
                plane.index_copy_(0, idx, buf.narrow(0, src0, len(block_ids)))
            else:
                for pos, dst, n in runs:
                    plane.narrow(0, dst, n).copy_(buf.narrow(0, src0 + pos, n))

    def order_after_reads(self) -> None:
        """Makes the current stream wait for every restore queued so far (the forward pass may run on a
        stream other than the one the restores were queued on at the step's start, and restores copied
        by layer groups run on a side stream); no call where the copies went to the current stream."""
        if self.last_read_event is not None:
            stream = current_stream()
            if stream != self.last_read_stream:
                self.await_launches()
                stream.wait_event(self.last_read_event)

    def await_launches(self) -> None:
        """Returns once every copy handed to the launch thread has been launched (``CopyGraphs.await_launches``):
        called before any wait on, query of or timing of a copy's events."""
        if self.graphs is not None:
            self.graphs.await_launches()

    def launch_stamps(self, ticket: int) -> tuple[int, int, int] | None:
        """(begin, end, result) of a copy's launch by the launch thread (None: not handed off, or not kept)."""
        return self.graphs.launch_stamps(ticket) if self.graphs is not None else None

    def ended_by(self, ready: Span, ticket: int = 0) -> str | None:
        """How a copy group's end (a point ``Span``) is known to have passed, None: not yet. "thread": ``ready``
        is the last group of handed-off replay ``ticket``, and the launch thread has seen that event complete
        (``CopyGraphs.copy_ended``: a counter read, no driver call); "query": its event has completed
        (``has_ended``); "cpu": a CPU stamp (the CPU build's copies are done on return)."""
        if ticket and self.graphs is not None and self.graphs.copy_ended(ticket):
            return "thread"
        if ready.end_event is None:
            return "cpu"
        return "query" if self.has_ended(ready) else None

    def copy_seen_ended_at(self, ticket: int) -> int | None:
        """When the launch thread saw handed-off replay ``ticket``'s copy end (None: it did not, or no thread)."""
        return self.graphs.copy_seen_ended_at(ticket) if self.graphs is not None else None

    def ids_packed_at(self, ticket: int) -> int | None:
        """When the launch thread began packing handed-off replay ``ticket``'s block ids (None: it packed none)."""
        return self.graphs.ids_packed_at(ticket) if self.graphs is not None else None

    def packs_ids_on_thread(self) -> bool:
        """Whether a handed-off copy's block ids may come unread (an ``IdRange``): the launch thread runs and packs
        them (``LaunchThread.set_pack``)."""
        graphs = self.graphs
        return graphs is not None and graphs.thread is not None and graphs.thread.packs_ids

    def has_ended(self, ready: Span) -> bool:
        """Whether a copy group's end (a point ``Span``) has passed: its event has completed (``query``, which
        does not block), or it is a CPU stamp (the CPU build's copies are done on return)."""
        event = ready.end_event
        if event is None:
            return True
        self.await_launches()
        return event.query()

    def reach_and_wait(self, ready: Span, holders: list | None = None):
        """Where the current stream is now, after which it waits for ``ready`` (a copy group's end): an
        event (a pooled one with ``holders``, as in ``event``), or a host stamp where there is nothing to
        wait for: on the CPU build (its copies are done on return), or once the group's copy has ended
        (``has_ended``; the GPU reaches this point later than the host does, so its stall is 0, and the
        stream needs no wait)."""
        if self.has_ended(ready):
            return _ns()
        reached = self.event(holders=holders)
        current_stream().wait_event(ready.end_event)
        return reached

    def read_back(self, block_ids: list[int]) -> torch.Tensor:
        """vLLM's KV of ``block_ids`` as buffer rows (tests compare restores with it)."""
        rows = torch.empty(len(block_ids), self.bytes_per_block, dtype=torch.uint8, device=self.device)
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        a = 0
        for plane, n in zip(self.planes, self.plane_nbytes):
            rows[:, a:a + n].view(plane.dtype).copy_(plane.index_select(0, idx))
            a += n
        return rows

    def extent(self, start: int, num_blocks: int) -> torch.Tensor:
        return self.buffer_blocks[start:start + num_blocks]
