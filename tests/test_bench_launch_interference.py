"""The hand-off benches on the CPU build: ``bench_launch_interference.py`` (the busy launch runs on the thread, each
trial's longest gap is placed against the thread's stamps, the summary counts what its trials hold) and
``bench_gpubuf_restore_parts.py``'s stalls per off-thread variant."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_launch_interference",
                                                  ROOT / "benchmarks" / "bench_launch_interference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_longest_gap_counts_the_request_as_the_first_stamp():
    longest_gap = _bench().longest_gap
    assert longest_gap(100, [101, 103, 150, 151]) == (103, 150)
    assert longest_gap(100, [180, 181]) == (100, 180)  # the probe's first stamp came late
    assert longest_gap(100, []) == (100, 100)


def test_the_bench_runs_the_busy_launch_and_places_each_gap(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_launch_interference.py"), "--trials", "3",
                          "--spin-ms", "0", "--delay-us", "0", "30", "--busy-us", "200", "--out", str(tmp_path / "i.json")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "i.json").read_text())
    variants = [(r["launch"], r["probe"], r["spin_ms"], r["delay_us"]) for r in result["summary"]]
    assert variants == [("busy", "python", 0.0, 0.0), ("busy", "python", 0.0, 30.0),
                        ("busy", "alloc", 0.0, 0.0), ("busy", "alloc", 0.0, 30.0)]
    for trials in result["trials"].values():
        assert len(trials) == 3
    for key, trials in result["trials"].items():
        for t in trials:  # the launch ran on the thread for its 200 us, after the request (30 us at the soonest)
            assert t["launch_end_us"] - t["launch_begin_us"] >= 200 and t["launch_begin_us"] >= 0
            assert t["launch_begin_us"] >= 30 or not key.endswith("/30.0")
            assert t["gap_us"] >= 0 and t["num_stamps"] > 1


def test_the_restore_parts_bench_places_each_off_thread_variants_stalls():
    """``bench_gpubuf_restore_parts.handoff_by_variant``: each ``gpubuf_offthread@...`` variant against the
    engine-launched arm (its rows carry no model, repeat or measured flag; the bench adds them), each restore's
    step paired with the engine-launched one of the same repeat (the bench died on this at 0698576: no repeat)."""
    spec = importlib.util.spec_from_file_location("bench_gpubuf_restore_parts",
                                                  ROOT / "benchmarks" / "bench_gpubuf_restore_parts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def row(after_us, launch_begin_us=None, critical_us=100):
        split = {"after_copy_s": after_us / 1e6, "copy_call_s": 30e-6, "write_ids_s": 2e-6, "to_forward_s": 50e-6,
                 "critical_s": critical_us / 1e6}
        if launch_begin_us is not None:
            split.update(thread_launch_s=40e-6, thread_lag_s=(28 + launch_begin_us + 40) / 1e6)
        return {"arm": "x", "context_tokens": 16384, "status": "ok", "split": split}

    rows = {"gpubuf_layered": [row(10, critical_us=150), row(20, critical_us=170)],
            "gpubuf_offthread@spin2ms@delay0us": [row(81, 1), row(18, 15)],
            "gpubuf_offthread@spin2ms@delay15us": [row(18, 16, critical_us=160), row(19, 17, critical_us=160)]}
    out = bench.handoff_by_variant(rows, "m", 16384)
    assert sorted(out) == ["gpubuf_offthread@spin2ms@delay0us", "gpubuf_offthread@spin2ms@delay15us"]
    assert out["gpubuf_offthread@spin2ms@delay0us"]["num_stalls"] == 1
    assert out["gpubuf_offthread@spin2ms@delay0us"]["stalled_launch_begin_us"] == 1.0
    assert out["gpubuf_offthread@spin2ms@delay15us"]["num_stalls"] == 0
    # paired by repeat: (100 - 150, 100 - 170) and (160 - 150, 160 - 170) us
    assert out["gpubuf_offthread@spin2ms@delay0us"]["num_pairs"] == 2
    assert out["gpubuf_offthread@spin2ms@delay0us"]["step_difference_ms"] == -0.06
    assert out["gpubuf_offthread@spin2ms@delay15us"]["step_difference_ms"] == 0.0
    assert bench.handoff_by_variant({"gpubuf_offthread": [row(81, 1)]}, "m", 16384) == {}  # no engine-launched arm
