"""Probes on a live engine with an LMCache connector: an off switch, and the components of a restore.

``ExternalSwitch`` turns the external cache off for the requests that follow, at the connector
boundary, so the control arms run on the same engine as the restores:

    off  the scheduler-side lookup answers "0 tokens" without asking LMCache
         (MP: no lookup, and the connector's own BYPASS_LMCACHE state where it has one (0.5.6; 0.5.3 leaves the
         tracker PREFETCHING with 0 hit tokens); in-process: no load spec is recorded)
         and the connector stores nothing: MP marks the prompt's whole chunks as already stored in
         the request's tracker (true here: LMCache holds the context; it is what a hit does too);
         in-process sets ``force_skip_save``. A control arm pays no store of a context LMCache holds
    on   the wrapped method is called unchanged

``ComponentProbe`` stamps (``time.perf_counter_ns``) what one measured follow-up spends where:

    lookup_s        scheduler-side ``get_num_new_matched_tokens``, summed over its calls
    lookup_wall_s   first lookup call to the call that answered (MP: the lookup is an L2->L1 prefetch,
                    so this includes the disk read and the staging into the L1 arena)
    disk_read_s     in-process only: first ``LocalDiskBackend.read_file`` start to last end
    load_s          worker-side ``start_load_kv`` (in-process: the whole retrieve -- disk read, host
                    staging, copy into the engine's KV; MP engine-driven (CPU): the L1 -> engine copy; MP
                    LMCache-driven (CUDA, ``--supported-transfer-mode auto``): only the retrieve's submission,
                    the server copies over CUDA IPC on its own stream after it returns)
    load_wall_s     the first ``start_load_kv`` after a lookup answered tokens to load, to the end of the last
                    worker-side ``get_finished`` that reported a retrieve finished: an asynchronous load's span
                    (MP: submission, the server's copy, and the engine's poll that saw it); None where no
                    retrieve was reported finished (in-process loads are synchronous). LMCache 0.5.3 and 0.5.6
                    alike: vLLM calls ``get_finished`` (0.32 through ``get_transfer_results``) every step
    load_gpu_s      CUDA only: the same calls timed by CUDA events recorded on the current stream just before
                    and just after each (their elapsed times summed): what the GPU's clock says the load took, from
                    the moment the stream reached its start to the moment it reached its end; None on CPU
    load_bytes      in-process only: the bytes of the memory objects LMCache's engine handed its GPU connector's copy
                    into vLLM's blocks (``batched_to_gpu``; ``to_gpu`` where a connector has no batched one), each object's
                    ``get_size()`` (its tensor's nbytes): what the retrieve copied host -> device less any tokens it
                    skipped (load_skipped_tokens), 0 where it called no copy. None where no copy is hooked
                    (``copy_hook`` says why: the MP path, whose server copies; the GPU buffer and vLLM's CPU tier,
                    other tiers; a layerwise retrieve) or a call's objects had no size
    load_chunks     the memory objects of those calls (LMCache's chunks); None as load_bytes
    load_tokens     the tokens of those calls (their ``end - start`` summed); None as load_bytes
    load_skipped_tokens  of those, the tokens vLLM already held, which the CUDA connectors' ``to_gpu`` does not write
                    (``vllm_cached_tokens`` passed with the call, less each chunk's start, within the chunk); 0 in a
                    restore into an emptied prefix cache; None as load_bytes
    load_device     where the first memory object of each of those calls lived: its tensor's device type ("cpu": host
                    memory, each byte crossed the link; "cuda": already on the device), "mixed" where calls differ; None
                    where no call ran or one's object could not be read (or as load_bytes)
    load_pinned     those objects' host memory was pinned (``is_pinned()``: the copy is a DMA at the link's rate, not a
                    staged pageable one); None where one was not in host memory or could not be read (or as load_device)
    to_gpu_s        the host's time inside those calls, summed (the 0.5.x CUDA connectors synchronize their load stream
                    before returning, so it holds the copy's whole span on the device); None as load_bytes
    to_gpu_in_load  every such call ran inside a ``start_load_kv`` (its stamps within one's); None where none ran or
                    none is hooked
    save_s          worker-side ``wait_for_save``
    forward_s       model executor (``execute_model`` + ``sample_tokens``) less load_s and save_s,
                    which run inside it
    other_s         first token less lookup_s and the executor's time (scheduling, output handling)

Invariant: every number is a difference of two real stamps, or a count of what a hooked call was handed, or None
where nothing was stamped or hooked.

``KvDigest`` digests the KV vLLM holds in a finished request's first blocks (the block ids its scheduler hands the
connector's ``request_finished``, the model runner's KV tensors), after the request and outside every stopwatch: a
restore's blocks against the blocks the context was computed into, byte for byte.
"""
from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

