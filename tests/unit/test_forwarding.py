"""Forwarders that cannot drift: the blocking Message shows every public field of the async
one (and nothing else), each read from it; the embedded cluster's attributes that are its
parts' read (and write) there."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from smartnsq import sync
from smartnsq.consumer.message import Message as AsyncMessage
from smartnsq.consumer.subscription import Subscription
from smartnsq.protocol.message import MessageLayout, decode_message, encode_message_frame
from smartnsq.testing import Cluster
from smartnsq.testing import cluster as cluster_module


def _public(cls: type) -> tuple[set[str], set[str]]:
    """The public fields and the public methods of ``cls``."""
    names = {name for name in dir(cls) if not name.startswith("_")}
    methods = {name for name in names if inspect.isfunction(inspect.getattr_static(cls, name))}
    return names - methods, methods


def test_the_blocking_message_shows_every_field_of_the_async_one() -> None:
    fields, methods = _public(AsyncMessage)
    blocking_fields, blocking_methods = _public(sync.Message)
    assert fields >= sync.NOT_FORWARDED  # what it leaves out exists
    assert blocking_fields == fields - sync.NOT_FORWARDED
    assert blocking_methods == methods
    for name in blocking_fields:
        assert isinstance(inspect.getattr_static(sync.Message, name), property), name


def test_each_field_is_read_from_the_async_message() -> None:
    layout = MessageLayout(binary_id=True, ext=True, detail=True)
    frame = encode_message_frame(
        7, 2, bytes(range(16)), b"body", ext_version=4, ext_raw=b'{"k":"v"}', offset=9, raw_size=3
    )
    message = decode_message(frame[8:], layout, AsyncMessage)  # after size and type
    message.lane = Subscription(None, "t", "c", ("127.0.0.1:4150", 1), None)  # type: ignore[arg-type]
    message.responded = False
    blocking: Any = sync.Message(message, None)  # type: ignore[arg-type]
    for name in _public(sync.Message)[0]:
        assert getattr(blocking, name) == getattr(message, name), name
    assert blocking.ext == {"k": "v"}
    assert (blocking.topic, blocking.partition, blocking.offset) == ("t", 1, 9)


def test_the_cluster_attributes_are_its_parts() -> None:
    cluster = Cluster(nodes=2)
    forwarded = {
        name: attribute
        for name, attribute in vars(Cluster).items()
        if isinstance(attribute, cluster_module._Forwarded)
    }
    assert {"host", "failover_delay", "topics", "classic"} <= set(forwarded)
    for name, attribute in forwarded.items():
        part = getattr(cluster, attribute.part)
        assert hasattr(part, name), f"Cluster.{name}: {type(part).__name__} has no {name}"
        assert getattr(cluster, name) is getattr(part, name)
        if attribute.writable:
            value = getattr(cluster, name)
            setattr(cluster, name, value)
            assert getattr(part, name) is value
        else:
            with pytest.raises(AttributeError):
                setattr(cluster, name, getattr(cluster, name))
    cluster.failover_delay = 2.5
    assert cluster._topology.failover_delay == 2.5
