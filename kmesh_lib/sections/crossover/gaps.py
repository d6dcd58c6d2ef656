"""What a section-21 run planned and did not measure, and why, from the run's own files.

Each (model, tier) child (``experiment.run_model``) gives its own account in raw/models.jsonl:

    ok           it ran its whole plan
    store_short  a context's store wrote short (raw/stores.jsonl has the bytes), so it ran no arm and no pair at
                 that context
    error        it raised (``detail``: the exception)
    (none)       no summary: killed at CHILD_TIMEOUT_S, or it died before writing one (its raw/child-*.log says)

``unmeasured`` sets the plan (the params' MODELS x CONTEXT_TOKENS_GRID x ARMS) against what entered the tables
(``report.usable`` rows; the pairs of raw/pairs.jsonl) and names, per child with something missing, its account;
``note`` says it in sentences, so every section of the report of a run whose children failed says what it lacks and
why, and ``show`` displays a table with the note under it.

The paired design is planned where params.resolved.yaml records NUM_RESTORES or NUM_DISK_RESTORES: every run
since the design writes both (``kmesh run`` and the GPU driver write every field), and no run before it has
either. A run without raw/pairs.jsonl therefore either predates the design (``predates_pairs``: its paired
checks are left out) or planned pairs its children did not measure (its paired checks fail, ``pairs_note``
saying why).
"""
from __future__ import annotations

from collections.abc import Iterable
from itertools import product

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.crossover import report
from kmesh_lib.sections.crossover.arms import TIER_OF
from kmesh_lib.sections.crossover.captures import ChildSummary
from kmesh_lib.sections.crossover.params import num_pairs

PAIRED_PARAMS = ("NUM_RESTORES", "NUM_DISK_RESTORES")  # written by every run planned in the paired design
PAIRED_SINCE = "this run predates the paired design (raw/ holds no pairs.jsonl: no restore/resident pairs, no floors per point)"
NO_PAIRS_PLANNED = "the params plan no pairs (NUM_RESTORES=0 and NUM_DISK_RESTORES=0, or no restore path)"


def predates_pairs(run: RunFiles) -> bool:
    """The run was recorded before the paired design: no raw/pairs.jsonl, and its params record neither of
    ``PAIRED_PARAMS``. A run whose params record them and that has no pairs planned pairs none of its children
    measured (or none at all: NUM_RESTORES=0), which is no reason to leave its paired checks out."""
    return not run.has_raw("pairs.jsonl") and not any(k in run.recorded_params for k in PAIRED_PARAMS)


def child(run: RunFiles, model: str, tier: str) -> ChildSummary | None:
    """The (model, tier) child's last summary in raw/models.jsonl (a resumed GPU run keeps only the finished one);
    None where it wrote none."""
    found = [m for m in run.records("models.jsonl") if (m.model, m.tier) == (model, tier)]
    return found[-1] if found else None


def _tokens(lengths: Iterable[int]) -> str:
    return ", ".join(f"{n:,}" for n in sorted(lengths))


def account(run: RunFiles, model: str, tier: str) -> str:
    """Why the (model, tier) child measured less than its plan, in its own words (raw/models.jsonl, with the short
    stores of raw/stores.jsonl); a clause that completes "its <tier> child ..."."""
    summary = child(run, model, tier)
    if summary is None:  # its log (``experiment.Unit.name``) says which
        return (f"left no summary in raw/models.jsonl (killed at CHILD_TIMEOUT_S={run.params.CHILD_TIMEOUT_S} s, or "
                "it died before writing one: its log, raw/child-*.log, says)")
    if summary.status == "error":
        return f"raised ({(summary.detail or 'no detail recorded')[:160]})"
    if summary.status == "store_short":
        short = [s for s in run.records("stores.jsonl") if (s.model, s.tier) == (model, tier)
                 and (s.write_errors or s.bytes_written < s.context_bytes)]
        stores = "; ".join(f"{s.context_tokens:,} tokens: {s.bytes_written:,} of {s.context_bytes:,} bytes"
                           + (f", {s.write_errors} write errors" if s.write_errors else "") for s in short)
        return (f"finished store_short: its store wrote short ({stores or 'raw/stores.jsonl records none'}), so it ran "
                "no arm and no pair at " + ("that context" if len(short) == 1 else "those contexts"))
    return f"finished {summary.status}, yet recorded none of them that hit its expected cached tokens"


