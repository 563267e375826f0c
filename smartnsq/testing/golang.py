"""Go library behaviours the emulated servers show on the wire.

nsqd is written in Go: its error texts quote arguments with ``%q``, parse numbers with
``strconv`` or its own ``ByteToBase10``, and youzan nsqd validates ext headers with the
valyala/fastjson parser, whose error messages it sends to clients. These functions reproduce
what the clients see (acceptance and texts), written from the behaviour of those libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "JSON_MAX_DEPTH",
    "JsonNumber",
    "JsonObject",
    "JsonParseError",
    "JsonString",
    "JsonValue",
    "byte_to_base10",
    "go_parse_bool",
    "go_parse_int",
    "go_quote",
    "json_get_string",
    "json_keys",
    "parse_json",
    "to_int64",
]

_UINT64 = 1 << 64
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def to_int64(value: int) -> int:
    """Go's conversion of an integer to int64 (two's complement wrap-around)."""
    value %= _UINT64
    return value - _UINT64 if value > _INT64_MAX else value


# --------------------------------------------------------------------------- fmt %q

_QUOTE_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x0B: "\\v",
    0x22: '\\"',
    0x5C: "\\\\",
}


def go_quote(data: bytes | str) -> str:
    """``fmt.Sprintf("%q", s)`` (``strconv.Quote``) of a Go string holding ``data``: printable
    characters as they are, the usual backslash escapes, ``\\xNN`` for bytes that are not
    UTF-8, ``\\uNNNN`` / ``\\UNNNNNNNN`` for other unprintable characters."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    out = ['"']
    for char in raw.decode("utf-8", "surrogateescape"):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[code])
        elif char.isprintable():
            out.append(char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


# --------------------------------------------------------------------------- numbers


def byte_to_base10(data: bytes) -> int:
    """nsqd's ``protocol.ByteToBase10``: ASCII digits only (no sign; empty is 0), uint64 with
    silent wrap-around. ValueError("failed to convert to Base10") otherwise."""
    if data and not (data.isascii() and data.isdigit()):
        raise ValueError("failed to convert to Base10")
    return int(data) % _UINT64 if data else 0


def go_parse_int(text: bytes | str, func: str = "ParseInt") -> int:
    """``strconv.ParseInt(s, 10, 64)``; the ValueError carries Go's message."""
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    digits = raw[1:] if raw[:1] in (b"+", b"-") else raw
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"strconv.{func}: parsing {go_quote(raw)}: invalid syntax")
    value = int(raw)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"strconv.{func}: parsing {go_quote(raw)}: value out of range")
    return value


def go_parse_bool(text: bytes | str) -> bool:
    """``strconv.ParseBool``; the ValueError carries Go's message."""
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    if raw in (b"1", b"t", b"T", b"TRUE", b"true", b"True"):
        return True
    if raw in (b"0", b"f", b"F", b"FALSE", b"false", b"False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(raw)}: invalid syntax")


# --------------------------------------------------------------------------- fastjson

JSON_MAX_DEPTH = 300


@dataclass(frozen=True)
class JsonString:
    """A string value, raw as written (escapes are decoded on use, best effort)."""

    raw: bytes


@dataclass(frozen=True)
class JsonNumber:
    """A number value, raw as written (fastjson only checks its characters)."""

    raw: bytes


@dataclass(frozen=True)
class JsonObject:
    """An object: its members in order, keys raw as written (duplicates kept)."""

    members: tuple[tuple[bytes, JsonValue], ...]


JsonValue: TypeAlias = "JsonObject | list[JsonValue] | JsonString | JsonNumber | bool | None"


class JsonParseError(ValueError):
    """fastjson refused the input; ``str(exc)`` is its message."""


class _Failure(Exception):
    def __init__(self, message: str, tail: bytes) -> None:
        super().__init__(message)
        self.message = message
        self.tail = tail


_WS = b" \r\n\t"
_NUMBER_CHARS = frozenset(b"0123456789-.eE+")


def _skip_ws(s: bytes, pos: int) -> int:
    while pos < len(s) and s[pos] in _WS:
        pos += 1
    return pos


def parse_json(data: bytes) -> JsonValue:
    """Parse like ``fastjson.ParseBytes``: any JSON value is accepted, strings and numbers are
    not validated further, nesting is limited to 300 levels. JsonParseError carries
    fastjson's message, e.g. ``cannot parse JSON: cannot parse empty string; unparsed
    tail: ""``."""
    start = _skip_ws(data, 0)
    try:
        value, pos = _value(data, start, 0)
    except _Failure as exc:
        raise JsonParseError(
            f"cannot parse JSON: {exc.message}; unparsed tail: {go_quote(exc.tail)}"
        ) from None
    pos = _skip_ws(data, pos)
    if pos < len(data):
        raise JsonParseError(f"unexpected tail: {go_quote(data[pos:])}")
    return value


def _value(s: bytes, pos: int, depth: int) -> tuple[JsonValue, int]:
    if pos >= len(s):
        raise _Failure("cannot parse empty string", b"")
    depth += 1
    if depth > JSON_MAX_DEPTH:
        raise _Failure(f"too big depth for the nested JSON; it exceeds {JSON_MAX_DEPTH}", s[pos:])
    first = s[pos]
    try:
        if first == 0x7B:  # {
            return _object(s, pos, depth)
        if first == 0x5B:  # [
            return _array(s, pos, depth)
        if first == 0x22:  # "
            return _string(s, pos)
    except _Failure as exc:
        kind = {0x7B: "object", 0x5B: "array", 0x22: "string"}[first]
        raise _Failure(f"cannot parse {kind}: {exc.message}", exc.tail) from None
    for word, value in ((b"true", True), (b"false", False), (b"null", None)):
        if first == word[0]:
            if not s.startswith(word, pos):
                raise _Failure(f"unexpected value found: {go_quote(s[pos:])}", s[pos:])
            return value, pos + len(word)
    end = pos
    while end < len(s) and s[end] in _NUMBER_CHARS:
        end += 1
    if end == pos:
        raise _Failure(
            f"cannot parse number: unexpected char: {go_quote(s[pos : pos + 1])}", s[pos:]
        )
    return JsonNumber(s[pos:end]), end


