"""Game of 24 for the Tree-of-Thoughts search (section 19): puzzles, prompts, parsing, grading.

A state is the numbers left plus the steps taken so far. A step combines two numbers left into
one, so a 4-number puzzle is done after 3 steps, with one number left:

    (1 1 4 6) --"4 * 6 = 24 (left: 1 1 24)"--> (1 1 24) --> (1 24) --> (24)

Model text is parsed strictly: a proposal line must read ``a op b = c (left: ...)`` exactly,
with integers or ``n/d`` fractions. A line that does not match is *unparsed*; a line that
matches but whose numbers are not left, whose arithmetic is wrong (checked with exact
fractions) or whose ``left`` list is not what remains is *invalid*. Both are counted, never
fatal. Answers are graded by evaluating the expression built from the steps with fractions.
"""
from __future__ import annotations

import csv
import io
import itertools
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from kmesh_lib.base.data import resolve_path
from kmesh_lib.base.params import read_bounded

TARGET = Fraction(24)
VALUE_SCORES = {"sure": 20.0, "likely": 1.0, "impossible": 0.001}  # Yao et al. 2023; unparsed scores 0

# Our own few-shot text: one shared header teaches both call kinds, so every prompt of a run
# starts with the same tokens and a child prompt can extend its parent's prompt + output.
FEWSHOT = """Game of 24: use each input number exactly once with + - * / to make 24.
To propose, write possible next steps, one per line: a op b = c (left: numbers left)
To evaluate, reason briefly, then end with: Judgement: sure, likely or impossible

Input: 2 8 8 14
Possible next steps:
2 + 8 = 10 (left: 8 10 14)
8 / 2 = 4 (left: 4 8 14)
14 + 2 = 16 (left: 8 8 16)
14 - 8 = 6 (left: 2 6 8)
8 - 2 = 6 (left: 6 8 14)

Evaluate: 4 8 14
14 - 8 = 6, 4 * 6 = 24
Judgement: sure

Evaluate: 6 8 14
14 - 8 = 6, 6 * 6 = 36, 6 + 8 + 14 = 28, (14 - 6) * 8 = 64
Judgement: impossible

Evaluate: 2 6 8
2 * 8 = 16, 16 + 6 = 22, close to 24
Judgement: likely

Input: 4 8 14
Possible next steps:
14 - 8 = 6 (left: 4 6)
4 + 8 = 12 (left: 12 14)
8 / 4 = 2 (left: 2 14)

Evaluate: 4 6
4 * 6 = 24
Judgement: sure

Input: 4 6
Possible next steps:
4 * 6 = 24 (left: 24)

Evaluate: 24
Judgement: sure
"""

_NUM = r"-?\d+(?:/\d+)?"
PROPOSAL_RE = re.compile(rf"\s*({_NUM}) ([-+*/]) ({_NUM}) = ({_NUM}) \(left: ({_NUM}(?: {_NUM})*)\)\s*")
JUDGEMENT_RE = re.compile(r"\s*Judgement: (sure|likely|impossible)\s*")
BLOCK_END = ("Input:", "Evaluate:", "Judgement:")  # the model moved on to the next few-shot part
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
       "/": lambda a, b: a / b if b else None}


@dataclass(frozen=True)
class Puzzle:
    index: int  # row in file order, 0-based
    numbers: tuple[int, ...]
    rank: int


def repo_path(path: str | Path) -> Path:
    """A relative path (the puzzle file, a manifest) is relative to the repository root, and
    ``$KMESH_DATA_ROOT/...`` is under the data root (``base.data.resolve_path``)."""
    return resolve_path(path)


MAX_PUZZLES_BYTES = 1 << 24  # the puzzle file is 40 KB


