"""The server side of ``bench/soak.py``: an embedded cluster with a fault proxy before each
nsqd, in a process of its own, driven over stdin.

It runs the cluster as ``smartnsq cluster`` does (no delivery records, the collector tuned
for a process that is the cluster alone), creates the topic, puts ``cluster_proxies``
before the nodes, writes a port file (what ``smartnsq cluster --port-file`` writes, plus the
proxies and the ``address_map`` that sends clients through them) and prints ``Ready``. Then
it reads one JSON command per line on stdin and answers each with one JSON line on stdout
(``{"ok": ...}`` or ``{"error": ...}``). End of stdin, or SIGTERM, stops it.

Commands (``node`` is an nsqd's index):

- ``reset``: reset the node's client links now (``FaultProxy.reset``); the count;
- ``burst``: ``count`` resets of the node's links, ``gap`` seconds apart; the total reset;
- ``blackhole`` / ``heal``: the node's link goes silent (nothing forwarded, held) / back;
- ``node_blackhole`` / ``node_heal``: ``Cluster.blackhole(node)`` / ``heal`` (the node
  itself silent to everyone, no proxy);
- ``latency`` (``seconds``, ``jitter``), ``slicing`` (``max_size``), ``clear``;
- ``stats``: every proxy's counters, this process's RSS (bytes) and CPU seconds;
- ``stored``: how many messages the topic holds (every partition, or every node).

Usage: python bench/soak_cluster.py --port-file PATH [--classic] [--nodes 4] ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from clients._worker import cpu_seconds, rss_bytes

from smartnsq.cli.cluster import describe, tune_gc
from smartnsq.testing import Cluster, ClusterError
from smartnsq.testing.faults import ClusterProxies, cluster_proxies


class Faults:
    """The commands, on one cluster and its proxies."""

    def __init__(self, cluster: Cluster, proxies: ClusterProxies, topic: str) -> None:
        self.cluster = cluster
        self.proxies = proxies
        self.topic = topic

    async def run(self, command: dict[str, Any]) -> Any:
        op = command["op"]
        node = command.get("node")
        proxy = self.proxies[node] if node is not None else None
        if op == "reset" and proxy is not None:
            return proxy.reset()
        if op == "burst" and proxy is not None:
            total = 0
            for i in range(int(command["count"])):
                if i:
                    await asyncio.sleep(float(command["gap"]))
                total += proxy.reset()
            return total
        if op == "blackhole" and proxy is not None:
            proxy.blackhole()
            return None
        if op == "heal" and proxy is not None:
            proxy.heal()
            return None
        if op == "node_blackhole" and node is not None:
            self.cluster.blackhole(node)
            return None
        if op == "node_heal" and node is not None:
            self.cluster.heal(node)
            return None
        if op == "latency" and proxy is not None:
            proxy.set_latency(float(command["seconds"]), float(command.get("jitter", 0.0)))
            return None
        if op == "slicing" and proxy is not None:
            proxy.set_slicing(command["max_size"])
            return None
        if op == "clear" and proxy is not None:
            proxy.clear()
            return None
        if op == "stats":
            return {
                "proxies": [dataclasses.asdict(p.stats()) for p in self.proxies],
                "rss": rss_bytes(),
                "cpu": cpu_seconds(),
            }
        if op == "stored":
            return self.cluster.depth(self.topic)
        raise ValueError(f"unknown command {command!r}")


def create_topic(cluster: Cluster, args: argparse.Namespace) -> None:
    """The topic and its registered channel, as ``smartnsq cluster --topic --channel`` makes
    them."""
    if cluster.classic:
        for node in cluster.nodes:
            cluster.ensure_channel(cluster.classic_topic(node, args.topic), args.channel)
        return
    cluster.create_topic_now(
        args.topic,
        partitions=args.partitions,
        replicas=args.replicas,
        ordered=args.ordered,
        ext=args.ext,
        channels=[args.channel],
    )


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    cluster = Cluster(args.nodes, classic=args.classic, record_deliveries=False)
    async with cluster, cluster_proxies(cluster, seed=args.seed) as proxies:
        create_topic(cluster, args)
        info = describe(cluster, os.getpid())
        info["proxies"] = proxies.nsqd_addresses
        info["address_map"] = proxies.address_map
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, args.port_file)
        print("Ready", flush=True)
        faults = Faults(cluster, proxies, args.topic)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                reading = asyncio.ensure_future(commands.readline())
                await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    break
                line = reading.result()
                if not line:
                    break
                try:
                    answer = {"ok": await faults.run(json.loads(line))}
                except (ValueError, LookupError, TypeError, ClusterError) as exc:
                    # A bad command is answered; the cluster goes on.
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                print(json.dumps(answer), flush=True)
        finally:
            stopping.cancel()
            with contextlib.suppress(FileNotFoundError):
                args.port_file.unlink()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--classic", action="store_true")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--topic", default="soak")
    parser.add_argument("--channel", default="soak")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--ordered", action="store_true", help="an ordered topic")
    parser.add_argument("--ext", action="store_true", help="an ext topic (ext headers)")
    parser.add_argument("--seed", type=int, default=None, help="the proxies' seed")
    args = parser.parse_args()
    restore_gc = tune_gc()
    try:
        return asyncio.run(serve(args))
    finally:
        restore_gc()


if __name__ == "__main__":
    sys.exit(main())
