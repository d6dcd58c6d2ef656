"""The kmesh engine as the Tree-of-Thoughts search's generator (section 19).

``engine_generator(engine, cfg)`` runs each group of ``workloads.tot_search.Call`` s in one ``run_group``
(requests of a BFS step share their prompt prefix), with three additions:

* ``BoundedEngine``: a request older than ``invocation_bound_s`` is aborted in the engine
  (its blocks are freed) and reported finished with ``finish_reason="timeout"``;
* ``InvocationBlockLog``: every block-pool event is attributed to the request whose
  KV-cache-manager call caused it, so each capture record carries its own physical events, and
  every request's scheduled tokens and preemptions are counted;
* ``outputs(call)``, when given, forces each call's output (``engine.forcing``): the scripted
  policy's text, or a capture's outputs when a run is replayed at another pool size;
* ``capture_record``: one ``kmesh.capture/1`` record per invocation.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from kmesh_lib.engine.requests import RequestResult, RequestSpec, StepOutput, run_group
from kmesh_lib.kv.capture_contract import record_from_result
from kmesh_lib.workloads.tot_search import Call, Invocation, SearchConfig


class BoundedEngine:
    """Forwards the request API to ``engine.vllm_engine.vllm_engine``; a request older than ``bound_s`` is aborted and
    reported finished with ``finish_reason="timeout"``, so ``run_group`` returns normally."""

    def __init__(self, engine, bound_s: float) -> None:
        self.engine, self.bound_ns = engine, int(bound_s * 1e9)
        self.t_submit_ns: dict[str, int] = {}
        self.aborted: set[str] = set()

    def submit(self, spec) -> None:
        self.t_submit_ns[spec.request_id] = time.monotonic_ns()
        self.engine.submit(spec)

    def has_unfinished(self) -> bool:
        return bool(self.t_submit_ns) or self.engine.has_unfinished()

    def step(self):

        now = time.monotonic_ns()
        overdue = [rid for rid, t in self.t_submit_ns.items() if now - t > self.bound_ns]
        if overdue:
            abort_requests(self.engine, overdue)
            self.aborted.update(overdue)
        outputs = [StepOutput(rid, [], [], True, "timeout") for rid in overdue]
        for rid in overdue:
            del self.t_submit_ns[rid]
        if self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id not in self.aborted:
                    outputs.append(out)
                    if out.finished:
                        self.t_submit_ns.pop(out.request_id, None)
        return outputs


def abort_requests(engine, request_ids: list[str]) -> None:
    """Aborts requests in a ``VllmEngine`` or a ``ReplayEngine``; their blocks are freed."""
    if engine.mode == "replay":
        from vllm.v1.request import RequestStatus

        engine.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
    else:
        engine.llm.llm_engine.abort_request(request_ids)


class InvocationBlockLog:
    """Attributes every block-pool event of a ``BlockPoolCapture`` to one request.

    Every allocation, touch and eviction happens inside ``KVCacheManager.allocate_slots(request,
    ...)`` and every free inside ``KVCacheManager.free(request)`` (preemption included), so the
    events a call of either adds belong to its request. Events outside both are counted in
    ``num_unattributed`` (expected 0).

    It also counts, per request, the tokens the scheduler scheduled (``Scheduler.schedule``'s
    ``num_scheduled_tokens``) and the preemptions (``Request.num_preemptions`` at its last
    free). Scheduled = prefill after the prefix hit + one per decoded token + whatever a
    preemption made it compute again, so the recompute is measured, not assumed away.
    """

    def __init__(self, engine, capture) -> None:
        self.capture, self.kvm, self.scheduler = capture, engine.kv_cache_manager, engine.scheduler
        self.by_request: dict[str, list] = {}
        self.num_scheduled_tokens: dict[str, int] = {}
        self.num_preemptions: dict[str, int] = {}
        for name in ("allocate_slots", "free"):
            self._wrap(name)
        original_schedule = self.scheduler.schedule

        def schedule(*args, **kwargs):
            out = original_schedule(*args, **kwargs)
            for rid, n in out.num_scheduled_tokens.items():
                self.num_scheduled_tokens[rid] = self.num_scheduled_tokens.get(rid, 0) + n
            return out

        self.scheduler.schedule = schedule

    def _wrap(self, name: str) -> None:
        original = getattr(self.kvm, name)

        def wrapper(request, *args, **kwargs):
            first = len(self.capture.events)
            result = original(request, *args, **kwargs)
            self.by_request.setdefault(request.request_id, []).extend(self.capture.events[first:])
            if name == "free":
                self.num_preemptions[request.request_id] = request.num_preemptions
            return result

        setattr(self.kvm, name, wrapper)

    def _lookup(self, table: dict, request_id: str):
        """The real engine suffixes request ids (``<id>-<8 chars>``); both forms are looked up."""
        return [v for rid, v in table.items() if rid == request_id or rid.rsplit("-", 1)[0] == request_id]

    def events_for(self, request_id: str) -> list[dict]:
        events = [e for evs in self._lookup(self.by_request, request_id) for e in evs]
        return [e.to_dict() for e in sorted(events, key=lambda e: e.step)]

    def scheduling_for(self, request_id: str) -> dict[str, int]:
        return {"num_scheduled_tokens": sum(self._lookup(self.num_scheduled_tokens, request_id)),
                "num_preemptions": sum(self._lookup(self.num_preemptions, request_id))}

    @property
    def num_unattributed(self) -> int:
        return len(self.capture.events) - sum(len(v) for v in self.by_request.values())

    def close(self) -> None:
        for name in ("allocate_slots", "free"):
            self.kvm.__dict__.pop(name, None)
        self.scheduler.__dict__.pop("schedule", None)


def engine_generator(engine, cfg: SearchConfig, on_step=None,
                     outputs: Callable[[Call], list[int]] | None = None) -> Callable:
    """``generate(calls)`` on a kmesh engine: one ``run_group`` per group, at the call's seed.

    ``outputs(call)``: the call's forced output ids (the engine must force outputs); None lets
    the model choose (``MAX_TOKENS`` each).
    """

    def generate(calls: list[Call]) -> list[RequestResult]:
        specs = [RequestSpec(c.invocation_id, list(c.prompt_token_ids), cfg.max_tokens, cfg.temperature, c.seed,
                             forced_token_ids=None if outputs is None else tuple(outputs(c)))
                 for c in calls]
        return run_group(BoundedEngine(engine, cfg.invocation_bound_s), specs, on_step=on_step)

    return generate


def capture_record(inv: Invocation, *, run_id: str, engine_info: dict, clock_domain: str,
                   block_events: list[dict] | None = None, scheduling: dict | None = None,
                   policy: str = "model") -> dict:
    """One ``kmesh.capture/1`` record: exact tokens, producer edge, kind, block events, and
    ``extra.policy`` ("scripted": the output was forced to the script's text)."""

    call = inv.call
    rec = record_from_result(inv.result, run_id=run_id, kind=call.kind, engine=engine_info, clock_domain=clock_domain,
                             family_id=f"puzzle-{call.puzzle_index}", parent_id=call.parent_id, block_events=block_events,
                             extra={"puzzle_index": call.puzzle_index, "step": call.step, "call_index": call.call_index,
                                    "seed": call.seed, "state_left": call.state.left, "state_steps": list(call.state.steps),
                                    "context_reset": call.context_reset, "parsed": inv.parsed, "policy": policy,
                                    **(scheduling or {})})
    if inv.timed_out:
        rec["status"] = "timeout"
    return rec
