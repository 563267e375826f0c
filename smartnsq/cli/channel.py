"""``smartnsq channel create``: register a channel of a topic (``seek`` and ``lag``:
``smartnsq.cli.offsets``)."""

from __future__ import annotations

import argparse
from typing import Any

from smartnsq.cli._common import (
    add_admin_options,
    add_verbosity,
    admin_for,
    channel_arg,
    setup_logging,
    topic_arg,
)
from smartnsq.cli.offsets import register_actions
from smartnsq.transport import loops

__all__ = ["register"]

DESCRIPTION = """\
youzan: register CHANNEL through the nsqlookupd leader. The channel then exists on every
replica of every partition of TOPIC and survives a leader failover. youzan registers channels
only on topics created with disable_channel_auto_create (smartnsq topic create --channel);
on other topics a consumer's SUB creates its channel, on each partition's leader only.

Classic nsqd: the channel is created on every nsqd that has TOPIC.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "channel",
        help="register a (durable) channel of a topic, move or show its position",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help="register a channel",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument("channel", metavar="CHANNEL")
    create.add_argument(
        "--no-wait", action="store_true", help="do not wait until nsqlookupd lists it"
    )
    add_admin_options(create)
    add_verbosity(create)
    create.set_defaults(func=run_create)
    register_actions(actions)


def run_create(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    channel = channel_arg(args.channel)
    setup_logging("channel", args.verbose)

    async def create() -> None:
        async with admin_for(args) as admin:
            await admin.create_channel(topic, channel, wait=None if args.no_wait else 30.0)

    loops.run(create())
    print(f"channel {topic}/{channel}: registered")
    return 0
