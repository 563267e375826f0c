"""Routing decisions of the Producer (smartnsq.publishing.routes): explicit partitions,
sharding keys, round-robin around failed partitions, classic nsqd by address."""

from collections.abc import Mapping
from typing import Any

import pytest

from smartnsq.errors import NoWritablePartitionError, ValidationError
from smartnsq.protocol.lookupd import Node, TopicLayout, TopicMeta
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.routes import ANY_TOPIC, Route, Router
from smartnsq.routing.sharding import Sharder


def _node(port: int) -> Node:
    return Node("127.0.0.1", port, port + 1, "0.3.7-HA.1.13.0")


def _youzan(
    leaders: Mapping[int, int], partition_num: int | None = None, *, ext: bool = False
) -> TopicLayout:
    """A write layout: partition -> the TCP port of its leader."""
    count = len(leaders) if partition_num is None else partition_num
    return TopicLayout(
        "t",
        "w",
        partitions={p: _node(port) for p, port in leaders.items()},
        meta=TopicMeta(partition_num=count, replica=2, extend_support=ext),
        youzan=True,
    )


def _classic(*ports: int) -> TopicLayout:
    nodes = tuple(Node("127.0.0.1", port, port + 1, "1.3.0") for port in ports)
    return TopicLayout("t", "w", classic_nodes=nodes)


def _modulo(key: object, partition_num: int) -> int:
    if not isinstance(key, int):
        raise TypeError(key)
    return key % partition_num


def _router(nsqd: tuple[str, ...] = ()) -> Router:
    return Router(Sharder(_modulo), nsqd, start=lambda: 0)


def _request(command: str = "PUB", **fields: Any) -> PublishRequest:
    return PublishRequest("t", command, [b"x"], **fields)


FOUR = _youzan({0: 4150, 1: 4152, 2: 4154, 3: 4156})

# --------------------------------------------------------------------------- youzan


def test_round_robin_over_the_partitions_from_the_start_turn() -> None:
    router = _router()
    chosen = [router.route(_request(), FOUR) for _ in range(6)]
    assert [r.partition for r in chosen] == [0, 1, 2, 3, 0, 1]
    assert chosen[1] == Route("127.0.0.1:4152", 1, True, False, "t")


def test_each_topic_has_its_own_turn() -> None:
    starts = iter([0, 2])
    router = Router(Sharder(_modulo), start=lambda: next(starts))
    other = PublishRequest("u", "PUB", [b"x"])
    assert router.route(_request(), FOUR).partition == 0
    assert router.route(other, FOUR).partition == 2
    assert router.route(_request(), FOUR).partition == 1


def test_the_default_start_turn_is_random() -> None:
    firsts = {Router(Sharder()).route(_request(), FOUR).partition for _ in range(200)}
    assert len(firsts) > 1


def test_round_robin_skips_the_partitions_that_failed() -> None:
    router = _router()
    chosen = [router.route(_request(), FOUR, avoid={1, 3}).partition for _ in range(9)]
    assert set(chosen) == {0, 2}
    assert chosen[:4] == [0, 2, 0, 2]


def test_when_every_partition_failed_any_will_do() -> None:
    assert _router().route(_request(), FOUR, avoid={0, 1, 2, 3}).partition in {0, 1, 2, 3}


def test_round_robin_skips_partitions_without_a_leader() -> None:
    layout = _youzan({0: 4150, 2: 4154}, partition_num=4)
    router = _router()
    assert [router.route(_request(), layout).partition for _ in range(4)] == [0, 2, 0, 2]


def test_no_writable_partition() -> None:
    layout = _youzan({}, partition_num=2)
    with pytest.raises(NoWritablePartitionError, match="no writable partition"):
        _router().route(_request(), layout)


def test_an_explicit_partition_goes_to_its_leader_and_stays_pinned() -> None:
    router = _router()
    request = _request(partition=2)
    assert router.pin(request, FOUR) == 2
    assert router.route(request, FOUR) == Route("127.0.0.1:4154", 2, True, False, "t")
    # the leader moved: same partition, new address
    moved = _youzan({0: 4150, 1: 4152, 2: 4160, 3: 4156})
    assert router.route(request, moved, pinned=2).address == "127.0.0.1:4160"


