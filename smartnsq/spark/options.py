"""The ``nsq`` data source's options: Spark hands them over as strings (names case-insensitive);
here they become validated, picklable settings. Pure code: no Spark, no I/O.

A mistake raises :class:`~smartnsq.errors.ValidationError` naming the option, when the query
is planned (before any task runs). An unknown option is a mistake too: a misspelt
``sharding`` would otherwise publish to other partitions without a word.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from smartnsq.errors import ValidationError
from smartnsq.producer.producer import DEFAULT_PUBLISH_TIMEOUT
from smartnsq.protocol.validation import check_channel, check_partition, check_topic
from smartnsq.spark.offsets import Position, parse_position

__all__ = ["HOLD_OPTIONS", "OFFSETS_OPTIONS", "Connect", "SinkOptions", "SourceOptions"]

# What Spark itself adds to the options it passes (``save(path)``, ``writeStream``).
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
_CONNECT = frozenset(
    {
        "lookupd",
        "nsqd",
        "tls",
        "tlscafile",
        "tlscertfile",
        "tlskeyfile",
        "tlsinsecure",
        "authsecret",
        "compression",
        "connecttimeout",
    }
)
_SINK = _CONNECT | {"topic", "sharding", "trace", "linger", "maxbatch", "publishtimeout"}
# Options of one reading mode only (lower-cased): the driver source's (hold, journal) and
# the offsets mode's.
HOLD_OPTIONS = frozenset(
    {
        "maxinflight",
        "journal",
        "journalsync",
        "maxbufferedmessages",
        "msgtimeout",
        "availablenowidle",
    }
)
OFFSETS_OPTIONS = frozenset(
    {
        "startingoffsets",
        "startingtimestamp",
        "endingoffsets",
        "failondataloss",
        "maxoffsetspertrigger",
    }
)
_SOURCE = (
    _CONNECT
    | HOLD_OPTIONS
    | OFFSETS_OPTIONS
    | {"topic", "channel", "mode", "ordered", "maxmessagespertrigger", "partitions"}
)
_MODES = ("offsets", "hold", "journal")
# Spelling shown in messages (Spark lower-cases option names).
_SPELLING = {
    name.lower(): name
    for name in [
        "lookupd",
        "nsqd",
        "tls",
        "tlsCaFile",
        "tlsCertFile",
        "tlsKeyFile",
        "tlsInsecure",
        "authSecret",
        "compression",
        "connectTimeout",
        "topic",
        "sharding",
        "trace",
        "linger",
        "maxBatch",
        "publishTimeout",
        "channel",
        "ordered",
        "maxMessagesPerTrigger",
        "maxInFlight",
        "partitions",
        "journal",
        "journalSync",
        "maxBufferedMessages",
        "msgTimeout",
        "availableNowIdle",
        "mode",
        "startingOffsets",
        "startingTimestamp",
        "endingOffsets",
        "failOnDataLoss",
        "maxOffsetsPerTrigger",
    ]
}


class _Reader:
    """Typed access to a Spark option map, every error naming the option."""

    def __init__(self, options: Mapping[str, str], known: frozenset[str]) -> None:
        self.values = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(self.values) - known - _SPARK_OPTIONS)
        if unknown:
            names = ", ".join(sorted(_SPELLING.get(k, k) for k in known))
            raise ValidationError(unknown[0], f"unknown option of the nsq data source ({names})")

    def text(self, name: str) -> str | None:
        value = self.values.get(name.lower())
        if value is None:
            return None
        value = str(value).strip()
        return value or None

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise ValidationError(name, "this option is required")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.text(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ValidationError(name, f"must be true or false, got {value!r}")

    def integer(self, name: str, default: int | None, minimum: int) -> int | None:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ValidationError(name, f"must be an integer, got {value!r}") from None
        if number < minimum:
            raise ValidationError(name, f"must be >= {minimum}, got {number}")
        return number

    def seconds(self, name: str, default: float | None, *, positive: bool = True) -> float | None:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ValidationError(name, f"must be a number of seconds, got {value!r}") from None
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            limit = "> 0" if positive else ">= 0"
            raise ValidationError(name, f"must be a finite number of seconds {limit}")
        return number

    def items(self, name: str) -> tuple[str, ...] | None:
        value = self.text(name)
        if value is None:
            return None
        parts = tuple(p.strip() for p in value.split(",") if p.strip())
        if not parts:
            raise ValidationError(name, "must list at least one address")
        return parts


@dataclass(frozen=True)
class Connect:
    """Where and how to connect, as the Producer and Consumer take it."""

    lookupd: tuple[str, ...] | None
    nsqd: tuple[str, ...] | None
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_insecure: bool = False
    auth_secret: str | None = None
    compression: Literal["snappy", "deflate"] | None = None
    connect_timeout: float = 5.0

    @classmethod
    def read(cls, options: _Reader) -> Connect:
        lookupd, nsqd = options.items("lookupd"), options.items("nsqd")
        if (lookupd is None) == (nsqd is None):
            raise ValidationError(
                "lookupd", "give exactly one of lookupd (nsqlookupd HTTP URLs) or nsqd (host:port)"
            )
        compression = options.text("compression")
        if compression not in (None, "snappy", "deflate"):
            raise ValidationError("compression", "must be snappy or deflate")
        tls_files = {
            name: options.text(name) for name in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")
        }
        tls = options.flag("tls") or any(tls_files.values()) or options.flag("tlsInsecure")
        if (tls_files["tlsCertFile"] is None) != (tls_files["tlsKeyFile"] is None):
            raise ValidationError(
                "tlsKeyFile", "a client certificate needs both tlsCertFile and tlsKeyFile"
            )
        return cls(
            lookupd=lookupd,
            nsqd=nsqd,
            tls=tls,
            tls_ca_file=tls_files["tlsCaFile"],
            tls_cert_file=tls_files["tlsCertFile"],
            tls_key_file=tls_files["tlsKeyFile"],
            tls_insecure=options.flag("tlsInsecure"),
            auth_secret=options.text("authSecret"),
            compression=compression,  # type: ignore[arg-type] # checked just above
            connect_timeout=options.seconds("connectTimeout", 5.0) or 5.0,
        )

    def client_arguments(self) -> dict[str, Any]:
        """Keyword arguments for :class:`smartnsq.Producer` / :class:`smartnsq.Consumer`.
        Called where the client runs: an ``SSLContext`` is not picklable."""
        arguments: dict[str, Any] = {
            "tls": self._tls_context(),
            "auth_secret": self.auth_secret,
            "compression": self.compression,
            "connect_timeout": self.connect_timeout,
        }
        if self.lookupd is not None:
            arguments["lookupd"] = list(self.lookupd)
        else:
            arguments["nsqd"] = list(self.nsqd or ())
        return arguments

    def _tls_context(self) -> bool | ssl.SSLContext:
        if not self.tls:
            return False
        if not (self.tls_ca_file or self.tls_cert_file or self.tls_insecure):
            return True
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file is not None:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.tls_insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True)
class SinkOptions:
    """``df.write.format("nsq")`` / ``df.writeStream.format("nsq")``."""

    connect: Connect
    topic: str | None
    sharding: Literal["java", "murmur3"] = "java"
    trace: bool = False
    linger: float | None = None
    max_batch: int = 5000
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        reader = _Reader(options, _SINK)
        topic = reader.text("topic")
        sharding = reader.text("sharding") or "java"
        if sharding not in ("java", "murmur3"):
            raise ValidationError("sharding", f"must be java or murmur3, got {sharding!r}")
        return cls(
            connect=Connect.read(reader),
            topic=None if topic is None else check_topic(topic),
            sharding=sharding,  # type: ignore[arg-type] # checked just above
            trace=reader.flag("trace"),
            linger=reader.seconds("linger", None, positive=False),
            max_batch=reader.integer("maxBatch", 5000, 1) or 5000,
            publish_timeout=reader.seconds("publishTimeout", DEFAULT_PUBLISH_TIMEOUT)
            or DEFAULT_PUBLISH_TIMEOUT,
        )

    def producer_arguments(self) -> dict[str, Any]:
        arguments = self.connect.client_arguments()
        arguments.update(
            sharding=self.sharding,
            trace=self.trace,
            linger=self.linger,
            publish_timeout=self.publish_timeout,
        )
        return arguments


@dataclass(frozen=True)
class SourceOptions:
    """``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``.

    ``mode``: ``offsets`` (youzan: ranges of queue offsets read on the executors), ``hold`` or
    ``journal`` (the driver's consumer, see receiver.py); None: chosen when the query is
    planned, offsets on youzan, hold on classic nsqd (:meth:`reading_mode`). ``given``: the
    options set (lower-cased names), to refuse those of a mode that does not apply.
    """

    connect: Connect
    topic: str
    channel: str
    mode: Literal["offsets", "hold", "journal"] | None = None
    ordered: bool = False
    max_messages_per_trigger: int | None = None
    max_in_flight: int = 10_000
    partitions: tuple[int, ...] | None = None
    journal: str | None = None
    journal_sync: bool = True
    max_buffered_messages: int = 200_000
    msg_timeout: float = 60.0
    available_now_idle: float = 1.0
    starting: Position | None = None
    ending: Position | None = None
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    given: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        reader = _Reader(options, _SOURCE)
        connect = Connect.read(reader)
        topic = check_topic(reader.required("topic"))
        mode = reader.text("mode")
        if mode is not None and mode not in _MODES:
            raise ValidationError("mode", f"must be one of {', '.join(_MODES)}, got {mode!r}")
        journal = reader.text("journal")
        if journal is not None:
            if mode not in (None, "journal"):
                raise ValidationError("journal", f"a journal is for mode=journal, not {mode}")
            mode = "journal"
        elif mode == "journal":
            raise ValidationError("journal", "mode=journal needs the journal directory")
        if mode == "offsets" and connect.nsqd is not None:
            raise ValidationError(
                "mode", "classic nsqd has no queue offsets: the offsets mode needs youzan (lookupd)"
            )
        ordered = reader.flag("ordered")
        if ordered and mode == "hold":
            raise ValidationError(
                "journal",
                "ordered=true needs a journal directory: an ordered channel sends a partition's "
                "next message only after the previous one is finished, and Spark confirms a "
                "micro-batch only when it plans the next one, so holding messages until then "
                "would stop the stream after its first batch (see docs/guides/spark.md)",
            )
        if ordered and connect.nsqd is not None:
            raise ValidationError("ordered", "ordered consumption needs lookupd (youzan)")
        given = frozenset(reader.values)
        if mode in ("hold", "journal") or connect.nsqd is not None:
            _refuse(given, OFFSETS_OPTIONS, "the offsets mode (youzan, lookupd, mode=offsets)")
        if mode == "offsets":
            _refuse(given, HOLD_OPTIONS, "mode=hold or mode=journal")
        starting = reader.text("startingOffsets")
        timestamp = reader.integer("startingTimestamp", None, 0)
        if starting is not None and timestamp is not None:
            raise ValidationError(
                "startingTimestamp", "give startingOffsets or startingTimestamp, not both"
            )
        ending = reader.text("endingOffsets")
        partitions = reader.items("partitions")
        max_in_flight = reader.integer("maxInFlight", 10_000, 1) or 10_000
        per_trigger = reader.integer("maxMessagesPerTrigger", None, 1)
        return cls(
            connect=connect,
            topic=topic,
            channel=check_channel(reader.required("channel")),
            mode=mode,  # type: ignore[arg-type] # checked above
            ordered=ordered,
            max_messages_per_trigger=per_trigger,
            max_in_flight=max_in_flight,
            partitions=None if partitions is None else _partition_ids(partitions),
            journal=journal,
            journal_sync=reader.flag("journalSync", True),
            max_buffered_messages=reader.integer("maxBufferedMessages", 200_000, 1) or 200_000,
            msg_timeout=reader.seconds("msgTimeout", 60.0) or 60.0,
            available_now_idle=reader.seconds("availableNowIdle", 1.0) or 1.0,
            starting=(
                Position("timestamp", timestamp_ms=timestamp)
                if timestamp is not None
                else None
                if starting is None
                else parse_position("startingOffsets", starting, topic)
            ),
            ending=None
            if ending is None
            else parse_position("endingOffsets", ending, topic, ending=True),
            fail_on_data_loss=reader.flag("failOnDataLoss", True),
            max_offsets_per_trigger=reader.integer("maxOffsetsPerTrigger", None, 1),
            given=given,
        )

    def reading_mode(self, youzan: bool) -> Literal["offsets", "hold", "journal"]:
        """The mode on a cluster that is (not) youzan; ValidationError names an option that
        mode does not take."""
        if self.mode is not None:
            if self.mode == "offsets" and not youzan:
                raise ValidationError("mode", "the offsets mode needs youzan queue offsets")
            return self.mode
        if not youzan:
            _refuse(self.given, OFFSETS_OPTIONS, "youzan (classic nsqd has no queue offsets)")
            if self.ordered:
                raise ValidationError("journal", "ordered=true in hold mode needs a journal")
            return "hold"
        _refuse(self.given, HOLD_OPTIONS, "mode=hold or mode=journal")
        return "offsets"

    def consumer_arguments(self) -> dict[str, Any]:
        arguments = self.connect.client_arguments()
        arguments.update(
            max_in_flight=self.max_in_flight,
            ordered=self.ordered,
            partitions=None if self.partitions is None else list(self.partitions),
            msg_timeout=self.msg_timeout,
        )
        return arguments


def _refuse(given: frozenset[str], names: frozenset[str], needed: str) -> None:
    """ValidationError for the first of ``names`` among the options ``given``."""
    wrong = sorted(given & names)
    if wrong:
        name = _SPELLING.get(wrong[0], wrong[0])
        raise ValidationError(name, f"applies to {needed} only")


def _partition_ids(items: tuple[str, ...]) -> tuple[int, ...]:
    ids = []
    for item in items:
        try:
            number = int(item)
        except ValueError:
            raise ValidationError("partitions", f"must list partition ids, got {item!r}") from None
        ids.append(check_partition(number, "partitions"))
    return tuple(sorted(set(ids)))
