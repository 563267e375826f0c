"""``smartnsq pub`` reading a stdin that stays open, sharding keys as the API takes them,
and empty lines (issue 13). Real subprocesses against the embedded cluster, as in
test_cli.py (whose helpers these tests share)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import signal
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import pytest

from smartnsq.producer.producer import Producer
from smartnsq.routing.sharding import INT64_MAX, INT64_MIN, Sharder
from smartnsq.testing import Cluster
from tests.integration.test_cli import (
    SMARTNSQ,
    SUMMARY,
    Result,
    _bodies,
    _env,
    _finish,
    _one_error_line,
    closed_port,
    cluster,
    smartnsq,
)

__all__ = ["closed_port", "cluster"]  # fixtures, shared with test_cli.py

# --------------------------------------------------------------------------- stdin left open


class OpenStdin:
    """``smartnsq pub ...`` whose stdin is a pipe this test writes to and keeps open, as
    ``tail -f app.log | smartnsq pub`` does."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def receipts(self, count: int) -> list[str]:
        """The next ``count`` trace receipt lines (--trace): messages the command has seen
        confirmed, not only stored by nsqd."""
        assert self.proc.stdout is not None
        lines = [await asyncio.wait_for(self.proc.stdout.readline(), 20) for _ in range(count)]
        assert all(line.startswith(b"partition=") for line in lines), lines
        return [line.decode() for line in lines]

    def unread(self) -> int:
        """Bytes written to the pipe and not read by the command yet."""
        assert self.proc.stdin is not None
        pipe = self.proc.stdin.get_extra_info("pipe")
        (count,) = struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4))
        return int(count)

    async def finish(self, timeout: float = 20.0) -> Result:
        """Wait for the command to end by itself: stdin stays open."""
        return await _finish(self.proc, timeout)


