"""The options every client shares: where nsqd is (``lookupd=[...]`` or ``nsqd=[...]``, the
lookup's poll interval and address map), how a connection is made (timeouts, heartbeats,
TLS, compression, AUTH, the IDENTIFY names) and the OpenTelemetry providers.

Each client's options are one frozen value, checked once when it is made and passed down
whole: :class:`ClientOptions` here, extended by
:class:`~smartnsq.producer.options.ProducerOptions` and
:class:`~smartnsq.consumer.options.ConsumerOptions`. The clients keep their keyword
arguments: a client's constructor hands them over with :func:`keyword_arguments`, and
:func:`expose_options` gives the client a read-only attribute per option. A unit test holds
each constructor's parameters to its options' fields (names, defaults and annotations), so
an option is written out once beside the public constructors.
"""

from __future__ import annotations

import dataclasses
import math
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from smartnsq.errors import ValidationError
from smartnsq.flow.backoff import check_seconds
from smartnsq.routing.addresses import AddressMapping
from smartnsq.transport.connection import Compression, ConnectionConfig
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.targets import Targets, resolve_targets

__all__ = ["ClientOptions", "check_flag", "expose_options", "keyword_arguments", "set_derived"]

C = TypeVar("C", bound=type)


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """What a Producer and a Consumer are both given (durations in seconds). Checked when
    made: the connection settings become :attr:`connection_config` (with the client's own,
    from :meth:`_connection_specific`); the targets are checked by :meth:`targets` (which a
    client calls in its constructor). Both raise ValidationError naming the argument."""

    lookupd: Sequence[str] | None = None
    nsqd: Sequence[str] | None = None
    connect_timeout: float = 5.0
    heartbeat_interval: float = 30.0
    tls: Any = False
    compression: Compression = None
    deflate_level: int = 6
    auth_secret: str | bytes | None = None
    client_id: str | None = None
    user_agent: str | None = None
    lookupd_poll_interval: float = 60.0
    lookup_manager: LookupManager | None = None
    address_map: AddressMapping | None = None
    tracer_provider: Any = None
    meter_provider: Any = None
    # derived: the per-connection settings
    connection_config: ConnectionConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_seconds("connect_timeout", self.connect_timeout, positive=True)
        heartbeat = self.heartbeat_interval
        if type(heartbeat) not in (int, float) or not math.isfinite(heartbeat):
            # its range (-1 disables, 0 is nsqd's default) is IDENTIFY's to check, below
            raise ValidationError("heartbeat_interval", f"must be seconds, got {heartbeat!r}")
        if type(self.tls) is not bool and not isinstance(self.tls, ssl.SSLContext):
            raise ValidationError("tls", f"must be a bool or an ssl.SSLContext, got {self.tls!r}")
        _check_optional("auth_secret", self.auth_secret, (str, bytes))
        _check_optional("client_id", self.client_id, (str,))
        _check_optional("user_agent", self.user_agent, (str,))
        _check_optional("lookup_manager", self.lookup_manager, (LookupManager,))
        for name, method in (("tracer_provider", "get_tracer"), ("meter_provider", "get_meter")):
            provider = getattr(self, name)
            if provider is not None and not callable(getattr(provider, method, None)):
                raise ValidationError(name, f"must be an OpenTelemetry provider (with {method})")
        config = ConnectionConfig.build(
            client_id=self.client_id,
            user_agent=self.user_agent,
            heartbeat_interval=self.heartbeat_interval,
            tls=self.tls,
            compression=self.compression,
            deflate_level=self.deflate_level,
            auth_secret=self.auth_secret,
            connect_timeout=self.connect_timeout,
            **self._connection_specific(),
        )
        set_derived(self, "connection_config", config)

    def _connection_specific(self) -> dict[str, Any]:
        """A client's own connection settings (``request_timeout``, ``msg_timeout``...)."""
        return {}

    def targets(self) -> Targets:
        """Where the client finds nsqd: the nsqd addresses (direct mode), or the lookup
        manager (made here unless one was given, and then the client's to close)."""
        return resolve_targets(
            lookupd=self.lookupd,
            nsqd=self.nsqd,
            lookup_manager=self.lookup_manager,
            poll_interval=self.lookupd_poll_interval,
            address_map=self.address_map,
        )


def _check_optional(name: str, value: object, kinds: tuple[type, ...]) -> None:
    if value is not None and not isinstance(value, kinds):
        expected = " or ".join(kind.__name__ for kind in kinds)
        raise ValidationError(name, f"must be a {expected} or None, not {type(value).__name__}")


def check_flag(name: str, value: object) -> bool:
    """A yes-or-no option: a bool, not a truthy value of another kind."""
    if type(value) is not bool:
        raise ValidationError(name, f"must be True or False, not {value!r}")
    return value


def set_derived(options: object, name: str, value: Any) -> None:
    """Set a field of a frozen options value while it is made (in ``__post_init__``): a
    value derived from the others, or an argument resolved (a default that follows the
    mode)."""
    object.__setattr__(options, name, value)


def keyword_arguments(arguments: Mapping[str, Any], *positional: str) -> dict[str, Any]:
    """A client constructor's keyword arguments, from its ``locals()`` taken first thing:
    all but ``self`` and the ``positional`` ones."""
    leave = {"self", *positional}
    return {name: value for name, value in arguments.items() if name not in leave}


def expose_options(options_type: type) -> Callable[[C], C]:
    """A class decorator: each field of ``options_type`` becomes a read-only attribute of
    the client that reads its ``options`` (``producer.publish_timeout`` is
    ``producer.options.publish_timeout``), unless the client has one of that name already
    (``Consumer.start`` is the method). Generated, so they cannot drift from the options."""

    def decorate(client: C) -> C:
        for option in dataclasses.fields(options_type):
            if not hasattr(client, option.name):
                setattr(client, option.name, _option_property(option.name))
        return client

    return decorate


def _option_property(name: str) -> property:
    def read(client: Any) -> Any:
        return getattr(client.options, name)

    return property(read, doc=f"``options.{name}`` (read-only)")
