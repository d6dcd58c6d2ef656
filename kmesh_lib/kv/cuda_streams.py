"""The current CUDA stream without its per-call cost, and the reference that puts CUDA events on the
host's monotonic clock.

``torch.cuda.current_stream()`` builds a new Python ``Stream`` on every call; vLLM tracks the stream
its runner set instead (``vllm.utils.torch_utils.current_stream``, which wraps ``torch.cuda.set_stream``)
and runs its forward pass on that stream. A restore queues work on it several times per step, so it
asks vLLM, and switches streams with ``torch.cuda.set_stream`` (which vLLM follows) rather than
``torch.cuda.stream(...)``, whose context asks torch for the current stream twice.
"""
from __future__ import annotations

import time

import torch

try:
    from vllm.utils.torch_utils import current_stream
except ImportError:  # a vLLM without the helper: torch's call, correct and slower
    current_stream = torch.cuda.current_stream

_ns = time.monotonic_ns


def stream_reference(stream=None, event=None) -> tuple[int, torch.cuda.Event, bool, int]:
    """(t_ns, event, synced, window_ns) taken together on an idle stream (default: the current one):
    puts later events on the monotonic clock. The GPU reaches an event recorded on an idle stream as soon
    as the record call has handed it over, so ``t_ns`` is stamped when the call returns and the event's
    GPU time is placed there: it happened within the call (at most ``window_ns``, the call's own host time,
    before the stamp) or at most the GPU's pickup latency (a few microseconds) after it. A stamp before the
    call would have placed every event early by up to the window (before 2 Dec 2026 the stamp came first,
    with the event made inside it: 18-60 us cold on the H200 machine's host,
    ``benchmarks/bench_cuda_host_calls.py``). The stream is synchronized only when it has work left
    (``synced``); a stream found idle (``query``, which does not block) costs no wait. ``event``: a timing
    event to record (an ``EventPool``'s), else a new one."""
    stream = stream or current_stream()
    synced = not stream.query()
    if synced:
        stream.synchronize()
    event = event or torch.cuda.Event(enable_timing=True)
    t_before = _ns()
    event.record(stream)
    t = _ns()
    return t, event, synced, t - t_before


def narrowest_reference(tries: int = 5, stream=None) -> tuple[int, torch.cuda.Event, bool, int]:
    """The ``stream_reference`` with the narrowest window of ``tries`` taken back to back on ``stream`` (default:
    the current one), idle (call it with the device synchronized, off any step's path, or on a stream whose work
    has ended: the first try waits for any left, and ``synced`` says whether one did): a record call the host was
    slow to return from (69 us against a median of 13 on the H200 machine) leaves its event's GPU time
    anywhere in its window; the narrowest bounds it best (NTP keeps its fastest exchange the same way)."""
    refs = [stream_reference(stream) for _ in range(tries)]
    t, event, _, window = min(refs, key=lambda ref: ref[3])
    return t, event, any(ref[2] for ref in refs), window


class EventPool:
    """Timing events made once and recorded again, each only after everything that holds its last
    record has read it: ``take(holders)`` hands out an event whose previous holders (objects with a
    ``resolved`` flag, e.g. ``RestoreTimeline``) are all resolved, and gives it ``holders``, a list the
    caller fills (an empty one holds the event until it is filled and resolved). A made event's record
    costs the host about a third of making one and recording it (``benchmarks/bench_cuda_host_calls.py``).
    With every event held, ``take`` makes an event outside the pool (at most ``size`` are kept)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.slots: list[list] = []  # [event, holders]

    def take(self, holders: list) -> torch.cuda.Event:
        for slot in self.slots:
            if slot[1] and all(h.resolved for h in slot[1]):
                slot[1] = holders
                return slot[0]
        event = torch.cuda.Event(enable_timing=True)
        if len(self.slots) < self.size:
            self.slots.append([event, holders])
        return event


class on_stream:
    """Makes ``stream`` current inside the block (None: no change), and the previous one after."""

    def __init__(self, stream) -> None:
        self.stream, self.previous = stream, None

    def __enter__(self):
        if self.stream is not None:
            self.previous = current_stream()
            torch.cuda.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            torch.cuda.set_stream(self.previous)
