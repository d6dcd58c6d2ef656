"""The pipelined child runner of the GPU drivers (``workloads.engine_runs``), with tiny fake children."""
from __future__ import annotations

import sys

from kmesh_lib.workloads.engine_runs import GPU_PHASE, Pipeline


def child(seconds: float, code: int = 0, phase: bool = True) -> list[str]:
    """A child that imports (0.2 s), holds the "GPU" for ``seconds``, prints its summary and exits ``code``."""
    body = (f"import time; time.sleep(0.2); {'print(' + repr(GPU_PHASE) + ', flush=True); ' if phase else ''}"
            f"time.sleep({seconds}); print('SUMMARY {{}}', flush=True); raise SystemExit({code})")
    return [sys.executable, "-c", body]


def handshake_child(folder, name: str, successor: str | None, guard_s: float = 300.0) -> list[str]:
    """A child that stamps its start, then its GPU phase (``time.monotonic_ns``, one clock for every process),
    and holds the "GPU" until its successor has started: it says ``SAW`` then, or ``ALONE`` if the successor
    did not start within ``guard_s`` (a guard against a hang, not a time anyone expects)."""
    body = (f"import time, pathlib; d = pathlib.Path({str(folder)!r}); (d / {name + '.started'!r}).touch(); "
            "print('START', time.monotonic_ns(), flush=True); time.sleep(0.2); "
            f"print({GPU_PHASE!r}, time.monotonic_ns(), flush=True); t0 = time.monotonic(); "
            f"succ = {successor!r}; seen = succ is None\n"
            f"while not seen and time.monotonic() - t0 < {guard_s}:\n"
            "    seen = (d / (succ + '.started')).exists(); time.sleep(0.01)\n"
            "print('SAW' if seen else 'ALONE', flush=True); print('SUMMARY {}', flush=True)")
    return [sys.executable, "-c", body]


def stamp(log: str, word: str) -> int:
    return int(next(line.split()[1] for line in log.splitlines() if line.startswith(word + " ")))


def test_children_overlap_only_before_their_gpu_phase(tmp_path):
    said = []
    pipe = Pipeline(tmp_path, say=said.append)
    names = ["r0", "r1", "r2"]
    items = [(n, handshake_child(tmp_path, n, names[i + 1] if i + 1 < len(names) else None)) for i, n in enumerate(names)]
    assert pipe.run(items) == []
    starts = [line for line in said if line.startswith("== ")]
    assert len(starts) == 3 and not pipe.failed and len(pipe.phases) == 3
    logs = [(tmp_path / "logs" / f"{n}.log").read_text() for n in names]
    # each child saw the next one start while it held the GPU: the next starts before this one ends ...
    assert all("SAW" in log and "ALONE" not in log for log in logs), logs
    # ... and only once this one said it holds the GPU (a real child then waits for the lock)
    assert all(stamp(later, "START") >= stamp(earlier, GPU_PHASE) for earlier, later in zip(logs, logs[1:])), logs


def test_a_budget_leaves_what_would_not_end_in_it_for_a_later_call(tmp_path):
    said = []
    pipe = Pipeline(tmp_path, budget_s=2.5, run_estimate_s=1.0, margin_s=0.0, say=said.append)
    names = [f"r{i}" for i in range(5)]
    left = pipe.run([(n, child(0.8)) for n in names])
    # the first always fits (1 s of 2.5), five never do (each waits for the one before to hold the GPU, 0.2 s
    # in, and a later one starts only while 2 estimates still fit): what is left is the tail, in order, and
    # every child it started ended
    assert 0 < len(left) < len(names) and left == names[len(names) - len(left):]
    assert not pipe.failed and len(pipe.phases) == len(names) - len(left)
    assert any(line.startswith("stopping:") for line in said)


def test_a_child_that_fails_or_overstays_its_gpu_phase_is_reported(tmp_path):
    said = []
    pipe = Pipeline(tmp_path, run_timeout_s=0.5, say=said.append)
    assert pipe.run([("dies", child(0.0, code=1)), ("hangs", child(30.0))]) == []
    assert pipe.failed == ["dies", "hangs"]
    assert any("hangs: killed after 0 s of GPU phase" in line for line in said)


def test_one_at_a_time_children_never_overlap_and_stop_after_a_failure(tmp_path):
    """``overlap=False`` (section 22's fleets): a child starts only once the one before ended; with
    ``stop_on_failure`` nothing starts after a child that failed (units that must run in their order)."""
    said = []
    pipe = Pipeline(tmp_path, overlap=False, stop_on_failure=True, say=said.append)
    names = ["u0", "u1", "u2"]
    items = [(n, handshake_child(tmp_path, n, names[i + 1] if i + 1 < len(names) else None, guard_s=1.0), 0.0)
             for i, n in enumerate(names)]
    assert pipe.run(items) == []
    logs = [(tmp_path / "logs" / f"{n}.log").read_text() for n in names]
    assert all("ALONE" in log for log in logs[:2]), logs  # no successor started while a child ran
    pipe = Pipeline(tmp_path, overlap=False, stop_on_failure=True, say=said.append)
    assert pipe.run([("dies", child(0.0, code=1)), ("after", child(0.0))]) == ["after"]
    assert pipe.failed == ["dies"] and any(line.startswith("stopping after dies failed") for line in said)


def test_an_items_own_estimate_is_asked_when_it_is_due_and_never_below_the_floor(tmp_path):
    asked = []

    def estimate(seconds: float):
        return lambda: asked.append(seconds) or seconds

    pipe = Pipeline(tmp_path, budget_s=5.0, run_estimate_s=1.0, margin_s=0.0, overlap=False, say=lambda *_: None)
    left = pipe.run([("small", child(0.0), estimate(0.5)), ("large", child(0.0), estimate(60.0))])
    assert left == ["large"] and asked == [0.5, 60.0] and pipe.estimate(0.5) == 1.0
