"""A restore's block ids packed for the copy kernel (int32 bytes), as the connector's scheduler side takes them
from vLLM's scheduler output (``HostStagedGpuBuffer._fill_block_ids``).

Two routes, the same bytes: ``id_pack.c`` through ``ctypes.PyDLL`` (a C loop that reads each wanted int of the
list once, the GIL held), built on first use where a C compiler and the interpreter's ``Python.h`` are there;
else ``struct`` (``fused_copy.pack_ids``: the list packed whole, the bytes cut). ``pack_via()`` says which this
process takes, and why not the first (the library is built at the first pack, or at that call).

The same library's ``kp_pack_into`` writes the ids into memory the caller owns without a Python API call, so the
launch thread can pack them without the GIL (``pack_into_address``; ``LaunchThread.request(..., ids=)``): the
engine thread then hands over the list and reads none of its ints.

Measured: ``benchmarks/bench_pack_ids.py`` on the H200 host (3 Dec 2026; 1,024 of 1,030 ids, the caches scrubbed
and the list copied just before, as the connector finds it): the slice packed by ``struct`` 53.4 us, the whole table
packed and cut 42.5, this loop 27.6 (medians); in section 21 at 0.5B 16k the restore's ``pack_ids`` part went
0.026 -> 0.021 ms (f4df at 11c0e22, ``struct``; b3f2 at 7c98a47, this loop). What is left is a cache miss per int
object read, which no packing from Python's ints avoids.
"""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from kmesh_lib.kv import native_build

SOURCE = Path(__file__).with_name("id_pack.c")


def _load_native():
    """``kp_pack_ids`` as a Python callable, and how it was made; (None, why) where it cannot be."""
    try:
        path = native_build.build_library(SOURCE, tuple(native_build.python_include()))
        lib = ctypes.PyDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # FileNotFoundError: no Python.h
        return None, f"struct (no native packer: {e})", None
    fn = lib.kp_pack_ids
    fn.argtypes, fn.restype = (ctypes.py_object, ctypes.c_ssize_t, ctypes.c_ssize_t), ctypes.py_object
    into = ctypes.cast(lib.kp_pack_into, ctypes.c_void_p).value
    return fn, "native (id_pack.c through ctypes.PyDLL)", into if _packs_into(into) else None


_PACK_INTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.py_object, ctypes.c_ssize_t, ctypes.c_ssize_t)
_SAMPLE = [0, 1, 255, 256, 70_000, 2**30 - 1]  # small (cached), heap and the largest compact ints


def _packs_into(address: int) -> bool:
    """Whether ``kp_pack_into`` reads this interpreter's ints as it must (it reads their layout directly): the
    sample's values, and a refusal of an int it cannot read. Called through ``CFUNCTYPE``, without the GIL, as the
    launch thread calls it."""
    fn, out = _PACK_INTO(address), (ctypes.c_int32 * len(_SAMPLE))()
    return (fn(ctypes.addressof(out), _SAMPLE, 0, len(_SAMPLE)) == 0 and list(out) == _SAMPLE
            and fn(ctypes.addressof(out), [2**40], 0, 1) == -1)


_route: tuple | None = None  # (the native callable or None, the route in words, kp_pack_into's address), made at first use


def pack_via() -> str:
    """The route this process packs ids by: "native (...)", or "struct (no native packer: <why>)"."""
    global _route
    if _route is None:
        _route = _load_native()
    return _route[1]


class IdRange:
    """Block ids ``table[first:first + num]`` of a request's block table, not read: a restore whose launch the launch
    thread makes, and whose ids it packs itself (``LaunchThread.request(..., ids=)``), carries this instead of a
    list, so the engine thread touches none of the ids' objects. ``len`` is ``num``; ``to_list`` and ``packed``
    read them (on the engine thread) where a route needs them there.

    Invariant: the holder keeps ``table`` from changing in ``[first, first + num)`` until the ids are read; a
    tracked request's table is only appended to (``HostStagedGpuBuffer._follow``), or replaced whole."""

    __slots__ = ("table", "first", "num")

    def __init__(self, table: list[int], first: int, num: int) -> None:
        if first < 0 or num < 0 or first + num > len(table):
            raise IndexError(f"IdRange: ids [{first}, {first + num}) outside a list of {len(table)}")
        self.table, self.first, self.num = table, first, num

    def __len__(self) -> int:
        return self.num

    def __repr__(self) -> str:
        return f"IdRange({self.num} ids from {self.first})"

    def to_list(self) -> list[int]:
        return self.table[self.first:self.first + self.num]

    def packed(self) -> bytes:
        return pack_ids(self.table, self.first, self.num)


def pack_into_address() -> int | None:
    """The C address of ``int kp_pack_into(int32_t *dst, PyObject *list, Py_ssize_t first, Py_ssize_t num)`` (0
    or -1: not a list, a range outside it, an id that is not an int below 2**30), which makes no Python API call;
    None where the native packer could not be built (``pack_via`` says why) or read a sample of ints wrongly."""
    if _route is None:
        pack_via()
    return _route[2]


def pack_ids(block_ids: list[int], first: int = 0, num: int | None = None) -> bytes:
    """``block_ids[first:first + num]`` (default: to the end) as int32 bytes, by the native loop where there is
    one (a list only), else ``fused_copy.pack_ids``. Raises ``IndexError`` for a range outside the list (either
    route); an id outside int32 or not an int raises ``OverflowError`` / ``TypeError`` natively, ``struct.error``
    on the struct route."""
    if num is None:
        num = len(block_ids) - first
    if _route is None:
        pack_via()
    native = _route[0]
    if native is not None and type(block_ids) is list:
        return native(block_ids, first, num)
    if first < 0 or num < 0 or first + num > len(block_ids):
        raise IndexError(f"pack_ids: ids [{first}, {first + num}) outside a list of {len(block_ids)}")
    from kmesh_lib.kv import fused_copy  # torch with it: only where there is no native packer

    return fused_copy.pack_ids(block_ids, first, num)
