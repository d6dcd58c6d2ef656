"""Section 22's tables and plot, computed from the raw records (``raw/requests.jsonl``, ``raw/arms.jsonl``).

Where a request's prompt tokens came from:

    local       cached in the serving engine's own pool (vLLM's prefix cache)
    restored    supplied by the LMCache server (L1 or the disk tier), 'shared' only
    recomputed  prefilled by the serving engine: prompt - local - restored

A request's first-token time runs from its arrival to its first token; a trace's makespan from its
first arrival to its last token. Tables take medians over requests (``numpy.quantile``) and over
repeats.
"""
from __future__ import annotations

from collections import defaultdict

from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.sections.multi_engine.captures import ArmRecord, ProbeRecord, RequestRecord, ServerCounts

ROLES = ("parent", "child", "noise")


def sources(row: RequestRecord) -> tuple[int, int, int]:
    """(local, restored, recomputed) prompt tokens of a finished request."""
    cached = row.num_cached_tokens or 0
    local = row.num_local_cached_tokens
    local = cached if local is None else min(local, cached)
    return local, cached - local, row.num_prompt_tokens - cached


def quantile(values, q: float) -> float | None:
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.quantile(values, q)) if values else None


def median(values) -> float | None:
    return quantile(list(values), 0.5)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1e3 * seconds, 2)


def makespans(rows: list[RequestRecord]) -> dict[tuple, float]:
    """Per arm: last token of any finished request minus the first arrival."""
    first, last = {}, {}
    for r in rows:
        k = r.arm
        if r.arrival_s is not None:
            first[k] = min(first.get(k, r.arrival_s), r.arrival_s)
        if r.status == "ok":
            last[k] = max(last.get(k, r.finish_s), r.finish_s)
    return {k: round(last[k] - first[k], 6) for k in last if k in first}


def parent_engines(rows: list[RequestRecord]) -> dict[tuple, int]:
    return {(*r.arm, r.family): r.engine for r in rows if r.role == "parent"}


