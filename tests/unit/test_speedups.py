"""The compiled hot path (``smartnsq.protocol._speedups``) gives exactly what the pure-Python
reference gives: the same frames, messages and MPUB bytes, the same errors. Skipped where it
was not built; the whole unit suite also runs with ``SMARTNSQ_PURE=1`` in CI."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError, ValidationError
from smartnsq.protocol import _build, commands, frames, message, validation
from smartnsq.protocol.frames import FrameDecoder
from smartnsq.protocol.message import MessageFrame, MessageLayout

speedups = _build.speedups
pytestmark = pytest.mark.skipif(speedups is None, reason="the compiled hot path is not built")

LAYOUTS = [
    MessageLayout.classic(),
    MessageLayout.youzan(),
    MessageLayout.youzan(ext=True),
    MessageLayout.youzan(detail=True),
    MessageLayout.youzan(ext=True, detail=True),
]
FIELDS = MessageFrame.__slots__


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except (ProtocolError, ValidationError) as exc:
        return ("error", type(exc), str(exc))


def _frames(decoder: FrameDecoder, next_frame: Any, chunks: list[bytes]) -> list[Any]:
    seen: list[Any] = []
    for chunk in chunks:
        decoder.feed(chunk)
        while True:
            outcome = _outcome(next_frame, decoder)
            seen.append(outcome)
            if outcome[0] == "error" or outcome[1] is None:
                # and the buffer is settled the same way (what was decoded dropped)
                seen.append(("buffer", decoder._pos, bytes(decoder._buf)))
                break
        if seen[-1][0] == "error":
            break
    return seen


def test_the_compiled_twins_are_installed() -> None:
    assert _build.COMPILED
    assert FrameDecoder.next_frame is speedups.next_frame
    assert message.decode_message is speedups.decode_message
    assert frames.pure_next_frame is not speedups.next_frame


frame_stream = st.lists(st.tuples(st.integers(0, 2), st.binary(max_size=40)), max_size=8).map(
    lambda fs: b"".join(frames.encode_frame(t, d) for t, d in fs)
)


@settings(max_examples=300, deadline=None)
@given(
    stream=st.one_of(frame_stream, st.binary(max_size=80)),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    limit=st.sampled_from([16, 64, frames.DEFAULT_MAX_FRAME_SIZE]),
)
def test_frame_splitting_matches_the_reference(stream: bytes, cuts: list[int], limit: int) -> None:
    points = sorted({c for c in cuts if c < len(stream)} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)] or [b""]
    compiled = _frames(FrameDecoder(limit), speedups.next_frame, chunks)
    reference = _frames(FrameDecoder(limit), frames.pure_next_frame, chunks)
    assert compiled == reference


def _fields(frame: MessageFrame) -> dict[str, Any]:
    return {name: getattr(frame, name) for name in FIELDS}


@settings(max_examples=400, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=80),
        st.builds(
            lambda head, ext, rest: head + ext + rest,
            st.binary(min_size=26, max_size=26),
            st.sampled_from([b"", b"\x00", b"\x02\x00\x03abc", b"\x04\x00\x09", b"\x02\x00"]),
            st.binary(max_size=30),
        ),
    ),
    layout=st.sampled_from(LAYOUTS),
)
def test_message_decoding_matches_the_reference(data: bytes, layout: MessageLayout) -> None:
    compiled = _outcome(speedups.decode_message, data, layout, MessageFrame)
    reference = _outcome(message.pure_decode_message, data, layout, MessageFrame)
    if compiled[0] == "ok":
        assert reference[0] == "ok"
        assert type(compiled[1]) is type(reference[1])
        assert _fields(compiled[1]) == _fields(reference[1])
    else:
        assert compiled == reference


def test_extreme_values_decode_as_the_reference_does() -> None:
    data = struct.pack(">qH", -1, 65535) + b"\xff" * 16 + b"\xff" + b"\x00\x00"
    data += b"\xff" * 12 + b"body"
    for layout in LAYOUTS:
        compiled = speedups.decode_message(data, layout, MessageFrame)
        assert _fields(compiled) == _fields(message.pure_decode_message(data, layout, MessageFrame))


class _Subclass(MessageFrame):
    __slots__ = ("extra",)


class _OwnInit(MessageFrame):
    __slots__ = ("seen",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen = True


def test_subclasses_and_other_buffers_decode_as_the_reference_does() -> None:
    data = struct.pack(">qH", 7, 2) + bytes(range(16)) + b"body"
    plain = speedups.decode_message(data, LAYOUTS[1], _Subclass)
    assert type(plain) is _Subclass
    assert plain.body == b"body"
    own = speedups.decode_message(data, LAYOUTS[1], _OwnInit)
    assert own.seen is True  # a class with its own __init__ gets it called
    viewed = speedups.decode_message(memoryview(data), LAYOUTS[0], MessageFrame)
    assert viewed.body == b"body"


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=50), max_size=20),
    limit=st.integers(4, 600),
    as_tuple=st.booleans(),
)
def test_the_mpub_frame_matches_the_reference(
    bodies: list[bytes], limit: int, as_tuple: bool
) -> None:
    head = commands.mpub_head("topic", 3)
    elements: Any = tuple(bodies) if as_tuple else bodies
    compiled = _outcome(commands._mpub_frame, head, elements, limit)
    reference = _outcome(commands.pure_mpub_frame, head, elements, limit)
    assert compiled == reference
    if compiled[0] == "ok":
        assert type(compiled[1]) is bytes


@settings(max_examples=200, deadline=None)
@given(message_id=st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=20)))
def test_fin_matches_the_reference(message_id: bytes) -> None:
    assert commands.fin is speedups.fin
    compiled = _outcome(speedups.fin, message_id)
    assert compiled == _outcome(commands.pure_fin, message_id)
    assert _outcome(speedups.fin, bytearray(message_id)) == _outcome(
        commands.pure_fin, bytearray(message_id)
    )


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(
        st.one_of(
            st.binary(max_size=40), st.binary(max_size=5).map(bytearray), st.text(max_size=3)
        ),
        max_size=20,
    ),
    limit=st.integers(1, 50),
    as_tuple=st.booleans(),
)
def test_checked_size_matches_the_reference(bodies: list[Any], limit: int, as_tuple: bool) -> None:
    assert validation.checked_size is speedups.checked_size
    batch: Any = tuple(bodies) if as_tuple else bodies
    assert speedups.checked_size(batch, limit) == validation.pure_checked_size(batch, limit)


def test_the_mpub_frame_leaves_what_is_not_bytes_to_the_reference() -> None:
    head = commands.mpub_head("topic")
    assert speedups.mpub_frame(head, [b"a", bytearray(b"b")], 1000) is None
    assert speedups.mpub_frame(head, iter([b"a"]), 1000) is None
    mixed = [b"a", bytearray(b"b")]
    assert commands._mpub_frame(head, mixed, 1000) == commands.pure_mpub_frame(head, mixed, 1000)


# --------------------------------------------------------------------------- run_eager

eager_twin = _build.compiled("smartnsq.consumer._eager_speedups")


def test_the_compiled_run_eager_is_installed() -> None:
    from smartnsq.consumer import eager

    assert eager_twin is not None
    assert eager.run_eager is eager_twin.run_eager
    assert eager.pure_run_eager is not eager_twin.run_eager


async def _scenarios(run: Any) -> list[Any]:
    """The same coroutines through ``run``: what each gives back, and what ``done`` heard."""
    import asyncio

    loop = asyncio.get_running_loop()
    heard: list[Any] = []

    def done(arg: Any, exc: BaseException | None) -> None:
        heard.append((arg, type(exc).__name__ if exc is not None else None))

    async def returns() -> int:
        return 42

    async def raises() -> None:
        raise ValueError("bad")

    async def waits() -> str:
        await asyncio.sleep(0)
        return "later"

    async def cancels_itself() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    async def exits() -> None:
        raise SystemExit(3)

    outcomes: list[Any] = []
    for name, coro in [
        ("returns", returns()),
        ("raises", raises()),
        ("waits", waits()),
        ("cancels", cancels_itself()),
    ]:
        task = run(loop, coro, done, name)
        if not task.done():
            await asyncio.sleep(0.01)
        outcomes.append((name, task.done(), task.cancelled()))
        if not task.cancelled():
            outcomes.append(task.exception().__class__.__name__ if task.exception() else None)
            if task.exception() is None:
                outcomes.append(task.result())
    try:
        run(loop, exits(), done, "exits")
    except SystemExit as exc:
        outcomes.append(("exits", exc.code))
    return [outcomes, heard]


async def test_run_eager_matches_the_reference() -> None:
    from smartnsq.consumer import eager

    assert eager_twin is not None
    assert await _scenarios(eager_twin.run_eager) == await _scenarios(eager.pure_run_eager)