def test_an_explicit_partition_beyond_the_topic_is_refused() -> None:
    request = _request(partition=4)
    for decide in (_router().route, _router().pin):
        with pytest.raises(ValidationError) as info:
            decide(request, FOUR)
        assert info.value.field == "partition"
        assert "4 partitions" in str(info.value)


def test_a_partition_without_a_leader_is_not_writable_now() -> None:
    request = _request(partition=1)
    layout = _youzan({0: 4150}, partition_num=2)
    with pytest.raises(NoWritablePartitionError, match=r"partition 1 of .* has no writable leader"):
        _router().route(request, layout)
    assert _router().pin(request, layout) == 1  # pinned all the same


def test_a_sharding_key_goes_to_the_sharders_partition_and_stays_there() -> None:
    router = _router()
    request = _request(key=7)
    pinned = router.pin(request, FOUR)
    assert pinned == 3
    assert router.route(request, FOUR, pinned=pinned).partition == 3
    # a layout with more partitions later does not move a publish already routed
    eight = _youzan({p: 4150 + 2 * p for p in range(8)})
    assert router.route(request, eight, pinned=pinned).partition == 3
    assert router.pin(request, eight) == 7  # a fresh publish of the same key
    assert router.route(_request(key=7), eight).partition == 7


def test_nothing_pins_an_unkeyed_or_classic_publish() -> None:
    router = _router()
    assert router.pin(_request(), FOUR) is None
    assert router.pin(_request(key=3), _classic(4150, 4250)) is None


def test_a_request_is_left_as_it_was_asked() -> None:
    router = _router()
    request = _request(key=7)
    router.route(request, FOUR, avoid={1})
    router.pin(request, FOUR)
    router.routable(request, FOUR)
    assert request == _request(key=7)


def test_a_keyed_publish_ignores_failed_partitions() -> None:
    assert _router().route(_request(key=5), FOUR, avoid={1}).partition == 1


def test_java_sharding_by_default() -> None:
    request = _request(key="order-42")
    sharder = Sharder("java")
    expected = sharder.partition_for("order-42", 4)
    assert Router(sharder).route(request, FOUR).partition == expected


def test_what_a_server_cannot_take_is_routed_and_left_to_the_codec() -> None:
    """DPUB on youzan and ext headers on a plain topic are the codec's refusals
    (smartnsq.publishing.wire): routing says where they would go."""
    assert _router().route(_request("DPUB"), FOUR).youzan
    request = _request("PUB_EXT", exts=[b'{"k":"v"}'])
    assert not _router().route(request, FOUR).ext_topic
    route = _router().route(request, _youzan({0: 4150, 1: 4152}, ext=True))
    assert route.ext_topic
    assert route.youzan


def test_a_route_table_is_computed_once_per_layout() -> None:
    router = _router()
    table = router.table("t", FOUR)
    assert router.table("t", FOUR) is table
    router.route(_request(), FOUR)
    assert router.table("t", FOUR) is table
    assert router.table("t", _youzan({0: 4150})) is not table


# --------------------------------------------------------------------------- classic


def test_classic_round_robin_over_the_nsqd_nodes() -> None:
    layout = _classic(4150, 4250)
    router = _router()
    chosen = [router.route(_request(), layout) for _ in range(3)]
    assert [r.address for r in chosen] == ["127.0.0.1:4150", "127.0.0.1:4250", "127.0.0.1:4150"]
    assert chosen[0] == Route("127.0.0.1:4150", None, False, False, ANY_TOPIC)


def test_classic_sharding_key_picks_an_nsqd() -> None:
    router = _router()
    for key, port in ((4, 4250), (5, 4350), (3, 4150), (4, 4250)):
        request = _request(key=key)
        assert router.route(request, _classic(4150, 4250, 4350)).address == f"127.0.0.1:{port}"


def test_a_classic_batch_stays_on_its_nsqd() -> None:
    request = _request("MPUB", address="127.0.0.1:4350")
    assert _router().route(request, _classic(4150, 4250)).address == "127.0.0.1:4350"


def test_a_partition_on_classic_is_carried_to_be_refused_with_the_address() -> None:
    request = _request(partition=1)
    route = _router().route(request, _classic(4150))
    assert (route.address, route.partition, route.youzan) == ("127.0.0.1:4150", 1, False)


