"""The lookup's own HTTP/1.1 reader (``smartnsq.transport.plainhttp``) held to h11: the same
answers, hostile and odd ones included, are read by both, from a buffer (an
``asyncio.StreamReader`` fed the answer and its end, as the socket would; no network). Both
accept an answer with the same status, headers, body and keep-alive decision, or both refuse
it, ours with its typed errors only (MalformedAnswer, AnswerTooLarge, ConnectionError: what
``httpclient.exchange`` turns into smartnsq's errors; anything else fails the test).

Where the two differ on purpose, RFC 9112 decides, and each difference is a case of its own
at the end with its reason; the fuzzed answers leave those inputs out (``_deliberate``).
tests/integration/test_plain_http.py reads answers like these over loopback sockets."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import h11
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from smartnsq.transport import plainhttp
from smartnsq.transport.plainhttp import AnswerTooLarge, MalformedAnswer

OK_HEAD = b"HTTP/1.1 200 OK\r\n"
MAX_BYTES = 1 << 20  # far above any answer made here: the size bound has its own tests
FUZZ = settings(max_examples=300, deadline=None, derandomize=True)


@dataclass(frozen=True)
class Accepted:
    status: int
    headers: dict[str, str]
    body: bytes
    reusable: bool


@dataclass(frozen=True)
class Refused:
    why: str


Outcome = Accepted | Refused


def ours(answer: bytes, method: str = "GET", max_bytes: int = MAX_BYTES) -> Outcome:
    """plainhttp's reading of ``answer``, the whole of what the server sent before closing."""

    async def read() -> tuple[int, dict[str, str], bytes, bool]:
        reader = asyncio.StreamReader(limit=plainhttp._MAX_HEAD)  # as PlainHttp opens it
        reader.feed_data(answer)
        reader.feed_eof()
        return await plainhttp._read_answer(reader, method, max_bytes)

    try:
        status, headers, body, reusable = asyncio.run(read())
    except (MalformedAnswer, AnswerTooLarge, ConnectionError) as exc:
        return Refused(f"{type(exc).__name__}: {exc}")
    return Accepted(status, headers, body, reusable)


def h11s(answer: bytes, method: str = "GET") -> Outcome:
    """h11's reading of the same, as a client that sent ``method`` and allows a head as large
    as plainhttp does, fed 4 KiB at a time as a socket would (h11 bounds a head only while it
    is incomplete); headers joined as plainhttp joins them."""
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=plainhttp._MAX_HEAD)
    connection.send(h11.Request(method=method, target="/lookup", headers=[("Host", "lookupd")]))
    connection.send(h11.EndOfMessage())
    pieces = [answer[i : i + 4096] for i in range(0, len(answer), 4096)] + [b""]  # b"": closed
    status = 0
    headers: dict[str, str] = {}
    body = bytearray()
    try:
        for piece in pieces:
            connection.receive_data(piece)
            while (event := connection.next_event()) is not h11.NEED_DATA:
                if isinstance(event, h11.Response):
                    status = event.status_code
                    for raw_name, raw_value in event.headers:
                        name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
                        headers[name] = f"{headers[name]}, {value}" if name in headers else value
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    # kept alive, and framed: a body that ran to the close leaves no connection
                    framed = method == "HEAD" or status in (204, 304)
                    framed = framed or "transfer-encoding" in headers or "content-length" in headers
                    reusable = framed and connection.their_state is h11.DONE
                    return Accepted(status, headers, bytes(body), reusable)
                elif not isinstance(event, h11.InformationalResponse):
                    return Refused(f"h11: {event!r} before the end of the answer")
    except h11.RemoteProtocolError as exc:
        return Refused(f"h11: {exc}")
    return Refused("h11: the connection closed before the answer's end")  # not reached


