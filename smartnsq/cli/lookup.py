"""``smartnsq lookup``: where a topic lives, as each nsqlookupd of the cluster sees it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smartnsq.cli._common import (
    add_connection_options,
    add_verbosity,
    muted_logs,
    resolve_target,
    setup_logging,
    table,
    topic_arg,
)
from smartnsq.cli.usage import UsageError
from smartnsq.protocol.lookupd import Access, TopicLayout, TopicMeta
from smartnsq.transport import loops
from smartnsq.transport.lookup import LookupManager

__all__ = ["register"]

DESCRIPTION = """\
Show where TOPIC lives, as each nsqlookupd of the cluster answers (the lookupds are found
with /listlookup from the given ones): the topic's flags, and a table of partitions with
their leader (host:tcp_port) and replica count; for a classic topic, its nsqd nodes.
Lookupds that disagree are pointed out. Exit code 1 when no lookupd knows the topic.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "lookup",
        help="show a topic's partitions, leaders and flags per nsqlookupd",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic", metavar="TOPIC")
    add_connection_options(parser)
    parser.add_argument(
        "--access",
        choices=("r", "w"),
        default="r",
        help="lookup for reading (default) or writing: a write lookup lists writable leaders",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_verbosity(parser)
    parser.set_defaults(func=run)


@dataclass
class _Answer:
    lookupd: str
    layout: TopicLayout | None = None
    error: str = ""

    @property
    def found(self) -> bool:
        layout = self.layout
        if layout is None:
            return False
        return not layout.empty or (layout.meta is not None and layout.meta.valid)

    def to_json(self) -> dict[str, Any]:
        layout = self.layout
        result: dict[str, Any] = {"lookupd": self.lookupd, "error": self.error or None}
        if layout is None:
            return result
        meta = layout.meta
        replica = meta.replica if meta is not None else None
        result.update(
            youzan=layout.youzan,
            found=self.found,
            flags=None if meta is None else _flags(meta),
            partitions=[
                {
                    "partition": pid,
                    "leader": node.tcp_address,
                    "leader_http": node.http_address,
                    "replicas": replica,
                }
                for pid, node in layout.partitions.items()
            ],
            nodes=[
                {"tcp": n.tcp_address, "http": n.http_address, "version": n.version}
                for n in layout.classic_nodes
            ],
            channels=list(layout.channels),
        )
        return result


def _flags(meta: TopicMeta) -> dict[str, Any]:
    return {
        "partition_num": meta.partition_num,
        "replica": meta.replica,
        "ordered": meta.ordered,
        "ext": meta.extend_support,
        "multi_part": meta.multi_part,
    }


def run(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    target = resolve_target(args)
    if target.lookupd is None:
        raise UsageError("lookup asks nsqlookupd: give --lookupd (or $SMARTNSQ_LOOKUPD)")
    setup_logging("lookup", args.verbose)
    answers = loops.run(
        _lookup_all(target.lookupd, topic, args.access, args.verbose, target.address_map)
    )
    if args.json:
        document = {
            "topic": topic,
            "access": args.access,
            "lookupds": [a.to_json() for a in answers],
            "disagreements": _disagreements(answers),
        }
        print(json.dumps(document, indent=2))
    else:
        print(_render(topic, args.access, answers), end="")
    return 0 if any(a.found for a in answers) else 1


async def _lookup_all(
    seeds: Sequence[str],
    topic: str,
    access: Access,
    verbose: int,
    address_map: dict[str, str] | None = None,
) -> list[_Answer]:
    async with LookupManager(seeds, address_map=address_map) as manager:
        with muted_logs(verbose):
            await manager.discover()  # raises when no lookupd answers
        answers = await manager.lookup_each(topic, access)
    return [
        _Answer(
            a.lookupd,
            TopicLayout(topic, access) if a.topic_not_found else a.layout,
            "" if a.topic_not_found else (a.error or a.failure),
        )
        for a in answers
    ]


def _disagreements(answers: Sequence[_Answer]) -> list[int]:
    """Partitions whose leader differs between the lookupds that list them."""
    leaders: dict[int, set[str]] = {}
    for answer in answers:
        if answer.layout is not None:
            for pid, node in answer.layout.partitions.items():
                leaders.setdefault(pid, set()).add(node.tcp_address)
    return sorted(pid for pid, nodes in leaders.items() if len(nodes) > 1)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _render(topic: str, access: str, answers: Sequence[_Answer]) -> str:
    lines: list[str] = []
    for answer in answers:
        title = f"nsqlookupd {answer.lookupd}: topic {topic} (access={access})"
        layout = answer.layout
        if layout is None:
            lines += [f"{title}: error: {answer.error}", ""]
            continue
        if not answer.found:
            lines += [f"{title}: not found", ""]
            continue
        meta = layout.meta
        if meta is not None and meta.valid:
            lines.append(
                f"{title}: partition_num={meta.partition_num} replica={meta.replica} "
                f"ordered={_yes(meta.ordered)} ext={_yes(meta.extend_support)} "
                f"multi_part={_yes(meta.multi_part)}"
            )
        else:
            lines.append(f"{title}: classic topic (no partitions)")
        if layout.partitions:
            replica = str(meta.replica) if meta is not None else "-"
            rows = [[str(pid), n.tcp_address, replica] for pid, n in layout.partitions.items()]
            lines += table(("PARTITION", "LEADER", "REPLICAS"), rows)
        elif meta is not None and meta.valid:
            lines.append("  no partition has a leader now")
        if layout.classic_nodes:
            rows = [[n.tcp_address, n.http_address, n.version] for n in layout.classic_nodes]
            lines += table(("NODE", "HTTP", "VERSION"), rows)
        if layout.channels:
            lines.append(f"  channels: {', '.join(layout.channels)}")
        lines.append("")
    differing = _disagreements(answers)
    if differing:
        which = ", ".join(str(pid) for pid in differing)
        lines.append(f"note: the nsqlookupds name different leaders for partition(s) {which}")
    return "\n".join(lines).rstrip("\n") + "\n"
