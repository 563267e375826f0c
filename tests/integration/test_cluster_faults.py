"""Fault injection and durability of the embedded cluster, checked with raw sockets."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.message import MessageLayout
from smartnsq.testing import Cluster, ClusterError
from tests.integration.rawclient import RawClient

YOUZAN = MessageLayout.youzan()
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


async def _lookup(cluster: Cluster, topic: str, access: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.get(
            f"{cluster.lookupd_url}/lookup",
            params={"topic": topic, "access": access, "metainfo": "true"},
            headers=V1,
        )


async def _leaders(cluster: Cluster, topic: str, access: str = "w") -> dict[int, int]:
    """partition -> tcp port of its leader, as nsqlookupd answers."""
    answer = (await _lookup(cluster, topic, access)).json()
    return {int(p): peer["tcp_port"] for p, peer in answer["partitions"].items()}


def _port(cluster: Cluster, node: int) -> int:
    return int(cluster.nsqd_addresses[node].rsplit(":", 1)[1])


async def _producer(cluster: Cluster, node: int) -> RawClient:
    return await RawClient.identified(cluster.nsqd_addresses[node])


async def _consumer(
    cluster: Cluster, node: int, topic: str, channel: str, partition: int, rdy: int = 100
) -> RawClient:
    client = await RawClient.identified(cluster.nsqd_addresses[node])
    await client.ok(c.sub(topic, channel, partition))
    client.send(c.rdy(rdy))
    return client


async def test_move_leader(youzan: Cluster) -> None:
    """The old leader keeps producer connections (they answer E_FAILED_ON_NOT_LEADER),
    closes consumer connections; the new leader redelivers un-FINed messages with the same
    id and attempts reset to 1; the lookup shows the new leader."""
    old, new = 1, 2  # ptest-0: leader node 1, replica node 2
    producer = await _producer(youzan, old)
    consumer = await _consumer(youzan, old, "ptest", "mv", 0)
    # A finished message syncs the channel's offset, and so the channel, to the replica.
    await producer.ok(c.pub("ptest", b"finished", 0))
    done = await consumer.message(YOUZAN)
    consumer.send(c.fin(done.id))
    await youzan.wait_for(lambda: youzan.unfinished("ptest", "mv") == 0)
    await producer.ok(c.pub("ptest", b"unfinished", 0))
    first = await consumer.message(YOUZAN)
    assert first.attempts == 1
    await youzan.move_leader("ptest", 0, to_node=new)
    assert await consumer.closed()
    assert await producer.error(c.pub("ptest", b"x", 0)) == "E_FAILED_ON_NOT_LEADER "
    assert await producer.error(c.pub("ptest", b"y", 0)) == "E_FAILED_ON_NOT_LEADER "  # open
    assert (await _leaders(youzan, "ptest"))[0] == _port(youzan, new)
    again = await _consumer(youzan, new, "ptest", "mv", 0)
    redelivered = await again.message(YOUZAN)
    assert (redelivered.id, redelivered.attempts, redelivered.body) == (first.id, 1, b"unfinished")
    again.send(c.fin(redelivered.id))
    await youzan.wait_for(lambda: youzan.unfinished("ptest", "mv") == 0)
    assert youzan.channel_record("ptest", "mv").finished == [
        (0, done.internal_id),
        (0, first.internal_id),
    ]
    for client in (producer, again):
        await client.close()


async def test_a_channel_never_synced_does_not_survive_a_leader_change(youzan: Cluster) -> None:
    """A channel created by SUB lives on the leader only until a FIN syncs its offset to the
    replicas (channel_durability.txt): the new leader has none, the next SUB creates it at
    the end, and what was published in between is never delivered to it."""
    old, new = 1, 2
    producer = await _producer(youzan, old)
    consumer = await _consumer(youzan, old, "ptest", "fresh", 0)
    await producer.ok(c.pub("ptest", b"held, never finished", 0))
    await consumer.message(YOUZAN)
    await youzan.move_leader("ptest", 0, to_node=new)
    assert await consumer.closed()
    writer = await _producer(youzan, new)
    await writer.ok(c.pub("ptest", b"published while nobody subscribed", 0))
    again = await _consumer(youzan, new, "ptest", "fresh", 0)
    assert await again.silent(0.3)
    await writer.ok(c.pub("ptest", b"after the new SUB", 0))
    assert (await again.message(YOUZAN)).body == b"after the new SUB"
    for client in (producer, writer, again):
        await client.close()


async def test_move_leader_to_a_non_replica_adds_it(youzan: Cluster) -> None:
    assert youzan.topology("ptest")[0]["replicas"] == [1, 2]
    await youzan.move_leader("ptest", 0, to_node=0)
    assert youzan.topology("ptest")[0] == {"leader": 0, "replicas": [1, 2, 0], "writable": True}


async def test_stop_node_fails_over_with_quorum() -> None:
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic("r3", 1, 3, channels=["c"], placement={0: [0, 1, 2]})
        await cluster.create_topic("r2", 1, 2, channels=["c"], placement={0: [0, 1]})
        producer = await _producer(cluster, 0)
        await producer.ok(c.pub("r3", b"before", 0))
        await cluster.stop_node(0)
        assert await producer.closed()
        # 3 replicas, 2 alive: a majority, the new leader takes writes
        assert cluster.topology("r3")[0] == {"leader": 1, "replicas": [0, 1, 2], "writable": True}
        node1 = await _producer(cluster, 1)
        await node1.ok(c.pub("r3", b"after", 0))
        # 2 replicas, 1 alive: leader moves but the partition refuses writes (as captured)
        assert cluster.topology("r2")[0]["leader"] == 1
        assert await node1.error(c.pub("r2", b"x", 0)) == "E_FAILED_ON_NOT_WRITABLE "
        assert await _leaders(cluster, "r2", "w") == {}
        assert await _leaders(cluster, "r2", "r") == {0: _port(cluster, 1)}
        await cluster.start_node(0)
        assert cluster.topology("r2")[0] == {"leader": 1, "replicas": [0, 1], "writable": True}
        await node1.ok(c.pub("r2", b"writable again", 0))
        # Everything acknowledged survived the crash.
        assert [r.body for r in cluster.messages("r3")] == [b"before", b"after"]
        await node1.close()


async def test_failover_delay() -> None:
    async with Cluster(nodes=3, failover_delay=0.3) as cluster:
        await cluster.create_topic("t", 1, 3, channels=["c"], placement={0: [0, 1, 2]})
        started = time.monotonic()
        await cluster.stop_node(0)
        assert await _leaders(cluster, "t", "r") == {}  # no live leader during the election
        await cluster.wait_for(lambda: cluster.leader("t", 0) == 1, timeout=3)
        assert time.monotonic() - started >= 0.3
        assert await _leaders(cluster, "t") == {0: _port(cluster, 1)}


async def test_restart_before_failover_keeps_leadership() -> None:
    async with Cluster(nodes=2, failover_delay=5) as cluster:
        await cluster.create_topic("t", 1, 2, channels=["c"], placement={0: [0, 1]})
        await cluster.stop_node(0)
        await cluster.start_node(0)
        assert cluster.topology("t")[0] == {"leader": 0, "replicas": [0, 1], "writable": True}
        producer = await _producer(cluster, 0)
        await producer.ok(c.pub("t", b"back", 0))
        await producer.close()


async def test_unwritable_partition(youzan: Cluster) -> None:
    producer = await _producer(youzan, 1)
    await youzan.set_writable("ptest", 0, False)
    assert await producer.error(c.pub("ptest", b"x", 0)) == "E_FAILED_ON_NOT_WRITABLE "
    assert 0 not in await _leaders(youzan, "ptest", "w")
    assert 0 in await _leaders(youzan, "ptest", "r")
    await youzan.set_writable("ptest", 0, True)
    await producer.ok(c.pub("ptest", b"x", 0))  # same connection: the error was not fatal
    await producer.close()


async def test_drop_connections(youzan: Cluster) -> None:
    producer = await _producer(youzan, 1)
    consumer = await _consumer(youzan, 1, "ptest", "d", 0)
    dropped = await youzan.drop_connections(1, producers=False)
    assert dropped == 1
    assert await consumer.closed()
    await producer.ok(c.pub("ptest", b"x", 0))
    assert await youzan.drop_connections(1) == 1
    assert await producer.closed()


async def test_suspended_heartbeats() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        client = await RawClient.identified(cluster.nsqd_addresses[0], heartbeat_interval=1000)
        client.skip_heartbeats = False
        cluster.suspend_heartbeats(0)
        assert await client.silent(1.5)
        cluster.resume_heartbeats(0)
        assert (await client.frame(2.5)).data == b"_heartbeat_"
        await client.close()


async def test_latency(youzan: Cluster) -> None:
    producer = await _producer(youzan, 1)
    youzan.set_latency(1, 0.2)
    started = time.monotonic()
    await producer.ok(c.pub("ptest", b"slow", 0))
    assert time.monotonic() - started >= 0.2
    youzan.set_latency(1, 0)
    await producer.close()


async def test_frozen_lookupd_serves_a_stale_answer() -> None:
    async with Cluster(nodes=3, lookupds=2) as cluster:
        await cluster.create_topic("t", 1, 2, channels=["c"], placement={0: [0, 1]})
        cluster.freeze_lookupd(1, ["t"])
        await cluster.move_leader("t", 0, to_node=1)
        async with httpx.AsyncClient(timeout=5) as http:
            answers = [
                (await http.get(f"{url}/lookup", params={"topic": "t"}, headers=V1)).json()
                for url in cluster.lookupd_urls
            ]
        assert answers[0]["partitions"]["0"]["tcp_port"] == _port(cluster, 1)
        assert answers[1]["partitions"]["0"]["tcp_port"] == _port(cluster, 0)
        cluster.thaw_lookupd(1)


def _leader(cluster: Cluster, topic: str, partition: int) -> int:
    leader = cluster.leader(topic, partition)
    assert leader is not None
    return leader


async def test_durability_across_leader_moves_and_crashes() -> None:
    """Everything acknowledged survives; what was not finished is redelivered; nothing
    finished is redelivered."""
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic("d", 3, 3, channels=["c"])
        leaders = {p: _leader(cluster, "d", p) for p in range(3)}
        for p, node in leaders.items():
            producer = await _producer(cluster, node)
            await producer.ok(c.mpub("d", [f"{p}-{i}".encode() for i in range(50)], p))
            await producer.close()
        # Consume part of each partition, leaving some in flight.
        finished: dict[int, set[int]] = {}
        consumers = []
        for p, node in leaders.items():
            consumer = await _consumer(cluster, node, "d", "c", p, rdy=30)
            got = [await consumer.message(YOUZAN) for _ in range(30)]
            consumer.send(c.rdy(0))
            for message in got[:20]:
                consumer.send(c.fin(message.id))
            finished[p] = {m.internal_id for m in got[:20] if m.internal_id is not None}
            await cluster.wait_for(lambda p=p: cluster.in_flight("d", "c", p) == 10)
            consumers.append(consumer)
        await cluster.move_leader("d", 0, to_node=(leaders[0] + 1) % 3)
        await cluster.stop_node(leaders[1])
        assert await consumers[0].closed()  # its partition moved away
        assert await consumers[1].closed()  # its node crashed
        await consumers[2].close()  # a plain disconnect: in-flight messages go back too
        for p in range(3):
            consumer = await _consumer(cluster, _leader(cluster, "d", p), "d", "c", p, rdy=50)
            for _ in range(30):
                message = await consumer.message(YOUZAN)
                assert message.internal_id not in finished[p]
                consumer.send(c.fin(message.id))
            assert await consumer.silent(0.1)
            await consumer.close()
        record = cluster.channel_record("d", "c")
        assert record.duplicates_finished() == []
        every = [(p, r.internal_id) for p in range(3) for r in cluster.messages("d", p)]
        assert len(every) == 150
        assert sorted(record.finished) == sorted(every)


async def test_message_timeout_touch_and_req_delay() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = await _producer(cluster, 0)
        consumer = await RawClient.identified(cluster.nsqd_addresses[0], msg_timeout=1000)
        await consumer.ok(c.sub("t", "c", 0))
        consumer.send(c.rdy(10))
        await producer.ok(c.pub("t", b"slow handler", 0))
        message = await consumer.message(YOUZAN)
        started = time.monotonic()
        await asyncio.sleep(0.6)
        consumer.send(c.touch(message.id))  # resets the 1 s timeout
        again = await consumer.message(YOUZAN, timeout=3)
        assert again.id == message.id
        assert again.attempts == 2
        assert time.monotonic() - started >= 1.5
        assert cluster.channel_record("t", "c").timed_out == [(0, message.internal_id)]
        consumer.send(c.req(again.id, 300))
        delayed_at = time.monotonic()
        third = await consumer.message(YOUZAN, timeout=3)
        assert third.attempts == 3
        assert time.monotonic() - delayed_at >= 0.25
        consumer.send(c.fin(third.id))
        await cluster.wait_for(lambda: cluster.unfinished("t", "c") == 0)
        for client in (producer, consumer):
            await client.close()


async def test_ordered_channel_ignores_req_delay() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("o", 1, 1, ordered=True, channels=["c"])
        producer = await _producer(cluster, 0)
        await producer.ok(c.pub("o", b"first", 0))
        await producer.ok(c.pub("o", b"second", 0))
        consumer = await RawClient.identified(cluster.nsqd_addresses[0], msg_timeout=1000)
        await consumer.ok(c.sub_ordered("o", "c", 0))
        consumer.send(c.rdy(5))
        layout = MessageLayout.youzan(detail=True)
        first = await consumer.message(layout)
        # published before the channel's first SUB_ORDERED: sent twice (as recorded)
        assert (await consumer.message(layout)).id == first.id
        consumer.send(c.req(first.id, 5000))  # ignored: stays in flight until its timeout
        assert await consumer.silent(0.5)
        again = await consumer.message(layout, timeout=2)
        assert (again.body, again.attempts) == (b"first", 2)
        consumer.send(c.req(again.id, 0))  # REQ 0 requeues at once, still first in line
        third = await consumer.message(layout)
        assert (third.body, third.attempts) == (b"first", 3)
        consumer.send(c.fin(third.id))
        assert (await consumer.message(layout)).body == b"second"
        for client in (producer, consumer):
            await client.close()


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (b"2501", "E_INVALID RDY count 2501 out of range 0-2500"),
        # nsqd reads digits only: a sign does not parse
        (b"-1", "E_INVALID RDY could not parse count -1"),
    ],
)
async def test_rdy_out_of_range_is_fatal(youzan: Cluster, count: bytes, expected: str) -> None:
    client = await _consumer(youzan, 1, "ptest", "r", 0, rdy=1)
    assert await client.error(b"RDY %s\n" % count) == expected
    assert await client.closed()


@pytest.mark.parametrize("classic", [False, True], ids=["youzan", "classic"])
async def test_a_client_leaving_with_messages_in_flight(classic: bool) -> None:
    """youzan puts a leaving client's in-flight messages back at once (protocol_v2's
    RequeueClientMessages); classic nsqd (RemoveClient) leaves them in flight until their
    msg_timeout, so another consumer gets them only then."""
    layout = MessageLayout.classic() if classic else YOUZAN
    partition = None if classic else 0
    async with Cluster(nodes=1, classic=classic) as cluster:
        if not classic:  # classic nsqd: the SUB below creates the topic and the channel
            await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = await _producer(cluster, 0)
        leaving = await RawClient.identified(cluster.nsqd_addresses[0], msg_timeout=1000)
        await leaving.ok(c.sub("t", "c", partition))
        leaving.send(c.rdy(1))
        await producer.ok(c.pub("t", b"unanswered", partition))
        message = await leaving.message(layout)
        staying = await RawClient.identified(cluster.nsqd_addresses[0])
        await staying.ok(c.sub("t", "c", partition))
        staying.send(c.rdy(1))
        left_at = time.monotonic()
        await leaving.close()
        again = await staying.message(layout, timeout=5)
        waited = time.monotonic() - left_at
        assert (again.id, again.attempts) == (message.id, 2)
        if classic:
            assert waited >= 0.9  # the leaving client's msg_timeout (1 s)
            assert cluster.channel_record("t", "c").timed_out != []
        else:
            assert waited < 0.9
            assert cluster.channel_record("t", "c").timed_out == []
        for client in (producer, staying):
            await client.close()


async def test_fin_on_an_ordered_channel_without_its_in_sync_majority_is_fatal() -> None:
    """docker_real_images.txt item 5 and protocol_v2.go FIN: while a partition lacks a
    majority of in-sync replicas (Cluster.set_writable(False), or a failover's catch-up),
    SUB_ORDERED succeeds and delivers, but the FIN of an ordered channel is a cluster error:
    fatal E_FAILED_ON_NOT_WRITABLE, empty description, whatever the id. REQ and TOUCH stay
    local to the node, and a plain channel's FIN is not refused."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("o", 1, 2, ordered=True, channels=["c"])
        leader = cluster.leader("o", 0)
        assert leader is not None
        # one node leads both
        await cluster.create_topic("p", 1, 2, channels=["c"], placement={0: [leader, 1 - leader]})
        producer = await _producer(cluster, leader)
        for topic in ("o", "p"):
            await producer.ok(c.pub(topic, b"m0", 0))
        await cluster.set_writable("o", 0, False)
        await cluster.set_writable("p", 0, False)
        layout = MessageLayout.youzan(detail=True)

        consumer = await RawClient.identified(cluster.nsqd_addresses[leader])
        await consumer.ok(c.sub_ordered("o", "c", 0))
        consumer.send(c.rdy(1))
        message = await consumer.message(layout)
        assert message.body == b"m0"
        assert (await consumer.message(layout)).id == message.id  # the first, sent twice
        consumer.send(c.touch(message.id))
        consumer.send(c.req(message.id, 0))  # back to the queue at once, then again
        again = await consumer.message(layout)
        assert (again.id, again.attempts) == (message.id, 2)
        assert await consumer.error(c.fin(again.id)) == "E_FAILED_ON_NOT_WRITABLE "
        assert await consumer.closed()
        assert cluster.unfinished("o", "c") == 1

        # subscribing again works and redelivers; an unknown id is refused the same way
        consumer = await RawClient.identified(cluster.nsqd_addresses[leader])
        await consumer.ok(c.sub_ordered("o", "c", 0))
        consumer.send(c.rdy(1))
        assert (await consumer.message(layout)).body == b"m0"
        assert await consumer.error(c.fin(b"\x00" * 7 + b"\x09" + b"\x00" * 8)) == (
            "E_FAILED_ON_NOT_WRITABLE "
        )
        assert await consumer.closed()

        plain = await RawClient.identified(cluster.nsqd_addresses[leader])
        await plain.ok(c.sub("p", "c", 0))
        plain.send(c.rdy(1))
        delivered = await plain.message(YOUZAN)
        plain.send(c.fin(delivered.id))
        await cluster.wait_for(lambda: cluster.unfinished("p", "c") == 0)

        await cluster.set_writable("o", 0, True)  # in sync again: the FIN goes through
        consumer = await RawClient.identified(cluster.nsqd_addresses[leader])
        await consumer.ok(c.sub_ordered("o", "c", 0))
        consumer.send(c.rdy(1))
        last = await consumer.message(layout)
        consumer.send(c.fin(last.id))
        await cluster.wait_for(lambda: cluster.unfinished("o", "c") == 0)
        for client in (producer, consumer, plain):
            await client.close()


async def test_fin_on_an_ordered_channel_after_a_crash_that_loses_the_majority() -> None:
    """2 replicas, the leader crashes: the new leader serves SUB_ORDERED, but its FINs are
    refused (fatal E_FAILED_ON_NOT_WRITABLE) until the crashed node is back in sync."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("o", 1, 2, ordered=True, channels=["c"])
        old = cluster.leader("o", 0)
        assert old is not None
        new = 1 - old
        producer = await _producer(cluster, old)
        await producer.ok(c.pub("o", b"m0", 0))
        await producer.close()
        await cluster.stop_node(old)
        assert cluster.leader("o", 0) == new
        layout = MessageLayout.youzan(detail=True)
        consumer = await RawClient.identified(cluster.nsqd_addresses[new])
        await consumer.ok(c.sub_ordered("o", "c", 0))
        consumer.send(c.rdy(1))
        message = await consumer.message(layout)
        assert (await consumer.message(layout)).id == message.id  # its channel's first, twice
        assert await consumer.error(c.fin(message.id)) == "E_FAILED_ON_NOT_WRITABLE "
        assert await consumer.closed()
        await cluster.start_node(old)
        consumer = await RawClient.identified(cluster.nsqd_addresses[new])
        await consumer.ok(c.sub_ordered("o", "c", 0))
        consumer.send(c.rdy(1))
        consumer.send(c.fin((await consumer.message(layout)).id))
        await cluster.wait_for(lambda: cluster.unfinished("o", "c") == 0)
        await consumer.close()


def _go_bytes(data: bytes) -> str:
    return "[" + " ".join(str(b) for b in data) + "]"


async def test_late_echo_of_the_first_ordered_delivery() -> None:
    """docker_real_images.txt item 6 as a fault: the first ordered delivery goes out twice,
    and the second copy is put in flight only after the FIN of the first, which fails
    non-fatally as not in flight (sub_ordered_first_delivery_twice.txt's text). The message is
    then in flight: the partition delivers nothing more until it is answered again (or its
    msg_timeout passes)."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("o", 1, 2, ordered=True, channels=["ord"])
        leader = cluster.leader("o", 0)
        assert leader is not None
        producer = await _producer(cluster, leader)
        for body in (b"m0", b"m1", b"m2"):
            await producer.ok(c.pub("o", body, 0))
        cluster.set_ordered_echo_late("o", "ord")
        layout = MessageLayout.youzan(detail=True)
        consumer = await RawClient.identified(cluster.nsqd_addresses[leader], msg_timeout=1000)
        await consumer.ok(c.sub_ordered("o", "ord", 0))
        consumer.send(c.rdy(1))
        first = await consumer.message(layout)
        second = await consumer.message(layout)
        assert (second.id, second.attempts, second.body) == (first.id, 1, b"m0")
        assert await consumer.error(c.fin(first.id)) == (
            f"E_FIN_FAILED FIN {_go_bytes(first.id)} failed ErrType:7 ErrCode:0 : "
            "Message ID not in flight"
        )
        assert cluster.in_flight("o", "ord") == 1  # the second copy, in flight now
        assert await consumer.silent(0.3)  # it holds the partition
        # unanswered, it times out (msg_timeout 1 s) and comes again
        again = await consumer.message(layout, timeout=3)
        assert (again.id, again.attempts) == (first.id, 2)
        consumer.send(c.fin(again.id))
        assert (await consumer.message(layout)).body == b"m1"
        assert [r[1] for r in cluster.channel_record("o", "ord").timed_out] == [first.internal_id]
        await consumer.close()
        await producer.close()


async def test_late_echo_answered_again_goes_on() -> None:
    """The client that answers the second copy (FIN again) unblocks the partition at once;
    a TOUCH as first answer fails the same way. Without the fault, the first FIN succeeds."""
    async with Cluster(nodes=1) as cluster:
        for topic in ("late", "usual"):
            await cluster.create_topic(topic, 1, 1, ordered=True, channels=["c"])
            producer = await _producer(cluster, 0)
            for body in (b"m0", b"m1"):
                await producer.ok(c.pub(topic, body, 0))
            await producer.close()
        cluster.set_ordered_echo_late("late", "c")
        layout = MessageLayout.youzan(detail=True)

        consumer = await RawClient.identified(cluster.nsqd_addresses[0])
        await consumer.ok(c.sub_ordered("late", "c", 0))
        consumer.send(c.rdy(1))
        first = await consumer.message(layout)
        assert (await consumer.message(layout)).id == first.id
        assert (await consumer.error(c.touch(first.id))).startswith("E_TOUCH_FAILED TOUCH ")
        consumer.send(c.fin(first.id))  # the second copy: in flight now, finished
        assert (await consumer.message(layout)).body == b"m1"
        await consumer.close()

        consumer = await RawClient.identified(cluster.nsqd_addresses[0])
        await consumer.ok(c.sub_ordered("usual", "c", 0))
        consumer.send(c.rdy(1))
        first = await consumer.message(layout)
        assert (await consumer.message(layout)).id == first.id
        consumer.send(c.fin(first.id))  # the first FIN finishes it
        assert (await consumer.message(layout)).body == b"m1"
        await consumer.close()
        with pytest.raises(ClusterError):
            cluster.set_ordered_echo_late("nosuch", "c")
