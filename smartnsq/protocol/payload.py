"""go-nsq's client-side payload compression on ext topics (youzan/go-nsq ``compress.go`` and
``message.go``).

A go-nsq producer may compress a body and say so in the ext header:
``"nsq.client.compress": "1"`` (gzip), ``"2"`` (snappy block) or ``"3"`` (lz4 block, needs
the optional ``lz4`` package), with ``"nsq.msg.size"`` the original size. Consumers
decompress and drop both keys, as go-nsq consumers do. Each codec's library is loaded with the
first message that needs it.
"""

from __future__ import annotations

import importlib
from typing import Any

from smartnsq.errors import ProtocolError, UnsupportedFeatureError

__all__ = ["COMPRESS_KEY", "SIZE_KEY", "decompress_payload"]

COMPRESS_KEY = "nsq.client.compress"
SIZE_KEY = "nsq.msg.size"
MARKER = COMPRESS_KEY.encode()


def decompress_payload(body: bytes, ext: dict[str, Any]) -> bytes:
    """Return the original body and remove the compression keys from ``ext``.

    Raises :class:`UnsupportedFeatureError` for an unknown codec (or lz4 without the lz4
    package) and :class:`ProtocolError` for a corrupt body.
    """
    codec = str(ext.get(COMPRESS_KEY, ""))
    size_text = ext.get(SIZE_KEY)
    try:
        size = int(size_text) if size_text is not None else None
    except (TypeError, ValueError):
        size = None
    try:
        if codec == "1":
            import gzip

            data = gzip.decompress(body)
        elif codec == "2":
            data = _snappy_block(body)
        elif codec == "3":
            data = _lz4_block(body, size)
        else:
            raise UnsupportedFeatureError(f"unknown payload compression {codec!r}")
    except (OSError, EOFError, ValueError) as exc:
        raise ProtocolError(f"corrupt compressed payload (codec {codec}): {exc}") from exc
    if size is not None and len(data) != size:
        raise ProtocolError(f"decompressed {len(data)} bytes, header says {size}")
    ext.pop(COMPRESS_KEY, None)
    ext.pop(SIZE_KEY, None)
    return data


def _snappy_block(body: bytes) -> bytes:
    import snappy

    try:
        return bytes(snappy.uncompress(body))
    except snappy.UncompressError as exc:  # neither OSError nor ValueError
        raise ProtocolError(f"corrupt snappy payload: {exc}") from exc


def _lz4_block(body: bytes, size: int | None) -> bytes:
    try:
        block = importlib.import_module("lz4.block")
    except ImportError:
        raise UnsupportedFeatureError(
            "the message is lz4-compressed; install the 'lz4' package to read it"
        ) from None
    if size is None:
        raise ProtocolError("lz4 payload without nsq.msg.size")
    return bytes(block.decompress(body, uncompressed_size=size))
