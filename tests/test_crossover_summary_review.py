"""Section 21's answer and verdict as a reader meets them (review of 458a, 89ce and b43a, 6 Dec 2026): which recompute
each speed-up is over, why a length below the crossover is no win, what an "at the floor" interval leaves open, the
paired reading beside the grid's, a negative median cost that meets no goal, and why a speed-up is the size it is."""
from __future__ import annotations

import math

import pytest

from kmesh_lib.sections.crossover import report as cr
from kmesh_lib.sections.crossover import summary

N = cr.GOAL_MIN_TOKENS


def _arms(point: dict[str, float], model: str = "m", tokens: int = N) -> list[dict]:
    return [{"model": model, "context_tokens": tokens, "arm": a, "ttft_ms": ms} for a, ms in point.items()]


def test_a_length_below_the_crossover_says_why_it_is_no_win_and_an_earlier_win_is_said():
    """458a's DRAM: 1.27x [1.10, 1.77] at 1,024 (a win), 1.06x [0.99, 1.44] at 4,096 (its interval reaches 1), then
    wins from 16,384. The phrase gave the 4,096 median alone, which reads as a win, and left 1,024 out."""
    row = {"model": "m", "path": "dram", "crossover_tokens": 16384,
           "speedup@1024": 1.27, "speedup@4096": 1.06, "speedup@16384": 1.13, "speedup@32512": 1.84,
           "speedup_ci@1024": [1.10, 1.77], "speedup_ci@4096": [0.995, 1.44], "speedup_ci@16384": [1.06, 1.39],
           "speedup_ci@32512": [1.66, 2.02]}
    said = summary.path_phrase(row)
    assert "1.06\u00d7 [0.99, 1.44] at 4,096, whose interval reaches 1" in said
    assert "faster at 1,024 too, 1.27\u00d7 [1.10, 1.77], but not at every length above it" in said
    # a length below that lost outright needs no reason, and a loss at 1,024 is no earlier win
    lost = {**row, "speedup@4096": 0.9, "speedup_ci@4096": [0.8, 0.97], "speedup_ci@1024": [0.9, 1.7]}
    said = summary.path_phrase(lost)
    assert "0.90\u00d7 [0.80, 0.97] at 4,096," in said and "reaches 1" not in said and "faster at 1,024" not in said


def test_the_verdict_and_the_findings_name_whose_recompute_a_speed_up_is_over():
    """458a put vLLM's CPU tier's 3.08x (over its own engine's recompute, 158 ms) beside DRAM's 1.84x (over the LMCache
    engine's, 156 ms) and named neither; a run without the tier's own recompute sets it against the LMCache engine's."""
    own = {"path": "native_offload", "control": "native_recompute"}  # the row's one control (arms.control_of)
    assert summary._over(own) == "over its own engine's recompute" and summary._own_control(own)
    assert summary._over({"path": "dram", "control": "recompute"}) == "over its own engine's recompute"
    other = {"path": "native_offload", "control": "recompute"}  # the tier's own recompute not measured at every length
    assert summary._over(other) == "over the LMCache engine's recompute (another engine)"
    assert not summary._own_control(other) and not summary._own_control({"path": "native_offload"})  # before the column


def test_an_at_the_floor_verdict_says_how_far_above_the_floor_its_interval_reaches():
    """b43a's 7B DRAM span at 32,512 read **at the floor** from [14.0, 63.6] ms against a 33.7-33.8 ms floor: the
    interval reaches the floor, and 1.89x it too. Within RESOLVE_FRACTION of the floor's max nothing is added."""
    floor = [33.675, 33.824]
    assert summary._reach("at the floor", 63.602, floor) == (
        " (its interval reaches 1.89\u00d7 the floor: not told apart from a cost that far above it)")
    assert summary._reach("at the floor", 33.824 * (1 + cr.RESOLVE_FRACTION), floor) == ""
    assert summary._reach("1.20\u20131.30\u00d7 its floor", 63.6, floor) == ""  # a ratio says its own reach
    assert summary._reach("at the floor", float("nan"), floor) == "" and summary._reach("at the floor", 60.0, None) == ""
    row = {"span_ci_ms": [33.5, 53.4], "span_ci_serial_ms": [14.0, 63.6], "ttft_difference_ci_ms": [42.2, 66.3],
           "ttft_difference_ci_serial_ms": [None, None]}
    assert summary._high(row, "span") == 63.6  # the widened interval the verdict judged
    assert summary._high(row, "ttft_difference") == 66.3  # no widened one: the bootstrap's
    assert summary._high({"span_ci_ms": [None, None]}, "span") != summary._high({"span_ci_ms": [None, None]}, "span")


def test_the_longest_points_reading_gives_the_paired_cost_beside_the_grids():
    """89ce's layered GPU buffer at 32,512 read "-3.7 ms [-12.1, +8.6]: no cost measured" from two unpaired medians of
    8 repeats while its 64 pairs measured +0.243 ms [0.109, 0.402]; both are said now."""
    tables = {"floor_distance": [{"model": "m", "context_tokens": N, "path": "gpubuf_layered", "restore_cost_ms": -3.7,
                                  "transfer_floor_ms": 0.209, "x_floor": -17.7}],
              "restore_resolution": [{"model": "m", "context_tokens": N, "path": "gpubuf_layered", "num_pairs": 64,
                                      "ttft_difference_ms": 0.243, "ttft_difference_ci_ms": [0.109, 0.402],
                                      "ttft_difference_ci_serial_ms": [0.109, 0.402], "ttft_verdict": "at the floor",
                                      "floor_ms": [0.216, 0.229]}]}
    [line] = summary._floor_sentences(tables, N)
    assert ("; paired (64 restores, each beside its resident follow-up): +0.243 ms [+0.109, +0.402] against the floor "
            "measured around the point: at the floor (its interval reaches 1.86\u00d7 the floor") in line
    assert summary._paired_clause(None) == "" and summary._paired_clause({"ttft_difference_ms": None}) == ""


