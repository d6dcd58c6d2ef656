"""The trace: families (section 18's shape) and unrelated traffic, arriving over time.

    parent   PARENT_TOKENS random tokens -> MAX_TOKENS greedy output tokens
    child    parent input + parent output + CHILD_SUFFIX_TOKENS own tokens; NUM_CHILDREN per parent,
             each arriving an exponential gap (mean MEAN_CHILD_GAP_S) after its parent finished
    noise    NOISE_TOKENS random tokens, unrelated to any family: pressure on the pools

Parents and unrelated requests (the roots) arrive as one Poisson process, mean gap
MEAN_ARRIVAL_GAP_S, in a seeded shuffled order. A child's prompt needs its parent's output, so a
child exists only once its parent finished: the trace is open for roots and closed for children,
as an agent's follow-up is.

Invariant: everything is drawn from ``random.Random(f"multi-engine-{SEED}-{repeat}")`` before the
first request is sent, so every policy serves the same prompts at the same offsets; only the
children's absolute arrival times follow their parent's finish, which is a measured outcome.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Child:
    request_id: str
    suffix: list[int]
    gap_s: float  # after the parent finished


@dataclass(frozen=True)
class Root:
    request_id: str
    role: str  # parent | noise
    family: int | None
    prompt_token_ids: list[int]
    arrival_s: float  # offset from the trace's start
    children: list[Child] = field(default_factory=list)


def make_trace(cfg, repeat: int, vocab_size: int) -> list[Root]:
    """The roots of one trace in arrival order, each parent with its children."""
    rng = random.Random(f"multi-engine-{cfg.SEED}-{repeat}")

    def tokens(n: int) -> list[int]:
        return [rng.randrange(4, vocab_size) for _ in range(n)]  # ids 0-3 are special

    parents = []
    for f in range(cfg.NUM_FAMILIES):
        prompt = tokens(cfg.PARENT_TOKENS)
        children = [Child(f"r{repeat}-f{f}-c{c}", tokens(cfg.CHILD_SUFFIX_TOKENS), rng.expovariate(1 / cfg.MEAN_CHILD_GAP_S))
                    for c in range(cfg.NUM_CHILDREN)]
        parents.append(("parent", f, prompt, children))
    noise = [("noise", n, tokens(cfg.NOISE_TOKENS), []) for n in range(cfg.NUM_NOISE)]
    order = parents + noise
    rng.shuffle(order)
    roots, t = [], 0.0
    for i, (role, n, prompt, children) in enumerate(order):
        if i:
            t += rng.expovariate(1 / cfg.MEAN_ARRIVAL_GAP_S)
        request_id = f"r{repeat}-f{n}-parent" if role == "parent" else f"r{repeat}-n{n}"
        roots.append(Root(request_id, role, n if role == "parent" else None, prompt, t, children))
    return roots


def child_prompt(parent_prompt: list[int], parent_output: list[int], child: Child) -> list[int]:
    return list(parent_prompt) + list(parent_output) + list(child.suffix)
