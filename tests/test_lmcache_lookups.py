"""The lookup trace: assembling the server's lines and naming each lookup's mechanism (no server needed)."""
from __future__ import annotations

import pytest

from kmesh_lib.lmcache.lookups import MECHANISMS, READS, assemble, classify, label_roles, phase_lookups, summarize

MS = 1_000_000
CTX = [11, 12, 13, 14]  # the four chunk-key ids of the shared context


def lookup(ext, pid, t_ms, keys=CTX, l1=None):
    return {"op": "lookup", "t_ns": int(t_ms * MS), "ext": ext, "pid": pid, "n_keys": len(keys), "k": keys,
            "mode": "LOCK", "l1_keys": l1}


def start(pid, t_ms, l1=0, keys=CTX, waited_ms=0.0, parked=False):
    return {"op": "start", "pid": pid, "t_ns": int(t_ms * MS), "waited_ns": int(waited_ms * MS), "parked": parked,
            "n_keys": len(keys), "k": keys, "l1_keys": l1}


def load(pid, t_ms, n=4, nbytes=4 * 3 * (1 << 20)):
    return {"op": "load", "pid": pid, "t_ns": int(t_ms * MS), "n_keys": n, "bytes": nbytes if n else 0}


def done(pid, t_ms, finish_ms=None):
    ev = {"op": "done", "pid": pid, "t_ns": int(t_ms * MS)}
    if finish_ms is not None:
        ev["t_finish_ns"] = int(finish_ms * MS)
    return ev


def mechanisms(events):
    return [lk.mechanism for lk in classify(assemble(events))]


def test_lmcache_053_together_one_load_and_contended_lookups():
    """0.5.3, discard, together (the H200 probe): B and C arrive during A's load, lose the L1 reservation, read nothing."""
    events = [lookup("g-A", 1, 4.7), start(1, 6.1), lookup("g-B", 2, 9.5), start(2, 10.5),
              load(1, 16.1), lookup("g-C", 3, 12.6), start(3, 13.2), load(2, 20.0, n=0), done(2, 24.3),
              load(3, 21.0, n=0), done(3, 26.6), done(1, 54.4)]
    assert mechanisms(events) == ["first_load", "contended_in_flight", "contended_in_flight"]
    assert summarize(classify(assemble(events)))["contended_keys"] == 8  # = LMCache's l1_contended chunks


def test_lmcache_056_together_every_lookup_loads_its_own_copy():
    events = [lookup("g-A", 1, 1.0), start(1, 1.1), lookup("g-B", 2, 1.5), start(2, 1.6), load(1, 2.0), load(2, 2.1),
              done(1, 30.0), done(2, 31.0)]
    assert mechanisms(events) == ["first_load", "concurrent_load"]


def test_a_lookup_after_the_copy_was_released_rereads_and_one_during_a_reread_is_contended():
    """1step, discard: B after A's load finished rereads; C during B's reread is contended; D after it rereads."""
    events = [lookup("g-A", 1, 2.7), start(1, 3.5), load(1, 8.9), done(1, 43.6),
              lookup("g-B", 2, 62.8), start(2, 63.4), load(2, 68.0),
              lookup("g-C", 3, 80.6), start(3, 81.2), load(3, 83.0, n=0), done(3, 85.5), done(2, 107.0),
              lookup("g-D", 4, 126.0), start(4, 126.4), load(4, 131.3), done(4, 168.1)]
    assert mechanisms(events) == ["first_load", "reread_after_load", "contended_in_flight", "reread_after_load"]


def test_singleflight_parked_lookups_wait_for_the_load_then_find_l1():
    events = [lookup("g-A", 1, 6.9), start(1, 7.4), load(1, 10.0),
              lookup("g-B", 2, 8.9), {"op": "park", "pid": 2, "t_ns": int(9.0 * MS), "behind": [1]},
              done(1, 56.7), start(2, 56.8, l1=4, waited_ms=47.8, parked=True), load(2, 57.0, n=0), done(2, 62.1)]
    lks = classify(assemble(events))
    assert [lk.mechanism for lk in lks] == ["first_load", "waited_for_in_flight"]
    assert lks[1].parked and lks[1].waited_ns == int(47.8 * MS) and lks[1].l1_keys == 4


