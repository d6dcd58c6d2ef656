"""Section 17's figure: which fields each trace source carries, beside what a retention replay needs.

Two heatmaps (share of records, 0-100 %), the colour bar beside the second; each column is wide enough for
its annotation at the report's text floor (``base.figures``), so the figure widens with the fields shown.
"""
from __future__ import annotations

from kmesh_lib.base.figures import save as save_figure

COLUMN_IN = 0.6  # one heatmap column: a "100%" annotation at the text floor, with a margin
PANEL_MIN_IN = 3.6  # a panel at least as wide as its two-line title
LABELS_IN = 4.2  # the source labels left of the first heatmap, the colour bar right of the second


def field_coverage(have, need, out=None):
    """``have``: sources x fields (share non-null); ``need``: sources x requirements (share that qualifies)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    widths = [max(PANEL_MIN_IN, COLUMN_IN * m.shape[1]) for m in (have, need)]
    fig, axes = plt.subplots(1, 2, figsize=(LABELS_IN + sum(widths), 2.0 + 0.34 * max(len(have), 1)),
                             sharey=True, gridspec_kw={"width_ratios": widths})
    panels = (("fields the records carry\n(share of records, non-null)", have),
              ("what a retention replay needs\n(share of records with a qualifying field)", need))
    for ax, (title, matrix) in zip(axes, panels):
        ax.set_facecolor("0.85")  # grey: no parseable record, no share to show
        sns.heatmap(matrix, ax=ax, vmin=0, vmax=1, cmap="Blues", annot=True, fmt=".0%", linewidths=0.5,
                    annot_kws={"size": 9}, cbar=ax is axes[-1], cbar_kws={"label": "share of records"})
        ax.set(title=title, xlabel="", ylabel="")
        plt.setp(ax.get_xticklabels(), rotation=45, ha="right", rotation_mode="anchor")
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, bbox_inches="tight")
    return fig
