"""A scripted policy for the Tree-of-Thoughts search: the text a weak model would write, seeded.

No instruction-tuned weights can be installed here, and with random or dummy weights no proposal
parses, so the search stops after one call per puzzle. The scripted policy writes each call's
output instead; the engine still prefills and decodes every call (``engine.forcing`` forces the
sampled ids), so the request order, the prefixes and the block pool are those of a model run.

What it writes, per call (``ScriptedPolicy.text``), from a generator seeded by (seed, call id):

* **proposal** for a state with n numbers left: 3..8 lines (1..4 with two numbers), each a
  distinct ``a op b = c (left: ...)`` step. A line is wrong with probability ``error_rate``; a
  wrong line is unparseable with probability ``unparsed_share`` (no left list, no spaces, a
  bullet, prose), otherwise it parses but is wrong (arithmetic off, or a left list that is not
  what remains), which the search counts as invalid.
* **value**: one to three lines of true arithmetic on the numbers left, then
  ``Judgement: sure|likely|impossible``. With probability ``value_accuracy`` the judgement
  agrees with the solver oracle (``game24.solve``: sure or likely when 24 is reachable,
  impossible when not), otherwise it contradicts it.
* **length**: a model given no stop string rarely stops at the end of its answer. With
  probability ``P_RUN_TO_CAP`` it keeps imitating the few-shot text up to ``max_tokens``;
  otherwise it stops a short tail after its answer (a geometric number of tokens, mean
  ``MEAN_TAIL_TOKENS``). An answer longer than ``max_tokens`` is cut there, and its last line
  is then lost or unparseable, as it would be for a model.

The output is deterministic per (seed, invocation id, state): the same search gives the same
calls, so a run can be re-derived from its parameters (section 19's checks do).
"""
from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from kmesh_lib.workloads import game24
from kmesh_lib.workloads.game24 import OPS, fmt
from kmesh_lib.workloads.tot_search import decode, encode

P_RUN_TO_CAP = 0.6  # share of calls that run on to max_tokens (no stop string, few-shot imitation)
MEAN_TAIL_TOKENS = 12  # otherwise: tokens written after the answer before the model stops


@cache
def solvable(value_key: tuple[Fraction, ...]) -> bool:
    """The oracle: can the numbers left still make 24 (exact fractions)?"""
    return game24.solve(value_key) is not None


@dataclass(frozen=True)
class ScriptedPolicy:
    """``text(call)`` / ``token_ids(call)``: a call's scripted output (see the module docstring)."""

    tokenizer: object
    seed: int = 0
    error_rate: float = 0.25
    unparsed_share: float = 0.5
    value_accuracy: float = 0.8
    max_tokens: int = 192

    def __post_init__(self) -> None:
        for name in ("error_rate", "unparsed_share", "value_accuracy"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)}: must be in [0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens}: must be >= 1")

    def rng(self, call) -> random.Random:
        key = f"{self.seed}/{call.invocation_id}/{call.kind}/{call.state.left}".encode()
        return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))

    def text(self, call) -> str:
        """The call's output as text (what ``token_ids`` decodes to)."""
        return self.draw(call)[0]

    def token_ids(self, call) -> list[int]:
        """The forced output: the scripted text tokenized and cut at the scripted length (>= 1 token)."""
        return self.draw(call)[1]

    def draw(self, call) -> tuple[str, list[int]]:
        rng = self.rng(call)
        answer = self.proposals(call.state, rng) if call.kind == "proposal" else self.judgement(call.state, rng)
        if rng.random() < P_RUN_TO_CAP:
            length = self.max_tokens
        else:
            num_tail = 1
            while rng.random() > 1.0 / MEAN_TAIL_TOKENS:
                num_tail += 1
            length = min(self.max_tokens, len(encode(self.tokenizer, answer)) + num_tail)
        text = answer
        ids = encode(self.tokenizer, text)
        while len(ids) < length:  # the model goes on imitating the few-shot text
            text += continuation(call.state, rng)
            ids = encode(self.tokenizer, text)
        ids = ids[:length]
        return decode(self.tokenizer, ids), ids

    # -- proposals --
    def proposals(self, state: game24.State, rng: random.Random) -> str:
        steps = candidate_steps(state)
        rng.shuffle(steps)
        num_lines = min(len(steps), rng.randint(3, 8) if len(state.numbers) > 2 else rng.randint(1, 4))
        lines = []
        for a, op, b, rest in steps[:num_lines]:
            c = OPS[op](a, b)
            if rng.random() < self.error_rate:
                lines.append(unparsed_line(a, op, b, c, rest, rng) if rng.random() < self.unparsed_share
                             else invalid_line(a, op, b, c, rest, rng))
            else:
                lines.append(step_line(a, op, b, c, rest + [c]))
        return "\n".join(lines) + "\n"

    # -- values --
    def judgement(self, state: game24.State, rng: random.Random) -> str:
        reachable = solvable(state.value_key)
        truthful = rng.random() < self.value_accuracy
        if reachable == truthful:  # says reachable: sure more often than likely
            word = "sure" if rng.random() < 0.7 else "likely"
        else:
            word = "impossible"
        return "".join(line + "\n" for line in reasoning(state, rng)) + f"Judgement: {word}\n"


