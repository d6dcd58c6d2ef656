"""The replay engine: vLLM's real Scheduler and KV-cache manager with no forward pass.

Each step runs ``Scheduler.schedule()``, then feeds ``Scheduler.update_from_output()`` a
``ModelRunnerOutput`` whose sampled token is a fixed function of (previous token, position).
Everything the cache does (prefix hits, allocation, hashing, eviction, preemption) is vLLM's own
code, so block accounting is exact at any block size and pool size, including the 16-token
blocks GPU experiments use, which the CPU attention backend cannot run. How vLLM tests itself
(``tests/v1/core``) is the model.

Outputs are deterministic and identical across arms; ``logprobs`` are 0.0 (the replay model puts
all its mass on one token). Timings measure the scheduler, not a model.

With ``num_speculative_tokens`` k > 0 a decoding request goes through vLLM's speculative-decoding path
(an ``ngram`` speculative config, so no draft model): after each step the engine proposes the replay
model's own next tokens as drafts (``Scheduler.update_draft_token_ids``), the scheduler schedules and
allocates them with the sampled token, and the step accepts every draft the replay model would have
sampled (all of them, as a greedy rejection sampler would) plus a bonus token. A lone request then
writes the same tokens into the same blocks in up to k + 1 times fewer steps: the blocks are popped from
the free queue in the same order, only more per step. Two details keep the pool state equal to plain
decoding: vLLM caches verified tokens only (a block filled by accepted drafts is cached at the next
step's allocation), so a request's last token is always sampled by a step without drafts; and a new
request with one uncached token is padded to 1 + k scheduled tokens, which stays inside the block its
next token needs while k < ``BLOCK_SIZE``. Running requests share steps, so with several of them the
number of steps (and a step-time model's clock) would differ: sequential replays only.
"""
from __future__ import annotations

import inspect
import os
import time

from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import materialize, resolve
from kmesh_lib.engine.requests import CacheObjects, RequestSpec, StepOutput

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
NUM_SPECIAL_TOKENS = 4  # replay tokens avoid ids 0-3 (pad, bos, eos, unk)


def replay_token(prev_token: int, position: int, vocab_size: int) -> int:
    """The replay model: next token from the previous token and its position only."""
    span = vocab_size - NUM_SPECIAL_TOKENS
    return NUM_SPECIAL_TOKENS + (prev_token * 1103515245 + position * 12345 + 7) % span


