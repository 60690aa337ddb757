# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, infer_types=False
"""Compiled kernels of the KV routing hot paths (built by ``scripts/build_native.sh``; ``native.py`` loads them).

Every function here is the compiled twin of a pure-Python definition, with equal results on equal inputs:

- ``chain_hashes``: ``block_hash.chain_hashes`` (CPython's tuple hash of ``(parent, tuple(block))``, chained),
  computed without building the tuples: the same xxHash-style mix CPython's ``tuplehash`` runs, over the same
  per-item hashes (``PyObject_Hash`` of each token id, CPython's ``int`` hash of the parent);
- ``overlap_walk``: the walk of ``PrefixIndex.overlap`` over the ``held`` / ``predicted`` tables (hash -> bitmask of
  slots), with masks of up to 64 slots as C integers;
- ``store_precise`` / ``remove`` / ``touch_routed``: ``PrefixIndex.stored`` (precise workers), ``PrefixIndex.removed``
  and the LRU pass of ``PrefixIndex.record_routed`` (precise workers);
- ``MaskTable``: the index's ``hash -> slot mask`` table as C integers (open addressing), with the dict methods the
  index uses (``get``, ``[]``, ``pop``, ``del``, ``len``, ``items``): the walk, store and removal above read and write
  it without a Python object per probe. ``PrefixIndex`` uses it while its masks fit 64 bits, else a dict;
- ``PreciseSink``: ``PrefixIndex.stored`` / ``removed`` for one precise worker (``PrefixIndex.precise_sink``), which
  the compiled KV-event path calls without a Python frame per message.

``native.py`` checks ``chain_hashes`` against the Python definition at import and falls back to pure Python on any
difference (another interpreter's tuple hash) or when this module is missing.
"""

from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_DelItem
from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_FromSsize_t, PyLong_FromUnsignedLongLong, PyLong_AsUnsignedLongLong, PyLong_FromLongLong
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint64_t, int64_t

from litellm_disagg.routing.kv._int64 cimport as_int64
from litellm_disagg.routing.kv._tuplehash cimport (
    Py_hash_t, Py_uhash_t, chain_step, finish, int_hash, mix, xxprime_5,
)

cdef extern from *:
    void prefetch "__builtin_prefetch" (const void* address) noexcept nogil

cdef extern from "Python.h":
    object PySequence_Fast(object o, const char* m)
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)
    PyObject** PySequence_Fast_ITEMS(object o)
    PyObject* PyList_GET_ITEM(object l, Py_ssize_t i)
    bint PyLong_CheckExact_ptr "PyLong_CheckExact" (PyObject* o) noexcept
    Py_hash_t PyObject_Hash_ptr "PyObject_Hash" (PyObject* o) noexcept
    bint PyLong_Check(object o) noexcept
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1


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


# -- the index's hash -> slot mask table, as C integers ---------------------------------------------------------------

cdef enum:
    MIN_CAPACITY = 64  # table sizes are powers of two, never below this


