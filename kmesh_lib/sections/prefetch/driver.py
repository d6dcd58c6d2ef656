"""Two ways a shared context reaches a group of follow-ups: prepared early, or loaded on arrival.

One group, the clock at the scheduled arrival T::

    early (lead L)   T-L: prefetch disk -> the tier's memory (MP: POST /cache/prefetches, then poll;
                          GPU buffer: the tier's ``prefetch``, disk -> pinned host -> the buffer)
                          then the one-token warm-up (context + 1 token) loads it into vLLM
                     T:   follow-ups A..N submitted, whatever the preparation's state
    on arrival       T:   follow-ups A..N submitted; the first lookup loads the context once,
                          the others reuse it (the tier keeps its copy in both arms)

The follow-ups are submitted by the group's arrival pattern (``workloads.context_params.ArrivalPattern``):
all at T (``together``), follow-up i at T + i*x ms, or after i*k engine steps that produced tokens.

Both stopwatches start at T, the *scheduled* arrival, not at the actual submission: the benchmark
supplies the advance notice but never postpones the requests, so a submission that the driver
delivers late (a step in progress at T) counts against the measured wait (``submit_delay_s``).

Invariants:
    - a group is ``ready`` only when the preparation finished before T: the prefetch (where there
      is one) completed and the warm-up produced its token at or before T, having found the whole
      context cached (``Readiness``); a late preparation still runs to the end, never cancelled;
    - on the in-process path (``LMCacheConnectorV1``) there is no application prefetch API: the
      early path is the warm-up alone (disk -> LocalCPU -> GPU), labelled ``warmup_only``;
    - every stamp is ``time.monotonic_ns()`` taken right after the engine step that produced it,
      as in ``engine.vllm_engine.requests.run_group``.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field

from kmesh_lib.engine.requests import RequestResult, RequestSpec, record_step

POLL_S = 0.0005  # the driver's idle wait between checks (prefetch completion, T)


@dataclass
class PrefetchCall:
    """One application-driven prefetch (MP path): submit, poll until completed, keys found."""

    submit_ns: int = 0
    done_ns: int = 0
    polls: int = 0
    found_keys: int = 0
    total_keys: int = 0
    status: str = "not started"
    error: str = ""

    @property
    def complete(self) -> bool:
        return self.status == "completed"


class BufferPrefetcher:
    """The GPU buffer's prefetch (``kv.gpu_buffer.GpuBufferTier.prefetch``) behind the same interface:
    ``start(tokens)``, ``call`` (found/total are blocks), ``done``; ``handle`` keeps the tier's record."""

    kind = "buffer_prefetch"

    def __init__(self, tier, timeout_s: float = 30.0) -> None:
        self.tier, self.timeout_s = tier, timeout_s
        self.call, self.done, self.handle = PrefetchCall(), threading.Event(), None

    def start(self, token_ids: list[int]) -> BufferPrefetcher:
        self.call, self.done = PrefetchCall(), threading.Event()
        self.call.submit_ns = time.monotonic_ns()
        self.handle = self.tier.prefetch(list(token_ids))
        threading.Thread(target=self._wait, daemon=True).start()
        return self

    def _wait(self) -> None:
        p, call = self.handle, self.call
        if not p.done.wait(self.timeout_s):
            call.status = "timeout"
        elif p.error:
            call.status, call.error = "failed", f"{p.status}: {p.error}"
        elif p.status in ("started", "resident"):  # read into the buffer now, or already there
            call.status, call.found_keys, call.total_keys = "completed", p.num_blocks, p.num_blocks
        else:  # miss: no stored entry holds a prefix of the tokens
            call.status = p.status
        call.done_ns = p.t_ready_ns or time.monotonic_ns()
        self.done.set()


class MPPrefetcher:
    """``POST /cache/prefetches`` + ``GET /cache/prefetches/{id}`` against a running lmcache server.

    ``start(tokens)`` runs submit-and-poll in a daemon thread; ``call`` fills in as it goes and
    ``done`` is set when the prefetch completed or failed. ``model_name`` must be the model path
    vLLM registered with the server (its ``cache_model_name``).
    """

    kind = "http_prefetch"

    def __init__(self, server, model_name: str, poll_s: float = 0.002, timeout_s: float = 30.0) -> None:
        self.server, self.model_name, self.poll_s, self.timeout_s = server, model_name, poll_s, timeout_s
        self.call = PrefetchCall()
        self.done = threading.Event()

    def start(self, token_ids: list[int]) -> MPPrefetcher:
        self.call, self.done = PrefetchCall(), threading.Event()
        threading.Thread(target=self._run, args=(list(token_ids),), daemon=True).start()
        return self

    def _run(self, token_ids: list[int]) -> None:
        call = self.call
        try:
            call.submit_ns = time.monotonic_ns()
            reply = json.loads(self.server._http("POST", "/cache/prefetches", {
                "model_name": self.model_name, "world_size": 1, "token_ids": token_ids}))
            request_id = reply["request_id"]
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                state = json.loads(self.server._http("GET", f"/cache/prefetches/{request_id}"))
                call.polls += 1
                if state.get("status") == "completed":
                    call.found_keys, call.total_keys = int(state.get("found_keys", 0)), int(state.get("total_keys", 0))
                    call.status = "completed"
                    break
                time.sleep(self.poll_s)
            else:
                call.status = "timeout"
        except Exception as e:  # noqa: BLE001 - recorded in the group, never raised into the driver
            call.status, call.error = "failed", f"{type(e).__name__}: {e}"
        call.done_ns = time.monotonic_ns()
        self.done.set()


