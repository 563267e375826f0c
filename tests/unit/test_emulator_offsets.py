"""The emulator's consume-position rules (smartnsq.testing.offsets), without sockets."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from smartnsq.protocol.server_session import Peer
from smartnsq.testing.offsets import (
    REREAD_WINDOW,
    ConsumeOffset,
    OffsetError,
    locate_position,
    parse_position,
    seek_channel,
)
from smartnsq.testing.state import Channel, Delivery, PartitionLog


def _log(bodies: list[bytes], timestamps: list[int] | None = None) -> PartitionLog:
    log = PartitionLog(0, ext=False, classic=False, topic_name="t")
    for i, body in enumerate(bodies):
        log._append(body, 0, None, b"", None, timestamps[i] if timestamps else None)
    return log


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"virtual_queue:1960", ConsumeOffset("virtual_queue", 1960)),
        (b"msgcount:0", ConsumeOffset("msgcount", 0)),
        (b"timestamp:+5", ConsumeOffset("timestamp", 5)),
        (b"special:-1", ConsumeOffset("special", -1)),
    ],
)
def test_parse(data: bytes, expected: ConsumeOffset) -> None:
    assert parse_position(data) == expected


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"", "invalid consume offset:"),
        (b"msgcount", "invalid consume offset:msgcount"),
        (b"Msgcount:1", "invalid consume offset:Msgcount:1"),
        (b"msgcount:1:", "invalid consume offset:msgcount:1:"),
        (b"msgcount: 1", 'strconv.ParseInt: parsing " 1": invalid syntax'),
        (
            b"msgcount:9223372036854775808",
            'strconv.ParseInt: parsing "9223372036854775808": value out of range',
        ),
    ],
)
def test_parse_refuses_as_from_bytes_does(data: bytes, text: str) -> None:
    with pytest.raises(OffsetError) as caught:
        parse_position(data)
    assert str(caught.value) == text


def test_locate() -> None:
    # raw sizes 32, 33, 34: offsets 0, 32, 65; end 99
    log = _log([b"aa", b"bbb", b"cccc"], [5_000_000_000, 6_000_000_000, 6_500_000_000])
    cases = {
        ConsumeOffset("virtual_queue", 0): 0,
        ConsumeOffset("virtual_queue", 1): 1,  # inside the first: the next boundary
        ConsumeOffset("virtual_queue", 32): 1,
        ConsumeOffset("virtual_queue", 99): 3,
        ConsumeOffset("virtual_queue", 10**6): 3,  # past the end: the end, without an error
        ConsumeOffset("virtual_queue", -7): 0,
        ConsumeOffset("msgcount", 1): 0,
        ConsumeOffset("msgcount", 0): 0,
        ConsumeOffset("msgcount", 3): 2,
        ConsumeOffset("msgcount", 4): 3,
        ConsumeOffset("msgcount", 999): 3,
        ConsumeOffset("timestamp", 6): 1,
        ConsumeOffset("timestamp", 7): 3,
        ConsumeOffset("timestamp", 0): 0,
        # nsqd's int64 nanoseconds wrap round: 290448384 ns after the epoch, before every
        # message (the client refuses such seconds; nsqd does not)
        ConsumeOffset("timestamp", 18_446_744_074): 0,
        ConsumeOffset("special", -1): 3,
    }
    assert {position: locate_position(log, position) for position in cases} == cases


@pytest.mark.parametrize(
    ("position", "text"),
    [
        (ConsumeOffset("special", 0), "not supported offset type"),
        (ConsumeOffset("timestamp", -1), "Invalid timestamp -1"),
        # the second times 1e9 overflows int64 into a negative number in nsqd
        (ConsumeOffset("timestamp", 9_300_000_000), "Invalid timestamp 9300000000"),
    ],
)
def test_locate_refuses(position: ConsumeOffset, text: str) -> None:
    with pytest.raises(OffsetError) as caught:
        locate_position(_log([b"x"]), position)
    assert str(caught.value) == text


def test_an_empty_queue_has_only_its_end() -> None:
    log = _log([])
    assert locate_position(log, ConsumeOffset("special", -1)) == 0
    for kind in ("virtual_queue", "msgcount", "timestamp"):
        with pytest.raises(OffsetError, match="commit log end of file"):
            locate_position(log, ConsumeOffset(kind, 1))


class _Client:
    def __init__(self) -> None:
        self.rdy = 100
        self.in_flight = 0
        self.peer = Peer.initial(youzan=True, heartbeat_interval=30.0, msg_timeout=60.0)
        self.label = "client"
        self.got: list[Delivery] = []

    def deliver_many(self, deliveries: list[Delivery]) -> None:
        self.got.extend(deliveries)


def _channel(count: int) -> tuple[Channel, _Client, list[Callable[[], None]]]:
    pending: list[Callable[[], None]] = []
    log = _log([b"m%d" % i for i in range(count)])
    channel = Channel(
        "c", log, start_index=0, schedule=pending.append, clock=lambda: 0.0, record=None
    )
    log.channels["c"] = channel
    client = _Client()
    channel.add_client(client)
    return channel, client, pending


def _run(pending: list[Callable[[], None]]) -> None:
    while pending:
        pending.pop(0)()


def test_a_seek_forgets_what_is_in_flight_and_rereads_out_of_order() -> None:
    channel, client, pending = _channel(REREAD_WINDOW + 10)
    client.rdy = 3
    _run(pending)
    assert [d.record.index for d in client.got] == [0, 1, 2]
    held = client.got[0].record.id
    client.got.clear()
    seek_channel(channel, 5, reorder=True)
    assert client.in_flight == 0
    assert not channel.in_flight
    assert not channel.finish(held, client)  # forgotten: its FIN fails
    client.rdy = 100
    _run(pending)
    order = [d.record.index for d in client.got]
    assert sorted(order) == list(range(5, REREAD_WINDOW + 10))
    window = order[:REREAD_WINDOW]
    assert window != sorted(window)
    assert order[REREAD_WINDOW:] == sorted(order[REREAD_WINDOW:])  # then queue order
    assert channel.confirmed_index() == 5


def test_the_reread_order_is_deterministic_and_never_sorted() -> None:
    orders = []
    for _ in range(2):
        channel, client, pending = _channel(2)
        seek_channel(channel, 0, reorder=True)
        _run(pending)
        orders.append([d.record.index for d in client.got])
    assert orders == [[1, 0], [1, 0]]


@pytest.mark.parametrize("ordered", [True, False])
def test_no_reordering_for_ordered_channels_or_a_sub_start(ordered: bool) -> None:
    channel, client, pending = _channel(5)
    channel.ordered = ordered
    seek_channel(channel, 1, reorder=ordered)  # ordered channel, or reorder=False
    client.rdy = 1 if ordered else 100
    for _ in range(4):
        _run(pending)
        if ordered and client.got:
            channel.finish(client.got[-1].record.id, client)
    assert [d.record.index for d in client.got] == [1, 2, 3, 4]