def test_a_negative_median_cost_meets_no_goal():
    """89ce's goal line read "met at 2 of 2 points", both with the restore's median first token below its resident
    follow-up's: within any bound and resolving nothing. They are counted apart now."""
    goals = [{"model": "m", "context_tokens": N, "fastest_within": True, "fastest_cost_ms": -3.7},
             {"model": "m", "context_tokens": 2 * N, "fastest_within": True, "fastest_cost_ms": 0.1},
             {"model": "m", "context_tokens": 4 * N, "fastest_within": False, "fastest_cost_ms": 9.0}]
    [line] = [x for x in summary._goal_sentences({"arms": []}, goals=goals, critical=[]) if x.startswith("The fastest")]
    assert "met at 1 of 3 points (and 1 with a negative cost, not counted" in line


def test_the_disk_bound_is_not_claimed_where_the_per_point_floor_puts_the_restores_below_it():
    below = {"model": "m", "context_tokens": N, "path": "disk",
             "span_verdict": "below its floor (a method problem, not a result)"}
    assert summary._disk_bound({}, N) == ", so the disk itself bounds it"
    assert summary._disk_bound({"restore_resolution": [{**below, "span_verdict": "at the floor"}]}, N) == (
        ", so the disk itself bounds it")
    assert "does not say what bounds them" in summary._disk_bound({"restore_resolution": [below]}, N)
    assert summary._disk_bound({"restore_resolution": [below]}, 2 * N) == ", so the disk itself bounds it"  # another point


def test_a_disk_floor_its_restores_beat_is_set_beside_lmcaches_own_read_of_the_same_bytes():
    """0248 (H100, 0.5B, 32,512 tokens): the disk restores' span [198.1, 199.9] ms fell below the floor [205.7, 206.7];
    LMCache's own disk read (its probe) took 167.6 ms where the floor's reads of the same bytes took 198.2-199.4 ms:
    the answer says the floor's reader, not the disk, is what they beat, and only where the read is faster."""
    below = {"model": "m", "context_tokens": N, "path": "disk", "floor_overlapped_ms": [198.18, 199.36],
             "span_verdict_overlapped": "at the floor",
             "span_verdict": "below its floor (a method problem, not a result)"}
    read = [{"model": "m", "context_tokens": N, "arm": "disk", "disk_read_ms": 167.6},
            {"model": "m", "context_tokens": N, "arm": "dram", "disk_read_ms": None}]
    clause = summary._own_read_clause(below, read)
    assert clause == ("; LMCache's own disk read there took 167.6 ms (its probe, median of the grid's disk follow-ups), "
                      "faster than the floor's reads of the same bytes (198.2\u2013199.4 ms): the floor's reader, not "
                      "the disk, is what these restores beat")
    within = summary._own_read_clause(below, [{**read[0], "disk_read_ms": 198.5}])
    assert "within the floor's reads" in within and "not the disk" not in within
    assert summary._own_read_clause({**below, "span_verdict": "at the floor"}, read) == ""
    assert summary._own_read_clause({**below, "context_tokens": 2 * N}, read) == ""  # no read at that point
    assert summary._own_read_clause(below, None) == ""
    bound = summary._disk_bound({"restore_resolution": [below], "components": read}, N)
    assert bound.startswith("; its restores there fall below") and clause in bound
    assert bound.endswith("so this run does not say what bounds them")
    [line] = summary._resolution_sentences([{**below, "span_ms": 198.7, "span_ci_ms": [198.1, 199.9], "floor_ms":
                                             [205.7, 206.7], "ttft_difference_ms": None, "ttft_verdict": "not paired",
                                             "num_restores": 8, "resolved": True}], components=read)
    assert clause in line


def test_why_a_speed_up_is_its_size_splits_both_first_tokens_at_the_crossover():
    """458a's 0.5B DRAM at 16,384: recompute 60.3 = resident 22.1 + 38.2 of prefill, the restore 53.4 = 22.1 + 31.3
    (8.6x its floor): it saves 6.9 ms, hence 1.13x. A path that never wins is split at its longest length."""
    tables = {"arms": _arms({"recompute": 60.3, "resident": 22.1, "dram": 53.4, "disk": 176.2})
              + _arms({"recompute": 155.6, "resident": 30.5, "dram": 84.5, "disk": 321.4}, tokens=2 * N),
              "floor_distance": [{"model": "m", "context_tokens": N, "path": "dram", "x_floor": 8.6}]}
    paths = {"dram": {"path": "dram", "crossover_tokens": N, f"speedup@{N}": 1.13, f"speedup@{2 * N}": 1.84},
             "disk": {"path": "disk", "crossover_tokens": None, f"speedup@{N}": 0.34, f"speedup@{2 * N}": 0.48}}
    said = summary._savings(tables, "m", paths)
    assert ("DRAM at 16,384 tokens, recompute 60.3 = 22.1 +38.2 against the restore 53.4 = 22.1 +31.3 "
            "(8.6\u00d7 its transfer floor): saves 6.9") in said
    assert "disk at 32,768 tokens, recompute 155.6 = 30.5 +125.1 against the restore 321.4 = 30.5 +290.9: loses 165.8" in said
    assert summary._savings({"arms": []}, "m", paths) == ""


