# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""CRC-32C (Castagnoli), the checksum of Kafka's RecordBatch v2.

Java reference: org.apache.kafka.common.utils.Crc32C. The batch CRC covers
the bytes from ``attributes`` (batch offset 21) to the end of the batch.

``crc32c(data, value=0)`` continues a previous result exactly like the PyPI
``crc32c`` package: ``crc32c(b, crc32c(a)) == crc32c(a + b)``.

The C code is in ``src/crc32c_impl.c``. At import it picks the SSE4.2 path
when the CPU has it (``HARDWARE`` says which), otherwise slicing-by-8 tables;
``KBROKER_CRC32C_SOFTWARE=1`` forces software for the whole process, and
``crc32c_sw`` is always the software path. Other kernels cimport
``crc32c_update`` (see crc32c.pxd).

Buffers are read in place (no copy): bytes, bytearray, mmap, C-contiguous
memoryviews, numpy arrays... A non-contiguous buffer raises TypeError. The
GIL is released for buffers of at least ``NOGIL_THRESHOLD`` bytes; the
buffer export stays held meanwhile, so a bytearray/mmap cannot be resized
or closed under us.
"""
import os

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.number cimport PyNumber_Index
from libc.stdint cimport uint32_t


cdef extern from "crc32c_impl.h":
    void kb_crc32c_init(int force_software) noexcept nogil
    int kb_crc32c_hardware_active() noexcept nogil
    int kb_crc32c_hardware_available() noexcept nogil
    uint32_t kb_crc32c(uint32_t crc, const unsigned char* data, size_t length) noexcept nogil
    uint32_t kb_crc32c_sw(uint32_t crc, const unsigned char* data, size_t length) noexcept nogil


ctypedef uint32_t (*crc_fn)(uint32_t, const unsigned char*, size_t) noexcept nogil

# Below this many bytes the GIL is kept. Uncontended, releasing and
# re-taking it costs ~20 ns (measured on the dev box); with SSE4.2 8 KiB
# take ~450 ns, so the release costs <= ~5% from here up, while a 1 MiB
# buffer (~37 us) lets other threads run. aiokafka holds it below 5 KiB.
cdef enum:
    _NOGIL_THRESHOLD = 8 * 1024

NOGIL_THRESHOLD = _NOGIL_THRESHOLD

kb_crc32c_init(os.environ.get("KBROKER_CRC32C_SOFTWARE") == "1")

#: True when crc32c() / crc32c_update() use the SSE4.2 instruction.
HARDWARE = bool(kb_crc32c_hardware_active())


cdef uint32_t crc32c_update(uint32_t crc, const unsigned char* data, size_t length) noexcept nogil:
    return kb_crc32c(crc, data, length)


cdef inline uint32_t _run(crc_fn fn, uint32_t value, const unsigned char* p, Py_ssize_t n) noexcept:
    cdef uint32_t result
    if n >= _NOGIL_THRESHOLD:
        with nogil:
            result = fn(value, p, <size_t>n)
        return result
    return fn(value, p, <size_t>n)


cdef object _checksum(crc_fn fn, object data, object value_arg):
    cdef Py_buffer view
    cdef uint32_t result
    # PyNumber_Index: TypeError for floats; the coercion: OverflowError
    # outside [0, 2**32).
    cdef uint32_t value = 0 if value_arg is 0 else PyNumber_Index(value_arg)
    if PyBytes_CheckExact(data):
        # bytes are immutable and `data` holds a reference: no export needed.
        return _run(fn, value, <const unsigned char*>PyBytes_AS_STRING(data),
                    PyBytes_GET_SIZE(data))
    try:
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    except (BufferError, ValueError) as exc:  # exporter cannot give a flat C-contiguous view
        raise TypeError(f"crc32c needs a C-contiguous buffer: {exc}") from None
    try:
        result = _run(fn, value, <const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return result


def crc32c(data, value=0):
    """CRC-32C of ``data`` (any C-contiguous buffer), continuing ``value``."""
    return _checksum(kb_crc32c, data, value)


def crc32c_sw(data, value=0):
    """Same as crc32c() but always the software (slicing-by-8) path."""
    return _checksum(kb_crc32c_sw, data, value)