def test_a_lookup_that_arrived_in_flight_finds_l1_when_its_lock_pass_follows_the_finish():
    """Stock 0.5.6 (CI at 4bae8d6, D): B arrived during A's load (A's done is later) but its lock pass came after A's
    finish began, so it found every chunk in L1. The done line carries the finish's start; older traces lack it."""
    events = [lookup("g-A", 1, 1.0), start(1, 1.1), load(1, 2.0), lookup("g-B", 2, 20.0),
              start(2, 29.5, l1=4), done(1, 30.0, finish_ms=29.0), load(2, 29.6, n=0), done(2, 29.7)]
    a, b = classify(assemble(events))
    assert [a.mechanism, b.mechanism] == ["first_load", "l1_resident"]
    assert a.end_ns() > b.t_arrival_ns and a.landed_ns() == int(29.0 * MS) <= b.t_start_ns
    assert a.to_dict(t0_ns=0)["t_finish_ms"] == 29.0
    older = assemble([lookup("g-A", 1, 1.0), start(1, 1.1), load(1, 2.0), done(1, 30.0)])[0]
    assert older.t_finish_ns is None and older.landed_ns() == older.end_ns() == int(30.0 * MS)


def test_retained_copy_is_l1_resident_and_missing_chunks_are_not_found():
    # 0.5.3 serves an all-L1 lookup in the storage manager: no controller request (pid -1)
    assert mechanisms([lookup("g-A", -1, 1.0, l1=4)]) == ["l1_resident"]
    assert mechanisms([lookup("g-A", 5, 1.0), start(5, 1.1, l1=4), load(5, 1.2, n=0), done(5, 1.3)]) == ["l1_resident"]
    assert mechanisms([lookup("g-A", 6, 1.0), start(6, 1.1, l1=0), load(6, 1.2, n=0), done(6, 1.3)]) == ["not_found"]
    # a controller request whose start line is missing cannot be placed: unknown, never guessed
    assert mechanisms([lookup("g-A", 7, 1.0)]) == ["unknown"]


def test_other_keys_do_not_count_as_in_flight():
    events = [lookup("x-A", 1, 1.0, keys=[1, 2]), start(1, 1.1), load(1, 1.5), lookup("y-A", 2, 2.0, keys=[8, 9]),
              start(2, 2.1), load(2, 2.5), done(1, 30.0), done(2, 31.0)]
    assert mechanisms(events) == ["first_load", "first_load"]


def test_controller_lines_before_the_lookup_line_are_merged():
    """The storage manager logs after ``submit_prefetch_task`` returns, the controller thread can log first."""
    events = [start(3, 1.2), load(3, 2.0), lookup("g-A", 3, 1.0), done(3, 9.0)]
    lks = assemble(events)
    assert len(lks) == 1 and lks[0].ext == "g-A" and lks[0].load_keys == 4 and lks[0].t_done_ns == 9 * MS
    assert classify(lks)[0].mechanism == "first_load"


def test_roles_take_the_longest_request_id_prefix_and_summaries_count_reads():
    events = [lookup("g-A-1a2b", 1, 1.0), start(1, 1.1), load(1, 1.5), done(1, 9.0),
              lookup("g-A1-9f", 2, 10.0), start(2, 10.1), load(2, 10.5), done(2, 20.0),
              lookup("", 3, 30.0), start(3, 30.1, l1=4), load(3, 30.2, n=0), done(3, 30.3)]
    lks = phase_lookups(events, {"g-A": "A", "g-A1": "A1"})
    assert [lk.role for lk in lks] == ["A", "A1", "http_prefetch"]
    s = summarize(lks)
    assert s["lookups"] == 3 and s["disk_reads"] == 2 and s["load_bytes"] == 2 * 12 * (1 << 20)
    assert s["by_mechanism"] == {"first_load": 1, "reread_after_load": 1, "l1_resident": 1}
    d = lks[1].to_dict(t0_ns=1 * MS)
    assert d["t_arrival_ms"] == 9.0 and "keys" not in d and d["mechanism"] == "reread_after_load"
    assert label_roles(lks, {})[0].role == "other"


@pytest.mark.parametrize("m", MECHANISMS)
def test_every_mechanism_is_documented_in_the_module_table(m):
    import kmesh_lib.lmcache.lookups as mod

    assert m in mod.__doc__ and (m in READS) == (m in ("first_load", "reread_after_load", "reread_after_store_drop",
                                                     "concurrent_load"))


def store_delete(t_ms, keys=CTX, locked=()):
    """The store controller's skip_l1 deletion (``server_plugin.StoreTrace``)."""
    return {"op": "l1_delete", "by": "store", "t_ns": int(t_ms * MS), "n_keys": len(keys), "k": list(keys),
            "locked": list(locked)}


