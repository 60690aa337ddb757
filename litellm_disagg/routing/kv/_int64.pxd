# cython: language_level=3
"""A Python int as a C int64, shared by the compiled tables (``_kvcore.MaskTable``, ``_kvwire.Translations``)."""

from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_Check
from libc.stdint cimport int64_t


cdef inline bint as_int64(object h, int64_t* out) except -1:
    """``h`` as a C int64: True for an int in the int64 range (block hashes, ``hash()`` values), else False (the
    caller keeps anything else in a dict, with the same answers)."""
    cdef int overflow = 0
    cdef long long v
    if not PyLong_Check(h):
        return False
    v = PyLong_AsLongLongAndOverflow(h, &overflow)
    if overflow:
        return False
    out[0] = v
    return True
