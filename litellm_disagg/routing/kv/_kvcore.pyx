# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, infer_types=False
"""Compiled kernels of the KV routing hot paths (built by ``scripts/build_native.sh``; ``native.py`` loads them).

Every function here is the compiled twin of a pure-Python definition, with equal results on equal inputs:

- ``chain_hashes``: ``block_hash.chain_hashes`` (CPython's tuple hash of ``(parent, tuple(block))``, chained),
  computed without building the tuples: the same xxHash-style mix CPython's ``tuplehash`` runs, over the same
  per-item hashes (``PyObject_Hash`` of each token id, CPython's ``int`` hash of the parent);
- ``overlap_walk``: the walk of ``PrefixIndex.overlap`` over the ``held`` / ``predicted`` tables (hash -> bitmask of
  slots), with masks of up to 64 slots as C integers;
- ``store_precise`` / ``remove``: ``PrefixIndex.stored`` (precise workers) and ``PrefixIndex.removed``.

``native.py`` checks ``chain_hashes`` against the Python definition at import and falls back to pure Python on any
difference (another interpreter's tuple hash) or when this module is missing.
"""

from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_DelItem
from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_FromSsize_t, PyLong_FromUnsignedLongLong, PyLong_AsUnsignedLongLong
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint64_t, int64_t

from litellm_disagg.routing.kv._tuplehash cimport (
    Py_hash_t, Py_uhash_t, chain_step, finish, int_hash, mix, xxprime_5,
)

cdef extern from "Python.h":
    object PySequence_Fast(object o, const char* m)
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)
    PyObject** PySequence_Fast_ITEMS(object o)
    PyObject* PyList_GET_ITEM(object l, Py_ssize_t i)
    bint PyLong_CheckExact_ptr "PyLong_CheckExact" (PyObject* o) noexcept
    Py_hash_t PyObject_Hash_ptr "PyObject_Hash" (PyObject* o) noexcept


def tuple_hash_constants_ok():
    """Whether the mix above is this interpreter's tuple hash (checked on a few tuples of ints)."""
    cdef Py_uhash_t acc
    for t in ((), (1,), (1, 2, 3), (-1, 2**40, -(2**62)), tuple(range(16))):
        acc = xxprime_5()
        for item in t:
            acc = mix(acc, <Py_uhash_t>PyObject_Hash(item))
        if finish(acc, len(t)) != hash(t):
            return False
    return True


def chain_hashes(token_ids, Py_ssize_t block_size, int64_t parent):
    """``[h := hash((h, tuple(block))) for each full block of token_ids]``, from ``h = parent``."""
    cdef object seq = PySequence_Fast(token_ids, "token ids must be a sequence")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq)
    cdef Py_ssize_t blocks = n // block_size
    cdef Py_ssize_t b, i, base
    cdef Py_uhash_t inner
    cdef Py_hash_t lane
    cdef Py_hash_t h = parent
    cdef list out = PyList_New(blocks)
    cdef object value
    cdef object item
    cdef PyObject** items
    cdef PyObject* p
    for b in range(blocks):
        # The items pointer is borrowed from ``seq`` (token_ids itself when it is a list): taken again after anything
        # that may run Python code and resize the list (the allocation below may start the GC; a token id that is not
        # exactly an int may have a ``__hash__`` of its own), and the size checked.
        if PySequence_Fast_GET_SIZE(seq) != n:
            raise RuntimeError("token ids changed size while they were hashed")
        items = PySequence_Fast_ITEMS(seq)
        inner = xxprime_5()
        base = b * block_size
        for i in range(block_size):
            p = items[base + i]
            if PyLong_CheckExact_ptr(p):  # an int's hash runs no Python code and allocates nothing
                lane = PyObject_Hash_ptr(p)
            else:
                item = <object>p  # a strong reference while its __hash__ runs
                lane = PyObject_Hash(item)
                if PySequence_Fast_GET_SIZE(seq) != n:
                    raise RuntimeError("token ids changed size while they were hashed")
                items = PySequence_Fast_ITEMS(seq)
            if lane == -1:
                raise TypeError("unhashable token id")
            inner = mix(inner, <Py_uhash_t>lane)
        h = chain_step(h, finish(inner, block_size))
        value = PyLong_FromSsize_t(h)
        Py_INCREF(value)
        PyList_SET_ITEM(out, b, value)
    return out


cdef inline uint64_t mask_of(PyObject* found) except? 0xFFFFFFFFFFFFFFFF:
    if found == NULL:
        return 0
    return PyLong_AsUnsignedLongLong(<object>found)


def overlap_walk(dict held, dict predicted, list hashes, uint64_t current):
    """The prefix walk of ``PrefixIndex.overlap`` from block 1, ``current`` being the slots that hold block 0 (not 0).

    Returns ``[(slots that stop, leading blocks they hold), ...]`` in the order the Python walk credits them; the
    slots still matching at the end come last with ``len(hashes)``. ``predicted`` may be empty."""
    cdef Py_ssize_t n = PyList_GET_SIZE(hashes)
    cdef Py_ssize_t position
    cdef uint64_t mask
    cdef bint with_predicted = len(predicted) > 0
    cdef list out = []
    cdef object h
    for position in range(1, n):
        if position >= PyList_GET_SIZE(hashes):
            raise RuntimeError("hashes changed size during the walk")
        h = <object>PyList_GET_ITEM(hashes, position)
        mask = mask_of(PyDict_GetItem(held, h))
        if with_predicted:
            mask |= mask_of(PyDict_GetItem(predicted, h))
        mask &= current
        if mask != current:
            out.append((current & ~mask, position))
            current = mask
            if current == 0:
                return out
    out.append((current, n))
    return out


def store_precise(dict held, dict lru, hashes, uint64_t bit, object no_expiry):
    """``PrefixIndex.stored``'s loop for a precise worker of slot bit ``bit``: each hash marked held and moved to the
    end of the worker's LRU."""
    cdef object seq = PySequence_Fast(hashes, "hashes must be a sequence")
    cdef Py_ssize_t i
    cdef uint64_t mask
    cdef object h
    for i in range(PySequence_Fast_GET_SIZE(seq)):
        if i >= PySequence_Fast_GET_SIZE(seq):  # the allocations below may run the GC: never trust an old pointer
            raise RuntimeError("hashes changed size while they were stored")
        h = <object>PySequence_Fast_ITEMS(seq)[i]
        mask = mask_of(PyDict_GetItem(held, h))
        if mask & bit:
            PyDict_DelItem(lru, h)
        else:
            PyDict_SetItem(held, h, PyLong_FromUnsignedLongLong(mask | bit))
        PyDict_SetItem(lru, h, no_expiry)


def remove(dict held, dict lru, hashes, uint64_t bit):
    """``PrefixIndex.removed``'s loop: each hash the worker's LRU has is dropped from it and its bit cleared."""
    cdef object seq = PySequence_Fast(hashes, "hashes must be a sequence")
    cdef Py_ssize_t i
    cdef uint64_t mask
    cdef object h
    cdef uint64_t keep = ~bit
    for i in range(PySequence_Fast_GET_SIZE(seq)):
        if i >= PySequence_Fast_GET_SIZE(seq):
            raise RuntimeError("hashes changed size while they were removed")
        h = <object>PySequence_Fast_ITEMS(seq)[i]
        if PyDict_GetItem(lru, h) == NULL:
            continue
        PyDict_DelItem(lru, h)
        mask = mask_of(PyDict_GetItem(held, h)) & keep
        if mask:
            PyDict_SetItem(held, h, PyLong_FromUnsignedLongLong(mask))
        else:
            PyDict_DelItem(held, h)
