"""Where a client finds nsqd: through nsqlookupd (youzan or classic) or a fixed list of
classic nsqd addresses. Shared by the Producer and the Consumer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from smartnsq.errors import ValidationError
from smartnsq.flow.backoff import check_seconds
from smartnsq.routing.addresses import AddressMap, AddressMapping, split_host_port
from smartnsq.transport.lookup import LookupManager, normalize_seed

__all__ = ["Targets", "check_nsqd_address", "resolve_targets"]


def check_nsqd_address(address: object) -> str:
    """An address of ``nsqd=[...]`` (``--nsqd``): nsqd's TCP ``host:port``. A URL is the
    usual mistake (an HTTP address belongs to ``lookupd=``): the error says so."""
    if isinstance(address, str) and "://" in address:
        raise ValidationError(
            "nsqd",
            f"{address!r} is a URL; nsqd takes nsqd's TCP address as host:port (default port "
            "4150). For nsqlookupd's HTTP address (http://host:4161) use lookupd=[...]",
        )
    split_host_port(address, "nsqd")
    return str(address)


class Targets(NamedTuple):
    nsqd: list[str]  # direct mode: classic nsqd TCP addresses (empty with lookupd)
    lookup: LookupManager | None
    owns_lookup: bool  # the client created the manager, so it closes it


def resolve_targets(
    *,
    lookupd: Sequence[str] | None,
    nsqd: Sequence[str] | None,
    lookup_manager: LookupManager | None = None,
    poll_interval: float = 60.0,
    address_map: AddressMapping | None = None,
) -> Targets:
    """Validate ``lookupd=[...]`` / ``nsqd=[...]`` (exactly one) and build the lookup.

    ``address_map`` applies to what nsqlookupd announces; with ``nsqd=[...]`` the addresses
    are the caller's own and it is refused, as it is with a ``lookup_manager`` (give the
    map to the manager)."""
    mapping = AddressMap.of(address_map)
    if mapping and lookup_manager is not None:
        raise ValidationError(
            "address_map", "give it to the LookupManager passed as lookup_manager, not here"
        )
    if mapping and nsqd is not None:
        raise ValidationError(
            "address_map", "maps addresses nsqlookupd announces: it needs lookupd=[...], not nsqd"
        )
    if lookup_manager is not None:
        return Targets([], lookup_manager, False)
    if (lookupd is None) == (nsqd is None):
        raise ValidationError("lookupd", "give exactly one of lookupd=[...] or nsqd=[...]")
    if isinstance(lookupd, str) or isinstance(nsqd, str):
        raise ValidationError("lookupd", "lookupd and nsqd take lists of addresses")
    if nsqd is not None:
        addresses = list(nsqd)
        if not addresses:
            raise ValidationError("nsqd", "needs at least one address")
        for address in addresses:
            check_nsqd_address(address)
        return Targets(addresses, None, False)
    # Checked here, not by the manager, so that errors name the client's arguments
    # (lookupd, lookupd_poll_interval) rather than the manager's (seeds, poll_interval).
    seeds = list(lookupd or ())
    if not seeds:
        raise ValidationError("lookupd", "needs at least one nsqlookupd address")
    for seed in seeds:
        normalize_seed(seed, "lookupd")
    check_seconds("lookupd_poll_interval", poll_interval, positive=True)
    manager = LookupManager(seeds, poll_interval=poll_interval, address_map=mapping)
    return Targets([], manager, True)
