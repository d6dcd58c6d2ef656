"""The pipelined child runner of the GPU drivers (``workloads.engine_runs``), with tiny fake children."""
from __future__ import annotations

import sys
import time

from kmesh_lib.workloads.engine_runs import GPU_PHASE, Pipeline


def child(seconds: float, code: int = 0, phase: bool = True) -> list[str]:
    """A child that imports (0.2 s), holds the "GPU" for ``seconds``, prints its summary and exits ``code``."""
    body = (f"import time; time.sleep(0.2); {'print(' + repr(GPU_PHASE) + ', flush=True); ' if phase else ''}"
            f"time.sleep({seconds}); print('SUMMARY {{}}', flush=True); raise SystemExit({code})")
    return [sys.executable, "-c", body]


def test_children_overlap_only_before_their_gpu_phase(tmp_path):
    said = []
    pipe = Pipeline(tmp_path, say=said.append)
    t0 = time.monotonic()
    assert pipe.run([(f"r{i}", child(0.6)) for i in range(3)]) == []
    # the second child starts once the first prints GPU_PHASE, not after it ended (a real child then waits for the lock)
    starts = [line for line in said if line.startswith("== ")]
    assert len(starts) == 3 and time.monotonic() - t0 < 3 * 0.8 + 1.5
    assert not pipe.failed and len(pipe.phases) == 3 and all(p >= 0.5 for p in pipe.phases)
    assert (tmp_path / "logs" / "r2.log").read_text().startswith(GPU_PHASE)


def test_a_budget_leaves_what_would_not_end_in_it_for_a_later_call(tmp_path):
    said = []
    pipe = Pipeline(tmp_path, budget_s=2.5, run_estimate_s=1.0, margin_s=0.0, say=said.append)
    left = pipe.run([(f"r{i}", child(0.8)) for i in range(5)])
    assert left and len(left) < 5 and pipe.elapsed() < 2.5 + 1.0
    assert any(line.startswith("stopping:") for line in said)


def test_a_child_that_fails_or_overstays_its_gpu_phase_is_reported(tmp_path):
    said = []
    pipe = Pipeline(tmp_path, run_timeout_s=0.5, say=said.append)
    assert pipe.run([("dies", child(0.0, code=1)), ("hangs", child(30.0))]) == []
    assert pipe.failed == ["dies", "hangs"]
    assert any("hangs: killed after 0 s of GPU phase" in line for line in said)