def test_the_floor_plot_draws_a_shared_floor_once_and_vllms_cpu_tier_its_load_time(tmp_path):
    """458a's floor plot: dram's and native_offload's floors (both host->device) lay one on the other, the legend
    naming a dram floor no one could see; and the notebook's promised restore span of vLLM's CPU tier was not drawn
    (its timeline has load_time_ms, no restore_ms)."""
    import matplotlib.pyplot as plt

    floors = [{"model": "m", "context_tokens": n, "path": path, "restore_cost_ms": cost * n / N,
               "transfer_floor_ms": 3.6 * n / N, "x_floor": round(cost / 3.6, 1)}
              for n in (N, 2 * N) for path, cost in (("dram", 31.3), ("native_offload", 9.6))]
    splits = [{"model": "m", "context_tokens": n, "arm": "native_offload", "load_time_ms": 5.5 * n / N} for n in (N, 2 * N)]
    fig = cr.floor_plot(floors, tmp_path / "f.png", splits)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["dram: restore cost", "dram, native_offload: transfer floor", "native_offload: restore cost",
                      "native_offload: restore span (timeline)"], labels
    plt.close("all")


def test_a_log_axis_labels_a_thousand_plainly():
    """b43a's floor plot labelled its top tick "1e+03" (the 7B disk restore, 1,068 ms)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(1, 2000)
    cr.label_log_axis(ax.yaxis)
    formatter = ax.yaxis.get_major_formatter()
    assert [formatter(v, 0) for v in (0.2, 5, 200, 1000, 2000)] == ["0.2", "5", "200", "1,000", "2,000"]
    plt.close("all")


def test_each_heatmap_panel_names_the_recompute_arm_it_is_over(tmp_path):
    """458a's panels read "dram restore vs recompute" and "native_offload restore vs recompute", over two engines'
    recomputes (156 and 158 ms at 32,512): each names its control now."""
    import matplotlib.pyplot as plt

    table = _arms({"recompute": 156.0, "dram": 84.5, "native_recompute": 158.0, "native_offload": 51.2})
    fig = cr.heatmaps(table, tmp_path / "h.png")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["dram restore\nvs recompute", "native_offload restore\nvs native_recompute"], titles
    plt.close("all")


def test_why_gives_no_floor_ratio_for_a_cost_the_grids_spread_hides():
    """89ce's retained GPU buffer at 1,024 tokens: a 0.5 ms cost from two unpaired medians whose interval holds 0 read
    '70.4x its transfer floor'. With the rows, a ratio only where the cost's interval lies above 0."""
    from crossover_records import as_grid_rows

    def rows(arm, values):
        return [{"model": "m", "context_tokens": 1024, "arm": arm, "measured": True, "status": "ok", "ttft_s": v / 1e3}
                for v in values]

    tables = {"arms": _arms({"gpubuf_recompute": 20.5, "gpubuf_resident": 9.7, "gpubuf_retained": 10.2}, tokens=1024),
              "floor_distance": [{"model": "m", "context_tokens": 1024, "path": "gpubuf_retained", "x_floor": 70.4}]}
    paths = {"gpubuf_retained": {"path": "gpubuf_retained", "crossover_tokens": 1024, "speedup@1024": 2.0,
                                 "control": "gpubuf_recompute"}}
    noisy = as_grid_rows(rows("gpubuf_resident", [7.3, 9.7, 10.4, 8.7]) + rows("gpubuf_retained", [6.9, 10.2, 10.6, 7.9]))
    assert "70.4" in summary._savings(tables, "m", paths) and "70.4" not in summary._savings(tables, "m", paths, noisy)
    apart = as_grid_rows(rows("gpubuf_resident", [9.6, 9.7, 9.8, 9.7]) + rows("gpubuf_retained", [10.2, 10.3, 10.2, 10.4]))
    assert "(70.4\u00d7 its transfer floor)" in summary._savings(tables, "m", paths, apart)


def test_a_heatmap_panel_names_only_the_recompute_arms_its_cells_are_over(tmp_path):
    """A model without the path has a control by ``control_of``'s rule (the LMCache engine's) but no cell: the panel
    named it beside the one its cells were over ("native_offload restore vs native_recompute / recompute")."""
    import matplotlib.pyplot as plt

    table = (_arms({"recompute": 156.0, "dram": 84.5, "native_recompute": 158.0, "native_offload": 51.2}, model="a")
             + _arms({"recompute": 100.0, "dram": 50.0, "native_offload": 40.0}, model="b"))
    fig = cr.heatmaps(table, tmp_path / "h.png")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["dram restore\nvs recompute",
                      "native_offload restore\nvs native_recompute (a) / recompute (b)"], titles
    fig = cr.heatmaps(table[:4] + table[4:6], tmp_path / "h2.png")  # b has no native_offload: no cell, not named
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["dram restore\nvs recompute", "native_offload restore\nvs native_recompute"], titles
    plt.close("all")


def test_every_sentence_reads_a_rows_control_one_way():
    """After the merge of 6 Dec three helpers read a crossover row's control three ways (``row["control"]``,
    ``row.get("control", "recompute")``, ``row.get("control") or "recompute"``): a row without one (from before the
    column) or with a null one crashed the phrase and the findings, or read as over the LMCache engine's in one
    sentence and another in the next. One reading now: no control is the LMCache engine's ``recompute``."""
    tables = {"arms": _arms({"recompute": 200.0, "resident": 20.0, "native_recompute": 100.0, "native_resident": 30.0,
                             "native_offload": 50.0})}
    for control in (None, "missing"):
        row = {"model": "m", "path": "native_offload", "crossover_tokens": N, f"speedup@{N}": 4.0}
        if control is None:
            row["control"] = None
        assert "(over the LMCache engine's recompute; " in summary.path_phrase(row)
        assert summary._recompute_ms(tables, row, N) == 200.0
        assert summary._other_engine(tables, row, N) == (
            ", on another engine: its resident follow-up 20.0 ms, this engine's 30.0 ms")
        assert summary._over(row) == "over the LMCache engine's recompute (another engine)"


