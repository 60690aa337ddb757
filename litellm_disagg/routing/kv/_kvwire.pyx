# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, infer_types=False
"""Compiled KV-event path: one vLLM ZMQ message, read from its msgpack bytes and applied to an ``EventApplier``.

``apply_message(applier, frames) -> bool`` is the compiled twin of
``applier.apply(engines.vllm.kv_events.decode_message(frames))`` for the message shape vLLM sends (an array-like
batch ``[ts, [event map, ...], rank]`` of map-encoded ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
events): it builds no Python object per token id or per event, computes the router's block hashes straight from the
``token_ids`` bytes (the same values as ``block_hash.chain_hashes``: the shared mix of ``_tuplehash.pxd``), and hands
the index one list per run of stores or removals, as ``EventApplier.apply`` does.

It returns False, having changed nothing, for anything it does not recognise or cannot read: the caller then runs
the Python decoder and applier on the same frames, which decode it, skip what they do not know, or reject it
(``MalformedBatch``). So what this path accepts, it applies exactly as the Python path would; the rest is the Python
path. Not recognised: another frame count or sequence frame size, array-like events (older vLLM), event types other
than the three, LoRA ids or names that are not int / str, ``extra_keys`` holding anything but nils, duplicate keys,
non-str map keys, trailing bytes, nesting deeper than ``MAX_DEPTH`` in skipped values, invalid UTF-8 anywhere in a
string it reads or skips.

The bytes come from the network: every read is bounds-checked against the payload's length (lengths larger than
what is left, truncation, wrong types all end in False), nothing is allocated from a length before that length was
checked against the bytes left, and nested values are skipped iteratively up to ``MAX_DEPTH`` levels.

Two passes: the first reads and checks the whole payload without side effects (recording where each event's fields
are, and hashing each full block of token ids as it checks them), the second applies it (sequence check,
translations, chaining the block hashes, index), so a payload rejected half-way changes nothing.

The index is reached through the worker's ``PrefixIndex.precise_sink`` (``_kvcore.PreciseSink``, kept on the
applier until the index marks it stale): no Python frame per message for a precise worker's stores and removals.

``Translations`` is the applier's engine-hash -> router-hash table when this module is built (``EventApplier`` makes
one; a dict without it): C cells the second pass reads and writes straight from the message's engine hashes. An
applier whose table is a plain dict (the pure-Python reference, in tests) is left to the Python path.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport (
    PyLong_AsLongLong, PyLong_AsUnsignedLongLong, PyLong_FromLongLong, PyLong_FromSsize_t, PyLong_FromUnsignedLongLong,
)
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcmp

from litellm_disagg.routing.kv._int64 cimport as_int64
from litellm_disagg.routing.kv._tuplehash cimport (
    Py_hash_t, Py_uhash_t, chain_step, finish, int_hash, mix, uint_hash, xxprime_5,
)

cdef extern from "Python.h":
    bint PyLong_Check(object o) noexcept
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1

import time as _time_module

_now = _time_module.time

MAX_DEPTH = 32
cdef int C_MAX_DEPTH = 32

cdef enum:
    STORED = 1
    REMOVED = 2
    CLEARED = 3

# Known event fields (bits of a seen-mask: a key met twice is not recognised).
cdef enum:
    F_TYPE = 1
    F_HASHES = 2
    F_PARENT = 4
    F_TOKENS = 8
    F_BLOCK_SIZE = 16
    F_LORA_ID = 32
    F_MEDIUM = 64
    F_LORA_NAME = 128
    F_EXTRA = 256
    F_GROUP = 512


cdef struct Reader:
    const unsigned char* p
    Py_ssize_t pos
    Py_ssize_t end


cdef struct Int:
    int64_t v
    bint big  # v holds a uint64 above INT64_MAX (as its bits)


cdef struct Event:
    int kind
    Py_ssize_t hashes_pos
    Py_ssize_t n_hashes
    bint has_parent
    Py_ssize_t parent_pos
    Py_ssize_t tokens_pos
    Py_ssize_t n_tokens
    Py_ssize_t inner_start  # this event's block tuple hashes: Batch.inner[inner_start:inner_start + n_tokens // size]
    Int block_size
    int medium  # 0: nil or absent, 1: "GPU", 2: another string (at medium_pos, medium_len)
    Py_ssize_t medium_pos
    Py_ssize_t medium_len
    int lora  # 0: none, 1: lora_name (at lora_pos, lora_len), 2: lora_id only
    Py_ssize_t lora_pos
    Py_ssize_t lora_len
    Int lora_id
    bint has_group
    Int group


cdef struct Batch:
    double ts
    Event* events
    Py_ssize_t n_events
    Py_ssize_t capacity
    Py_ssize_t size  # the worker's block size: token ids are hashed in blocks of it while they are checked
    Py_hash_t* inner  # hash(tuple(block)) of every full block of every event's token ids, in reading order
    Py_ssize_t n_inner
    Py_ssize_t inner_capacity


# -- reading msgpack, every read checked ------------------------------------------------------------------------------


cdef inline uint64_t be(const unsigned char* p, int n) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


cdef inline bint has(Reader* r, Py_ssize_t n) noexcept nogil:
    return n >= 0 and r.end - r.pos >= n


cdef int read_int(Reader* r, Int* out) noexcept nogil:
    """Any msgpack integer (not bool, not float). 0, or -1 when the next value is not one or is cut short."""
    cdef unsigned char b
    cdef int n
    cdef uint64_t u
    if not has(r, 1):
        return -1
    b = r.p[r.pos]
    out.big = False
    if b <= 0x7f:
        out.v = b
        r.pos += 1
        return 0
    if b >= 0xe0:
        out.v = <int64_t>(<signed char>b)
        r.pos += 1
        return 0
    if 0xcc <= b <= 0xcf:
        n = 1 << (b - 0xcc)
        if not has(r, 1 + n):
            return -1
        u = be(r.p + r.pos + 1, n)
        out.v = <int64_t>u
        out.big = u > <uint64_t>0x7FFFFFFFFFFFFFFF
        r.pos += 1 + n
        return 0
    if 0xd0 <= b <= 0xd3:
        n = 1 << (b - 0xd0)
        if not has(r, 1 + n):
            return -1
        u = be(r.p + r.pos + 1, n)
        if n == 1:
            out.v = <signed char>u
        elif n == 2:
            out.v = <short>u
        elif n == 4:
            out.v = <int>u
        else:
            out.v = <int64_t>u
        r.pos += 1 + n
        return 0
    return -1


cdef int read_len(Reader* r, unsigned char fix_lo, unsigned char fix_hi, unsigned char fix_mask,
                  unsigned char b8, unsigned char b16, unsigned char b32, Py_ssize_t* n) noexcept nogil:
    """A header: fix form (fix_lo..fix_hi, length in fix_mask bits) or 8/16/32-bit length (b8 0: no 8-bit form)."""
    cdef unsigned char b
    cdef int width
    if not has(r, 1):
        return -1
    b = r.p[r.pos]
    if fix_lo <= b <= fix_hi:
        n[0] = b & fix_mask
        r.pos += 1
        return 0
    if b8 != 0 and b == b8:
        width = 1
    elif b == b16:
        width = 2
    elif b == b32:
        width = 4
    else:
        return -1
    if not has(r, 1 + width):
        return -1
    n[0] = <Py_ssize_t>be(r.p + r.pos + 1, width)
    r.pos += 1 + width
    return 0


cdef int read_array(Reader* r, Py_ssize_t* n) noexcept nogil:
    """An array header; its length is checked against the bytes left (every item takes at least one byte)."""
    if read_len(r, 0x90, 0x9f, 0x0f, 0, 0xdc, 0xdd, n) < 0 or not has(r, n[0]):
        return -1
    return 0


cdef int read_map(Reader* r, Py_ssize_t* n) noexcept nogil:
    if read_len(r, 0x80, 0x8f, 0x0f, 0, 0xde, 0xdf, n) < 0 or n[0] > (r.end - r.pos) // 2:
        return -1
    return 0


cdef int read_str(Reader* r, Py_ssize_t* start, Py_ssize_t* n) noexcept nogil:
    """A str's bytes (not checked as UTF-8 here: ``utf8_ok``)."""
    if read_len(r, 0xa0, 0xbf, 0x1f, 0xd9, 0xda, 0xdb, n) < 0 or not has(r, n[0]):
        return -1
    start[0] = r.pos
    r.pos += n[0]
    return 0