def assert_same(answer: bytes, method: str = "GET") -> Outcome:
    """Both accept ``answer`` alike, or both refuse it; returns ours."""
    mine, reference = ours(answer, method), h11s(answer, method)
    if isinstance(reference, Refused) or isinstance(mine, Refused):
        assert type(mine) is type(reference), _shown(answer, mine, reference)
        return mine
    assert isinstance(mine, Accepted)
    if "transfer-encoding" in mine.headers and "content-length" in mine.headers:
        # Deliberate (test_chunked_beside_a_length_is_read_but_the_connection_not_kept)
        assert not mine.reusable
        reference = Accepted(reference.status, reference.headers, reference.body, False)
    assert mine == reference, _shown(answer, mine, reference)
    return mine


def _shown(answer: bytes, mine: Outcome, reference: Outcome) -> str:
    return f"{answer[:300]!r}:\n ours: {str(mine)[:300]}\n h11:  {str(reference)[:300]}"


# --- fuzzed answers ----------------------------------------------------------------------

# The inputs where plainhttp and h11 differ on purpose (the cases at the end): a status line of
# another HTTP major version, whitespace before a chunk extension's ";", more than 100 lines.
_OTHER_MAJOR = re.compile(rb"(?:^|\n)HTTP/[02-9]\.")
_BWS_BEFORE_EXTENSION = re.compile(rb"(?:^|\n)[0-9A-Fa-f]{1,20}[ \t]+;")


def _deliberate(answer: bytes) -> bool:
    return bool(
        _OTHER_MAJOR.search(answer)
        or _BWS_BEFORE_EXTENSION.search(answer)
        or answer.count(b"\n") > plainhttp._MAX_HEADERS
    )


NO_LF = st.binary(max_size=16).map(lambda b: b.replace(b"\n", b""))
LINE_END = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r\r\n"])
STATUS_LINE = st.one_of(
    st.sampled_from(
        [
            b"HTTP/1.1 200 OK",
            b"HTTP/1.1 200 OK",
            b"HTTP/1.0 200 OK",
            b"HTTP/1.1 404 Not Found",
            b"HTTP/1.1 500 Internal Server Error",
            b"HTTP/1.1 200",
            b"HTTP/1.1 200 ",
            b"HTTP/1.1 299 \x80\xff reason\twith\x01controls",
            b"HTTP/1.2 200 OK",
            b"HTTP/1.1 999 Beyond",
            b"HTTP/1.1 204 No Content",
            b"HTTP/1.1 304 Not Modified",
        ]
    ),
    st.sampled_from(
        [
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1 20 OK",
            b"HTTP/1.1  200 OK",
            b"HTTP/1.10 200 OK",
            b"http/1.1 200 OK",
            b"HTTP/1.1 099 Low",
            b"HTTP/1.1 000 Zero",
            b"HTTP/1.1 200 O\x00K",
            b"HTTP/1.1 200 O\x0bK",
            b"HTTP/1.1 200 O\rK",
            b" HTTP/1.1 200 OK",
            b"HTTP/1.1\t200 OK",
            b"HTTP/1.1 200OK",
            b"HTTP/1.1 -20 OK",
            b"HTTP/1.1 101 Switching Protocols",
            b"SSH-2.0-OpenSSH_9.6",
            b"",
        ]
    ),
    NO_LF,
)
NAME = st.one_of(
    st.sampled_from(
        [b"Content-Type", b"X-NSQ-Content-Type", b"Server", b"date", b"X", b"a-b_c.d~e!#$%&'*+^`|"]
    ),
    st.sampled_from([b"Bad Name", b"X ", b"", b"\xe9t\xe9", b"X\x00", b"(x)", b"a:b"]),
    NO_LF,
)
VALUE = st.one_of(
    st.sampled_from([b"application/json", b"nsq; version=1.0", b"", b"  spaced  out\t", b"a\tb"]),
    st.sampled_from([b"a\x00b", b"a\x0bb", b"a\x0cb", b"a\rb", b"\x01\x7f\x80\xa0\xff", b"a\nb"]),
    NO_LF,
)
SEPARATOR = st.sampled_from([b": ", b": ", b":", b":  ", b" : ", b"\t:", b""])