def policy_table(rows: list[RequestRecord], num_engines: int) -> list[dict]:
    """One row per (model, policy): makespan, first-token times, token sources and per-engine load."""
    spans = makespans(rows)
    parents = parent_engines(rows)
    groups: dict[tuple, list[RequestRecord]] = defaultdict(list)
    for r in rows:
        groups[(r.model, r.policy)].append(r)
    out = []
    for (model, policy), rs in groups.items():
        ok = [r for r in rs if r.status == "ok"]
        repeats = sorted({r.repeat for r in rs})
        n = len(repeats)
        src = [sum(sources(r)[i] for r in ok) for i in range(3)]
        children = [r for r in ok if r.role == "child"]
        with_parent = [r for r in children if parents.get((model, r.repeat, policy, r.family)) == r.engine]
        computed = [0] * num_engines
        served = [0] * num_engines
        for r in ok:
            served[r.engine] += 1
            computed[r.engine] += sources(r)[2]
        row = {"model": model, "policy": policy, "repeats": n, "requests": len(rs), "ok": len(ok),
               "makespan_ms": ms(median(spans.get((model, rep, policy)) for rep in repeats)),
               "ttft_ms": ms(median(r.ttft_s for r in ok)), "ttft_p90_ms": ms(quantile([r.ttft_s for r in ok], 0.9))}
        for role in ROLES:
            row[f"{role}_ttft_ms"] = ms(median(r.ttft_s for r in ok if r.role == role))
        row.update({"local_tokens": int(src[0]) // n, "restored_tokens": int(src[1]) // n,
                    "recomputed_tokens": int(src[2]) // n,
                    "children_with_parent": f"{len(with_parent)}/{len(children)}",
                    "child_cached_share": round(sum(r.num_cached_tokens or 0 for r in children)
                                                / max(1, sum(r.num_prompt_tokens for r in children)), 3),
                    "requests_per_engine": [s // n for s in served], "computed_per_engine": [c // n for c in computed],
                    "load_imbalance": round(max(computed) * num_engines / sum(computed), 2) if sum(computed) else None})
        out.append(row)
    order = {p: i for i, p in enumerate(("recompute", "round_robin", "prefix_aware", "shared"))}
    return sorted(out, key=lambda r: (r["model"], order.get(r["policy"], 9)))


def oom_chunks(before: ServerCounts, after: ServerCounts) -> int:
    """Chunks the server could not place in L1 between two snapshots (a store or a load dropped)."""
    d = {k: after.metric(k) - before.metric(k) for k in ("l1_allocation_failures", "failure_l1_oom")}
    return int(max(d.values()))


def bytes_table(arms: list[ArmRecord], rows: list[RequestRecord]) -> list[dict]:
    """Per 'shared' trace: bytes through the server by tier, three counts of the disk tier's traffic,
    and what the engines say they restored (external tokens x KV bytes per token)."""
    restored = defaultdict(int)
    for r in rows:
        if r.status == "ok":
            restored[r.arm] += sources(r)[1]
    out = []
    for a in arms:
        b, c = a.server_before, a.server_after
        if b is None or c is None:
            continue
        chunk = a.chunk_size * a.kv_bytes_per_token
        m = {k: c.metric(k) - b.metric(k) for k in c.metrics}
        device = (c.device_read_bytes - b.device_read_bytes
                  if c.device_read_bytes is not None and b.device_read_bytes is not None else None)
        hook_read = c.hook_read_bytes - b.hook_read_bytes if c.hook_read_bytes is not None else None
        out.append({
            "model": a.model, "repeat": a.repeat, "policy": a.policy,
            "engine_restored_bytes": restored[a.arm] * a.kv_bytes_per_token,
            # LMCache 0.5.3 exports no per-tier lookup counters: None there, never a 0 it did not count
            "l1_hit_tokens": _count(m, "lookup_hit_l1_tokens"), "l2_hit_tokens": _count(m, "lookup_hit_l2_tokens"),
            "l1_write_bytes": int(m.get("l1_write_chunks", 0) * chunk),
            "l1_evicted_bytes": int(m.get("l1_evicted_chunks", 0) * chunk),
            "l2_write_bytes_hook": c.hook_write_bytes - b.hook_write_bytes,
            "l2_write_bytes_metrics": int(m.get("l2_stored_chunks", 0) * chunk),
            "l2_write_errors": c.hook_write_errors - b.hook_write_errors,
            "l2_read_bytes_hook": hook_read, "l2_read_bytes_device": device,
            "l2_read_bytes_metrics": int(m.get("l2_loaded_chunks", 0) * chunk),
            "l1_oom_chunks": oom_chunks(b, c),
            "lookup_hit_tokens": int(m.get("lookup_hit_tokens", 0)),
            "disk_tier_bytes": c.disk_tier_bytes, "l2_usage_bytes": int(c.metric("l2_usage_bytes"))})
    return out


def _count(metrics: dict, name: str) -> int | None:
    return int(metrics[name]) if name in metrics else None


def restore_table(rows: list[RequestRecord]) -> list[dict]:
    """Children the shared server restored, against the same children under the other policies:
    what restoring cost in first-token time, next to recomputing and to a local hit."""
    by = {(*r.arm, r.request_id): r for r in rows if r.status == "ok"}
    groups: dict[str, list[tuple]] = defaultdict(list)
    for (model, repeat, policy, rid), r in by.items():
        if policy == "shared" and r.role == "child" and sources(r)[1] > 0:
            groups[model].append((repeat, rid, r))
    out = []
    for model, items in groups.items():
        row = {"model": model, "restored_children": len(items),
               "restored_tokens_median": median(sources(r)[1] for _, _, r in items),
               "shared_ttft_ms": ms(median(r.ttft_s for _, _, r in items))}
        for policy in ("recompute", "round_robin", "prefix_aware"):
            same = [by[(model, rep, policy, rid)] for rep, rid, _ in items if (model, rep, policy, rid) in by]
            row[f"{policy}_ttft_ms"] = ms(median(r.ttft_s for r in same))
            row[f"{policy}_local_tokens_median"] = median(sources(r)[0] for r in same)
        out.append(row)
    return out


def plot(rows: list[RequestRecord], table: list[dict], path_out, title: str = ""):
    """Per model: first-token times per policy (box, log scale), makespan per policy (bars, a dot per
    repeat) and computed prompt tokens per engine."""
    import matplotlib.pyplot as plt
    import numpy as np

    models = list(dict.fromkeys(r["model"] for r in table))
    spans = makespans(rows)
    fig, axes = plt.subplots(len(models), 3, figsize=(12, 3.2 * len(models)), squeeze=False)
    for ax_row, model in zip(axes, models):
        mine = [t for t in table if t["model"] == model]
        policies = [t["policy"] for t in mine]
        data = [[1e3 * r.ttft_s for r in rows if r.model == model and r.policy == p and r.status == "ok"]
                for p in policies]
        ax_row[0].boxplot(data, showfliers=True)
        ax_row[0].set_xticks(range(1, len(policies) + 1), policies)
        ax_row[0].set(yscale="log", ylabel="first token (ms)", title=f"{model}: first-token time per request")
        ax_row[1].bar(policies, [t["makespan_ms"] or 0 for t in mine], color="C0", alpha=0.6)
        for i, p in enumerate(policies):
            ys = [1e3 * v for (m, _, q), v in spans.items() if m == model and q == p]
            ax_row[1].plot([i] * len(ys), ys, "k.", ms=6)
        ax_row[1].set(ylabel="makespan (ms)", title="makespan (median; dots: repeats)")
        bottom = np.zeros(len(policies))
        for e in range(len(mine[0]["computed_per_engine"])):
            vals = np.array([t["computed_per_engine"][e] for t in mine])
            ax_row[2].bar(policies, vals, bottom=bottom, label=f"engine {e}")
            bottom += vals
        ax_row[2].set(ylabel="prompt tokens computed", title="load: computed tokens per engine")
        ax_row[2].legend(fontsize=7)
        for ax in ax_row:
            ax.tick_params(axis="x", labelsize=8, labelrotation=20)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path_out)
    return fig


PROBE_KINDS = ("recompute", "local", "restore")


def probe_table(probes: list[ProbeRecord]) -> list[dict]:
    """Per model: the idle-engine child's first token recomputed, from a local hit and restored
    (medians over NUM_PROBES), and the bytes a restore moved into the engine."""
    out = []
    for model in dict.fromkeys(p.model for p in probes):
        row: dict = {"model": model, "probes": len({p.probe for p in probes if p.model == model})}
        for kind in PROBE_KINDS:
            mine = [p for p in probes if p.model == model and p.kind == kind]
            row[f"{kind}_ttft_ms"] = ms(median(p.ttft_s for p in mine))
            row[f"{kind}_cached_tokens"] = median(p.num_cached_tokens for p in mine)
        restores = [p for p in probes if p.model == model and p.kind == "restore"]
        row["restore_bytes"] = median((p.num_external_tokens or 0) * p.kv_bytes_per_token for p in restores)
        out.append(row)
    return out
