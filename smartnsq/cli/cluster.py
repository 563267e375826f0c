"""``smartnsq cluster``: run the embedded NSQ cluster in the foreground.

It starts the emulated nsqlookupd(s) and nsqd nodes (on 127.0.0.1 with OS-chosen ports unless
``--host``, ``--lookupd-port`` or ``--nsqd-port`` say otherwise), creates the requested topics,
prints where everything listens and, with ``--port-file``, writes the same as JSON for other
processes (benchmarks, demos, containers). It runs until Ctrl-C or SIGTERM, then shuts the
cluster down and removes the port file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from smartnsq.cli.usage import UsageError
from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import MAX_PARTITIONS, check_channel, check_topic
from smartnsq.transport import loops

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

# asyncio's bind error: "error while attempting to bind on address ('127.0.0.1', 4161): ..."
_BOUND_ADDRESS = re.compile(r"address \('(?P<host>[^']*)', (?P<port>\d+)")

__all__ = ["ChannelSpec", "TopicSpec", "parse_channel", "parse_topic", "register", "tune_gc"]

_FLAGS = ("ordered", "ext", "multipart")


@dataclass(frozen=True)
class TopicSpec:
    """``name:partitions:replicas[:flags]`` from the command line."""

    name: str
    partitions: int = 1
    replicas: int = 1
    ordered: bool = False
    ext: bool = False
    multi_part: bool = False


@dataclass(frozen=True)
class ChannelSpec:
    topic: str
    channel: str


def _count(spec: str, what: str, text: str, low: int, high: int) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise UsageError(f"--topic {spec!r}: {what} must be an integer {low}..{high}, got {text!r}")
    return int(text)


def parse_topic(spec: str, *, classic: bool = False) -> TopicSpec:
    """Parse ``name:partitions:replicas[:flag,flag]`` (flags: ordered, ext, multipart); a
    classic cluster's topics are a bare ``name`` (``name:1:1`` is accepted too)."""
    parts = spec.split(":")
    if len(parts) > 4 or (not classic and len(parts) < 3):
        expected = "NAME" if classic else "NAME:PARTITIONS:REPLICAS[:FLAGS], e.g. orders:4:2"
        raise UsageError(f"--topic {spec!r}: expected {expected}")
    name = parts[0]
    try:
        check_topic(name)
    except ValidationError as exc:
        raise UsageError(f"--topic {spec!r}: {exc.reason}") from None
    partitions = _count(spec, "partitions", parts[1], 1, MAX_PARTITIONS) if len(parts) > 1 else 1
    replicas = _count(spec, "replicas", parts[2], 1, 5) if len(parts) > 2 else 1
    flags = [f for f in parts[3].split(",") if f] if len(parts) > 3 else []
    unknown = [f for f in flags if f not in _FLAGS]
    if unknown:
        raise UsageError(
            f"--topic {spec!r}: unknown flag {unknown[0]!r} (known: {', '.join(_FLAGS)})"
        )
    return TopicSpec(
        name,
        partitions,
        replicas,
        ordered="ordered" in flags,
        ext="ext" in flags,
        multi_part="multipart" in flags,
    )


