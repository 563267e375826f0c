"""The settings of one connection to nsqd (what IDENTIFY asks for, TLS, AUTH, timeouts)."""

from __future__ import annotations

import math
import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any, Literal

from smartnsq._version import __version__
from smartnsq.errors import ValidationError
from smartnsq.protocol.frames import DEFAULT_MAX_FRAME_SIZE
from smartnsq.protocol.identify import MAX_HEARTBEAT_INTERVAL_MS, IdentifyRequest
from smartnsq.protocol.session import ClientSession, ResponseHook

__all__ = ["Compression", "ConnectionConfig"]

_HOSTNAME = socket.gethostname()

Compression = Literal["snappy", "deflate"] | None


@dataclass(frozen=True)
class ConnectionConfig:
    """Per-connection settings (durations in seconds). Validated at construction."""

    client_id: str = field(default_factory=lambda: f"{_HOSTNAME.split('.')[0]}:{os.getpid()}")
    hostname: str = _HOSTNAME
    user_agent: str = f"smartnsq/{__version__}"
    heartbeat_interval: float = 30.0
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    tls: bool | ssl.SSLContext = False
    tls_server_hostname: str | None = None
    compression: Compression = None
    deflate_level: int = 6
    sample_rate: int = 0
    msg_timeout: float | None = None
    auth_secret: str | bytes | None = None
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    write_timeout: float = 10.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    # The IDENTIFY of each (extend_support, desired_tag) asked for: made once, shared by
    # every connection with these settings (and encoded once).
    _identify_requests: dict[tuple[bool | None, str | None], IdentifyRequest] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "request_timeout", "write_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValidationError(name, f"must be a positive number of seconds, got {value!r}")
        if self.compression not in (None, "snappy", "deflate"):
            raise ValidationError("compression", "must be None, 'snappy' or 'deflate'")
        heartbeat = self.heartbeat_interval
        # IDENTIFY checks it too, but in milliseconds: it is given in seconds
        ms = _ms(heartbeat) if type(heartbeat) in (int, float) and math.isfinite(heartbeat) else 0
        if ms not in (-1, 0) and not 1000 <= ms <= MAX_HEARTBEAT_INTERVAL_MS:
            raise ValidationError(
                "heartbeat_interval",
                f"must be -1 (no heartbeats), 0 (nsqd's default) or "
                f"1..{MAX_HEARTBEAT_INTERVAL_MS // 1000} seconds, got {heartbeat!r}",
            )
        # IdentifyRequest validates the negotiable values (heartbeat range, levels...).
        self.identify_request(extend_support=None, desired_tag=None)

    @classmethod
    def build(
        cls, *, client_id: str | None = None, user_agent: str | None = None, **options: Any
    ) -> ConnectionConfig:
        """A config where ``client_id``/``user_agent`` None keep the defaults."""
        if client_id is not None:
            options["client_id"] = client_id
        if user_agent is not None:
            options["user_agent"] = user_agent
        return cls(**options)

    def identify_request(
        self, *, extend_support: bool | None, desired_tag: str | None
    ) -> IdentifyRequest:
        key = (extend_support, desired_tag)
        request = self._identify_requests.get(key)
        if request is None:
            request = self._identify_requests[key] = self._new_identify_request(*key)
        return request

    def _new_identify_request(
        self, extend_support: bool | None, desired_tag: str | None
    ) -> IdentifyRequest:
        return IdentifyRequest(
            client_id=self.client_id,
            hostname=self.hostname,
            user_agent=self.user_agent,
            heartbeat_interval=_ms(self.heartbeat_interval),
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=(
                None if self.output_buffer_timeout is None else _ms(self.output_buffer_timeout)
            ),
            tls_v1=bool(self.tls),
            snappy=self.compression == "snappy",
            deflate=self.compression == "deflate",
            deflate_level=self.deflate_level,
            sample_rate=self.sample_rate,
            msg_timeout=None if self.msg_timeout is None else _ms(self.msg_timeout),
            extend_support=extend_support,
            desired_tag=desired_tag,
        )

    def ssl_context(self) -> ssl.SSLContext:
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return ssl.create_default_context()

    def session(
        self,
        address: str,
        *,
        on_response: ResponseHook,
        extend_support: bool | None,
        desired_tag: str | None,
    ) -> ClientSession:
        """The protocol session of one connection with these settings."""
        return ClientSession(
            self.identify_request(extend_support=extend_support, desired_tag=desired_tag),
            on_response=on_response,
            address=address,
            auth_secret=self.auth_secret,
            request_timeout=self.request_timeout,
            handshake_timeout=self.connect_timeout,
            max_frame_size=self.max_frame_size,
        )


def _ms(seconds: float) -> int:
    if seconds == -1:
        return -1
    return round(seconds * 1000)
