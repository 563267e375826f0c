from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from smartnsq.testing import Cluster

# partition -> nodes (leader first), from topology_at_capture.json and nsqlookupd_nodes.json
CAPTURE = {
    "ptest": {0: [1, 2], 1: [3, 0]},
    "otest": {0: [3, 0], 1: [0, 1], 2: [1, 2], 3: [2, 3]},
    "etest": {0: [1, 2], 1: [3, 0]},
    "p3": {0: [0], 1: [1], 2: [3]},
    "r3test": {0: [0, 1, 3]},
}


async def create_capture_topics(cluster: Cluster, channels: Sequence[str] = ("init",)) -> None:
    """The captures' topics on a 4-node cluster: ptest 2x2, otest 4x2 ordered, etest 2x2 ext,
    p3 3x1, r3test 1x3, placed as recorded, each with ``channels`` created the way the
    recordings' were (by a SUB: channel auto-creation stays allowed, as in the captures)."""
    topics = (
        ("ptest", 2, 2, False, False),
        ("otest", 4, 2, True, False),
        ("etest", 2, 2, False, True),
        ("p3", 3, 1, False, False),
        ("r3test", 1, 3, False, False),
    )
    for name, partitions, replicas, ordered, ext in topics:
        await cluster.create_topic(
            name, partitions, replicas, ordered=ordered, ext=ext, placement=CAPTURE[name]
        )
        for channel in channels:
            await cluster.create_channel_on_leaders(name, channel)


@pytest.fixture
async def youzan() -> AsyncIterator[Cluster]:
    """The topology of the captures (topology_at_capture.json, nodes numbered from 0 here:
    the transcripts' nsqd2 is node 1): 4 nodes; ptest 2x2, otest 4x2 ordered, etest 2x2 ext,
    p3 3x1, r3test 1x3; every topic with the channel "init"."""
    async with Cluster(nodes=4) as cluster:
        await create_capture_topics(cluster)
        yield cluster


@pytest.fixture
async def classic() -> AsyncIterator[Cluster]:
    async with Cluster(classic=True, nodes=1) as cluster:
        yield cluster