def _array(s: bytes, pos: int, depth: int) -> tuple[JsonValue, int]:
    pos = _skip_ws(s, pos + 1)
    if pos >= len(s):
        raise _Failure("missing ']'", b"")
    if s[pos] == 0x5D:
        return [], pos + 1
    items: list[JsonValue] = []
    while True:
        pos = _skip_ws(s, pos)
        try:
            item, pos = _value(s, pos, depth)
        except _Failure as exc:
            raise _Failure(f"cannot parse array value: {exc.message}", exc.tail) from None
        items.append(item)
        pos = _skip_ws(s, pos)
        if pos >= len(s):
            raise _Failure("unexpected end of array", b"")
        if s[pos] == 0x2C:
            pos += 1
            continue
        if s[pos] == 0x5D:
            return items, pos + 1
        raise _Failure("missing ',' after array value", s[pos:])


def _object(s: bytes, pos: int, depth: int) -> tuple[JsonValue, int]:
    pos = _skip_ws(s, pos + 1)
    if pos >= len(s):
        raise _Failure("missing '}'", b"")
    if s[pos] == 0x7D:
        return JsonObject(()), pos + 1
    members: list[tuple[bytes, JsonValue]] = []
    while True:
        pos = _skip_ws(s, pos)
        if pos >= len(s) or s[pos] != 0x22:
            raise _Failure('cannot find opening \'"" for object key', s[pos:])
        key, pos = _key(s, pos)
        pos = _skip_ws(s, pos)
        if pos >= len(s) or s[pos] != 0x3A:
            raise _Failure("missing ':' after object key", s[pos:])
        pos = _skip_ws(s, pos + 1)
        try:
            value, pos = _value(s, pos, depth)
        except _Failure as exc:
            raise _Failure(f"cannot parse object value: {exc.message}", exc.tail) from None
        members.append((key, value))
        pos = _skip_ws(s, pos)
        if pos >= len(s):
            raise _Failure("unexpected end of object", b"")
        if s[pos] == 0x2C:
            pos += 1
            continue
        if s[pos] == 0x7D:
            return JsonObject(tuple(members)), pos + 1
        raise _Failure("missing ',' after object value", s[pos:])


def _key(s: bytes, pos: int) -> tuple[bytes, int]:
    backslashes = 0
    for i in range(pos + 1, len(s)):
        char = s[i]
        if char == 0x22 and backslashes % 2 == 0:
            return s[pos + 1 : i], i + 1
        backslashes = backslashes + 1 if char == 0x5C else 0
    raise _Failure("cannot parse object key: missing closing '\"'", b"")


def _string(s: bytes, pos: int) -> tuple[JsonValue, int]:
    backslashes = 0
    for i in range(pos + 1, len(s)):
        char = s[i]
        if char == 0x22 and backslashes % 2 == 0:
            return JsonString(s[pos + 1 : i]), i + 1
        backslashes = backslashes + 1 if char == 0x5C else 0
    raise _Failure("missing closing '\"'", b"")


_UNESCAPES = {
    0x22: b'"',
    0x5C: b"\\",
    0x2F: b"/",
    0x62: b"\b",
    0x66: b"\f",
    0x6E: b"\n",
    0x72: b"\r",
    0x74: b"\t",
}


def _unescape(raw: bytes) -> bytes:
    """fastjson's best-effort unescaping: unknown or broken escapes are kept as written."""
    if b"\\" not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        char = raw[i]
        if char != 0x5C or i + 1 >= len(raw):
            out.append(char)
            i += 1
            continue
        escaped = raw[i + 1]
        i += 2
        if escaped in _UNESCAPES:
            out += _UNESCAPES[escaped]
        elif escaped == 0x75 and len(raw) - i >= 4 and _is_hex(raw[i : i + 4]):
            code = int(raw[i : i + 4], 16)
            # Go's string(rune(x)) of a lone surrogate is U+FFFD.
            out += ("\ufffd" if 0xD800 <= code <= 0xDFFF else chr(code)).encode()
            i += 4
        else:
            out += bytes((0x5C, escaped))
    return bytes(out)


def _is_hex(data: bytes) -> bool:
    return all(c in b"0123456789abcdefABCDEF" for c in data)


def json_get_string(value: JsonValue, key: str) -> str | None:
    """youzan nsqd's ``GetString(key)`` on a parsed ext header: None when the key is absent
    (or the header is not an object; the first of duplicated keys counts); TypeError when
    the value is not a string."""
    if not isinstance(value, JsonObject):
        return None
    wanted = key.encode()
    found = next((m for m in value.members if m[0] == wanted), None)
    if found is None:
        found = next((m for m in value.members if _unescape(m[0]) == wanted), None)
    if found is None:
        return None
    if not isinstance(found[1], JsonString):
        raise TypeError("json value type not match")
    return _unescape(found[1].raw).decode("utf-8", "replace")


def json_keys(value: JsonValue) -> list[str]:
    """The (unescaped) keys of an object, in order; no keys for any other value."""
    if not isinstance(value, JsonObject):
        return []
    return [_unescape(k).decode("utf-8", "replace") for k, _ in value.members]