@st.composite
def field_lines(draw: st.DrawFn, framing: list[bytes], most: int = 8) -> list[bytes]:
    """Header (or trailer) lines: ``framing`` ones among others, some folded (obs-fold)."""
    lines = [
        name + separator + value
        for name, separator, value in draw(
            st.lists(st.tuples(NAME, SEPARATOR, VALUE), max_size=most)
        )
    ]
    for line in framing:
        lines.insert(draw(st.integers(0, len(lines))), line)
    if lines and draw(st.integers(0, 4)) == 0:  # a continuation line, anywhere
        where = draw(st.integers(0, len(lines)))
        lines.insert(where, draw(st.sampled_from([b" ", b"\t", b"   "])) + draw(VALUE))
    return lines


def _head(draw: st.DrawFn, status_line: bytes, lines: list[bytes]) -> bytes:
    return b"".join(line + draw(LINE_END) for line in [status_line, *lines]) + draw(LINE_END)


CONNECTION = st.sampled_from(
    [[], [], [b"Connection: close"], [b"Connection: keep-alive"], [b"Connection: Close"],
     [b"Connection: upgrade, close"], [b"Connection: close\xa0"], [b"Connection: x,close"]]
)  # fmt: skip


def _length_fields(draw: st.DrawFn, size: int) -> list[bytes]:
    n = str(size).encode()
    values = [
        [n], [n], [n], [b"000" + n], [n + b", " + n], [n, n], [n, str(size + 1).encode()],
        [str(max(size - 1, 0)).encode()], [str(size + 1).encode()], [b"abc"], [b""], [b" "],
        [b"+" + n], [b"-1"], [b"0x" + n], [b"\xb2"], [b"1_0"], [b"1 0"], [b"0" * 20 + n],
        [b"9" * 20], [n + b","], [b", " + n],
    ]  # fmt: skip
    return [b"Content-Length: " + value for value in draw(st.sampled_from(values))]


CHUNK_SIZE_FORMS = [b"%x", b"%x", b"%X", b"000%x", b"%x;name=value", b"%x;", b"%x  ", b"%x\t"]
ODD_CHUNK_SIZE_FORMS = [b"0x%x", b"+%x", b"-%x", b" %x", b"%x_0", b"", b"zz", b"%x\x00"]


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    out = bytearray()
    for data in draw(st.lists(st.binary(min_size=1, max_size=24), max_size=4)):
        form = draw(st.sampled_from(CHUNK_SIZE_FORMS * 3 + ODD_CHUNK_SIZE_FORMS))
        declared = len(data) + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1]))
        size_line = form.replace(b"%x", b"%x" % declared) if declared >= 0 else b"-1"
        size_line = size_line.replace(b"%X", b"%X" % max(declared, 0))
        end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"]))
        out += size_line + end + data + draw(st.sampled_from([b"\r\n"] * 6 + [b"\n", b"", b"\rX"]))
    out += draw(st.sampled_from([b"0", b"0", b"000", b"0;last", b"0  "])) + b"\r\n"
    trailer_framing = draw(
        st.sampled_from([[], [], [b"Content-Length: x"], [b"Transfer-Encoding: gzip"]])
    )
    for line in draw(field_lines(trailer_framing, most=3)):
        out += line + draw(LINE_END)
    out += draw(st.sampled_from([b"\r\n", b"\r\n", b"\n", b""]))
    return bytes(out)


