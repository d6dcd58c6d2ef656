"""Game of 24 (section 19): puzzle file, strict proposal parsing, judgements, exact grading."""
from fractions import Fraction

import pytest

from kmesh_lib.base.data import resolve_path
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.game24 import grade, parse_judgement, parse_proposals, root_state


@pytest.mark.requires_data("game24")
def test_puzzles_come_in_file_order():
    first = game24.load_puzzles(resolve_path("$KMESH_DATA_ROOT/game24/24.csv"), [0, 1, 2])
    assert [(p.index, p.numbers, p.rank) for p in first] == [
        (0, (1, 1, 4, 6), 1), (1, (1, 1, 11, 11), 2), (2, (1, 1, 3, 8), 3)]
    every = game24.load_puzzles(resolve_path("$KMESH_DATA_ROOT/game24/24.csv"))
    assert len(every) == 1362 and all(len(p.numbers) == 4 for p in every)
    with pytest.raises(IndexError, match="out of range"):
        game24.load_puzzles(resolve_path("$KMESH_DATA_ROOT/game24/24.csv"), [1362])


def test_valid_lines_make_states_with_expressions():
    text = "4 * 6 = 24 (left: 1 1 24)\n1 + 1 = 2 (left: 2 4 6)\n6 / 4 = 3/2 (left: 1 1 3/2)\n\nEvaluate: 1 1 24\n"
    parsed = parse_proposals(root_state((1, 1, 4, 6)), text)
    assert (parsed.num_lines, parsed.num_unparsed_lines, parsed.num_invalid) == (3, 0, 0)
    first, second, third = parsed.states
    assert first.numbers == (1, 1, 24) and first.exprs == ("1", "1", "(4 * 6)")
    assert first.steps == ("4 * 6 = 24 (left: 1 1 24)",)
    assert second.value_key == (2, 4, 6)
    assert third.numbers == (1, 1, Fraction(3, 2)) and third.left == "1 1 3/2"


def test_unparsed_and_invalid_lines_are_counted_not_fatal():
    text = "\n".join([
        "1. 4 * 6 = 24 (left: 1 1 24)",  # numbered: unparsed
        "4*6 = 24 (left: 1 1 24)",  # no spaces: unparsed
        "4 * 6 = 25 (left: 1 1 25)",  # wrong arithmetic: invalid
        "4 * 7 = 28 (left: 1 1 28)",  # 7 is not left: invalid
        "4 * 6 = 24 (left: 1 24)",  # left list wrong: invalid
        "1 - 1 = 0 (left: 0 4 6)",  # valid
        "6 / 0 = 1 (left: 1 1 4)",  # 0 not left: invalid
        "garbage \ufffd\ufffd",  # unparsed
    ])
    parsed = parse_proposals(root_state((1, 1, 4, 6)), text)
    assert (parsed.num_lines, parsed.num_unparsed_lines, parsed.num_invalid, len(parsed.states)) == (8, 3, 4, 1)
    empty = parse_proposals(root_state((1, 1, 4, 6)), "\n\nInput: 1 1 4 6")
    assert (empty.num_lines, empty.states) == (0, [])


def test_the_block_ends_at_the_next_few_shot_part():
    text = "1 + 1 = 2 (left: 2 4 6)\nEvaluate: 2 4 6\n4 * 6 = 24 (left: 1 1 24)"
    assert parse_proposals(root_state((1, 1, 4, 6)), text).num_lines == 1


def test_judgements():
    assert parse_judgement("4 * 6 = 24\nJudgement: sure\n\nEvaluate: 5") == "sure"
    assert parse_judgement("Judgement: likely") == "likely"
    assert parse_judgement("Judgement: Sure") is None  # strict
    assert parse_judgement("blah\nEvaluate: 1 2\nJudgement: sure") is None  # past the next part
    assert game24.VALUE_SCORES == {"sure": 20.0, "likely": 1.0, "impossible": 0.001}


def test_grading_is_exact_and_checks_the_numbers():
    assert grade((1, 1, 4, 6), "(1 * 1) * (4 * 6)").ok
    assert grade((3, 3, 8, 8), "8 / (3 - 8 / 3)").ok  # needs exact fractions
    assert not grade((1, 1, 4, 6), "4 * 6").ok  # numbers missing
    assert grade((1, 1, 4, 6), "(1 + 1) * 4 * 6").reason == "equals 48, not 24"
    assert "division by zero" in grade((1, 1, 4, 6), "4 * 6 / (1 - 1)").reason
    assert not grade((1, 1, 4, 6), None).ok and not grade((1, 1, 4, 6), "4 * 6 (").ok


def test_few_shot_examples_are_consistent():
    """Every example proposal line is valid, and every judgement agrees with a brute-force solver
    except the 'likely' ones (a judgement call)."""
    blocks = game24.FEWSHOT.split("\n\n")
    for block in blocks:
        lines = block.split("\n")
        if lines[0].startswith("Input: "):
            state = root_state(int(x) for x in lines[0][7:].split())
            parsed = parse_proposals(state, "\n".join(lines[2:]))
            assert parsed.num_lines == len(lines) - 2 == len(parsed.states), block
        if lines[0].startswith("Evaluate: "):
            numbers = [int(x) for x in lines[0][10:].split()]
            judgement = parse_judgement("\n".join(lines[1:]))
            if judgement != "likely":
                assert (judgement == "sure") == (game24.solve(numbers) is not None), block


def test_solver_finds_the_first_puzzles():
    for numbers in ((1, 1, 4, 6), (1, 1, 11, 11), (1, 1, 3, 8)):
        assert grade(numbers, game24.solve(numbers)).ok
    assert game24.solve((1, 1, 1, 1)) is None
