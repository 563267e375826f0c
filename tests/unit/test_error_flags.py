"""Every error the client raises says itself whether it is retriable and whether it means the
cluster layout is stale; ``smartnsq.flow.retry`` only reads those two flags."""

from __future__ import annotations

import inspect

import pytest

from smartnsq import errors as e
from smartnsq.flow.retry import is_retriable, needs_lookup_refresh
from smartnsq.protocol.errors import ERROR_CLASSES

# The errors that are not server frames: (retriable, refresh_lookup).
CLIENT_ERRORS: dict[type[e.NSQError], tuple[bool, bool]] = {
    e.NSQError: (False, False),
    e.ValidationError: (False, False),
    e.ProtocolError: (True, False),  # a broken stream: a new connection may be sound
    e.NotNsqdError: (False, False),
    e.NotHttpError: (False, False),
    e.ConnectionClosedError: (True, True),
    e.NSQTimeoutError: (True, True),
    e.ClientClosedError: (False, False),
    e.ForkedClientError: (False, False),
    e.PublishError: (False, False),
    e.UnsupportedFeatureError: (False, False),
    e.TopicNotFoundError: (False, False),
    e.TopicHasNoChannelError: (False, False),
    e.LookupFailedError: (True, False),
    e.NotLookupdError: (False, False),
    e.NoWritablePartitionError: (True, True),
    e.OrderViolationError: (False, False),
    e.AdminError: (False, False),
    e.DataLossError: (False, False),
    e.PlacementError: (False, False),
}


def _every_error_class() -> list[type[e.NSQError]]:
    classes = [getattr(e, name) for name in e.__all__]
    return [c for c in classes if inspect.isclass(c) and issubclass(c, e.NSQError)]


def _bare(cls: type[e.NSQError]) -> e.NSQError:
    """An instance without running ``__init__`` (whose arguments differ per class)."""
    return cls.__new__(cls)


def test_the_table_covers_every_error_that_is_not_a_server_frame() -> None:
    server = {c for c in _every_error_class() if issubclass(c, e.ServerError)}
    assert set(_every_error_class()) - server == set(CLIENT_ERRORS)


@pytest.mark.parametrize("cls", _every_error_class(), ids=lambda c: c.__name__)
def test_every_error_carries_both_flags(cls: type[e.NSQError]) -> None:
    assert type(cls.retriable) is bool
    assert type(cls.refresh_lookup) is bool
    error = _bare(cls)
    assert is_retriable(error) is cls.retriable
    assert needs_lookup_refresh(error) is cls.refresh_lookup
    if cls.refresh_lookup:
        assert cls.retriable, "a stale layout is worth another try once refreshed"


@pytest.mark.parametrize("cls", sorted(CLIENT_ERRORS, key=lambda c: c.__name__))
def test_client_errors(cls: type[e.NSQError]) -> None:
    assert (cls.retriable, cls.refresh_lookup) == CLIENT_ERRORS[cls]


def test_server_errors_keep_their_registry_flags() -> None:
    assert e.NotLeaderError.retriable
    assert e.NotLeaderError.refresh_lookup
    assert not e.BadTopicError.retriable
    assert set(ERROR_CLASSES.values()) <= set(_every_error_class())


def test_a_server_error_instance_may_differ_from_its_class() -> None:
    error = e.UnknownServerError("E_NEW", code="E_NEW")
    error.retriable = False
    assert not is_retriable(error)


def test_anything_but_an_nsq_error_is_never_retried() -> None:
    for exc in (OSError("x"), RuntimeError("x"), TimeoutError(), ConnectionResetError()):
        assert not is_retriable(exc)
        assert not needs_lookup_refresh(exc)
