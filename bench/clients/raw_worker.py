"""The raw asyncio ceiling: what any asyncio NSQ client pays at least per message.

Standard library only (and uvloop with ``--loop=uvloop``), no client library: one minimal
``asyncio.Protocol`` per connection that parses frames from its buffer and answers them.

- ``consume``: SUB (``SUB_ORDERED`` with ``--ordered``) on every partition (youzan, found
  through ``--lookupd``) or on the ``--nsqd`` given, ``RDY --max-in-flight``, and a FIN for
  every message frame, the FINs of one read in one write.
- ``pub1``: one PUB written, its OK awaited (a future per publish, as a coroutine caller
  needs), then the next.

A client's CPU per message over this row's is its own cost: what it does beyond reading a
frame and writing the answer on the same event loop (issue 35).
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
import urllib.request
from typing import Any

from _worker import BODY, Meter, Result, emit, parse_args, percentiles, run_loop

_SIZE = struct.Struct(">l")
_HEAD = struct.Struct(">ll")
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
HEARTBEAT = b"_heartbeat_"
IDENTIFY = json.dumps({"client_id": "raw", "hostname": "raw", "feature_negotiation": True})


def _command(line: str, body: bytes | None = None) -> bytes:
    head = line.encode() + b"\n"
    return head if body is None else head + _SIZE.pack(len(body)) + body


class Raw(asyncio.Protocol):
    """One connection: frames in, the answers out."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None  # the next response frame
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.counter: Counter | None = None  # consuming: FIN each message

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        error = exc or ConnectionError("connection closed")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        if not self.closed.done():
            self.closed.set_result(None)

    def write(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionError("not connected")
        self.transport.write(data)

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        self.waiter = self.loop.create_future()
        self.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        size = len(buffer)
        at = 0
        fins: list[bytes] = []
        while size - at >= 8:
            length, kind = _HEAD.unpack_from(buffer, at)
            end = at + 4 + length
            if end > size:
                break
            if kind == FRAME_MESSAGE:
                # 8 bytes of timestamp, 2 of attempts, then the 16-byte id
                fins.append(b"FIN " + buffer[at + 18 : at + 34] + b"\n")
            elif kind == FRAME_ERROR:
                # youzan sends an ordered channel's first message twice, and the FIN of the
                # copy not in flight fails, non-fatal (docs/protocol.md)
                if not buffer.startswith(b"E_FIN_FAILED", at + 8):
                    raise RuntimeError(f"nsqd answered an error: {bytes(buffer[at + 8 : end])!r}")
            elif buffer[at + 8 : end] == HEARTBEAT:
                fins.append(b"NOP\n")
            elif self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(bytes(buffer[at + 8 : end]))
            at = end
        del buffer[:at]
        if fins:
            self.write(b"".join(fins))
            if self.counter is not None:
                self.counter.add(len(fins))


class Counter:
    """Messages FINed over every connection; ``done`` once ``expected`` were."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add(self, count: int) -> None:
        self.count += count
        if self.count >= self.expected and not self.done.done():
            self.done.set_result(None)


async def connect(address: str) -> Raw:
    host, port = address.rsplit(":", 1)
    _, conn = await asyncio.get_running_loop().create_connection(Raw, host, int(port))
    conn.write(b"  V2")
    await conn.request(_command("IDENTIFY", IDENTIFY.encode()))
    return conn


def partitions(lookupd: str, topic: str) -> list[tuple[str, int]]:
    """(nsqd TCP address, partition id) of every partition of a youzan topic (setup)."""
    request = urllib.request.Request(
        f"{lookupd}/lookup?topic={topic}&access=r",
        headers={"Accept": "application/vnd.nsq; version=1.0"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        found = json.loads(answer.read())
    return [
        (f"{node['broadcast_address']}:{node['tcp_port']}", int(partition))
        for partition, node in sorted(found["partitions"].items(), key=lambda kv: int(kv[0]))
    ]


async def consume(args: Any, result: Result) -> None:
    if args.lookupd:
        targets: list[tuple[str, int | None]] = list(partitions(args.lookupd[0], args.topic))
    else:
        targets = [(address, None) for address in args.nsqd]
    verb = "SUB_ORDERED" if args.ordered else "SUB"
    counter = Counter(args.messages)
    meter = Meter(args.cluster_pid)
    meter.start()
    conns = []
    for address, partition in targets:
        conn = await connect(address)
        conns.append(conn)
        line = f"{verb} {args.topic} {args.channel}"
        await conn.request(_command(line if partition is None else f"{line} {partition}"))
        conn.counter = counter
        conn.write(_command(f"RDY {args.max_in_flight}"))
    try:
        await asyncio.wait_for(counter.done, args.timeout)
        meter.stop()
    finally:
        for conn in conns:
            if conn.transport is not None:
                conn.transport.close()
    meter.fill(result, args.messages)
    result.extra = {"connections": len(conns), "ordered": args.ordered}


async def pub1(args: Any, result: Result) -> None:
    if not args.nsqd:
        raise SystemExit("raw pub1: --nsqd only")
    conn = await connect(args.nsqd[0])
    command = _command(f"PUB {args.topic}", BODY)
    latencies: list[int] = []
    clock = time.perf_counter_ns

    async def run(messages: int) -> None:
        for _ in range(messages):
            t0 = clock()
            await conn.request(command)
            latencies.append(clock() - t0)

    meter = Meter(args.cluster_pid)
    try:
        await run(args.warmup)
        latencies.clear()
        meter.start()
        await asyncio.wait_for(run(args.messages), args.timeout)
        meter.stop()
    finally:
        if conn.transport is not None:
            conn.transport.close()
    meter.fill(result, args.messages)
    result.latency_us = percentiles(latencies)


def main() -> int:
    args = parse_args("raw", ("consume", "pub1"))
    version = "uvloop" if args.loop == "uvloop" else f"asyncio {sys.version.split()[0]}"
    result = Result("raw", version, args.workload)
    run_loop((consume if args.workload == "consume" else pub1)(args, result), args.loop)
    result.extra["loop"] = args.loop
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
