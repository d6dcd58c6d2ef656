"""Section 21's restore streaks, from a run folder of the paired design: whether the slow restores ran while the host
was slow, and whether the copy floor timed right before each moved with them.

    python3 benchmarks/restore_streaks.py RUN_DIR [RUN_DIR ...] [--min-tokens 16384] [--slow 1.2]

Per (model, context, restore path) with at least 16 whole pairs, from raw/pairs.jsonl in the order the pairs ran:
- the resident follow-up's host-only time (its ``other_s``: scheduling and output handling, no restore and no
  forward pass in it), and the pairs where it exceeds ``--slow`` times its median (``host slow``);
- the restore's span (``report.restore_span``) and the copy floor timed right before it (``pair_floor_s``, runs from
  5 Dec 2026), median in the host-fast and the host-slow pairs;
- Pearson's r of the span with the resident's host-only time and with its first token (``intervals.correlation``);
- where the rows carry the host's counters (``arms.host_state``, from commit ecc5309), r of the span with what changed
  over the restore's own request (``counter_deltas``: from the read before the restore to the read before the next
  row of its point): the host's steal time, this process's involuntary context switches, and the CPU's clock;
- the engine steps each restore took (its ``exec_calls``), median in the host-fast and the host-slow pairs: a load
  that ran inside one step (a request of 3) was submitted by a host that held the step for the whole copy;
- for vLLM's CPU tier, the copy function its load handler chose and its descriptors (``tier_route``'s
  ``load_copy_function``, from 7 Dec 2026; ``kv.offloading.load_copy_way``): a Triton kernel launched once, or one
  ``cuMemcpyBatchAsync`` descriptor per block and layer, submitted by the host.

A span that slows with the host while the floor stays put is launched piece by piece from the host (one DMA, the
floor, is not). Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmesh_lib.base.intervals import correlation  # noqa: E402
from kmesh_lib.base.records import RunFiles  # noqa: E402
from kmesh_lib.sections.crossover import report  # noqa: E402

MIN_PAIRS = 16


def _r(x, y) -> str:
    c = correlation(x, y)
    return "-" if c is None else f"{c[0]:+.2f} [{c[1]:+.2f}, {c[2]:+.2f}]"


def counter_deltas(rows: list, restore_tags: list[str], key: str) -> list[float | None] | None:
    """Per restore (by tag), what ``host[key]`` counted over the restore's own request: its value at the next row of
    the same point (model, context, restore path) less its value at the restore. ``arms.host_state`` is read just
    before each row, so the restore's request lies between the two reads (with the next row's preparation, and its
    copy floor where it is a restore); the row before the restore would count the request before it instead. None
    for a restore that is its point's last row (nothing read after it); None for all where a row lacks the counter
    (runs before ecc5309, or a platform without it)."""
    point = {r.tag: (r.model, r.context_tokens, r.pair_arm) for r in rows}
    position = {r.tag: i for i, r in enumerate(rows)}
    out: list[float | None] = []
    for tag in restore_tags:
        i = position[tag]
        later = next((r for r in rows[i + 1:] if (r.model, r.context_tokens, r.pair_arm) == point[tag]), None)
        now = (rows[i].host or {}).get(key)
        if now is None:
            return None
        if later is None:
            out.append(None)
            continue
        after = (later.host or {}).get(key)
        if after is None:
            return None
        out.append(float(after) - float(now))
    return out


def streak_lines(run: RunFiles, min_tokens: int, slow_factor: float) -> list[str]:
    rows = list(report.usable(run.records("pairs.jsonl")))
    out = []
    for (model, n, path), by_pair in sorted(report.pairs_of(rows).items()):
        timed = [(p, report.restore_span(p["restore"])[0]) for _, p in sorted(by_pair.items())
                 if "restore" in p and "resident" in p]
        whole = [p for p, s in timed if s is not None]
        if n < min_tokens or len(whole) < MIN_PAIRS:
            continue
        span = np.array([1e3 * s for _, s in timed if s is not None])
        host = np.array([1e3 * (p["resident"].components.other_s or 0.0) for p in whole])
        ttft = np.array([1e3 * p["resident"].ttft_s for p in whole])
        floor = np.array([1e3 * p["restore"].pair_floor_s if p["restore"].pair_floor_s else np.nan for p in whole])
        slow = host > slow_factor * np.median(host)

        def med(values, mask) -> str:
            v = values[mask]
            v = v[~np.isnan(v)]
            return f"{np.median(v):8.2f}" if v.size else f"{'-':>8}"

        line = (f"{model:14} {n:>6} {path:16} {len(whole):>4} {np.median(host):6.2f} {int(slow.sum()):>4}  "
                f"{med(span, ~slow)} {med(span, slow)}  {med(floor, ~slow)} {med(floor, slow)}  "
                f"{_r(span, host):>21} {_r(span, ttft):>21}")
        tags = [p["restore"].tag for p in whole]
        steps = np.array([float(p["restore"].components.exec_calls or 0) for p in whole])
        extra = [f"steps {med(steps, ~slow).strip()}/{med(steps, slow).strip()}"]
        for key, label in (("cpu_steal_s", "steal"), ("ctx_switches_involuntary", "preempted"), ("cpu_mhz", "clock")):
            deltas = counter_deltas(rows, tags, key)
            if deltas is not None:
                kept = [(s, d) for s, d in zip(span, deltas) if d is not None]
                extra.append(f"{label} {_r(*zip(*kept)) if kept else '-'}")
        out.append(line + "  " + "; ".join(extra))
    return out


def load_copy_lines(run: RunFiles) -> list[str]:
    """One line per vLLM CPU-tier child: the copy its load handler chose (runs before 7 Dec 2026 did not record it)."""
    out = []
    for child in run.records("models.jsonl"):
        if child.tier != "native":
            continue
        route = child.tier_route or {}
        way = route.get("load_copy_function")
        if way is None:
            out.append(f"{child.model}: vLLM CPU tier's load copy not recorded (a run before kv.offloading.load_copy_way)")
        elif "load_refs_per_block" not in route:  # the function read, its descriptors not
            out.append(f"{child.model}: vLLM CPU tier's load copy {way} ({route.get('load_page_bytes', 'pages not read')})")
        else:
            out.append(f"{child.model}: vLLM CPU tier's load copy {way}, {route['load_refs_per_block']} descriptor(s) "
                       f"of {'/'.join(str(b) for b in route['load_page_bytes'])} B per block")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--min-tokens", type=int, default=report.RESOLVE_MIN_TOKENS)
    ap.add_argument("--slow", type=float, default=1.2, help="host slow: the resident's other_s above this x its median")
    args = ap.parse_args()
    head = (f"{'model':14} {'tokens':>6} {'path':16} {'n':>4} {'host':>6} {'slow':>4}  {'span ms':>17}  "
            f"{'floor ms':>17}  {'r(span, host)':>21} {'r(span, res. ttft)':>21}")
    sub = f"{'':14} {'':>6} {'':16} {'':>4} {'ms':>6} {'':>4}  {'fast':>8} {'slow':>8}  {'fast':>8} {'slow':>8}"
    for run_dir in args.run_dirs:
        run = RunFiles(Path(run_dir))
        if not run.has_raw("pairs.jsonl"):
            print(f"{run.run_dir.name}: no raw/pairs.jsonl (a run before the paired design)")
            continue
        print(f"{run.run_dir.name}: pairs with the resident's host-only time above {args.slow}x its median are host slow")
        print(head)
        print(sub)
        for line in streak_lines(run, args.min_tokens, args.slow):
            print(line)
        for line in load_copy_lines(run):
            print(line)


if __name__ == "__main__":
    main()
