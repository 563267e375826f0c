"""The embedded nsqd's batched paths (FIN runs, MPUB appends, delivery batches, frames built
without encode_message_frame) answer exactly as the one-command-at-a-time paths do."""

from __future__ import annotations

import asyncio

from smartnsq.protocol import commands as c
from smartnsq.protocol.frames import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, Frame
from smartnsq.protocol.message import (
    EXT_VERSION_NONE,
    MessageFrame,
    MessageLayout,
    decode_message,
    encode_message_frame,
)
from smartnsq.protocol.responses import CLOSE_WAIT
from smartnsq.testing import Cluster
from tests.integration.rawclient import RawClient

YOUZAN = MessageLayout.youzan()
CLASSIC = MessageLayout.classic()
OK_FRAME = Frame(FRAME_TYPE_RESPONSE, b"OK")


def _not_in_flight(message_id: bytes) -> str:
    shown = "[" + " ".join(str(b) for b in message_id) + "]"
    return f"E_FIN_FAILED FIN {shown} failed ErrType:7 ErrCode:0 : Message ID not in flight"


async def _consumer(
    cluster: Cluster, topic: str, partition: int | None, **identify: object
) -> RawClient:
    client = await RawClient.identified(cluster.nsqd_addresses[0], **identify)
    assert await client.request(c.sub(topic, "ch", partition)) == OK_FRAME
    return client


async def test_a_run_of_fins_in_one_write_answers_like_single_fins() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["ch"])
        consumer = await _consumer(cluster, "t", 0)
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.mpub("t", [b"m%d" % i for i in range(5)], 0))
        consumer.send(c.rdy(10))
        got = [await consumer.message(YOUZAN) for _ in range(5)]
        bogus = bytes(range(16))
        # One write: FIN, FIN, unknown id, the same id again, FIN, then CLS to mark the end.
        consumer.send(
            c.fin(got[0].id)
            + c.fin(got[1].id)
            + c.fin(bogus)
            + c.fin(got[1].id)
            + c.fin(got[2].id)
            + c.CLS
        )
        assert await consumer.error(b"") == _not_in_flight(bogus)
        assert await consumer.error(b"") == _not_in_flight(got[1].id)
        assert await consumer.frame() == Frame(FRAME_TYPE_RESPONSE, CLOSE_WAIT)
        record = cluster.channel_record("t", "ch")
        assert record.finished == [(0, m.internal_id) for m in got[:3]]
        assert cluster.in_flight("t", "ch") == 2
        # A FIN line shorter than 21 bytes: youzan nsqd reads on and takes bytes 4..20 as the
        # id, so the next FIN's start ends up in it (an unknown id: not fatal) and that FIN is
        # lost.
        consumer.send(c.fin(got[3].id) + b"FIN not-an-id\n" + c.fin(got[4].id))
        assert await consumer.error(b"") == _not_in_flight(b"not-an-id\nFIN " + got[4].id[:2])
        assert record.finished[-1] == (0, got[3].internal_id)
        assert cluster.in_flight("t", "ch") == 1
        # An id whose internal id is not positive ends a run: fatal E_INVALID.
        consumer.send(c.fin(got[4].id) + c.fin(bytes(16)) + c.fin(got[4].id))
        assert await consumer.error(b"") == "E_INVALID Invalid Message ID"
        assert await consumer.closed()
        assert record.finished[-1] == (0, got[4].internal_id)
        assert cluster.in_flight("t", "ch") == 0
        await producer.close()


async def _consume_all(client: RawClient, layout: MessageLayout, count: int) -> list[Frame]:
    """Receive ``count`` messages, FINning all of each read in one write."""
    frames: list[Frame] = []
    while len(frames) < count:
        batch = [await client.frame()]
        while (more := client.decoder.next_frame()) is not None:
            batch.append(Frame(*more))
        assert all(f.type == FRAME_TYPE_MESSAGE for f in batch), batch[-1]
        frames += batch
        client.send(b"".join(c.fin(decode_message(f.data, layout, MessageFrame).id) for f in batch))
    return frames