cdef int read_bin(Reader* r, Py_ssize_t* start, Py_ssize_t* n) noexcept nogil:
    """A bin's bytes (bin 8/16/32; no fix form: the empty range 1..0)."""
    if read_len(r, 1, 0, 0, 0xc4, 0xc5, 0xc6, n) < 0 or not has(r, n[0]):
        return -1
    start[0] = r.pos
    r.pos += n[0]
    return 0


cdef inline bint at_nil(Reader* r) noexcept nogil:
    return has(r, 1) and r.p[r.pos] == 0xc0


cdef int read_float(Reader* r, double* out) noexcept nogil:
    """A float32, a float64 or an integer (msgspec reads an integer into a float field)."""
    cdef unsigned char b
    cdef uint64_t u
    cdef unsigned int u32
    cdef Int i
    if not has(r, 1):
        return -1
    b = r.p[r.pos]
    if b == 0xcb:
        if not has(r, 9):
            return -1
        u = be(r.p + r.pos + 1, 8)
        out[0] = (<double*>&u)[0]
        r.pos += 9
        return 0
    if b == 0xca:
        if not has(r, 5):
            return -1
        u32 = <unsigned int>be(r.p + r.pos + 1, 4)
        out[0] = <double>(<float*>&u32)[0]
        r.pos += 5
        return 0
    if read_int(r, &i) < 0:
        return -1
    out[0] = <double>(<uint64_t>i.v) if i.big else <double>i.v
    return 0


cdef bint utf8_ok(const unsigned char* p, Py_ssize_t n):
    try:
        PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return False
    return True


cdef int skip(Reader* r):
    """Skip one value of any type, nested up to C_MAX_DEPTH levels (iteratively: a count of values still to skip
    per level). Strings must be valid UTF-8, as the Python decoder's generic path requires."""
    cdef Py_ssize_t pending[33]
    cdef int depth = 0
    cdef unsigned char b
    cdef Py_ssize_t n, start
    cdef int width
    cdef Int i
    cdef double d
    pending[0] = 1
    while True:
        while depth >= 0 and pending[depth] == 0:
            depth -= 1
        if depth < 0:
            return 0
        pending[depth] -= 1
        if not has(r, 1):
            return -1
        b = r.p[r.pos]
        if b <= 0x7f or b >= 0xe0 or 0xcc <= b <= 0xd3:
            if read_int(r, &i) < 0:
                return -1
        elif b == 0xc0 or b == 0xc2 or b == 0xc3:
            r.pos += 1
        elif b == 0xca or b == 0xcb:
            if read_float(r, &d) < 0:
                return -1
        elif 0xa0 <= b <= 0xbf or 0xd9 <= b <= 0xdb:
            if read_str(r, &start, &n) < 0 or not utf8_ok(r.p + start, n):
                return -1
        elif 0xc4 <= b <= 0xc6:
            if read_bin(r, &start, &n) < 0:
                return -1
        elif 0x90 <= b <= 0x9f or b == 0xdc or b == 0xdd or 0x80 <= b <= 0x8f or b == 0xde or b == 0xdf:
            if 0x80 <= b <= 0x8f or b >= 0xde:
                if read_map(r, &n) < 0:
                    return -1
                n *= 2
            elif read_array(r, &n) < 0:
                return -1
            if n:
                if depth + 1 > C_MAX_DEPTH:
                    return -1
                depth += 1
                pending[depth] = n
        elif 0xd4 <= b <= 0xd8:  # fixext 1, 2, 4, 8, 16: type byte + data
            n = 1 << (b - 0xd4)
            if not has(r, 2 + n):
                return -1
            r.pos += 2 + n
        elif 0xc7 <= b <= 0xc9:  # ext 8, 16, 32: length, type byte, data
            width = 1 << (b - 0xc7)
            if not has(r, 1 + width):
                return -1
            n = <Py_ssize_t>be(r.p + r.pos + 1, width)
            r.pos += 1 + width
            if not has(r, 1 + n):
                return -1
            r.pos += 1 + n
        else:  # 0xc1: never used
            return -1


