"""Section 20's figures: waits per arm (every measured group), the pilot, and the lead sweep.

``lead_sweep_figure`` draws on a bare ``matplotlib.figure.Figure`` (no pyplot state), so the live
panel can redraw it from a background thread and the notebook can show it as a static image that
an offline report keeps (the widget itself needs JavaScript; the figure does not).
"""
from __future__ import annotations

import io

from kmesh_lib.base.figures import DPI, legible
from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.sections.prefetch.captures import PrefetchGroup
from kmesh_lib.sections.prefetch.stats import lead_sweep, resident_wait, usable

ARM_ORDER = ("on_arrival", "early", "early_fixed", "dram", "buffer", "resident")


def plot_arms(groups: list[PrefetchGroup], path: str, out=None, ax_pair=None):
    """Per group size: every measured group's A-first-token wait and makespan, by arm (ms)."""
    import matplotlib.pyplot as plt

    gs = [g for g in usable(groups) if g.path == path]
    sizes = sorted({g.group_size for g in gs})
    fig, axes = plt.subplots(1, 2 * max(1, len(sizes)), figsize=(4 * max(1, len(sizes)) * 2, 3.2), squeeze=False)
    for i, n in enumerate(sizes or [0]):
        for j, (key, label) in enumerate((("wait_a_s", "A first token"), ("makespan_s", "all done"))):
            ax = axes[0][2 * i + j]
            arms = [a for a in ARM_ORDER if any(g.arm == a and g.group_size == n for g in gs)]
            for k, arm in enumerate(arms):
                ys = [getattr(g, key) * 1e3 for g in gs if g.arm == arm and g.group_size == n]
                ax.scatter([k + (m % 7 - 3) * 0.04 for m in range(len(ys))], ys, s=8, alpha=0.6)
                ax.hlines(sum(ys) / len(ys), k - 0.3, k + 0.3, color="k")
            ax.set_xticks(range(len(arms)), arms, rotation=30, fontsize=7)
            ax.set_title(f"{path} N={n}: {label}", fontsize=9)
            ax.set_ylabel("ms from T", fontsize=8)
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out)
    return fig


def plot_pilot(groups: list[PrefetchGroup], out=None):
    """Pilot: A's wait (ms from T) against lead, filled = ready, hollow = not ready."""
    import matplotlib.pyplot as plt

    pilot = [g for g in groups if g.phase == "pilot"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for path, n in sorted({(g.path, g.group_size) for g in pilot}):
        xs = [g for g in pilot if g.path == path and g.group_size == n]
        sc = ax.scatter([g.lead_ms for g in xs if g.ready], [g.wait_a_s * 1e3 for g in xs if g.ready],
                        s=14, label=f"{path} N={n}")
        ax.scatter([g.lead_ms for g in xs if not g.ready], [g.wait_a_s * 1e3 for g in xs if not g.ready],
                   s=14, facecolors="none", edgecolors=sc.get_facecolor())
    ax.set_xlabel("lead (ms)")
    ax.set_ylabel("A first token, ms from T")
    ax.set_title("pilot (hollow: not ready at T)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out)
    return fig


def lead_sweep_figure(groups: list[PrefetchGroup], only: tuple[str, int] | None = None, highlight_ms: float | None = None,
                      out=None):
    """A's first token (median, p25-p75) against the lead, per path and group size, from recorded groups.

    Early leads: filled where every group was ready at T, hollow otherwise. On arrival (lead 0, no
    preparation) is the grey band, the resident arm (the context already in vLLM's KV) the dashed line. ``highlight_ms``
    marks a lead (the panel's slider); ``only`` draws one (path, N).
    """
    from matplotlib.figure import Figure

    rows = lead_sweep(groups)
    residents = resident_wait(groups)
    panels = [only] if only else sorted({(r["path"], r["group_size"]) for r in rows})
    fig = Figure(figsize=(4.6 * max(1, len(panels)) + 2.0, 3.3))  # 2 in for the legend beside the panels
    for i, (path, n) in enumerate(panels or [("", 0)]):
        ax = fig.add_subplot(1, max(1, len(panels)), i + 1)
        mine = [r for r in rows if r["path"] == path and r["group_size"] == n]
        early = [r for r in mine if r["arm"] == "early"]
        for r in [r for r in mine if r["arm"] == "on_arrival"][:1]:
            ax.axhspan(r["p25"], r["p75"], color="0.85", label="on arrival (p25-p75)")
            ax.axhline(r["A first token ms (median)"], color="0.5", lw=1)
        if (path, n) in residents:
            ax.axhline(residents[(path, n)][0], color="tab:green", ls="--", lw=1, label="resident (in vLLM's KV)")
        for r in early:
            all_ready = r["ready"] == r["groups"]
            y = r["A first token ms (median)"]
            ax.errorbar([r["lead_ms"]], [y], yerr=[[y - r["p25"]], [r["p75"] - y]], fmt="o", color="tab:blue",
                        mfc="tab:blue" if all_ready else "white", capsize=3, ms=6)
        ax.plot([], [], "o", color="tab:blue", label="early, all ready")
        ax.plot([], [], "o", color="tab:blue", mfc="white", label="early, some late")
        if highlight_ms is not None:
            ax.axvline(highlight_ms, color="tab:red", lw=1)
        ax.set(xlabel="lead before T (ms)", ylabel="A's first token, ms from T", title=f"{path} N={n}")
        ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)  # beside the last panel, off the points
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, bbox_inches="tight")
    return fig


def png(fig) -> bytes:
    """The PNG the live panel shows: ``base.figures``' DPI and text floor, as a saved figure."""
    legible(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def png_css_width(image: bytes) -> int:
    """The CSS width of a ``png`` image: its pixels (the IHDR width) at 96 CSS px an inch, as a report shows it."""
    return round(int.from_bytes(image[16:20], "big") * 96 / DPI)
