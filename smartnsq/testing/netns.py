"""True network partitions on Linux: server processes in a network namespace of their own,
joined to the host by a veth pair, and the link cut and restored.

Unlike a proxy, nothing stands between client and server: the kernel drops the packets. A
:class:`Netns` is a fresh namespace with a veth pair on a small subnet of its own (a /30 in
10.213.0.0/16 not in use: the host's end ``host_address``, the namespace's ``address``);
:meth:`Netns.spawn` runs a command inside it; :meth:`Netns.partition` sets the namespace's
end of the link down, so packets both ways are dropped (open connections stay open and
silent, new connections time out) and :meth:`Netns.heal` sets it up again.
:class:`NetnsCluster` runs ``python -m smartnsq cluster`` in one.

It needs root and a working ``ip netns`` (iproute2): :func:`netns_unavailable_reason` says
why not, for tests to skip. Everything created (processes, the namespace, the veth pair) is
removed by ``close()`` and, for anything left open, at interpreter exit. This machine's
kernel may lack the netem qdisc: latency comes from :mod:`smartnsq.testing.faults`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.testing.errors import ClusterError
from smartnsq.testing.lifecycle import StartsAndCloses

__all__ = [
    "Netns",
    "NetnsCluster",
    "NetnsError",
    "NetnsUnavailableError",
    "netns_unavailable_reason",
]

_POOL = ipaddress.ip_network("10.213.0.0/16")  # where the /30 subnets are drawn from
_IP_TIMEOUT = 10.0  # seconds for one `ip` command
_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL for a spawned process
_unavailable: list[str | None] = []  # the probe's answer, once per process


class NetnsError(ClusterError):
    """A namespace could not be made or driven (an ``ip`` command failed)."""


class NetnsUnavailableError(NetnsError):
    """Network namespaces cannot be used here (not root, no ``ip netns``...)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"ip {' '.join(args)}: {exc}") from None
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def netns_unavailable_reason() -> str | None:
    """None when this process can make network namespaces joined by veth pairs, else why
    not, in one line. It tries (a namespace and a veth pair, removed at once), once per
    process."""
    if not _unavailable:
        _unavailable.append(_probe())
    return _unavailable[0]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    tag = uuid.uuid4().hex[:6]
    name, veth = f"smartnsq-probe-{tag}", f"snq{tag}p"
    try:
        _ip("netns", "add", name)
        try:
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"snq{tag}q")
            _ip("link", "set", f"snq{tag}q", "netns", name)
        finally:
            _ip("link", "delete", veth, check=False)
            _ip("netns", "delete", name, check=False)
    except NetnsError as exc:
        return f"ip netns does not work here: {exc}"
    return None


def _subnets_in_use() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    found: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        words = line.split()
        if "inet" in words:
            found.append(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show").stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if first != "default":
                found.append(ipaddress.ip_network(first, strict=False))
    return found


def _free_subnet() -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    used = _subnets_in_use()
    rng = random.Random()
    for _ in range(100):
        candidate = ipaddress.ip_network(
            f"{_POOL.network_address + 4 * rng.randrange(_POOL.num_addresses // 4)}/30"
        )
        if not any(candidate.overlaps(other) for other in used):
            return candidate
    raise NetnsError(f"no free /30 subnet in {_POOL}")


class Netns(StartsAndCloses):
    """A network namespace joined to the host by a veth pair on its own /30 subnet.

    ``async with Netns() as ns:`` makes it; ``await ns.spawn(...)`` runs commands inside
    (their addresses: ``ns.address``); ``ns.partition()`` / ``ns.heal()`` cut and restore
    the link; leaving removes the processes, the namespace and the veth pair. ``subnet``
    (a /30, e.g. ``"10.213.4.0/30"``) by default is drawn from 10.213.0.0/16 among those
    not in use. Raises :class:`NetnsUnavailableError` where namespaces cannot be used."""

    def __init__(self, *, subnet: str | None = None) -> None:
        tag = uuid.uuid4().hex[:8]
        self.name = f"smartnsq-{tag}"
        self.host_veth = f"snq{tag}h"  # interface names are at most 15 bytes
        self.inner_veth = f"snq{tag}n"
        self._subnet = subnet
        self.address = ""
        self.host_address = ""
        self.partitioned = False
        self._processes: list[asyncio.subprocess.Process] = []
        self._created = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<Netns {self.name} {self.address or '(not made)'}>"

    async def start(self) -> Netns:
        """Make the namespace and the link (what ``async with`` does)."""
        if self._created or self._closed:
            raise NetnsError("a Netns is made once")
        reason = netns_unavailable_reason()
        if reason is not None:
            raise NetnsUnavailableError(reason)
        await asyncio.to_thread(self._create)
        return self

    def _create(self) -> None:
        if self._subnet is not None:
            try:
                subnet = ipaddress.ip_network(self._subnet)
            except ValueError as exc:
                raise ValidationError("subnet", str(exc)) from None
            if subnet.version != 4 or subnet.num_addresses < 4:
                raise ValidationError("subnet", f"{subnet}: an IPv4 subnet of 4 addresses or more")
        else:
            subnet = _free_subnet()
        host_ip, inner_ip = list(subnet.hosts())[:2]
        self.host_address, self.address = str(host_ip), str(inner_ip)
        prefix = subnet.prefixlen
        self._created = True
        atexit.register(self._remove)
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.host_veth, "type", "veth", "peer", "name", self.inner_veth)
            _ip("link", "set", self.inner_veth, "netns", self.name)
            _ip("addr", "add", f"{host_ip}/{prefix}", "dev", self.host_veth)
            _ip("link", "set", self.host_veth, "up")
            _ip("-n", self.name, "addr", "add", f"{inner_ip}/{prefix}", "dev", self.inner_veth)
            _ip("-n", self.name, "link", "set", "lo", "up")
            self._link_up()
        except BaseException:
            self._remove()
            raise

    def _link_up(self) -> None:
        _ip("-n", self.name, "link", "set", self.inner_veth, "up")
        # Setting the link down dropped the namespace's default route: back to the host.
        _ip("-n", self.name, "route", "replace", "default", "via", self.host_address)

    async def spawn(self, *command: str, **options: Any) -> asyncio.subprocess.Process:
        """Run ``command`` inside the namespace (``ip netns exec``), in a session of its
        own; ``options`` go to ``asyncio.create_subprocess_exec`` (``stdout=...``). The
        process is stopped (SIGTERM, then SIGKILL) on :meth:`close`."""
        self._require_made()
        process = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self.name, *command, start_new_session=True, **options
        )
        self._processes.append(process)
        return process

    def partition(self) -> None:
        """Cut the link (the namespace's end set down): packets both ways are dropped,
        connections stay open and silent, new ones time out. Idempotent."""
        self._require_made()
        if not self.partitioned:
            _ip("-n", self.name, "link", "set", self.inner_veth, "down")
            self.partitioned = True

    def heal(self) -> None:
        """Restore the link; TCP retransmits what waited. Idempotent."""
        self._require_made()
        if self.partitioned:
            self._link_up()
            self.partitioned = False

    def _require_made(self) -> None:
        if not self._created or self._closed:
            raise NetnsError(f"{self.name} is not made (or was closed)")

    async def close(self) -> None:
        """Stop the processes, remove the namespace and the veth pair; idempotent."""
        if self._closed:
            return
        for process in self._processes:
            await _stop(process)
        self._processes.clear()
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._remove)
        for process in self._processes:  # only at exit: close() stopped them already
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._created:
            _ip("link", "delete", self.host_veth, check=False)
            _ip("netns", "delete", self.name, check=False)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the process's session, SIGKILL if it is still there after a while."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