def test_why_splits_a_recompute_on_another_engine_against_that_engines_resident():
    """a47e (1.5B, 16,384 tokens): vLLM's CPU tier's speed-up is over the LMCache engine's recompute (116.8 ms, its
    resident 12.3 ms); the why read "recompute 116.8 = 16.8 +100.0", the CPU tier's own resident under the LMCache
    engine's recompute, beside DRAM's "116.8 = 12.3 +104.5" of the same recompute."""
    tables = {"arms": _arms({"recompute": 116.8, "resident": 12.3, "dram": 28.6, "native_resident": 16.8,
                             "native_offload": 35.0, "native_recompute": 90.0})}
    over_lmcache = {"path": "native_offload", "control": "recompute", "crossover_tokens": N, f"speedup@{N}": 3.33}
    said = summary._savings(tables, "m", {"native_offload": over_lmcache})
    assert ("vLLM CPU-tier at 16,384 tokens, recompute on the LMCache engine 116.8 = 12.3 +104.5 against the restore "
            "35.0 = 16.8 +18.2: saves 81.8") in said, said
    unsplit = {"arms": [a for a in tables["arms"] if a["arm"] != "resident"]}  # f993: no LMCache resident arm
    assert ("recompute on the LMCache engine 116.8 (its resident follow-up not measured) against the restore 35.0 = "
            "16.8 +18.2: saves 81.8") in summary._savings(unsplit, "m", {"native_offload": over_lmcache})
    own = {**over_lmcache, "control": "native_recompute"}
    assert "recompute 90.0 = 16.8 +73.2 against the restore 35.0 = 16.8 +18.2: saves 55.0" in summary._savings(
        tables, "m", {"native_offload": own})


def test_a_first_token_below_its_floor_says_what_the_same_pairs_forward_passes_did():
    """b298's 7B GPU buffer at 32,512: the retained restore's paired first token +0.753 ms [+0.610, +1.003] against a
    1.26-1.30 ms copy floor read below its floor. The sentence set beside it the grid's forward_steps (its repeats,
    -0.57 ms), not the pairs it judges, whose own forward passes differed by -0.216 ms [-0.269, -0.185]. Now the pairs'
    own difference is said, with its interval: faster or slower where that lies wholly off 0, no measurable difference
    where it holds 0; the verdict stays as judged, and a row whose pairs record no forward pass adds nothing."""
    below = "below its floor (a method problem, not a result)"
    paired = {"model": "m", "context_tokens": N, "path": "gpubuf_retained", "num_pairs": 64, "num_restores": 64,
              "span_ms": 1.378, "span_ci_ms": [1.374, 1.380], "floor_ms": [1.259, 1.301],
              "span_verdict": "1.06\u20131.10\u00d7 its floor", "ttft_difference_ms": 0.753,
              "ttft_difference_ci_ms": [0.610, 1.003], "ttft_verdict": below, "resolved": True,
              "forward_difference_ms": -0.216, "forward_difference_ci_ms": [-0.268, -0.186], "num_forward_pairs": 64}
    faster = ("; in the same pairs the restored follow-up's forward pass ran 0.216 ms [0.186, 0.268] faster than its "
              "resident partner's, which the first-token difference includes")
    tables = {"floor_distance": [{"model": "m", "context_tokens": N, "path": "gpubuf_retained", "restore_cost_ms": 0.9,
                                  "transfer_floor_ms": 1.28, "x_floor": 0.7}],
              "restore_resolution": [paired],
              # the grid's repeats at the same point: no longer what the sentence reads
              "forward_steps": [{"model": "m", "context_tokens": N, "path": "gpubuf_retained", "difference_ms": -0.571,
                                 "difference_ci_ms": [-1.022, -0.448]}]}
    [line] = summary._floor_sentences(tables, N)
    assert f"against the floor measured around the point: {below}{faster}." in line and "0.57" not in line
    [line] = summary._resolution_sentences([paired])
    assert f"(paired): {below} (64 restores" in line and line.endswith(f"resolved to 10% of the floor){faster}.")
    slower = {**paired, "forward_difference_ms": 0.066, "forward_difference_ci_ms": [0.001, 0.151]}
    assert summary._resolution_sentences([slower])[0].endswith(
        "; in the same pairs the restored follow-up's forward pass ran 0.066 ms [0.001, 0.151] slower than its resident "
        "partner's, which the first-token difference includes.")
    holds = {**paired, "forward_difference_ms": -0.003, "forward_difference_ci_ms": [-0.029, 0.035]}
    said = "; in the same pairs the forward passes did not differ measurably (-0.003 ms [-0.029, +0.035]), so that is not why"
    assert summary._resolution_sentences([holds])[0].endswith(f"{said}.")
    assert f"{below}{said}" in summary._floor_sentences({**tables, "restore_resolution": [holds]}, N)[0]
    # a verdict not below the floor, pairs that record no forward pass, or no interval of it: nothing added
    unrecorded = {k: v for k, v in paired.items() if not k.startswith(("forward_", "num_forward"))}
    for row in ({**paired, "ttft_verdict": "at the floor"}, unrecorded,
                {**paired, "forward_difference_ci_ms": [None, None]}):
        assert "in the same pairs" not in summary._resolution_sentences([row])[0]
        assert "in the same pairs" not in summary._floor_sentences({**tables, "restore_resolution": [row]}, N)[0]


