"""LookupManager over httpx.MockTransport: no sockets, time driven by a fake clock and sleep."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import cycle
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq.errors import (
    ClientClosedError,
    LookupFailedError,
    NotLookupdError,
    TopicHasNoChannelError,
    TopicNotFoundError,
    ValidationError,
)
from smartnsq.protocol.lookupd import TopicLayout, TopicMeta
from smartnsq.transport.lookup import LookupManager

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lookupd"
V1 = {"X-NSQ-Content-Type": "nsq; version=1.0"}
HA = "0.3.7-HA.1.13.0"

A, B, C = "10.0.0.1:4161", "10.0.0.2:4161", "10.0.0.3:4161"


# --------------------------------------------------------------------------- helpers


def fixture(name: str) -> httpx.Response:
    """A recorded answer with the status and envelope the server sent."""
    entry = json.loads((FIXTURES / "index.json").read_text())[name]
    headers = V1 if entry["envelope"] == "v1" else {}
    return httpx.Response(entry["status"], content=(FIXTURES / name).read_bytes(), headers=headers)


def v1(payload: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(payload).encode(), headers=V1)


def peer(port: int, host: str = "127.0.0.1", version: str = HA) -> dict[str, Any]:
    return {
        "id": f"{host}:{port + 7}",
        "remote_address": f"{host}:{port + 7}",
        "hostname": "vm",
        "broadcast_address": host,
        "tcp_port": port,
        "http_port": port + 1,
        "version": version,
    }


def youzan_answer(
    leaders: dict[int, int], channels: tuple[str, ...] = ("c",), partition_num: int | None = None
) -> httpx.Response:
    payload: dict[str, Any] = {
        "channels": list(channels),
        "partitions": {str(pid): peer(port) for pid, port in leaders.items()},
        "producers": [peer(port) for port in sorted(set(leaders.values()))],
    }
    if partition_num is not None:
        payload["meta"] = {"partition_num": partition_num, "replica": 2}
    return v1(payload)


def listlookup(*addresses: str) -> httpx.Response:
    nodes = [
        {
            "ID": f"{a}:nsqlookup",
            "NodeIP": a.split(":")[0],
            "TcpPort": "4160",
            "HttpPort": a.split(":")[1],
            "RpcPort": "4260",
            "Epoch": 1,
        }
        for a in addresses
    ]
    return v1({"lookupdleader": nodes[0], "lookupdnodes": nodes})


NO_LISTLOOKUP = v1({"message": "NOT_FOUND"}, 404)  # classic nsqlookupd
NO_COORDINATOR = httpx.Response(200, content=b"", headers=V1)

Answer = httpx.Response | Callable[[httpx.Request], httpx.Response]


@dataclass
class FakeLookupd:
    lookup: Answer = field(default_factory=lambda: youzan_answer({0: 24510}))
    listlookup: Answer = field(default_factory=lambda: NO_COORDINATOR)
    nodes: Answer | None = None
    # what every nsqlookupd answers on /info (an nsqd's /info also names its ports)
    info: Answer = field(default_factory=lambda: v1({"version": "1.3.0"}))
    down: bool = False
    delay: float = 0.0
    gate: asyncio.Event | None = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/nodes" and self.nodes is not None:
            answer = self.nodes
        elif request.url.path == "/info":
            answer = self.info
        else:
            answer = self.lookup if request.url.path == "/lookup" else self.listlookup
        return answer(request) if callable(answer) else answer


class FakeCluster:
    """Lookupds by "host:port" behind one MockTransport; unknown hosts refuse connections."""

    def __init__(self) -> None:
        self.lookupds: dict[str, FakeLookupd] = {}
        self.requests: list[httpx.Request] = []

    def add(self, address: str, lookupd: FakeLookupd | None = None) -> FakeLookupd:
        self.lookupds[address] = lookupd or FakeLookupd()
        return self.lookupds[address]

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        lookupd = self.lookupds.get(f"{request.url.host}:{request.url.port}")
        if lookupd is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await lookupd.handle(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    def count(self, address: str | None = None, path: str | None = None) -> int:
        return sum(
            1
            for r in self.requests
            if (address is None or f"{r.url.host}:{r.url.port}" == address)
            and (path is None or r.url.path == path)
        )


class FakeTime:
    """A clock and a sleep that only return when the test advances time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        entry = (self.now + delay, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        finally:
            self._waiters.remove(entry)

    @property
    def sleeping(self) -> int:
        return sum(not fut.done() for _, fut in self._waiters)

    async def advance(self, seconds: float) -> None:
        """Move the clock; wake the sleepers whose time came; let the poller go back to sleep."""
        self.now += seconds
        woke = False
        for deadline, fut in list(self._waiters):
            if deadline <= self.now and not fut.done():
                fut.set_result(None)
                woke = True
        if woke:
            await until(lambda: self.sleeping > 0)


async def until(condition: Callable[[], bool], spins: int = 500) -> None:
    for _ in range(spins):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def ports(layout: TopicLayout) -> dict[int, int]:
    return {pid: node.tcp_port for pid, node in layout.partitions.items()}


@pytest.fixture
def clock() -> FakeTime:
    return FakeTime()


@pytest.fixture
async def make(clock: FakeTime) -> AsyncIterator[Callable[..., LookupManager]]:
    """Build managers on a cluster with a fake clock; every one is closed at teardown."""
    managers: list[LookupManager] = []

    def factory(
        cluster: FakeCluster, seeds: list[str] | None = None, **kwargs: Any
    ) -> LookupManager:
        kwargs.setdefault("clock", clock.clock)
        kwargs.setdefault("sleep", clock.sleep)
        kwargs.setdefault("http_retry_wait", 0.0)
        kwargs.setdefault("refresh_min_interval", 0.0)
        if "http_client" not in kwargs:
            kwargs["transport"] = cluster.transport
        manager = LookupManager(seeds or [A], **kwargs)
        managers.append(manager)
        return manager

    yield factory
    for manager in managers:
        await manager.close()


Make = Callable[..., LookupManager]


# --------------------------------------------------------------------------- discovery + merge


async def test_discovery_and_majority_merge_across_three_lookupds(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(youzan_answer({0: 24510, 1: 24520}, partition_num=2)))
    cluster.add(B, FakeLookupd(youzan_answer({0: 24510, 1: 24530}, partition_num=2)))
    cluster.add(C, FakeLookupd(youzan_answer({0: 24540, 1: 24520}, partition_num=2)))
    cluster.lookupds[A].listlookup = listlookup(A, B, C)
    manager = make(cluster, [A])

    layout = await manager.lookup("ptest", "w")

    assert manager.lookupd_addresses == (A, B, C)
    assert ports(layout) == {0: 24510, 1: 24520}  # two votes each
    assert layout.meta == TopicMeta(partition_num=2, replica=2)
    assert layout.access == "w"
    for address in (A, B, C):
        assert cluster.count(address, "/lookup") == 1
    assert cluster.count(A, "/listlookup") == 1
    lookup = next(r for r in cluster.requests if r.url.path == "/lookup")
    assert dict(lookup.url.params) == {"topic": "ptest", "access": "w", "metainfo": "true"}
    for request in cluster.requests:
        assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
        # httpx's own bounds are what remains of the request's 5 s: none outlasts it.
        bounds = request.extensions["timeout"]
        assert set(bounds) == {"connect", "read", "write", "pool"}
        assert all(4.0 < value <= 5.0 for value in bounds.values())


@pytest.mark.parametrize(("slow", "winner"), [(A, 24510), (B, 24520)])
async def test_tie_goes_to_the_answer_received_last(make: Make, slow: str, winner: int) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(youzan_answer({0: 24510})))
    cluster.add(B, FakeLookupd(youzan_answer({0: 24520})))
    cluster.lookupds[slow].delay = 0.005
    manager = make(cluster, [A, B])
    assert ports(await manager.lookup("ptest", "w")) == {0: winner}