def warm_prefetch_then_warmup(deletes):
    """0.5.3, the early arm (H200 run): the HTTP (WARM) prefetch loads the context, its finish hands the keys
    to the store controller (0.5.3), which re-stores them (0 bytes: the files exist) and may drop them from
    L1; the warm-up's lookup arrives 5 ms after the prefetch was done."""
    return [lookup("", 11, -98.3), start(11, -97.9), load(11, -94.1), done(11, -61.2),
            {"op": "warm_handoff", "t_ns": int(-61.3 * MS), "n_keys": 4, "k": CTX},
            {"op": "store_submit", "t_ns": int(-61.0 * MS), "task": 7, "n_keys": 4, "k": CTX, "warm_keys": 4},
            {"op": "store_done", "t_ns": int(-58.9 * MS), "task": 7, "ok": True, "bytes": 0, "n_keys": 4, "k": CTX},
            *deletes, lookup("g-warmup", 12, -56.4), start(12, -56.0), load(12, -52.6), done(12, -20.3)]


def test_a_store_drop_between_the_warm_load_and_the_lookup_names_the_reread():
    lks = phase_lookups(warm_prefetch_then_warmup([store_delete(-58.8)]), {"g-warmup": "warmup"})
    assert [(lk.role, lk.mechanism) for lk in lks] == [("http_prefetch", "first_load"),
                                                       ("warmup", "reread_after_store_drop")]
    assert lks[1].store_dropped == 4 and lks[1].to_dict()["store_dropped"] == 4
    assert summarize(lks)["disk_reads"] == 2 and summarize(lks)["by_mechanism"]["reread_after_store_drop"] == 1


def test_a_store_drop_logged_before_the_warm_loads_done_line_still_counts():
    """The done line is written after the finish returns; the store thread may delete first."""
    lks = phase_lookups(warm_prefetch_then_warmup([store_delete(-61.25)]), {"g-warmup": "warmup"})
    assert lks[1].mechanism == "reread_after_store_drop"


def test_without_a_store_drop_in_the_window_a_reread_stays_reread_after_load():
    roles = {"g-warmup": "warmup"}
    # no deletion in the trace at all (the old trace, or the guard on: nothing was re-stored)
    assert [lk.mechanism for lk in phase_lookups(warm_prefetch_then_warmup([]), roles)] == \
        ["first_load", "reread_after_load"]
    # a deletion before the earlier load was submitted, or after this lookup's own load, is not this reread's cause
    for t in (-95.0, -50.0):
        assert phase_lookups(warm_prefetch_then_warmup([store_delete(t)]), roles)[1].mechanism == "reread_after_load"
    # a deletion of other chunks, or one that skipped them all (read-locked: nothing deleted), neither
    assert phase_lookups(warm_prefetch_then_warmup([store_delete(-58.8, keys=[99])]), roles)[1].mechanism == \
        "reread_after_load"
    # only a drop by the store controller counts, and classify alone (no drops given) never guesses it
    other = dict(store_delete(-58.8), by="other")
    assert phase_lookups(warm_prefetch_then_warmup([other]), roles)[1].mechanism == "reread_after_load"
    assert classify(assemble(warm_prefetch_then_warmup([store_delete(-58.8)])))[1].mechanism == "reread_after_load"


def test_a_lookup_that_locked_the_warm_copy_first_is_l1_resident_even_if_the_store_ran():
    """The warm-up locked the chunks before the store's deletion (which skipped them): no read."""
    events = [lookup("", 11, -98.3), start(11, -97.9), load(11, -94.1), done(11, -61.2),
              lookup("g-warmup", -1, -60.0, l1=4), store_delete(-58.8, keys=[], locked=CTX)]
    lks = phase_lookups(events, {"g-warmup": "warmup"})
    assert [lk.mechanism for lk in lks] == ["first_load", "l1_resident"]


def test_store_events_count_chunks_per_op_and_only_the_store_controllers_deletions():
    from kmesh_lib.lmcache.lookups import STORE_OPS, store_events

    events = [{"op": "warm_handoff", "n_keys": 16, "k": list(range(16))},
              {"op": "store_submit", "t_ns": 5, "n_keys": 16, "k": list(range(16))},
              {"op": "store_done", "t_ns": 6, "n_keys": 16},
              {"op": "l1_delete", "by": "store", "n_keys": 12, "k": list(range(12))},
              {"op": "l1_delete", "by": "clear", "n_keys": 4, "k": [12, 13, 14, 15]},  # not the store controller's
              {"op": "warm_store_skipped", "k": [1, 2, 3]},  # no n_keys: counted from its keys
              {"op": "lookup", "t_ns": 7, "ext": "g-A", "pid": 3, "n_keys": 16}]
    assert store_events(events) == {"store_submit": 16, "store_done": 16, "l1_delete": 12, "warm_handoff": 16,
                                    "warm_store_skipped": 3}
    assert store_events([]) == dict.fromkeys(STORE_OPS, 0)
