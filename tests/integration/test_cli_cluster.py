"""``smartnsq cluster``: the embedded cluster as a foreground process, driven through a real
subprocess (``python -m smartnsq cluster``) and reached through its port file."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq.cli import main
from smartnsq.cli.cluster import ChannelSpec, TopicSpec, parse_channel, parse_topic, tune_gc
from smartnsq.cli.usage import UsageError
from smartnsq.protocol import commands as c
from smartnsq.protocol.frames import FRAME_TYPE_RESPONSE, Frame
from smartnsq.protocol.message import MessageLayout
from tests.integration.rawclient import RawClient

TIMEOUT = 20.0  # a cold interpreter start on a busy CI machine
OK = Frame(FRAME_TYPE_RESPONSE, b"OK")


class ClusterProcess:
    def __init__(self, proc: asyncio.subprocess.Process, port_file: Path) -> None:
        self.proc = proc
        self.port_file = port_file
        self.banner: list[str] = []

    async def ready(self) -> dict[str, Any]:
        """Read the address block up to its last line (printed once the port file exists)."""
        if self.proc.stdout is None:
            raise RuntimeError("no stdout pipe")
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT)
            if not line:
                raise AssertionError(f"exited early: {await self.stderr()}")
            self.banner.append(line.decode().rstrip("\n"))
            if line.startswith(b"Ready"):
                break
        info: dict[str, Any] = json.loads(self.port_file.read_text())
        return info

    async def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(signum)
        out, err = await asyncio.wait_for(self.proc.communicate(), TIMEOUT)
        return self.proc.returncode or 0, out.decode(), err.decode()

    async def stderr(self) -> str:
        if self.proc.stderr is None:
            return ""
        return (await self.proc.stderr.read()).decode()


Spawn = Callable[..., Awaitable[ClusterProcess]]


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Spawn]:
    procs: list[asyncio.subprocess.Process] = []

    async def _spawn(*argv: str) -> ClusterProcess:
        port_file = tmp_path / f"cluster{len(procs)}.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "smartnsq",
            "cluster",
            *argv,
            "--port-file",
            str(port_file),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        procs.append(proc)
        return ClusterProcess(proc, port_file)

    try:
        yield _spawn
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_youzan_cluster_serves_and_stops_on_sigterm(spawn: Spawn) -> None:
    cluster = await spawn(
        "--nodes", "3", "--topic", "orders:4:2", "--topic", "audit:1:1:ordered,ext",
        "--channel", "orders:billing",
    )  # fmt: skip
    info = await cluster.ready()
    assert info["mode"] == "youzan"
    assert info["pid"] == cluster.proc.pid
    nodes = info["nsqd"]
    assert len(nodes) == 3
    topics = info["topics"]
    orders = topics["orders"]
    assert orders["channels"] == ["billing"]
    assert [row["partition"] for row in orders["partitions"]] == [0, 1, 2, 3]
    assert all(len(row["replicas"]) == 2 for row in orders["partitions"])
    assert topics["audit"]["ordered"]
    assert topics["audit"]["ext"]
    # The printed block names every address of the port file.
    banner = "\n".join(cluster.banner)
    for node in nodes:
        assert node["tcp"] in banner
        assert node["http"] in banner
    assert "partition 3" in banner

    # It answers: nsqlookupd over HTTP, nsqd over HTTP and TCP (publish, then consume).
    lookupd = info["lookupd_http"]
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        answer = await http.get(f"{lookupd[0]}/lookup", params={"topic": "orders"})
        assert answer.status_code == 200
        assert (await http.get(f"http://{nodes[0]['http']}/ping")).text == "OK"
    leader = orders["partitions"][1]["tcp"]
    consumer = await RawClient.identified(leader)
    await consumer.ok(c.sub("orders", "billing", 1))
    producer = await RawClient.identified(leader)
    await producer.ok(c.pub("orders", b"hello", 1))
    consumer.send(c.rdy(1))
    message = await consumer.message(MessageLayout.youzan())
    assert message.body == b"hello"
    await producer.close()
    await consumer.close()

    code, out, err = await cluster.stop(signal.SIGTERM)
    assert code == 0, err
    assert "Traceback" not in err
    assert "stopped" in out
    assert not cluster.port_file.exists()


async def test_classic_cluster_stops_on_ctrl_c(spawn: Spawn) -> None:
    cluster = await spawn("--classic", "--nodes", "1", "--topic", "t", "--channel", "t:c")
    info = await cluster.ready()
    assert info["mode"] == "classic"
    address = info["nsqd"][0]["tcp"]
    assert info["topics"] == {"t": {"nsqd": [address], "channels": ["c"]}}
    client = await RawClient.identified(address)
    await client.ok(c.pub("t", b"x"))
    await client.close()
    code, _, err = await cluster.stop(signal.SIGINT)
    assert code == 0, err
    assert "Traceback" not in err


async def _cli_exits(*args: str) -> tuple[int | None, bytes, bytes]:
    """``smartnsq cluster ARGS`` run to its end (killed after TIMEOUT): rc, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "cluster", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, out, err