def _gaps(run: RunFiles, planned: Iterable[tuple], have: set[tuple]) -> list[dict]:
    """The planned (model, context, arm) points missing from ``have``, one row per (model, tier) child."""
    by_child: dict[tuple, dict] = {}
    for model, n, arm in planned:
        if (model, n, arm) in have:
            continue
        gap = by_child.setdefault((model, TIER_OF[arm]), {"arms": {}, "contexts": set()})
        gap["arms"].setdefault(arm, None)
        gap["contexts"].add(n)
    out = []
    for (model, tier), gap in by_child.items():
        summary = child(run, model, tier)
        out.append({"model": model, "tier": tier, "child": summary.status if summary else "no summary",
                    "arms": ", ".join(gap["arms"]), "contexts": _tokens(gap["contexts"]),
                    "why": f"its {tier} child {account(run, model, tier)}"})
    return out


def unmeasured(run: RunFiles, arms: Iterable[str] | None = None) -> list[dict]:
    """One row per (model, tier) child whose planned arms (of ``arms``; default every arm of the params) miss a
    measured row at some context of the grid: model, tier, child (its status), arms, contexts, why (its account)."""
    p = run.params
    wanted = [a for a in p.ARMS if arms is None or a in set(arms)]
    have = {(r.model, r.context_tokens, r.arm) for r in report.usable(run.records("rows.jsonl"))}
    return _gaps(run, product(p.MODELS, p.CONTEXT_TOKENS_GRID, wanted), have)


def _sentences(gaps: list[dict], grid: list[int], what: str, brief: bool = False) -> str:
    return " ".join(f"No {what} of {g['arms']} for {g['model']} "
                    + ("at any context" if g["contexts"] == _tokens(grid) else f"at {g['contexts']} tokens")
                    + (f" (its {g['tier']} child: {g['child']}; why: the table of unmeasured points, under the grid)." if brief
                       else f": {g['why']}.") for g in gaps)


def note(run: RunFiles, arms: Iterable[str] | None = None, brief: bool = False) -> str:
    """``unmeasured`` in sentences ("No measured row of lmcache_mp for qwen2.5-7b at any context: its lmcache_mp
    child finished store_short: ..."); empty where nothing of ``arms`` is missing. ``brief``: the child's status
    alone, pointing to the table of unmeasured points (shown under the grid) for its account: the notes under the tables
    after it, which said the same account once a table (13c2: six times, a report over ten screens)."""
    return _sentences(unmeasured(run, arms), run.params.CONTEXT_TOKENS_GRID, "measured row", brief)


def missing_pairs(run: RunFiles) -> list[dict]:
    """``unmeasured`` for the paired design: the planned (model, context, restore path) points with no pair in
    raw/pairs.jsonl (none planned before the design, or with NUM_RESTORES=0 and NUM_DISK_RESTORES=0)."""
    p = run.params
    if predates_pairs(run):
        return []
    have = {(r.model, r.context_tokens, r.pair_arm) for r in run.records("pairs.jsonl")}
    planned = [(m, n, a) for m, n, a in product(p.MODELS, p.CONTEXT_TOKENS_GRID, p.ARMS) if num_pairs(p, a)]
    return _gaps(run, planned, have)


def pairs_note(run: RunFiles) -> str:
    """Why the run's pairs (the restore_resolution table) lack a point: it predates the design, its params plan
    none, or the children's accounts (``missing_pairs``); empty where every planned pair point was measured."""
    p = run.params
    if predates_pairs(run):
        return PAIRED_SINCE[0].upper() + PAIRED_SINCE[1:] + "."
    if not any(num_pairs(p, a) for a in p.ARMS):
        return NO_PAIRS_PLANNED[0].upper() + NO_PAIRS_PLANNED[1:] + "."
    return _sentences(missing_pairs(run), p.CONTEXT_TOKENS_GRID, "restore/resident pair")


def show(table, note_text: str = "") -> None:
    """Displays ``table`` (rows, or a DataFrame) where it has rows, and under it ``note_text`` (what it lacks and
    why) as Markdown: an empty table says why it is empty instead of "Empty DataFrame" (a table empty for the
    reason a note above it gave, with no note of its own, shows nothing)."""
    import pandas as pd
    from IPython.display import Markdown, display

    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table if table is not None else [])
    if not frame.empty:
        display(frame)
    if note_text:
        display(Markdown(note_text))


def show_resolution(rows: list[dict], note_text: str = "") -> None:
    """The restore_resolution table as ``report.resolution_views`` splits it, each part under its title, then
    ``note_text`` (the points without pairs, and why)."""
    from IPython.display import Markdown, display

    for title, view in report.resolution_views(rows):
        display(Markdown(f"**{title}**"))
        show(view)
    if note_text:
        display(Markdown(note_text))


__all__ = ["NO_PAIRS_PLANNED", "PAIRED_PARAMS", "PAIRED_SINCE", "account", "child", "missing_pairs", "note",
           "pairs_note", "predates_pairs", "show", "show_resolution", "unmeasured"]