class ReplayEngine(CacheObjects):
    """Same request API as ``VllmEngine``; ``scheduler``/``kv_cache_manager``/``block_pool`` too.

    Args:
        kv_transfer_config: a KV connector for the scheduler (its scheduler side runs as in vLLM).
        model_runner: called with each step's ``SchedulerOutput`` where a GPU model runner would run
            the forward pass (tests run a connector's worker side on CPU tensors there).
        num_speculative_tokens: drafts per decode step (0: plain decoding; below ``BLOCK_SIZE``; see the
            module docstring).
    """

    mode = "replay"

    def __init__(self, params: EngineParams, kv_transfer_config=None, model_runner=None,
                 num_speculative_tokens: int = 0) -> None:
        from vllm.engine.arg_utils import EngineArgs
        try:
            from vllm.utils.hashing import get_hash_fn_by_name
        except ImportError:  # older vLLM
            from vllm.utils import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        if not 0 <= num_speculative_tokens < params.BLOCK_SIZE:
            raise ValueError(f"num_speculative_tokens={num_speculative_tokens}: must be 0..BLOCK_SIZE-1 "
                             f"({params.BLOCK_SIZE - 1}), so that a padded admission stays in its block")
        t0 = time.monotonic()
        self.params = params
        self.num_speculative_tokens = num_speculative_tokens
        self.spec = resolve(params.MODEL)
        model_dir = materialize(self.spec, "dummy", params.DTYPE, params.SEED) if self.spec.is_synthetic else self.spec.path
        args = EngineArgs(
            model=str(model_dir), skip_tokenizer_init=True, block_size=params.BLOCK_SIZE, dtype=params.DTYPE,
            enable_prefix_caching=True, num_gpu_blocks_override=params.NUM_GPU_BLOCKS,
            max_model_len=params.MAX_MODEL_LEN, max_num_seqs=params.MAX_NUM_SEQS,
            max_num_batched_tokens=max(params.MAX_NUM_BATCHED_TOKENS, params.MAX_MODEL_LEN),
            enforce_eager=True, load_format="dummy", seed=params.SEED, kv_transfer_config=kv_transfer_config,
            speculative_config=({"method": "ngram", "num_speculative_tokens": num_speculative_tokens}
                                if num_speculative_tokens else None),
        )
        self.model_runner = model_runner
        vllm_config = args.create_engine_config()
        # NOTE: the CPU platform may round the block size up; the replay keeps the asked size.
        vllm_config.cache_config.block_size = params.BLOCK_SIZE
        vllm_config.cache_config.num_gpu_blocks = params.NUM_GPU_BLOCKS
        self.vocab_size = self.spec.config["vocab_size"]
        kv_cache_config = self._kv_cache_config(params)
        kwargs = dict(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(vllm_config),
                      block_size=params.BLOCK_SIZE, hash_block_size=params.BLOCK_SIZE, log_stats=True)
        # NOTE: vLLM 0.26 (the GPU stack) predates hash_block_size; pass what this version takes.
        accepted = inspect.signature(Scheduler.__init__).parameters
        self.scheduler = Scheduler(**{k: v for k, v in kwargs.items() if k in accepted})
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._block_hasher = get_request_block_hasher(params.BLOCK_SIZE, hash_fn)
        self.num_steps = 0
        self.forced_token_ids: dict[str, tuple[int, ...]] = {}
        self.start_s = time.monotonic() - t0

    def _kv_cache_config(self, params: EngineParams):
        import torch
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )

        cfg = self.spec.config
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(cfg["num_hidden_layers"])]
        attn = FullAttentionSpec(block_size=params.BLOCK_SIZE, num_kv_heads=cfg["num_key_value_heads"],
                                 head_size=head_dim, dtype=getattr(torch, params.DTYPE))
        return KVCacheConfig(num_blocks=params.NUM_GPU_BLOCKS, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(layer_names, attn)])

    def submit(self, spec: RequestSpec) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        max_tokens = spec.max_tokens
        if spec.forced_token_ids is not None:  # as VllmEngine: exactly the forced ids
            self.forced_token_ids[spec.request_id] = tuple(spec.forced_token_ids)
            max_tokens = len(spec.forced_token_ids)
        sp = SamplingParams(max_tokens=max_tokens, temperature=spec.temperature, seed=spec.seed,
                            ignore_eos=True, detokenize=False)
        request = Request(request_id=spec.request_id, prompt_token_ids=list(spec.prompt_token_ids),
                          sampling_params=sp, pooling_params=None, block_hasher=self._block_hasher)
        self.scheduler.add_request(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[StepOutput]:
        from vllm.v1.outputs import ModelRunnerOutput

        scheduler_output = self.scheduler.schedule()
        if self.model_runner is not None:
            self.model_runner(scheduler_output)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        drafts = scheduler_output.scheduled_spec_decode_tokens
        sampled = []
        for rid in req_ids:
            request = self.scheduler.requests[rid]
            # schedule() already advanced num_computed_tokens (drafts included); a token is sampled only
            # once every known token (prompt + outputs so far) has been computed, as in the GPU model runner.
            if request.num_computed_tokens >= request.num_tokens:
                sampled.append(self.verify_drafts(request, drafts.get(rid, ())))
            else:
                sampled.append([])
        runner_output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                          sampled_token_ids=sampled)
        engine_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self.num_steps += 1
        if self.num_speculative_tokens:
            self.propose_drafts(req_ids)
        outputs = []
        for client_outputs in engine_outputs.values():
            for out in client_outputs.outputs:
                if out.finish_reason is not None:
                    self.forced_token_ids.pop(out.request_id, None)
                stats = getattr(out, "prefill_stats", None)  # vLLM >= 0.32; older: num_cached_tokens
                num_cached = stats.num_cached_tokens if stats is not None else getattr(out, "num_cached_tokens", None)
                outputs.append(StepOutput(
                    out.request_id, list(out.new_token_ids), [0.0] * len(out.new_token_ids),
                    out.finish_reason is not None,
                    str(out.finish_reason) if out.finish_reason is not None else None, num_cached))
        return outputs

    def next_token(self, request) -> int:
        """The token ``request`` samples now: its forced id at this position when it has forced ids,
        else a deterministic function of its last token and length (the accounting stays vLLM's)."""
        return self.next_tokens(request, 1)[0]

    def next_tokens(self, request, count: int) -> list[int]:
        """The ``count`` tokens ``request`` would sample next, one by one (``next_token`` chained)."""
        forced = self.forced_token_ids.get(request.request_id)
        if forced is not None:
            return list(forced[request.num_output_tokens:request.num_output_tokens + count])
        out, prev, position = [], request.all_token_ids[-1], request.num_tokens
        for _ in range(count):
            prev = replay_token(prev, position, self.vocab_size)
            out.append(prev)
            position += 1
        return out

    def verify_drafts(self, request, draft_token_ids) -> list[int]:
        """The tokens a greedy sampler returns for ``request`` this step: the leading drafts equal to the
        replay model's tokens, then the model's token after them (vLLM's padding drafts, -1, match none)."""
        expected = self.next_tokens(request, len(draft_token_ids) + 1)
        num_accepted = 0
        while num_accepted < len(draft_token_ids) and draft_token_ids[num_accepted] == expected[num_accepted]:
            num_accepted += 1
        return expected[:num_accepted + 1]

    def propose_drafts(self, req_ids: list[str]) -> None:
        """Drafts for the requests stepped: the replay model's next tokens, up to the request's second-to-last
        output, so that its last token is sampled by a step without drafts (see the module docstring)."""
        from vllm.v1.outputs import DraftTokenIds

        proposed = {}
        for rid in req_ids:
            request = self.scheduler.requests.get(rid)
            if request is None or request.is_finished() or request.num_computed_tokens < request.num_tokens - 1:
                continue  # finished, or still prefilling
            num_drafts = min(self.num_speculative_tokens, request.max_tokens - request.num_output_tokens - 2)
            if num_drafts > 0:
                proposed[rid] = self.next_tokens(request, num_drafts)
        if proposed:
            self.scheduler.update_draft_token_ids(DraftTokenIds(list(proposed), list(proposed.values())))

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def close(self) -> None:
        self.scheduler.shutdown()
