"""One trace through one fleet under one policy: dispatch on arrival, collect tokens, record.

The router is a single loop in the notebook's process. It sends each root at its arrival offset
and each child once its parent finished plus the child's gap; it picks the engine with the
policy, reading the engines' KV events into one ``PrefixIndex`` per engine; it collects the
engines' step messages (tokens stamped by the engine process) and appends every finished or
failed request to ``raw/requests.jsonl``, fsynced once per loop pass, so a crash loses at most
the requests that finished in that pass.

A request's clock starts at its arrival (the moment the router would have received it):

    first_token_s = first token stamp - arrival      (includes routing, the pipe and queueing)
    makespan      = last finish stamp - first arrival (the trace as a whole)

An engine process that exits (killed, crashed) fails its in-flight requests (``engine_died``);
the children of a failed parent fail too (``parent_failed``), since their prompts need its
output; the router routes the rest of the trace to the engines still alive.
"""
from __future__ import annotations

import hashlib
import heapq
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from kmesh_lib.sections.multi_engine.policies import ROUTERS, PrefixIndex
from kmesh_lib.sections.multi_engine.workload import Child, Root, child_prompt

POLL_S = 0.2  # longest wait for a message before the router checks deadlines and liveness again


def prompt_sha(token_ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


@dataclass
class Flight:
    """One request from arrival to its last token (or its failure)."""

    request_id: str
    role: str
    family: int | None
    prompt_token_ids: list[int]
    arrival_ns: int | None  # None: a child whose parent failed never arrived
    children: list[Child] = field(default_factory=list)
    engine: int | None = None
    matched_tokens: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    live: list[bool] = field(default_factory=list)  # the engines alive when it was routed
    dispatch_ns: int | None = None
    submit_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_cached_tokens: int | None = None
    lookup: list[int] | None = None  # [vLLM-local cached tokens, tokens the server supplied]
    finish_reason: str | None = None
    status: str = "pending"  # pending | running | ok | failed
    error: str = ""


class Router:
    def __init__(self, engines, policy: str, cfg, meta: dict, skip_prefix_cache: bool, kill=None) -> None:
        self.engines = engines
        self.cfg = cfg
        self.meta = meta  # model, repeat, policy: copied into every record
        self.router = ROUTERS[policy](len(engines))
        self.skip_prefix_cache = skip_prefix_cache
        self.kill = kill  # (engine index, after this many dispatches) or None
        self.killed: dict | None = None
        self.indexes = [PrefixIndex(cfg.BLOCK_SIZE) for _ in engines]
        self.live = [e.alive() for e in engines]
        self.flights: dict[str, Flight] = {}
        self.on_engine: list[set[str]] = [set() for _ in engines]
        self.num_dispatched = 0
        self.done: list[Flight] = []

    # -- the loop --
    def run(self, roots: list[Root], record) -> dict:
        self.t0 = time.monotonic_ns()
        due: list[tuple[int, int, Flight]] = []
        for i, r in enumerate(roots):
            f = Flight(r.request_id, r.role, r.family, list(r.prompt_token_ids), self.t0 + int(r.arrival_s * 1e9),
                       list(r.children))
            heapq.heappush(due, (f.arrival_ns, i, f))
        self.due, self.seq = due, len(roots)
        deadline = self.t0 + int(self.cfg.TRACE_TIMEOUT_S * 1e9)
        while self.due or any(f.status in ("pending", "running") for f in self.flights.values()):
            now = time.monotonic_ns()
            while self.due and self.due[0][0] <= now:
                self.dispatch(heapq.heappop(self.due)[2])
            if (self.kill is not None and self.killed is None and self.num_dispatched >= self.kill[1]
                    and self.on_engine[self.kill[0]]):  # mid-request: the engine has work in flight
                self.inject_kill()
            timeout = POLL_S if not self.due else min(POLL_S, max(0.0, (self.due[0][0] - time.monotonic_ns()) / 1e9))
            conns = {self.engines[i].conn: i for i in range(len(self.engines)) if self.live[i]}
            for conn in wait(list(conns), timeout) if conns else []:
                self.receive(conns[conn])
            if not conns and self.due:
                time.sleep(timeout)
            for i, e in enumerate(self.engines):
                if self.live[i] and not e.alive():
                    self.engine_died(i, f"exit code {e.proc.returncode}")
            if time.monotonic_ns() > deadline:
                self.fail_all_open("timeout")
            self.flush(record)
        self.flush(record)
        return self.summary()

    def dispatch(self, f: Flight) -> None:
        self.flights[f.request_id] = f
        f.matched_tokens = [idx.match_tokens(f.prompt_token_ids) for idx in self.indexes]
        f.in_flight = [len(s) for s in self.on_engine]
        f.live = list(self.live)
        try:
            i = self.router.choose(f.matched_tokens, f.in_flight, self.live)
        except LookupError:
            self.fail(f, "no_live_engine")
            return
        f.engine, f.dispatch_ns, f.status = i, time.monotonic_ns(), "running"
        self.on_engine[i].add(f.request_id)
        self.num_dispatched += 1
        try:
            self.engines[i].submit(f.request_id, f.prompt_token_ids, self.cfg.MAX_TOKENS, self.skip_prefix_cache)
        except OSError:
            self.engine_died(i, "pipe closed on submit")

    def receive(self, i: int) -> None:
        conn = self.engines[i].conn
        try:
            while conn.poll(0):
                self.handle(i, conn.recv())
        except (EOFError, OSError):
            self.engine_died(i, "pipe closed")

    def handle(self, i: int, msg: dict) -> None:
        op = msg["op"]
        if op == "submitted":
            f = self.flights.get(msg["request_id"])
            if f is not None:
                f.submit_ns = msg["t_ns"]
        elif op == "step":
            for event in msg["events"]:
                self.indexes[i].apply(event)
            for out in msg["outputs"]:
                f = self.flights.get(out["request_id"])
                if f is None or f.status != "running":
                    continue
                f.output_token_ids += out["new_token_ids"]
                f.logprobs += out["new_logprobs"]
                f.token_ns += [msg["t_ns"]] * len(out["new_token_ids"])
                if out["num_cached_tokens"] is not None:
                    f.num_cached_tokens = out["num_cached_tokens"]
                if out["finished"]:
                    f.finish_reason, f.lookup = out["finish_reason"], out["lookup"]
                    self.finish(f, "ok")
        elif op == "error":
            self.engine_died(i, "error: " + msg["text"].splitlines()[0])

    def finish(self, f: Flight, status: str, error: str = "") -> None:
        f.status, f.error = status, error
        if f.engine is not None:
            self.on_engine[f.engine].discard(f.request_id)
        self.done.append(f)
        for c in f.children:
            if status == "ok":
                arrival = f.token_ns[-1] + int(c.gap_s * 1e9)
                child = Flight(c.request_id, "child", f.family, child_prompt(f.prompt_token_ids, f.output_token_ids, c),
                               arrival)
                heapq.heappush(self.due, (arrival, self.seq, child))
                self.seq += 1
            else:
                child = Flight(c.request_id, "child", f.family, [], None)
                self.flights[c.request_id] = child
                self.finish(child, "failed", "parent_failed")

    def fail(self, f: Flight, error: str) -> None:
        self.flights[f.request_id] = f
        self.finish(f, "failed", error)

    def engine_died(self, i: int, why: str) -> None:
        if not self.live[i]:
            return
        self.live[i] = False
        self.engines[i].dead_reason = why
        for rid in sorted(self.on_engine[i]):
            self.finish(self.flights[rid], "failed", "engine_died")

    def fail_all_open(self, error: str) -> None:
        while self.due:
            self.fail(heapq.heappop(self.due)[2], error)
        for f in list(self.flights.values()):
            if f.status in ("pending", "running"):
                self.finish(f, "failed", error)

    def inject_kill(self) -> None:
        i = self.kill[0]
        t = time.monotonic_ns()
        self.engines[i].kill()
        self.engines[i].proc.wait()  # the router killed it, so it knows: nothing is routed there after this
        conn = self.engines[i].conn
        try:  # what the engine sent before it died still counts
            while conn.poll(0):
                self.handle(i, conn.recv())
        except (EOFError, OSError):
            pass
        self.killed = {"engine": i, "after_dispatched": self.num_dispatched, "at_s": (t - self.t0) / 1e9,
                       "in_flight": sorted(self.on_engine[i])}
        self.engine_died(i, "killed by the fault test")

    # -- records --
    def rel(self, ns: int | None) -> float | None:
        return None if ns is None else (ns - self.t0) / 1e9

    def row(self, f: Flight) -> dict:
        local, external = f.lookup if f.lookup is not None else (None, None)
        return {**self.meta, "request_id": f.request_id, "role": f.role, "family": f.family, "status": f.status,
                "error": f.error, "engine": f.engine, "num_prompt_tokens": len(f.prompt_token_ids),
                "prompt_sha": prompt_sha(f.prompt_token_ids) if f.prompt_token_ids else None,
                "skip_prefix_cache": self.skip_prefix_cache, "matched_tokens": f.matched_tokens, "in_flight": f.in_flight,
                "live": f.live,
                "arrival_s": self.rel(f.arrival_ns), "dispatch_s": self.rel(f.dispatch_ns), "submit_s": self.rel(f.submit_ns),
                "first_token_s": self.rel(f.token_ns[0]) if f.token_ns else None,
                "finish_s": self.rel(f.token_ns[-1]) if f.token_ns else None,
                "num_output_tokens": len(f.output_token_ids), "output_token_ids": f.output_token_ids,
                "logprobs": f.logprobs, "finish_reason": f.finish_reason, "num_cached_tokens": f.num_cached_tokens,
                "num_local_cached_tokens": local, "num_external_tokens": external}

    def flush(self, record) -> None:
        if self.done:
            record.append_jsonl("requests.jsonl", [self.row(f) for f in self.done])
            self.done = []

    def summary(self) -> dict:
        flights = list(self.flights.values())
        ok = [f for f in flights if f.status == "ok"]
        return {**self.meta, "num_requests": len(flights), "num_ok": len(ok), "num_failed": len(flights) - len(ok),
                "makespan_s": (max(f.token_ns[-1] for f in ok) - min(f.arrival_ns for f in flights if f.arrival_ns)) / 1e9
                if ok else None,
                "engines_alive": [e.alive() for e in self.engines], "dead_reasons": [e.dead_reason for e in self.engines],
                "index_blocks": [len(x) for x in self.indexes], "killed": self.killed}