def load_puzzles(path: str | Path, indices: list[int] | None = None) -> list[Puzzle]:
    """Puzzles by 0-based row index in file order (all of them when ``indices`` is None).

    Raises ValueError (one line, quoting no row) for a file that is not a puzzle CSV: no
    ``Puzzles`` and ``Rank`` columns, a row without four numbers and a rank, more than 16 MiB.
    """
    data = read_bounded(repo_path(path), MAX_PUZZLES_BYTES, "puzzle CSV")
    try:
        rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"not a CSV file ({type(e).__name__})") from None
    if not rows or not {"Puzzles", "Rank"} <= set(rows[0]):
        raise ValueError("not a puzzle CSV: it needs the columns Puzzles and Rank")
    puzzles = []
    for i, row in enumerate(rows):
        try:
            numbers = tuple(int(x) for x in (row["Puzzles"] or "").split())
            puzzles.append(Puzzle(i, numbers, int(row["Rank"])))
        except (TypeError, ValueError):
            raise ValueError(f"row {i}: Puzzles is not numbers or Rank not an integer") from None
        if len(numbers) != 4:
            raise ValueError(f"row {i}: Puzzles holds {len(numbers)} numbers, not 4")
    if indices is None:
        return puzzles
    bad = [i for i in indices if not 0 <= i < len(puzzles)]
    if bad:
        raise IndexError(f"puzzle indices {bad} out of range 0..{len(puzzles) - 1}")
    return [puzzles[i] for i in indices]


def fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


@dataclass(frozen=True)
class State:
    """Numbers left, each with the expression that produced it, and the steps taken."""

    numbers: tuple[Fraction, ...]
    exprs: tuple[str, ...]
    steps: tuple[str, ...] = ()

    @property
    def left(self) -> str:
        return " ".join(fmt(x) for x in self.numbers)

    @property
    def value_key(self) -> tuple[Fraction, ...]:
        """What a value call judges: the numbers left, in any order (the memoization key)."""
        return tuple(sorted(self.numbers))

    @property
    def expression(self) -> str:
        """The whole computation so far; for a finished state, the answer."""
        text = " , ".join(self.exprs)
        return text[1:-1] if len(self.exprs) == 1 and text.startswith("(") and _balanced(text[1:-1]) else text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def root_state(numbers) -> State:
    numbers = tuple(numbers)
    return State(tuple(Fraction(n) for n in numbers), tuple(str(n) for n in numbers))


def apply_step(state: State, a: Fraction, op: str, b: Fraction, c: Fraction, left: list[Fraction]) -> State | None:
    """The state after ``a op b = c``, or None when the step is not valid from ``state``."""
    i = next((k for k, x in enumerate(state.numbers) if x == a), None)
    j = next((k for k, x in enumerate(state.numbers) if x == b and k != i), None)
    if i is None or j is None or OPS[op](a, b) != c:
        return None
    rest = [k for k in range(len(state.numbers)) if k not in (i, j)]
    numbers = tuple(state.numbers[k] for k in rest) + (c,)
    if sorted(numbers) != sorted(left):
        return None
    step = f"{fmt(a)} {op} {fmt(b)} = {fmt(c)} (left: {' '.join(fmt(x) for x in numbers)})"
    exprs = tuple(state.exprs[k] for k in rest) + (f"({state.exprs[i]} {op} {state.exprs[j]})",)
    return State(numbers, exprs, state.steps + (step,))


@dataclass
class ProposalParse:
    states: list[State]
    num_lines: int = 0  # lines in the proposal block
    num_unparsed_lines: int = 0  # lines that do not match the format
    num_invalid: int = 0  # lines that match but are wrong (numbers, arithmetic or left list)


def proposal_block(text: str) -> list[str]:
    """Lines up to the first blank line or the first line that starts the next few-shot part."""
    lines = []
    for line in text.split("\n"):
        if not line.strip() or line.lstrip().startswith(BLOCK_END):
            break
        lines.append(line)
    return lines


