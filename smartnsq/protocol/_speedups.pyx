# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of the protocol floor's hottest functions (built where a C compiler is).

Each function here gives exactly what its pure-Python reference gives, byte for byte, error
for error (tests/unit/test_speedups.py checks them against each other): the reference is
the Python code, which runs wherever this module was not built, or when ``SMARTNSQ_PURE=1``.

* ``next_frame``: ``FrameDecoder.next_frame`` (frames.py), the frame header read with C
  loads instead of ``struct.unpack_from``;
* ``decode_message``: ``message.decode_message``, the fields read the same way and the
  object built with its class's ``__new__`` and slot stores (no Python ``__init__`` call);
* ``mpub_frame``: ``commands._mpub_frame``, the MPUB frame written into one preallocated
  bytes object (one copy of each body, no per-body length-prefix object);
* ``fin``: ``commands.fin``, the 21 bytes written at once;
* ``checked_size``: ``validation.pure_checked_size``, an MPUB batch's bodies checked and
  their sizes added in one loop.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from smartnsq.errors import ProtocolError, ValidationError

DEF HEAD_SIZE = 26
DEF DETAIL_SIZE = 12


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _u64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>_u32(p) << 32) | _u32(p + 4)


cdef inline void _put_u32(unsigned char* p, uint32_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


def next_frame(self):
    """``FrameDecoder.next_frame``: the next complete frame as ``(type, data)``, or None."""
    cdef bytearray buf = self._buf
    cdef Py_ssize_t pos = self._pos
    cdef Py_ssize_t available = PyByteArray_GET_SIZE(buf) - pos
    cdef const unsigned char* p
    cdef int32_t size, frame_type
    cdef Py_ssize_t max_size
    if available < 4:
        if pos:
            self.settle()
        return None
    p = <const unsigned char*>PyByteArray_AS_STRING(buf) + pos
    size = <int32_t>_u32(p)
    max_size = self.max_frame_size
    if size < 4 or size > max_size:
        raise ProtocolError(f"corrupt frame size {size} (allowed 4..{max_size})")
    if available < 8 or available < <Py_ssize_t>size + 4:
        if pos:
            self.settle()
        return None
    frame_type = <int32_t>_u32(p + 4)
    if not 0 <= frame_type <= 2:
        raise ProtocolError(f"unknown frame type {frame_type}")
    data = PyBytes_FromStringAndSize(<const char*>p + 8, size - 4)
    self._pos = pos + 4 + size
    return frame_type, data


cdef object _frame_init = None  # MessageFrame.__init__: classes that keep it are built here
cdef object _reference = None  # message.pure_decode_message


def decode_message(data, layout, cls):
    """``message.decode_message``: the data of a message frame as a ``cls`` instance."""
    global _frame_init, _reference
    if _reference is None:
        from smartnsq.protocol import message as reference

        _frame_init = reference.MessageFrame.__init__
        _reference = reference.pure_decode_message
    if type(data) is not bytes or cls.__init__ is not _frame_init:
        return _reference(data, layout, cls)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = HEAD_SIZE
    cdef Py_ssize_t ext_len
    cdef int ext_version = 0
    if size < HEAD_SIZE:
        raise ProtocolError(f"message frame of {size} bytes is shorter than its header")
    timestamp = <int64_t>_u64(p)
    attempts = <uint16_t>((p[8] << 8) | p[9])
    message_id = PyBytes_FromStringAndSize(<const char*>p + 10, 16)
    if layout.binary_id:
        internal_id = _u64(p + 10)
        trace_id = _u64(p + 18)
    else:
        internal_id = trace_id = None
    ext_raw = None
    if layout.ext:
        if size < pos + 1:
            raise ProtocolError("message frame truncated in its ext block")
        ext_version = p[pos]
        pos += 1
        if ext_version != 0:
            if size < pos + 2:
                raise ProtocolError("message frame truncated in its ext block")
            ext_len = (p[pos] << 8) | p[pos + 1]
            pos += 2
            if size < pos + ext_len:
                raise ProtocolError("message frame truncated in its ext header")
            ext_raw = PyBytes_FromStringAndSize(<const char*>p + pos, ext_len)
            pos += ext_len
    offset = raw_size = None
    if layout.detail:
        if size < pos + DETAIL_SIZE:
            raise ProtocolError("message frame truncated in its queue-position block")
        offset = _u64(p + pos)
        raw_size = _u32(p + pos + 8)
        pos += DETAIL_SIZE
    message = cls.__new__(cls)
    message.timestamp = timestamp
    message.attempts = attempts
    message.id = message_id
    message.internal_id = internal_id
    message.trace_id = trace_id
    message.ext_version = ext_version
    message.ext_raw = ext_raw
    message.offset = offset
    message.raw_size = raw_size
    message.body = PyBytes_FromStringAndSize(<const char*>p + pos, size - pos)
    return message


def mpub_frame(head, elements, Py_ssize_t max_body_size, str unit="bytes"):
    """``commands.pure_mpub_frame``: ``head``, then ``[size][count]([size][element])*``;
    None when ``head`` or an element is not ``bytes`` (the reference takes those)."""
    if type(head) is not bytes or (type(elements) is not list and type(elements) is not tuple):
        return None
    cdef list items = list(elements) if type(elements) is tuple else elements
    cdef Py_ssize_t count = len(items)
    cdef Py_ssize_t i, n, total = 4 + 4 * count
    cdef Py_ssize_t head_size = PyBytes_GET_SIZE(head)
    cdef unsigned char* out
    cdef object element
    for i in range(count):
        element = items[i]
        if type(element) is not bytes:
            return None  # not all bytes: the reference handles it
        total += PyBytes_GET_SIZE(element)
    if total > max_body_size:
        raise ValidationError(
            "bodies", f"batch is {total} {unit}, over the maximum of {max_body_size}"
        )
    frame = PyBytes_FromStringAndSize(NULL, head_size + 4 + total)
    out = <unsigned char*>PyBytes_AS_STRING(frame)
    memcpy(out, PyBytes_AS_STRING(head), head_size)
    out += head_size
    _put_u32(out, <uint32_t>total)
    _put_u32(out + 4, <uint32_t>count)
    out += 8
    for i in range(count):
        element = items[i]
        n = PyBytes_GET_SIZE(element)
        _put_u32(out, <uint32_t>n)
        memcpy(out + 4, PyBytes_AS_STRING(element), n)
        out += 4 + n
    return frame


cdef object _reference_size = None  # validation.pure_checked_size


def checked_size(bodies, Py_ssize_t max_msg_size):
    """``validation.pure_checked_size``: the bytes of a list of bodies together when each
    is ``bytes`` of 1..``max_msg_size`` bytes, else -1 (anything but a list: the reference)."""
    global _reference_size
    if type(bodies) is not list:
        if _reference_size is None:
            from smartnsq.protocol import validation

            _reference_size = validation.pure_checked_size
        return _reference_size(bodies, max_msg_size)
    cdef list items = bodies
    cdef Py_ssize_t i, n, total = 0
    cdef Py_ssize_t count = len(items)
    cdef object element
    if count == 0:
        return -1
    for i in range(count):
        element = items[i]
        if type(element) is not bytes:
            return -1
        n = PyBytes_GET_SIZE(element)
        if n == 0 or n > max_msg_size:
            return -1
        total += n
    return total


cdef object _reference_fin = None  # commands.pure_fin


def fin(message_id):
    """``commands.fin``: ``FIN <16-byte id>\\n``."""
    global _reference_fin
    cdef unsigned char* out
    if type(message_id) is not bytes or PyBytes_GET_SIZE(message_id) != 16:
        if _reference_fin is None:
            from smartnsq.protocol import commands

            _reference_fin = commands.pure_fin
        return _reference_fin(message_id)
    frame = PyBytes_FromStringAndSize(NULL, 21)
    out = <unsigned char*>PyBytes_AS_STRING(frame)
    memcpy(out, b"FIN ", 4)
    memcpy(out + 4, PyBytes_AS_STRING(message_id), 16)
    out[20] = 10
    return frame