cdef class MaskTable:
    """``{block hash: slot mask}`` for masks of 1 to 64 bits, as C integers: open addressing with linear probing over
    arrays of int64 keys and uint64 masks (a mask of 0 marks an empty cell, so a present entry's mask is never 0),
    deletion by backward shift (no tombstones), at most half full, halved when under an eighth full (memory follows
    the entries, as the index's capacity bounds them). One probe reads two adjacent arrays, not three Python
    objects. Keys that are not ints in the int64 range live in ``other`` (a dict) with the same answers: the index's
    block hashes always fit, so it stays empty in use.

    The dict methods ``PrefixIndex`` uses, with dict semantics: ``get``, ``[]`` (read, write, ``del``), ``pop``,
    ``in``, ``len``, iteration over keys, ``keys``, ``items`` (a list: C cells in table order, then ``other``).
    Setting a mask of 0 or one outside 64 bits raises: the index deletes an entry whose mask becomes 0."""

    cdef int64_t* cell_keys
    cdef uint64_t* cell_masks
    cdef Py_ssize_t capacity  # a power of two
    cdef Py_ssize_t used  # C cells in use
    cdef int shift  # 64 - log2(capacity): the home cell is the top bits of key * golden ratio
    cdef dict other

    def __cinit__(self):
        self.cell_keys = NULL
        self.cell_masks = NULL
        self.used = 0
        self.other = {}
        self._alloc(MIN_CAPACITY)

    def __dealloc__(self):
        PyMem_Free(self.cell_keys)
        PyMem_Free(self.cell_masks)

    cdef int _alloc(self, Py_ssize_t capacity) except -1:
        cdef int64_t* keys = <int64_t*>PyMem_Calloc(capacity, sizeof(int64_t))
        cdef uint64_t* masks = <uint64_t*>PyMem_Calloc(capacity, sizeof(uint64_t))
        cdef int bits = 0
        if keys == NULL or masks == NULL:
            PyMem_Free(keys)
            PyMem_Free(masks)
            raise MemoryError()
        while (<Py_ssize_t>1 << bits) < capacity:
            bits += 1
        self.cell_keys, self.cell_masks, self.capacity, self.shift = keys, masks, capacity, 64 - bits
        return 0

    cdef inline Py_ssize_t home(self, int64_t key) noexcept nogil:
        return <Py_ssize_t>((<uint64_t>key * <uint64_t>0x9E3779B97F4A7C15) >> self.shift)

    cdef inline Py_ssize_t find(self, int64_t key) noexcept nogil:
        """The cell holding ``key``, or the empty cell where it would go."""
        cdef Py_ssize_t last = self.capacity - 1
        cdef Py_ssize_t i = self.home(key)
        while self.cell_masks[i] != 0 and self.cell_keys[i] != key:
            i = (i + 1) & last
        return i

    cdef inline uint64_t lookup(self, int64_t key) noexcept nogil:
        return self.cell_masks[self.find(key)]

    cdef int prefetch_all(self, object seq) except -1:
        """Ask the CPU for the home cells of a sequence's hashes (``PySequence_Fast``) ahead of the loop over them:
        the probes' cache misses, one per hash in a table of hundreds of thousands, then overlap."""
        cdef Py_ssize_t i, cell
        cdef int64_t key
        for i in range(PySequence_Fast_GET_SIZE(seq)):
            if as_int64(<object>PySequence_Fast_ITEMS(seq)[i], &key):
                cell = self.home(key)
                prefetch(&self.cell_masks[cell])
                prefetch(&self.cell_keys[cell])
        return 0

    cdef int _resize(self, Py_ssize_t capacity) except -1:
        cdef int64_t* old_keys = self.cell_keys
        cdef uint64_t* old_masks = self.cell_masks
        cdef Py_ssize_t old_capacity = self.capacity
        cdef Py_ssize_t i, j
        self._alloc(capacity)
        for i in range(old_capacity):
            if old_masks[i] != 0:
                j = self.find(old_keys[i])
                self.cell_keys[j] = old_keys[i]
                self.cell_masks[j] = old_masks[i]
        PyMem_Free(old_keys)
        PyMem_Free(old_masks)
        return 0

    cdef int put(self, int64_t key, uint64_t mask) except -1:
        """Set ``key``'s mask (not 0)."""
        cdef Py_ssize_t i = self.find(key)
        if self.cell_masks[i] == 0:
            if 2 * (self.used + 1) > self.capacity:
                self._resize(2 * self.capacity)
                i = self.find(key)
            self.cell_keys[i] = key
            self.used += 1
        self.cell_masks[i] = mask
        return 0

    cdef int drop(self, int64_t key) except -1:
        """Delete ``key`` if present (backward shift: the entries after it that could sit earlier move up)."""
        cdef Py_ssize_t last = self.capacity - 1
        cdef Py_ssize_t i = self.find(key)
        cdef Py_ssize_t j, k
        if self.cell_masks[i] == 0:
            return 0
        j = i
        while True:
            j = (j + 1) & last
            if self.cell_masks[j] == 0:
                break
            k = self.home(self.cell_keys[j])
            # the entry at j stays when its home lies cyclically in (i, j]
            if (i < k <= j) if i <= j else (i < k or k <= j):
                continue
            self.cell_keys[i] = self.cell_keys[j]
            self.cell_masks[i] = self.cell_masks[j]
            i = j
        self.cell_masks[i] = 0
        self.cell_keys[i] = 0
        self.used -= 1
        if self.capacity > MIN_CAPACITY and 8 * self.used < self.capacity:
            self._resize(self.capacity // 2)
        return 0

    # -- dict methods (the Python paths of PrefixIndex, tests) --

    def get(self, h, default=None):
        cdef int64_t key
        cdef uint64_t mask
        if as_int64(h, &key):
            mask = self.lookup(key)
            return default if mask == 0 else PyLong_FromUnsignedLongLong(mask)
        return self.other.get(h, default)

    def __getitem__(self, h):
        found = self.get(h, None)
        if found is None:
            raise KeyError(h)
        return found

    def __setitem__(self, h, mask):
        cdef int64_t key
        cdef uint64_t m = mask  # OverflowError outside 0..2**64-1
        if m == 0:
            raise ValueError("a MaskTable mask is never 0 (delete the entry instead)")
        if as_int64(h, &key):
            self.put(key, m)
        else:
            self.other[h] = mask

    def __delitem__(self, h):
        if self.pop(h, None) is None:
            raise KeyError(h)

    def pop(self, h, default=None):
        cdef int64_t key
        cdef uint64_t mask
        if as_int64(h, &key):
            mask = self.lookup(key)
            if mask == 0:
                return default
            self.drop(key)
            return PyLong_FromUnsignedLongLong(mask)
        return self.other.pop(h, default)

    def __contains__(self, h):
        return self.get(h, None) is not None

    def __len__(self):
        return self.used + len(self.other)

    def items(self):
        cdef list out = []
        cdef Py_ssize_t i
        for i in range(self.capacity):
            if self.cell_masks[i] != 0:
                out.append((PyLong_FromLongLong(self.cell_keys[i]), PyLong_FromUnsignedLongLong(self.cell_masks[i])))
        out.extend(self.other.items())
        return out

    def keys(self):
        return [k for k, _ in self.items()]

    def __iter__(self):
        return iter(self.keys())

    def cells(self):
        """The table's size in cells (for tests of its growth and shrinking)."""
        return self.capacity


cdef inline uint64_t table_mask(MaskTable table, object h) except? 0xFFFFFFFFFFFFFFFF:
    cdef int64_t key
    cdef PyObject* found
    if as_int64(h, &key):
        return table.lookup(key)
    found = PyDict_GetItem(table.other, h)
    return mask_of(found)


cdef inline int table_set(MaskTable table, object h, uint64_t mask) except -1:
    """Set (mask not 0) or delete (mask 0) ``h``'s entry."""
    cdef int64_t key
    if as_int64(h, &key):
        if mask:
            table.put(key, mask)
        else:
            table.drop(key)
    elif mask:
        PyDict_SetItem(table.other, h, PyLong_FromUnsignedLongLong(mask))
    else:
        PyDict_DelItem(table.other, h)
    return 0


def overlap_walk(MaskTable held, dict predicted, list hashes, uint64_t current):
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
        mask = table_mask(held, h)
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


cdef int store_loop(MaskTable held, dict lru, object seq, uint64_t bit, object no_expiry) except -1:
    """Each hash of ``seq`` (a ``PySequence_Fast`` result) marked held for slot bit ``bit`` and moved to the end of
    the worker's LRU: ``store_precise`` and ``PreciseSink.stored``."""
    cdef Py_ssize_t i
    cdef uint64_t mask
    cdef object h
    for i in range(PySequence_Fast_GET_SIZE(seq)):
        if i >= PySequence_Fast_GET_SIZE(seq):  # the allocations below may run the GC: never trust an old pointer
            raise RuntimeError("hashes changed size while they were stored")
        h = <object>PySequence_Fast_ITEMS(seq)[i]
        mask = table_mask(held, h)
        if mask & bit:
            PyDict_DelItem(lru, h)
        else:
            table_set(held, h, mask | bit)
        PyDict_SetItem(lru, h, no_expiry)
    return 0


cdef int remove_loop(MaskTable held, dict lru, object seq, uint64_t bit) except -1:
    """Each hash of ``seq`` the worker's LRU has dropped from it and its bit cleared: ``remove`` and
    ``PreciseSink.removed``."""
    cdef Py_ssize_t i
    cdef object h
    cdef uint64_t keep = ~bit
    for i in range(PySequence_Fast_GET_SIZE(seq)):
        if i >= PySequence_Fast_GET_SIZE(seq):
            raise RuntimeError("hashes changed size while they were removed")
        h = <object>PySequence_Fast_ITEMS(seq)[i]
        if PyDict_GetItem(lru, h) == NULL:
            continue
        PyDict_DelItem(lru, h)
        table_set(held, h, table_mask(held, h) & keep)
    return 0


def store_precise(MaskTable held, dict lru, hashes, uint64_t bit, object no_expiry):
    """``PrefixIndex.stored``'s loop for a precise worker of slot bit ``bit``: each hash marked held and moved to the
    end of the worker's LRU."""
    cdef object seq = PySequence_Fast(hashes, "hashes must be a sequence")
    held.prefetch_all(seq)
    store_loop(held, lru, seq, bit, no_expiry)


def remove(MaskTable held, dict lru, hashes, uint64_t bit):
    """``PrefixIndex.removed``'s loop: each hash the worker's LRU has is dropped from it and its bit cleared."""
    cdef object seq = PySequence_Fast(hashes, "hashes must be a sequence")
    held.prefetch_all(seq)
    remove_loop(held, lru, seq, bit)


def touch_routed(MaskTable held, dict lru, hashes, uint64_t bit):
    """``PrefixIndex.record_routed``'s first loop for a precise worker of slot bit ``bit``: each hash the worker holds
    moves to the end of its LRU (value kept); returns the others, in order (the blocks to predict)."""
    cdef object seq = PySequence_Fast(hashes, "hashes must be a sequence")
    cdef Py_ssize_t i
    cdef object h
    cdef object value
    cdef PyObject* found
    cdef list fresh = []
    for i in range(PySequence_Fast_GET_SIZE(seq)):
        if i >= PySequence_Fast_GET_SIZE(seq):
            raise RuntimeError("hashes changed size while they were routed")
        h = <object>PySequence_Fast_ITEMS(seq)[i]
        if table_mask(held, h) & bit:
            found = PyDict_GetItem(lru, h)
            if found == NULL:
                raise KeyError(h)
            value = <object>found  # a strong reference: the deletion below must not free it
            PyDict_DelItem(lru, h)
            PyDict_SetItem(lru, h, value)
        else:
            fresh.append(h)
    return fresh


cdef class PreciseSink:
    """``PrefixIndex.stored`` / ``removed`` for one precise worker, callable without a Python frame (the compiled
    KV-event path, ``_kvwire``, calls it once per run of stores or removals instead of the index's Python methods).

    Made by ``PrefixIndex.precise_sink``, which holds on to it and clears ``valid`` whenever the worker's slot may
    have changed (a worker added, removed, cleared or re-sized, the index leaving the compiled core): the caller
    then asks for a new one. Either method returns False, having done nothing, when it does not apply (no longer
    valid; the worker is unknown or approximate, or the index is not on the compiled core, when it was made): the
    caller then calls the index's method, which does the same thing in Python. Otherwise it does exactly what that
    method does: stored blocks replace the worker's predictions of them first (its ``predicted`` entries and its bit
    in the index's ``all_predicted``), then the same LRU order and the same trim past capacity (``trim``: the index's
    own, a Python call once per ``capacity / 16`` stores or so)."""

    cdef public bint valid
    cdef MaskTable held  # None: no fast path for this worker
    cdef dict lru
    cdef dict predicted
    cdef dict all_predicted
    cdef uint64_t bit
    cdef Py_ssize_t capacity
    cdef object no_expiry
    cdef object trim

    def __init__(self, held=None, dict lru=None, dict predicted=None, dict all_predicted=None, uint64_t bit=0,
                 Py_ssize_t capacity=0, no_expiry=None, trim=None):
        self.valid = True
        self.held = held  # TypeError unless a MaskTable or None
        self.lru, self.predicted, self.all_predicted, self.bit = lru, predicted, all_predicted, bit
        self.capacity, self.no_expiry, self.trim = capacity, no_expiry, trim
        if held is not None and (lru is None or predicted is None or all_predicted is None or bit == 0 or trim is None):
            raise ValueError("a PreciseSink with a table needs the worker's LRU and predictions, the index's "
                             "predictions, its slot bit and trim")

    @property
    def fast(self):
        """Whether it applies events itself (a precise worker on the compiled core when it was made)."""
        return self.held is not None

    def stored(self, hashes):
        """``PrefixIndex.stored(worker, hashes)``, or False (nothing done) when it does not apply."""
        cdef object seq
        cdef MaskTable held = self.held
        cdef dict lru = self.lru
        if not self.valid or held is None:
            return False
        seq = PySequence_Fast(hashes, "hashes must be a sequence")
        held.prefetch_all(seq)
        if len(self.predicted):
            self._confirm(seq)
        store_loop(held, lru, seq, self.bit, self.no_expiry)
        if len(lru) > self.capacity:
            self.trim()
        return True

    cdef int _confirm(self, object seq) except -1:
        """``PrefixIndex._confirm_predictions``: each stored block's prediction dropped, and the worker's bit in the
        index's predictions of it."""
        cdef Py_ssize_t i
        cdef object h
        cdef PyObject* found
        cdef uint64_t mask
        cdef dict predicted = self.predicted
        cdef dict all_predicted = self.all_predicted
        for i in range(PySequence_Fast_GET_SIZE(seq)):
            if i >= PySequence_Fast_GET_SIZE(seq):
                raise RuntimeError("hashes changed size while they were stored")
            h = <object>PySequence_Fast_ITEMS(seq)[i]
            if PyDict_GetItem(predicted, h) == NULL:
                continue
            PyDict_DelItem(predicted, h)
            mask = mask_of(PyDict_GetItem(all_predicted, h)) & ~self.bit
            if mask:
                PyDict_SetItem(all_predicted, h, PyLong_FromUnsignedLongLong(mask))
            elif PyDict_GetItem(all_predicted, h) != NULL:
                PyDict_DelItem(all_predicted, h)
        return 0

    def removed(self, hashes):
        """``PrefixIndex.removed(worker, hashes)``, or False (nothing done) when it does not apply."""
        cdef object seq
        cdef MaskTable held = self.held
        if not self.valid or held is None:
            return False
        seq = PySequence_Fast(hashes, "hashes must be a sequence")
        held.prefetch_all(seq)
        remove_loop(held, self.lru, seq, self.bit)
        return True
