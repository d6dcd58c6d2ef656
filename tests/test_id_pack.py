"""A restore's block ids packed for the copy kernel (``kv.id_pack``): the native loop gives ``struct``'s bytes for
every range, refuses what ``struct`` refuses, and a process that cannot build it packs with ``struct`` and says why."""
import struct

import pytest

from kmesh_lib.kv import fused_copy, id_pack, native_build

TABLE = [(7919 * i + 13) % 50_000 for i in range(40)]


@pytest.fixture
def native():
    id_pack._route = None
    if not id_pack.pack_via().startswith("native"):
        pytest.skip(id_pack.pack_via())
    yield
    id_pack._route = None


@pytest.mark.parametrize("first, num", [(0, None), (0, 40), (0, 1), (5, 7), (39, 1), (40, 0), (12, 0)])
def test_the_native_loop_packs_the_bytes_struct_packs(native, first, num):
    end = len(TABLE) if num is None else first + num
    assert id_pack.pack_ids(TABLE, first, num) == struct.pack(f"{end - first}i", *TABLE[first:end])
    assert id_pack.pack_ids(TABLE, first, num) == fused_copy.pack_ids(TABLE, first, num)


def test_the_native_loop_refuses_a_range_outside_the_list_and_ids_outside_int32(native):
    with pytest.raises(IndexError, match=r"\[35, 45\) outside a list of 40"):
        id_pack.pack_ids(TABLE, 35, 10)
    with pytest.raises(IndexError):
        id_pack.pack_ids(TABLE, -1, 2)
    with pytest.raises(OverflowError, match="block id 1 does not fit in int32"):
        id_pack.pack_ids([1, 2**31, 3])
    with pytest.raises(OverflowError):
        id_pack.pack_ids([1, 2**80])
    with pytest.raises(TypeError, match="block id 2 is not an int"):
        id_pack.pack_ids([1, 2, "3"])
    assert id_pack.pack_ids([-(2**31), 2**31 - 1]) == struct.pack("2i", -(2**31), 2**31 - 1)


def test_without_the_interpreters_headers_ids_are_packed_by_struct_and_the_route_says_why(monkeypatch, tmp_path):
    def no_headers():
        raise FileNotFoundError("no Python.h in '/nowhere'")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native_build, "python_include", no_headers)
    monkeypatch.setattr(id_pack, "_route", None)
    assert id_pack.pack_via() == "struct (no native packer: no Python.h in '/nowhere')"
    assert id_pack.pack_ids(TABLE, 3, 4) == struct.pack("4i", *TABLE[3:7])
    with pytest.raises(IndexError):
        id_pack.pack_ids(TABLE, 38, 5)
    monkeypatch.setattr(id_pack, "_route", None)


def test_a_tuple_of_ids_takes_the_struct_route(native):
    assert id_pack.pack_ids(tuple(TABLE), 2, 3) == struct.pack("3i", *TABLE[2:5])


def test_the_gil_free_packer_writes_the_same_ids_and_refuses_what_it_cannot_read(native):
    """``kp_pack_into`` as the launch thread calls it, here through ``ctypes.CDLL`` (which releases the GIL for the
    call): ``struct``'s bytes for every range; -1 for what it cannot read without the interpreter."""
    import ctypes

    assert id_pack.pack_into_address() is not None  # built natively, it passed its sample (``_packs_into``)
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.py_object, ctypes.c_ssize_t, ctypes.c_ssize_t)(
        id_pack.pack_into_address())
    out = (ctypes.c_int32 * 40)()
    for first, num in [(0, 40), (5, 7), (39, 1), (12, 0)]:
        assert fn(ctypes.addressof(out), TABLE, first, num) == 0
        assert bytes(out)[:4 * num] == struct.pack(f"{num}i", *TABLE[first:first + num])
    assert fn(ctypes.addressof(out), [-7, 0, 2**30 - 1], 0, 3) == 0 and list(out[:3]) == [-7, 0, 2**30 - 1]
    for bad in ([2**30], [-(2**30) - 1], [True], ["1"], [1.0]):
        assert fn(ctypes.addressof(out), bad, 0, 1) == -1, bad
    assert fn(ctypes.addressof(out), TABLE, 35, 10) == -1 and fn(ctypes.addressof(out), tuple(TABLE), 0, 1) == -1


def test_an_id_range_reads_its_ids_only_when_asked():
    table = list(TABLE)
    ids = id_pack.IdRange(table, 3, 4)
    assert len(ids) == 4 and ids.to_list() == TABLE[3:7] and ids.packed() == struct.pack("4i", *TABLE[3:7])
    table.append(5)  # a tracked table only grows: the range reads the same ids
    assert ids.to_list() == TABLE[3:7]
    with pytest.raises(IndexError, match=r"\[38, 43\) outside a list of 41"):
        id_pack.IdRange(table, 38, 5)


def test_a_gil_free_packer_that_misreads_its_sample_is_not_offered(native, monkeypatch):
    monkeypatch.setattr(id_pack, "_packs_into", lambda address: False)
    id_pack._route = None
    assert id_pack.pack_into_address() is None  # the launch thread is then given no packer
    assert id_pack.pack_via().startswith("native") and id_pack.pack_ids(TABLE, 0, 2) == struct.pack("2i", *TABLE[:2])