cdef inline bint key_is(Reader* r, Py_ssize_t start, Py_ssize_t n, const char* name, Py_ssize_t name_len) noexcept nogil:
    return n == name_len and memcmp(r.p + start, name, n) == 0


cdef int event_kind(Reader* r, Py_ssize_t start, Py_ssize_t n) noexcept nogil:
    if key_is(r, start, n, b"BlockStored", 11):
        return STORED
    if key_is(r, start, n, b"BlockRemoved", 12):
        return REMOVED
    if key_is(r, start, n, b"AllBlocksCleared", 16):
        return CLEARED
    return -1


cdef int find_kind(Reader r, Py_ssize_t entries):
    """The event's ``type`` (read on a copy of the reader): first key as vLLM writes it, else anywhere."""
    cdef Py_ssize_t i, start, n
    for i in range(entries):
        if read_str(&r, &start, &n) < 0:
            return -1
        if key_is(&r, start, n, b"type", 4):
            if read_str(&r, &start, &n) < 0:
                return -1
            return event_kind(&r, start, n)
        if skip(&r) < 0:
            return -1
    return -1


cdef int read_hashes(Reader* r, Py_ssize_t* pos, Py_ssize_t* count):
    """An array of engine block hashes, each an integer or bin."""
    cdef Py_ssize_t n, i, start, length
    cdef Int v
    if read_array(r, &n) < 0:
        return -1
    pos[0] = r.pos
    count[0] = n
    for i in range(n):
        if has(r, 1) and 0xc4 <= r.p[r.pos] <= 0xc6:
            if read_bin(r, &start, &length) < 0:
                return -1
        elif read_int(r, &v) < 0:
            return -1
    return 0


cdef int read_opt_int(Reader* r, bint* present, Int* out) noexcept nogil:
    if at_nil(r):
        r.pos += 1
        present[0] = False
        return 0
    present[0] = True
    return read_int(r, out)


cdef inline int read_token(Reader* r, Int* out) noexcept nogil:
    """``read_int``, with the forms token ids take inline (positive fixint, uint 8 / 16)."""
    cdef unsigned char b
    if r.pos < r.end:
        b = r.p[r.pos]
        if b <= 0x7f:
            out.v = b
            out.big = False
            r.pos += 1
            return 0
        if b == 0xcd and r.end - r.pos >= 3:
            out.v = (<int64_t>r.p[r.pos + 1] << 8) | r.p[r.pos + 2]
            out.big = False
            r.pos += 3
            return 0
    return read_int(r, out)


cdef int read_tokens(Reader* r, Event* e, Batch* batch):
    """The ``token_ids`` array's items (its header read: ``e.n_tokens``), each checked to be an integer; the hash of
    each full block of ``batch.size`` of them (``hash(tuple(block))``) appended to ``batch.inner`` on the way, so the
    second pass chains them without reading the tokens again. Trailing tokens of a partial block are only checked
    (such an event is skipped when applied)."""
    cdef Py_ssize_t blocks = e.n_tokens // batch.size
    cdef Py_ssize_t b, i
    cdef Py_uhash_t inner
    cdef Int token
    cdef Py_hash_t* grown
    cdef Py_ssize_t want
    if batch.n_inner + blocks > batch.inner_capacity:
        # blocks <= n_tokens, already checked against the bytes left (one byte per item at least)
        want = 2 * batch.inner_capacity + blocks + 16
        grown = <Py_hash_t*>PyMem_Realloc(batch.inner, want * sizeof(Py_hash_t))
        if grown == NULL:
            return -1
        batch.inner = grown
        batch.inner_capacity = want
    e.inner_start = batch.n_inner
    for b in range(blocks):
        inner = xxprime_5()
        for i in range(batch.size):
            if read_token(r, &token) < 0:
                return -1
            inner = mix(inner, <Py_uhash_t>(uint_hash(<uint64_t>token.v) if token.big else int_hash(token.v)))
        batch.inner[batch.n_inner + b] = finish(inner, batch.size)
    batch.n_inner += blocks
    for i in range(e.n_tokens - blocks * batch.size):
        if read_token(r, &token) < 0:
            return -1
    return 0


