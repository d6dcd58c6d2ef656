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


def stream_reference(stream=None) -> tuple[int, torch.cuda.Event, bool]:
    """(t_ns, event, synced) taken together on an idle stream (default: the current one): puts later
    events on the monotonic clock. The GPU reaches an event recorded on an idle stream as soon as it is
    queued, so the stream is synchronized only when it has work left (``synced``); a stream found idle
    (``query``, which does not block) costs no wait."""
    stream = stream or current_stream()
    synced = not stream.query()
    if synced:
        stream.synchronize()
    t = _ns()
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return t, event, synced


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
