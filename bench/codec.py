"""Codec micro-benchmark: frames/s and messages/s decoded, commands/s encoded.

Runs on one core, pure protocol floor (no sockets). 100-byte bodies, the stream fed in
64 KiB reads as a socket would deliver it. Usage: python bench/codec.py [--messages N]
"""

from __future__ import annotations

import argparse
import os
import struct
import time
from collections.abc import Callable

from smartnsq.protocol import commands
from smartnsq.protocol.frames import FrameDecoder
from smartnsq.protocol.message import (
    MessageFrame,
    MessageLayout,
    decode_message,
    encode_message_frame,
)

BODY = b"x" * 100
READ_SIZE = 65536


def _stream(layout: MessageLayout, count: int) -> bytes:
    frames = []
    for i in range(count):
        message_id = struct.pack(">QQ", i, 0) if layout.binary_id else b"%016x" % i
        frames.append(
            encode_message_frame(
                1_700_000_000_000_000_000 + i,
                1,
                message_id,
                BODY,
                ext_version=(4 if i % 2 else 0) if layout.ext else None,
                ext_raw=b'{"k":"v"}' if layout.ext and i % 2 else b"",
                offset=i * 130 if layout.detail else None,
                raw_size=130 if layout.detail else None,
            )
        )
    return b"".join(frames)


def _best(fn: Callable[[], int], rounds: int) -> float:
    """Best ops/s of several rounds (CPU time of this process)."""
    best = 0.0
    for _ in range(rounds):
        start = time.process_time()
        ops = fn()
        elapsed = time.process_time() - start
        best = max(best, ops / elapsed)
    return best


def bench_decode(layout: MessageLayout, count: int, rounds: int) -> tuple[float, float]:
    stream = _stream(layout, count)
    chunks = [stream[i : i + READ_SIZE] for i in range(0, len(stream), READ_SIZE)]

    def frames_only() -> int:
        decoder = FrameDecoder()
        n = 0
        for chunk in chunks:
            decoder.feed(chunk)
            n += len(decoder.drain())
        return n

    def messages() -> int:
        decoder = FrameDecoder()
        n = 0
        for chunk in chunks:
            decoder.feed(chunk)
            for frame in decoder.drain():
                decode_message(frame.data, layout, MessageFrame)
                n += 1
        return n

    return _best(frames_only, rounds), _best(messages, rounds)


def bench_encode(count: int, rounds: int) -> dict[str, float]:
    ids = [struct.pack(">QQ", i, 0) for i in range(count)]

    def pub() -> int:
        for _ in range(count):
            commands.pub("orders", BODY, 3)
        return count

    def pub_trace() -> int:
        for i in range(count):
            commands.pub_trace("orders", BODY, i, 3)
        return count

    def mpub100() -> int:
        batch = [BODY] * 100
        for _ in range(count // 100):
            commands.mpub("orders", batch, 3)
        return count

    def fin() -> int:
        for message_id in ids:
            commands.fin(message_id)
        return count

    def rdy() -> int:
        for i in range(count):
            commands.rdy(i % 2500)
        return count

    return {
        "PUB": _best(pub, rounds),
        "PUB_TRACE": _best(pub_trace, rounds),
        "MPUB (msgs in batches of 100)": _best(mpub100, rounds),
        "FIN": _best(fin, rounds),
        "RDY": _best(rdy, rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    layouts = {
        "classic (hex id)": MessageLayout.classic(),
        "youzan": MessageLayout.youzan(),
        "youzan + detail (SUB_ORDERED)": MessageLayout.youzan(detail=True),
        "youzan + ext + detail": MessageLayout.youzan(ext=True, detail=True),
    }
    print(f"decode, 100-byte bodies, {args.messages} messages, best of {args.rounds} (CPU time)")
    print(f"{'layout':32} {'frames/s':>12} {'messages/s':>12}")
    for name, layout in layouts.items():
        frames, msgs = bench_decode(layout, args.messages, args.rounds)
        print(f"{name:32} {frames:12,.0f} {msgs:12,.0f}")
    print()
    print(f"{'encode':32} {'commands/s':>12}")
    for name, rate in bench_encode(args.messages, args.rounds).items():
        print(f"{name:32} {rate:12,.0f}")


if __name__ == "__main__":
    main()