async def test_discovery_keeps_seeds_and_drops_vanished_lookupds(make: Make) -> None:
    cluster = FakeCluster()
    seed = cluster.add(A)
    cluster.add(B)
    cluster.add(C)
    seed.listlookup = listlookup(B, C)  # the seed itself is not listed (e.g. a VIP)
    manager = make(cluster, [A])
    await manager.lookup("t")
    assert manager.lookupd_addresses == (A, B, C)

    seed.listlookup = listlookup(B)
    for lookupd in (B, C):
        cluster.lookupds[lookupd].listlookup = listlookup(B)
    await manager.refresh("t")
    assert manager.lookupd_addresses == (A, B)

    # Failures and classic 404s keep the current set.
    seed.listlookup = NO_LISTLOOKUP
    cluster.lookupds[B].listlookup = httpx.Response(500, content=b"<html>oops</html>")
    await manager.refresh("t")
    assert manager.lookupd_addresses == (A, B)


async def test_lookupd_without_coordinator_lists_nothing(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A).listlookup = fixture("nsqlookupd_listlookup.v1.json")  # lists 127.0.0.1:24161
    manager = make(cluster, [A, B], http_attempts=1)
    cluster.add(B).listlookup = httpx.Response(
        200, content=b'{"status_code":200,"status_txt":"OK","data":null}'
    )
    await manager.lookup("t")
    assert manager.lookupd_addresses == (A, B, "127.0.0.1:24161")
    assert cluster.count("127.0.0.1:24161", "/lookup") == 1  # refused: down-ranked, not fatal


