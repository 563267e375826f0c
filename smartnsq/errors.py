"""The smartnsq exception tree.

Every error raised by the library derives from :class:`NSQError`, and every one says how a
client treats it (as aiokafka's errors do): ``retriable``, the same request can succeed if tried
again later (possibly elsewhere); ``refresh_lookup``, the cluster layout the client used is
probably stale, so it asks nsqlookupd again before the next try. The Producer's retries and the
Consumer's reconnections read these two flags and nothing else.

Server error frames map to :class:`ServerError` subclasses (one per NSQ error code, see
``smartnsq.protocol.errors`` for the registry) that also carry ``code`` and ``fatal``. Argument
errors derive from :class:`ValueError` or :class:`TypeError` as well, so callers that validate
input the usual Python way keep working.
"""

from __future__ import annotations

__all__ = [
    "AdminError",
    "AuthDisabledError",
    "AuthError",
    "AuthFailedError",
    "AuthFirstError",
    "BadBodyError",
    "BadChannelError",
    "BadExtError",
    "BadMessageError",
    "BadPartitionError",
    "BadProtocolError",
    "BadTagError",
    "BadTopicError",
    "ChannelNotRegisteredError",
    "ClientClosedError",
    "ConnectionClosedError",
    "CreateTopicFailedError",
    "DPubFailedError",
    "DataLossError",
    "ExtNotSupportedError",
    "ExtendSupportForbiddenError",
    "ExtendSupportRequiredError",
    "FinFailedError",
    "ForkedClientError",
    "IdentifyFailedError",
    "InvalidCommandError",
    "InvalidJsonHeaderError",
    "InvalidTraceIdError",
    "LookupFailedError",
    "MPubFailedError",
    "MessageResponseFailedError",
    "NSQError",
    "NSQTimeoutError",
    "NoWritablePartitionError",
    "NotHttpError",
    "NotLeaderError",
    "NotLookupdError",
    "NotNsqdError",
    "NotWritableError",
    "OrderViolationError",
    "OrderedSubscribeRequiredError",
    "PlacementError",
    "ProtocolError",
    "PubFailedError",
    "PubTooMuchWaitingError",
    "PublishError",
    "ReqFailedError",
    "ServerError",
    "TagNotSupportedError",
    "TooManyConnectionsError",
    "TopicHasNoChannelError",
    "TopicNotExistError",
    "TopicNotFoundError",
    "TouchFailedError",
    "UnauthorizedError",
    "UnknownServerError",
    "UnsupportedFeatureError",
    "ValidationError",
]


class NSQError(Exception):
    """Base class of every error raised by smartnsq.

    ``retriable``: trying the same request again later can succeed. ``refresh_lookup``: the
    cluster layout behind the request is probably stale (ask nsqlookupd again first). Both are
    class attributes; a :class:`ServerError` may set them per instance.
    """

    retriable: bool = False
    refresh_lookup: bool = False


# --------------------------------------------------------------------------- arguments


class ValidationError(NSQError, ValueError):
    """An argument is invalid; raised before anything is sent. ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


# --------------------------------------------------------------------------- transport


class ProtocolError(NSQError):
    """The peer sent bytes that do not follow the NSQ protocol (corrupt frame, bad size...).
    Retriable: the connection it came on is closed, and a new one may be sound (a stream a
    proxy or a middlebox broke); what it carried is tried again like a lost connection's."""

    retriable = True


class NotNsqdError(ProtocolError):
    """An address given as an nsqd TCP port answers HTTP (nsqd's HTTP port, another web
    service): a configuration mistake that retrying cannot fix."""

    retriable = False


