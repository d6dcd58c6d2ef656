"""Section 16's per-group plots: one figure per (path, group size), every measured group a point.

    panel 1  stopwatch 1: A's first output token (ms), per pair
    panel 2  stopwatch 2: the group's makespan, every request's last token (ms), per pair
    panel 3  disk MiB read per group: preparation (hatched) + follow-ups, per pair and arm

Control arms (recompute, resident) of the same group size share panels 1 and 2 so the external arms
sit between them. Groups that were not ``ok`` are drawn hollow. Where the pairs run several arrival
patterns in turn, each pair's tick names its pattern (``pair_patterns``).
"""
from __future__ import annotations

from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.sections.retention.captures import RetentionGroup

MIB = 1 << 20
STYLE = {"retain": ("tab:blue", "o"), "discard": ("tab:red", "s"), "resident": ("tab:green", "^"),
         "recompute": ("tab:gray", "v")}


def plot_group_size(groups: list[RetentionGroup], path: str, n: int, out_path=None):
    import matplotlib.pyplot as plt

    mine = [g for g in groups if g.measured and g.group_size == n and g.path in (path, "engine")]
    first = {}  # x = the measured pair's index within its block (blocks may have different warm-up pairs)
    for g in mine:
        first[g.engine_run] = min(first.get(g.engine_run, g.pair), g.pair)
    x = {id(g): g.pair - first[g.engine_run] for g in mine}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for arm, (color, marker) in STYLE.items():
        gs = sorted((g for g in mine if g.arm == arm), key=lambda g: g.pair)
        if not gs:
            continue
        for ax, key in zip(axes[:2], ("ttft_a_s", "makespan_s")):
            ok = [g for g in gs if g.status == "ok"]
            bad = [g for g in gs if g.status != "ok"]
            ax.plot([x[id(g)] for g in ok], [getattr(g, key) * 1e3 for g in ok], marker=marker, color=color, ls="-", label=arm)
            if bad:
                ax.plot([x[id(g)] for g in bad], [getattr(g, key) * 1e3 for g in bad], marker=marker, color=color, ls="",
                        mfc="none", label=f"{arm} (not ok)")
        if arm in ("retain", "discard"):
            shift = -0.2 if arm == "retain" else 0.2
            xs = [x[id(g)] + shift for g in gs]
            prep = [_mib(g.prep_reads) for g in gs]
            fol = [_mib(g.followup_reads) for g in gs]
            axes[2].bar(xs, prep, width=0.4, color=color, alpha=0.5, hatch="//", label=f"{arm}: preparation")
            axes[2].bar(xs, fol, width=0.4, bottom=prep, color=color, label=f"{arm}: follow-ups")
    axes[0].set(title=f"A's first token, N={n}", xlabel="measured pair", ylabel="ms")
    axes[1].set(title=f"makespan ({n} x last token)", xlabel="measured pair", ylabel="ms")
    axes[2].set(title="disk tier MiB read per group", xlabel="measured pair", ylabel="MiB")
    patterns = pair_patterns(mine, x)
    if len(set(patterns.values())) > 1:  # pairs of several arrival patterns in turn: each pair names its own
        for ax in axes:
            ax.set_xticks(sorted(patterns), [patterns[k] for k in sorted(patterns)], rotation=90, fontsize=7.5)
            ax.set_xlabel("measured pair, by its arrival pattern")
    for ax in axes:
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.3)  # room for the legend above the data
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle(f"{path} path, groups of {n}: every measured group", fontsize=10)
    fig.tight_layout()
    if out_path is not None:
        save_figure(fig, out_path)
    return fig


def pair_patterns(groups: list[RetentionGroup], x: dict[int, int]) -> dict[int, str]:
    """Each measured pair's x and its arrival pattern (and singleflight setting, where a run measured both): a run
    cycles its pairs through the patterns, so a sawtooth along the pairs is the patterns, not a drift (review
    finding, 6 Dec 2026: 6282's makespan panel rose five times from 'together' to '200ms' over an axis that said
    only 'measured pair')."""
    both = len({g.singleflight for g in groups if g.path != "engine"}) > 1
    return {x[id(g)]: g.arrival + (f" sf {'on' if g.singleflight else 'off'}" if both else "") for g in groups}


def _mib(reads: dict) -> float:
    b = reads["hook_bytes"] if reads["hook_bytes"] is not None else reads["device_bytes"]
    return (b or 0) / MIB
