"""Section 00 for people: headline figures, the closing answer, the public aggregates.

All three read the run's raw records through the same functions as ``checks``, never the
notebook's printout, so a report says what the files say.
"""
from __future__ import annotations

from kmesh_lib.base.checks import verdict as checks_verdict
from kmesh_lib.base.records import RunFiles, recorded_packages
from kmesh_lib.sections.engine_check.checks import OPS, arms, block_ops, by_arm, checks, expected_prefix_hit


def _arm_facts(run: RunFiles) -> list[dict]:
    rows, events = by_arm(run.records("requests.jsonl")), by_arm(run.records("block_events.jsonl"))
    facts = []
    for arm, (block_size, num_gpu_blocks) in arms(run.params).items():
        mine = rows.get(arm, [])
        if len(mine) != 2:
            continue
        prompt = len(mine[1].prompt_token_ids)
        facts.append({"arm": arm, "engine": arm.split("-B")[0], "block_size": block_size, "num_gpu_blocks": num_gpu_blocks,
                      "num_prompt_tokens": prompt, "num_cached_tokens": [r.num_cached_tokens for r in mine],
                      "expected_cached_tokens": expected_prefix_hit(prompt, run.params.CONTEXT_TOKENS, block_size),
                      "block_ops": block_ops(events.get(arm, []))})
    return facts


def _ops(ops: dict) -> str:
    return ", ".join(f"{ops[op]} {name}" for op, name in (("alloc", "allocations"), ("touch", "touches"),
                                                        ("free", "frees"), ("evict", "evictions")) if ops[op] or op != "evict")


def headline(run: RunFiles) -> dict[str, str]:
    out = {}
    for f in _arm_facts(run):
        label = f"{f['engine']} engine, B={f['block_size']}"
        out[f"{label}: second request cached"] = f"{f['num_cached_tokens'][1]} of {f['num_prompt_tokens']} prompt tokens"
        out[f"{label}: block operations"] = _ops(f["block_ops"])
    out["checks"] = checks_verdict(checks(run))
    return out


def answer(run: RunFiles) -> str:
    facts = _arm_facts(run)
    if not facts:
        return "No request pair was recorded, so this run cannot answer the question."
    p, env = run.params, run.env
    report = checks(run)
    failed = [c.name for c in report if c.status == "failed"]
    version = recorded_packages(env).get("vllm", "?")
    parts = []
    for f in facts:
        hit = f["num_cached_tokens"][1] == f["expected_cached_tokens"] and f["num_cached_tokens"][0] == 0
        engine = "replay engine (vLLM's scheduler, no forward pass)" if f["engine"] == "replay" else f"{f['engine']} engine"
        parts.append(f"On the {engine} ({f['block_size']}-token blocks, {f['num_gpu_blocks']}-block pool) the "
                     f"second request found **{f['num_cached_tokens'][1]} of its {f['num_prompt_tokens']} prompt tokens** "
                     f"cached ({'every' if hit else 'not every'} full block of the {p.CONTEXT_TOKENS}-token shared prefix "
                     f"it may reuse: {f['expected_cached_tokens']}); the capture logged {_ops(f['block_ops'])}.")
    drained = not any("drained" in name or "ref_cnts" in name for name in failed)
    verdict = ("**Yes.**" if not failed else "**Not on this run:** " + "; ".join(failed[:3]) + ".")
    same = next(c for c in report if c.name.startswith("the two engines"))
    agree = ("The real and replay engines gave the same cached tokens and block operations at the same block size and pool."
             if same.status == "ok" else
             "The two engines ran different block sizes or pools here, so their counts are not compared; "
             "the gpu profile runs both at 16-token blocks." if same.status == "skipped" else
             "The two engines disagree at the same block size and pool: " + same.detail + ".")
    return (f"{verdict} vLLM {version} ({p.MODEL}, {p.DTYPE}, on {p.DEVICE}). " + " ".join(parts) + " "
            + ("Replaying the logged events from an empty pool gives every logged reference count, the second request's "
               "hits are touches of the first request's own blocks, and every reference is released at the end: the pool "
               "drains. " if drained else "The replayed capture does not drain: see the failed checks. ")
            + agree + " The evidence is two requests and one prefix length per engine: it shows the mechanism the "
            "later sections rely on, not its behaviour under load.")


def public_results(run: RunFiles) -> dict:
    """The aggregates section 00 publishes: per arm, sizes, cached tokens and block operation counts.
    The check statuses are the public document's own ``checks`` list (``app.publish``): check names
    are sentences, longer than a public key may be."""
    return {"section": "engine_check", "run_id": run.results.get("run_id"), "status": run.results.get("status"),
            "arms": [{"arm": f["arm"], "engine": f["engine"], "block_size": f["block_size"],
                      "num_gpu_blocks": f["num_gpu_blocks"], "num_prompt_tokens": f["num_prompt_tokens"],
                      "num_cached_tokens": list(f["num_cached_tokens"]), "expected_cached_tokens": f["expected_cached_tokens"],
                      "block_ops": {op: f["block_ops"][op] for op in OPS}} for f in _arm_facts(run)]}


def verdict(run: RunFiles) -> list[str]:
    """One sentence: the prefix hit per engine (token counts, deterministic: no interval) and whether the pool drained."""
    run = RunFiles.of(run)
    facts = _arm_facts(run)
    if not facts:
        return ["No verdict: no request pair was recorded."]
    failed = [c.name for c in checks(run) if c.status == "failed"]
    hits = all(f["num_cached_tokens"][1] == f["expected_cached_tokens"] and f["num_cached_tokens"][0] == 0 for f in facts)
    drained = not any("drained" in name or "ref_cnts" in name for name in failed)
    word = "Yes" if hits and drained else "No"
    same = len({(f["num_cached_tokens"][1], f["num_prompt_tokens"]) for f in facts}) == 1
    found = (f"{facts[0]['num_cached_tokens'][1]} of its {facts[0]['num_prompt_tokens']} prompt tokens cached on "
             + ("both engines" if len(facts) == 2 else "every engine") if same else
             "; ".join(f"{f['num_cached_tokens'][1]} of {f['num_prompt_tokens']} on the {f['engine']} engine" for f in facts))
    return [f"{word}: the second request found {found} ({'every' if hits else 'not every'} full block of the shared "
            f"prefix it may reuse), and the block pool {'drained' if drained else 'did not drain'} afterwards "
            "(token counts, deterministic)."]


def findings(run: RunFiles) -> list[dict]:
    """Per engine arm: cached tokens of the two requests against the expected prefix hit, and the block operations."""
    return [{"engine": f"{f['engine']}, B={f['block_size']}, {f['num_gpu_blocks']} blocks",
             "cached tokens, 1st / 2nd request": f"{f['num_cached_tokens'][0]} / {f['num_cached_tokens'][1]} "
                                                f"of {f['num_prompt_tokens']}",
             "expected 2nd": f["expected_cached_tokens"], "block operations": _ops(f["block_ops"])}
            for f in _arm_facts(RunFiles.of(run))]