cdef int read_event(Reader* r, Event* e, Batch* batch):
    cdef Py_ssize_t entries, k, start, n, i
    cdef int seen = 0
    cdef int bit
    cdef Int v
    cdef bint present
    if read_map(r, &entries) < 0:
        return -1
    e.kind = find_kind(r[0], entries)
    if e.kind < 0:
        return -1
    e.has_parent = False
    e.medium = 0
    e.lora = 0
    e.has_group = False
    e.n_hashes = 0
    e.n_tokens = 0
    for k in range(entries):
        if read_str(r, &start, &n) < 0:
            return -1
        bit = 0
        if key_is(r, start, n, b"type", 4):
            bit = F_TYPE
        elif key_is(r, start, n, b"block_hashes", 12):
            bit = F_HASHES
        elif key_is(r, start, n, b"medium", 6):
            bit = F_MEDIUM
        elif key_is(r, start, n, b"group_idx", 9):
            bit = F_GROUP
        elif e.kind == STORED:
            if key_is(r, start, n, b"parent_block_hash", 17):
                bit = F_PARENT
            elif key_is(r, start, n, b"token_ids", 9):
                bit = F_TOKENS
            elif key_is(r, start, n, b"block_size", 10):
                bit = F_BLOCK_SIZE
            elif key_is(r, start, n, b"lora_id", 7):
                bit = F_LORA_ID
            elif key_is(r, start, n, b"lora_name", 9):
                bit = F_LORA_NAME
            elif key_is(r, start, n, b"extra_keys", 10):
                bit = F_EXTRA
        if bit == F_TYPE or (bit != 0 and e.kind == CLEARED):
            # the tag (read by find_kind), or a field a cleared event does not have (msgspec skips those)
            if bit == F_TYPE and seen & F_TYPE:
                return -1
            seen |= F_TYPE if bit == F_TYPE else 0
            if skip(r) < 0:
                return -1
            continue
        if bit == 0:  # a field this event type does not have (msgspec ignores unknown fields)
            if not utf8_ok(r.p + start, n) or skip(r) < 0:
                return -1
            continue
        if seen & bit:
            return -1
        seen |= bit
        if bit == F_HASHES:
            if read_hashes(r, &e.hashes_pos, &e.n_hashes) < 0:
                return -1
        elif bit == F_MEDIUM:
            if at_nil(r):
                r.pos += 1
            else:
                if read_str(r, &e.medium_pos, &e.medium_len) < 0:
                    return -1
                if key_is(r, e.medium_pos, e.medium_len, b"GPU", 3):
                    e.medium = 1
                elif utf8_ok(r.p + e.medium_pos, e.medium_len):
                    e.medium = 2
                else:
                    return -1
        elif bit == F_GROUP:
            if read_opt_int(r, &e.has_group, &e.group) < 0:
                return -1
        elif bit == F_PARENT:
            if at_nil(r):
                r.pos += 1
            else:
                e.has_parent = True
                e.parent_pos = r.pos
                if has(r, 1) and 0xc4 <= r.p[r.pos] <= 0xc6:
                    if read_bin(r, &start, &n) < 0:
                        return -1
                elif read_int(r, &v) < 0:
                    return -1
        elif bit == F_TOKENS:
            if read_array(r, &e.n_tokens) < 0:
                return -1
            e.tokens_pos = r.pos
            if read_tokens(r, e, batch) < 0:
                return -1
        elif bit == F_BLOCK_SIZE:
            if read_int(r, &e.block_size) < 0:
                return -1
        elif bit == F_LORA_ID:
            if read_opt_int(r, &present, &e.lora_id) < 0:
                return -1
            if present and e.lora == 0:
                e.lora = 2
        elif bit == F_LORA_NAME:
            if at_nil(r):
                r.pos += 1
            else:
                if read_str(r, &e.lora_pos, &e.lora_len) < 0 or not utf8_ok(r.p + e.lora_pos, e.lora_len):
                    return -1
                e.lora = 1
        elif bit == F_EXTRA:  # nil, or one nil per block: nothing else hashed (anything else: the Python path)
            if at_nil(r):
                r.pos += 1
            else:
                if read_array(r, &n) < 0:
                    return -1
                for i in range(n):
                    if not at_nil(r):
                        return -1
                    r.pos += 1
    if e.kind == STORED and (seen & (F_HASHES | F_TOKENS | F_BLOCK_SIZE)) != (F_HASHES | F_TOKENS | F_BLOCK_SIZE):
        return -1
    if e.kind == REMOVED and not (seen & F_HASHES):
        return -1
    return 0


cdef int read_batch(Reader* r, Batch* batch):
    cdef Py_ssize_t items, n, i
    cdef Event* grown
    cdef Int rank
    cdef bint present
    if read_array(r, &items) < 0 or not (2 <= items <= 3):
        return -1
    if read_float(r, &batch.ts) < 0:
        return -1
    if read_array(r, &n) < 0:
        return -1
    for i in range(n):
        if batch.n_events == batch.capacity:
            grown = <Event*>PyMem_Realloc(batch.events, (2 * batch.capacity + 4) * sizeof(Event))
            if grown == NULL:
                return -1
            batch.events = grown
            batch.capacity = 2 * batch.capacity + 4
        if read_event(r, &batch.events[batch.n_events], batch) < 0:
            return -1
        batch.n_events += 1
    if items == 3 and read_opt_int(r, &present, &rank) < 0:
        return -1
    if r.pos != r.end:
        return -1
    return 0


# -- applying ---------------------------------------------------------------------------------------------------------


cdef object int_object(Int v):
    if v.big:
        return PyLong_FromUnsignedLongLong(<uint64_t>v.v)
    return PyLong_FromLongLong(v.v)


cdef object hash_object(Reader* r):
    """The engine hash at the reader (an integer or bin, already checked) as the Python decoder gives it."""
    cdef Py_ssize_t start, n
    cdef Int v
    if has(r, 1) and 0xc4 <= r.p[r.pos] <= 0xc6:
        if read_bin(r, &start, &n) < 0:
            raise AssertionError("engine hash changed between the passes")
        return PyBytes_FromStringAndSize(<const char*>(r.p + start), n)
    if read_int(r, &v) < 0:
        raise AssertionError("engine hash changed between the passes")
    return int_object(v)


cdef bint wanted(Event* e, Reader* r, object media, object kv_group) except -1:
    """``EventApplier``'s test: the event's medium among ``media`` and its group nil or ``kv_group``."""
    cdef object medium
    if e.medium == 0:
        medium = None
    elif e.medium == 1:
        medium = "GPU"
    else:
        medium = PyUnicode_DecodeUTF8(<const char*>(r.p + e.medium_pos), e.medium_len, NULL)
    if medium not in media:
        return False
    if e.has_group and int_object(e.group) != kv_group:
        return False
    return True


