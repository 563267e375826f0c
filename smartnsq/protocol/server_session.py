"""nsqd's side of a connection's handshake, pure: the mirror of ``ClientSession``'s.

What a client's IDENTIFY sets on the server, in nsqd's order and with its texts
(``nsqd/client_v2.go`` ``Identify`` and its setters), and what the server negotiates back
(``protocol_v2.go`` ``IDENTIFY``: the answer, then TLS, snappy or deflate, each confirmed by
an ``OK`` in the upgraded stream; ``nsqdserver/`` in youzan/nsq 0.3.7-HA.1.13.0, ``nsqd/``
in nsqio/nsq v1.3.0). The
embedded nsqd carries it out (writes, ``start_tls``, codecs); what a real server answered is
in ``tests/fixtures`` and checked byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from smartnsq.protocol.identify import MAX_DEFLATE_LEVEL, MAX_OUTPUT_BUFFER_SIZE, IdentifyResponse
from smartnsq.protocol.responses import OK
from smartnsq.protocol.validation import MAX_DESIRED_TAG_LENGTH

__all__ = ["Negotiation", "Peer", "ServerFeatures", "UpgradeConflict", "negotiate"]

# What an nsqd client's output buffer is before IDENTIFY changes it: youzan 100 B and 50 ms,
# classic 16 KiB and 250 ms (NewOptions in nsqd/options.go).
_YOUZAN_BUFFER = (100, 50)
_CLASSIC_BUFFER = (16 * 1024, 250)
_CLASSIC_MAX_BUFFER_TIMEOUT_MS = 30_000  # youzan's is 1 s, IdentifyRequest's bound


@dataclass(frozen=True)
class ServerFeatures:
    """What an nsqd offers and bounds (durations in seconds)."""

    youzan: bool
    version: str
    max_rdy_count: int = 2500
    max_msg_timeout: float = 900.0
    max_heartbeat_interval: float = 60.0
    tls: bool = False  # a TLS certificate is configured
    snappy: bool = True
    deflate: bool = True
    auth: bool = False  # an auth server (here: secrets) is configured


class UpgradeConflict(ValueError):
    """IDENTIFY asked for snappy and deflate together (``E_IDENTIFY_FAILED``)."""


@dataclass(frozen=True)
class Peer:
    """What nsqd knows of a client: its defaults, then what IDENTIFY set (durations in
    seconds; the output buffer timeout in milliseconds, 0 when unbuffered)."""

    heartbeat_interval: float  # 0: no heartbeats
    msg_timeout: float
    output_buffer_size: int
    output_buffer_timeout: int
    buffer_size_chosen: bool = False  # IDENTIFY set output_buffer_size
    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    sample_rate: int = 0
    desired_tag: str = ""
    extend_support: bool = False

    @classmethod
    def initial(cls, *, youzan: bool, heartbeat_interval: float, msg_timeout: float) -> Peer:
        size, timeout = _YOUZAN_BUFFER if youzan else _CLASSIC_BUFFER
        return cls(heartbeat_interval, msg_timeout, size, timeout)

    def identified(self, data: Mapping[str, Any], features: ServerFeatures) -> Peer:
        """The client after its IDENTIFY (``data``: the decoded JSON body): each setting in
        nsqd's order; :class:`ValueError` with nsqd's text names the first bad one."""
        youzan = features.youzan
        client_id, hostname = data.get("client_id", ""), data.get("hostname", "")
        if youzan:  # the deprecated names still count
            client_id = client_id or data.get("short_id", "")
            hostname = hostname or data.get("long_id", "")

        heartbeat = self.heartbeat_interval
        interval = data.get("heartbeat_interval", 0)
        if interval == -1:
            heartbeat = 0.0
        elif 1000 <= interval <= features.max_heartbeat_interval * 1000:
            heartbeat = interval / 1000
        elif interval != 0:
            raise ValueError(f"heartbeat interval ({interval}) is invalid")

        size = data.get("output_buffer_size", 0)
        timeout = data.get("output_buffer_timeout", 0)
        if youzan:  # sizes above the maximum are clamped, timeouts below 10 ms raised to it
            buffer_size = _buffer_size(size, self.output_buffer_size, clamp=True)
            buffer_timeout = _buffer_timeout(
                10 if 0 < timeout < 10 else timeout, self.output_buffer_timeout, 1000
            )
        else:  # classic checks the timeout first, and -1 for the size also unbuffers
            buffer_timeout = _buffer_timeout(
                timeout, self.output_buffer_timeout, _CLASSIC_MAX_BUFFER_TIMEOUT_MS
            )
            buffer_size = _buffer_size(size, self.output_buffer_size, clamp=False)
            if size == -1:
                buffer_timeout = 0

        rate = data.get("sample_rate", 0)
        if not 0 <= rate <= 99:
            raise ValueError(f"sample rate ({rate}) is invalid")

        msg_timeout = self.msg_timeout
        requested = data.get("msg_timeout", 0)
        if 1000 <= requested <= features.max_msg_timeout * 1000:
            msg_timeout = requested / 1000
        elif requested != 0:
            raise ValueError(f"msg timeout ({requested}) is invalid")

        tag, extend = self.desired_tag, self.extend_support
        if youzan:
            wanted = data.get("desired_tag", "")
            if len(wanted.encode()) > MAX_DESIRED_TAG_LENGTH:
                length = len(wanted.encode())
                raise ValueError(f"invalid tag len {length}, exceed limit {MAX_DESIRED_TAG_LENGTH}")
            tag = wanted or tag  # an empty tag keeps the one set before
            extend = extend or bool(data.get("extend_support"))  # never switched off again
        return replace(
            self,
            heartbeat_interval=heartbeat,
            msg_timeout=msg_timeout,
            output_buffer_size=buffer_size,
            output_buffer_timeout=buffer_timeout,
            buffer_size_chosen=size != 0,
            client_id=client_id,
            hostname=hostname,
            user_agent=data.get("user_agent", ""),
            sample_rate=rate,
            desired_tag=tag,
            extend_support=extend,
        )


def _buffer_size(size: int, current: int, *, clamp: bool) -> int:
    if size == -1:
        return 1
    if 64 <= size <= MAX_OUTPUT_BUFFER_SIZE or (clamp and size > MAX_OUTPUT_BUFFER_SIZE):
        return min(size, MAX_OUTPUT_BUFFER_SIZE)
    if size != 0:
        raise ValueError(f"output buffer size ({size}) is invalid")
    return current


def _buffer_timeout(timeout: int, current: int, maximum: int) -> int:
    if timeout == -1:
        return 0
    if 1 <= timeout <= maximum:
        return timeout
    if timeout != 0:
        raise ValueError(f"output buffer timeout ({timeout}) is invalid")
    return current


@dataclass(frozen=True)
class Negotiation:
    """nsqd's answer to IDENTIFY and the upgrades that follow it, in that order: TLS, then
    snappy or deflate (``deflate_level`` 0: youzan stores, its missing-level bug)."""

    reply: bytes
    negotiated: bool = True
    tls: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0


def negotiate(data: Mapping[str, Any], peer: Peer, features: ServerFeatures) -> Negotiation:
    """What nsqd answers to IDENTIFY once ``peer`` is identified. Without
    ``feature_negotiation`` a plain ``OK`` and no upgrade; :class:`UpgradeConflict` for
    snappy and deflate together."""
    if not data.get("feature_negotiation"):
        return Negotiation(OK, negotiated=False)
    tls = bool(data.get("tls_v1")) and features.tls
    snappy = bool(data.get("snappy")) and features.snappy
    deflate = bool(data.get("deflate")) and features.deflate
    level = int(data.get("deflate_level", 0))
    if features.youzan:  # min(requested, 6) when deflating: a missing level is 0
        deflate_level = min(level, MAX_DEFLATE_LEVEL) if deflate else 0
    else:
        deflate_level = min(level if deflate and level > 0 else 6, MAX_DEFLATE_LEVEL)
    if snappy and deflate:
        raise UpgradeConflict("cannot enable both deflate and snappy compression")
    reply = IdentifyResponse(
        max_rdy_count=features.max_rdy_count,
        version=features.version,
        max_msg_timeout=int(features.max_msg_timeout * 1000),
        msg_timeout=int(peer.msg_timeout * 1000),
        tls_v1=tls,
        deflate=deflate,
        deflate_level=deflate_level,
        max_deflate_level=MAX_DEFLATE_LEVEL,
        snappy=snappy,
        sample_rate=peer.sample_rate,
        auth_required=features.auth,
        output_buffer_size=peer.output_buffer_size,
        output_buffer_timeout=peer.output_buffer_timeout,
        desired_tag=peer.desired_tag,
    ).encode()
    return Negotiation(reply, True, tls, snappy, deflate, deflate_level)