def candidate_steps(state: game24.State) -> list[tuple[Fraction, str, Fraction, list[Fraction]]]:
    """Distinct steps a proposer would write: larger number first for - and /, no division by 0."""
    seen, steps = set(), []
    for i, j in itertools.permutations(range(len(state.numbers)), 2):
        a, b = state.numbers[i], state.numbers[j]
        rest = [x for k, x in enumerate(state.numbers) if k not in (i, j)]
        for op in OPS:
            if (op in "-/" and a < b) or (op in "+*" and i > j) or OPS[op](a, b) is None:
                continue
            if (a, op, b) not in seen:
                seen.add((a, op, b))
                steps.append((a, op, b, rest))
    return steps


def step_line(a, op, b, c, left) -> str:
    return f"{fmt(a)} {op} {fmt(b)} = {fmt(c)} (left: {' '.join(fmt(x) for x in sorted(left))})"


def invalid_line(a, op, b, c, rest, rng: random.Random) -> str:
    """Parses, but is wrong: the arithmetic is off, or the left list is not what remains."""
    if rng.random() < 0.6 or not rest or rest[0] == c:  # (rest[0] == c: the list below would be right)
        wrong = c + rng.choice([-2, -1, 1, 2, 3, 10])
        return step_line(a, op, b, wrong, rest + [wrong])
    return step_line(a, op, b, c, rest[1:] + [c, c])


def unparsed_line(a, op, b, c, rest, rng: random.Random) -> str:
    """What a weak model writes instead of the format: the parser counts it unparsed."""
    left = " ".join(fmt(x) for x in sorted(rest + [c]))
    return rng.choice([
        f"{fmt(a)} {op} {fmt(b)} = {fmt(c)}",
        f"{fmt(a)}{op}{fmt(b)}={fmt(c)} (left: {left})",
        f"- {fmt(a)} {op} {fmt(b)} = {fmt(c)} (left: {left})",
        f"{fmt(a)} and {fmt(b)} make {fmt(c)}, leaving {left}",
    ])


def reasoning(state: game24.State, rng: random.Random) -> list[str]:
    """One to three lines of true arithmetic on the numbers left, as in the few-shot examples."""
    numbers = list(state.numbers)
    if len(numbers) < 2:
        return []
    lines = []
    for _ in range(rng.randint(1, 3)):
        a, b = rng.sample(numbers, 2)
        op = rng.choice([o for o in OPS if OPS[o](a, b) is not None])
        lines.append(f"{fmt(a)} {op} {fmt(b)} = {fmt(OPS[op](a, b))}")
    return [", ".join(lines)]


def continuation(state: game24.State, rng: random.Random) -> str:
    """What the model writes after its answer: the next few-shot part, imitated (a blank line
    first, so the parser has stopped before it)."""
    lines = "".join(line + "\n" for line in reasoning(state, rng))
    return (f"\nEvaluate: {state.left}\n{lines}Judgement: {rng.choice(['sure', 'likely', 'impossible'])}\n"
            f"\nInput: {state.left}\nPossible next steps:\n")