@contextlib.asynccontextmanager
async def pub_open_stdin(*args: str) -> AsyncIterator[OpenStdin]:
    proc = await asyncio.create_subprocess_exec(
        *SMARTNSQ,
        "pub",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    try:
        yield OpenStdin(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()


def _clean_exit(result: Result, code: int) -> None:
    """Exit ``code``, no traceback, no interpreter abort (SIGABRT, "Fatal Python error")."""
    assert result.rc == code, result
    assert "Traceback" not in result.err, result.err
    assert "Fatal Python error" not in result.err, result.err


async def test_pub_error_with_stdin_open_exits_1(cluster: Cluster) -> None:
    async with pub_open_stdin("nosuch", "--lookupd", cluster.lookupd_url) as pub:
        await pub.write(b"1\n2\n3\n")
        result = await pub.finish()
    line = _one_error_line(result, 1)
    assert line.startswith("smartnsq pub: error: topic 'nosuch' not found"), line


async def test_pub_failure_mid_stream_with_stdin_open_exits_1() -> None:
    async with Cluster(classic=True) as classic:
        nsqd = classic.nsqd_addresses[0]
        args = ("events", "--nsqd", nsqd, "--timeout", "1", "--trace")
        async with pub_open_stdin(*args) as pub:
            await pub.write(b"a\nb\n")
            await pub.receipts(2)  # classic nsqd: "partition=- ...", once confirmed
            await classic.stop_node(0)
            await pub.write(b"c\n")
            result = await pub.finish()
    line = _one_error_line(result, 1)
    assert line.startswith("smartnsq pub: error: "), line
    assert line.endswith("(2 messages published before it, through stdin line 2)"), line


@pytest.mark.parametrize("address", ["--nsqd", "--lookupd"])
async def test_pub_nothing_listening_with_stdin_open_exits_1(
    closed_port: int, address: str
) -> None:
    target = f"127.0.0.1:{closed_port}"
    async with pub_open_stdin("orders", address, target) as pub:
        await pub.write(b"1\n")
        result = await pub.finish()
    _clean_exit(result, 1)
    assert len(result.err_lines) == 1, result.err


async def test_pub_oversized_line_mid_stream_with_stdin_open(cluster: Cluster) -> None:
    args = ("orders", "--lookupd", cluster.lookupd_url, "--partition", "3")
    async with pub_open_stdin(*args) as pub:
        await pub.write(b"first\n" + b"x" * (1024 * 1024 + 1) + b"\nlast\n")
        result = await pub.finish()
    line = _one_error_line(result, 2)
    assert line == (
        "smartnsq pub: error: stdin line 2 is over the maximum message size of 1048576 bytes "
        "(1 message published before it)"
    )
    assert _bodies(cluster, "orders", 3) == [b"first"]


async def test_pub_oversized_line_without_newline_fails_before_reading_it_all(
    cluster: Cluster,
) -> None:
    """A line longer than a message can be is refused as soon as it is, not buffered."""
    args = ("orders", "--lookupd", cluster.lookupd_url, "--partition", "1")
    async with pub_open_stdin(*args) as pub:
        await pub.write(b"ok\n" + b"y" * (1024 * 1024 + 10))  # no newline, stdin open
        result = await pub.finish()
    line = _one_error_line(result, 2)
    assert line.startswith("smartnsq pub: error: stdin line 2 is over the maximum"), line
    assert _bodies(cluster, "orders", 1) == [b"ok"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_pub_signal_with_stdin_open_exits_130(
    cluster: Cluster, signum: signal.Signals
) -> None:
    args = ("orders", "--lookupd", cluster.lookupd_url, "--partition", "0")
    async with pub_open_stdin(*args) as pub:
        await pub.write(b"a\nb\n")
        await cluster.wait_for(lambda: len(_bodies(cluster, "orders", 0)) == 2)
        pub.proc.send_signal(signum)
        result = await pub.finish()
    _clean_exit(result, 130)
    summary, note = result.err_lines
    match = SUMMARY.fullmatch(summary)
    assert match is not None, summary
    assert match.groups() == ("2", "orders")
    assert note == "smartnsq pub: interrupted: stopped reading stdin after line 2"
    assert _bodies(cluster, "orders", 0) == [b"a", b"b"]


async def _publishing_slowly(
    cluster: Cluster, pub: OpenStdin, partition: int, latency: float
) -> int:
    """``pub`` (with --trace) is connected, and from now on the partition's leader (its
    index, returned) answers ``latency`` seconds late."""
    await pub.write(b"warm-up\n")
    await pub.receipts(1)
    leader = cluster.leader("orders", partition)
    assert leader is not None
    cluster.set_latency(leader, latency)
    return leader


PARTIAL = b"d, still without its newline"


async def test_pub_first_signal_still_publishes_the_lines_read(cluster: Cluster) -> None:
    """Lines taken from the pipe exist nowhere else: the first signal publishes them."""
    args = ("orders", "--lookupd", cluster.lookupd_url, "--partition", "2", "--trace")
    async with pub_open_stdin(*args) as pub:
        await _publishing_slowly(cluster, pub, 2, 1.0)
        await pub.write(b"a\n")  # answered late: meanwhile b and c are read
        await cluster.wait_for(lambda: len(_bodies(cluster, "orders", 2)) == 2)
        await pub.write(b"b\nc\n" + PARTIAL)
        await cluster.wait_for(lambda: pub.unread() == 0)
        pub.proc.send_signal(signal.SIGINT)
        result = await pub.finish()
    _clean_exit(result, 130)
    assert _bodies(cluster, "orders", 2) == [b"warm-up", b"a", b"b", b"c"]
    assert len(result.out.splitlines()) == 3  # the receipts of a, b and c
    summary, note = result.err_lines
    match = SUMMARY.fullmatch(summary)
    assert match is not None, summary
    assert match.group(1) == "4"
    assert note == (
        "smartnsq pub: interrupted: stopped reading stdin after line 4; the next line had "
        f"no newline yet and was not published ({len(PARTIAL)} bytes read)"
    )


async def test_pub_second_signal_exits_at_once_saying_what_is_unpublished(
    cluster: Cluster,
) -> None:
    args = ("orders", "--lookupd", cluster.lookupd_url, "--partition", "1", "--timeout", "60")
    async with pub_open_stdin(*args, "--trace") as pub:
        leader = await _publishing_slowly(cluster, pub, 1, 30.0)  # a hung publish
        await pub.write(b"a\n")
        await cluster.wait_for(lambda: len(_bodies(cluster, "orders", 1)) == 2)
        await pub.write(b"b\n")
        await cluster.wait_for(lambda: pub.unread() == 0)
        pub.proc.send_signal(signal.SIGINT)  # stop reading, publish b after a...
        pub.proc.send_signal(signal.SIGTERM)  # ...no: stop now
        result = await pub.finish(timeout=10)
        cluster.set_latency(leader, 0.0)
    _clean_exit(result, 130)
    assert result.out == ""  # a was never confirmed
    assert result.err_lines == [
        "smartnsq pub: interrupted: 1 message published; 2 lines read from stdin not "
        "published (the last 1 sent may have arrived)"
    ]


async def test_pub_reads_a_regular_file_and_dev_null(cluster: Cluster, tmp_path: Path) -> None:
    """Files the event loop cannot watch (regular files, /dev/null) are read directly."""
    path = tmp_path / "lines.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(3000)))
    for stdin_path, count in ((path, 3000), (Path(os.devnull), 0)):
        with stdin_path.open("rb") as stdin:
            proc = await asyncio.create_subprocess_exec(
                *SMARTNSQ, "pub", "orders", "--lookupd", cluster.lookupd_url,
                "--sharding-key", "file", stdin=stdin, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=_env(),
            )  # fmt: skip
            result = await _finish(proc)
        _clean_exit(result, 0)
        match = SUMMARY.fullmatch(result.err.strip())
        assert match is not None, result.err
        assert match.group(1) == str(count)
    partition = Sharder("java").partition_for("file", 4)
    assert _bodies(cluster, "orders", partition) == [b"line %d" % i for i in range(3000)]


@contextlib.contextmanager
def _terminal() -> Iterator[tuple[int, int]]:
    controller, terminal = pty.openpty()
    try:
        yield controller, terminal
    finally:
        os.close(controller)
        os.close(terminal)


async def test_pub_from_a_terminal_says_it_reads_stdin(cluster: Cluster) -> None:
    with _terminal() as (controller, terminal):
        proc = await asyncio.create_subprocess_exec(
            *SMARTNSQ, "pub", "orders", "--lookupd", cluster.lookupd_url, "--partition", "0",
            stdin=terminal, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=_env(),
        )  # fmt: skip
        os.write(controller, b"typed\n\x04")  # a line, then Ctrl-D
        result = await _finish(proc)
    _clean_exit(result, 0)
    hint, summary = result.err_lines
    assert hint == "smartnsq pub: reading messages from stdin, one per line (Ctrl-D to end)"
    assert SUMMARY.fullmatch(summary), summary
    assert _bodies(cluster, "orders", 0) == [b"typed"]


# --------------------------------------------------------------------------- sharding keys


def _api_key(text: str) -> int | str:
    """The key a Python program means by ``text``: an int if it is one written the plain way
    and fits a Java long, else the string (the documented --key-type auto rule)."""
    try:
        value = int(text)
    except ValueError:
        return text
    plain = str(value) == text and text.isascii()
    return value if plain and INT64_MIN <= value <= INT64_MAX else text


# Numbers (most small ones land elsewhere when hashed as text) and the edges of the rule:
# signs, 64-bit bounds, leading zeros, other numerals, plain strings.
EDGE_KEYS = [
    "-1", "-123456789", str(INT64_MAX), str(INT64_MIN), str(INT64_MAX + 1),
    str(INT64_MIN - 1), "007", "+5", "-0", "1e3", "0x1f", "١٢", " 7", "customer-7",
]  # fmt: skip
JAVA_KEYS = [str(k) for k in range(0, 1000, 41)] + EDGE_KEYS
MURMUR3_KEYS = ["10", "999", "-1", "007", str(INT64_MAX + 1), "customer-7"]

# The command's entry point, called once per argument list in one interpreter: the same
# code as the `smartnsq` executable, without an interpreter start per key.
RUNNER = """
import json, sys
from smartnsq.cli import main
for argv in json.load(sys.stdin):
    code = main(argv)
    print(f"exit={code}", flush=True)
"""

Case = tuple[str, tuple[str, ...], int | str]  # CLI key, CLI options, the API's key


async def _cli_partitions(cluster: Cluster, cases: list[Case]) -> list[int]:
    """The partition ``smartnsq pub --trace --sharding-key KEY OPTIONS`` reports per case."""
    runs = [
        ["pub", "orders", "--lookupd", cluster.lookupd_url, "--trace", "-q",
         "--sharding-key", key, *options, "--", f"case {number}"]
        for number, (key, options, _) in enumerate(cases)
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RUNNER, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(runs).encode()), 60)
    assert proc.returncode == 0, err.decode()
    assert err == b"", err.decode()
    lines = out.decode().splitlines()
    assert len(lines) == 2 * len(cases), lines
    partitions = []
    for receipt, code in zip(lines[::2], lines[1::2], strict=True):
        assert code == "exit=0", (receipt, code)
        fields = dict(item.split("=", 1) for item in receipt.split(" "))
        partitions.append(int(fields["partition"]))
    return partitions


async def _check_keys(
    cluster: Cluster, strategy: Literal["java", "murmur3"], cases: list[Case]
) -> None:
    """The CLI's partition for each key is the Sharder's and the Producer's for the API
    key, and the message is there."""
    sharder = Sharder(strategy)
    reported = await _cli_partitions(cluster, cases)
    expected = [sharder.partition_for(api_key, 4) for _, _, api_key in cases]
    async with Producer(lookupd=[cluster.lookupd_url], sharding=strategy) as producer:
        api = [
            (await producer.publish("orders", b"api", sharding_key=api_key)).partition
            for _, _, api_key in cases
        ]
    keys = [(key, options) for key, options, _ in cases]
    assert list(zip(keys, reported, strict=True)) == list(zip(keys, expected, strict=True))
    assert api == expected
    for number, partition in enumerate(reported):
        assert f"case {number}".encode() in _bodies(cluster, "orders", partition)


async def test_pub_sharding_key_lands_where_the_api_puts_it(cluster: Cluster) -> None:
    sharder = Sharder("java")
    differ = [
        k for k in range(1000) if sharder.partition_for(k, 4) != sharder.partition_for(str(k), 4)
    ]
    assert len(differ) == 750  # issue 13: the type of a key decides its partition
    cases: list[Case] = [(key, (), _api_key(key)) for key in JAVA_KEYS]
    assert [_api_key(key) for key in EDGE_KEYS[:6]] == [
        -1, -123456789, INT64_MAX, INT64_MIN, str(INT64_MAX + 1), str(INT64_MIN - 1)
    ]  # fmt: skip
    assert all(isinstance(_api_key(key), str) for key in EDGE_KEYS[6:])
    # --key-type says what the key is, instead of the rule
    cases += [("10", ("--key-type", "str"), "10"), ("007", ("--key-type", "int"), 7)]
    cases += [("-0", ("--key-type", "int"), 0), ("10", ("--key-type", "int"), 10)]
    cases += [("10", ("--sharding", "java"), 10)]
    await _check_keys(cluster, "java", cases)


async def test_pub_murmur3_sharding_key(cluster: Cluster) -> None:
    cases: list[Case] = [(key, ("--sharding", "murmur3"), _api_key(key)) for key in MURMUR3_KEYS]
    cases.append(("007", ("--sharding", "murmur3", "--key-type", "int"), 7))
    await _check_keys(cluster, "murmur3", cases)


# --------------------------------------------------------------------------- empty lines


async def test_pub_skip_empty(cluster: Cluster) -> None:
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url, "--partition",
                            "0", "--skip-empty", stdin=b"\na\n\nb\n\n\nc")  # fmt: skip
    assert result.rc == 0, result
    assert _bodies(cluster, "orders", 0) == [b"a", b"b", b"c"]
    assert result.err.startswith("published 3 messages to orders in ")
    assert result.err.endswith(" msg/s), 4 empty lines skipped\n")


async def test_pub_empty_line_error_names_its_line_after_whole_batches(cluster: Cluster) -> None:
    """The lines before the empty one are published first (here in batches of 2)."""
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url, "--partition",
                            "2", "--batch-size", "2", stdin=b"a\nb\nc\n\nd\n")  # fmt: skip
    line = _one_error_line(result, 2)
    assert line == (
        "smartnsq pub: error: stdin line 4 is empty: NSQ messages cannot be empty "
        "(3 messages published before it; --skip-empty skips empty lines)"
    )
    assert _bodies(cluster, "orders", 2) == [b"a", b"b", b"c"]


