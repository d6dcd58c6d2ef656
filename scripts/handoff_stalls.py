"""Where the launch thread's stalls of the engine thread fall, over section 21 runs with both hand-off arms.

    python scripts/handoff_stalls.py RUN_DIR [RUN_DIR ...] [--bin-us 2] [--plot OUT.png] [--json OUT.json]

For each run (a folder holding ``raw/rows.jsonl`` or ``raw/rows.jsonl.xz``, published, failed or kept aside):
``report.handoff_table`` per model, then over every run together the off-thread restores binned by where the
thread's launch began (us after the request, ``report.handoff_points``): how many, and how many stalled (their
``after_copy`` longer than the longest of their own run's engine-launched arm). With ``--plot``, one figure of
every run's restores (``report.handoff_plot``'s points, a panel per run). Reads only recorded rows; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--bin-us", type=float, default=2.0)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.crossover.report import HANDOFF_PAIR, handoff_points, handoff_table

    handed_arm, own_arm = HANDOFF_PAIR
    runs, tables, binned = {}, {}, {}
    for run_dir in args.runs:
        rows = RunFiles(run_dir, section="crossover").records("rows.jsonl")  # a run kept aside names no section
        runs[run_dir.name], tables[run_dir.name] = [], handoff_table(rows)
        for h in tables[run_dir.name]:
            print(f"{run_dir.name} {h['model']}: {h['num_stalls']} of {h['num_handed']} stalled; launch began "
                  f"{h['stalled_launch_begin_us']} us (stalled) / {h['other_launch_begin_us']} us (others) after the "
                  f"request; stalled Python ended {h['stall_resumed_after_launch_us']} us after the launch returned")
        for arms in handoff_points(rows).values():
            if not arms.get(own_arm):
                continue
            longest = max(p["after_copy_us"] for p in arms[own_arm])
            for p in arms.get(handed_arm, []):
                if "launch_begin_us" in p:
                    runs[run_dir.name].append((p["launch_begin_us"], p["after_copy_us"], p["stalled"], longest,
                                               p["launch_end_us"]))
                    b = args.bin_us * (p["launch_begin_us"] // args.bin_us)
                    n, s = binned.get(b, (0, 0))
                    binned[b] = (n + 1, s + p["stalled"])
    print(f"\nlaunch began (us after the request) | restores | stalled   (every run, {args.bin_us:g} us bins)")
    for b in sorted(binned):
        n, s = binned[b]
        print(f"  {b:+7.1f} .. {b + args.bin_us:+7.1f} | {n:8d} | {s:7d}")
    # where a stalled Python ends, against the launch's length: a slope near 1 says the end follows the launch's end
    from scipy.stats import theilslopes

    stalls = [p for pts in runs.values() for p in pts if p[2]]
    slope = None
    if len(stalls) >= 3:
        fit = theilslopes([p[1] - p[0] for p in stalls], [p[4] - p[0] for p in stalls])
        slope = {"slope": round(float(fit.slope), 3), "low": round(float(fit.low_slope), 3),
                 "high": round(float(fit.high_slope), 3), "num_stalls": len(stalls)}
        print(f"stall end - launch start on the launch's length (Theil-Sen, 95%): {slope['slope']} "
              f"[{slope['low']}, {slope['high']}] over {len(stalls)} stalls")
    after = sorted(round(p[1], 1) for pts in runs.values() for p in pts)
    gap = max(zip(after, after[1:]), key=lambda ab: ab[1] - ab[0]) if len(after) > 1 else None
    if gap:
        print(f"after_copy of every off-thread restore: {after[0]}-{gap[0]} us or {gap[1]}-{after[-1]} us (widest gap)")
    out = {"tables": tables, "bins_us": args.bin_us, "stall_end_slope": slope, "after_copy_gap_us": gap,
           "binned": [{"from_us": b, "num_restores": n, "num_stalled": s} for b, (n, s) in sorted(binned.items())]}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        named = [(name, pts) for name, pts in runs.items() if pts]
        fig, axes = plt.subplots(1, len(named), figsize=(3.2 * len(named), 2.8), squeeze=False, sharey=True)
        for ax, (name, pts) in zip(axes[0], named):
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, c=["C3" if p[2] else "C0" for p in pts])
            for longest in sorted({p[3] for p in pts}):  # each model's engine-launched longest
                ax.axhline(longest, color="0.4", ls="--", lw=1)
            ax.set(title=name.rsplit("-", 1)[-1], xlabel="launch began, us after request")
        axes[0][0].set_ylabel(f"{handed_arm}: after_copy, us")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=72)
    return out


if __name__ == "__main__":
    main()