# -- the engine-to-router hash table ---------------------------------------------------------------------------------


cdef struct Cell:
    uint64_t key
    int64_t value
    bint full


cdef enum:
    MIN_CELLS = 64  # table sizes are powers of two, never below this


cdef inline bint as_ukey(object e, uint64_t* key) except -1:
    """``e`` as a C key: True for an int in 0..2**64-1 (vLLM's engine block hashes), else False."""
    cdef int overflow = 0
    cdef long long v
    if not PyLong_Check(e):
        return False
    v = PyLong_AsLongLongAndOverflow(e, &overflow)
    if overflow == 0:
        if v < 0:
            return False
        key[0] = <uint64_t>v
        return True
    if overflow < 0:
        return False
    try:
        key[0] = PyLong_AsUnsignedLongLong(e)
    except OverflowError:
        return False
    return True


cdef class Translations:
    """An ``EventApplier``'s engine-hash -> router-hash table (``{engine hash: our hash}``) as C integers: open
    addressing with linear probing over cells of a uint64 key and an int64 value, deletion by backward shift, at most
    half full, halved when under an eighth full (as ``_kvcore.MaskTable``). Entries whose key is not an int in
    0..2**64-1 (bytes hashes, negative ints) or whose value is not an int64 live in ``other``, a dict, with the same
    answers. ``apply_message`` reads and writes the cells straight from the message's bytes: no Python int per engine
    hash, no dict probe.

    The dict methods ``EventApplier`` uses, with dict semantics (the pure-Python applier uses a dict, the reference
    the tests compare it with): ``get``, ``[]`` (read, write, ``del``), ``pop``, ``in``, ``len``, ``update`` (pairs),
    ``clear``, ``items`` (a list: C cells in table order, then ``other``), ``keys``, iteration over keys."""

    cdef Cell* cells
    cdef Py_ssize_t capacity  # a power of two
    cdef Py_ssize_t used  # C cells in use
    cdef int shift  # 64 - log2(capacity)
    cdef dict other

    def __cinit__(self):
        self.cells = NULL
        self.used = 0
        self.other = {}
        self._alloc(MIN_CELLS)

    def __dealloc__(self):
        PyMem_Free(self.cells)

    cdef int _alloc(self, Py_ssize_t capacity) except -1:
        cdef Cell* cells = <Cell*>PyMem_Calloc(capacity, sizeof(Cell))
        cdef int bits = 0
        if cells == NULL:
            raise MemoryError()
        while (<Py_ssize_t>1 << bits) < capacity:
            bits += 1
        self.cells, self.capacity, self.shift = cells, capacity, 64 - bits
        return 0

    cdef inline Py_ssize_t home(self, uint64_t key) noexcept nogil:
        return <Py_ssize_t>((key * <uint64_t>0x9E3779B97F4A7C15) >> self.shift)

    cdef inline Py_ssize_t find(self, uint64_t key) noexcept nogil:
        """The cell holding ``key``, or the empty cell where it would go."""
        cdef Py_ssize_t last = self.capacity - 1
        cdef Py_ssize_t i = self.home(key)
        while self.cells[i].full and self.cells[i].key != key:
            i = (i + 1) & last
        return i

    cdef int _resize(self, Py_ssize_t capacity) except -1:
        cdef Cell* old = self.cells
        cdef Py_ssize_t old_capacity = self.capacity
        cdef Py_ssize_t i, j
        self._alloc(capacity)
        for i in range(old_capacity):
            if old[i].full:
                j = self.find(old[i].key)
                self.cells[j] = old[i]
        PyMem_Free(old)
        return 0

    cdef int put(self, uint64_t key, int64_t value) except -1:
        cdef Py_ssize_t i = self.find(key)
        if not self.cells[i].full:
            if 2 * (self.used + 1) > self.capacity:
                self._resize(2 * self.capacity)
                i = self.find(key)
            self.cells[i].key = key
            self.cells[i].full = True
            self.used += 1
        self.cells[i].value = value
        return 0

    cdef inline bint lookup(self, uint64_t key, int64_t* value) noexcept nogil:
        cdef Py_ssize_t i = self.find(key)
        if not self.cells[i].full:
            return False
        value[0] = self.cells[i].value
        return True

    cdef bint take(self, uint64_t key, int64_t* value) except -1:
        """Delete ``key`` (True, its value in ``value``) or False when absent (backward shift, as ``MaskTable.drop``)."""
        cdef Py_ssize_t last = self.capacity - 1
        cdef Py_ssize_t i = self.find(key)
        cdef Py_ssize_t j, k
        if not self.cells[i].full:
            return False
        value[0] = self.cells[i].value
        j = i
        while True:
            j = (j + 1) & last
            if not self.cells[j].full:
                break
            k = self.home(self.cells[j].key)
            if (i < k <= j) if i <= j else (i < k or k <= j):
                continue
            self.cells[i] = self.cells[j]
            i = j
        self.cells[i].full = False
        self.cells[i].key = 0
        self.cells[i].value = 0
        self.used -= 1
        if self.capacity > MIN_CELLS and 8 * self.used < self.capacity:
            self._resize(self.capacity // 2)
        return True

    # -- object-level operations (one per dict method, and the message path's odd keys) --

    cdef bint get_object(self, object e, int64_t* value) except -1:
        cdef uint64_t key
        cdef object found
        if as_ukey(e, &key) and self.lookup(key, value):
            return True
        if not self.other:
            return False
        found = self.other.get(e)
        if found is None:
            return False
        value[0] = PyLong_AsLongLong(found)
        return True

    cdef int set_object(self, object e, object h) except -1:
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and as_int64(h, &value):
            self.put(key, value)
            if self.other:
                self.other.pop(e, None)
        else:
            if as_ukey(e, &key):
                self.take(key, &value)
            self.other[e] = h
        return 0

    cdef object pop_object(self, object e):
        """The value (a Python int, or ``other``'s object), or None when absent."""
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and self.take(key, &value):
            return PyLong_FromLongLong(value)
        if not self.other:
            return None
        return self.other.pop(e, None)

    # -- the message path: the engine hash at the reader (an integer or a bin, checked by the first pass) --

    cdef bint get_at(self, Reader* r, int64_t* value) except -1:
        cdef Int v
        if has(r, 1) and 0xc4 <= r.p[r.pos] <= 0xc6:
            return self.get_object(hash_object(r), value)
        if read_int(r, &v) < 0:
            raise AssertionError("engine hash changed between the passes")
        if (v.big or v.v >= 0) and self.lookup(<uint64_t>v.v, value):
            return True
        if not self.other:
            return False
        return self.get_object(int_object(v), value)

    cdef int set_at(self, Reader* r, int64_t value) except -1:
        cdef Int v
        if has(r, 1) and 0xc4 <= r.p[r.pos] <= 0xc6:
            return self.set_object(hash_object(r), PyLong_FromLongLong(value))
        if read_int(r, &v) < 0:
            raise AssertionError("engine hash changed between the passes")
        if (v.big or v.v >= 0) and not self.other:
            return self.put(<uint64_t>v.v, value)
        return self.set_object(int_object(v), PyLong_FromLongLong(value))

    cdef bint take_at(self, Reader* r, int64_t* value) except -1:
        cdef Int v
        cdef object found
        if has(r, 1) and 0xc4 <= r.p[r.pos] <= 0xc6:
            found = self.pop_object(hash_object(r))
        else:
            if read_int(r, &v) < 0:
                raise AssertionError("engine hash changed between the passes")
            if (v.big or v.v >= 0) and self.take(<uint64_t>v.v, value):
                return True
            if not self.other:
                return False
            found = self.pop_object(int_object(v))
        if found is None:
            return False
        value[0] = PyLong_AsLongLong(found)
        return True

    # -- dict methods (the Python path of EventApplier, tests) --

    def get(self, e, default=None):
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and self.lookup(key, &value):
            return PyLong_FromLongLong(value)
        return self.other.get(e, default)

    def __getitem__(self, e):
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and self.lookup(key, &value):
            return PyLong_FromLongLong(value)
        return self.other[e]

    def __setitem__(self, e, h):
        self.set_object(e, h)

    def __delitem__(self, e):
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and self.take(key, &value):
            return
        del self.other[e]

    def pop(self, e, default=None):
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and self.take(key, &value):
            return PyLong_FromLongLong(value)
        return self.other.pop(e, default)

    def __contains__(self, e):
        cdef uint64_t key
        cdef int64_t value
        if as_ukey(e, &key) and self.lookup(key, &value):
            return True
        return e in self.other

    def __len__(self):
        return self.used + len(self.other)

    def update(self, pairs):
        for e, h in pairs:
            self.set_object(e, h)

    def clear(self):
        cdef Cell* cells = <Cell*>PyMem_Calloc(MIN_CELLS, sizeof(Cell))
        if cells == NULL:
            raise MemoryError()
        PyMem_Free(self.cells)
        self.cells, self.capacity, self.shift, self.used = cells, MIN_CELLS, 58, 0
        self.other.clear()

    def items(self):
        cdef list out = []
        cdef Py_ssize_t i
        for i in range(self.capacity):
            if self.cells[i].full:
                out.append((PyLong_FromUnsignedLongLong(self.cells[i].key), PyLong_FromLongLong(self.cells[i].value)))
        out.extend(self.other.items())
        return out

    def keys(self):
        return [k for k, _ in self.items()]

    def __iter__(self):
        return iter(self.keys())

    def __eq__(self, other):
        """Equal to a dict or a table with the same entries, as dicts compare."""
        if isinstance(other, (Translations, dict)):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def cells_allocated(self):
        """The table's size in cells (for tests of its growth and shrinking)."""
        return self.capacity


cdef list stored_hashes(Event* e, Reader* r, Batch* batch, Translations ours, object applier, Py_ssize_t size,
                        Py_ssize_t* skipped):
    """``EventApplier._stored`` after its medium and group test: our hashes of the event's blocks (translations
    updated), or None when they cannot be rebuilt (counted in ``skipped``)."""
    cdef Py_ssize_t count = e.n_hashes
    cdef Py_ssize_t b
    cdef object lora
    cdef Py_hash_t h
    cdef int64_t found
    cdef Reader hashes_reader
    cdef list out
    cdef object ours_h
    if e.block_size.big or e.block_size.v != size or e.n_tokens % size != 0 or e.n_tokens // size != count:
        skipped[0] += count
        return None
    if not e.has_parent:
        if e.lora == 1:
            lora = PyUnicode_DecodeUTF8(<const char*>(r.p + e.lora_pos), e.lora_len, NULL)
        elif e.lora == 2:
            lora = str(int_object(e.lora_id))
        else:
            lora = None
        h = PyLong_AsLongLong(applier._chain_root(lora))
    else:
        r.pos = e.parent_pos
        if not ours.get_at(r, &found):
            skipped[0] += count
            return None
        h = found
    out = PyList_New(count)
    hashes_reader = r[0]
    hashes_reader.pos = e.hashes_pos
    for b in range(count):
        h = chain_step(h, batch.inner[e.inner_start + b])
        ours_h = PyLong_FromSsize_t(h)
        Py_INCREF(ours_h)
        PyList_SET_ITEM(out, b, ours_h)
        ours.set_at(&hashes_reader, h)
    return out


cdef list removed_hashes(Event* e, Reader* r, Translations ours):
    """``EventApplier._removed`` after its medium and group test: our hashes of the blocks we knew (dropped from the
    translations)."""
    cdef list out = []
    cdef Py_ssize_t i
    cdef int64_t h
    r.pos = e.hashes_pos
    for i in range(e.n_hashes):
        if ours.take_at(r, &h):
            out.append(PyLong_FromLongLong(h))
    return out


def apply_message(applier, frames):
    """``applier.apply(decode_message(frames))`` for a message this module recognises (returns True); False, having
    done nothing, for any other message (the caller runs the Python path on it)."""
    cdef object payload, seq_frame
    if len(frames) != 3:
        return False
    seq_frame = frames[1]
    payload = frames[2]
    if not PyBytes_CheckExact(seq_frame) or PyBytes_GET_SIZE(seq_frame) != 8 or not PyBytes_CheckExact(payload):
        return False
    return apply_bytes(
        applier,
        <const unsigned char*>PyBytes_AS_STRING(seq_frame),
        <const unsigned char*>PyBytes_AS_STRING(payload),
        PyBytes_GET_SIZE(payload),
    )


cdef bint apply_bytes(object applier, const unsigned char* seq_bytes, const unsigned char* p, Py_ssize_t n) except -1:
    """One message's sequence frame (8 bytes) and payload: applied (True) or not recognised (False, nothing done).
    The bytes must stay valid and unchanged during the call."""
    cdef Batch batch
    cdef Reader r
    cdef Py_ssize_t size = applier.block_size
    if size < 1:
        return False
    r.p = p
    r.pos = 0
    r.end = n
    if type(applier._ours) is not Translations:  # a plain dict (the pure-Python reference): the Python path
        return False
    batch.events = NULL
    batch.n_events = 0
    batch.capacity = 0
    batch.size = size
    batch.inner = NULL
    batch.n_inner = 0
    batch.inner_capacity = 0
    try:
        if read_batch(&r, &batch) < 0:
            return False
        _apply(applier, &batch, &r, <int64_t>be(seq_bytes, 8), size)
        return True
    finally:
        PyMem_Free(batch.events)
        PyMem_Free(batch.inner)


cdef _apply(object applier, Batch* batch, Reader* r, int64_t seq_c, Py_ssize_t size):
    """``EventApplier.apply``, over the events ``read_batch`` recorded."""
    cdef object seq = PyLong_FromLongLong(seq_c)
    cdef object stats = applier.stats
    cdef object last = stats.last_seq
    cdef Py_ssize_t i
    cdef Event* e
    cdef list ours
    cdef list run = None
    cdef bint run_stores = False
    cdef bint stores
    cdef Py_ssize_t stored_blocks = 0, removed_blocks = 0, ignored = 0, skipped = 0
    cdef Translations translations
    cdef object index = applier.index
    cdef object worker_id = applier.worker_id
    cdef object media = applier.media
    cdef object kv_group = applier.kv_group
    if last is not None and seq == last + 1:
        stats.last_seq = seq
    elif not applier._in_sequence(seq):
        return
    stats.batches += 1
    stats.last_batch_ts, stats.last_applied_at = batch.ts, _now()
    translations = applier._ours
    try:
        for i in range(batch.n_events):
            e = &batch.events[i]
            if e.kind == CLEARED:
                if run is not None:
                    _flush(applier, index, worker_id, run, run_stores)
                    run = None
                applier._cleared()
                translations = applier._ours
                continue
            if not wanted(e, r, media, kv_group):
                ignored += 1
                continue
            if e.kind == STORED:
                ours = stored_hashes(e, r, batch, translations, applier, size, &skipped)
                if ours is not None:
                    stored_blocks += len(ours)
                stores = True
            else:
                ours = removed_hashes(e, r, translations)
                removed_blocks += len(ours)
                stores = False
            if not ours:
                continue
            if run is None:
                run, run_stores = ours, stores
            elif stores == run_stores:
                run.extend(ours)
            else:
                _flush(applier, index, worker_id, run, run_stores)
                translations = applier._ours
                run, run_stores = ours, stores
        if run is not None:
            _flush(applier, index, worker_id, run, run_stores)
    finally:
        if stored_blocks:
            stats.stored_blocks += stored_blocks
        if removed_blocks:
            stats.removed_blocks += removed_blocks
        if ignored:
            stats.ignored_events += ignored
        if skipped:
            stats.skipped_blocks += skipped


cdef _flush(object applier, object index, object worker_id, list run, bint stored):
    """``EventApplier._flush``: the index's ``stored`` / ``removed`` through the worker's ``PreciseSink`` (no Python
    frame per message), which the applier keeps until the index marks it stale; the index's own methods when the sink
    does not apply (or without one: an index without the compiled core)."""
    cdef object sink = applier._sink
    if sink is None or not sink.valid:
        sink = index.precise_sink(worker_id)
        applier._sink = sink
    if stored:
        if sink is None or not sink.stored(run):
            index.stored(worker_id, run)
        if len(applier._ours) > applier._max_translations:
            applier._prune_translations()
    elif sink is None or not sink.removed(run):
        index.removed(worker_id, run)


# -- receiving straight from the ZMQ socket ---------------------------------------------------------------------------
#
# pyzmq's recv_multipart costs several microseconds per message in Python (a getsockopt per frame); a burst is drained
# here with libzmq's own functions instead, on the socket pyzmq opened (``Socket.underlying``), and each message's
# payload is read where libzmq holds it. The functions are looked up in the libzmq that pyzmq's extension already
# loaded (dlopen with RTLD_NOLOAD: the same library, never a second copy); without them the caller drains in Python.

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flag)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_NOLOAD

