"""Section 17's figure: which fields each trace source carries, and what a retention replay needs of them.

Heatmaps of the share of records (0-100 %), sources as rows, stacked: the fields the records carry (at most
``MAX_COLUMNS`` fields a panel, so a corpus with many fields adds panels downward instead of shrinking every
cell once the report fits the figure into its column), then the replay's requirements; one colour bar
beside them. Each column is wide enough for its annotation at the report's text floor (``base.figures``).
"""
from __future__ import annotations

from kmesh_lib.base.figures import save as save_figure

MAX_COLUMNS = 12  # fields a panel: 12 columns of COLUMN_IN, the labels and the bar fit the report's column
COLUMN_IN = 0.6  # one heatmap column: a "100%" annotation at the text floor, with a margin
PANEL_MIN_IN = 4.2  # a panel at least as wide as its title
LABELS_IN = 4.2  # the source labels left of the heatmaps, the colour bar right of them
ROW_IN = 0.34  # one source
PANEL_EXTRA_IN = 2.1  # a panel's two-line title above it and its rotated column labels below it


def field_coverage(have, need, out=None):
    """``have``: sources x fields (share non-null); ``need``: sources x requirements (share that qualifies)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    num_fields = have.shape[1]
    chunks = [have.iloc[:, i:i + MAX_COLUMNS] for i in range(0, max(num_fields, 1), MAX_COLUMNS)]
    panels = [("fields the records carry"
               + (f" ({i * MAX_COLUMNS + 1}-{i * MAX_COLUMNS + m.shape[1]} of {num_fields})" if len(chunks) > 1 else "")
               + "\n(share of records, non-null)", m) for i, m in enumerate(chunks)]
    panels.append(("what a retention replay needs\n(share of records with a qualifying field)", need))
    width = LABELS_IN + max(PANEL_MIN_IN, COLUMN_IN * max(max(m.shape[1], 1) for _, m in panels))
    height = len(panels) * (PANEL_EXTRA_IN + ROW_IN * max(len(have), 1))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, height), squeeze=False, layout="constrained")
    axes = list(axes[:, 0])
    for ax, (title, matrix) in zip(axes, panels):
        ax.set_facecolor("0.85")  # grey: no parseable record, no share to show
        sns.heatmap(matrix, ax=ax, vmin=0, vmax=1, cmap="Blues", annot=True, fmt=".0%", linewidths=0.5,
                    annot_kws={"size": 9}, cbar=False)
        ax.set(title=title, xlabel="", ylabel="")
        ax.set_aspect("auto")
        plt.setp(ax.get_xticklabels(), rotation=45, ha="right", rotation_mode="anchor")
    if axes[0].collections:
        fig.colorbar(axes[0].collections[0], ax=axes, label="share of records", fraction=0.03, pad=0.02)
    if out is not None:
        save_figure(fig, out, bbox_inches="tight")
    return fig