async def test_bad_topic_spec_is_a_one_line_usage_error() -> None:
    returncode, out, err = await _cli_exits("--topic", "orders:x:2")
    assert returncode == 2
    assert out == b""
    lines = err.decode().splitlines()
    assert lines == [
        "smartnsq cluster: error: --topic 'orders:x:2': partitions must be an integer 1..254, "
        "got 'x'"
    ]


async def test_a_busy_port_is_a_failure_naming_the_port() -> None:
    """Exit 1 (a failure: the arguments were right), not 2, and the port is named."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        returncode, out, err = await _cli_exits("--nodes", "1", "--lookupd-port", str(port))
    finally:
        busy.close()
    assert returncode == 1
    assert out == b""
    lines = err.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"smartnsq cluster: error: cannot listen on 127.0.0.1:{port}: ")
    assert f"holds port {port}" in lines[0]
    assert "--lookupd-port" in lines[0]


# --------------------------------------------------------------------------- specs, in-process


def test_topic_specs() -> None:
    assert parse_topic("orders:4:2") == TopicSpec("orders", 4, 2)
    assert parse_topic("audit:1:1:ordered,ext") == TopicSpec("audit", 1, 1, ordered=True, ext=True)
    assert parse_topic("t", classic=True) == TopicSpec("t")
    assert parse_topic("t:1:1", classic=True) == TopicSpec("t")
    assert parse_channel("orders:billing") == ChannelSpec("orders", "billing")
    assert parse_topic("wide:254:1:multipart").partitions == 254


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("orders:0:1", "partitions must be an integer 1..254, got '0'"),
        # nsqlookupd refuses 255 partitions, as topic create does
        ("orders:255:1", "partitions must be an integer 1..254, got '255'"),
        ("orders:2:6", "replicas must be an integer 1..5, got '6'"),
        ("orders:2:-1", "replicas must be an integer 1..5, got '-1'"),
        ("orders:2:1:sorted", "unknown flag 'sorted'"),
        ("orders:2:1:ext:x", "expected NAME:PARTITIONS:REPLICAS[:FLAGS]"),
        ("bad topic:1:1", "--topic 'bad topic:1:1':"),
        (":1:1", "--topic ':1:1':"),
        ("bad", "--topic 'bad': expected NAME:PARTITIONS:REPLICAS[:FLAGS], e.g. orders:4:2"),
        ("orders:2", "--topic 'orders:2': expected NAME:PARTITIONS:REPLICAS[:FLAGS]"),
    ],
)
def test_bad_topic_specs(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_topic(spec)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--channel", "orders"], "expected TOPIC:CHANNEL"),
        (["--channel", "orders:bad channel"], "--channel 'orders:bad channel'"),
        (["--channel", "orders:billing"], "no --topic orders"),
        (["--nodes", "2", "--topic", "t:1:3"], "3 replicas need as many nodes (--nodes 2)"),
        (["--nodes", "0"], "--nodes must be >= 1"),
        (["--classic", "--lookupds", "2"], "exactly one nsqlookupd"),
        (["--classic", "--topic", "t:2:1"], "classic topics have no partitions"),
        (["--topic", "t:1:1", "--topic", "t:2:1"], "the same topic is given twice"),
        (["--topic", "bad"], "--topic 'bad': expected NAME:PARTITIONS:REPLICAS[:FLAGS]"),
        (["--classic", "--topic", "t:2"], "classic topics have no partitions"),
        (["--broadcast-address", "0.0.0.0"], "--broadcast-address: must name a host"),
        (["--lookupd-port", "70000"], "--lookupd-port: must be a port 1..65535"),
        (["--lookupd-port", "65535"], "--nsqd-port: the ports of 3 nodes go past 65535"),
        (["--lookupd-port", "4161", "--nsqd-port", "4160"], "overlap the nsqlookupd ports"),
        (["--failover-delay", "-1"], "--failover-delay must be >= 0"),
    ],
)
def test_usage_errors_exit_2_before_starting(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cluster", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("smartnsq cluster: error: ")
    assert message in err


def test_tune_gc_is_undone() -> None:
    before = gc.get_threshold()
    callbacks = list(gc.callbacks)
    restore = tune_gc()
    try:
        assert gc.get_threshold() != before
        assert len(gc.callbacks) == len(callbacks) + 1
        gc.collect(1)  # survivors are frozen
        assert gc.get_freeze_count() > 0
    finally:
        restore()
    assert gc.get_threshold() == before
    assert gc.callbacks == callbacks
    assert gc.get_freeze_count() == 0