cdef struct zmq_msg_t:
    uint64_t _opaque[8]  # 64 bytes, 8-aligned: libzmq 4.1+

ctypedef int (*msg_init_t)(zmq_msg_t*) noexcept nogil
ctypedef int (*msg_recv_t)(zmq_msg_t*, void*, int) noexcept nogil
ctypedef void* (*msg_data_t)(zmq_msg_t*) noexcept nogil
ctypedef size_t (*msg_size_t)(const zmq_msg_t*) noexcept nogil
ctypedef int (*msg_more_t)(const zmq_msg_t*) noexcept nogil
ctypedef int (*msg_close_t)(zmq_msg_t*) noexcept nogil
ctypedef int (*errno_t)() noexcept nogil
ctypedef void (*version_t)(int*, int*, int*) noexcept nogil

cdef msg_init_t zmq_msg_init = NULL
cdef msg_recv_t zmq_msg_recv = NULL
cdef msg_data_t zmq_msg_data = NULL
cdef msg_size_t zmq_msg_size = NULL
cdef msg_more_t zmq_msg_more = NULL
cdef msg_close_t zmq_msg_close = NULL
cdef errno_t zmq_errno = NULL

cdef int ZMQ_DONTWAIT = 1
cdef int EAGAIN_ = 11
cdef int EINTR_ = 4
cdef int MAX_FRAMES = 3


