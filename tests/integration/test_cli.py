"""The ``smartnsq`` command line, run as subprocesses against the embedded cluster.

The cluster lives in the test's event loop, so every subprocess is awaited with
``asyncio.create_subprocess_exec``: the loop keeps serving the cluster meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import pytest

from smartnsq.producer.producer import Producer
from smartnsq.publishing.stamps import STAMP_KEY, parse_stamp
from smartnsq.routing.sharding import Sharder
from smartnsq.testing import Cluster

SMARTNSQ = (sys.executable, "-m", "smartnsq")
SUMMARY = re.compile(r"published (\d+) messages? to (\S+) in \d+\.\d\d s \(\d+ msg/s\)")
TAIL_LINE = re.compile(r"partition=(\S+) offset=(\S+) trace_id=(\S+) attempts=(\d+) (.*)")


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without the user's SMARTNSQ_* defaults, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTNSQ_")}
    env.update(extra)
    return env


async def smartnsq(
    *args: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *SMARTNSQ,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else _env(),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@contextlib.asynccontextmanager
async def spawn(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """A long-running command (tail); killed if the test leaves it running."""
    proc = await asyncio.create_subprocess_exec(
        *SMARTNSQ,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _finish(proc: asyncio.subprocess.Process, timeout: float = 20.0) -> Result:
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = await asyncio.wait_for(
        asyncio.gather(proc.stdout.read(), proc.stderr.read()), timeout
    )
    rc = await asyncio.wait_for(proc.wait(), timeout)
    return Result(rc, out.decode(), err.decode())


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=3, lookupds=2) as c:
        # Channels that SUB may create (tail's ephemeral ones), and one so producers can write.
        for name, partitions, replicas, ordered, ext in (
            ("orders", 4, 2, False, False),
            ("ordered", 4, 2, True, False),
            ("ext", 2, 1, False, True),
        ):
            await c.create_topic(name, partitions, replicas, ordered=ordered, ext=ext)
            await c.create_channel_on_leaders(name, "audit")
        yield c


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on: bound (so nobody else takes it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _bodies(cluster: Cluster, topic: str, partition: int) -> list[bytes]:
    return [r.body for r in cluster.messages(topic, partition)]


def _one_error_line(result: Result, code: int) -> str:
    assert result.rc == code, result
    assert "Traceback" not in result.err
    assert len(result.err_lines) == 1, result.err
    return result.err_lines[0]


def _subscribed(cluster: Cluster, topic: str, prefix: str, partitions: Sequence[int]) -> str:
    """The channel starting with ``prefix`` that has a client on every one of
    ``partitions`` ("" if none yet)."""
    parts = cluster.topics[topic].partitions
    for name in list(parts[partitions[0]].log.channels):
        logs = [parts[p].log for p in partitions]
        if name.startswith(prefix) and all(
            name in log.channels and log.channels[name].clients for log in logs
        ):
            return name
    return ""


async def _wait_subscribed(
    cluster: Cluster,
    proc: asyncio.subprocess.Process,
    topic: str,
    prefix: str,
    partitions: Sequence[int] = (0, 1, 2, 3),
) -> str:
    await cluster.wait_for(
        lambda: (
            proc.returncode is not None or bool(_subscribed(cluster, topic, prefix, partitions))
        ),
        timeout=20,
    )
    assert proc.returncode is None, await _finish(proc)
    return _subscribed(cluster, topic, prefix, partitions)


# --------------------------------------------------------------------------- pub


async def test_pub_arguments_to_one_partition(cluster: Cluster) -> None:
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url, "--partition", "2",
                            "a", "b c", "ünï")  # fmt: skip
    assert result.rc == 0, result
    assert result.out == ""
    (line,) = result.err_lines
    match = SUMMARY.fullmatch(line)
    assert match is not None, line
    assert match.groups() == ("3", "orders")
    assert _bodies(cluster, "orders", 2) == [b"a", b"b c", "ünï".encode()]
    assert all(not _bodies(cluster, "orders", p) for p in (0, 1, 3))


async def test_pub_bodies_may_follow_the_options(cluster: Cluster) -> None:
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url, "one",
                            "--partition", "1", "two", "--", "-three")  # fmt: skip
    assert result.rc == 0, result
    assert _bodies(cluster, "orders", 1) == [b"one", b"two", b"-three"]


async def test_pub_stdin_lines_with_a_key_stay_in_order_on_its_partition(
    cluster: Cluster,
) -> None:
    lines = [f"event {i}" for i in range(1200)] + ["  spaces kept  ", "cr kept\r", "last"]
    stdin = ("\n".join(lines)).encode()  # the last line has no newline: still a message
    result = await smartnsq(
        "pub", "orders", "--lookupd", cluster.lookupd_url, "--sharding-key", "customer-7",
        stdin=stdin,
    )  # fmt: skip
    assert result.rc == 0, result
    match = SUMMARY.fullmatch(result.err.strip())
    assert match is not None, result.err
    assert match.group(1) == str(len(lines))
    partition = Sharder("java").partition_for("customer-7", 4)
    assert _bodies(cluster, "orders", partition) == [line.encode() for line in lines]
    assert sum(len(cluster.messages("orders", p)) for p in range(4)) == len(lines)


async def test_pub_integer_key(cluster: Cluster) -> None:
    key = 123456789
    sharder = Sharder("java")
    partition = sharder.partition_for(key, 4)
    assert partition != sharder.partition_for(str(key), 4)  # the key type matters here
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url,
                            "--sharding-key", str(key), "--key-type", "int", "x")  # fmt: skip
    assert result.rc == 0, result
    assert _bodies(cluster, "orders", partition) == [b"x"]


async def test_pub_unkeyed_stdin_is_batched_over_partitions(cluster: Cluster) -> None:
    stdin = b"".join(b"%d\n" % i for i in range(2000))
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url,
                            "--batch-size", "100", stdin=stdin)  # fmt: skip
    assert result.rc == 0, result
    logs = [[int(b) for b in _bodies(cluster, "orders", p)] for p in range(4)]
    assert sorted(n for log in logs for n in log) == list(range(2000))
    assert sum(1 for log in logs if log) > 1
    for log in logs:
        assert log == sorted(log)
        # whole batches of 100 consecutive lines
        assert all(log[i] % 100 == 0 for i in range(0, len(log), 100))


async def test_pub_trace_prints_each_receipt(cluster: Cluster) -> None:
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url, "--trace",
                            "--partition", "1", "x", "yy", "zzz")  # fmt: skip
    assert result.rc == 0, result
    records = cluster.messages("orders", 1)
    lines = result.out.splitlines()
    assert len(lines) == len(records) == 3
    for line, record in zip(lines, records, strict=True):
        fields = dict(item.split("=") for item in line.split(" "))
        assert list(fields) == ["partition", "internal_id", "trace_id", "offset", "size"]
        assert fields["partition"] == "1"
        assert int(fields["internal_id"]) == record.internal_id
        assert int(fields["trace_id"]) == record.trace_id != 0
        assert int(fields["offset"]) == record.offset
        assert int(fields["size"]) == record.raw_size


async def test_pub_ext_headers(cluster: Cluster) -> None:
    result = await smartnsq("pub", "ext", "--lookupd", cluster.lookupd_url, "--partition", "0",
                            "--ext", "source=cli", "--ext", "k=a=b", "x", "y")  # fmt: skip
    assert result.rc == 0, result
    records = cluster.messages("ext", 0)
    headers = [json.loads(r.ext_raw) for r in records]
    stamps = [parse_stamp(r.ext_raw) for r in records]
    assert [s.seq for s in stamps if s is not None] == [1, 2]  # the producer's stamps, in order
    assert [{k: v for k, v in h.items() if k != STAMP_KEY} for h in headers] == [
        {"source": "cli", "k": "a=b"}
    ] * 2


async def test_pub_classic_nsqd_from_the_environment() -> None:
    async with Cluster(classic=True) as classic:
        env = _env(SMARTNSQ_NSQD=",".join(classic.nsqd_addresses))
        result = await smartnsq("pub", "events", "hello", env=env)
        assert result.rc == 0, result
        assert _bodies_classic(classic, "events") == [b"hello"]
        env = _env(SMARTNSQ_LOOKUPD=classic.lookupd_url)
        result = await smartnsq("pub", "events", "--trace", "again", env=env)
        assert result.rc == 0, result
        assert result.out == "partition=- internal_id=- trace_id=- offset=- size=-\n"
        assert "classic nsqd cannot trace" in result.err
        assert _bodies_classic(classic, "events") == [b"hello", b"again"]


def _bodies_classic(cluster: Cluster, topic: str) -> list[bytes]:
    return [r.body for r in cluster.messages(topic)]


async def test_pub_empty_line_is_an_error_after_the_lines_before_it(cluster: Cluster) -> None:
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url,
                            "--partition", "0", stdin=b"a\nb\n\nc\n")  # fmt: skip
    line = _one_error_line(result, 2)
    assert line == (
        "smartnsq pub: error: stdin line 3 is empty: NSQ messages cannot be empty "
        "(2 messages published before it; --skip-empty skips empty lines)"
    )
    assert _bodies(cluster, "orders", 0) == [b"a", b"b"]


async def test_pub_oversized_line_says_how_far_it_got(cluster: Cluster) -> None:
    stdin = b"first\n" + b"x" * (1024 * 1024 + 1) + b"\nlast\n"
    result = await smartnsq("pub", "orders", "--lookupd", cluster.lookupd_url,
                            "--partition", "3", stdin=stdin)  # fmt: skip
    line = _one_error_line(result, 2)
    assert line == (
        "smartnsq pub: error: stdin line 2 is over the maximum message size of 1048576 bytes "
        "(1 message published before it)"
    )
    assert _bodies(cluster, "orders", 3) == [b"first"]


# --------------------------------------------------------------------------- tail


async def test_tail_n_prints_finishes_and_leaves_no_channel(cluster: Cluster) -> None:
    async with spawn("tail", "orders", "--lookupd", cluster.lookupd_url, "-n", "3") as proc:
        channel = await _wait_subscribed(cluster, proc, "orders", "tail-")
        assert channel.endswith("#ephemeral")
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("orders", b"plain", partition=0)
            await producer.publish("orders", b"two\nlines \xff", partition=3)
            traced = await producer.publish("orders", b"traced", partition=1, trace_id=77)
        result = await _finish(proc)
    assert result.rc == 0, result
    assert result.err == ""
    lines = sorted(result.out.splitlines())
    parsed = [TAIL_LINE.fullmatch(line) for line in lines]
    assert all(parsed), lines
    assert [m.groups() for m in parsed if m] == [  # each the first of its partition
        ("0", "0", "-", "1", "plain"),
        ("1", "0", "77", "1", "traced"),
        ("3", "0", "-", "1", "two\\nlines \ufffd"),
    ]
    assert traced.trace_id == 77
    record = cluster.channel_record("orders", channel)
    # the process has exited; the cluster may still be reading its last FIN
    await cluster.wait_for(lambda: len(record.finished) == 3, timeout=5)
    await cluster.wait_for(lambda: not _subscribed(cluster, "orders", channel, [0]))
    assert all(channel not in p.log.channels for p in cluster.topics["orders"].partitions.values())


async def test_tail_raw_bodies(cluster: Cluster) -> None:
    async with spawn("tail", "orders", "--lookupd", cluster.lookupd_url, "-n", "1", "--raw",
                     "--channel", "raw") as proc:  # fmt: skip
        await _wait_subscribed(cluster, proc, "orders", "raw")
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("orders", b"a\nb\xff", partition=2)
        result = await _finish(proc)
    assert result.rc == 0, result
    assert result.out == "partition=2 offset=0 trace_id=- attempts=1 b'a\\nb\\xff'\n"


async def test_tail_ordered_topic_partition_subset_with_offsets(cluster: Cluster) -> None:
    args = ("tail", "ordered", "--lookupd", cluster.lookupd_url, "--partitions", "0,2", "-n", "3")
    async with spawn(*args) as proc:
        await _wait_subscribed(cluster, proc, "ordered", "tail-", partitions=(0, 2))
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            for partition in (1, 0, 2, 0):
                await producer.publish("ordered", f"p{partition}", partition=partition)
        result = await _finish(proc)
    assert result.rc == 0, result
    assert result.err_lines == [
        "smartnsq tail: note: ordered is an ordered topic: subscribing with SUB_ORDERED"
    ]
    got = [TAIL_LINE.fullmatch(line) for line in result.out.splitlines()]
    expected = {
        (str(p), str(r.offset), "-", "1", r.body.decode())
        for p in (0, 2)
        for r in cluster.messages("ordered", p)
    }
    assert len(expected) == 3
    assert {m.groups() for m in got if m} == expected
    # per partition, in queue order
    zeros = [m.group(2) for m in got if m and m.group(1) == "0"]
    assert zeros == sorted(zeros, key=int)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_tail_signal_drains_and_exits_0(cluster: Cluster, signum: signal.Signals) -> None:
    async with spawn("tail", "orders", "--lookupd", cluster.lookupd_url,
                     "--channel", "watch") as proc:  # fmt: skip
        assert proc.stdout is not None
        await _wait_subscribed(cluster, proc, "orders", "watch")
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish_many("orders", [b"m1", b"m2"], partition=3)
        lines = [await asyncio.wait_for(proc.stdout.readline(), 10) for _ in range(2)]
        proc.send_signal(signum)
        result = await _finish(proc)
    assert result.rc == 0, result
    assert [line.decode() for line in lines] == [
        "partition=3 offset=0 trace_id=- attempts=1 m1\n",
        "partition=3 offset=32 trace_id=- attempts=1 m2\n",
    ]
    assert result.out == result.err == ""
    record = cluster.channel_record("orders", "watch")
    await cluster.wait_for(lambda: len(record.finished) == 2, timeout=5)
    assert cluster.unfinished("orders", "watch") == 0
    assert record.requeued == []


# --------------------------------------------------------------------------- lookup


def _lookup_sections(text: str) -> dict[str, tuple[str, list[list[str]]]]:
    """lookupd address -> (its title line's tail, table rows)."""
    sections: dict[str, tuple[str, list[list[str]]]] = {}
    for block in text.strip().split("\n\n"):
        title, *rows = block.splitlines()
        match = re.fullmatch(r"nsqlookupd (\S+): topic \S+ \(access=\w\): (.*)", title)
        assert match is not None, title
        table = [row.split() for row in rows if not row.startswith("  channels:")]
        sections[match.group(1)] = (match.group(2), table)
    return sections


async def test_lookup_table_per_lookupd_matches_the_topology(cluster: Cluster) -> None:
    # one lookupd given: the other is found with /listlookup
    result = await smartnsq("lookup", "ordered", "--lookupd", cluster.lookupd_urls[1])
    assert result.rc == 0, result
    assert result.err == ""
    sections = _lookup_sections(result.out)
    assert list(sections) == [u.removeprefix("http://") for u in cluster.lookupd_urls[::-1]]
    expected_rows = [["PARTITION", "LEADER", "REPLICAS"]] + [
        [str(p), cluster.nsqd_addresses[info["leader"]], str(len(info["replicas"]))]
        for p, info in cluster.topology("ordered").items()
    ]
    for flags, rows in sections.values():
        assert flags == "partition_num=4 replica=2 ordered=yes ext=no multi_part=no"
        assert rows == expected_rows
    assert "  channels: audit" in result.out


async def test_lookup_json_and_ext_flags(cluster: Cluster) -> None:
    result = await smartnsq("lookup", "ext", "--lookupd", cluster.lookupd_url, "--json",
                            "--access", "w")  # fmt: skip
    assert result.rc == 0, result
    document = json.loads(result.out)
    assert (document["topic"], document["access"], document["disagreements"]) == ("ext", "w", [])
    assert len(document["lookupds"]) == 2
    topology = cluster.topology("ext")
    for answer in document["lookupds"]:
        assert answer["error"] is None
        assert answer["found"]
        assert answer["youzan"]
        assert answer["flags"] == {
            "partition_num": 2, "replica": 1, "ordered": False, "ext": True, "multi_part": False
        }  # fmt: skip
        assert [(p["partition"], p["leader"], p["replicas"]) for p in answer["partitions"]] == [
            (p, cluster.nsqd_addresses[info["leader"]], 1) for p, info in topology.items()
        ]


async def test_lookup_shows_lookupds_that_disagree(cluster: Cluster) -> None:
    cluster.freeze_lookupd(1, ["orders"])
    old = cluster.leader("orders", 0)
    new = (old + 1) % 3 if old is not None else 0
    await cluster.move_leader("orders", 0, to_node=new)
    result = await smartnsq("lookup", "orders", "--lookupd", cluster.lookupd_url)
    assert result.rc == 0, result
    sections = _lookup_sections(result.out.split("\nnote:")[0])
    fresh, stale = (sections[u.removeprefix("http://")][1] for u in cluster.lookupd_urls)
    assert fresh[1][:2] == ["0", cluster.nsqd_addresses[new]]
    assert stale[1][:2] == ["0", cluster.nsqd_addresses[old or 0]]
    assert result.out.endswith("note: the nsqlookupds name different leaders for partition(s) 0\n")


async def test_lookup_unknown_and_classic_topics(cluster: Cluster) -> None:
    result = await smartnsq("lookup", "nope", "--lookupd", cluster.lookupd_url)
    assert result.rc == 1
    assert [v[0] for v in _lookup_sections(result.out).values()] == ["not found"] * 2
    async with Cluster(classic=True) as classic:
        await smartnsq("pub", "events", "--nsqd", classic.nsqd_addresses[0], "x")
        result = await smartnsq("lookup", "events", "--lookupd", classic.lookupd_url)
        assert result.rc == 0, result
        ((title, rows),) = _lookup_sections(result.out).values()
        assert title == "classic topic (no partitions)"
        assert rows[0] == ["NODE", "HTTP", "VERSION"]
        assert rows[1][:2] == [classic.nsqd_addresses[0], classic.nsqd_http_addresses[0]]


# --------------------------------------------------------------------------- mistakes


USAGE_ERRORS = [
    (["pub", "orders", "x"], "give --lookupd URL or --nsqd HOST:PORT"),
    (["pub", "orders", "--lookupd", "http://h:1", "--nsqd", "h:1", "x"], "not allowed with"),
    (["pub", "bad topic!", "--nsqd", "h:1", "x"], "invalid topic name"),
    (["pub", "orders", "--nsqd", "nonsense", "x"], "invalid nsqd address"),
    (["pub", "orders", "--lookupd", "ftp://h:1", "x"], "invalid nsqlookupd address"),
    (["pub", "orders", "--nsqd", "h:1", "--partition", "1", "--sharding-key", "k", "x"],
     "not allowed with"),
    (["pub", "orders", "--nsqd", "h:1", "--sharding-key", "k", "--key-type", "int", "x"],
     "is not an integer"),
    (["pub", "orders", "--nsqd", "h:1", "--ext", "novalue", "x"], "expected KEY=VALUE"),
    (["pub", "orders", "--nsqd", "h:1", "--trace", "--ext", "k=v", "x"], "cannot be combined"),
    (["pub", "orders", "--nsqd", "h:1", ""], "BODY argument 1 is empty"),
    (["pub", "orders", "--nsqd", "h:1", "--partition", "-1", "x"], "--partition must be >= 0"),
    (["pub", "orders", "--nsqd", "h:1", "--partition", "one", "x"], "invalid int value"),
    (["pub", "orders", "--nsqd", "h:1", "--bogus", "x"], "unrecognized arguments: --bogus"),
    (["tail", "orders", "--nsqd", "h:1", "--partitions", "a,b"], "expected partition numbers"),
    (["tail", "orders", "--nsqd", "h:1", "--ordered"], "--ordered needs youzan partitions"),
    (["tail", "orders", "--nsqd", "h:1", "-n", "0"], "-n must be >= 1"),
    (["tail", "orders", "--nsqd", "h:1", "--channel", "bad channel"], "invalid channel name"),
    (["lookup", "orders", "--nsqd", "h:1"], "give --lookupd"),
    (["lookup", "orders", "--lookupd", "h:1", "--access", "x"], "invalid choice"),
    (["demo", "--messages", "0"], "--messages must be >= 1"),
    (["demo", "--nodes", "2", "--replicas", "3"], "--replicas 3 needs as many nodes"),
    (["demo", "--partitions", "255"], "--partitions must be at most 254"),
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
]  # fmt: skip


async def test_user_mistakes_are_one_line_and_exit_2() -> None:
    async def check(argv: list[str], expected: str) -> str | None:
        result = await smartnsq(*argv)
        if result.rc != 2 or len(result.err_lines) != 1 or result.out:
            return f"{argv}: {result}"
        line = result.err_lines[0]
        if not line.startswith("smartnsq") or ": error: " not in line or expected not in line:
            return f"{argv}: {line!r} does not say {expected!r}"
        return None

    # A few at a time: each is a separate interpreter.
    limit = asyncio.Semaphore(4)

    async def bounded(argv: list[str], expected: str) -> str | None:
        async with limit:
            return await check(argv, expected)

    problems = await asyncio.gather(*(bounded(argv, text) for argv, text in USAGE_ERRORS))
    assert [p for p in problems if p] == []


async def test_environment_with_both_addresses_is_a_mistake() -> None:
    env = _env(SMARTNSQ_LOOKUPD="http://127.0.0.1:4161", SMARTNSQ_NSQD="127.0.0.1:4150")
    line = _one_error_line(await smartnsq("pub", "orders", "x", env=env), 2)
    assert "both $SMARTNSQ_LOOKUPD and $SMARTNSQ_NSQD are set" in line


async def test_nothing_listening_is_one_line_and_exit_1(closed_port: int) -> None:
    lookupd = f"http://127.0.0.1:{closed_port}"
    nsqd = f"127.0.0.1:{closed_port}"
    cases = [
        (("pub", "orders", "--lookupd", lookupd, "x"), "no nsqlookupd answered"),
        (("pub", "orders", "--nsqd", nsqd, "x"), "cannot connect"),
        (("tail", "orders", "--lookupd", lookupd), "no nsqlookupd answered"),
        (("tail", "orders", "--nsqd", nsqd), "cannot connect"),
        (("lookup", "orders", "--lookupd", lookupd), "no nsqlookupd answered"),
    ]
    results = await asyncio.gather(*(smartnsq(*argv) for argv, _ in cases))
    for (argv, expected), result in zip(cases, results, strict=True):
        line = _one_error_line(result, 1)
        assert line.startswith(f"smartnsq {argv[0]}: error: "), line
        assert expected in line, line


# --------------------------------------------------------------------------- demo


def _check_demo_report(out: str, messages: int, customers: int) -> None:
    assert "emulator" in out
    assert f"per-key order verified: {customers} keys, 0 violations\n" in out
    rates = re.findall(rf"^ +{messages} in \d+\.\d\d s: [\d,]+ msg/s$", out, re.M)
    assert len(rates) == 2, out  # publish and consume
    counts = re.findall(r"^(\d+) +node \d+ +(\d+)$", out, re.M)
    assert [p for p, _ in counts] == ["0", "1", "2", "3"]
    assert sum(int(n) for _, n in counts) == messages
    trace = re.findall(r"^  (publish|consume) topic=orders .*trace_id=(\d+)", out, re.M)
    assert 3 <= len(trace) <= 5, out
    assert {event for event, _ in trace} == {"publish", "consume"}
    assert out.rstrip().splitlines()[-1].startswith("ok in ")


async def test_demo_small() -> None:
    result = await smartnsq("demo", "--messages", "2000", "--customers", "50", timeout=60)
    assert result.rc == 0, result
    assert result.err == ""
    _check_demo_report(result.out, 2000, 50)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_demo_with_the_defaults_finishes_well_under_a_minute() -> None:
    began = time.monotonic()
    result = await smartnsq("demo", timeout=110)
    elapsed = time.monotonic() - began
    assert result.rc == 0, result
    _check_demo_report(result.out, 20_000, 500)
    assert elapsed < 30, f"the demo took {elapsed:.1f} s"
