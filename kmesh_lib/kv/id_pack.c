/* Block ids as the restore copy's kernel reads them (int32), straight from a Python list of ints
 * (kv/id_pack.py). Called through ctypes.PyDLL: the GIL is held for the whole call.
 *
 * Why in C: packing 1,024 ids with struct.pack(*ids) builds a tuple of them first (a reference taken on every
 * int) and then reads each; on a host whose caches the engine's step has just evicted each pass over the ints'
 * objects costs a cache miss per object. This loop reads each int of the wanted range once and takes no
 * reference: one pass.
 *
 * Invariant: returns a new bytes object of 4 * num bytes holding list[first:first + num] as int32, or NULL with a
 * Python exception set (not a list, a range outside it, an item that is not an int in int32).
 *
 * kp_pack_into writes the same ids into memory the caller owns, and makes no Python API call: the launch thread
 * (kv/launch_thread.c) calls it without the GIL, so the engine thread hands over the list instead of reading its
 * ints. What it reads are plain loads of objects the caller keeps alive and unchanged until the call has returned
 * (the list: its size and item pointers; each int: its type pointer and its value's words, which never change).
 */
#include <Python.h>
#include <stdint.h>

PyObject *kp_pack_ids(PyObject *list, Py_ssize_t first, Py_ssize_t num) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "pack_ids: block ids must be a list");
        return NULL;
    }
    if (first < 0 || num < 0 || first + num > PyList_GET_SIZE(list)) {
        PyErr_Format(PyExc_IndexError, "pack_ids: ids [%zd, %zd) outside a list of %zd", first, first + num,
                     PyList_GET_SIZE(list));
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, num * 4);
    if (out == NULL) return NULL;
    int32_t *dst = (int32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < num; i++) {
        PyObject *item = PyList_GET_ITEM(list, first + i);
        if (!PyLong_Check(item)) {
            Py_DECREF(out);
            PyErr_Format(PyExc_TypeError, "pack_ids: block id %zd is not an int", first + i);
            return NULL;
        }
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(item, &overflow);
        if (overflow || v < INT32_MIN || v > INT32_MAX) {
            Py_DECREF(out);
            PyErr_Format(PyExc_OverflowError, "pack_ids: block id %zd does not fit in int32", first + i);
            return NULL;
        }
        dst[i] = (int32_t)v;
    }
    return out;
}

/* One block id from an exact int of at most one digit (|v| < 2**30: a compact int), read in place without the
 * GIL; -1 for anything else (a bool, a subclass, a larger int), which the caller reports as a bad id. */
static inline int read_compact(PyObject *item, int32_t *out) {
    if (!PyLong_CheckExact(item)) return -1;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)item)) return -1;
    *out = (int32_t)PyUnstable_Long_CompactValue((PyLongObject *)item);
#else
    Py_ssize_t size = Py_SIZE(item); /* the sign times the number of digits; 0 for zero */
    if (size < -1 || size > 1) return -1;
    *out = (int32_t)(size * (Py_ssize_t)((PyLongObject *)item)->ob_digit[0]);
#endif
    return 0;
}

/* dst[0..num) <- list[first:first + num] as int32. Returns 0, or -1 (not a list, a range outside it, an id that
 * is not a compact int), with dst partly written. No Python API call, no reference taken: safe without the GIL
 * while the caller keeps the list and its items alive and the list unchanged. */
int kp_pack_into(int32_t *dst, PyObject *list, Py_ssize_t first, Py_ssize_t num) {
    if (!PyList_CheckExact(list) || first < 0 || num < 0 || first + num > PyList_GET_SIZE(list)) return -1;
    PyObject **items = ((PyListObject *)list)->ob_item + first;
    for (Py_ssize_t i = 0; i < num; i++)
        if (read_compact(items[i], dst + i)) return -1;
    return 0;
}