# --------------------------------------------------------------------------- classic


async def test_a_sharding_key_on_classic_nsqd_is_explained() -> None:
    """Classic nsqd has no partitions: the key picks an nsqd, as the API does, and the
    command says so instead of passing over it in silence."""
    async with Cluster(classic=True, nodes=2) as classic:
        result = await smartnsq(
            "pub", "t", "--lookupd", classic.lookupd_url, "--sharding-key", "42", "a", "b"
        )
        _clean_exit(result, 0)
        async with Producer(lookupd=[classic.lookupd_url]) as producer:
            nsqd = (await producer.publish("t", b"probe", sharding_key=42)).address
        notes = [line for line in result.err_lines if line.startswith("smartnsq pub: note:")]
        assert notes == [
            "smartnsq pub: note: classic nsqd has no partitions: --sharding-key chose the nsqd "
            f"({nsqd}), the same one for the same key, as the Python API does; it orders "
            "nothing by itself"
        ]
        # Without a key, no note.
        plain = await smartnsq("pub", "t", "--lookupd", classic.lookupd_url, "c")
        _clean_exit(plain, 0)
        assert "note:" not in plain.err


# --------------------------------------------------------------------------- the summary


async def test_the_summary_times_the_whole_publish(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding the partitions and connecting is most of a short publish: the summary's time
    and rate count it (they once started after it, giving "0.00 s (240150 msg/s)" for a
    command that took 0.26 s)."""
    from smartnsq.cli import build_parser, pub
    from smartnsq.cli._common import resolve_target

    slow_start = 0.5  # seconds the producer's start is made to take, on pub's clock
    skew = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(pub, "time", SimpleNamespace(perf_counter=lambda: real() + skew[0]))
    start = Producer.start

    async def slow(self: Producer) -> None:
        skew[0] += slow_start
        await start(self)

    monkeypatch.setattr(Producer, "start", slow)
    args = build_parser().parse_args(["pub", "orders", "a", "b", "--lookupd", cluster.lookupd_url])
    publisher = pub._Publisher(args, "orders", resolve_target(args), None, None)
    assert await publisher.main([b"a", b"b"]) == 0
    summary = SUMMARY.search(capsys.readouterr().err)
    assert summary is not None
    seconds = float(summary.group(0).split(" in ")[1].split(" s ")[0])
    assert seconds >= slow_start
