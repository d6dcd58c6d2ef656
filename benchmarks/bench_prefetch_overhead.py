"""How close does the early arm's first-token wait come to the resident arm's (the context already in vLLM's
KV), and how much of it is measurement overhead?

    .venv/bin/python benchmarks/bench_prefetch_overhead.py [RUN_DIR]     (default: the newest run id in outputs/prefetch)

Part 1 times the driver's own instruments on this machine (no engine): one ``time.monotonic_ns()``
stamp, one readiness check (``threading.Event.is_set``), and the overshoot of the idle wait
``time.sleep(DRIVER_POLL_MS)``. Part 2 reads a finished run's ``raw/groups.jsonl`` and gives, per path
and group size, the early arm's mean A-first-token wait, the resident arm's, their paired gap
with a 95 % paired bootstrap interval (``stats.paired_saving``: scipy, percentile, seeded), over the
pairs the section's tables use (a group in which a follow-up recomputed the context is left out, as
there), and the part of the gap the instruments can explain: the early
group's submission delay at T plus its stamps x the stamp cost (upper bound; the idle polls end
before T and the prefetch polls run in another thread, so neither is on the measured path).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def per_call_ns(fn, n: int = 200_000) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def sleep_overshoot_us(poll_s: float, n: int = 400) -> tuple[float, float]:
    over = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        time.sleep(poll_s)
        over.append((time.perf_counter_ns() - t0) / 1e3 - poll_s * 1e6)
    over.sort()
    return sum(over) / n, over[int(0.99 * n)]


def main() -> int:
    import numpy as np

    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.prefetch.checks import groups_of
    from kmesh_lib.sections.prefetch.stats import cases, paired_saving, pairs

    stamp_ns = per_call_ns(time.monotonic_ns)
    ev = threading.Event()
    check_ns = per_call_ns(ev.is_set)
    mean_us, p99_us = sleep_overshoot_us(0.0005)
    print(f"instruments: stamp {stamp_ns:.0f} ns, readiness check {check_ns:.0f} ns, "
          f"idle wait 0.5 ms overshoot mean {mean_us:.0f} us (p99 {p99_us:.0f} us)")
    if len(sys.argv) > 1:
        run = Path(sys.argv[1])
    else:
        runs = sorted((p for p in (REPO / "outputs" / "prefetch").glob("*") if RunFiles(p).has_raw("groups.jsonl")),
                      key=lambda p: p.name.split("-", 1)[-1])  # by the run id's date, not the file time
        if not runs:
            print("no prefetch run to analyse")
            return 0
        run = runs[-1]
    groups = groups_of(RunFiles(run))
    print(f"run: {run.name}")
    rows = []
    for path, n in cases(groups):
        sub = [g for g in groups if g["path"] == path and g["group_size"] == n]
        for arm in ("early", "early_fixed", "dram", "on_arrival"):
            ps = pairs(sub, arm, "resident")
            if not ps:
                continue
            gap, lo, hi = paired_saving([x["wait_a_s"] for x, _ in ps], [y["wait_a_s"] for _, y in ps], 5000, 0)
            overhead = float(np.mean([x["submit_delay_s"] + x["stamps"] * stamp_ns / 1e9 for x, _ in ps]))
            resident = float(np.mean([y["wait_a_s"] for _, y in ps]))
            rows.append({"path": path, "N": n, "arm": arm, "lead_ms": ps[0][0]["lead_ms"], "pairs": len(ps),
                         "A wait ms": round(1e3 * float(np.mean([x["wait_a_s"] for x, _ in ps])), 2),
                         "resident ms": round(1e3 * resident, 2), "gap ms": round(gap * 1e3, 2),
                         "gap 95% CI": [round(lo * 1e3, 2), round(hi * 1e3, 2)],
                         "instrument share ms": round(overhead * 1e3, 3),
                         "ready": sum(bool(x.get("ready")) for x, _ in ps) if arm.startswith("early") else None})
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
