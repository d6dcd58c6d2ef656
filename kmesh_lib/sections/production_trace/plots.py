"""Section 23's figures: cached share against pool size (stock, LRU, ideal), and the saved prefill time
per request that an external tier buys, as quantiles.

Saved by ``base.figures.save`` (its DPI, its text floor) where ``out`` is given; legends sit beside the axes,
off the lines and bars.
"""
from __future__ import annotations

from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.base.records import RunFiles


def cached_share_vs_pool(run, out=None, ax=None):
    """Per shape: the share of prompt tokens reused by LRU and by the ideal at each pool size (GiB of KV),
    stock vLLM's replay marked where it ran."""
    import matplotlib.pyplot as plt

    rows = RunFiles.of(run).results.get("pools", [])
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for i, shape in enumerate(dict.fromkeys(r["shape"] for r in rows)):
        mine = sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["pool_gib"])
        x = [r["pool_gib"] for r in mine]
        ax.plot(x, [r["ideal_cached_share"] for r in mine], marker="o", c=f"C{i}", label=f"{shape}: ideal bound")
        ax.plot(x, [r["lru_cached_share"] for r in mine], marker="s", ls="--", c=f"C{i}", label=f"{shape}: LRU")
        stock = [r for r in mine if r["stock"] == "replayed"]
        if stock:
            ax.scatter([r["pool_gib"] for r in stock], [r["lru_cached_share"] if r["stock_prefill_tokens"] is None else
                                                        1 - r["stock_prefill_tokens"] / r["num_prompt_tokens"]
                                                        for r in stock],
                       marker="*", s=160, c=f"C{i}", edgecolors="k", zorder=3, label=f"{shape}: stock vLLM (replay)")
    ax.set_xscale("log")
    ax.set_xlabel("GPU KV pool (GiB)")
    ax.set_ylabel("share of prompt tokens reused")
    ax.set_title("Prefix reuse against pool size")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))  # outside: no point hidden
    if out is not None:
        save_figure(ax.figure, out, bbox_inches="tight")
    return ax


def tier_savings(run, out=None, ax=None):
    """Per tier row: estimated prefill time saved per request (p50, p90, p99, mean)."""
    import matplotlib.pyplot as plt

    rows = RunFiles.of(run).results.get("tiers", [])
    if ax is None:  # wide enough that each row's label (the shape's name on its own line) keeps to its slot
        _, ax = plt.subplots(figsize=(max(7.0, 1.0 + 1.1 * len(rows)), 4))
    labels = [f"{r['shape']}\n{r['tier']}\n{r['tier_gib']:g} GiB" for r in rows]
    for j, q in enumerate(("p50", "p90", "p99", "mean")):
        ax.bar([i + j * 0.2 for i in range(len(rows))],
               [r.get("saved_ms_per_request", {}).get(q, 0) for r in rows], width=0.2, label=q)
    # 8 pt: over the 7.5 pt text floor; base.figures.save raises it on a figure wider than 10.8 in
    ax.set_xticks([i + 0.3 for i in range(len(rows))], labels, fontsize=8)
    ax.axhline(0, c="k", lw=0.6)
    ax.set_ylabel("prefill time saved per request (ms)")
    ax.set_title("External tier behind the pool: saved time per request (section 21 costs)", pad=28)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)  # above: no bar hidden, the
    # axes keep the figure's width for the rows' labels
    if out is not None:
        save_figure(ax.figure, out, bbox_inches="tight")
    return ax
