"""Section 18's figures: cached tokens per request (stock against held), and the pool-size sweep.

Saved by ``base.figures.save`` (its DPI, its text floor); legends sit beside the axes, off the bars and lines.
"""
from __future__ import annotations

import pandas as pd

from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.sections.family_hold.report import request_rows


def cached_tokens(modes: list[tuple[str, list]], out=None):
    """``modes``: (label, arm records) per engine mode; the first sample's ``num_cached_tokens`` per request."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes) + 1.2, 3.4), sharey=False, squeeze=False)
    for ax, (label, runs) in zip(axes[0], modes):
        df = pd.DataFrame(request_rows(runs))
        df = df[df["sample"] == 0].pivot(index="request", columns="arm", values="num_cached_tokens").loc[runs[0].roles]
        df[["stock", "held"]].plot.bar(ax=ax, width=0.8, legend=False)
        ax.set(title=f"{label}, B={runs[0].block_size}, {runs[0].num_gpu_blocks} blocks", ylabel="num_cached_tokens",
               xlabel="")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5))  # outside: no bar hidden
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, bbox_inches="tight")
    return fig


def sweep_crossing(sweep_rows: list[dict], cross: float | None, block_size: int, out=None):
    """Tokens saved for the child and displaced from competitors against the parent's share of the pool."""
    import matplotlib.pyplot as plt

    df = pd.DataFrame(sweep_rows)
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.plot(df["parent_share"], df["saved"], "o-", label="saved (child)")
    ax.plot(df["parent_share"], df["displaced"], "s-", label="displaced (competing hits)")
    if cross is not None:
        ax.axvline(cross, color="gray", ls="--", label=f"crossing at {cross:.3f}")
    ax.set(xlabel="parent's hashed blocks / usable pool", ylabel="tokens", title=f"Family hold, B={block_size}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, bbox_inches="tight")
    return fig