class NotHttpError(ProtocolError):
    """An address given as an HTTP address (nsqlookupd's, or nsqd's HTTP API) is an nsqd TCP
    port: it answered the request with nsqd's ``E_BAD_PROTOCOL`` frame. A configuration
    mistake that retrying cannot fix (the reverse of :class:`NotNsqdError`)."""

    retriable = False


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection closed (or could not be opened) before the operation completed.
    Retriable; the node may have crashed or lost its leadership, so the layout is refreshed."""

    retriable = True
    refresh_lookup = True

    def __init__(self, message: str, address: str | None = None) -> None:
        super().__init__(f"{message} ({address})" if address else message)
        self.address = address


class NSQTimeoutError(NSQError, TimeoutError):
    """An operation did not complete within its timeout. Also a builtin ``TimeoutError``.
    Retriable, with a layout refresh (the node may be gone)."""

    retriable = True
    refresh_lookup = True


class ClientClosedError(NSQError, RuntimeError):
    """A producer or consumer was used after ``close()`` (clients are not reusable)."""


class ForkedClientError(NSQError, RuntimeError):
    """A blocking client created before ``os.fork()`` was used in the child process."""


# --------------------------------------------------------------------------- server frames


class ServerError(NSQError):
    """An error frame sent by nsqd.

    ``code`` is the NSQ error code (``E_BAD_TOPIC``...), ``message`` the full frame text.
    ``fatal``: nsqd closes the connection after sending it (depends on the command for some
    codes). ``retriable`` and ``refresh_lookup`` as on :class:`NSQError`, per code.
    """

    code: str = ""
    fatal: bool = True

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        fatal: bool | None = None,
        command: str | None = None,
        address: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if fatal is not None:
            self.fatal = fatal
        self.command = command
        self.address = address

    def __str__(self) -> str:
        where = f" (from {self.address})" if self.address else ""
        return f"{self.message}{where}"


class InvalidCommandError(ServerError):
    code = "E_INVALID"


class BadTopicError(ServerError):
    code = "E_BAD_TOPIC"


class BadChannelError(ServerError):
    code = "E_BAD_CHANNEL"


class BadPartitionError(ServerError):
    code = "E_BAD_PARTITION"


class BadBodyError(ServerError):
    code = "E_BAD_BODY"


class BadMessageError(ServerError):
    code = "E_BAD_MESSAGE"


class TopicNotExistError(ServerError):
    """The topic partition is not hosted by this nsqd (layout changed or wrong node)."""

    code = "E_TOPIC_NOT_EXIST"
    retriable = True
    refresh_lookup = True


class NotLeaderError(ServerError):
    """This nsqd is not (or no longer) the leader of the partition."""

    code = "E_FAILED_ON_NOT_LEADER"
    retriable = True
    refresh_lookup = True


class NotWritableError(ServerError):
    """The partition cannot take writes right now (replication or cluster failure)."""

    code = "E_FAILED_ON_NOT_WRITABLE"
    retriable = True
    refresh_lookup = True


class PubFailedError(ServerError):
    code = "E_PUB_FAILED"
    fatal = False
    retriable = True
    refresh_lookup = True


class MPubFailedError(PubFailedError):
    code = "E_MPUB_FAILED"


class DPubFailedError(ServerError):
    code = "E_DPUB_FAILED"
    retriable = True


class PubTooMuchWaitingError(ServerError):
    """nsqd applies back-pressure: too many bytes are waiting to be written."""

    code = "E_PUB_TOO_MUCH_WAITING"
    retriable = True


class ExtNotSupportedError(ServerError):
    code = "E_EXT_NOT_SUPPORT"
    fatal = False


class InvalidJsonHeaderError(ServerError):
    code = "E_INVALID_JSON_HEADER"
    fatal = False


class InvalidTraceIdError(ServerError):
    code = "INVALID_TRACE_ID"
    fatal = False


class BadTagError(ServerError):
    code = "E_BAD_TAG"
    fatal = False


class TagNotSupportedError(ServerError):
    code = "E_TAG_NOT_SUPPORT"
    fatal = False


class OrderedSubscribeRequiredError(ServerError):
    """A plain SUB on an ordered topic: the consumer must be created with ``ordered=True``."""

    code = "E_SUB_ORDER_IS_MUST"

    def __str__(self) -> str:
        return (
            f"{super().__str__()}: this topic only allows ordered consumption; "
            "create the Consumer with ordered=True (SUB_ORDERED)"
        )


class ExtendSupportRequiredError(ServerError):
    code = "E_SUB_EXTEND_NEED"
    retriable = True
    refresh_lookup = True


class ExtendSupportForbiddenError(ServerError):
    code = "E_SUB_EXTEND_FORBIDDON"
    retriable = True
    refresh_lookup = True


class ChannelNotRegisteredError(ServerError):
    """Channel auto-creation is disabled for the topic; register it via lookupd first."""

    code = "E_SUB_CHANNEL_NOT_REGISTERED"


class MessageResponseFailedError(ServerError):
    """FIN, REQ or TOUCH failed (id unknown or timed out). Never fatal."""

    fatal = False


class FinFailedError(MessageResponseFailedError):
    code = "E_FIN_FAILED"


class ReqFailedError(MessageResponseFailedError):
    code = "E_REQ_FAILED"


class TouchFailedError(MessageResponseFailedError):
    code = "E_TOUCH_FAILED"


class IdentifyFailedError(ServerError):
    code = "E_IDENTIFY_FAILED"


class AuthError(ServerError):
    """Base of the AUTH error codes (all fatal)."""


class AuthFirstError(AuthError):
    code = "E_AUTH_FIRST"


class AuthFailedError(AuthError):
    code = "E_AUTH_FAILED"


class UnauthorizedError(AuthError):
    code = "E_UNAUTHORIZED"


class AuthDisabledError(AuthError):
    code = "E_AUTH_DISABLED"


class CreateTopicFailedError(ServerError):
    """INTERNAL_CREATE_TOPIC refused (always, on a cluster node). Not fatal."""

    code = "E_CREATE_TOPIC_FAILED"
    fatal = False


class BadExtError(ServerError):
    code = "E_BAD_EXT"


class BadProtocolError(ServerError):
    """nsqd did not recognise the protocol magic and closed the connection: the peer is not
    an nsqd speaking protocol V2 (wrong port, or something in between)."""

    code = "E_BAD_PROTOCOL"

    def __str__(self) -> str:
        return (
            f"{super().__str__()}: the server refused the protocol V2 magic; "
            "is this the nsqd TCP address?"
        )


class TooManyConnectionsError(ServerError):
    """youzan nsqd refused the connection: it has too many clients."""

    code = "too much client connections"
    retriable = True


class UnknownServerError(ServerError):
    """An error code this client does not know. Treated as fatal; retried like a failure."""

    retriable = True


# --------------------------------------------------------------------------- client level


class PublishError(NSQError):
    """A publish failed for good: retries exhausted or a non-retriable error.

    The last server or connection error is the ``__cause__``. ``outcome_unknown`` is True
    when a try was sent and never answered (the connection was lost or the time ran out
    while waiting): nsqd may have stored the message, so publishing it again may store it
    twice. A consumer that must not process it twice keys on the message's identity: a
    trace id it carries, or its ``(partition, offset)``.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int | None = None,
        tries: int = 0,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.tries = tries
        self.outcome_unknown = outcome_unknown