def test_a_first_token_below_its_floor_says_where_the_host_stood_when_the_copy_ended():
    """b298's 7B GPU buffer: first tokens below the copy's floor at 16,384 and 32,512 tokens, which the README called
    not explained. Each restore stamps where the host stood when its copy ended (``to_forward_ms``): 0.63-0.72 ms before
    the forward pass's first attention layer at every context while the copy grew from 0.11 to 1.38 ms, so the host
    waits for the copy before that layer, and the host work up to that wait ran beside the copy. The clause says it
    where the first token is below its floor and the row has the stamp; the range needs the same path's other points
    (one point alone says only that the copy ran beside host work); any other verdict adds nothing."""
    below = "below its floor (a method problem, not a result)"
    base = {"model": "m", "path": "gpubuf_retained", "num_pairs": 64, "num_restores": 64, "span_ci_ms": [1.374, 1.380],
            "floor_ms": [1.259, 1.301], "span_verdict": "1.06\u20131.10\u00d7 its floor", "ttft_difference_ms": 0.753,
            "ttft_difference_ci_ms": [0.610, 1.003], "resolved": True, "num_to_forward": 64}
    longest = {**base, "context_tokens": 32512, "span_ms": 1.378, "ttft_verdict": below, "to_forward_ms": 0.722,
               "to_forward_ci_ms": [0.699, 0.744], "num_ended_before_forward": 64}
    short = {**base, "context_tokens": 1024, "span_ms": 0.115, "ttft_verdict": "1.9\u20132.1\u00d7 its floor",
             "to_forward_ms": 0.634, "to_forward_ci_ms": [0.61, 0.65], "num_ended_before_forward": 64}
    every = [short, longest]
    [line] = summary._resolution_sentences([longest], {}, every)
    assert line.endswith(
        "; in 64 of its 64 restores the copy had ended before the host reached the forward pass's first attention layer "
        "(0.722 ms [0.699, 0.744] before, median), and 0.63-0.72 ms before at every context from 1,024 tokens while the "
        "restore grew from 0.12 to 1.38 ms: the host waits for the copy before that layer, so the step's host work "
        "between the copy's launch and that wait ran beside the copy, work a resident step does too; where the host "
        "waits, the records do not show.")
    alone = summary._resolution_sentences([longest], {}, [longest])[0]
    assert "at every context" not in alone and "the copy ran beside host work of the step" in alone
    for row in ({**longest, "ttft_verdict": "at the floor"}, {k: v for k, v in longest.items() if k != "to_forward_ms"}):
        assert "before the host reached" not in summary._resolution_sentences([row], {}, every)[0]
    # the answer's floor sentences say it too, from the whole table
    tables = {"floor_distance": [{"model": "m", "context_tokens": 32512, "path": "gpubuf_retained",
                                  "restore_cost_ms": 0.9, "transfer_floor_ms": 1.28, "x_floor": 0.7}],
              "restore_resolution": every}
    assert "0.63-0.72 ms before at every context" in summary._floor_sentences(tables, 32512)[0]


def test_a_first_token_below_its_floor_says_how_much_later_the_restored_host_reached_the_forward_pass():
    """Beside where the host stood when the copy ended, the same pairs' host paths from where vLLM starts the step's
    loads to the forward pass's first attention layer (``host_path_difference_ms``): later where the interval lies
    wholly above 0, earlier (absolute values) where wholly below, no measurable difference where it holds 0; after the
    to_forward part, before the closing sentence. A row without it reads as before."""
    below = "below its floor (a method problem, not a result)"
    row = {"model": "m", "path": "gpubuf_retained", "num_pairs": 64, "num_restores": 64, "span_ci_ms": [1.374, 1.380],
           "floor_ms": [1.259, 1.301], "span_verdict": "1.06\u20131.10\u00d7 its floor", "ttft_difference_ms": 0.753,
           "ttft_difference_ci_ms": [0.610, 1.003], "resolved": True, "num_to_forward": 64, "context_tokens": 32512,
           "span_ms": 1.378, "ttft_verdict": below, "to_forward_ms": 0.722, "to_forward_ci_ms": [0.699, 0.744],
           "num_ended_before_forward": 64}
    [before] = summary._resolution_sentences([row], {}, [row])
    to_forward = "the copy ran beside host work of the step, which a resident step does too"
    closing = "; where the host waits, the records do not show."
    assert before.endswith(to_forward + closing) and "in the same pairs the restored step's host" not in before
    cases = [([0.512, 0.498, 0.547], "reached that layer 0.512 ms [0.498, 0.547] later than its resident partner's"),
             ([-0.0214, -0.0402, -0.0011], "reached that layer 0.021 ms [0.001, 0.040] earlier than its resident partner's"),
             ([0.004, -0.012, 0.019], "reached that layer with no measurable difference from its resident partner's "
                                      "(+0.004 ms [-0.012, +0.019])")]
    for (median, low, high), said in cases:
        line = summary._resolution_sentences([{**row, "host_path_difference_ms": median, "host_path_difference_ci_ms":
                                               [low, high], "num_host_path_pairs": 64}], {}, [row])[0]
        assert line == before[:-len(closing)] + "; in the same pairs the restored step's host " + said + closing
    # any other verdict adds nothing, the host path with it
    at = {**row, "ttft_verdict": "at the floor", "host_path_difference_ms": 0.512,
          "host_path_difference_ci_ms": [0.498, 0.547], "num_host_path_pairs": 64}
    assert "the restored step's host" not in summary._resolution_sentences([at], {}, [at])[0]


def test_the_host_wait_range_is_said_once_per_path():
    """A path below its floor at two points gave the same range twice (b298's report): the second point now refers to
    the first's line; another path gives its own range."""
    below = "below its floor (a method problem, not a result)"
    def row(n, path, gap, span):
        return {"model": "m", "path": path, "context_tokens": n, "num_pairs": 64, "num_restores": 64, "span_ms": span,
                "span_ci_ms": [span, span], "floor_ms": [0.6, 0.7], "span_verdict": "1.1\u00d7 its floor",
                "ttft_difference_ms": 0.4, "ttft_difference_ci_ms": [0.3, 0.5], "ttft_verdict": below, "resolved": True,
                "num_to_forward": 64, "num_ended_before_forward": 64, "to_forward_ms": gap, "to_forward_ci_ms": [gap, gap]}
    every = [row(n, p, g, s) for p in ("gpubuf_retained", "gpubuf_layered")
             for n, g, s in ((1024, 0.63, 0.11), (16384, 0.70, 0.73), (32512, 0.72, 1.38))]
    lines = summary._resolution_sentences([r for r in every if r["context_tokens"] >= 16384], {}, every)
    ranged = [("at every context from 1,024 tokens" in line, "the line for 16,384 tokens gives the range" in line)
              for line in lines]
    assert ranged == [(True, False), (False, True)] * 2


