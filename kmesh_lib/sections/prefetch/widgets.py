"""The interactive panel: a lead-time slider and a group-size selector that re-run a small sweep.

Constructing the panel runs nothing: the engine starts only when a user presses *Run*, so a
headless papermill or nbval execution builds the widgets harmlessly (nbval skips widget outputs)
and the published numbers come from the parameter list alone. Without ipywidgets the panel is a
one-line note.
"""
from __future__ import annotations

from kmesh_lib.sections.prefetch.plots import plot_arms
from kmesh_lib.sections.prefetch.protocol import PrefetchRun


def live_sweep(cfg, path: str, n: int, lead_ms: float, groups: int | None = None, log=print) -> list[dict]:
    """A fresh engine run with ``groups`` pairs of (on_arrival, early at ``lead_ms``); not recorded."""

    run = PrefetchRun(cfg, path, n, run_index=99, log=log)
    try:
        run.start()
        recs = run.confirm([("on_arrival", 0.0), ("early", lead_ms / 1e3)], groups or cfg.WIDGET_GROUPS, 0)
    finally:
        run.close()
    return recs


def panel(cfg, path: str | None = None):
    """The widget box, or a note when ipywidgets is missing. Callbacks run only on user input."""
    try:
        import ipywidgets as w
    except ImportError:
        return "ipywidgets is not installed: the live panel is off (the tables above come from LEADS_MS)"
    import matplotlib.pyplot as plt


    path = path or cfg.PATHS[0]
    lead = w.FloatSlider(value=cfg.LEADS_MS[-1], min=0.0, max=max(cfg.LEADS_MS) * 2 or 500.0, step=5.0,
                         description="lead (ms)", continuous_update=False)
    size = w.Dropdown(options=list(cfg.GROUP_SIZES), value=cfg.GROUP_SIZES[0], description="group size")
    button = w.Button(description="Run")
    out = w.Output()

    def run(_):
        with out:
            out.clear_output()
            print(f"running {cfg.WIDGET_GROUPS} pairs at lead {lead.value:.0f} ms, N={size.value} ...")
            recs = live_sweep(cfg, path, size.value, lead.value, log=lambda m: None)
            for r in recs:
                r["measured"] = True
            ready = [r["ready"] for r in recs if r["arm"] == "early"]
            print(f"early ready at T: {sum(ready)}/{len(ready)}")
            plot_arms(recs, path)
            plt.show()

    button.on_click(run)
    return w.VBox([w.HBox([lead, size, button]), out])