TRANSFER_ENCODING = st.sampled_from(
    [[b"chunked"], [b"chunked"], [b"Chunked"], [b"CHUNKED"], [b" chunked "], [b"gzip, chunked"],
     [b"chunked, gzip"], [b"gzip"], [b"identity"], [b""], [b"chunked, chunked"], [b"xchunked"],
     [b"chunked", b"chunked"]]
)  # fmt: skip


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, str]:
    """An answer as a server might send it, odd or hostile in any part, and the method."""
    method = draw(st.sampled_from(["GET", "GET", "GET", "POST", "HEAD"]))
    out = bytearray()
    for _ in range(draw(st.integers(0, 2))):  # interim answers
        interim = draw(st.sampled_from([b"HTTP/1.1 100 Continue", b"HTTP/1.1 103 Early Hints"]))
        framing = draw(st.sampled_from([[], [], [b"Content-Length: nope"]]))
        out += _head(draw, interim, draw(field_lines(framing, most=2)))
    status_line = draw(STATUS_LINE)
    framing = draw(CONNECTION)
    kind = draw(st.sampled_from(["length", "chunked", "close", "both", "none"]))
    body = draw(st.binary(max_size=64))
    if kind == "length":
        framing = framing + _length_fields(draw, len(body))
    elif kind in ("chunked", "both"):
        framing = framing + [b"Transfer-Encoding: " + v for v in draw(TRANSFER_ENCODING)]
        body = draw(chunked_body())
        if kind == "both":
            framing.append(b"Content-Length: %d" % draw(st.integers(0, 80)))
    elif kind == "none":
        body = b""
    out += _head(draw, status_line, draw(field_lines(framing)))
    out += body
    if draw(st.integers(0, 5)) == 0:  # cut short: the server closed the connection there
        out = out[: draw(st.integers(0, len(out)))]
    elif draw(st.integers(0, 5)) == 0:  # bytes after the answer
        out += draw(st.sampled_from([b"HTTP/1.1 200 OK\r\n\r\n", b"junk", b"\r\n"]))
    return bytes(out), method


@FUZZ
@given(answers())
def test_a_fuzzed_answer_is_read_as_h11_reads_it(answer_and_method: tuple[bytes, str]) -> None:
    answer, method = answer_and_method
    assume(not _deliberate(answer))
    assert_same(answer, method)


@FUZZ
@given(st.binary(max_size=200))
def test_bytes_of_any_kind_are_read_as_h11_reads_them(answer: bytes) -> None:
    assume(not _deliberate(answer))
    assert_same(answer)
    assert_same(OK_HEAD + answer)
    assert_same(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + answer)


@FUZZ
@given(answers(), st.data())
def test_every_cut_of_an_answer_is_read_as_h11_reads_it(
    answer_and_method: tuple[bytes, str], data: st.DataObject
) -> None:
    """An answer cut anywhere (the server closed there): a framed answer cut before its end is
    refused by both, one that runs to the close is whatever came."""
    answer, method = answer_and_method
    assume(not _deliberate(answer))
    cut = data.draw(st.integers(0, len(answer)))
    assert_same(answer[:cut], method)


# --- named cases: what is read, and what is refused ---------------------------------------

