"""What each lookup did at the lmcache server, from the launcher's lookup trace (``server_plugin``).

A lookup of the MP connector is an L2 -> L1 prefetch. Whether it reads the disk tier depends on
when it reaches the server's prefetch controller relative to other loads of the same chunks. The
controller (``v1/distributed/storage_controllers/prefetch_controller.py``, 0.5.3 and 0.5.6)
first read-locks the chunks L1 holds (its *lock pass*), asks the L2 adapters, then reserves L1
write buffers for the rest and loads them:

    mechanism                read?  when it arrived                     what happened in LMCache
    first_load               yes    no earlier load of these chunks     nothing in L1; loads from disk
    reread_after_load        yes    after an earlier load had finished  that copy was temporary (``default``
                                                                        retention) and its reader had released
                                                                        it: L1 no longer held it
    reread_after_store_drop  yes    after a warm prefetch finished      0.5.3 handed the warm load's keys to the
                                                                        store controller as new writes
                                                                        (``finish_write``); it stored them to
                                                                        L2 again (the ``fs`` adapter found the
                                                                        files: nothing written) and, under
                                                                        ``skip_l1``, deleted them from L1 before
                                                                        this lookup locked them
    concurrent_load          yes    while another load was in flight    0.5.6: write reservations are tagged
                                                                        per request, so it stages and loads its
                                                                        own copy
    contended_in_flight      no     while another load was in flight    0.5.3: ``reserve_write(mode="new")``
                                                                        finds the key reserved; 0.5.6: the other
                                                                        load landed in L1 between this lookup's
                                                                        lock pass and its reservation (both
                                                                        ``KEY_NOT_WRITABLE``, metric reason
                                                                        ``l1_contended``); it falls back to its
                                                                        L1-only hit and loads nothing
    waited_for_in_flight     no     while another load was in flight    kmesh singleflight: parked until that
                                                                        load finished, then its lock pass found
                                                                        the chunks in L1
    l1_resident              no     any time the chunks were in L1      its lock pass found them: retained, or
                                                                        a temporary copy still read-locked by
                                                                        another reader
    not_found                no     -                                   neither L1 nor the disk tier had them

"In flight" is judged on server-side stamps (``time.monotonic_ns``): an earlier lookup of
overlapping chunks that loaded, from its arrival at the storage manager to its ``done``. Its chunks
land in L1 inside LMCache's finish, which the ``done`` line brackets (``t_finish_ns`` to ``t_ns``), and a
lookup's lock pass follows its arrival: one that arrived in flight may still find them all in L1
(``l1_resident``) when its lock pass came after that finish began (``Lookup.landed_ns``).
``reread_after_store_drop`` is assigned only from the store trace (``server_plugin.StoreTrace``):
an ``l1_delete`` by the store controller of this lookup's chunks after the latest earlier load of
them was submitted (its chunks are write-locked until it finishes, so a deletion can only follow
that finish; ``_dropped_before``) and before this lookup's own load (which follows its lock pass; a chunk the lock
pass had read-locked cannot be deleted). Without such a line a reread is ``reread_after_load``.

Invariant: ``classify`` assigns exactly one mechanism per lookup and reads only the trace; a
lookup the trace cannot place (a missing ``start`` line) is ``unknown``, never guessed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

MECHANISMS = ("first_load", "reread_after_load", "reread_after_store_drop", "concurrent_load", "contended_in_flight",
              "waited_for_in_flight", "l1_resident", "not_found", "unknown")
READS = ("first_load", "reread_after_load", "reread_after_store_drop", "concurrent_load")
STORE_OPS = ("store_submit", "store_done", "l1_delete", "warm_handoff", "warm_store_skipped")  # not per lookup


@dataclass
class Lookup:
    """One lookup as the server saw it. Times are ``time.monotonic_ns()`` stamps taken in the server."""

    ext: str  # the engine's request id (LMCacheMPConnector sends vLLM's request id)
    pid: int  # the prefetch controller's request id; -1 when L1 served it all before the controller
    t_arrival_ns: int
    n_keys: int
    keys: frozenset = field(default_factory=frozenset)
    mode: str = ""
    sm_l1_keys: int | None = None  # 0.5.3: keys the storage manager found in L1 before the controller
    t_start_ns: int | None = None  # the controller's lock pass (after any singleflight wait)
    parked: bool = False  # the singleflight held it back behind an overlapping request
    waited_ns: int = 0
    ctrl_l1_keys: int | None = None  # keys the controller's lock pass found in L1
    t_load_ns: int | None = None
    load_keys: int = 0
    load_bytes: int = 0
    t_finish_ns: int | None = None  # LMCache's finish began (its chunks land in L1 from here); None in older traces
    t_done_ns: int | None = None  # that finish returned
    role: str = ""
    mechanism: str = "unknown"
    store_dropped: int = 0  # reread_after_store_drop: its chunks the store controller deleted from L1 first

    @property
    def l1_keys(self) -> int | None:
        parts = [x for x in (self.sm_l1_keys, self.ctrl_l1_keys) if x is not None]
        return sum(parts) if parts else None

    @property
    def loaded(self) -> bool:
        return self.load_keys > 0

    def end_ns(self) -> float:
        return self.t_done_ns if self.t_done_ns is not None else float("inf")

    def landed_ns(self) -> float:
        """The earliest stamp at which its loaded chunks can be in L1: its finish began (``end_ns`` in older traces)."""
        return self.t_finish_ns if self.t_finish_ns is not None else self.end_ns()

    def to_dict(self, t0_ns: int | None = None) -> dict:
        d = asdict(self)
        d.pop("keys")
        d["l1_keys"] = self.l1_keys
        if t0_ns is not None:  # times relative to the caller's origin (e.g. the group's first submission)
            for k in ("t_arrival_ns", "t_start_ns", "t_load_ns", "t_finish_ns", "t_done_ns"):
                d[k.replace("_ns", "_ms")] = None if d[k] is None else round((d.pop(k) - t0_ns) / 1e6, 3)
        return d


def assemble(events: list[dict]) -> list[Lookup]:
    """Lookups from trace events (``lookup`` lines joined to the controller's lines by ``pid``).

    A controller request with no ``lookup`` line (a prefetch that did not come through the storage
    manager's ``submit_prefetch_task``) is kept, with an empty ``ext``.
    """
    by_pid: dict[int, Lookup] = {}
    out: list[Lookup] = []
    for ev in events:
        op = ev["op"]
        if op == "lookup":
            lk = Lookup(ev["ext"], ev["pid"], ev["t_ns"], ev["n_keys"], frozenset(ev.get("k", ())), ev.get("mode", ""),
                        sm_l1_keys=ev.get("l1_keys"))
            out.append(lk)
            if lk.pid >= 0:
                prior = by_pid.get(lk.pid)
                if prior is not None and not prior.ext and prior.t_arrival_ns >= lk.t_arrival_ns:
                    out.remove(prior)  # the controller logged first; merge its lines into this lookup
                    lk.t_start_ns, lk.waited_ns, lk.ctrl_l1_keys = prior.t_start_ns, prior.waited_ns, prior.ctrl_l1_keys
                    lk.parked = prior.parked
                    lk.t_load_ns, lk.load_keys, lk.load_bytes = prior.t_load_ns, prior.load_keys, prior.load_bytes
                    lk.t_finish_ns, lk.t_done_ns = prior.t_finish_ns, prior.t_done_ns
                by_pid[lk.pid] = lk
            continue
        if op in ("release", "store_reserve") or op in STORE_OPS:  # not a lookup's step
            continue
        lk = by_pid.get(ev.get("pid"))
        if lk is None and op in ("park", "start"):
            lk = Lookup("", ev["pid"], ev["t_ns"], ev.get("n_keys", 0), frozenset(ev.get("k", ())))
            by_pid[lk.pid] = lk
            out.append(lk)
        if lk is None:
            continue
        if op == "park":
            lk.parked = True
        elif op == "start":
            lk.t_start_ns, lk.waited_ns, lk.ctrl_l1_keys = ev["t_ns"], ev.get("waited_ns", 0), ev.get("l1_keys")
            lk.parked = lk.parked or bool(ev.get("parked"))
            lk.keys = lk.keys or frozenset(ev.get("k", ()))
        elif op == "load":
            lk.t_load_ns, lk.load_keys, lk.load_bytes = ev["t_ns"], ev["n_keys"], ev.get("bytes", 0)
        elif op == "done":
            lk.t_finish_ns, lk.t_done_ns = ev.get("t_finish_ns"), ev["t_ns"]
    return sorted(out, key=lambda x: x.t_arrival_ns)


def store_drops(events: list[dict]) -> list[tuple[int, frozenset]]:
    """(stamp, keys) of every L1 deletion the store controller made (``l1_delete`` by ``store``)."""
    return [(ev["t_ns"], frozenset(ev.get("k", ()))) for ev in events
            if ev.get("op") == "l1_delete" and ev.get("by") == "store" and ev.get("k")]


def _dropped_before(lk: Lookup, finished: list[Lookup], drops) -> frozenset:
    """This lookup's chunks the store controller deleted after the latest earlier load of them and
    before this lookup's own load (its arrival where no load line was logged).

    The window opens at that load's submission, not its ``done`` line: the chunks it loads are
    write-locked until it finishes (``L1Manager.delete`` skips them), so a deletion stamped in
    between can only follow its finish, and the ``done`` line is written after the finish returns,
    when the store controller's thread may already have deleted them.
    """
    if not finished or not drops:
        return frozenset()
    last = max(finished, key=Lookup.end_ns)
    since = last.t_load_ns if last.t_load_ns is not None else last.t_arrival_ns
    until = lk.t_load_ns if lk.t_load_ns is not None else lk.t_arrival_ns
    out: frozenset = frozenset()
    for t, keys in drops:
        if since <= t <= until:
            out |= keys & lk.keys & last.keys
    return out


def classify(lookups: list[Lookup], drops: list[tuple[int, frozenset]] = ()) -> list[Lookup]:
    """Sets ``mechanism`` on every lookup (see the module table); returns them in arrival order.

    ``drops``: the store controller's L1 deletions (``store_drops``); without them no reread is
    ``reread_after_store_drop``.
    """
    ordered = sorted(lookups, key=lambda x: x.t_arrival_ns)
    for i, lk in enumerate(ordered):
        earlier = [o for o in ordered[:i] if o.loaded and o.keys & lk.keys]
        in_flight = [o for o in earlier if o.end_ns() > lk.t_arrival_ns]
        finished = [o for o in earlier if o.end_ns() <= lk.t_arrival_ns]
        # a load by a later arrival that overlapped this lookup (0.5.3: it won the L1 reservation)
        overlapping = in_flight or [o for o in ordered[i + 1:] if o.loaded and o.keys & lk.keys
                                    and o.t_arrival_ns < lk.end_ns()]
        if lk.pid >= 0 and lk.t_start_ns is None:
            lk.mechanism = "unknown"
        elif lk.loaded and in_flight:
            lk.mechanism = "concurrent_load"
        elif lk.loaded and finished:
            dropped = _dropped_before(lk, finished, drops)
            lk.store_dropped = len(dropped)
            lk.mechanism = "reread_after_store_drop" if dropped else "reread_after_load"
        elif lk.loaded:
            lk.mechanism = "first_load"
        elif lk.parked and in_flight:
            lk.mechanism = "waited_for_in_flight"
        elif lk.l1_keys is not None and lk.l1_keys >= lk.n_keys > 0:
            lk.mechanism = "l1_resident"
        elif overlapping:
            lk.mechanism = "contended_in_flight"
        elif lk.l1_keys:
            lk.mechanism = "l1_resident"
        else:
            lk.mechanism = "not_found"
    return ordered


def label_roles(lookups: list[Lookup], roles: dict[str, str]) -> list[Lookup]:
    """Sets ``role`` from the engine request ids: the longest ``roles`` key that ``ext`` starts with.

    (vLLM may append a suffix to a request id; "g-A" must not claim "g-A1", hence the longest.)
    """
    for lk in lookups:
        hits = [rid for rid in roles if lk.ext.startswith(rid)]
        lk.role = roles[max(hits, key=len)] if hits else ("http_prefetch" if not lk.ext else "other")
    return lookups


def summarize(lookups: list[Lookup]) -> dict:
    """Counts per mechanism, how many lookups read the disk tier, the bytes their loads reserved, and
    ``contended_keys``: the keys of ``contended_in_flight`` lookups that L1 did not hold, which must
    equal LMCache's own ``l2_prefetch_failure{reason="l1_contended"}`` chunks for the phase (an
    independent check of the classification; ``PhaseReads.contended_chunks``)."""
    by = {m: 0 for m in MECHANISMS}
    for lk in lookups:
        by[lk.mechanism] += 1
    return {"lookups": len(lookups), "disk_reads": sum(lk.mechanism in READS for lk in lookups),
            "load_bytes": sum(lk.load_bytes for lk in lookups if lk.loaded),
            "contended_keys": sum(lk.n_keys - (lk.l1_keys or 0) for lk in lookups if lk.mechanism == "contended_in_flight"),
            "by_mechanism": {m: n for m, n in by.items() if n}}


def store_events(events: list[dict]) -> dict[str, int]:
    """Chunks per store-side event of one phase: the store controller's submits and finished stores,
    its L1 deletions (by ``store``), and a warm prefetch's keys handed to it (``warm_handoff``) or kept
    from it by the warm-store guard (``warm_store_skipped``). Each op is counted, 0 where none came."""
    out = dict.fromkeys(STORE_OPS, 0)
    for ev in events:
        op = ev.get("op")
        if op in out and (op != "l1_delete" or ev.get("by") == "store"):
            out[op] += ev.get("n_keys", len(ev.get("k", ())))
    return out


def store_reservations(events: list[dict]) -> dict:
    """The store path's L1 reservations of one phase (``server_plugin.StoreReserveTrace``): calls, keys asked, keys
    reserved, the keys left out by L1 error (``OUT_OF_MEMORY``, ``KEY_NOT_WRITABLE``), and the most of the arena in
    use just before one (None where no call said). A store that reserved nothing wrote nothing, whatever the engine
    was told."""
    calls = [ev for ev in events if ev.get("op") == "store_reserve"]
    errors: dict[str, int] = {}
    for ev in calls:
        for name, n in ev.get("errors", {}).items():
            errors[name] = errors.get(name, 0) + n
    used = [ev["l1_used"] for ev in calls if ev.get("l1_used") is not None]
    return {"calls": len(calls), "keys": sum(ev["n_keys"] for ev in calls),
            "reserved": sum(ev["reserved"] for ev in calls), "errors": errors,
            "l1_used_max": max(used) if used else None,
            "l1_total": next((ev["l1_total"] for ev in calls if ev.get("l1_total") is not None), None)}


def phase_lookups(events: list[dict], roles: dict[str, str]) -> list[Lookup]:
    """assemble -> classify (with the phase's store drops) -> label_roles, for one phase's trace events."""
    return label_roles(classify(assemble(events), store_drops(events)), roles)