@dataclass
class Readiness:
    """Was the preparation complete at the scheduled arrival T? All times relative to T, in seconds."""

    lead_s: float
    prep: str  # http_prefetch+warmup, warmup_only, none
    prefetch_done_s: float | None  # None: no prefetch on this path
    warmup_submit_s: float | None
    warmup_token_s: float | None
    warmup_cached_tokens: int | None
    expected_cached_tokens: int
    ready: bool = False
    why_not: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def readiness(lead_s: float, t_arrival_ns: int, expected_cached: int, prefetch: PrefetchCall | None,
              warmup: RequestResult | None, prep: str) -> Readiness:
    """The readiness record of one early group (a pure function of the stamps: testable with a fake clock)."""
    rel = (lambda ns: None if not ns else (ns - t_arrival_ns) / 1e9)
    r = Readiness(lead_s, prep, rel(prefetch.done_ns) if prefetch else None,
                  rel(warmup.t_submit_ns) if warmup else None,
                  rel(warmup.t_first_token_ns) if warmup else None,
                  warmup.num_cached_tokens if warmup else None, expected_cached)
    if prefetch is not None and not prefetch.complete:
        r.why_not = f"prefetch {prefetch.status}"
    elif prefetch is not None and prefetch.found_keys < prefetch.total_keys:
        r.why_not = f"prefetch found {prefetch.found_keys} of {prefetch.total_keys} chunks"
    elif warmup is None or warmup.t_first_token_ns is None:
        r.why_not = "no warm-up token"
    elif warmup.t_first_token_ns > t_arrival_ns:
        r.why_not = f"warm-up token {r.warmup_token_s * 1e3:.1f} ms after T"
    elif warmup.num_cached_tokens < expected_cached:
        r.why_not = f"warm-up found {warmup.num_cached_tokens} of {expected_cached} context tokens cached"
    r.ready = not r.why_not
    return r


@dataclass
class GroupTiming:
    """One group's follow-ups, measured from the scheduled arrival T."""

    t_arrival_ns: int
    results: list[RequestResult]
    warmup: RequestResult | None = None
    prefetch: PrefetchCall | None = None
    loop_iterations: int = 0
    idle_waits: int = 0
    stamps: int = 0
    extra: dict = field(default_factory=dict)

    def wait_a_s(self) -> float:
        """Stopwatch 1: T to A's first token (A is submitted first)."""
        return (self.results[0].t_first_token_ns - self.t_arrival_ns) / 1e9

    def makespan_s(self, nth: int) -> float:
        """Stopwatch 2: T until every follow-up produced its nth token."""
        return (max(r.nth_token_ns(nth) for r in self.results) - self.t_arrival_ns) / 1e9

    def submit_delay_s(self) -> float:
        return (min(r.t_submit_ns for r in self.results) - self.t_arrival_ns) / 1e9


def drive(engine, followups: list[RequestSpec], lead_s: float = 0.0, warmup: RequestSpec | None = None,
          prefetcher=None, prefetch_tokens: list[int] | None = None, poll_s: float = POLL_S,
          clock=time.monotonic_ns, sleep=time.sleep, spacing_ms: float = 0.0, spacing_steps: int = 0) -> GroupTiming:
    """Runs one group: preparation from T - lead_s, follow-ups submitted from T by the arrival pattern.

    With a ``prefetcher`` the warm-up is submitted once the prefetch is done (completed or
    failed); without one, at once. ``lead_s=0`` and no warm-up is the on-arrival path. Follow-up i
    is due at T + i * ``spacing_ms`` or, with ``spacing_steps``, once i * k engine steps that produced
    tokens ran since T (or at once when the engine is idle); both 0: all at T. Steps the engine until
    the follow-ups and the warm-up finished. Returns the stamps; nothing is judged here.
    """
    t_start = clock()
    t_arrival = t_start + int(lead_s * 1e9)
    results = {s.request_id: RequestResult(s.request_id, list(s.prompt_token_ids)) for s in followups}
    warm = RequestResult(warmup.request_id, list(warmup.prompt_token_ids)) if warmup else None
    if warm is not None:
        results[warm.request_id] = warm
    timing = GroupTiming(t_arrival, [results[s.request_id] for s in followups], warm)
    if prefetcher is not None:
        prefetcher.start(prefetch_tokens)
        timing.prefetch = prefetcher.call
    warm_pending = warmup is not None
    submitted, token_steps = 0, 0  # follow-ups submitted; steps with tokens since the first submission

    def due(i: int) -> bool:
        if clock() < t_arrival:
            return False
        if spacing_steps:
            return i == 0 or token_steps >= i * spacing_steps or not engine.has_unfinished()
        return clock() >= t_arrival + int(i * spacing_ms * 1e6)

    unfinished = set(results)
    while unfinished:
        timing.loop_iterations += 1
        if warm_pending and (prefetcher is None or prefetcher.done.is_set()):
            warm.t_submit_ns = clock()
            engine.submit(warmup)
            warm_pending = False
        while submitted < len(followups) and due(submitted):
            spec = followups[submitted]
            results[spec.request_id].t_submit_ns = clock()
            engine.submit(spec)
            submitted += 1
        if not engine.has_unfinished():
            if warm_pending or submitted < len(followups):
                timing.idle_waits += 1
                next_due = t_arrival + int(submitted * spacing_ms * 1e6)
                sleep(max(0.0, min(poll_s, (next_due - clock()) / 1e9)) if submitted < len(followups) else poll_s)
                continue
            raise RuntimeError(f"engine idle with unfinished requests {sorted(unfinished)}")
        outputs = engine.step()
        record_step(results, outputs, clock(), unfinished)
        timing.stamps += 1
        if submitted:
            token_steps += any(o.new_token_ids for o in outputs if o.request_id != (warm and warm.request_id))
    return timing