async def _frames_match_records(cluster: Cluster, topic: str, classic: bool) -> None:
    layout = CLASSIC if classic else YOUZAN
    partition = None if classic else 0
    consumer = await _consumer(cluster, topic, partition)
    producer = await RawClient.identified(cluster.nsqd_addresses[0])
    bodies = [b"body-%05d" % i for i in range(3000)]
    for start in range(0, len(bodies), 100):
        await producer.ok(c.mpub(topic, bodies[start : start + 100], partition))
    await producer.ok(c.pub(topic, b"single", partition))
    consumer.send(c.rdy(2500))
    frames = await _consume_all(consumer, layout, len(bodies) + 1)
    records = cluster.messages(topic)
    assert len(records) == len(frames)
    for frame, record in zip(frames, records, strict=True):
        expected = encode_message_frame(record.timestamp, 1, record.id, record.body)
        assert frame.data == expected[8:]
    assert [r.body for r in records] == [*bodies, b"single"]
    await cluster.wait_for(lambda: cluster.unfinished(topic, "ch") == 0)
    log = cluster.channel_record(topic, "ch")
    label = log.deliveries[0][3]
    assert log.deliveries == [(partition, r.internal_id, 1, label) for r in records]
    assert log.finished == [(partition, r.internal_id) for r in records]
    await consumer.close()
    await producer.close()


async def test_youzan_batches_deliver_the_frames_encode_message_frame_builds() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["ch"])
        await _frames_match_records(cluster, "t", classic=False)
        records = cluster.messages("t")
        assert [r.internal_id for r in records] == list(range(2, 2 + len(records)))
        assert [r.index for r in records] == list(range(len(records)))
        offsets = [r.offset for r in records]
        assert offsets == [sum(30 + len(r.body) for r in records[:i]) for i in range(len(records))]


async def test_classic_batches_deliver_the_frames_encode_message_frame_builds() -> None:
    async with Cluster(nodes=1, classic=True) as cluster:
        await _frames_match_records(cluster, "t", classic=True)
        ids = [r.id for r in cluster.messages("t")]
        assert len(set(ids)) == len(ids)


async def test_mpub_to_an_ext_topic_and_the_ext_detail_layout() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("e", 1, 1, ext=True, channels=["ch"])
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.mpub("e", [b"a", b"bb"], 0))
        records = cluster.messages("e")
        assert [(r.ext_version, r.raw_size, r.offset) for r in records] == [
            (EXT_VERSION_NONE, 32, 0),
            (EXT_VERSION_NONE, 33, 32),
        ]
        consumer = await RawClient.identified(cluster.nsqd_addresses[0], extend_support=True)
        start = c.StartPosition.message_count(1)
        assert await consumer.request(c.sub_advanced("e", "ch", 0, start)) == OK_FRAME
        consumer.send(c.rdy(2))
        for record in records:
            frame = await consumer.frame()
            expected = encode_message_frame(
                record.timestamp,
                1,
                record.id,
                record.body,
                ext_version=EXT_VERSION_NONE,
                offset=record.offset,
                raw_size=record.raw_size,
            )
            assert frame.data == expected[8:]
        await producer.close()
        await consumer.close()


async def test_clients_sharing_a_channel_take_turns() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["ch"])
        first = await _consumer(cluster, "t", 0)
        second = await _consumer(cluster, "t", 0)
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        for start in range(0, 1000, 100):
            await producer.ok(c.mpub("t", [b"%d" % i for i in range(start, start + 100)], 0))
        first.send(c.rdy(300))
        await cluster.wait_for(lambda: cluster.in_flight("t", "ch") == 300)
        second.send(c.rdy(300))
        await cluster.wait_for(lambda: cluster.in_flight("t", "ch") == 600)
        got: list[bytes] = []

        async def drain(client: RawClient) -> None:
            while True:
                message = await client.message(YOUZAN)
                got.append(message.body)
                client.send(c.fin(message.id))

        tasks = [asyncio.create_task(drain(client)) for client in (first, second)]
        try:
            await cluster.wait_for(lambda: cluster.unfinished("t", "ch") == 0)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert sorted(got, key=int) == [b"%d" % i for i in range(1000)]
        deliveries = cluster.channel_record("t", "ch").deliveries
        assert len(deliveries) == 1000
        assert len({d[3] for d in deliveries}) == 2
        for client in (first, second, producer):
            await client.close()


async def test_sampled_out_messages_are_finished_without_delivery() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["ch"])
        consumer = await _consumer(cluster, "t", 0, sample_rate=50)
        producer = await RawClient.identified(cluster.nsqd_addresses[0])
        await producer.ok(c.mpub("t", [b"x"] * 400, 0))
        consumer.send(c.rdy(400))
        channel = cluster.topics["t"].partitions[0].log.channels["ch"]
        await cluster.wait_for(lambda: channel.depth == 0)
        delivered = cluster.in_flight("t", "ch")
        assert channel.finish_count == 400 - delivered
        assert 0 < delivered < 400  # each of 400 kept with probability 1/2
        assert len(cluster.channel_record("t", "ch").finished) == 0  # not FINs
        await consumer.close()
        await producer.close()