def bind_libzmq(str extension_path):
    """Find libzmq's functions through pyzmq's compiled backend (``zmq.backend.cython._zmq.__file__``), which must
    already be loaded. True when ``drain`` can be used."""
    global zmq_msg_init, zmq_msg_recv, zmq_msg_data, zmq_msg_size, zmq_msg_more, zmq_msg_close, zmq_errno
    cdef bytes path = extension_path.encode()
    cdef void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD)
    cdef int major = 0, minor = 0, patch = 0
    if handle == NULL:
        return False
    cdef version_t version = <version_t>dlsym(handle, b"zmq_version")
    if version == NULL:
        return False
    version(&major, &minor, &patch)
    if major != 4 or minor < 1:
        return False
    cdef void* f[7]
    cdef const char* names[7]
    names[:] = [b"zmq_msg_init", b"zmq_msg_recv", b"zmq_msg_data", b"zmq_msg_size", b"zmq_msg_more",
                b"zmq_msg_close", b"zmq_errno"]
    cdef int i
    for i in range(7):
        f[i] = dlsym(handle, names[i])
        if f[i] == NULL:
            return False
    zmq_msg_init = <msg_init_t>f[0]
    zmq_msg_recv = <msg_recv_t>f[1]
    zmq_msg_data = <msg_data_t>f[2]
    zmq_msg_size = <msg_size_t>f[3]
    zmq_msg_more = <msg_more_t>f[4]
    zmq_msg_close = <msg_close_t>f[5]
    zmq_errno = <errno_t>f[6]
    return True