class UnsupportedFeatureError(NSQError):
    """The server (or the topic) cannot do what was asked, e.g. DPUB on youzan nsqd."""


class TopicNotFoundError(NSQError):
    """nsqlookupd does not know the topic."""

    def __init__(self, topic: str, detail: str = "") -> None:
        text = f"topic {topic!r} not found in nsqlookupd"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.topic = topic


class TopicHasNoChannelError(NSQError):
    """A write lookup was refused because the topic has no channel yet."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"nsqlookupd refuses writes to topic {topic!r} because it has no channel yet: "
            "start a consumer first, or create a channel (nsqd POST /channel/create, or "
            "nsqlookupd --allow-write-with-nochannels)"
        )
        self.topic = topic


class LookupFailedError(NSQError):
    """No nsqlookupd answered a lookup. Retriable (a lookupd may answer again)."""

    retriable = True


class NotLookupdError(LookupFailedError):
    """An address given as an nsqlookupd answers HTTP, but not as one (an nsqd's HTTP port,
    another web service): a configuration mistake that retrying cannot fix."""

    retriable = False


class NoWritablePartitionError(NSQError):
    """The lookup shows no writable partition (or not the one a key needs): during a
    failover, until a new leader is elected and in sync. Retriable, with a layout refresh."""

    retriable = True
    refresh_lookup = True


class OrderViolationError(NSQError):
    """An ordered partition delivered a message whose id or offset went backwards."""


class DataLossError(NSQError):
    """A range of queue offsets to read is no longer in the queue: it starts before the
    queue's first message (old data deleted) or ends past the queue's end (messages lost,
    e.g. with a leader that failed before they were replicated). Not retriable: reading
    again finds the same queue."""


class AdminError(NSQError):
    """An administration request (topic or channel creation...) was refused.

    ``message`` says what went wrong (the server's own words, or ours with the server's
    kept in ``detail``), ``status`` is the HTTP status, ``url`` where it was sent."""

    def __init__(
        self, message: str, *, status: int | None = None, url: str = "", detail: str = ""
    ) -> None:
        answer = f"HTTP {status}" if status is not None else ""
        where = " from ".join(part for part in (answer, url) if part)
        if detail:
            where = f"{where}: {detail}" if where else detail
        super().__init__(f"{message} ({where})" if where else message)
        self.status = status
        self.message = message
        self.url = url
        self.detail = detail


class PlacementError(ValidationError, AdminError):
    """nsqlookupd cannot place a topic on the cluster's nsqd nodes: every replica of a
    partition needs a node of its own, and a plain topic (neither ordered nor multi-part)
    one node per replica of every partition (partitions x replicas <= nodes). The message
    says what would fit.

    Raised before anything is sent when the node count is known (``nodes``), else from
    nsqlookupd's refusal (``status``, ``url``, and its text in ``detail``). ``field`` names
    the argument to change; ``partitions`` and ``replicas`` are what was asked."""

    def __init__(
        self,
        field: str,
        message: str,
        *,
        partitions: int,
        replicas: int,
        nodes: int | None,
        status: int | None = None,
        url: str = "",
        detail: str = "",
    ) -> None:
        AdminError.__init__(self, f"{field}: {message}", status=status, url=url, detail=detail)
        self.field = field
        self.reason = message
        self.partitions = partitions
        self.replicas = replicas
        self.nodes = nodes