def test_classic_topic_not_published_yet() -> None:
    with pytest.raises(NoWritablePartitionError, match="no nsqd publishes"):
        _router().route(_request(), _classic())


def test_direct_mode_routes_over_the_given_nsqd() -> None:
    router = _router(("10.0.0.1:4150", "10.0.0.2:4150"))
    routes = router.direct_routes
    assert [r.pool_topic for r in routes] == [ANY_TOPIC, ANY_TOPIC]
    chosen = [router.route_classic(_request(), routes).address for _ in range(2)]
    assert chosen == ["10.0.0.1:4150", "10.0.0.2:4150"]


# --------------------------------------------------------------------------- key_targets


def test_key_targets_youzan_partitions() -> None:
    assert _router().key_targets("t", [0, 5, 6, 3], FOUR) == [0, 1, 2, 3]


def test_key_targets_agree_with_single_publishes() -> None:
    router = Router(Sharder("murmur3"))
    keys = ["a", "b", "c", "a", 17]
    targets = router.key_targets("t", keys, FOUR)
    for key, target in zip(keys, targets, strict=True):
        request = _request(key=key)
        assert router.route(request, FOUR).partition == target


def test_key_targets_classic_addresses() -> None:
    targets = _router().key_targets("t", [1, 2], _classic(4150, 4250))
    assert targets == ["127.0.0.1:4250", "127.0.0.1:4150"]


def test_key_targets_direct_mode() -> None:
    router = _router(("10.0.0.1:4150", "10.0.0.2:4150"))
    assert router.key_targets("t", [0, 1], None) == ["10.0.0.1:4150", "10.0.0.2:4150"]


def test_key_targets_without_nsqd() -> None:
    with pytest.raises(NoWritablePartitionError, match="no nsqd publishes"):
        _router().key_targets("t", [1], _classic())


def test_key_targets_name_the_bad_key() -> None:
    with pytest.raises(ValidationError) as info:
        Router(Sharder("java")).key_targets("t", ["a", b"bytes"], FOUR)
    assert info.value.field == "sharding_keys[1]"


# --------------------------------------------------------------------------- waiting for a leader


def test_a_pinned_publish_has_its_target_without_a_writable_leader() -> None:
    router = _router()
    no_leader_for_1 = _youzan({0: 4150}, partition_num=2)
    keyed = _request(key=5)  # 5 % 2 -> partition 1, which has no leader now
    assert router.target(keyed, no_leader_for_1) == 1
    with pytest.raises(NoWritablePartitionError):
        router.route(keyed, no_leader_for_1)
    explicit = _request(partition=1)
    assert router.target(explicit, no_leader_for_1) == 1
    with pytest.raises(ValidationError):
        router.target(_request(partition=7), no_leader_for_1)
    classic = _request(key=3)
    assert router.target(classic, _classic(4150, 4152)) == "127.0.0.1:4152"
    assert _router(("10.0.0.1:4150",)).target(classic, None) == "10.0.0.1:4150"


def test_routable_says_whether_a_layout_has_somewhere_to_go() -> None:
    router = _router()
    keyed = _request(key=5)
    assert not router.routable(keyed, _youzan({0: 4150}, partition_num=2))
    assert router.routable(keyed, _youzan({0: 4150, 1: 4152}))
    # pinned to partition 0 by an earlier routing: its leader is what counts
    assert router.routable(keyed, _youzan({0: 4150}, partition_num=2), pinned=0)
    unkeyed = _request()
    assert router.routable(unkeyed, _youzan({0: 4150}, partition_num=2))
    assert not router.routable(unkeyed, _youzan({}, partition_num=2))
    unknown = _request(key=1)
    assert not router.routable(unknown, TopicLayout("t", "w", youzan=True))  # no count yet
    out_of_range = _request(partition=9)  # refused by the next try, not waited for
    assert router.routable(out_of_range, _youzan({0: 4150}, partition_num=2))
    assert router.routable(_request(), _classic(4150))
    assert not router.routable(_request(), _classic())
    assert _router(("10.0.0.1:4150",)).routable(_request(), None)


def test_routable_takes_no_round_robin_turn() -> None:
    router = _router()
    for _ in range(3):
        assert router.routable(_request(), FOUR)
    assert router.route(_request(), FOUR).partition == 0
