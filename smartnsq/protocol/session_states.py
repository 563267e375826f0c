"""The client session's states and what is allowed in each, as tables (h11's ``_state.py``).

A connection goes through the handshake (IDENTIFY, then in nsqd's fixed order TLS, snappy or
deflate, then AUTH), is ready for requests, may subscribe once, may close its subscription
(CLS), and ends closed (the socket is gone) or in error (a fatal error frame or a protocol
violation; nsqd closes the connection after a fatal error).

Two tables say what may happen in each state:

* :data:`ACCEPTS`: the kinds of server frame a state takes. What real servers do decides
  it (nsqio/nsq v1.3.0 ``nsqd/protocol_v2.go`` and youzan/nsq 0.3.7-HA.1.13.0
  ``nsqdserver/protocol_v2.go``: ``IOLoop``, ``messagePump``, ``IDENTIFY``, ``SUB`` and
  youzan's ``internalSUB``, ``CLS``):

  - heartbeats come from the message pump, which ticks from the moment the connection is
    accepted, so any state takes them;
  - message frames come only from a subscribed channel, with RDY above 0, which the client
    sends after SUB's ``OK``: a message before that is a protocol error. After CLS nsqd
    still sends what its pump had under way, so closing takes them;
  - an error frame may come in any state (youzan refuses a connection over its limit before
    the IDENTIFY answer);
  - a response answers the handshake step under way, or the oldest request waiting for one
    (responses come in request order). nsqd answers nothing else, so a response with no
    request waiting is a protocol error (see ``ClientSession``).

  A frame of a kind the state does not take is a :class:`~smartnsq.errors.ProtocolError`
  that ends the session. In :attr:`State.ERROR` and :attr:`State.CLOSED` nothing more is
  read: after a fatal error nsqd closes the connection, and what its pump wrote meanwhile
  is dropped.

* :data:`SENDS`: the commands that change the state when the client sends them. Requests
  (PUB and its kin, and any command nsqd answers) are taken in :data:`REQUEST_STATES` and
  leave the state as it is; SUB is taken once, when ready (nsqd: "cannot SUB in current
  state" otherwise), CLS only when subscribed.
"""

from __future__ import annotations

import enum

__all__ = [
    "ACCEPTS",
    "HANDSHAKE_STATES",
    "REQUEST_STATES",
    "SENDS",
    "SUBSCRIBE_COMMANDS",
    "TERMINAL_STATES",
    "Received",
    "State",
]


class State(enum.StrEnum):
    """Where a client session is (a ``str`` enum: cheap to hash on the hot path)."""

    CONNECTED = "connected"  # the socket is open, nothing sent yet
    IDENTIFYING = "identifying"  # magic and IDENTIFY sent, waiting for the answer
    TLS = "tls"  # the transport starts TLS, then nsqd's OK comes over it
    COMPRESSION = "compression"  # waiting for nsqd's OK in the compressed stream
    AUTH = "auth"  # AUTH sent, waiting for the answer
    READY = "ready"  # handshake done: requests, and SUB once
    SUBSCRIBING = "subscribing"  # SUB sent, its OK not yet here
    SUBSCRIBED = "subscribed"  # messages flow
    CLOSING = "closing"  # CLS sent: what nsqd had under way still comes, then CLOSE_WAIT
    CLOSED = "closed"  # the socket is gone
    ERROR = "error"  # a fatal error frame or a protocol violation ended the session


class Received(enum.StrEnum):
    """The kinds of server frame."""

    RESPONSE = "response"
    HEARTBEAT = "heartbeat"
    ERROR_FRAME = "error frame"
    MESSAGE = "message"


_ANY_BUT_MESSAGES = frozenset({Received.RESPONSE, Received.HEARTBEAT, Received.ERROR_FRAME})
_ALL = _ANY_BUT_MESSAGES | {Received.MESSAGE}

ACCEPTS: dict[State, frozenset[Received]] = {
    State.CONNECTED: frozenset(),  # nothing was sent, nothing can be answered
    State.IDENTIFYING: _ANY_BUT_MESSAGES,
    State.TLS: _ANY_BUT_MESSAGES,
    State.COMPRESSION: _ANY_BUT_MESSAGES,
    State.AUTH: _ANY_BUT_MESSAGES,
    State.READY: _ANY_BUT_MESSAGES,
    State.SUBSCRIBING: _ANY_BUT_MESSAGES,
    State.SUBSCRIBED: _ALL,
    State.CLOSING: _ALL,
    State.CLOSED: frozenset(),
    State.ERROR: frozenset(),
}

SUBSCRIBE_COMMANDS = frozenset({"SUB", "SUB_ORDERED", "SUB_ADVANCED"})

SENDS: dict[tuple[State, str], State] = {
    (State.CONNECTED, "IDENTIFY"): State.IDENTIFYING,
    **{(State.READY, command): State.SUBSCRIBING for command in sorted(SUBSCRIBE_COMMANDS)},
    (State.SUBSCRIBED, "CLS"): State.CLOSING,
}

HANDSHAKE_STATES = frozenset({State.IDENTIFYING, State.TLS, State.COMPRESSION, State.AUTH})
REQUEST_STATES = frozenset({State.READY, State.SUBSCRIBING, State.SUBSCRIBED, State.CLOSING})
TERMINAL_STATES = frozenset({State.CLOSED, State.ERROR})
