"""The error-code registry: error frame text -> typed :class:`~smartnsq.errors.ServerError`.

Codes are matched on the first word of the frame text (real servers send
``"E_FAILED_ON_NOT_LEADER "`` with a trailing space, and ``INVALID_TRACE_ID`` has no ``E_``).
Whether a code is fatal depends on the command for some codes: ``E_FAILED_ON_NOT_LEADER`` and
``E_FAILED_ON_NOT_WRITABLE`` are non-fatal after a publish but fatal after SUB or FIN
(youzan/nsq 0.3.7-HA.1.13.0: ``internal/protocol/errors.go``, and which errors close the
connection in ``nsqdserver/protocol_v2.go``, ``handleRequestReponseForClient``). Unknown codes
become :class:`~smartnsq.errors.UnknownServerError`.
"""

from __future__ import annotations

from smartnsq import errors as e
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, encode_frame

__all__ = [
    "BAD_PROTOCOL_FRAME",
    "ERROR_CLASSES",
    "PUBLISH_COMMANDS",
    "error_code",
    "error_from_frame",
    "is_fatal",
]

#: What nsqd writes to a connection whose first 4 bytes are not its protocol magic (an HTTP
#: request sent to its TCP port, say), before it closes the connection: the error frame
#: ``E_BAD_PROTOCOL``, no description (``tcpServer.Handle``, nsqd/tcp.go in nsqio/nsq v1.3.0
#: and nsqdserver/tcp.go in youzan/nsq 0.3.7-HA.1.13.0).
BAD_PROTOCOL_FRAME = encode_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")

PUBLISH_COMMANDS = frozenset(
    {"PUB", "MPUB", "PUB_TRACE", "MPUB_TRACE", "PUB_EXT", "MPUB_EXT", "DPUB"}
)

ERROR_CLASSES: dict[str, type[e.ServerError]] = {
    cls.code: cls
    for cls in (
        e.InvalidCommandError,
        e.BadTopicError,
        e.BadChannelError,
        e.BadPartitionError,
        e.BadBodyError,
        e.BadMessageError,
        e.TopicNotExistError,
        e.NotLeaderError,
        e.NotWritableError,
        e.PubFailedError,
        e.MPubFailedError,
        e.DPubFailedError,
        e.PubTooMuchWaitingError,
        e.ExtNotSupportedError,
        e.InvalidJsonHeaderError,
        e.InvalidTraceIdError,
        e.BadTagError,
        e.TagNotSupportedError,
        e.OrderedSubscribeRequiredError,
        e.ExtendSupportRequiredError,
        e.ExtendSupportForbiddenError,
        e.ChannelNotRegisteredError,
        e.FinFailedError,
        e.ReqFailedError,
        e.TouchFailedError,
        e.IdentifyFailedError,
        e.AuthFirstError,
        e.AuthFailedError,
        e.UnauthorizedError,
        e.AuthDisabledError,
        e.CreateTopicFailedError,
        e.BadExtError,
        e.BadProtocolError,
    )
}

# Codes whose fatality depends on the command: non-fatal for publishes, fatal otherwise.
_NON_FATAL_FOR_PUBLISH = frozenset({"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE"})
_TOO_MANY_CONNECTIONS = "too much client connections"


def error_code(text: str) -> str:
    """The code of an error frame's text (its first word)."""
    if text.startswith(_TOO_MANY_CONNECTIONS):
        return _TOO_MANY_CONNECTIONS
    return text.split(" ", 1)[0]


def is_fatal(code: str, command: str | None) -> bool:
    """Whether nsqd closes the connection after sending ``code`` in answer to ``command``."""
    if code in _NON_FATAL_FOR_PUBLISH:
        return command not in PUBLISH_COMMANDS
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return True
    return cls.fatal


def error_from_frame(
    payload: bytes | str, command: str | None = None, address: str | None = None
) -> e.ServerError:
    """Build the typed exception for an error frame's payload.

    ``command`` is the command the error answers (``"PUB"``, ``"SUB"``, ``"FIN"``...), when
    known; it decides fatality for the codes where that differs.
    """
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    text = text.rstrip("\n")
    code = error_code(text)
    if code == _TOO_MANY_CONNECTIONS:
        return e.TooManyConnectionsError(text, command=command, address=address)
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return e.UnknownServerError(text, code=code, fatal=True, command=command, address=address)
    return cls(text, fatal=is_fatal(code, command), command=command, address=address)