def test_the_resolution_table_is_shown_as_views_that_hold_every_column_once():
    """0248's restore_resolution had 46 columns: one table ran 66 px past the page. The report shows it as
    report.resolution_views: the verdicts first, every view led by the point's keys, a view no row fills left out,
    and a column no view names shown last, never dropped."""
    from kmesh_lib.sections.crossover import report

    row = {"model": "m", "context_tokens": N, "path": "dram", "span_ms": 1.0, "span_verdict": "at the floor",
           "span_lag1": 0.2, "to_forward_ms": None, "a_later_column": 3}
    views = report.resolution_views([row, {**row, "path": "disk", "a_later_column": None}])
    titles = [t for t, _ in views]
    assert titles[0].startswith("Verdicts") and titles[1].startswith("Streaks") and titles[-1] == "Other columns"
    assert not [t for t in titles if t.startswith("The forward pass")]  # no row holds a forward column
    shown = [k for _, v in views for k in v[0] if k not in report.RESOLUTION_KEYS]
    assert sorted(shown) == sorted(k for k in row if k not in report.RESOLUTION_KEYS and k != "to_forward_ms")
    assert all(list(v[0])[:3] == list(report.RESOLUTION_KEYS) for _, v in views)
    assert views[-1][1][1] == {"model": "m", "context_tokens": N, "path": "disk", "a_later_column": None}


def test_a_cuda_disk_floor_without_the_pinned_way_fails_its_check():
    """0248's disk restores beat a floor read into ordinary pages while LMCache reads into pinned memory; from
    7a9fe1a the sweep adds a pinned way, and a CUDA floor that could not run it (its ``not_swept``) fails."""
    import importlib
    from types import SimpleNamespace

    checks = importlib.import_module("kmesh_lib.sections.crossover.checks")

    def floor(*ways, not_swept=None):
        disk = {"sweep": [dict(w) for w in ways], **({"not_swept": not_swept} if not_swept else {})}
        return SimpleNamespace(model="m", context_tokens=N, tier="lmcache", when="before", saturated={"disk": disk})

    pageable, pinned = {"layout": "chunk_files", "destination": "pageable"}, {"layout": "chunk_files", "destination": "pinned"}
    assert checks._pinned_floor_check([floor(pageable, pinned)], cuda=True).status == "ok"
    missed = checks._pinned_floor_check([floor(pageable, pinned), floor(pageable, not_swept=[{"why": "pin refused"}])],
                                        cuda=True)
    assert missed.status == "failed" and "1 of 2" in missed.detail and "pin refused" in missed.detail
    assert checks._pinned_floor_check([floor(pageable)], cuda=False).status == "skipped"  # CPU: left out by design
    old = checks._pinned_floor_check([floor({"layout": "one_file"})], cuda=True)  # before destinations were recorded
    assert old.status == "skipped" and old.predates == checks.DESTINATIONS_SINCE
    assert checks._pinned_floor_check([SimpleNamespace(saturated={"copy": {}})], cuda=True) is None  # no disk floor


def _grid(point: dict[str, list[float]], n: int = N, nbytes: int = 1 << 20) -> list:
    """Measured grid rows of one point: ``point[arm]`` = its follow-ups' first tokens in ms."""
    from crossover_records import as_grid_rows

    return as_grid_rows([{"model": "m", "context_tokens": n, "arm": arm, "measured": True, "status": "ok",
                          "ttft_s": ms / 1e3, "makespan_s": ms / 1e3, "context_bytes": nbytes, "disk_read_bytes": 0,
                          "components": {}} for arm, values in point.items() for ms in values])


# 1 MiB at 0.1 GiB/s host->device: a 9.766 ms copy floor; at 1 GiB/s device->device 0.977 ms
FLOORS = {"copy": {"gib_per_s": 0.1}, "disk": {"gib_per_s": 0.1}, "device": {"gib_per_s": 1.0}}


def test_the_floor_distance_gives_each_cost_its_interval_and_the_paired_tables_verdict_never_a_ratio_below_one():
    """Issue 42 (bbf8, 7B on an H100: the grid's table printed x_floor -19.5 for the layered GPU buffer at 1,024 tokens
    and 0.9 for DRAM at 16,384): each cost's 95% interval from the grid's follow-ups and ``floor_verdict``'s word for
    it; a ratio only where the interval lies wholly above the floor."""
    spread = [-3.0, 2.5, -1.0, 4.0, 0.5, -2.0]
    rows = _grid({"resident": [20.0] * 6, "native_resident": [20.0] * 6, "lmcache_mp_resident": [20.0] * 6,
                  "dram": [50.0, 50.5, 49.5, 50.2, 49.8, 50.1],  # ~30 ms over a 9.77 ms floor: a ratio range
                  "native_offload": [27.0, 29.0, 35.0, 31.0, 45.0, 26.0],  # reaches down to the floor: at the floor
                  "lmcache_mp": [25.0, 25.2, 24.9, 25.1, 25.0, 24.8],  # ~5 ms, wholly below the copy floor
                  "gpubuf_resident": [20.0] * 6,
                  "gpubuf_retained": [20.0 + d for d in spread],  # holds 0: no cost measured
                  "gpubuf_layered": [15.0, 15.2, 14.9, 15.1, 15.0, 14.8]})  # wholly below its resident follow-up
    table = cr.arm_table(rows)
    got = {r["path"]: r for r in cr.floor_table(table, FLOORS, rows)}
    assert got["dram"]["verdict"].endswith("\u00d7 its floor") and got["dram"]["x_floor"] == pytest.approx(3.1, abs=0.05)
    assert got["native_offload"]["verdict"] == "at the floor" and got["native_offload"]["x_floor"] is None
    assert got["lmcache_mp"]["verdict"].startswith("below its floor") and got["lmcache_mp"]["x_floor"] is None
    assert got["gpubuf_retained"]["verdict"] == "no cost measured" and got["gpubuf_retained"]["x_floor"] is None
    assert got["gpubuf_layered"]["verdict"].startswith("below the resident") and got["gpubuf_layered"]["x_floor"] is None
    for r in got.values():  # the invariant: a number only beside a ratio range, and never below 1
        low, high = r["restore_cost_ci_ms"]
        assert low <= r["restore_cost_ms"] <= high
        assert (r["x_floor"] is not None) == ("\u00d7" in r["verdict"]) and (r["x_floor"] is None or r["x_floor"] >= 1)
        assert r["verdict"] == cr.floor_verdict(low, high, [r["transfer_floor_ms"]] * 2)  # the paired table's rule
    # on the CPU a cost below its timed floor judges nothing, as the paired table says it
    cpu = {r["path"]: r for r in cr.floor_table(table, FLOORS, rows, bound=False)}
    assert cpu["lmcache_mp"]["verdict"] == "below its timed floor (on the CPU no physical bound: not judged)"
    # without the follow-ups there is no interval: no verdict beyond that, and no ratio
    bare = cr.floor_table(table, FLOORS)
    assert all(r["verdict"].startswith("unresolved") and r["x_floor"] is None for r in bare)


