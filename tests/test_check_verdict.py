"""``base.checks.verdict``: the phrase a results table shows for a run's checks. A skipped check is not a pass, so
a run with one says so (engine_check b42b passed with one skipped, and its row read "all passed" before)."""
import pytest

from kmesh_lib.base.checks import Check, verdict


@pytest.mark.parametrize("statuses, phrase", [
    (["ok", "ok"], "all passed"),
    (["ok", "skipped"], "all others passed, 1 skipped"),
    (["failed", "ok", "failed"], "2 failed"),
    (["failed", "skipped", "skipped"], "1 failed, 2 skipped"),
    (["skipped", "skipped"], "none ran, 2 skipped"),  # a running run's files: no check has its evidence yet
])
def test_the_phrase_names_every_check_that_is_not_ok(statuses, phrase):
    assert verdict([Check(f"c{i}", s, "") for i, s in enumerate(statuses)]) == phrase


def test_a_recorded_nan_agrees_with_a_recomputed_nan_and_with_nothing_else():
    """An interval of one pair is NaN in the table and in results.json (JSON keeps it): the same figure."""
    from kmesh_lib.base.checks import differences

    nan = float("nan")
    assert differences({"ci": [nan, 1.0]}, {"ci": [nan, 1.0]}) == []
    assert differences({"ci": [nan]}, {"ci": [0.0]}) == ["ci[0]: nan != 0.0"]
    assert differences({"ci": [0.0]}, {"ci": [nan]}) == ["ci[0]: 0.0 != nan"]
