"""Section 00's statements about a run, recomputed from ``raw/`` and ``params.resolved.yaml``.

    raw/requests.jsonl      one row per request: arm, request_id, prompt and output token ids,
                            num_cached_tokens, submission and token stamps, finish_reason
    raw/block_events.jsonl  the block-pool capture: arm, step, op, block_ids, ref_cnts after the call

An arm is one engine: ``<ENGINE>-B<BLOCK_SIZE>`` (the profile's engine) and
``replay-B<REPLAY_BLOCK_SIZE>``. Per arm the events are replayed from a drained pool: the logged
reference counts must be the replayed ones, the events split into one segment per request at the
points where every reference is released, and the second request's prefix hit must be touches of
the first request's own blocks (the exact parent-to-child edges), one block per ``BLOCK_SIZE``
cached tokens. Every figure ``results.json`` states about an arm is recomputed here and compared.
"""
from __future__ import annotations

from kmesh_lib.base.checks import Check, all_of, check, differences
from kmesh_lib.base.declared import ABSENT
from kmesh_lib.base.records import RunFiles
from kmesh_lib.kv.capture import TAKES, replay_references
from kmesh_lib.sections.engine_check.captures import EngineCheckBlockEvent, EngineCheckRequest
from kmesh_lib.sections.engine_check.params import EngineCheckParams

OPS = ("alloc", "touch", "free", "evict", "hold", "release")
LIVE = ("start_s", "drain_ok")  # the fields of an arm's table only the live run knew


def expected_prefix_hit(prompt_len: int, shared_len: int, block_size: int) -> int:
    """Tokens vLLM reuses: full shared blocks, capped so the last prompt token is recomputed."""
    return min(shared_len // block_size, (prompt_len - 1) // block_size) * block_size


def arms(params: EngineCheckParams) -> dict[str, tuple[int, int]]:
    """Arm label -> (block size, pool size with the null block), in the order the notebook runs them."""
    return {f"{params.ENGINE}-B{params.BLOCK_SIZE}": (params.BLOCK_SIZE, params.NUM_GPU_BLOCKS),
            f"replay-B{params.REPLAY_BLOCK_SIZE}": (params.REPLAY_BLOCK_SIZE, params.REPLAY_NUM_GPU_BLOCKS)}


def segments(events: list[EngineCheckBlockEvent]) -> list[list[EngineCheckBlockEvent]]:
    """The events split where every reference is released: one segment per sequential request.

    An eviction happens inside the allocation that follows it, so it opens the next segment.
    """
    out: list[list[EngineCheckBlockEvent]] = []
    current: list[EngineCheckBlockEvent] = []
    num_refs = 0
    for event in events:
        current.append(event)
        num_refs += TAKES.get(event.op, 0) * len(event.block_ids)
        if num_refs == 0 and event.op in ("free", "release"):
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def block_ids(events: list[EngineCheckBlockEvent], op: str) -> list[int]:
    return [b for e in events if e.op == op for b in e.block_ids]


def block_ops(events: list[EngineCheckBlockEvent]) -> dict[str, int]:
    """Block-level operations per kind (a touch of 3 blocks counts 3), as ``BlockPoolCapture.counts``."""
    return {op: len(block_ids(events, op)) for op in OPS}


def first_token_ms(row: EngineCheckRequest) -> float:
    return round((row.t_token_ns[0] - row.t_submit_ns) / 1e9 * 1e3, 2)


def request_rows(engine: str, block_size: int, shared_len: int, rows: list[EngineCheckRequest]) -> list[dict]:
    """The per-request table the notebook shows and ``results.json`` keeps, from raw request rows."""
    return [{"engine": engine, "request": r.request_id, "prompt_tokens": len(r.prompt_token_ids),
             "output_tokens": len(r.output_token_ids), "num_cached_tokens": r.num_cached_tokens,
             "expected_cached": expected_prefix_hit(len(r.prompt_token_ids), shared_len, block_size) if i else 0,
             "first_token_ms": first_token_ms(r), "finish": r.finish_reason}
            for i, r in enumerate(rows)]


def by_arm(records: list) -> dict[str, list]:
    """Records per arm label, in recorded order."""
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r.arm, []).append(r)
    return out


def arm_table(run: RunFiles, arm: str) -> dict:
    """The arm's declared table (``tables.TABLES``): engine, block size, per-request rows and block
    operations, from raw/; ``ABSENT`` when raw/ has no request of the arm. Its ``LIVE`` fields only the live
    run knew (the engine's start time, the live pool's drain report) are recorded, not rebuilt."""
    rows = by_arm(run.records("requests.jsonl")).get(arm, [])
    if not rows:
        return ABSENT
    engine, block_size = arm.split("-B")[0], arms(run.params)[arm][0]
    return {"engine": engine, "block_size": block_size,
            "requests": request_rows(engine, block_size, run.params.CONTEXT_TOKENS, rows),
            "block_ops": block_ops(by_arm(run.records("block_events.jsonl")).get(arm, []))}