class NetnsCluster(StartsAndCloses):
    """``python -m smartnsq cluster`` (the embedded emulator, as a separate process) in a
    namespace of its own, listening on the namespace's address: ``args`` are the
    command's options (``"--classic"``, ``"--nodes", "3"``, ``"--topic", "t:2:2"``...).

    ``async with NetnsCluster("--classic") as cluster:`` gives :attr:`lookupd_urls` and
    :attr:`nsqd_addresses` as the cluster printed them; :meth:`partition` and :meth:`heal`
    cut and restore the whole cluster's link."""

    def __init__(self, *args: str, startup_timeout: float = 30.0) -> None:
        for word in ("--host", "--port-file"):
            if word in args:
                raise ValidationError("args", f"{word} is chosen by NetnsCluster")
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.netns = Netns()
        self.info: dict[str, Any] = {}
        self.output: list[str] = []  # what the cluster printed (and logged)
        self._process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> NetnsCluster:
        await self.netns.start()
        try:
            with tempfile.TemporaryDirectory(prefix="smartnsq-netns-") as folder:
                port_file = Path(folder) / "ports.json"
                command = [sys.executable, "-m", "smartnsq", "cluster"]
                command += ["--host", self.netns.address, "--port-file", str(port_file)]
                self._process = await self.netns.spawn(
                    *command,
                    *self.args,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                await self._ready(self._process)
                if not port_file.exists():
                    shown = "".join(self.output).strip()
                    raise NetnsError(f"smartnsq cluster did not start: {shown}")
                self.info = json.loads(port_file.read_text())
            # Read on, so that a full pipe never blocks the cluster.
            self._drain = asyncio.get_running_loop().create_task(self._read_output())
        except BaseException:
            await self.close()
            raise
        return self

    async def _ready(self, process: asyncio.subprocess.Process) -> None:
        """Read the cluster's output until it says it is ready (or ends), within the
        timeout."""
        try:
            await asyncio.wait_for(self._read_output(until=b"Ready;"), self.startup_timeout)
        except TimeoutError:
            raise NetnsError(
                f"smartnsq cluster was not ready within {self.startup_timeout:g} s: "
                f"{''.join(self.output).strip()}"
            ) from None

    async def _read_output(self, until: bytes | None = None) -> None:
        stream = self._process.stdout if self._process is not None else None
        if stream is None:
            return
        while line := await stream.readline():
            self.output.append(line.decode(errors="replace"))
            if until is not None and line.startswith(until):
                return

    @property
    def lookupd_urls(self) -> list[str]:
        return list(self.info.get("lookupd_http", []))

    @property
    def lookupd_url(self) -> str:
        return self.lookupd_urls[0]

    @property
    def nsqd_addresses(self) -> list[str]:
        return [node["tcp"] for node in self.info.get("nsqd", [])]

    @property
    def partitioned(self) -> bool:
        return self.netns.partitioned

    def partition(self) -> None:
        """Cut the cluster's link (see :meth:`Netns.partition`)."""
        self.netns.partition()

    def heal(self) -> None:
        self.netns.heal()

    async def close(self) -> None:
        """Stop the cluster and remove the namespace."""
        await self.netns.close()
        if self._drain is not None:
            await self._drain  # the output ends with the process