def test_the_floor_distance_judges_each_cost_against_the_floors_timed_around_its_point_where_the_run_has_them():
    """Issue 42 (9c33, the H200 at 0.5B: the GPU buffer from disk at 16,384 tokens read "below its floor" against the
    disk floor timed once at the run's start, 137.6 ms, where the floors timed before and after that point,
    121-124 ms, found the same restores 1.04-1.46x): the grid's verdict judges against the point's range where there
    is one, names which floor it judged, and keeps the run-start floor beside it; a point with no floor timed
    around it (or a tier with no such record) keeps the run-start floor."""
    from crossover_records import as_point_floors

    rows = _grid({"gpubuf_resident": [20.0] * 6, "gpubuf_disk": [32.0, 32.5, 31.8, 32.2, 31.9, 32.1],
                  "resident": [20.0] * 6, "dram": [50.0, 50.5, 49.5, 50.2, 49.8, 50.1]})
    table = cr.arm_table(rows)
    slow = {"disk": {"gib_per_s": 0.07}, "copy": {"gib_per_s": 0.1}}  # 13.95 ms for the 1 MiB: above the ~12 ms cost
    around = as_point_floors([{"tier": "gpubuf", "context_tokens": N, "when": when,
                               "floors": {"disk": {"median_s": disk}, "copy": {"median_s": 0.001}}}
                              for when, disk in (("before", 0.0095), ("after", 0.0102))])
    start = {r["path"]: r for r in cr.floor_table(table, slow, rows)}
    assert start["gpubuf_disk"]["verdict"].startswith("below its floor") and start["gpubuf_disk"]["point_floor_ms"] is None
    assert start["gpubuf_disk"]["floor_timed"] == "at the run's start"
    got = {r["path"]: r for r in cr.floor_table(table, slow, rows, point_floors=around)}
    disk = got["gpubuf_disk"]
    assert disk["point_floor_ms"] == [9.5, 10.2] and disk["floor_timed"] == "around the point"
    assert disk["transfer_floor_ms"] == start["gpubuf_disk"]["transfer_floor_ms"]  # the grid's floor, kept beside it
    low, high = disk["restore_cost_ci_ms"]
    assert disk["verdict"] == cr.floor_verdict(low, high, [9.5, 10.2]) and disk["verdict"].endswith("\u00d7 its floor")
    assert disk["x_floor"] == pytest.approx(disk["restore_cost_ms"] / 10.2, abs=0.05) and disk["x_floor"] >= 1
    assert cr.judged_floor_ms(disk) == [9.5, 10.2]
    # LMCache's DRAM has no floor timed around this point (only the GPU buffer's tier was): the run-start one judges
    assert got["dram"]["point_floor_ms"] is None and got["dram"]["verdict"] == start["dram"]["verdict"]
    assert cr.judged_floor_ms(got["dram"]) == [got["dram"]["transfer_floor_ms"]] * 2


def test_the_goal_table_reads_the_floor_distances_verdicts():
    """The fastest path keeps its verdict and gives a ratio only beside a ratio range; the path nearest its floor is one
    at the floor before any ratio range, and a cost whose interval holds 0 is no distance at all."""
    table = _arms({"gpubuf_retained": 20.5, "gpubuf_resident": 20.0, "dram": 40.0, "native_offload": 30.0})
    table = [{**t, "context_mib": 1.0} for t in table]
    distance = [{"model": "m", "context_tokens": N, "path": "gpubuf_retained", "restore_cost_ms": 0.5,
                 "transfer_floor_ms": 0.977, "verdict": "no cost measured", "x_floor": None},
                {"model": "m", "context_tokens": N, "path": "dram", "restore_cost_ms": 20.0, "transfer_floor_ms": 9.766,
                 "verdict": "1.90\u20132.20\u00d7 its floor", "x_floor": 2.0},
                {"model": "m", "context_tokens": N, "path": "native_offload", "restore_cost_ms": 10.0,
                 "transfer_floor_ms": 9.766, "verdict": "at the floor", "x_floor": None}]
    (g,) = cr.goal_table(table, distance)
    assert (g["fastest_path"], g["fastest_verdict"], g["fastest_x_floor"]) == ("gpubuf_retained", "no cost measured", None)
    assert (g["nearest_path"], g["nearest_verdict"], g["nearest_x_floor"]) == ("native_offload", "at the floor", None)
    assert summary._cost_against_floor(g) == "no cost measured"
    (g,) = cr.goal_table(table, distance[1:2])
    assert (g["nearest_path"], g["nearest_x_floor"]) == ("dram", 2.0)
    (g,) = cr.goal_table(table, distance[:1])
    assert "nearest_path" not in g  # a cost the grid's spread hides is near no floor
    # the goal points' cell judges a CPU run's cost by the table's own verdict (its bound), not a physical floor
    cpu = {"fastest_verdict": "below its timed floor (on the CPU no physical bound: not judged)",
           "fastest_cost_ci_ms": [0.2, 0.4], "fastest_floor_ms": 1.0}
    assert summary._cost_against_floor(cpu) == cpu["fastest_verdict"]


