"""Tree-of-Thoughts breadth-first search for Game of 24 (Yao et al. 2023), puzzle by puzzle.

Per puzzle and per step, every frontier state gets one *proposal* call (one batch per step);
every valid proposed state gets a *value* score from the model (one batch; finished states too,
as "Evaluate: 24"); the best ``breadth`` states (stable on ties) are the next frontier. After
``len(numbers) - 1`` steps the best state's expression is the answer, graded with fractions.

Prompts extend the producer's exact tokens, so producer edges are exact-prefix edges:

    proposal(root) = few-shot header + "Input: <numbers>, Possible next steps:"
    proposal(s)  = parent.prompt + parent.output + "Input: <s>, Possible next steps:"
    value(c)     = proposal(s).prompt + proposal(s).output + "Evaluate: <c>"   c proposed by it
    proposal(c)  = proposal(s).prompt + proposal(s).output + "Input: <c>, ..."

``parent_id`` of a call is the proposal call whose output produced its state (None at the
root). A chain that would not fit ``max_model_len`` restarts from the few-shot header (counted
in ``num_context_resets``; that edge is no longer an exact prefix).

Value memoization: a value call judges only the numbers left, so each distinct multiset is
evaluated once per run (as the original's value cache); every later candidate with the same
numbers reuses the score and counts in ``num_avoided_value_calls``.

Invariants: ``num_value_calls + num_avoided_value_calls == num_valued_candidates``; a group of
calls is started only if it fits ``max_calls`` and the run is inside ``run_ceiling_s``; a limit
hit (including a call cut off at ``invocation_bound_s``) stops the search and marks it partial.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kmesh_lib.engine.model_spec import ByteTokenizer
from kmesh_lib.engine.requests import RequestResult
from kmesh_lib.workloads import game24


@dataclass(frozen=True)
class SearchConfig:
    breadth: int = 2
    max_tokens: int = 192
    temperature: float = 0.7
    base_seed: int = 0  # call i samples with seed base_seed + i
    max_model_len: int = 2048
    max_calls: int = 384
    run_ceiling_s: float = 75 * 60.0
    invocation_bound_s: float = 120.0


@dataclass(frozen=True)
class Call:
    invocation_id: str
    kind: str  # proposal | value
    call_index: int
    puzzle_index: int
    step: int  # 1-based BFS step
    parent_id: str | None
    prompt_token_ids: tuple[int, ...]
    seed: int
    state: game24.State  # proposal: the state to expand; value: the state to judge
    context_reset: bool = False


@dataclass
class Invocation:
    call: Call
    result: RequestResult
    text: str  # the decoded output
    parsed: dict = field(default_factory=dict)  # what the search read from it

    @property
    def timed_out(self) -> bool:
        return self.result.finish_reason == "timeout"


@dataclass
class PuzzleOutcome:
    """Every task's outcome is kept: solved, failed (with reason), partial or not_run."""

    puzzle_index: int
    numbers: tuple[int, ...]
    status: str
    reason: str
    expression: str | None = None
    steps: tuple[str, ...] = ()
    num_calls: int = 0

    def to_dict(self) -> dict:
        return {"puzzle_index": self.puzzle_index, "numbers": list(self.numbers), "status": self.status,
                "reason": self.reason, "expression": self.expression, "steps": list(self.steps),
                "num_calls": self.num_calls}


@dataclass
class SearchRun:
    invocations: list[Invocation]
    outcomes: list[PuzzleOutcome]
    counts: Counter
    limit_hit: str | None

    @property
    def partial(self) -> bool:
        return self.limit_hit is not None