@dataclass
class HeldListlookup(FakeLookupd):
    """Holds every ``/listlookup`` until ``release`` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/listlookup":
            await self.release.wait()
        return await super().handle(request)


async def test_the_first_lookup_asks_the_seeds_beside_the_discovery(make: Make) -> None:
    """A new client's first lookup waits for one round trip, not two: the seed is asked
    /lookup while its /listlookup is held; the lookupds it lists are asked once it answers,
    and all the answers are merged. Later rounds discover first."""
    cluster = FakeCluster()
    seed = HeldListlookup(youzan_answer({0: 24510, 1: 24520}, partition_num=2))
    cluster.add(A, seed)
    cluster.add(B, FakeLookupd(youzan_answer({0: 24510, 1: 24530}, partition_num=2)))
    cluster.add(C, FakeLookupd(youzan_answer({0: 24540, 1: 24520}, partition_num=2)))
    seed.listlookup = listlookup(A, B, C)
    manager = make(cluster, [A])

    first = asyncio.ensure_future(manager.lookup("ptest", "w"))
    await until(lambda: cluster.count(A, "/lookup") == cluster.count(A, "/listlookup") == 1)
    assert cluster.count(B) == cluster.count(C) == 0
    seed.release.set()
    layout = await first
    assert ports(layout) == {0: 24510, 1: 24520}  # two votes each, as in one round
    assert [cluster.count(address, "/lookup") for address in (A, B, C)] == [1, 1, 1]

    seed.release.clear()
    again = asyncio.ensure_future(manager.refresh("ptest", "w"))
    await until(lambda: cluster.count(A, "/listlookup") == 2)
    for _ in range(20):
        await asyncio.sleep(0)
    assert cluster.count(path="/lookup") == 3  # held until the discovery ends
    seed.release.set()
    await again
    assert cluster.count(path="/lookup") == 6


# --------------------------------------------------------------------------- health and backoff


async def test_failing_lookupd_is_down_ranked_with_exponential_backoff(
    make: Make, clock: FakeTime
) -> None:
    cluster = FakeCluster()
    cluster.add(A)
    bad = cluster.add(B, FakeLookupd(down=True))
    manager = make(cluster, [A, B], http_attempts=2)

    # t=1000, the first round: both seeds are asked /lookup beside the first discovery, so B
    # fails /listlookup and /lookup twice each (one retry), then is skipped.
    await manager.refresh("t")
    assert cluster.count(B, "/listlookup") == 2
    assert cluster.count(B, "/lookup") == 2
    assert cluster.count(A, "/lookup") == 1

    clock.now += 0.5
    await manager.refresh("t")
    assert cluster.count(B) == 4  # still backing off (1 s)

    clock.now += 0.5
    await manager.refresh("t")  # t=1001: its time came, /listlookup fails again -> 2 s
    assert cluster.count(B) == 6
    assert cluster.count(B, "/lookup") == 2  # skipped by the lookups that follow discovery

    clock.now += 1.5
    await manager.refresh("t")
    assert cluster.count(B) == 6

    bad.down = False
    clock.now += 0.5
    await manager.refresh("t")  # t=1003: back, answers both requests, backoff reset
    assert cluster.count(B) == 8
    assert cluster.count(B, "/lookup") == 3

    bad.down = True
    clock.now += 0.1
    await manager.refresh("t")  # fails: 1 s again, not 4 s
    clock.now += 1.0
    await manager.refresh("t")
    assert cluster.count(B) == 8 + 2 + 2


async def test_only_foreign_5xx_are_retried_and_down_ranked(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    proxy = cluster.add(A, FakeLookupd(httpx.Response(502, content=b"<html>Bad Gateway</html>")))
    legacy = cluster.add(B, FakeLookupd(fixture("nsqlookupd_lookup_bad_access.default.json")))
    proxy.listlookup = legacy.listlookup = NO_LISTLOOKUP
    manager = make(cluster, [A, B], http_attempts=3)

    with pytest.raises(LookupFailedError) as info:
        await manager.refresh("t")
    assert cluster.count(A, "/lookup") == 3  # 502 from a proxy: retried
    assert cluster.count(B, "/lookup") == 1  # HTTP 500 legacy answer from nsqlookupd: not retried
    message = str(info.value)
    assert f"{A}: HTTP 502 from" in message
    assert f"{B}: HTTP 500 INVALID_ACCESS_MODE" in message

    clock.now += 0.5
    with pytest.raises(LookupFailedError):
        await manager.refresh("t")
    assert cluster.count(A, "/lookup") == 3  # down-ranked
    assert cluster.count(B, "/lookup") == 2  # answered: still healthy


async def test_when_every_lookupd_is_down_ranked_all_are_tried(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    only = cluster.add(A, FakeLookupd(down=True))
    manager = make(cluster, [A], http_attempts=1)
    for expected in (2, 4, 6):  # /listlookup + /lookup each round
        with pytest.raises(LookupFailedError, match=A):
            await manager.refresh("t")
        assert cluster.count(A) == expected
    only.down = False
    layout = await manager.refresh("t")
    assert ports(layout) == {0: 24510}


# --------------------------------------------------------------------------- coalescing, rate limit


async def test_concurrent_refreshes_share_one_round(make: Make) -> None:
    cluster = FakeCluster()
    gate = asyncio.Event()
    for address in (A, B, C):
        cluster.add(address, FakeLookupd(youzan_answer({0: 24510, 1: 24520}), gate=gate))
    cluster.lookupds[A].listlookup = listlookup(A, B, C)
    manager = make(cluster, [A])

    callers = [asyncio.ensure_future(manager.refresh("ptest", "w")) for _ in range(50)]
    # the /listlookup and the seed's /lookup beside it (the first discovery), held at the gate
    await until(lambda: len(cluster.requests) == 2)
    await asyncio.sleep(0)
    gate.set()
    layouts = await asyncio.gather(*callers)

    assert all(layout is layouts[0] for layout in layouts)
    assert cluster.count(A, "/listlookup") == 1
    for address in (A, B, C):
        assert cluster.count(address, "/lookup") == 1
    # Rounds for different keys are not merged together.
    await asyncio.gather(manager.refresh("ptest", "r"), manager.refresh("other", "w"))
    assert cluster.count(path="/lookup") == 3 + 6


async def test_refresh_is_rate_limited(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A)
    manager = make(cluster, [A], refresh_min_interval=0.25)

    first = await manager.refresh("t")
    assert cluster.count(A, "/lookup") == 1
    lookupd.lookup = youzan_answer({0: 24520})
    clock.now += 0.1
    assert await manager.refresh("t") is first
    assert await manager.lookup("t") is first
    assert cluster.count(A, "/lookup") == 1

    clock.now += 0.2
    second = await manager.refresh("t")
    assert ports(second) == {0: 24520}
    assert cluster.count(A, "/lookup") == 2
    # lookup() serves the cache whatever the time
    clock.now += 100
    assert await manager.lookup("t") is second
    assert cluster.count(A, "/lookup") == 2


async def test_forced_refresh_right_after_a_plain_lookup_is_not_rate_limited(
    make: Make, clock: FakeTime
) -> None:
    """A client that just cached a layout and then saw E_FAILED_ON_NOT_LEADER must get a
    fresh answer at once: the round that filled the cache may be the stale one."""
    cluster = FakeCluster()
    lookupd = cluster.add(A)
    manager = make(cluster, [A], refresh_min_interval=0.25)
    await manager.lookup("t")
    lookupd.lookup = youzan_answer({0: 24520})  # the leader moved
    clock.now += 0.01
    assert ports(await manager.refresh("t")) == {0: 24520}
    assert cluster.count(A, "/lookup") == 2
    clock.now += 0.01
    await manager.refresh("t")  # forced again so soon: served from the cache
    assert cluster.count(A, "/lookup") == 2


async def test_rate_limit_does_not_apply_without_a_cached_layout(
    make: Make, clock: FakeTime
) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A, FakeLookupd(down=True))
    manager = make(cluster, [A], refresh_min_interval=0.25, http_attempts=1)
    with pytest.raises(LookupFailedError):
        await manager.lookup("t")
    lookupd.down = False
    clock.now += 0.01
    assert ports(await manager.lookup("t")) == {0: 24510}


def _wake_due(clock: FakeTime) -> None:
    for deadline, future in list(clock._waiters):
        if deadline <= clock.now and not future.done():
            future.set_result(None)


async def test_wait_until_asks_in_rounds_until_the_layout_suits(
    make: Make, clock: FakeTime
) -> None:
    """How a publish waits for a partition's new leader: forced rounds, refresh_min_interval
    apart, shared by every waiter, ending with the first layout that suits."""
    cluster = FakeCluster()
    lookupd = cluster.add(A, FakeLookupd(youzan_answer({1: 24520}, partition_num=2)))
    manager = make(cluster, [A], refresh_min_interval=0.25)
    await manager.lookup("t", "w")
    waiters = [
        asyncio.create_task(manager.wait_until("t", "w", lambda layout: 0 in layout.partitions, 10))
        for _ in range(5)
    ]
    # One task asks for all five: one round, then one sleep, whatever the number of waiters
    # (each waiter is a predicate and a future, not a loop of its own).
    await until(lambda: clock.sleeps.count(0.25) == 1)
    assert cluster.count(A, "/lookup") == 2  # one round for the five waiters
    assert len([t for t in asyncio.all_tasks() if "lookup-wait" in t.get_name()]) == 1
    clock.now += 0.25
    _wake_due(clock)
    await until(lambda: clock.sleeps.count(0.25) == 2)
    assert cluster.count(A, "/lookup") == 3
    lookupd.lookup = youzan_answer({0: 24510, 1: 24520}, partition_num=2)  # a leader again
    clock.now += 0.25
    _wake_due(clock)
    layouts = await asyncio.gather(*waiters)
    assert all(ports(layout) == {0: 24510, 1: 24520} for layout in layouts)
    assert cluster.count(A, "/lookup") == 4


async def test_wait_until_gives_up_after_its_timeout(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(down=True))
    manager = make(cluster, [A], refresh_min_interval=0.25, http_attempts=1)
    waiter = asyncio.create_task(manager.wait_until("t", "w", lambda layout: True, 0.4))
    await until(lambda: 0.25 in clock.sleeps)
    clock.now += 0.25
    _wake_due(clock)
    await until(lambda: len([d for d in clock.sleeps if d < 1]) == 2)
    assert [d for d in clock.sleeps if d < 1] == [0.25, pytest.approx(0.15)]
    clock.now += 0.15
    _wake_due(clock)
    assert await waiter is None
    # With no time at all, one round still runs.
    rounds = cluster.count(A, "/lookup")
    assert await manager.wait_until("t", "w", lambda layout: False, 0) is None
    assert cluster.count(A, "/lookup") == rounds + 1


# --------------------------------------------------------------------------- outcomes


async def test_topic_not_found(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(v1({"message": "TOPIC_NOT_FOUND"}, 404)))  # classic
    cluster.add(B, FakeLookupd(fixture("nsqlookupd_lookup_nonexistent_access_w_metainfo.v1.json")))
    cluster.add(C, FakeLookupd(down=True))
    manager = make(cluster, [A, B, C], http_attempts=1, refresh_min_interval=0.25)
    with pytest.raises(TopicNotFoundError) as info:
        await manager.lookup("nope", "w")
    assert info.value.topic == "nope"

    # The definitive answer is remembered for refresh_min_interval, like a layout would be.
    asked = cluster.count(path="/lookup")
    with pytest.raises(TopicNotFoundError):
        await manager.lookup("nope", "w")
    assert cluster.count(path="/lookup") == asked
    clock.now += 0.3
    with pytest.raises(TopicNotFoundError):
        await manager.lookup("nope", "w")
    assert cluster.count(path="/lookup") > asked


async def test_a_topic_error_is_remembered_for_one_round_only(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A, FakeLookupd(v1({"message": "TOPIC_NOT_FOUND"}, 404)))
    manager = make(cluster, [A], refresh_min_interval=0.25, http_attempts=1)
    with pytest.raises(TopicNotFoundError):
        await manager.refresh("t")
    clock.now += 0.3
    lookupd.down = True
    with pytest.raises(LookupFailedError):
        await manager.refresh("t")
    lookupd.down = False
    lookupd.lookup = youzan_answer({0: 24510})
    clock.now += 0.1  # within refresh_min_interval, but nothing is cached: ask again
    assert ports(await manager.refresh("t")) == {0: 24510}


async def test_topic_deleted_evicts_the_cached_layout(make: Make) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A)
    manager = make(cluster, [A])
    await manager.lookup("t", "w")
    lookupd.lookup = fixture("nsqlookupd_lookup_nonexistent_access_w_metainfo.default.json")
    with pytest.raises(TopicNotFoundError):
        await manager.refresh("t", "w")
    with pytest.raises(TopicNotFoundError):
        await manager.lookup("t", "w")  # not the stale layout


@pytest.mark.parametrize(
    "name",
    [
        "nsqlookupd_lookup_no_channel_yet_access_w.v1.json",
        "nsqlookupd_lookup_no_channel_yet_access_w_metainfo.default.json",
    ],
)
async def test_topic_has_no_channel(make: Make, name: str) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(fixture(name)))
    cluster.add(B, FakeLookupd(fixture("nsqlookupd_lookup_nonexistent_access_w_metainfo.v1.json")))
    manager = make(cluster, [A, B])
    with pytest.raises(TopicHasNoChannelError, match="start a consumer first"):
        await manager.lookup("ptest", "w")


async def test_unknown_topic_read_is_an_empty_layout(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(fixture("nsqlookupd_lookup_nonexistent.v1.json")))
    manager = make(cluster, [A])
    layout = await manager.lookup("no_such_topic")
    assert layout.empty
    assert layout.youzan


async def test_layout_wins_over_errors(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(fixture("nsqlookupd_lookup_nonexistent_access_w_metainfo.v1.json")))
    cluster.add(B, FakeLookupd(fixture("nsqlookupd_lookup_ptest_access_w_metainfo.default.json")))
    cluster.add(C, FakeLookupd(down=True))
    manager = make(cluster, [A, B, C], http_attempts=1)
    layout = await manager.lookup("ptest", "w")
    assert ports(layout) == {0: 24520, 1: 24540}


async def test_all_down_without_cache(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(down=True))
    cluster.add(B, FakeLookupd(httpx.Response(200, content=b"garbage")))
    manager = make(cluster, [A, B], http_attempts=1)
    await manager.discover()  # A fails it: the lookups after a discovery skip A
    with pytest.raises(LookupFailedError) as info:
        await manager.lookup("t")
    message = str(info.value)
    assert f"{A}: not asked, backing off after ConnectError: connection refused" in message
    assert f"{B}: ProtocolError" in message
    assert "'t'" in message


async def test_all_down_with_cache_serves_the_cache(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A)
    manager = make(cluster, [A], http_attempts=1)
    cached = await manager.lookup("t", "w")
    lookupd.down = True
    with caplog.at_level(logging.WARNING, logger="smartnsq.lookup"):
        assert await manager.refresh("t", "w") is cached
        assert await manager.lookup("t", "w") is cached
    assert "serving the cached layout" in caplog.text
    assert all(r.name == "smartnsq.lookup" for r in caplog.records)


async def test_classic_write_lookup_of_a_new_topic_lists_every_nsqd(make: Make) -> None:
    """Classic NSQ creates a topic on its first PUB: a write lookup of an unknown topic on a
    classic lookupd answers with every nsqd (/nodes) instead of TopicNotFoundError."""
    cluster = FakeCluster()
    classic = cluster.add(A, FakeLookupd(v1({"message": "TOPIC_NOT_FOUND"}, 404)))
    classic.listlookup = NO_LISTLOOKUP
    classic.nodes = fixture("classic_nsqlookupd_nodes.json")
    manager = make(cluster, [A])
    layout = await manager.lookup("new_topic", "w")
    assert layout.is_classic
    assert [n.tcp_address for n in layout.classic_nodes] == ["127.0.0.1:14150"]
    with pytest.raises(TopicNotFoundError):
        await manager.lookup("new_topic", "r")  # reading still waits for the topic


async def test_youzan_unknown_topic_is_not_bootstrapped(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(v1({"message": "Key not found"}, 404)))
    manager = make(cluster, [A])
    with pytest.raises(TopicNotFoundError):
        await manager.lookup("missing", "w")
    assert cluster.count(A, "/nodes") == 0


async def test_classic_lookupd(make: Make) -> None:
    cluster = FakeCluster()
    classic = cluster.add(A, FakeLookupd(fixture("classic_nsqlookupd_lookup_t1.json")))
    classic.listlookup = NO_LISTLOOKUP
    old = cluster.add(B, FakeLookupd(fixture("classic_nsqlookupd_lookup_t1.json")))
    old.listlookup = httpx.Response(404, content=b"404 page not found\n")  # Go's ServeMux
    manager = make(cluster, [A, B])
    layout = await manager.lookup("t1")
    assert layout.is_classic
    assert [n.tcp_address for n in layout.classic_nodes] == ["127.0.0.1:14150"]
    await manager.refresh("t1")
    # A 404 on /listlookup is an answer, not a failure: nobody was down-ranked.
    assert cluster.count(A, "/lookup") == cluster.count(B, "/lookup") == 2
    assert manager.lookupd_addresses == (A, B)


async def test_failover_answers_are_followed(make: Make) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(
        A, FakeLookupd(fixture("leader_change_r3test_p0_SIGTERM_w_before.v1.json"))
    )
    manager = make(cluster, [A])
    assert ports(await manager.lookup("r3test", "w")) == {0: 24510}
    lookupd.lookup = fixture("leader_change_r3test_p0_SIGTERM_w_after_failover.v1.json")
    after = await manager.refresh("r3test", "w")
    assert ports(after) == {0: 24520}
    assert after.classic_nodes == ()  # the old leader, still listed, is not a target


# --------------------------------------------------------------------------- polling and watch


async def test_periodic_refresh_uses_jittered_intervals(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A)
    rand = cycle([0.0, 1.0, 0.5, 0.25])
    manager = make(cluster, [A], poll_interval=10.0, poll_jitter=0.3, rand=lambda: next(rand))

    await manager.lookup("t")
    # The poller first slept on the placeholder due time (10 s), then the round rescheduled
    # the topic earlier (rand 0.0 -> 10 * (1 - 0.3) = 7 s) and woke it up.
    await until(lambda: clock.sleeping == 1 and len(clock.sleeps) == 2)
    assert clock.sleeps == [10.0, pytest.approx(7.0)]
    for expected in (13.0, 10.0, 8.5):
        await clock.advance(clock.sleeps[-1])
        assert clock.sleeps[-1] == pytest.approx(expected)
    assert cluster.count(A, "/lookup") == 4
    assert all(7.0 <= delay <= 13.0 for delay in clock.sleeps[1:])

    # Nothing happens between due times.
    await clock.advance(clock.sleeps[-1] / 2)
    assert cluster.count(A, "/lookup") == 4


async def test_poll_once_refreshes_only_due_topics(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A)
    manager = make(cluster, [A], poll_interval=10.0, poll_jitter=0.0)
    await manager.lookup("t1")
    clock.now += 5
    await manager.lookup("t2")
    assert await manager.poll_once() == 0
    clock.now += 5
    assert await manager.poll_once() == 1  # t1 only
    clock.now += 5
    assert await manager.poll_once() == 1  # t2 only
    assert cluster.count(A, "/lookup") == 4


async def test_watch_fires_only_on_change(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A, FakeLookupd(youzan_answer({0: 24510})))
    manager = make(cluster, [A], poll_interval=10.0, poll_jitter=0.0)
    sync_calls: list[TopicLayout] = []
    async_calls: list[TopicLayout] = []

    async def async_callback(layout: TopicLayout) -> None:
        await asyncio.sleep(0)
        async_calls.append(layout)

    await manager.lookup("t", "w")
    unwatch = manager.watch("t", "w", sync_calls.append)
    manager.watch("t", "w", async_callback)
    await until(lambda: clock.sleeping == 1)

    await clock.advance(10)  # same answer
    assert cluster.count(A, "/lookup") == 2
    assert sync_calls == async_calls == []

    # Same nodes under new connection ids: not a change.
    other_ids = json.loads(youzan_answer({0: 24510}).content)
    other_ids["partitions"]["0"]["remote_address"] = "127.0.0.1:60000"
    lookupd.lookup = v1(other_ids)
    await clock.advance(10)
    assert sync_calls == []

    lookupd.lookup = youzan_answer({0: 24520})
    await clock.advance(10)
    assert [ports(lay) for lay in sync_calls] == [{0: 24520}]
    assert async_calls == sync_calls

    await clock.advance(10)
    assert len(sync_calls) == 1

    # A forced refresh notifies as well, before it returns.
    lookupd.lookup = youzan_answer({0: 24530})
    await manager.refresh("t", "w")
    assert [ports(lay) for lay in sync_calls] == [{0: 24520}, {0: 24530}]

    unwatch()
    unwatch()  # idempotent
    lookupd.lookup = youzan_answer({0: 24540})
    await clock.advance(10)
    assert len(sync_calls) == 2
    assert len(async_calls) == 3


async def test_watch_of_an_unknown_topic_fetches_it_at_once(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A)
    manager = make(cluster, [A], poll_interval=10.0)
    first: list[TopicLayout] = []
    await manager.lookup("other")
    await until(lambda: clock.sleeping == 1)
    manager.watch("t", "r", first.append)  # wakes the sleeping poller
    await until(lambda: len(first) == 1)
    assert ports(first[0]) == {0: 24510}
    assert cluster.count(A, "/lookup") == 2


async def test_callback_errors_are_logged_and_polling_goes_on(
    make: Make, clock: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A)
    manager = make(cluster, [A], poll_interval=10.0, poll_jitter=0.0)
    seen: list[TopicLayout] = []

    def broken(layout: TopicLayout) -> None:
        raise RuntimeError("boom")

    async def broken_async(layout: TopicLayout) -> None:
        raise RuntimeError("async boom")

    await manager.lookup("t")
    manager.watch("t", "r", broken)
    manager.watch("t", "r", broken_async)
    manager.watch("t", "r", seen.append)
    await until(lambda: clock.sleeping == 1)
    with caplog.at_level(logging.ERROR, logger="smartnsq.lookup"):
        for port in (24520, 24530):
            lookupd.lookup = youzan_answer({0: port})
            await clock.advance(10)
    assert [ports(lay) for lay in seen] == [{0: 24520}, {0: 24530}]
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 4
    assert all("lookup watcher" in r.getMessage() for r in failures)


async def test_periodic_failures_keep_the_cache_and_the_poller(
    make: Make, clock: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster()
    lookupd = cluster.add(A)
    manager = make(cluster, [A], poll_interval=10.0, poll_jitter=0.0, http_attempts=1)
    cached = await manager.lookup("t")
    missing: list[TopicLayout] = []
    manager.watch("gone", "w", missing.append)
    await until(lambda: clock.sleeping == 1)
    lookupd.down = True
    with caplog.at_level(logging.WARNING, logger="smartnsq.lookup"):
        await clock.advance(10)
        await clock.advance(10)
    assert "periodic lookup of 'gone'" in caplog.text
    assert await manager.lookup("t") is cached
    lookupd.down = False
    await clock.advance(10)
    assert len(missing) == 1


# --------------------------------------------------------------------------- lifecycle


def _other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_close_leaves_no_tasks_and_closes_its_client(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A)
    before = _other_tasks()
    manager = make(cluster, [A])
    await manager.lookup("t")
    manager.watch("t", "w", lambda layout: None)
    await until(lambda: clock.sleeping == 1)
    assert _other_tasks() - before
    client = manager._client
    assert client is not None

    await manager.close()
    assert _other_tasks() - before == set()
    assert client.is_closed
    assert manager.closed
    await manager.close()  # idempotent

    with pytest.raises(ClientClosedError):
        await manager.lookup("t")
    with pytest.raises(ClientClosedError):
        await manager.refresh("t")
    with pytest.raises(ClientClosedError):
        manager.watch("t", "r", lambda layout: None)
    with pytest.raises(ClientClosedError):
        await manager.poll_once()


async def test_close_during_a_round(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(gate=asyncio.Event()))
    before = _other_tasks()
    manager = make(cluster, [A])
    pending = asyncio.ensure_future(manager.lookup("t"))
    await until(lambda: len(cluster.requests) == 1)
    await manager.close()
    with pytest.raises(ClientClosedError):
        await pending
    assert _other_tasks() - before == set()


async def test_async_with_and_a_callers_client(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A)
    before = _other_tasks()
    async with httpx.AsyncClient(transport=cluster.transport) as client:
        async with make(cluster, [A], http_client=client) as manager:
            assert ports(await manager.lookup("t")) == {0: 24510}
        assert manager.closed
        assert not client.is_closed  # not ours to close
    assert _other_tasks() - before == set()


async def test_nothing_is_bound_before_first_use() -> None:
    manager = LookupManager(["h"])
    assert manager._client is None
    assert manager._poller is None
    await manager.close()


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("seed", "address"),
    [
        ("10.0.0.1:4161", "10.0.0.1:4161"),
        ("http://10.0.0.1:4161/", "10.0.0.1:4161"),
        ("https://Lookupd.example:443", "lookupd.example:443"),
        ("lookupd", "lookupd:4161"),
        ("[::1]:4161", "[::1]:4161"),
        (" http://h:1 ", "h:1"),
    ],
)
def test_seeds_are_normalised(seed: str, address: str) -> None:
    assert LookupManager([seed]).lookupd_addresses == (address,)


def test_duplicate_seeds_are_merged() -> None:
    assert LookupManager(["h:1", "http://h:1"]).lookupd_addresses == ("h:1",)


@pytest.mark.parametrize(
    "seeds",
    [
        [],
        "h:4161",
        [""],
        [None],
        ["ftp://h:1"],
        ["h:0"],
        ["h:99999"],
        ["h:port"],
        ["http://h:1/lookup"],
        ["http://h:1?x=1"],
        ["http://user@h:1"],
        ["http://:1"],
    ],
)
def test_bad_seeds(seeds: Any) -> None:
    with pytest.raises(ValidationError) as info:
        LookupManager(seeds)
    assert info.value.field == "seeds"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"poll_interval": 0}, "poll_interval"),
        ({"poll_jitter": 1.0}, "poll_jitter"),
        ({"poll_jitter": -0.1}, "poll_jitter"),
        ({"refresh_min_interval": -1}, "refresh_min_interval"),
        ({"backoff_base": 0}, "backoff_base"),
        ({"backoff_max": True}, "backoff_max"),
        ({"http_attempts": 0}, "http_attempts"),
        ({"http_retry_wait": -1}, "http_retry_wait"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValidationError) as info:
        LookupManager(["h"], **kwargs)
    assert info.value.field == name


async def test_bad_arguments(make: Make) -> None:
    manager = make(FakeCluster(), [A])
    with pytest.raises(ValidationError):
        await manager.lookup("bad topic!")
    with pytest.raises(ValidationError):
        await manager.lookup("t", "x")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        manager.watch("t", "rw", print)  # type: ignore[arg-type]


async def test_lookup_each_reports_every_lookupd_unmerged(make: Make) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(youzan_answer({0: 24510})))
    cluster.add(B, FakeLookupd(youzan_answer({0: 24520})))  # disagrees
    cluster.add(C, FakeLookupd(down=True))
    manager = make(cluster, [A, B, C], http_attempts=1)
    answers = {a.lookupd: a for a in await manager.lookup_each("t", "r")}
    assert ports(answers[A].layout) == {0: 24510}  # type: ignore[arg-type]
    assert ports(answers[B].layout) == {0: 24520}  # type: ignore[arg-type]
    assert answers[C].layout is None
    assert "ConnectError" in answers[C].failure
    missing = FakeCluster()
    missing.add(A, FakeLookupd(v1({"message": "TOPIC_NOT_FOUND"}, 404)))
    (only,) = await make(missing, [A]).lookup_each("nope", "r")
    assert only.topic_not_found
    assert only.layout is None


async def test_an_nsqd_given_as_a_lookupd_is_named_and_skipped(make: Make) -> None:
    cluster = FakeCluster()
    nsqd = cluster.add(A, FakeLookupd(listlookup=NO_LISTLOOKUP))
    nsqd.info = v1({"version": "1.3.0", "tcp_port": 4150, "http_port": 4161})
    manager = make(cluster, [A])
    with pytest.raises(NotLookupdError, match="is an nsqd's HTTP address"):
        await manager.discover()
    cluster.add(B)
    both = make(cluster, [A, B])
    await both.discover()  # one real lookupd is enough; the nsqd is never asked to look up
    await both.lookup("t")
    assert (cluster.count(A, "/lookup"), cluster.count(B, "/lookup")) == (0, 1)


async def test_closing_ends_every_wait_with_a_typed_error(make: Make, clock: FakeTime) -> None:
    cluster = FakeCluster()
    cluster.add(A, FakeLookupd(youzan_answer({1: 24520}, partition_num=2)))
    manager = make(cluster, [A])
    await manager.lookup("t", "w")
    waiters = [
        asyncio.create_task(manager.wait_until("t", "w", lambda layout: False, 10))
        for _ in range(3)
    ]
    await until(lambda: clock.sleeping > 0)
    await manager.close()
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(outcome, ClientClosedError) for outcome in outcomes)