from kmesh_lib.engine.vllm_engine import worker_connector

_ns = time.perf_counter_ns

# The GPU connector's methods that copy a retrieve's memory objects into vLLM's blocks, the one LMCacheEngine.retrieve
# calls first: 0.5.3 and 0.5.6 call batched_to_gpu(memory_objs, starts, ends) (their CUDA connectors' loop to_gpu
# over the objects inside it, so only one of the two is wrapped: never a copy counted twice)
COPY_METHODS = ("batched_to_gpu", "to_gpu")


def _find(obj, attr: str, depth: int = 3):
    """The first object reachable from ``obj`` through connector attributes that has ``attr``."""
    seen, frontier = set(), [obj]
    for _ in range(depth + 1):
        nxt = []
        for o in frontier:
            if o is None or id(o) in seen:
                continue
            seen.add(id(o))
            if attr in getattr(type(o), "__dict__", {}) or attr in getattr(o, "__dict__", {}) or hasattr(type(o), attr):
                return o
            if hasattr(o, "__dict__"):
                nxt += [v for k, v in vars(o).items()
                        if k.startswith("_lmcache") or k in ("connector", "_connector", "impl", "_impl")]
        frontier = nxt
    return None


def copied(name: str, args: tuple, kwargs: dict) -> tuple[int, int, int, int] | None:
    """(bytes, memory objects, tokens, tokens vLLM held) a copy call of ``COPY_METHODS`` was handed:
    ``batched_to_gpu(memory_objs, starts, ends)`` or ``to_gpu(memory_obj, start, end)``; each object's bytes its
    ``get_size()`` (the bytes its tensor views), else its tensor's nbytes; the tokens vLLM held as the CUDA
    connectors' ``to_gpu`` skips them (``min(end - start, max(0, vllm_cached_tokens - start))`` a chunk). None where
    the call was not handed memory objects with a size (a layerwise connector's ``batched_to_gpu(starts, ends)``), or
    where counting them raised anything (an object another LMCache version frees or shapes otherwise)."""
    names = ("memory_objs", "starts", "ends") if name == "batched_to_gpu" else ("memory_obj", "start", "end")
    try:
        objs, starts, ends = (args[i] if i < len(args) else kwargs[k] for i, k in enumerate(names))
        if name != "batched_to_gpu":
            objs, starts, ends = [objs], [starts], [ends]
        objs, num_bytes = list(objs), 0
        for obj in objs:
            if hasattr(obj, "get_size"):
                num_bytes += int(obj.get_size())
            else:
                num_bytes += int(obj.tensor.nbytes)
        spans = [(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]
        held = int(kwargs.get("vllm_cached_tokens") or 0)
        return (num_bytes, len(objs), sum(e - s for s, e in spans),
                sum(min(e - s, max(0, held - s)) for s, e in spans))
    except Exception:  # noqa: BLE001 - runs in the copy's ``finally``: a count that fails must never fail the copy
        return None


def placed(name: str, args: tuple, kwargs: dict) -> tuple[str, bool | None] | None:
    """(device type, pinned) of the first memory object a copy call of ``COPY_METHODS`` was handed: its tensor's
    ``device.type`` and, in host memory, ``is_pinned()`` (None on a device, or where torch cannot say). None where the
    call was handed no object with a tensor, or reading it raised anything: a diagnostic never fails the copy."""
    try:
        objs = args[0] if args else kwargs["memory_objs" if name == "batched_to_gpu" else "memory_obj"]
        tensor = (next(iter(objs)) if name == "batched_to_gpu" else objs).tensor
        device = str(tensor.device.type)
    except Exception:  # noqa: BLE001 - runs in the copy's ``finally``, as ``copied``
        return None
    try:
        pinned = bool(tensor.is_pinned()) if device == "cpu" else None
    except Exception:  # noqa: BLE001 - a build without an accelerator may refuse to say
        pinned = None
    return device, pinned


class ExternalSwitch:
    """``on`` (the default) leaves the connector alone; ``off`` hides LMCache from the next requests."""

    def __init__(self, engine, probe: ComponentProbe | None = None) -> None:
        self.connector = engine.scheduler.connector
        self.on = True
        self.probe = probe
        self.mp_inner = _find(self.connector, "_get_or_create_request_tracker")
        self.save_knob, self.save_attr = None, None
        for attr in ("force_skip_save",):  # in-process: True skips the save
            knob = _find(self.connector, attr)
            if knob is not None and attr in getattr(knob, "__dict__", {}):
                self.save_knob, self.save_attr = knob, attr
                self.store_default = getattr(knob, attr)
                break
        self.can_skip_save = self.save_knob is not None
        original = self.connector.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens):
            t0 = _ns()
            out = original(request, num_computed_tokens) if self.on else self._bypass(request)
            if self.probe is not None:
                self.probe.lookup(t0, _ns(), out)
            return out

        self.connector.get_num_new_matched_tokens = get_num_new_matched_tokens

    def _bypass(self, request):
        if self.mp_inner is not None:
            import sys

            states = sys.modules[type(self.mp_inner).__module__].LMCacheMPRequestState
            tracker = self.mp_inner._get_or_create_request_tracker(request)
            # 0.5.6 has a bypass state (READY after the allocation); 0.5.3 has none, and a tracker left
            # PREFETCHING with no lookup and 0 hit tokens turns READY there without a retrieve (H200, 6 Dec:
            # setting the missing state raised on every recompute follow-up of the MP tier)
            if hasattr(states, "BYPASS_LMCACHE"):
                tracker.state = states.BYPASS_LMCACHE
            chunk = self.mp_inner.scheduler_adapter.lmcache_tokens_per_chunk
            tracker.num_stored_tokens = request.num_prompt_tokens // chunk * chunk
        return 0, False

    def set(self, on: bool) -> None:
        self.on = on
        if self.save_attr == "force_skip_save":
            self.save_knob.force_skip_save = self.store_default if on else True

    def describe(self) -> dict:
        """How ``off`` works on this engine (the child's record): which LMCache shape the switch found."""
        if self.mp_inner is not None:
            import sys

            states = sys.modules[type(self.mp_inner).__module__].LMCacheMPRequestState
            bypass = ("mp tracker state BYPASS_LMCACHE" if hasattr(states, "BYPASS_LMCACHE") else
                      "mp tracker left PREFETCHING, no lookup (this LMCache has no BYPASS_LMCACHE state: 0.5.3)")
        else:
            bypass = "lookup answers 0"
        return {"bypass": bypass,
                "skips_save_when_off": self.save_attr or ("mp tracker num_stored_tokens" if self.mp_inner is not None else None)}