def parse_proposals(state: State, text: str) -> ProposalParse:
    out = ProposalParse([])
    for line in proposal_block(text):
        out.num_lines += 1
        m = PROPOSAL_RE.fullmatch(line)
        if m is None:
            out.num_unparsed_lines += 1
            continue
        a, op, b, c, left = m.groups()
        new = apply_step(state, Fraction(a), op, Fraction(b), Fraction(c), [Fraction(x) for x in left.split()])
        if new is None:
            out.num_invalid += 1
        else:
            out.states.append(new)
    return out


def parse_judgement(text: str) -> str | None:
    """The first ``Judgement: sure|likely|impossible`` line before the next few-shot part."""
    for line in text.split("\n"):
        if (m := JUDGEMENT_RE.fullmatch(line)) or line.lstrip().startswith(("Input:", "Evaluate:")):
            return m.group(1) if m else None
    return None


def propose_question(state: State) -> str:
    return f"\nInput: {state.left}\nPossible next steps:\n"


def value_question(state: State) -> str:
    return f"\nEvaluate: {state.left}\n"


# -- grading --
_TOKEN_RE = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


@dataclass(frozen=True)
class Grade:
    ok: bool
    value: Fraction | None
    reason: str


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value and the integer literals of an expression of + - * / and parentheses.

    Raises:
        ValueError: on a syntax error or a division by zero.
    """
    tokens, pos = [], 0
    while pos < len(expression.rstrip()):
        m = _TOKEN_RE.match(expression, pos)
        if m is None:
            raise ValueError(f"unexpected text at {pos}: {expression[pos:pos + 10]!r}")
        tokens.append(int(m.group(1)) if m.group(1) else m.group(2))
        pos = m.end()
    literals: list[int] = []

    def parse(i: int, level: int) -> tuple[Fraction, int]:
        if level == 2:  # factor
            if i < len(tokens) and tokens[i] == "(":
                value, i = parse(i + 1, 0)
                if i >= len(tokens) or tokens[i] != ")":
                    raise ValueError("unbalanced parentheses")
                return value, i + 1
            if i < len(tokens) and isinstance(tokens[i], int):
                literals.append(tokens[i])
                return Fraction(tokens[i]), i + 1
            raise ValueError(f"expected a number at token {i}")
        ops = ("+", "-") if level == 0 else ("*", "/")
        value, i = parse(i, level + 1)
        while i < len(tokens) and tokens[i] in ops:
            op = tokens[i]
            rhs, i = parse(i + 1, level + 1)
            if op == "/" and rhs == 0:
                raise ValueError("division by zero")
            value = OPS[op](value, rhs)
        return value, i

    value, end = parse(0, 0)
    if end != len(tokens):
        raise ValueError(f"unexpected token {tokens[end]!r}")
    return value, literals


def grade(numbers, expression: str | None) -> Grade:
    """Solved iff the expression uses exactly the puzzle's numbers and equals 24 exactly."""
    if not expression:
        return Grade(False, None, "no expression")
    try:
        value, literals = evaluate(expression)
    except ValueError as e:
        return Grade(False, None, f"does not evaluate: {e}")
    if sorted(literals) != sorted(numbers):
        return Grade(False, value, f"uses {sorted(literals)}, not the puzzle's {sorted(numbers)}")
    if value != TARGET:
        return Grade(False, value, f"equals {fmt(value)}, not 24")
    return Grade(True, value, "equals 24")


def solve(numbers) -> str | None:
    """A brute-force solution (for tests and the test oracle), or None if there is none."""
    def search(state: State) -> State | None:
        if len(state.numbers) == 1:
            return state if state.numbers[0] == TARGET else None
        for i, j in itertools.permutations(range(len(state.numbers)), 2):
            a, b = state.numbers[i], state.numbers[j]
            for op in OPS:
                c = OPS[op](a, b)
                if c is None:
                    continue
                rest = [x for k, x in enumerate(state.numbers) if k not in (i, j)]
                found = search(apply_step(state, a, op, b, c, rest + [c]))
                if found:
                    return found
        return None

    found = search(root_state(numbers))
    return found.expression if found else None
