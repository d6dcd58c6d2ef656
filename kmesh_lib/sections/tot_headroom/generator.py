"""The kmesh engine as the Tree-of-Thoughts search's generator (section 19).

``engine_generator(engine, cfg)`` runs each group of ``workloads.tot_search.Call`` s in one ``run_group``
(requests of a BFS step share their prompt prefix), with three additions:

* ``BoundedEngine``: a request older than ``invocation_bound_s`` is aborted in the engine
  (its blocks are freed) and reported finished with ``finish_reason="timeout"``;
* ``InvocationBlockLog``: every block-pool event is attributed to the request whose
  KV-cache-manager call caused it, so each capture record carries its own physical events;
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
    """

    def __init__(self, engine, capture) -> None:
        self.capture, self.kvm = capture, engine.kv_cache_manager
        self.by_request: dict[str, list] = {}
        for name in ("allocate_slots", "free"):
            self._wrap(name)

    def _wrap(self, name: str) -> None:
        original = getattr(self.kvm, name)

        def wrapper(request, *args, **kwargs):
            first = len(self.capture.events)
            result = original(request, *args, **kwargs)
            self.by_request.setdefault(request.request_id, []).extend(self.capture.events[first:])
            return result

        setattr(self.kvm, name, wrapper)

    def events_for(self, request_id: str) -> list[dict]:
        """The real engine suffixes request ids (``<id>-<8 chars>``); both forms are looked up."""
        events = list(self.by_request.get(request_id, []))
        for rid, evs in self.by_request.items():
            if rid != request_id and rid.rsplit("-", 1)[0] == request_id:
                events += evs
        return [e.to_dict() for e in sorted(events, key=lambda e: e.step)]

    @property
    def num_unattributed(self) -> int:
        return len(self.capture.events) - sum(len(v) for v in self.by_request.values())

    def close(self) -> None:
        for name in ("allocate_slots", "free"):
            self.kvm.__dict__.pop(name, None)


def engine_generator(engine, cfg: SearchConfig, on_step=None) -> Callable:
    """``generate(calls)`` on a kmesh engine: one ``run_group`` per group, at the call's seed."""

    def generate(calls: list[Call]) -> list[RequestResult]:
        specs = [RequestSpec(c.invocation_id, list(c.prompt_token_ids), cfg.max_tokens, cfg.temperature, c.seed)
                 for c in calls]
        return run_group(BoundedEngine(engine, cfg.invocation_bound_s), specs, on_step=on_step)

    return generate


def capture_record(inv: Invocation, *, run_id: str, engine_info: dict, clock_domain: str,
                   block_events: list[dict] | None = None) -> dict:
    """One ``kmesh.capture/1`` record: exact tokens, producer edge, kind, block events."""

    call = inv.call
    rec = record_from_result(inv.result, run_id=run_id, kind=call.kind, engine=engine_info, clock_domain=clock_domain,
                             family_id=f"puzzle-{call.puzzle_index}", parent_id=call.parent_id, block_events=block_events,
                             extra={"puzzle_index": call.puzzle_index, "step": call.step, "call_index": call.call_index,
                                    "seed": call.seed, "state_left": call.state.left, "state_steps": list(call.state.steps),
                                    "context_reset": call.context_reset, "parsed": inv.parsed})
    if inv.timed_out:
        rec["status"] = "timeout"
    return rec
