"""What a client session reports to its transport (``ClientSession.receive_data``,
``expired``, ``connection_lost``): typed events, each a small immutable value.

The two frames of the hot paths are not events: a response goes to the session's
``on_response(token, data)`` and a message to the hook ``subscribe`` set, inline, so that
publishing and consuming cost no object per frame.
"""

from __future__ import annotations

from typing import NamedTuple

from smartnsq.errors import NSQError, ServerError
from smartnsq.protocol.identify import IdentifyResponse
from smartnsq.protocol.responses import AuthResponse

__all__ = [
    "HEARTBEAT_EVENT",
    "START_TLS",
    "Closed",
    "Event",
    "Heartbeat",
    "Ready",
    "RequestFailed",
    "SessionFailed",
    "StartTLS",
    "UnsolicitedError",
]


class RequestFailed(NamedTuple):
    """The request ``token`` failed: nsqd's error reply to it, or the session ended first."""

    token: int
    error: NSQError


class UnsolicitedError(NamedTuple):
    """An error frame that answers no request (``E_FIN_FAILED`` after a FIN, for one)."""

    error: ServerError


class Heartbeat(NamedTuple):
    """nsqd's heartbeat; the session has queued the NOP that answers it."""


class StartTLS(NamedTuple):
    """The transport upgrades the socket to TLS now, then calls ``tls_started``."""


class Ready(NamedTuple):
    """The handshake is done: requests may be sent. ``identify`` is None when nsqd did not
    negotiate features (a plain ``OK``); ``auth`` is set when nsqd required AUTH."""

    identify: IdentifyResponse | None
    auth: AuthResponse | None


class SessionFailed(NamedTuple):
    """A fatal error frame, a protocol violation or an expired deadline ended the session:
    the transport drops the connection. Every request pending was failed before it."""

    error: NSQError


class Closed(NamedTuple):
    """The connection is gone; every request pending was failed before it."""

    error: NSQError


Event = RequestFailed | UnsolicitedError | Heartbeat | StartTLS | Ready | SessionFailed | Closed

HEARTBEAT_EVENT = Heartbeat()
START_TLS = StartTLS()