ACCEPTED = {
    "content-length": (OK_HEAD + b"Content-Length: 2\r\n\r\nok", b"ok"),
    "chunked, extension, trailer": (
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n5\r\ndefgh\r\n"
        b"0\r\nTrailer: x\r\n\r\n",
        b"abcdefgh",
    ),
    "chunked, upper case hex, zeros": (
        OK_HEAD + b"Transfer-Encoding: Chunked\r\n\r\n00A\r\n0123456789\r\n000\r\n\r\n",
        b"0123456789",
    ),
    "to the close, HTTP/1.0": (b"HTTP/1.0 200 OK\r\n\r\nall of it", b"all of it"),
    "to the close, HTTP/1.1": (OK_HEAD + b"Server: x\r\n\r\nall of it", b"all of it"),
    "bare LF line ends": (b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", b"ok"),
    "identical lengths in a list": (OK_HEAD + b"Content-Length: 2, 2\r\n\r\nok", b"ok"),
    "identical lengths in two fields": (
        OK_HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
    ),
    "interim answers first": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        + OK_HEAD
        + b"Content-Length: 2\r\n\r\nok",
        b"ok",
    ),
    "no reason phrase": (b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    "a later minor version": (b"HTTP/1.9 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    "a status code beyond 599": (b"HTTP/1.1 999 x\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    "controls other than NUL, CR, LF, VT, FF in a value": (
        OK_HEAD + b"X: \x01\x7f\x80\xff\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
    ),
}


@pytest.mark.parametrize(("answer", "body"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_what_is_read(answer: bytes, body: bytes) -> None:
    outcome = assert_same(answer)
    assert isinstance(outcome, Accepted)
    assert outcome.body == body


def test_obs_fold_is_replaced_by_one_space() -> None:
    """RFC 9112 5.2: a user agent replaces each obs-fold with SP before reading the value
    (before, plainhttp refused the answer)."""
    answer = OK_HEAD + b"X-Long: first\r\n   second\r\n\tthird\r\nContent-Length: 0\r\n\r\n"
    outcome = assert_same(answer)
    assert isinstance(outcome, Accepted)
    assert outcome.headers["x-long"] == "first second third"


REFUSED = {
    "conflicting lengths": OK_HEAD + b"Content-Length: 2, 3\r\n\r\nok",
    "conflicting length fields": OK_HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    "lengths that differ as text": OK_HEAD + b"Content-Length: 2\r\nContent-Length: 02\r\n\r\nok",
    # before: isdigit() let a superscript two through, and int() raised a bare ValueError
    "a superscript digit as a length": OK_HEAD + b"Content-Length: \xb2\r\n\r\nok",
    "a length of 21 digits": OK_HEAD + b"Content-Length: " + b"0" * 19 + b"02\r\n\r\nok",
    "a signed length": OK_HEAD + b"Content-Length: +2\r\n\r\nok",
    # before: any coding that contained "chunked" was read as chunked alone
    "gzip then chunked": OK_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "not chunked": OK_HEAD + b"Transfer-Encoding: notchunked\r\n\r\n0\r\n\r\n",
    "chunked twice": OK_HEAD + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "an empty coding": OK_HEAD + b"Transfer-Encoding:\r\nContent-Length: 2\r\n\r\nok",
    # before: Python's int(size, 16) read these
    "a chunk size with 0x": OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\nok\r\n0\r\n\r\n",
    "a chunk size with _": OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1_0\r\n" + b"x" * 16,
    "a chunk size line ended by LF": OK_HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n",
    "chunk data not ended by CRLF": OK_HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n0\r\n\r\n",
    # before: trailer lines were skipped unread
    "a malformed trailer": OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nno colon\r\n\r\n",
    "whitespace before a colon": OK_HEAD + b"Content-Length : 2\r\n\r\nok",
    "a name that is no token": OK_HEAD + b"X(y): 1\r\nContent-Length: 2\r\n\r\nok",
    "NUL in a value": OK_HEAD + b"X: a\x00b\r\nContent-Length: 2\r\n\r\nok",
    "a bare CR in a value": OK_HEAD + b"X: a\rb\r\nContent-Length: 2\r\n\r\nok",
    "a CR too many at a line's end": OK_HEAD + b"X: a\r\r\nContent-Length: 2\r\n\r\nok",
    "a continuation line first": OK_HEAD + b" X: a\r\nContent-Length: 2\r\n\r\nok",
    # before: the first three characters after the space were the code
    "a four-digit status": b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
    "a status below 100": b"HTTP/1.1 099 x\r\nContent-Length: 2\r\n\r\nok",
    "no space after the status": b"HTTP/1.1 200OK\r\nContent-Length: 2\r\n\r\nok",
    "HTTP/1.10": b"HTTP/1.10 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "101 without an upgrade asked": b"HTTP/1.1 101 Switching Protocols\r\n\r\n"
    + OK_HEAD
    + b"Content-Length: 2\r\n\r\nok",
    "a body cut short": OK_HEAD + b"Content-Length: 5\r\n\r\nok",
    "chunks cut short": OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nok",
    "no last chunk": OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n",
    "a head cut short": OK_HEAD + b"Content-Length: 2\r\n",
    "nothing": b"",
    "no HTTP": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "a 70 KiB header line": OK_HEAD + b"X: " + b"x" * 70_000 + b"\r\n\r\n",
    "a 70 KiB head": OK_HEAD
    + b"".join(b"X-%d: %s\r\n" % (i, b"x" * 1000) for i in range(70))
    + b"\r\n",
}


@pytest.mark.parametrize("answer", REFUSED.values(), ids=REFUSED.keys())
def test_what_is_refused(answer: bytes) -> None:
    assert isinstance(assert_same(answer), Refused)


def test_the_size_bound_is_ours() -> None:
    """max_bytes (h11 has no such bound): a declared length over it, chunks going past it, or
    an answer running to the close past it are refused before being read whole."""
    assert isinstance(ours(OK_HEAD + b"Content-Length: 5\r\n\r\nhello", max_bytes=4), Refused)
    chunked = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n"
    assert isinstance(ours(chunked, max_bytes=5), Refused)
    assert isinstance(ours(b"HTTP/1.0 200 OK\r\n\r\nhello", max_bytes=4), Refused)
    assert ours(OK_HEAD + b"Content-Length: 5\r\n\r\nhello", max_bytes=5) == Accepted(
        200, {"content-length": "5"}, b"hello", True
    )


# --- where plainhttp and h11 differ on purpose --------------------------------------------


def test_whitespace_before_a_chunk_extension_is_read() -> None:
    """RFC 9112 7.1.1 allows BWS before a chunk extension's ";" (chunk-ext = *( BWS ";" BWS
    chunk-ext-name ...)); h11's chunk-header pattern does not."""
    answer = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2 ;a=b\r\nok\r\n0\t;last\r\n\r\n"
    assert _deliberate(answer)
    outcome = ours(answer)
    assert isinstance(outcome, Accepted)
    assert outcome.body == b"ok"
    assert isinstance(h11s(answer), Refused)


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/3.1"])
def test_another_major_version_is_refused(version: bytes) -> None:
    """The request went as HTTP/1.1: an answer in another major version is not in HTTP/1.1's
    syntax (RFC 9112 2.3: the major version names the messaging syntax), and nsqlookupd
    never sends one. h11 reads any HTTP/d.d status line."""
    answer = version + b" 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert _deliberate(answer)
    assert isinstance(ours(answer), Refused)
    assert isinstance(h11s(answer), Accepted)


def test_more_than_100_header_lines_are_refused() -> None:
    """A bound of plainhttp's own beside the head's size (h11 bounds only the size): a lookup
    answer has a handful of headers."""

    def answer(lines: int) -> bytes:
        fields = b"".join(b"X-%d: 1\r\n" % i for i in range(lines - 1))
        return OK_HEAD + fields + b"Content-Length: 2\r\n\r\nok"

    too_many = answer(plainhttp._MAX_HEADERS + 1)
    assert _deliberate(too_many)
    assert isinstance(ours(too_many), Refused)
    assert isinstance(h11s(too_many), Accepted)
    assert isinstance(assert_same(answer(plainhttp._MAX_HEADERS)), Accepted)


def test_chunked_beside_a_length_is_read_but_the_connection_not_kept() -> None:
    """Transfer-Encoding wins over Content-Length (RFC 9112 6.3, as h11 reads it); such an
    answer "ought to be handled as an error" (request smuggling, response splitting): the
    answer is read, and its connection closed, not kept for the next request as h11 would."""
    answer = (
        OK_HEAD + b"Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    )
    mine, reference = ours(answer), h11s(answer)
    assert isinstance(mine, Accepted)
    assert isinstance(reference, Accepted)
    assert (mine.body, reference.body) == (b"ok", b"ok")
    assert (mine.reusable, reference.reusable) == (False, True)
