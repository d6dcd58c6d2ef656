"""Saving a section's figure so that a report shows it sharp and legible (issue 43).

``save(fig, path)`` writes the PNG at ``DPI`` (twice a screen's 72 points per inch, so it stays sharp on
a high-density display) after raising every text of the figure to at least the size that shows as
``MIN_PX`` CSS pixels once the report fits the figure into its ``COLUMN_PX``-wide column (a report
shows a PNG of ``DPI`` at its size in inches, as a browser counts 96 px an inch, or narrower to fit the
column). The figure is laid out again when a text grew. The report reads the DPI back from
the PNG (``pHYs``) to size the image.
"""
from __future__ import annotations

DPI = 144
COLUMN_PX = 1040  # app.report's column: 1100 px less its padding
MIN_PX = 10


def min_points(width_in: float) -> float:
    """The smallest font size (points) that shows as MIN_PX pixels in a figure ``width_in`` inches wide."""
    px_per_in = min(96.0, COLUMN_PX / max(width_in, 0.1))
    return MIN_PX * 72.0 / px_per_in


def legible(fig) -> None:
    """Raises every text of ``fig`` smaller than ``min_points`` of its width to that size (in place)."""
    from matplotlib.text import Text

    floor = min_points(fig.get_figwidth())
    changed = False
    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < floor:
            text.set_fontsize(floor)
            changed = True
    if not changed:
        return
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    engine = fig.get_layout_engine()
    if engine is None or isinstance(engine, PlaceHolderLayoutEngine):  # laid out by tight_layout() once, or never
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig.tight_layout()
    else:
        engine.execute(fig)


def save(fig, path, **kwargs) -> None:
    """``fig.savefig(path, dpi=DPI, **kwargs)`` after ``legible(fig)``."""
    legible(fig)
    fig.savefig(path, dpi=DPI, **kwargs)