def test_the_floor_plot_draws_a_cost_only_as_far_as_its_interval_puts_it_above_the_floor(tmp_path):
    """bbf8's plot drew the grid's medians; a cost whose interval holds 0 or reaches the floor has no distance to draw:
    at the floor it is marked hollow on the floor, the rest are named under the figure."""
    import matplotlib.pyplot as plt

    def row(n, path, cost, verdict, x=None, ci=(None, None)):
        return {"model": "m", "context_tokens": n, "path": path, "restore_cost_ms": cost, "transfer_floor_ms": 9.8 * n / N,
                "verdict": verdict, "x_floor": x, "restore_cost_ci_ms": list(ci)}

    floors = [row(N, "dram", 14.6, "at the floor", ci=(12.6, 59.6)),
              row(2 * N, "dram", 71.2, "1.59\u20132.51\u00d7 its floor", x=3.6, ci=(54.0, 85.4)),
              row(N, "gpubuf_retained", -5.6, "below the resident follow-up (a method problem, not a result)"),
              row(2 * N, "gpubuf_retained", 1.1, "no cost measured", ci=(-1.3, 2.3))]
    fig = cr.floor_plot(floors, tmp_path / "f.png")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    cost = lines["dram: restore cost"].get_ydata()
    assert math.isnan(cost[0]) and cost[1] == 71.2  # the at-the-floor median is not drawn as a distance
    assert list(lines["dram: cost at the floor"].get_ydata()) == [9.8]  # marked on the floor instead
    assert "gpubuf_retained: restore cost" not in lines  # nothing of it drawn: no legend entry, the note names it
    note = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")  # wrapped to the figure's width
    assert "no cost measured: gpubuf_retained at 32,768" in note and "below the resident follow-up" in note
    assert "dram" not in note
    # a cost drawn in a later model's panel alone still has its legend entry (the legend gathers every panel's)
    other = [{**r, "model": "b"} for r in floors if r["path"] == "dram"]
    fig = cr.floor_plot([r for r in floors if r["path"] != "dram"] + other, tmp_path / "g.png")
    assert "dram: restore cost" in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close("all")


def test_the_answer_gives_a_cost_at_its_floor_that_verdict_not_a_ratio():
    """The disk sentence and the why of a speed-up give a ratio only where the cost's interval lies wholly above its
    floor, and "at the floor" where it reaches it."""
    at = {"model": "m", "context_tokens": N, "path": "disk", "x_floor": None, "verdict": "at the floor"}
    assert summary._disk_distance({}, [at], N) == (
        "; at 16,384 tokens the disk restore's cost, by its 95% interval against its transfer floor, is at the floor"
        ", so the disk itself bounds it")
    assert summary._disk_distance({}, [{**at, "x_floor": 1.5}], N) == (
        "; at 16,384 tokens the disk restore costs 1.5\u00d7 its transfer floor, so the disk itself bounds it")
    assert summary._disk_distance({}, [{**at, "verdict": "no cost measured"}], N).endswith("is no cost measured")
    assert summary._disk_distance({}, [], N) == ""
    tables = {"arms": _arms({"recompute": 60.3, "resident": 22.1, "dram": 33.4}),
              "floor_distance": [{"model": "m", "context_tokens": N, "path": "dram", "x_floor": None,
                                  "verdict": "at the floor"}]}
    paths = {"dram": {"path": "dram", "crossover_tokens": N, f"speedup@{N}": 1.81}}
    assert "+11.3 (at its transfer floor, by the cost's 95% interval): saves 26.9" in summary._savings(tables, "m", paths)


def test_the_goal_readings_judge_against_the_floor_the_floor_table_judged_a_range_where_timed_around_the_point():
    """The goals judged each span against the run-start floor while the floor table, from 7 Dec 2026, judges against
    the floors timed around the point: one floor for both now. Against a range, "within" holds against every floor
    timed there (its min), "not met" only where the interval is above GOAL_X x its max, the ratio over its max."""
    floor = [10.0, 12.0]
    assert cr.within_goal(10.5, 11.9, floor) and not cr.within_goal(10.5, 12.1, floor)  # 1.2 x the min is 12.0
    assert cr.goal_verdict(10.5, 12.1, floor) == "unresolved" and cr.goal_verdict(14.5, 15.0, floor) == "not met"
    assert cr.goal_verdict(14.1, 15.0, 10.0) == "not met"  # one floor, timed once: as before
    reading = cr.goal_reading(13.0, [12.5, 13.5], floor)
    assert reading["verdict"] == cr.floor_verdict(12.5, 13.5, floor) and reading["x_floor"] == pytest.approx(13 / 12, abs=1e-3)
    assert not reading["within"]
    distance = [{"model": "m", "context_tokens": N, "path": "gpubuf_disk", "transfer_floor_ms": 14.0,
                 "point_floor_ms": floor, "restore_cost_ms": 11.0, "verdict": "at the floor", "x_floor": None}]
    splits = [{"model": "m", "context_tokens": N, "arm": "gpubuf_disk", "restore_ms": 11.0, "restore_ci_ms": [10.6, 11.4]}]
    [span] = cr.timeline_goal_table(splits, distance)
    assert span["floor_ms"] == floor and span["within"] and span["verdict"] == "at the floor"  # 14.0 would read below
    assert summary.floor_text(floor) == "10.000-12.000" and summary.floor_text(14.0) == "14.000"
