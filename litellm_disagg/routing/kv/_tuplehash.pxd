# cython: language_level=3
"""CPython's tuple hash of ``(parent, (t0, t1, ...))`` over int64 / uint64 values, as inline C: shared by the compiled
block hash (``_kvcore.chain_hashes``) and the compiled KV-event path (``_kvwire``), so both compute the same values.
``native.py`` checks them against this interpreter's ``hash()`` at import."""

from libc.stdint cimport int64_t, uint64_t

cdef extern from "Python.h":
    ctypedef Py_ssize_t Py_hash_t
    ctypedef size_t Py_uhash_t

cdef inline Py_uhash_t xxprime_1() noexcept nogil:
    return 11400714785074694791ULL

cdef inline Py_uhash_t xxprime_2() noexcept nogil:
    return 14029467366897019727ULL

cdef inline Py_uhash_t xxprime_5() noexcept nogil:
    return 2870177450012600261ULL

cdef inline uint64_t modulus() noexcept nogil:
    return (<uint64_t>1 << 61) - 1


cdef inline Py_hash_t int_hash(int64_t v) noexcept nogil:
    """CPython's hash of an int in the int64 range (reduced modulo 2**61 - 1, sign kept, -1 -> -2)."""
    cdef uint64_t a
    cdef Py_hash_t r
    if v < 0:
        a = (<uint64_t>0 - <uint64_t>v) % modulus()
        r = -<Py_hash_t>a
    else:
        r = <Py_hash_t>(<uint64_t>v % modulus())
    if r == -1:
        r = -2
    return r


cdef inline Py_hash_t uint_hash(uint64_t v) noexcept nogil:
    """CPython's hash of a non-negative int below 2**64 (never -1: the remainder is below 2**61)."""
    return <Py_hash_t>(v % modulus())


cdef inline Py_uhash_t mix(Py_uhash_t acc, Py_uhash_t lane) noexcept nogil:
    acc += lane * xxprime_2()
    acc = (acc << 31) | (acc >> 33)
    return acc * xxprime_1()


cdef inline Py_hash_t finish(Py_uhash_t acc, Py_ssize_t length) noexcept nogil:
    acc += (<Py_uhash_t>length) ^ (xxprime_5() ^ 3527539UL)
    if acc == <Py_uhash_t>-1:
        return 1546275796
    return <Py_hash_t>acc


cdef inline Py_hash_t chain_step(Py_hash_t parent, Py_hash_t block_tuple_hash) noexcept nogil:
    """``hash((parent, block))`` given ``hash(block)``."""
    cdef Py_uhash_t outer = mix(xxprime_5(), <Py_uhash_t>int_hash(parent))
    outer = mix(outer, <Py_uhash_t>block_tuple_hash)
    return finish(outer, 2)
