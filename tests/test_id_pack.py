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
