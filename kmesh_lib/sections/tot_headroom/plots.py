"""Section 19's figures: the search tree coloured by cached fraction, prefill against pool size,
and headroom against pool size by script error rate. Each title names the policy.

Each takes ``out`` and saves there by ``base.figures.save`` (its DPI, its text floor); legends sit beside the
axes, off the tree, the points and the lines.
"""
from __future__ import annotations

from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.tot_headroom.captures import TotInvocation
from kmesh_lib.sections.tot_headroom.params import CAPTURE, ENGINE_TRACE
from kmesh_lib.sections.tot_headroom.report import policy_name


def tree_layout(records: list[TotInvocation]) -> dict[str, tuple[float, float]]:
    """(x, y) per invocation: leaves in call order, a parent centred over its children; y is the
    BFS step (two rows per step: proposals, then the value calls they produced)."""
    children: dict[str | None, list[str]] = {}
    by_id = {r.invocation_id: r for r in records}
    for r in records:
        children.setdefault(r.parent_id if r.parent_id in by_id else None, []).append(r.invocation_id)
    xy: dict[str, tuple[float, float]] = {}
    next_x = [0.0]

    def place(node: str) -> float:
        kids = children.get(node, [])
        x = sum(place(k) for k in kids) / len(kids) if kids else next_x[0]
        if not kids:
            next_x[0] += 1.0
        rec = by_id[node]
        xy[node] = (x, -(2 * (rec.extra.step - 1) + (rec.kind == "value")))
        return x

    for root in children.get(None, []):
        place(root)
        next_x[0] += 1.5  # a gap between puzzles
    return xy


def _beside(ax, **kwargs) -> None:
    """The legend right of the axes, its top at the axes' top: nothing drawn under it."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, **kwargs)


def _saved(ax, out):
    if out is not None:
        ax.figure.tight_layout()
        save_figure(ax.figure, out, bbox_inches="tight")
    return ax


def search_tree(run, ax=None, out=None):
    """The engine run's calls as a tree (edges: producer -> child), coloured by the cached share of
    each prompt (``num_cached_tokens / prompt tokens``); circles propose, squares value."""
    import matplotlib.pyplot as plt

    run = RunFiles.of(run)
    records = run.records(CAPTURE)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.6))
    xy = tree_layout(records)
    for r in records:
        if r.parent_id in xy:
            (x0, y0), (x1, y1) = xy[r.parent_id], xy[r.invocation_id]
            ax.plot([x0, x1], [y0, y1], c="0.75", lw=0.8, zorder=1)
    points = None
    for kind, marker in (("proposal", "o"), ("value", "s")):
        mine = [r for r in records if r.kind == kind]
        if mine:
            points = ax.scatter([xy[r.invocation_id][0] for r in mine], [xy[r.invocation_id][1] for r in mine],
                                c=[r.num_cached_tokens / len(r.prompt_token_ids) for r in mine], cmap="viridis",
                                vmin=0, vmax=1, marker=marker, s=40, edgecolors="k", linewidths=0.4, zorder=2,
                                label=f"{kind} call")
    for r in records:
        if r.parent_id not in xy:  # a puzzle's root call
            x, y = xy[r.invocation_id]
            ax.annotate(f"puzzle {r.extra.puzzle_index}", (x, y), xytext=(0, 8), textcoords="offset points",
                        ha="center", fontsize=8)
    ax.margins(y=0.15)  # room above each root for its label, inside the axes (under the title)
    if points is not None:
        ax.figure.colorbar(points, ax=ax, label="cached share of the prompt", fraction=0.03)
    ax.set(yticks=[], xticks=[], title=f"ToT search tree, {policy_name(run)} policy: {len(records)} calls "
                                       f"(rows: steps 1-3, proposals over their value calls)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, borderaxespad=0)  # under the tree, left of the bar
    return _saved(ax, out)


def prefill_vs_pool(run, trace: str = ENGINE_TRACE, ax=None, out=None):
    """Prefill tokens against pool size: stock vLLM (replay engine; its recompute after preemption
    stacked on), the LRU reference and the ideal bound; the engine's own observation as a star."""
    import matplotlib.pyplot as plt

    run = RunFiles.of(run)
    rows = [r for r in run.results.get("stock_sweep", []) if r["trace"] == trace]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    sizes = [r["num_blocks"] for r in rows]
    stock = [r for r in rows if "stock_total_tokens" in r]
    ax.plot(sizes, [r["lru_prefill_tokens"] for r in rows], "o-", lw=4, ms=9, alpha=0.4, label="LRU reference")
    ax.plot(sizes, [r["ideal_prefill_tokens"] for r in rows], "s--", c="k", ms=4, label="ideal bound (MIN)")
    ax.plot([r["num_blocks"] for r in stock], [r["stock_total_tokens"] for r in stock], "v-", c="tab:red", ms=6,
            label="stock vLLM (replay engine), recompute included")
    ax.plot([r["num_blocks"] for r in stock], [r["stock_prefill_tokens"] for r in stock], "^:", c="tab:red", ms=5,
            alpha=0.6, label="stock vLLM, first prefill only")
    engine = [r for r in rows if "engine_prefill_tokens" in r]
    if engine:
        ax.plot([engine[0]["num_blocks"]], [engine[0]["engine_prefill_tokens"]], "r*", ms=14,
                label="stock vLLM on the engine (observed)")
    if rows:
        ax.axhline(rows[0]["num_prompt_tokens"], ls=":", c="gray", label="all prompt tokens")
        ax.axhline(rows[0]["num_compulsory_tokens"], ls="--", c="gray", lw=0.8, label="compulsory")
    if stock and min(sizes) < stock[0]["num_blocks"]:
        ax.axvspan(min(sizes) / 1.2, stock[0]["num_blocks"] / 1.1, color="0.93", zorder=0,
                   label="pool below one request (vLLM refuses it)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # stock, LRU and ideal differ by a few percent near the working set
    ax.set(xlabel="pool size (usable blocks)", ylabel="prefill tokens (log scale)",
           title=f"{trace} trace, {policy_name(run) if trace == ENGINE_TRACE else 'scripted'} policy: "
                 f"{rows[0]['num_calls'] if rows else 0} calls")
    _beside(ax)
    return _saved(ax, out)


def headroom_by_error_rate(run, ax=None, out=None):
    """Headroom share (stock minus ideal, over stock) against pool size, one line per script error rate."""
    import matplotlib.pyplot as plt

    run = RunFiles.of(run)
    rows = [r for r in run.results.get("stock_sweep", []) if r["trace"] != ENGINE_TRACE and "headroom_share" in r]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.8))
    for rate in sorted({r["error_rate"] for r in rows}):
        mine = [r for r in rows if r["error_rate"] == rate]
        ax.plot([r["num_blocks"] for r in mine], [r["headroom_share"] for r in mine], "o-", ms=4,
                label=f"error rate {rate:g}")
    ax.set_xscale("log", base=2)
    scale = run.results.get("scale_searches", [])
    ax.set(xlabel="pool size (usable blocks)", ylabel="headroom / stock prefill", ylim=(0, None),
           title=f"scripted policy, {scale[0]['num_puzzles'] if scale else 0} puzzles: headroom by search quality")
    _beside(ax)
    return _saved(ax, out)
