"""The interactive panel: a lead slider that re-plots from the recorded groups, and a Run button that
measures a new lead in its own run folder.

    slider, group size   redraw at once from the groups recorded so far (the run's, plus every live
                         measurement made in this panel): the lead sweep with the slider's lead marked,
                         and the nearest recorded lead's numbers underneath
    Run                  a fresh engine in a child process (``live``), measuring on_arrival and early
                         at the slider's lead, WIDGET_GROUPS pairs, into a new run folder next to this
                         run's; disabled while it runs; the progress bar counts recorded groups; when it
                         ends its groups join the plot and the folder holds its checks and results

Engine output never reaches the panel: the child writes it to the live folder's ``engine.log``.
The figure is a PNG in an ``Image`` widget, drawn on a bare matplotlib ``Figure`` (no pyplot), so the
watcher thread can redraw it. Constructing the panel runs nothing; a headless papermill or nbval
run only builds it (nbval skips widget outputs), and the notebook shows a static lead-sweep figure
before it for readers without the widget's JavaScript. Without ipywidgets the panel is a note.
"""
from __future__ import annotations

import threading
import time

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.prefetch import live
from kmesh_lib.sections.prefetch.plots import lead_sweep_figure, png, png_css_width
from kmesh_lib.sections.prefetch.stats import lead_sweep

HEADER_START = '{"schema"'  # a capture's schema header (base.captures): the first line, no group


class LivePanel:
    """The widgets and their callbacks; ``launch`` starts a live measurement (``live.start``)."""

    def __init__(self, cfg, groups: list[dict], parent_run: str, path: str | None = None, launch=live.start,
                 poll_s: float = 0.5) -> None:
        import ipywidgets as w

        self.cfg, self.parent_run, self.launch, self.poll_s = cfg, parent_run, launch, poll_s
        self.path = path or cfg.PATHS[0]
        self.groups = list(groups)
        self.live_runs: list[str] = []
        self.thread: threading.Thread | None = None
        top = max(cfg.LEADS_MS) * 2 or 500.0
        self.lead = w.FloatSlider(value=cfg.LEADS_MS[-1], min=0.0, max=top, step=5.0, description="lead (ms)",
                                  continuous_update=True)
        self.size = w.Dropdown(options=list(cfg.GROUP_SIZES), value=cfg.GROUP_SIZES[0], description="group size")
        self.button = w.Button(description="Run", tooltip="measure this lead on a fresh engine (a new run folder)")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="groups", layout=w.Layout(visibility="hidden"))
        self.status = w.HTML()
        self.image = w.Image(format="png")
        self.lead.observe(self.redraw, names="value")
        self.size.observe(self.redraw, names="value")
        self.button.on_click(self.run)
        self.box = w.VBox([w.HBox([self.lead, self.size, self.button, self.progress]), self.status, self.image])
        self.redraw()

    # -- from the recorded groups, at once --
    def redraw(self, *_) -> None:
        n, lead = self.size.value, self.lead.value
        image = png(lead_sweep_figure(self.groups, only=(self.path, n), highlight_ms=lead))
        self.image.value = image
        self.image.layout.width = f"{png_css_width(image)}px"  # its size in inches, sharp: never stretched
        self.status.value = self.nearest(n, lead)

    def nearest(self, n: int, lead: float) -> str:
        rows = [r for r in lead_sweep(self.groups) if r["path"] == self.path and r["group_size"] == n]
        early = [r for r in rows if r["arm"] == "early"]
        arrival = next((r for r in rows if r["arm"] == "on_arrival"), None)
        if not early:
            return "no early groups recorded for this group size"
        r = min(early, key=lambda r: abs(r["lead_ms"] - lead))
        text = (f"nearest recorded lead {r['lead_ms']:g} ms: {r['groups']} groups, {r['ready']} ready at T, "
                f"A's first token median {r['A first token ms (median)']:.1f} ms")
        if arrival:
            text += f" (on arrival {arrival['A first token ms (median)']:.1f} ms)"
        if abs(r["lead_ms"] - lead) > 1e-9:
            text += f"; press Run to measure {lead:g} ms"
        return text

    # -- a new measurement --
    def run(self, _=None) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        cfg = live.live_params(self.cfg, self.path, self.size.value, self.lead.value)
        self.button.disabled = True
        self.progress.max, self.progress.value = live.expected_groups(cfg), 0
        self.progress.layout.visibility = "visible"
        self.status.value = f"measuring lead {self.lead.value:g} ms, N={self.size.value} on a fresh engine ..."
        self.thread = threading.Thread(target=self._watch, args=(cfg,), daemon=True)
        self.thread.start()

    def _watch(self, cfg) -> None:
        try:
            out, proc = self.launch(cfg, self.parent_run)
            groups_file = out / "raw" / "groups.jsonl"
            while proc.poll() is None:
                self.progress.value = _lines(groups_file)
                time.sleep(self.poll_s)
            recorded = live.recorded_groups(out, cfg)
            self.progress.value = len(recorded)
            self.groups += recorded
            self.live_runs.append(out.name)
            self.redraw()
            verdict = RunFiles(out).readable_results.get("status", "without results.json")  # its own checks' word
            self.status.value = (f"recorded in {out.name} ({len(recorded)} groups; run {verdict}, exit {proc.returncode}); "
                                 + self.status.value)
        except Exception as e:  # noqa: BLE001 - shown in the panel, never raised into the kernel's thread
            self.status.value = f"live run failed: {type(e).__name__}: {e}"
        finally:
            self.button.disabled = False
            self.progress.layout.visibility = "hidden"


def _lines(path) -> int:
    try:
        with open(path) as f:
            return sum(1 for line in f if line.endswith("\n") and not line.startswith(HEADER_START))
    except FileNotFoundError:
        return 0


def panel(cfg, groups: list, parent_run: str, path: str | None = None):
    """The widget box, or a note when ipywidgets is missing. Callbacks run only on user input."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "ipywidgets is not installed: the live panel is off (the lead sweep above is the recorded one)"
    return LivePanel(cfg, groups, parent_run, path).box
