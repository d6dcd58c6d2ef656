"""Section 21's resolution, one line per (model, context, restore path), from a run folder: how wide each restore
span's 95% interval is against the path's floor, and how many restores would bring its half-width to 10% of it.

    python3 benchmarks/restore_resolution.py RUN_DIR [--fraction 0.1] [--min-tokens 0]

A run of the paired design (raw/pairs.jsonl) is read through ``report.resolution_table``: the span's median, its 95%
bootstrap interval and half-width, the floor's range measured before and after the point, the verdicts. A run
recorded before it has no pairs: its rows' spans (``report.restore_span``: one per measured restore of the grid) give
the interval, and the floor is the run's recorded one (``floor_distance``'s ``transfer_floor_ms``, one measurement).
Either way ``needed`` is ``report.restores_needed``: the restores for the half-width asked (a median's interval
narrows as 1/sqrt(n)), from the half-width the table judges: where the restores ran in streaks (``lag1``, the spans'
lag-1 autocorrelation in the order the pairs ran, above white noise's bound) that is the bootstrap's widened by
``intervals.serial_inflation``, so ``needed`` assumes the streaks stay as long. Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmesh_lib.base.intervals import median_of_differences  # noqa: E402
from kmesh_lib.base.records import RunFiles  # noqa: E402
from kmesh_lib.sections.crossover import report  # noqa: E402
from kmesh_lib.sections.crossover.tables import restore_resolution  # noqa: E402


def from_rows(run: RunFiles) -> list[dict]:
    """The grid's own restores (runs before the paired design): span intervals against the recorded floor."""
    floor = {(r["model"], r["context_tokens"], r["path"]): r["transfer_floor_ms"]
             for r in (run.readable_results.get("floor_distance") or [])}
    spans: dict[tuple, list[float]] = {}
    for r in report.usable(run.records("rows.jsonl")):
        if r.arm in report.RESTORES:
            s, _ = report.restore_span(r)
            if s is not None:
                spans.setdefault((r.model, r.context_tokens, r.arm), []).append(1e3 * s)
    out = []
    for key, ms in sorted(spans.items()):
        med, low, high = median_of_differences(ms)
        f = floor.get(key)
        out.append({"model": key[0], "context_tokens": key[1], "path": key[2], "num_restores": len(ms),
                    "span_ms": med, "span_ci_ms": [low, high], "span_half_width_ms": (high - low) / 2,
                    "floor_ms": [f, f] if f else None, "span_verdict": report.floor_verdict(low, high, [f, f] if f else None)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--fraction", type=float, default=report.RESOLVE_FRACTION)
    ap.add_argument("--min-tokens", type=int, default=0)
    args = ap.parse_args()
    run = RunFiles(Path(args.run_dir))
    table = restore_resolution(run)
    paired = isinstance(table, list)
    rows = table if paired else from_rows(run)
    print(f"{run.run_dir.name}: " + ("the paired design (raw/pairs.jsonl)" if paired else
                                     "no pairs: the grid's restores against the run's one floor measurement"))
    print(f"{'model':14} {'tokens':>6} {'path':17} {'n':>4} {'span ms':>9} {'95% interval':>21} {'hw judged':>10} "
          f"{'floor ms':>19} {'lag1':>5} {'hw/floor':>8} {'needed':>6}  verdict")
    for r in rows:
        if r["context_tokens"] < args.min_tokens:
            continue
        hw, floor = r.get("span_half_width_serial_ms", r["span_half_width_ms"]), r["floor_ms"]
        r1 = r.get("span_lag1")
        ratio = hw / floor[0] if hw is not None and floor and floor[0] else None
        need = report.restores_needed(hw, r["num_restores"], floor[0], args.fraction) if ratio is not None else None
        ci = r["span_ci_ms"]
        fl = f"[{floor[0]:.4f}, {floor[1]:.4f}]" if floor else "none"
        print(f"{r['model']:14} {r['context_tokens']:>6} {r['path']:17} {r['num_restores']:>4} "
              f"{(r['span_ms'] if r['span_ms'] is not None else float('nan')):>9.4f} "
              f"[{(ci[0] if ci[0] is not None else float('nan')):>8.4f}, {(ci[1] if ci[1] is not None else float('nan')):>8.4f}] "
              f"{(hw if hw is not None else float('nan')):>10.4f} {fl:>19} {(r1 if r1 is not None else float('nan')):>5.2f} "
              f"{(ratio if ratio is not None else float('nan')):>8.3f} {need if need is not None else '-':>6}  "
              f"{r['span_verdict']}" + (f"; first token {r['ttft_verdict']}" if paired else ""))


if __name__ == "__main__":
    main()