class ComponentProbe:
    """Stamps the components of the follow-ups between ``start()`` and ``stop()``."""

    def __init__(self, engine) -> None:
        self.lock = threading.Lock()
        self.active = False
        self.calls: dict[str, list] = {k: [] for k in ("lookup", "load", "save", "exec", "disk", "recv", "copy")}
        executor = engine._engine.engine_core.engine_core.model_executor
        for name in ("execute_model", "sample_tokens"):
            if hasattr(executor, name):
                self._wrap(executor, name, "exec")
        worker = worker_connector()
        self.has_worker = worker is not None
        self.cuda = getattr(getattr(engine, "params", None), "DEVICE", "cpu") == "cuda"
        self.events: list[tuple] = []  # (start, end) CUDA events around each load while active
        if worker is not None:
            self._wrap(worker, "start_load_kv", "load")
            self._wrap(worker, "wait_for_save", "save")
            if hasattr(worker, "get_finished"):
                self._wrap_finished(worker)
        self.worker, self.has_copies = worker, False
        self.copy_hook = "no worker-side connector"  # what the copy hook wraps, or why it wraps nothing
        self._hook_copies()
        self.has_disk = self._wrap_disk_reads()

    def _hook_copies(self) -> None:
        """Wraps the in-process LMCache engine's GPU connector's copy (``COPY_METHODS``), found from vLLM's worker-side
        connector as the probe finds its other objects (``_find``: vLLM's ``LMCacheConnectorV1._lmcache_engine``, the
        adapter, whose ``lmcache_engine`` is the engine), and says what it wrapped or why none (``copy_hook``). Never
        raises: a run measures on without the byte count where the hook cannot be installed. An engine not yet
        built is looked for again at the next ``start()``."""
        self.copy_pending = False
        if self.worker is None:
            return
        try:
            holder = _find(self.worker, "lmcache_engine")
            if holder is None:
                self.copy_hook = ("no in-process LMCache engine behind the worker's connector (on the MP path "
                                  "LMCache's server copies; the GPU buffer and vLLM's CPU tier are not LMCache's)")
                return
            engine = holder.lmcache_engine
            if engine is None:
                self.copy_hook, self.copy_pending = "the in-process LMCache engine is not built yet", True
                return
            if getattr(holder, "use_layerwise", False):
                # a layerwise retrieve feeds a generator its objects layer by layer (batched_to_gpu(starts, ends)):
                # no call is handed the chunks whole
                self.copy_hook = "not hooked: a layerwise retrieve (use_layerwise) copies layer by layer"
                return
            gpu = getattr(engine, "gpu_connector", None)
            name = next((m for m in COPY_METHODS if callable(getattr(gpu, m, None))), None)
            if name is None:
                self.copy_hook = (f"not hooked: the LMCache engine's GPU connector ({type(gpu).__name__}) has none of "
                                  f"{', '.join(COPY_METHODS)}")
                return
            self._wrap_copy(gpu, name)
            self.has_copies, self.copy_hook = True, f"{type(gpu).__name__}.{name}"
        except Exception as e:  # noqa: BLE001 - a diagnostic hook never stops a run; why it is missing is recorded
            self.copy_hook = f"not hooked: {type(e).__name__}: {e}"[:200]

    def _wrap_copy(self, gpu, name: str) -> None:
        """Stamps each call of ``gpu.name`` (the instance's attribute: the class and other engines are untouched) and
        counts what it was handed (``copied``) and where its first object lives (``placed``) after its end stamp,
        outside the copy's span."""
        original = getattr(gpu, name)

        def copy(*args, **kwargs):
            t0 = _ns()
            try:
                return original(*args, **kwargs)
            finally:
                t1 = _ns()
                if self.active:  # one record a call: what it was handed, and where its first object lives
                    self._add("copy", t0, t1, (copied(name, args, kwargs), placed(name, args, kwargs)))

        setattr(gpu, name, copy)

    def _wrap(self, obj, name: str, kind: str) -> None:
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            events = self._events_start() if kind == "load" else None
            t0 = _ns()
            try:
                return original(*args, **kwargs)
            finally:
                self._add(kind, t0, _ns())
                if events is not None:
                    events[1].record()
                    with self.lock:
                        self.events.append(events)

        setattr(obj, name, timed)

    def _wrap_finished(self, worker) -> None:
        """Stamps each ``get_finished`` call that reports a finished retrieve (its second set non-empty)."""
        original = worker.get_finished

        def get_finished(*args, **kwargs):
            t0 = _ns()
            out = original(*args, **kwargs)
            recving = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if recving:
                self._add("recv", t0, _ns(), len(recving))
            return out

        worker.get_finished = get_finished

    def _load_wall_s(self) -> float | None:
        """``load_wall_s`` (module docstring) from this follow-up's stamps."""
        c = self.calls
        if not c["recv"]:
            return None
        to_load = [t1 for _, t1, out in c["lookup"] if isinstance(out, tuple) and out[0]]
        after = [t0 for t0, _, _ in c["load"] if to_load and t0 >= to_load[0]]
        # a report stamped before the load began is an earlier request's (the drain before each follow-up should leave
        # none): only reports after the first load end this follow-up's span, never a negative one
        ends = [t1 for _, t1, _ in c["recv"] if after and t1 >= after[0]]
        if not ends:
            return None
        return (max(ends) - after[0]) / 1e9

    def _copies(self) -> dict:
        """``load_bytes``, ``load_chunks``, ``load_tokens``, ``load_skipped_tokens``, ``load_device``, ``load_pinned``,
        ``to_gpu_s`` and ``to_gpu_in_load`` (module docstring) from this follow-up's copy calls."""
        c = self.calls
        if not self.has_copies:
            return dict.fromkeys(("load_bytes", "load_chunks", "load_tokens", "load_skipped_tokens", "load_device",
                                  "load_pinned", "to_gpu_s", "to_gpu_in_load"))
        counted = [x for _, _, (x, _) in c["copy"]]
        known = all(x is not None for x in counted)
        inside = [any(l0 <= t0 and t1 <= l1 for l0, l1, _ in c["load"]) for t0, t1, _ in c["copy"]]
        return {"load_bytes": sum(x[0] for x in counted) if known else None,
                "load_chunks": sum(x[1] for x in counted) if known else None,
                "load_tokens": sum(x[2] for x in counted) if known else None,
                "load_skipped_tokens": sum(x[3] for x in counted) if known else None,
                **self._places(),
                "to_gpu_s": sum(t1 - t0 for t0, t1, _ in c["copy"]) / 1e9,
                "to_gpu_in_load": all(inside) if inside else None}

    def _places(self) -> dict:
        """``load_device`` and ``load_pinned`` (module docstring) from this follow-up's copy calls."""
        places = [x for _, _, (_, x) in self.calls["copy"]]
        if not places or any(p is None for p in places):
            return {"load_device": None, "load_pinned": None}
        devices = sorted({d for d, _ in places})
        pins = [p for _, p in places]
        return {"load_device": devices[0] if len(devices) == 1 else "mixed",
                "load_pinned": all(pins) if devices == ["cpu"] and None not in pins else None}

    def _wrap_disk_reads(self) -> bool:
        try:
            from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
        except ImportError:
            return False
        if getattr(LocalDiskBackend.read_file, "_kmesh_probe", None) is None:
            original, probes = LocalDiskBackend.read_file, []

            def read_file(backend, key, buffer, path):
                t0 = _ns()
                try:
                    return original(backend, key, buffer, path)
                finally:
                    for p in probes:
                        p._add("disk", t0, _ns())

            read_file._kmesh_probe = probes
            LocalDiskBackend.read_file = read_file
        LocalDiskBackend.read_file._kmesh_probe.append(self)
        return True

    def _events_start(self):
        """A (start, end) pair of CUDA events, the start recorded on the current stream now; None off CUDA or
        while the probe is not active."""
        if not (self.cuda and self.active):
            return None
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    def _load_gpu_s(self) -> float | None:
        if not self.cuda:
            return None
        with self.lock:
            events, self.events = list(self.events), []
        total = 0.0
        for start, end in events:
            end.synchronize()
            total += start.elapsed_time(end) / 1e3
        return total

    def _add(self, kind: str, t0: int, t1: int, extra=None) -> None:
        if self.active:
            with self.lock:
                self.calls[kind].append((t0, t1, extra))

    def lookup(self, t0: int, t1: int, out) -> None:
        self._add("lookup", t0, t1, out)

    def start(self) -> None:
        if self.copy_pending:
            self._hook_copies()
        with self.lock:
            for v in self.calls.values():
                v.clear()
            self.events = []
        self.active = True

    def stop(self, first_token_s: float) -> dict:
        self.active = False
        c = self.calls
        total = lambda kind: sum(t1 - t0 for t0, t1, _ in c[kind]) / 1e9  # noqa: E731
        answered = [t1 for _, t1, out in c["lookup"] if out is not None and (not isinstance(out, tuple) or out[0] is not None)]
        lookup_wall = (answered[0] - c["lookup"][0][0]) / 1e9 if answered else None
        disk = (max(t1 for _, t1, _ in c["disk"]) - min(t0 for t0, _, _ in c["disk"])) / 1e9 if c["disk"] else None
        load, save, execute = total("load"), total("save"), total("exec")
        return {
            "lookup_s": total("lookup"), "lookup_calls": len(c["lookup"]), "lookup_wall_s": lookup_wall,
            "disk_read_s": disk if self.has_disk else None, "disk_reads": len(c["disk"]) if self.has_disk else None,
            "load_s": load if self.has_worker else None, "save_s": save if self.has_worker else None,
            "load_gpu_s": self._load_gpu_s() if self.has_worker else None,
            "load_wall_s": self._load_wall_s() if self.has_worker else None,
            **self._copies(),
            "forward_s": max(0.0, execute - load - save), "exec_s": execute, "exec_calls": len(c["exec"]),
            "other_s": first_token_s - total("lookup") - execute,
        }


