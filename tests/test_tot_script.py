"""The scripted policy (section 19): seeded, a weak model's text at the asked error rate and accuracy."""
from collections import Counter
from fractions import Fraction

import pytest

from kmesh_lib.engine.model_spec import ByteTokenizer
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_script import P_RUN_TO_CAP, ScriptedPolicy, candidate_steps, solvable
from kmesh_lib.workloads.tot_search import Call, encode

TOK = ByteTokenizer(512)


def call(kind, numbers, i=0):
    state = game24.root_state(numbers)
    return Call(f"q0-c{i:04d}-{kind}", kind, i, 0, 1, None, (5, 6), 0, state)


def proposal_lines(policy, n=300):
    """Parse statistics over n proposal calls on assorted states, as the search would read them."""
    stats = Counter()
    for i in range(n):
        c = call("proposal", (1 + i % 7, 2 + i % 5, 3 + i % 11, 4 + i % 3), i)
        parsed = game24.parse_proposals(c.state, policy.text(c))
        stats.update(lines=parsed.num_lines, unparsed=parsed.num_unparsed_lines, invalid=parsed.num_invalid,
                     valid=len(parsed.states))
    return stats


def test_the_same_call_gives_the_same_output_and_another_call_another():
    policy = ScriptedPolicy(TOK, seed=3)
    a, b = call("proposal", (1, 2, 3, 4), 0), call("proposal", (1, 2, 3, 4), 1)
    assert policy.token_ids(a) == policy.token_ids(a) == ScriptedPolicy(TOK, seed=3).token_ids(a)
    assert policy.token_ids(a) != policy.token_ids(b)
    assert policy.token_ids(a) != ScriptedPolicy(TOK, seed=4).token_ids(a)
    assert TOK.decode(policy.token_ids(a)) == policy.text(a)


def test_lengths_are_capped_and_most_calls_run_to_the_cap():
    policy = ScriptedPolicy(TOK, seed=0, max_tokens=192)
    lengths = [len(policy.token_ids(call(kind, (1, 2, 3, 4), i))) for i in range(400) for kind in ("proposal", "value")]
    assert max(lengths) == 192 and min(lengths) >= 1
    at_cap = sum(n == 192 for n in lengths) / len(lengths)
    assert P_RUN_TO_CAP - 0.1 < at_cap < P_RUN_TO_CAP + 0.25  # runs to the cap, plus answers longer than it
    assert len(set(lengths)) > 20  # the rest stop a short, varying tail after their answer


def test_error_rate_zero_writes_only_valid_lines_except_where_the_cap_cuts():
    stats = proposal_lines(ScriptedPolicy(TOK, seed=1, error_rate=0.0, max_tokens=1000))
    assert stats["invalid"] == stats["unparsed"] == 0 and stats["valid"] == stats["lines"] > 900


@pytest.mark.parametrize("error_rate, unparsed_share", [(0.25, 0.5), (0.5, 0.2), (1.0, 1.0)])
def test_wrong_lines_come_at_the_asked_rate_and_split(error_rate, unparsed_share):
    stats = proposal_lines(ScriptedPolicy(TOK, seed=2, error_rate=error_rate, unparsed_share=unparsed_share,
                                          max_tokens=1000))
    wrong = stats["invalid"] + stats["unparsed"]
    assert wrong / stats["lines"] == pytest.approx(error_rate, abs=0.05)
    assert stats["unparsed"] / max(wrong, 1) == pytest.approx(unparsed_share, abs=0.06)


def test_every_candidate_step_is_valid_and_distinct():
    state = game24.root_state((1, 1, 4, 6))
    steps = candidate_steps(state)
    assert len(steps) == len({(a, op, b) for a, op, b, _ in steps})
    for a, op, b, rest in steps:
        c = game24.OPS[op](a, b)
        assert c is not None and game24.apply_step(state, a, op, b, c, rest + [c]) is not None


@pytest.mark.parametrize("accuracy", [1.0, 0.0])
def test_judgements_follow_the_oracle_at_the_asked_accuracy(accuracy):
    policy = ScriptedPolicy(TOK, seed=5, value_accuracy=accuracy, max_tokens=1000)
    states = [(4, 6), (1, 1), (24,), (25,), (1, 2, 3), (13, 13, 13)]
    for i, numbers in enumerate(states * 5):
        judgement = game24.parse_judgement(policy.text(call("value", numbers, i)))
        reachable = solvable(tuple(sorted(Fraction(n) for n in numbers)))
        assert (judgement in ("sure", "likely")) == (reachable == (accuracy == 1.0)), (numbers, judgement)


def test_rates_outside_zero_to_one_are_refused():
    with pytest.raises(ValueError, match="error_rate=1.5"):
        ScriptedPolicy(TOK, error_rate=1.5)
    with pytest.raises(ValueError, match="max_tokens=0"):
        ScriptedPolicy(TOK, max_tokens=0)


def test_a_real_tokenizer_interface_is_used_without_special_tokens():
    class Bpe:  # the transformers call the search makes: encode(text, add_special_tokens=False)
        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return [ord(ch) for ch in text]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    policy = ScriptedPolicy(Bpe(), seed=0, max_tokens=50)
    c = call("value", (4, 6))
    assert policy.token_ids(c) == encode(Bpe(), policy.text(c))[:50]
