"""Section 00's figure: the blocks the two requests hold, step by step, on each engine.

Saved by ``base.figures.save`` (its DPI, its text floor); the legend sits beside the axes, off the steps.
"""
from __future__ import annotations

from kmesh_lib.base.figures import save as save_figure


def blocks_in_use(runs: list[tuple[object, int]], out=None):
    """``runs``: (a pair's run, its usable blocks) per engine; each step line is usable minus free blocks."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3))
    styles = (dict(lw=4, alpha=0.5), dict(ls="--"))
    for (run, usable), style in zip(runs, styles):
        steps, free = zip(*run.capture.num_free_by_step)
        ax.step(steps, [usable - f for f in free], where="post", label=f"{run.engine_mode} engine, B={run.block_size}",
                **style)
    ax.set(xlabel="engine step", ylabel="blocks in use", title="Blocks held by the two requests (back to 0: drained)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, bbox_inches="tight")
    return fig