def arm_checks(run: RunFiles, arm: str, block_size: int, num_gpu_blocks: int) -> list[Check]:
    p = run.params
    shared, suffix, max_tokens = p.CONTEXT_TOKENS, p.SUFFIX_TOKENS, p.MAX_TOKENS
    rows = by_arm(run.records("requests.jsonl")).get(arm, [])
    events = by_arm(run.records("block_events.jsonl")).get(arm, [])
    no_rows, no_events = f"raw/requests.jsonl has no {arm} rows", f"raw/block_events.jsonl has no {arm} events"
    pair = rows if [r.request_id for r in rows] == ["first", "second"] else []
    out = [check(f"{arm}: two requests recorded, first then second", bool(pair),
                 f"request ids {[r.request_id for r in rows]}", rows, no_rows)]
    first, second = pair or (None, None)
    lengths = [len(r.prompt_token_ids) for r in pair]
    out.append(check(f"{arm}: both prompts are CONTEXT_TOKENS shared + SUFFIX_TOKENS own tokens",
                     lengths == [shared + suffix] * 2
                     and first.prompt_token_ids[:shared] == second.prompt_token_ids[:shared]
                     and first.prompt_token_ids[shared:] != second.prompt_token_ids[shared:],
                     f"prompt tokens {lengths}, {shared} + {suffix} wanted", pair, no_rows))
    out.append(all_of(f"{arm}: both requests finished with MAX_TOKENS={max_tokens} tokens", pair,
                      lambda r: len(r.output_token_ids) == max_tokens and r.finish_reason == "length",
                      lambda r: f"{r.request_id}: {len(r.output_token_ids)} tokens, {r.finish_reason}", no_rows))
    first_cached = first.num_cached_tokens if first else None
    second_cached = second.num_cached_tokens if second else None
    want = expected_prefix_hit(len(second.prompt_token_ids) if second else 0, shared, block_size)
    out.append(check(f"{arm}: first request found nothing cached", first_cached == 0,
                     f"{first_cached} cached", pair, no_rows))
    out.append(check(f"{arm}: second request hit every reusable shared block", second_cached == want,
                     f"{second_cached} cached, {want} reusable (B={block_size})", pair, no_rows))

    refs, errors = replay_references([e.as_event() for e in events])
    out.append(check(f"{arm}: logged ref_cnts equal the replayed reference counts", not errors,
                     f"{len(events)} events" + (f"; {errors[0]}" if errors else ""), events, no_events))
    leaked = sorted(b for b, n in refs.items() if n)
    out.append(check(f"{arm}: the pool drained (every reference released)", not leaked and not errors,
                     f"{len(refs)} blocks used, {num_gpu_blocks - 1} usable; still referenced: {leaked[:10]}",
                     events, no_events))
    parts = segments(events)
    first_ev, second_ev = parts if len(parts) == 2 else ([], [])
    out.append(check(f"{arm}: the capture splits into one drained segment per request", len(parts) == len(pair) == 2,
                     f"{len(parts)} segments for {len(pair)} requests", events, no_events))
    touched, parent_ids = block_ids(second_ev, "touch"), block_ids(first_ev, "alloc")
    out.append(check(f"{arm}: the second's cached tokens are touches of the first's blocks, in order",
                     bool(pair) and touched == parent_ids[:len(touched)] and not block_ids(first_ev, "touch")
                     and len(touched) * block_size == second_cached,
                     f"touched {touched[:8]}{'...' if len(touched) > 8 else ''} x B={block_size} vs "
                     f"{second_cached} cached; the first allocated {parent_ids[:8]}",
                     first_ev and second_ev, "the capture did not split into two requests"))

    recorded = run.results.get(arm, {})
    diffs = differences(arm_table(run, arm), {k: v for k, v in recorded.items() if k not in LIVE}, arm)
    out.append(check(f"{arm}: results.json requests and block operations equal the raw", not diffs,
                     "; ".join(diffs[:3]) or f"the whole {arm} table: {len(rows)} requests, {len(events)} events",
                     recorded and rows and events, f"results.json has no {arm} summary" if not recorded else no_rows))
    out.append(Check(f"{arm}: live drain check (every usable block back in the free queue)",
                     "ok" if recorded.get("drain_ok") is True else "failed" if recorded.get("drain_ok") is False else "skipped",
                     "the live pool's report, kept in results.json", recorded_only=True))
    return out


def checks(run: RunFiles) -> list[Check]:
    """Section 00's checks: each arm's requests, its replayed capture, and the engines' agreement."""
    arm_sizes = arms(run.params)
    out = [c for arm, (b, n) in arm_sizes.items() for c in arm_checks(run, arm, b, n)]
    (first, size_a), (second, size_b) = arm_sizes.items()
    rows, events = by_arm(run.records("requests.jsonl")), by_arm(run.records("block_events.jsonl"))
    same = {a: ([r.num_cached_tokens for r in rows.get(a, [])], block_ops(events.get(a, []))) for a in arm_sizes}
    comparable = size_a == size_b and rows.get(first) and rows.get(second)
    out.append(check("the two engines give the same cached tokens and block operations at the same block size and pool",
                     same[first] == same[second], f"{first}: {same[first]}; {second}: {same[second]}", comparable,
                     f"not comparable: {first} runs B={size_a[0]}, {size_a[1]} blocks; "
                     f"{second} B={size_b[0]}, {size_b[1]} blocks"))
    return out


def counts(run: RunFiles) -> dict[str, int | str]:
    """Deterministic facts of the run, for the smoke golden: cached tokens and block operations per arm."""
    rows, events = by_arm(run.records("requests.jsonl")), by_arm(run.records("block_events.jsonl"))
    out: dict[str, int | str] = {}
    for arm in arms(run.params):
        ops = block_ops(events.get(arm, []))
        out[f"{arm} num_cached_tokens per request"] = ", ".join(str(r.num_cached_tokens) for r in rows.get(arm, []))
        out[f"{arm} output tokens"] = sum(len(r.output_token_ids) for r in rows.get(arm, []))
        out[f"{arm} block ops"] = ", ".join(f"{op} {ops[op]}" for op in OPS if ops[op] or op in ("alloc", "touch", "free"))
        out[f"{arm} block events"] = len(events.get(arm, []))
    return out