class KvDigest:
    """Digests of the KV vLLM holds in a finished request's first blocks: what a restore wrote, to be compared with the
    same blocks when the context was computed.

    The block ids are the ones vLLM's scheduler hands its connector's ``request_finished`` (or
    ``request_finished_all_groups``, its first group) as the request finishes: wrapped on the scheduler-side connector
    instance, the wrapper keeps a reference to them (no copy, no work inside the step). The KV is the model runner's
    ``kv_caches`` (one tensor per attention layer, in the engine's process: ``model_executor.driver_worker.worker
    .model_runner``), each indexed on its one dimension of ``kv_cache_config.num_blocks`` blocks, whatever the
    backend's layout. ``take`` digests after the request finished, never inside a timed span.

    A digest, per layer and block, of the block's bytes viewed as int64 words: their sum and their sum weighted by
    position (1, 2, ...), both wrapping: exact, and a block written to the wrong place, a row left stale or a byte
    changed moves its block's. Equal digests on one engine say the blocks hold the same bytes in the same order, up to
    a collision of both sums (``compare_kv`` compares two, block by block).

    Invariant: never raises into the engine; where the KV or the ids cannot be reached ``how`` says why and ``take``
    returns None.
    """

    def __init__(self, engine) -> None:
        self.finished: dict[str, list[int]] = {}  # request id -> the block ids its request_finished was handed
        self.held: set[tuple[int, int]] = set()  # (position, block id) of every request taken since ``forget_held``
        self.kv_caches, self.block_size, self.num_blocks = None, None, None
        try:
            core = engine._engine.engine_core.engine_core
            scheduler = core.scheduler
            config = scheduler.kv_cache_config
            self.num_blocks = int(config.num_blocks)
            self.block_size = int(config.kv_cache_groups[0].kv_cache_spec.block_size)
            if len(config.kv_cache_groups) != 1:
                self.how = f"not taken: {len(config.kv_cache_groups)} KV cache groups (one is digested)"
                return
            caches = list(core.model_executor.driver_worker.worker.model_runner.kv_caches)
            dims = [[i for i, n in enumerate(t.shape) if n == self.num_blocks] for t in caches]
            if not caches or any(len(d) != 1 for d in dims):
                self.how = (f"not taken: no single dimension of {self.num_blocks} blocks in the model runner's "
                            f"{len(caches)} KV tensors ({caches[0].shape if caches else None})")
                return
            connector = scheduler.connector
            for name in ("request_finished", "request_finished_all_groups"):
                if callable(getattr(connector, name, None)):
                    self._wrap_finished(connector, name)
            self.kv_caches, self.block_dims = caches, [d[0] for d in dims]
            self.how = (f"{len(caches)} KV tensors {tuple(caches[0].shape)} {caches[0].dtype} on "
                        f"{caches[0].device.type}, blocks of {self.block_size} tokens on dim {dims[0][0]}, at the ids "
                        f"{type(connector).__name__}.request_finished was handed")
        except Exception as e:  # noqa: BLE001 - a diagnostic never stops a run; why it is missing is recorded
            self.kv_caches, self.how = None, f"not taken: {type(e).__name__}: {e}"[:200]

    def _wrap_finished(self, connector, name: str) -> None:
        original = getattr(connector, name)

        def finished(request, block_ids, *args, **kwargs):
            self.finished[request.request_id] = block_ids
            return original(request, block_ids, *args, **kwargs)

        setattr(connector, name, finished)

    def forget_held(self) -> None:
        """A new context: the blocks the last one's requests held cannot hold this one's KV."""
        self.held = set()

    def scrub(self) -> bool:
        """Zeroes every block of vLLM's KV caches, so that the next restore's equal digest shows it wrote every block:
        one it did not write holds zeros, not the KV an earlier request of the context left there (without it, 125 of
        e7c8's 137 restores landed on such blocks and were no evidence). Only while no request holds a block: after
        the prefix cache's reset, outside every stopwatch. Every block held so far then holds none of its earlier KV
        (``held`` and the requests not yet taken are forgotten). False, changing nothing, where the KV was not reached
        (``how`` says why) or could not be written; never raises."""
        if self.kv_caches is None:
            return False
        try:
            for t in self.kv_caches:
                t.zero_()
            if self.kv_caches[0].device.type == "cuda":
                import torch

                torch.cuda.synchronize(self.kv_caches[0].device)
        except Exception:  # noqa: BLE001 - a restore left unscrubbed is judged as before (its reused blocks left out)
            return False
        self.held, self.finished = set(), {}
        return True

    def take(self, request_id: str, num_tokens: int) -> BlockDigest | None:
        """The digest of each of the first ``num_tokens // block_size`` blocks of the finished request whose id is
        ``request_id`` (vLLM may add a suffix to it), and which of them sat at the same position in a request taken since
        ``forget_held`` (one of the same context, whose KV such a block may still hold: an equal digest there does not
        show that a restore wrote it); None where the KV was not reached, no such request finished, or it held fewer
        blocks. Forgets every request finished so far, and adds their blocks to the held ones."""
        finished, self.finished = self.finished, {}
        if self.kv_caches is None:
            return None
        try:
            import torch

            def first_group(ids):  # request_finished_all_groups: one list per group, the one group first
                return ids[0] if ids and not isinstance(ids[0], int) else ids

            key = next((k for k in finished if k == request_id or k.startswith(f"{request_id}-")), None)
            ids = first_group(finished[key]) if key is not None else None
            held = set(self.held)
            for k, v in finished.items():
                self.held.update(enumerate(first_group(v)))
                if k != key:
                    held.update(enumerate(first_group(v)))
            num_blocks = num_tokens // self.block_size
            if ids is None or num_blocks == 0 or len(ids) < num_blocks:
                return None
            layers, weights_of = [], {}  # one position weight vector per row width: the layers share theirs
            for t, dim in zip(self.kv_caches, self.block_dims, strict=True):
                rows = t.index_select(dim, torch.tensor(ids[:num_blocks], dtype=torch.long, device=t.device))
                rows = rows.movedim(dim, 0).reshape(num_blocks, -1)  # one row per block, its bytes in order
                words = (rows.view(torch.int64) if rows.shape[1] * rows.element_size() % 8 == 0
                         else rows.view(torch.uint8).to(torch.int64))
                weights = weights_of.get((words.shape[1], words.device))
                if weights is None:
                    weights = weights_of[(words.shape[1], words.device)] = torch.arange(
                        1, words.shape[1] + 1, dtype=torch.int64, device=words.device)
                layers.append(torch.stack([words.sum(dim=1), (words * weights).sum(dim=1)], dim=1))
            return BlockDigest(torch.stack(layers).cpu(), self.block_size,
                               [(k, b) in held for k, b in enumerate(ids[:num_blocks])])
        except Exception:  # noqa: BLE001 - a digest that cannot be taken is recorded None, the run goes on
            return None