# Counters of a run. Proposal lines are read up to the first blank line (``workloads.game24.proposal_block``);
# an *unparsed* line does not match the format, an *invalid* one matches but is wrong; an unparsed
# proposal call is one in which no line matched. ``num_valued_candidates`` = value calls + avoided.
COUNT_NAMES = ("num_calls", "num_proposal_calls", "num_value_calls", "num_avoided_value_calls",
               "num_valued_candidates", "num_proposal_lines", "num_unparsed_proposal_lines",
               "num_unparsed_proposal_calls", "num_invalid_proposals", "num_valid_proposals",
               "num_unparsed_values", "num_context_resets", "num_timeouts")


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` alone (a real tokenizer adds no special tokens: prompts concatenate)."""
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(text)
    return tokenizer.encode(text, add_special_tokens=False)


def decode(tokenizer, token_ids) -> str:
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.decode(list(token_ids))
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)


class TotSearch:
    """The search driver. ``generate(calls) -> list[RequestResult]`` runs one group of calls.

    ``generate`` is the kmesh engine (``sections.tot_headroom.generator.engine_generator``) in the section; unit tests
    inject an oracle, and the consistency check replays a capture (returning None where the
    capture ends). ``on_group(invocations)`` runs once each group is parsed (captures write there).
    """

    def __init__(self, generate: Callable, tokenizer, cfg: SearchConfig, clock: Callable[[], float] = time.monotonic,
                 on_group: Callable | None = None) -> None:
        self.generate, self.tokenizer, self.cfg, self.clock, self.on_group = generate, tokenizer, cfg, clock, on_group
        self.header = encode(tokenizer, game24.FEWSHOT)
        self.invocations: list[Invocation] = []
        self.value_memo: dict[tuple, float] = {}
        self.counts: Counter = Counter({name: 0 for name in COUNT_NAMES})
        self.limit_hit: str | None = None
        self.t0 = None

    def run(self, puzzles: list[game24.Puzzle], started_at: float | None = None) -> SearchRun:
        """Searches each puzzle in turn; the run ceiling counts from ``started_at`` (default: now)."""
        self.t0 = self.clock() if started_at is None else started_at
        outcomes = []
        for puzzle in puzzles:
            if self.limit_hit:
                reason = f"limit hit before: {self.limit_hit}"
                outcomes.append(PuzzleOutcome(puzzle.index, puzzle.numbers, "not_run", reason))
                continue
            num_before = len(self.invocations)
            outcome = self._search(puzzle)
            outcome.num_calls = len(self.invocations) - num_before
            outcomes.append(outcome)
        return SearchRun(self.invocations, outcomes, self.counts, self.limit_hit)

    def _search(self, puzzle: game24.Puzzle) -> PuzzleOutcome:
        frontier: list[tuple[game24.State, Invocation | None]] = [(game24.root_state(puzzle.numbers), None)]
        num_steps = len(puzzle.numbers) - 1
        for step in range(1, num_steps + 1):
            calls = [self._call("proposal", puzzle, step, state, producer, game24.propose_question(state), i)
                     for i, (state, producer) in enumerate(frontier)]
            invocations = self._run(calls)
            if invocations is None:
                return self._partial(puzzle, step)
            candidates = []
            for inv in invocations:
                parsed = game24.parse_proposals(inv.call.state, inv.text)
                inv.parsed = {"num_lines": parsed.num_lines, "num_unparsed_lines": parsed.num_unparsed_lines,
                              "num_invalid": parsed.num_invalid, "num_valid": len(parsed.states)}
                self.counts.update(num_proposal_lines=parsed.num_lines,
                                   num_unparsed_proposal_lines=parsed.num_unparsed_lines,
                                   num_invalid_proposals=parsed.num_invalid, num_valid_proposals=len(parsed.states),
                                   num_unparsed_proposal_calls=int(not parsed.states and parsed.num_invalid == 0))
                candidates += [(state, inv) for state in parsed.states]
            self._emit(invocations)
            if not candidates:
                return PuzzleOutcome(puzzle.index, puzzle.numbers, "failed", f"no valid proposal at step {step}")
            values = self._values(puzzle, step, candidates)
            if values is None:
                return self._partial(puzzle, step)
            order = sorted(range(len(candidates)), key=lambda i: -values[i])[:self.cfg.breadth]
            frontier = [candidates[i] for i in order]
        best = frontier[0][0]
        graded = game24.grade(puzzle.numbers, best.expression)
        return PuzzleOutcome(puzzle.index, puzzle.numbers, "solved" if graded.ok else "failed",
                             graded.reason, best.expression, best.steps)

    def _partial(self, puzzle, step) -> PuzzleOutcome:
        return PuzzleOutcome(puzzle.index, puzzle.numbers, "partial", f"limit {self.limit_hit} at step {step}")

    def _values(self, puzzle, step, candidates) -> list[float] | None:
        """Scores per candidate; one value call per distinct multiset of numbers left in the run."""
        calls, pending = [], set()
        for state, producer in candidates:
            key = state.value_key
            self.counts["num_valued_candidates"] += 1
            if key in self.value_memo or key in pending:
                self.counts["num_avoided_value_calls"] += 1
                continue
            pending.add(key)
            calls.append(self._call("value", puzzle, step, state, producer, game24.value_question(state), len(calls)))
        invocations = self._run(calls) if calls else []
        if invocations is None:
            return None
        for inv in invocations:
            judgement = game24.parse_judgement(inv.text)
            inv.parsed = {"judgement": judgement}
            self.counts["num_unparsed_values"] += judgement is None
            self.value_memo[inv.call.state.value_key] = game24.VALUE_SCORES.get(judgement, 0.0)
        self._emit(invocations)
        return [self.value_memo[state.value_key] for state, _ in candidates]

    def _call(self, kind, puzzle, step, state, producer, question, offset: int) -> Call:
        """Call ``offset`` of the next group; its prompt extends ``producer``'s prompt + output."""
        call_index = len(self.invocations) + offset
        suffix = encode(self.tokenizer, question)
        reset = False
        prompt = self.header + suffix
        if producer is not None:
            chained = list(producer.result.prompt_token_ids) + list(producer.result.output_token_ids) + suffix
            if len(chained) + self.cfg.max_tokens <= self.cfg.max_model_len:
                prompt = chained
            else:
                reset = True
                self.counts["num_context_resets"] += 1
        if len(prompt) + self.cfg.max_tokens > self.cfg.max_model_len:
            raise ValueError(f"a {len(prompt)}-token prompt + {self.cfg.max_tokens} output tokens exceed "
                             f"max_model_len={self.cfg.max_model_len}")
        return Call(f"q{puzzle.index}-c{call_index:04d}-{kind}", kind, call_index, puzzle.index, step,
                    producer.call.invocation_id if producer else None, tuple(prompt),
                    self.cfg.base_seed + call_index, state, reset)

    def _run(self, calls: list[Call]) -> list[Invocation] | None:
        """Runs one group if every limit allows it; None once a limit is hit."""
        if self.limit_hit is None and len(self.invocations) + len(calls) > self.cfg.max_calls:
            self.limit_hit = "max_calls"
        if self.limit_hit is None and self.clock() - self.t0 > self.cfg.run_ceiling_s:
            self.limit_hit = "run_ceiling"
        if self.limit_hit:
            return None
        results = self.generate(calls)
        if results is None:  # a generator replaying a capture that ended here
            self.limit_hit = "capture_end"
            return None
        invocations = [Invocation(call, result, decode(self.tokenizer, result.output_token_ids))
                       for call, result in zip(calls, results, strict=True)]
        self.invocations += invocations
        kinds = Counter(inv.call.kind for inv in invocations)
        self.counts.update(num_calls=len(invocations), num_proposal_calls=kinds["proposal"], num_value_calls=kinds["value"],
                           num_timeouts=sum(inv.timed_out for inv in invocations))
        if self.counts["num_timeouts"]:
            self.limit_hit = "invocation_bound"
            self._emit(invocations)  # recorded as they are: the search stops here
            return None
        return invocations

    def _emit(self, invocations: list[Invocation]) -> None:
        if self.on_group is not None and invocations:
            self.on_group(invocations)