def drain(applier, size_t socket_address, Py_ssize_t max_messages, fallback):
    """Receive up to ``max_messages`` waiting messages from the ZMQ socket at ``socket_address`` without blocking;
    apply each one this module recognises, hand every other one to ``fallback(frames: list[bytes])``. Returns
    ``(messages received, messages applied here)``. Stops early when the socket has nothing more waiting; raises
    ``OSError`` for any other receive error, and lets an exception of ``fallback`` or of the applier's callbacks
    through (the messages already received are counted in neither case: the caller logs and goes on)."""
    cdef void* sock = <void*>socket_address
    cdef zmq_msg_t msgs[3]
    cdef zmq_msg_t extra
    cdef int frames, rc, err, i
    cdef bint more
    cdef Py_ssize_t received = 0, applied = 0
    cdef list python_frames
    if zmq_msg_recv == NULL:
        raise RuntimeError("bind_libzmq was not called or failed")
    if sock == NULL:
        raise ValueError("no socket")
    while received < max_messages:
        frames = 0
        python_frames = None
        more = True
        # Every frame of a ZMQ message arrives together: once its first frame is there, the rest are.
        while more:
            if frames < MAX_FRAMES:
                zmq_msg_init(&msgs[frames])
                rc = zmq_msg_recv(&msgs[frames], sock, ZMQ_DONTWAIT)
                if rc < 0:
                    err = zmq_errno()
                    zmq_msg_close(&msgs[frames])
                    for i in range(frames):
                        zmq_msg_close(&msgs[i])
                    if frames == 0 and (err == EAGAIN_ or err == EINTR_):  # nothing more waiting, or a signal
                        return received, applied
                    raise OSError(err, "zmq_msg_recv failed")
                more = zmq_msg_more(&msgs[frames]) != 0
                frames += 1
            else:  # a fourth frame: not vLLM's shape, the whole message goes to the Python path
                if python_frames is None:
                    python_frames = [_frame_bytes(&msgs[i]) for i in range(frames)]
                zmq_msg_init(&extra)
                rc = zmq_msg_recv(&extra, sock, ZMQ_DONTWAIT)
                if rc < 0:
                    err = zmq_errno()
                    zmq_msg_close(&extra)
                    for i in range(frames):
                        zmq_msg_close(&msgs[i])
                    raise OSError(err, "zmq_msg_recv failed")
                python_frames.append(_frame_bytes(&extra))
                more = zmq_msg_more(&extra) != 0
                zmq_msg_close(&extra)
        received += 1
        try:
            if python_frames is None and frames == 3 and zmq_msg_size(&msgs[1]) == 8 and apply_bytes(
                applier,
                <const unsigned char*>zmq_msg_data(&msgs[1]),
                <const unsigned char*>zmq_msg_data(&msgs[2]),
                <Py_ssize_t>zmq_msg_size(&msgs[2]),
            ):
                applied += 1
                continue
            if python_frames is None:
                python_frames = [_frame_bytes(&msgs[i]) for i in range(frames)]
        finally:
            for i in range(frames):
                zmq_msg_close(&msgs[i])
        fallback(python_frames)
    return received, applied


cdef bytes _frame_bytes(zmq_msg_t* msg):
    return PyBytes_FromStringAndSize(<const char*>zmq_msg_data(msg), <Py_ssize_t>zmq_msg_size(msg))