class BlockDigest(NamedTuple):
    """``KvDigest.take``'s digest of a request's first blocks."""

    digests: Any  # int64 tensor (layers, blocks, 2) on the host: each block's word sum and position-weighted sum
    block_size: int  # tokens per block
    reused: list[bool]  # per block: it sat at the same position in an earlier request of the context


KV_FIELDS = ("kv_digest_equal", "kv_digest_tokens", "kv_digest_differing_tokens", "kv_digest_reused_tokens",
             "kv_digest_differing_by_layer", "kv_digest_differing_spans", "kv_digest_zero_blocks",
             "kv_digest_misplaced_blocks")


def compare_kv(now: BlockDigest | None, stored: BlockDigest | None) -> dict:
    """A restore's blocks (``now``) against the blocks its context was computed into (``stored``), block by block:
    ``kv_digest_equal`` (every block's digest in every layer equal), ``kv_digest_tokens`` (the tokens compared),
    ``kv_digest_differing_tokens`` (those of blocks whose digest differs in any layer: what the restore did not write
    as computed) and ``kv_digest_reused_tokens`` (those of blocks that held the same place in an earlier request of the
    context: an equal digest there is no evidence). Where they differ, where: ``kv_digest_differing_by_layer`` (per
    layer, its blocks whose digest differs) and ``kv_digest_differing_spans`` (the runs of differing blocks, each
    ``[first, last]`` block index of the context, inclusive); and what a differing block holds where that can be told:
    ``kv_digest_zero_blocks``, blocks whose bytes are all zero in every layer (a copy from memory never written), and
    ``kv_digest_misplaced_blocks``, blocks that hold, in every layer, the KV the context was computed into at another
    block (a copy to the wrong place). All None where either digest is missing or they differ in shape."""
    if now is None or stored is None or tuple(now.digests.shape) != tuple(stored.digests.shape):
        return dict.fromkeys(KV_FIELDS)
    differs = (now.digests != stored.digests).any(dim=2)  # (layers, blocks)
    same = (~differs.any(dim=0)).tolist()
    spans: list[list[int]] = []
    for block, ok in enumerate(same):
        if ok:
            continue
        if spans and spans[-1][1] == block - 1:
            spans[-1][1] = block
        else:
            spans.append([block, block])
    keys = now.digests.transpose(0, 1).reshape(len(same), -1).tolist()  # per block, its digests in every layer
    stored_keys = {tuple(k) for k in stored.digests.transpose(0, 1).reshape(len(same), -1).tolist()}
    differing = [keys[b] for b, ok in enumerate(same) if not ok]
    return {"kv_digest_equal": all(same), "kv_digest_tokens": len(same) * now.block_size,
            "kv_digest_differing_tokens": same.count(False) * now.block_size,
            "kv_digest_reused_tokens": sum(now.reused) * now.block_size,
            "kv_digest_differing_by_layer": differs.sum(dim=1).tolist(), "kv_digest_differing_spans": spans,
            "kv_digest_zero_blocks": sum(not any(k) for k in differing),
            "kv_digest_misplaced_blocks": sum(tuple(k) in stored_keys for k in differing)}