def parse_channel(spec: str) -> ChannelSpec:
    """Parse ``topic:channel``."""
    topic, sep, channel = spec.partition(":")
    if not sep:
        raise UsageError(f"--channel {spec!r}: expected TOPIC:CHANNEL")
    try:
        check_topic(topic)
        check_channel(channel)
    except ValidationError as exc:
        raise UsageError(f"--channel {spec!r}: {exc}") from None
    return ChannelSpec(topic, channel)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="run the embedded NSQ cluster in the foreground",
        description=(
            "Run an embedded NSQ cluster (youzan HA or classic) on 127.0.0.1 until Ctrl-C or "
            "SIGTERM. Ports are chosen by the OS; they are printed, and written as JSON to "
            "--port-file if given."
        ),
    )
    parser.add_argument("--nodes", type=int, default=3, help="nsqd nodes (default 3)")
    parser.add_argument("--lookupds", type=int, default=1, help="nsqlookupd nodes (default 1)")
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME:PARTITIONS:REPLICAS[:FLAGS]",
        help=(
            "create a topic; FLAGS is a comma list of ordered, ext, multipart; with --classic "
            "just NAME (repeatable)"
        ),
    )
    parser.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="TOPIC:CHANNEL",
        help="register a channel on every partition of a --topic (repeatable)",
    )
    parser.add_argument("--classic", action="store_true", help="classic nsqd + nsqlookupd")
    parser.add_argument(
        "--failover-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds before a stopped leader's partitions fail over (default 0)",
    )
    parser.add_argument(
        "--allow-write-with-nochannels",
        action="store_true",
        help="nsqlookupd's option: answer write lookups of topics that have no channel yet",
    )
    addresses = parser.add_argument_group("addresses")
    addresses.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)",
    )
    addresses.add_argument(
        "--lookupd-port",
        type=int,
        default=0,
        metavar="PORT",
        help="HTTP port of nsqlookupd 0 (the next ones follow); default: chosen by the OS",
    )
    addresses.add_argument(
        "--nsqd-port",
        type=int,
        default=0,
        metavar="PORT",
        help=(
            "TCP port of nsqd 0; nsqd i listens on PORT+2i (TCP) and PORT+2i+1 (HTTP); "
            "default: right after the nsqlookupd ports with --lookupd-port, else chosen by the OS"
        ),
    )
    addresses.add_argument(
        "--broadcast-address",
        metavar="HOST",
        help=(
            "the address nsqlookupd announces for the nodes (nsqd's --broadcast-address); "
            "default: the address clients on this machine use"
        ),
    )
    parser.add_argument(
        "--port-file", type=Path, metavar="PATH", help="write the addresses as JSON to PATH"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    topics = [parse_topic(spec, classic=args.classic) for spec in args.topic]
    channels = [parse_channel(spec) for spec in args.channel]
    _check_plan(args, topics, channels)
    restore_gc = tune_gc()
    try:
        return loops.run(_serve(args, topics, channels))
    finally:
        restore_gc()


# Young collections this far apart cost little and pause ~1 ms (generation 1: ~10 ms).
_GC_THRESHOLDS = (10_000, 5, 10)


def tune_gc() -> Callable[[], None]:
    """Tune the garbage collector for a process that is the cluster alone; returns a function
    that undoes it.

    The emulator keeps every message it was ever sent. With the default thresholds a busy
    cluster spends a third of its CPU rescanning them, in full collections that pause for
    up to a second once millions are stored. Here collections are rarer and whatever
    survives a generation-1 collection is frozen: never scanned again (reference counting
    still frees it; only a reference cycle that dies after being frozen would be leaked,
    and the emulator's long-lived objects hold none).
    """
    previous = gc.get_threshold()

    def freeze_survivors(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()

    gc.set_threshold(*_GC_THRESHOLDS)
    gc.callbacks.append(freeze_survivors)

    def restore() -> None:
        if freeze_survivors in gc.callbacks:
            gc.callbacks.remove(freeze_survivors)
        gc.set_threshold(*previous)
        gc.unfreeze()

    return restore


def _check_plan(
    args: argparse.Namespace, topics: list[TopicSpec], channels: list[ChannelSpec]
) -> None:
    """Refuse what the cluster would refuse, before anything starts."""
    if args.nodes < 1:
        raise UsageError(f"--nodes must be >= 1, got {args.nodes}")
    if args.lookupds < 1:
        raise UsageError(f"--lookupds must be >= 1, got {args.lookupds}")
    if args.failover_delay < 0:
        raise UsageError(f"--failover-delay must be >= 0, got {args.failover_delay}")
    if args.classic and args.lookupds != 1:
        raise UsageError("a classic cluster has exactly one nsqlookupd (--lookupds 1)")
    try:
        # The cluster's own checks of the addresses, before anything listens.
        _cluster(args)
    except ValidationError as exc:
        option = {"broadcast_address": "--broadcast-address", "lookupd_port": "--lookupd-port"}
        raise UsageError(f"{option.get(exc.field, '--nsqd-port')}: {exc.reason}") from None
    names = [t.name for t in topics]
    if len(set(names)) != len(names):
        raise UsageError("--topic: the same topic is given twice")
    for topic in topics:
        if args.classic and (topic.partitions, topic.replicas) != (1, 1):
            raise UsageError(f"--topic {topic.name}: classic topics have no partitions or replicas")
        if args.classic and (topic.ordered or topic.ext or topic.multi_part):
            raise UsageError(f"--topic {topic.name}: flags need a youzan cluster (no --classic)")
        if topic.replicas > args.nodes:
            raise UsageError(
                f"--topic {topic.name}: {topic.replicas} replicas need as many nodes "
                f"(--nodes {args.nodes})"
            )
    for channel in channels:
        if channel.topic not in names:
            raise UsageError(
                f"--channel {channel.topic}:{channel.channel}: no --topic {channel.topic}"
            )


async def _serve(
    args: argparse.Namespace, topics: list[TopicSpec], channels: list[ChannelSpec]
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    handled: list[signal.Signals] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
            handled.append(signum)
        except (NotImplementedError, RuntimeError):
            pass  # no signal handlers on this platform: Ctrl-C raises KeyboardInterrupt
    cluster = _cluster(args)
    port_file: Path | None = args.port_file
    try:
        try:
            await cluster.start()
        except OSError as exc:
            # A fixed port in use, an address this machine does not have: a failure (exit
            # 1), not a usage mistake; the arguments were fine.
            print(f"smartnsq cluster: error: {_listen_failure(args, exc)}", file=sys.stderr)
            return 1
        _create(cluster, topics, channels)
        info = describe(cluster, os.getpid())
        if port_file is not None:
            _write_atomically(port_file, json.dumps(info, indent=2) + "\n")
        print(format_block(info), flush=True)
        await stop.wait()
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        await cluster.stop()
        if port_file is not None:
            _remove(port_file)
    print("smartnsq cluster: stopped", flush=True)
    return 0


def _listen_failure(args: argparse.Namespace, exc: OSError) -> str:
    """Why the cluster could not listen, naming the address (asyncio's bind error carries
    it) and, for a busy port, what to do."""
    found = _BOUND_ADDRESS.search(exc.strerror or str(exc))
    where = f"{found['host']}:{found['port']}" if found else args.host
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    text = f"cannot listen on {where}: {reason}"
    if exc.errno == errno.EADDRINUSE:
        port = f"port {found['port']}" if found else "a port"
        text += (
            f"; another program (another smartnsq cluster, an nsqlookupd?) holds {port}: stop "
            "it, or choose other ports with --lookupd-port/--nsqd-port (without them the OS "
            "picks free ones)"
        )
    return text


def _cluster(args: argparse.Namespace) -> Cluster:
    from smartnsq.testing.cluster import Cluster

    # Nobody outside this process can read the delivery records: do not keep them.
    return Cluster(
        args.nodes,
        classic=args.classic,
        lookupds=args.lookupds,
        failover_delay=args.failover_delay,
        allow_write_with_no_channels=args.allow_write_with_nochannels,
        record_deliveries=False,
        host=args.host,
        broadcast_address=args.broadcast_address,
        lookupd_port=args.lookupd_port,
        nsqd_port=args.nsqd_port,
    )


def _create(cluster: Cluster, topics: list[TopicSpec], channels: list[ChannelSpec]) -> None:
    from smartnsq.testing.cluster import ClusterError

    try:
        for topic in topics:
            if cluster.classic:
                for node in cluster.nodes:
                    cluster.classic_topic(node, topic.name)
            else:
                # Channels named for a topic are registered (durable), as `smartnsq topic
                # create --channel` does.
                cluster.create_topic_now(
                    topic.name,
                    partitions=topic.partitions,
                    replicas=topic.replicas,
                    ordered=topic.ordered,
                    ext=topic.ext,
                    multi_part=topic.multi_part,
                    channels=[c.channel for c in channels if c.topic == topic.name],
                )
        for channel in channels:
            if cluster.classic:
                for node in cluster.nodes:
                    cluster.ensure_channel(node.classic_topics[channel.topic], channel.channel)
    except (ClusterError, ValidationError) as exc:
        raise UsageError(str(exc)) from None


def describe(cluster: Cluster, pid: int) -> dict[str, Any]:
    """Everything another process needs to reach the cluster (the port file's content)."""
    nodes = [
        {"node": node.index, "tcp": node.tcp_address, "http": node.http_address}
        for node in cluster.nodes
    ]
    topics: dict[str, Any] = {}
    if cluster.classic:
        for node in cluster.nodes:
            for name, log_ in node.classic_topics.items():
                entry = topics.setdefault(name, {"nsqd": [], "channels": []})
                entry["nsqd"].append(node.tcp_address)
                for channel in log_.channels:
                    if channel not in entry["channels"]:
                        entry["channels"].append(channel)
    else:
        for name, topic in cluster.topics.items():
            partitions = []
            for pid_, row in cluster.topology(name).items():
                leader = row["leader"]
                partitions.append(
                    {
                        "partition": pid_,
                        "leader": leader,
                        "tcp": cluster.nodes[leader].tcp_address if leader is not None else None,
                        "http": cluster.nodes[leader].http_address if leader is not None else None,
                        "replicas": row["replicas"],
                    }
                )
            topics[name] = {
                "replicas": topic.replica,
                "ordered": topic.ordered,
                "ext": topic.ext,
                "multi_part": topic.multi_part,
                "channels": list(topic.channel_names),
                "partitions": partitions,
            }
    return {
        "pid": pid,
        "mode": "classic" if cluster.classic else "youzan",
        "broadcast_address": cluster.broadcast_address,
        "lookupd_http": cluster.lookupd_urls,
        "nsqd": nodes,
        "topics": topics,
    }


def format_block(info: dict[str, Any]) -> str:
    """The short human-readable summary printed at start-up."""
    nodes = info["nsqd"]
    lines = [
        f"smartnsq cluster ({info['mode']}, pid {info['pid']}): "
        f"{len(nodes)} nsqd, {len(info['lookupd_http'])} nsqlookupd"
    ]
    lines += [f"  lookupd   {url}" for url in info["lookupd_http"]]
    announced = info["broadcast_address"]
    if announced not in (urlsplit(url).hostname for url in info["lookupd_http"]):
        lines.append(f"  nsqlookupd announces the nodes as {announced} (--broadcast-address)")
    lines += [f"  nsqd {n['node']:<4} tcp {n['tcp']:<21} http {n['http']}" for n in nodes]
    for name, topic in info["topics"].items():
        channels = ", ".join(topic["channels"]) or "none"
        if info["mode"] == "classic":
            lines.append(f"  topic {name} (channels: {channels})")
            continue
        flags = [f for f in ("ordered", "ext", "multi_part") if topic[f]]
        shown = f", {', '.join(flags)}" if flags else ""
        count = len(topic["partitions"])
        lines.append(
            f"  topic {name}: {count} partition{'s' if count > 1 else ''} x "
            f"{topic['replicas']} replica{'s' if topic['replicas'] > 1 else ''}{shown} "
            f"(channels: {channels})"
        )
        for row in topic["partitions"]:
            replicas = ",".join(str(r) for r in row["replicas"])
            lines.append(
                f"    partition {row['partition']:<3} -> nsqd {row['leader']} "
                f"({row['tcp']}), replicas {replicas}"
            )
    lines.append("Ready; Ctrl-C or SIGTERM to stop.")
    return "\n".join(lines)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_atomically(path: Path, text: str) -> None:
    """Readers polling for the file never see it half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UsageError(f"--port-file {str(path)!r}: {exc.strerror or exc}") from None
