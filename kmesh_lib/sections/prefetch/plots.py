"""Section 20's figures: waits per arm (every measured group) and the pilot's wait against lead."""
from __future__ import annotations

from kmesh_lib.sections.prefetch.stats import usable

ARM_ORDER = ("on_arrival", "early", "early_fixed", "dram", "engine")


def plot_arms(groups: list[dict], path: str, out=None, ax_pair=None):
    """Per group size: every measured group's A-first-token wait and makespan, by arm (ms)."""
    import matplotlib.pyplot as plt


    gs = [g for g in usable(groups) if g["path"] == path]
    sizes = sorted({g["group_size"] for g in gs})
    fig, axes = plt.subplots(1, 2 * max(1, len(sizes)), figsize=(4 * max(1, len(sizes)) * 2, 3.2), squeeze=False)
    for i, n in enumerate(sizes or [0]):
        for j, (key, label) in enumerate((("wait_a_s", "A first token"), ("makespan_s", "all done"))):
            ax = axes[0][2 * i + j]
            arms = [a for a in ARM_ORDER if any(g["arm"] == a and g["group_size"] == n for g in gs)]
            for k, arm in enumerate(arms):
                ys = [g[key] * 1e3 for g in gs if g["arm"] == arm and g["group_size"] == n]
                ax.scatter([k + (m % 7 - 3) * 0.04 for m in range(len(ys))], ys, s=8, alpha=0.6)
                ax.hlines(sum(ys) / len(ys), k - 0.3, k + 0.3, color="k")
            ax.set_xticks(range(len(arms)), arms, rotation=30, fontsize=7)
            ax.set_title(f"{path} N={n}: {label}", fontsize=9)
            ax.set_ylabel("ms from T", fontsize=8)
    fig.tight_layout()
    if out is not None:
        fig.savefig(out, dpi=80)
    return fig


def plot_pilot(groups: list[dict], out=None):
    """Pilot: A's wait (ms from T) against lead, filled = ready, hollow = not ready."""
    import matplotlib.pyplot as plt

    pilot = [g for g in groups if g.get("phase") == "pilot"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for path, n in sorted({(g["path"], g["group_size"]) for g in pilot}):
        xs = [g for g in pilot if g["path"] == path and g["group_size"] == n]
        sc = ax.scatter([g["lead_ms"] for g in xs if g["ready"]], [g["wait_a_s"] * 1e3 for g in xs if g["ready"]],
                        s=14, label=f"{path} N={n}")
        ax.scatter([g["lead_ms"] for g in xs if not g["ready"]], [g["wait_a_s"] * 1e3 for g in xs if not g["ready"]],
                   s=14, facecolors="none", edgecolors=sc.get_facecolor())
    ax.set_xlabel("lead (ms)")
    ax.set_ylabel("A first token, ms from T")
    ax.set_title("pilot (hollow: not ready at T)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if out is not None:
        fig.savefig(out, dpi=80)
    return fig
