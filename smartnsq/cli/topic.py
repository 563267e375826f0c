"""``smartnsq topic``: create or delete a topic (``create``, ``delete``)."""

from __future__ import annotations

import argparse
from typing import Any

from smartnsq.admin import MAX_PARTITIONS, MAX_REPLICAS
from smartnsq.cli._common import (
    add_admin_options,
    add_verbosity,
    admin_for,
    channel_arg,
    plural,
    setup_logging,
    topic_arg,
)
from smartnsq.transport import loops

__all__ = ["register"]

DESCRIPTION = """\
youzan: topics are created by the nsqlookupd leader, which places PARTITIONS x REPLICAS on
the nsqd nodes (--ordered: SUB_ORDERED consumption, publishes name their partition;
--multi-part: several partitions per node; --ext: JSON ext headers). Every replica of a
partition needs a node of its own, and a plain topic (neither --ordered nor --multi-part) one
node per replica of every partition: PARTITIONS x REPLICAS <= nodes.

Channels given with --channel are registered: they exist on every replica of every partition
and survive a leader failover. Registering needs the topic to refuse
channels that SUB would create (disable_channel_auto_create), which --channel turns on:
consumers may then use registered channels only (register more with smartnsq channel create).
Without --channel, a consumer's SUB creates its channel at the topic's end, on each
partition's leader only, where a leader crash can lose it (see docs/guides/durable-channels.md).

Classic nsqd: the topic (and its channels) is created on every nsqd.

create waits until every partition has a leader and takes writes (nsqlookupd enables writes
in a topic check, which create asks for again every few seconds); --no-wait returns at once.
Creating a topic that exists with the same settings is fine.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topic",
        help="create or delete a topic (youzan: through the nsqlookupd leader)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help="create a topic, with registered channels",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument(
        "--partitions", type=int, default=1, metavar="N", help=f"1..{MAX_PARTITIONS} (default 1)"
    )
    create.add_argument(
        "--replicas", type=int, default=1, metavar="N", help=f"1..{MAX_REPLICAS} (default 1)"
    )
    create.add_argument("--ordered", action="store_true", help="an ordered topic (orderedmulti)")
    create.add_argument(
        "--multi-part",
        action="store_true",
        help="a multi-part topic (multipart): its partitions may share nodes",
    )
    create.add_argument("--ext", action="store_true", help="a topic with JSON ext headers")
    create.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="NAME",
        help="register a durable channel (repeatable)",
    )
    create.add_argument(
        "--no-wait", action="store_true", help="do not wait until the topic is ready"
    )
    add_admin_options(create)
    add_verbosity(create)
    create.set_defaults(func=run_create)
    delete = actions.add_parser("delete", help="delete a topic, every partition and message of it")
    delete.add_argument("topic", metavar="TOPIC")
    add_admin_options(delete)
    add_verbosity(delete)
    delete.set_defaults(func=run_delete)


def run_create(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    channels = [channel_arg(name) for name in args.channel]
    setup_logging("topic", args.verbose)

    async def create() -> bool:
        async with admin_for(args) as admin:
            await admin.create_topic(
                topic,
                args.partitions,
                args.replicas,
                ordered=args.ordered,
                multi_part=args.multi_part,
                ext=args.ext,
                channels=channels,
                wait=None if args.no_wait else 30.0,
            )
            return await admin.is_youzan()

    youzan = loops.run(create())
    if not youzan:
        # what classic nsqd makes: the topic (and channels) on each nsqd, nothing else
        made = ", channels: " + ", ".join(channels) if channels else ""
        print(
            f"topic {topic}: created on every nsqd (classic NSQ: no partitions or replicas){made}"
        )
        return 0
    kinds = [k for k, on in (("ordered", args.ordered), ("multi-part", args.multi_part)) if on]
    kinds += ["ext"] if args.ext else []
    registered = f", channels registered: {', '.join(channels)}" if channels else ""
    print(
        f"topic {topic}: {plural(args.partitions, 'partition')} x "
        f"{plural(args.replicas, 'replica')}"
        + (f" ({', '.join(kinds)})" if kinds else "")
        + registered
    )
    return 0


def run_delete(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    setup_logging("topic", args.verbose)

    async def delete() -> None:
        async with admin_for(args) as admin:
            await admin.delete_topic(topic)

    loops.run(delete())
    print(f"topic {topic}: deleted")
    return 0
