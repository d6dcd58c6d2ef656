"""Section 21 tables and plots, from ``raw/rows.jsonl`` rows (``app.registry.crossover.arms.RestoreBench.run``).

    arm_table        median first token (and makespan) per (model, context, arm), measured ``ok`` rows
    crossover_table  per (model, restore path): recompute / restore per context, and the crossover:
                     the shortest measured context from which the restore is faster at every longer one
    floor_table      how far each restore is from its floor: restore - engine-resident (the cost of
                     bringing the context in) against bytes / floor bandwidth
    component_table  median per-component split of each arm (``lmcache.probes``)

Invariant: only measured rows whose follow-ups hit exactly their expected cached tokens enter a table.
"""
from __future__ import annotations

import statistics

from kmesh_lib.kv.floors import floor_seconds

RESTORES = ("dram", "disk")
COMPONENTS = ("lookup_s", "lookup_wall_s", "disk_read_s", "load_s", "save_s", "forward_s", "other_s")


def usable(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("measured") and r.get("status") == "ok"]


def arm_table(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in usable(rows):
        groups.setdefault((r["model"], r["context_tokens"], r["arm"]), []).append(r)
    out = []
    for (model, n, arm), rs in sorted(groups.items()):
        out.append({"model": model, "context_tokens": n, "arm": arm, "n": len(rs),
                    "context_mib": rs[0]["context_bytes"] / (1 << 20),
                    "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in rs),
                    "ttft_min_ms": 1e3 * min(r["ttft_s"] for r in rs),
                    "makespan_ms": 1e3 * statistics.median(r["makespan_s"] for r in rs),
                    "disk_read_mib": statistics.median(r["disk_read_bytes"] or 0 for r in rs) / (1 << 20)})
    return out


def _lookup(table: list[dict]) -> dict[tuple, dict]:
    return {(t["model"], t["context_tokens"], t["arm"]): t for t in table}


def crossover_point(lengths: list[int], wins: list[bool]) -> int | None:
    """The shortest length from which every longer measured length is a win (None: no such length)."""
    point = None
    for n, win in sorted(zip(lengths, wins), reverse=True):
        if not win:
            break
        point = n
    return point


def crossover_table(table: list[dict]) -> list[dict]:
    t = _lookup(table)
    models = sorted({r["model"] for r in table}, key=lambda m: [r["model"] for r in table].index(m))
    out = []
    for model in models:
        for path in RESTORES:
            lengths = sorted(n for (m, n, a) in t if m == model and a == path and (m, n, "recompute") in t)
            if not lengths:
                continue
            speed = {n: t[(model, n, "recompute")]["ttft_ms"] / t[(model, n, path)]["ttft_ms"] for n in lengths}
            point = crossover_point(lengths, [speed[n] > 1.0 for n in lengths])
            row = {"model": model, "path": path, "crossover_tokens": point,
                   "crossover": (f">= {point}" if point is not None else f"none up to {max(lengths)}")}
            row.update({f"speedup@{n}": round(speed[n], 3) for n in lengths})
            out.append(row)
    return out


def floor_table(table: list[dict], disk_floor: dict, copy_floor: dict) -> list[dict]:
    """Restore cost (restore - engine-resident) against the transfer floor of the context's bytes."""

    t = _lookup(table)
    out = []
    for (model, n, arm), row in sorted(t.items()):
        if arm not in RESTORES or (model, n, "floor") not in t:
            continue
        nbytes = row["context_mib"] * (1 << 20)
        floor_s = floor_seconds(nbytes, copy_floor) + (floor_seconds(nbytes, disk_floor) if arm == "disk" else 0.0)
        cost_ms = row["ttft_ms"] - t[(model, n, "floor")]["ttft_ms"]
        out.append({"model": model, "context_tokens": n, "path": arm, "context_mib": round(row["context_mib"], 2),
                    "restore_cost_ms": round(cost_ms, 3), "transfer_floor_ms": round(1e3 * floor_s, 3),
                    "x_floor": round(cost_ms / (1e3 * floor_s), 1) if floor_s > 0 else None})
    return out


def component_table(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in usable(rows):
        groups.setdefault((r["model"], r["context_tokens"], r["arm"]), []).append(r)
    out = []
    for (model, n, arm), rs in sorted(groups.items()):
        row = {"model": model, "context_tokens": n, "arm": arm, "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in rs)}
        for c in COMPONENTS:
            vals = [r["components"].get(c) for r in rs if r["components"].get(c) is not None]
            row[c.replace("_s", "_ms")] = round(1e3 * statistics.median(vals), 3) if vals else None
        out.append(row)
    return out


def heatmaps(table: list[dict], path_out, title: str = ""):
    """One panel per restore path: log2(recompute / restore) over model shape x context length."""
    import matplotlib.pyplot as plt
    import numpy as np

    t = _lookup(table)
    models = list(dict.fromkeys(r["model"] for r in table))
    lengths = sorted({r["context_tokens"] for r in table})
    # constrained layout places the suptitle above the panel titles (a plain suptitle overlapped them)
    fig, axes = plt.subplots(1, len(RESTORES), figsize=(4.2 * len(RESTORES), 0.6 * len(models) + 1.9), squeeze=False,
                             sharey=True, layout="constrained")  # one set of model labels, on the left panel only
    for ax, path in zip(axes[0], RESTORES):
        grid = np.full((len(models), len(lengths)), np.nan)
        for i, m in enumerate(models):
            for j, n in enumerate(lengths):
                if (m, n, path) in t and (m, n, "recompute") in t:
                    grid[i, j] = np.log2(t[(m, n, "recompute")]["ttft_ms"] / t[(m, n, path)]["ttft_ms"])
        im = ax.imshow(grid, cmap="RdBu", vmin=-3, vmax=3, aspect="auto")
        for i in range(len(models)):
            for j in range(len(lengths)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{2 ** grid[i, j]:.2f}x", ha="center", va="center", fontsize=8,
                            color="white" if abs(grid[i, j]) > 2 else "black")  # legible on the darkest cells
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(models)), models)
        ax.set(xlabel="context tokens", title=f"{path} restore vs recompute")
    fig.colorbar(im, ax=axes[0].tolist(), label="log2 speed-up (blue: restore wins)")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path_out, dpi=80, bbox_inches="tight")
    return fig


def floor_plot(floors: list[dict], path_out):
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in floors))
    fig, axes = plt.subplots(1, len(models), figsize=(3.6 * len(models), 3), squeeze=False, sharey=True)
    for ax, m in zip(axes[0], models):
        for path, marker, color in (("dram", "o", "C0"), ("disk", "s", "C1")):
            rs = [r for r in floors if r["model"] == m and r["path"] == path]
            xs = [r["context_tokens"] for r in rs]
            ax.plot(xs, [max(r["restore_cost_ms"], 1e-3) for r in rs], marker=marker, color=color, label=f"{path}: restore cost")
            ax.plot(xs, [r["transfer_floor_ms"] for r in rs], marker=marker, ls="--", color=color, alpha=0.5,
                    label=f"{path}: transfer floor")
        ax.set(xscale="log", yscale="log", xlabel="context tokens", title=m)
    axes[0][0].set_ylabel("ms")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_out, dpi=80)
    return fig
