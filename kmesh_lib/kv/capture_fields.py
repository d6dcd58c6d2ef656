"""Field checkers of the capture contract (``kv.capture_contract`` holds the schema and the API).

Each checker takes the record (or one of its values) and ``bad(field, message)``, and reports
every broken rule of its fields; none raises and none stops at the first problem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Bad = Callable[[str, str], None]

SCHEMA_ID = "kmesh.capture/1"
STATUSES = ("finished", "aborted", "error", "timeout", "length", "stop")
COMPLETED_STATUSES = ("finished", "length", "stop")  # the engine produced a last token
ENGINE_NAMES = ("vllm",)
ENGINE_MODES = ("real", "replay")
BLOCK_OPS = ("alloc", "touch", "free", "evict", "hold", "release")

_ENGINE_KEYS = {"name", "version", "mode", "device", "block_size", "num_gpu_blocks", "model"}


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not a count


def check_engine(engine: Any, bad: Bad) -> int | None:
    """Check the engine object; return num_gpu_blocks when it is valid (bounds block ids)."""
    if not isinstance(engine, dict):
        bad("engine", f"must be an object (got {type(engine).__name__})")
        return None
    for key in sorted(set(engine) - _ENGINE_KEYS):
        bad(f"engine.{key}", "unknown field")
    for key in sorted(_ENGINE_KEYS - {"model"} - set(engine)):
        bad(f"engine.{key}", "missing")
    if "name" in engine and engine["name"] not in ENGINE_NAMES:
        bad("engine.name", f"must be one of {', '.join(ENGINE_NAMES)} (got {engine['name']!r})")
    if "mode" in engine and engine["mode"] not in ENGINE_MODES:
        bad("engine.mode", f"must be one of {', '.join(ENGINE_MODES)} (got {engine['mode']!r})")
    for key in ("version", "device", "model"):
        if key in engine and not (isinstance(engine[key], str) and engine[key]):
            bad(f"engine.{key}", f"must be a non-empty string (got {engine[key]!r})")
    if "block_size" in engine and not (is_int(engine["block_size"]) and engine["block_size"] > 0):
        bad("engine.block_size", f"must be an int > 0 (got {engine['block_size']!r})")
    blocks = engine.get("num_gpu_blocks")
    if "num_gpu_blocks" in engine and not (is_int(blocks) and blocks > 1):
        bad("engine.num_gpu_blocks", f"must be an int > 1 (got {blocks!r})")
        return None
    return blocks


def check_times(rec: dict, bad: Bad) -> None:
    times = {}
    for name in ("t_submit_ns", "t_first_token_ns", "t_finish_ns"):
        if name not in rec or (rec[name] is None and name != "t_submit_ns"):
            continue
        if not (is_int(rec[name]) and rec[name] >= 0):
            bad(name, f"must be an int >= 0{'' if name == 't_submit_ns' else ' or null'}"
                      f" (got {rec[name]!r})")
        else:
            times[name] = rec[name]
    submit, first, finish = (times.get(k) for k in ("t_submit_ns", "t_first_token_ns",
                                                    "t_finish_ns"))
    if submit is not None and first is not None and first < submit:
        bad("t_first_token_ns", f"must be >= t_submit_ns (got {first} < {submit})")
    if finish is not None and first is not None and finish < first:
        bad("t_finish_ns", f"must be >= t_first_token_ns (got {finish} < {first})")
    elif finish is not None and submit is not None and finish < submit:
        bad("t_finish_ns", f"must be >= t_submit_ns (got {finish} < {submit})")
    if rec.get("status") in COMPLETED_STATUSES and "t_finish_ns" in rec and rec["t_finish_ns"] is None:
        bad("t_finish_ns", f"must be set when status is {rec['status']!r}")


def _check_token_list(rec: dict, name: str, bad: Bad) -> list | None:
    ids = rec.get(name)
    if name not in rec:
        return None
    if not isinstance(ids, list):
        bad(name, f"must be a list of ints >= 0 (got {type(ids).__name__})")
        return None
    wrong = next((i for i, t in enumerate(ids) if not (is_int(t) and t >= 0)), None)
    if wrong is not None:
        bad(name, f"must hold ints >= 0 (item {wrong} is {ids[wrong]!r})")
        return None
    return ids


def check_tokens(rec: dict, bad: Bad) -> None:
    prompt = _check_token_list(rec, "prompt_token_ids", bad)
    output = _check_token_list(rec, "output_token_ids", bad)
    if prompt is not None and not prompt:
        bad("prompt_token_ids", "must not be empty")
    if output and rec.get("t_first_token_ns", 0) is None:
        bad("t_first_token_ns", f"must be set when output_token_ids holds {len(output)} tokens")
    cached = rec.get("num_cached_tokens")
    if "num_cached_tokens" in rec and not is_int(cached):
        bad("num_cached_tokens", f"must be an int (got {cached!r})")
    elif "num_cached_tokens" in rec and prompt is not None and not 0 <= cached <= len(prompt):
        bad("num_cached_tokens", f"must be in 0..len(prompt_token_ids)={len(prompt)} (got {cached})")


def check_block_events(events: Any, num_gpu_blocks: int | None, bad: Bad) -> None:
    if not isinstance(events, list):
        bad("block_events", f"must be a list (got {type(events).__name__})")
        return
    last_step = -1
    for i, ev in enumerate(events):
        name = f"block_events[{i}]"
        if not isinstance(ev, dict):
            bad(name, f"must be an object (got {type(ev).__name__})")
            continue
        for key in sorted(set(ev) - {"step", "op", "block_ids", "ref_cnts"}):
            bad(f"{name}.{key}", "unknown field")
        step, op, ids, refs = ev.get("step"), ev.get("op"), ev.get("block_ids"), ev.get("ref_cnts")
        if not (is_int(step) and step >= 0):
            bad(f"{name}.step", f"must be an int >= 0 (got {step!r})")
        elif step < last_step:
            bad(f"{name}.step", f"must be >= the previous event's step (got {step} < {last_step})")
        else:
            last_step = step
        if op not in BLOCK_OPS:
            bad(f"{name}.op", f"must be one of {', '.join(BLOCK_OPS)} (got {op!r})")
        if not (isinstance(ids, list) and ids):
            bad(f"{name}.block_ids", f"must be a non-empty list of ints (got {ids!r})")
            continue
        high = num_gpu_blocks - 1 if num_gpu_blocks else None
        wrong = [b for b in ids if not (is_int(b) and b >= 1 and (high is None or b <= high))]
        if wrong:
            bad(f"{name}.block_ids", f"ids must be ints in 1..{high or 'num_gpu_blocks-1'} "
                                     f"(got {wrong[0]!r})")
        if "ref_cnts" in ev and not (isinstance(refs, list) and len(refs) == len(ids)
                                     and all(is_int(r) and r >= 0 for r in refs)):
            bad(f"{name}.ref_cnts", f"must be {len(ids)} ints >= 0, one per block id (got {refs!r})")
