"""Dockerized NSQ clusters for integration tests, on testcontainers.

* :class:`YouzanContainerCluster`: etcd (v2 API), one nsqlookupd and ``nodes`` youzan nsqd;
* :class:`ClassicContainerCluster`: nsqlookupd and one nsqd from ``nsqio/nsq``;
* :class:`EmbeddedContainerCluster`: ``smartnsq cluster`` (the embedded emulator) in one
  container of the project's image (``contrib/docker/Dockerfile``): a fast stand-in.

Every container joins a private network under a fixed name (``etcd``, ``nsqlookupd``,
``nsqd0``...) and announces that name to nsqlookupd, as nsqd would in any container. A client
on the host cannot resolve those names, so each cluster publishes the ports on the host and
hands its clients an :class:`~smartnsq.routing.addresses.AddressMap` that translates the
announced ``name:port`` (or container IP) into the published ``127.0.0.1:port``, read live so
that a restarted container is followed. :meth:`ContainerCluster.producer` and
:meth:`ContainerCluster.consumer` are wired with it.

A cluster is a context manager (``with`` or ``async with``); leaving it removes every
container and the network, also when the test failed (and at interpreter exit for a cluster
never closed). Node faults: :meth:`~ContainerCluster.stop` (SIGTERM),
:meth:`~ContainerCluster.kill` (SIGKILL), :meth:`~ContainerCluster.start`,
:meth:`~ContainerCluster.pause`, :meth:`~ContainerCluster.unpause`, and network partitions:
:meth:`~ContainerCluster.partition`, :meth:`~ContainerCluster.heal`. They are blocking Docker
calls: from a coroutine use ``await asyncio.to_thread(cluster.kill, 1)``.

Images come from the arguments or the environment (``SMARTNSQ_TEST_IMAGE``,
``SMARTNSQ_YOUZAN_IMAGE``, ``SMARTNSQ_ETCD_IMAGE``, ``SMARTNSQ_CLASSIC_IMAGE``). Without a
Docker engine every class raises :class:`DockerUnavailableError`, one line naming the
problem. testcontainers is a development dependency (``pip install smartnsq[dev]`` or
``pip install testcontainers``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from smartnsq.errors import ValidationError
from smartnsq.protocol.lookupd import ACCEPT_V1
from smartnsq.routing.addresses import AddressMap, split_host_port
from smartnsq.testing.errors import ClusterError

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
    from testcontainers.core.wait_strategies import HttpWaitStrategy
    from testcontainers.core.waiting_utils import WaitStrategy

    from smartnsq.admin import Admin
    from smartnsq.consumer.consumer import Consumer
    from smartnsq.producer.producer import Producer

__all__ = [
    "DEFAULT_CLASSIC_IMAGE",
    "DEFAULT_EMBEDDED_IMAGE",
    "DEFAULT_ETCD_IMAGE",
    "DEFAULT_YOUZAN_IMAGE",
    "ENV_CLASSIC_IMAGE",
    "ENV_EMBEDDED_IMAGE",
    "ENV_ETCD_IMAGE",
    "ENV_YOUZAN_IMAGE",
    "LABEL",
    "ClassicContainerCluster",
    "ContainerCluster",
    "ContainerClusterError",
    "DockerUnavailableError",
    "EmbeddedContainerCluster",
    "YouzanContainerCluster",
    "docker_unavailable_reason",
]

ENV_EMBEDDED_IMAGE = "SMARTNSQ_TEST_IMAGE"
ENV_YOUZAN_IMAGE = "SMARTNSQ_YOUZAN_IMAGE"
ENV_ETCD_IMAGE = "SMARTNSQ_ETCD_IMAGE"
ENV_CLASSIC_IMAGE = "SMARTNSQ_CLASSIC_IMAGE"
# contrib/docker/build-image tags it so; youzan publishes no image (docs/guides/docker.md).
DEFAULT_EMBEDDED_IMAGE = "smartnsq:local"
DEFAULT_YOUZAN_IMAGE = "youzan-nsq:local"
# youzan's coordinator speaks etcd's v2 API: etcd 3.4 serves it with --enable-v2.
DEFAULT_ETCD_IMAGE = "quay.io/coreos/etcd:v3.4.33"
DEFAULT_CLASSIC_IMAGE = "nsqio/nsq:v1.3.0"
#: Every container of a cluster carries this label, its value the cluster's id.
LABEL = "io.smartnsq.cluster"

_CLUSTER_ID = "smartnsq-test"  # youzan's --cluster-id
_ETCD_URL = "http://etcd:2379"  # etcd's client URL on the cluster's network
_STOP_TIMEOUT = 10  # seconds between SIGTERM and SIGKILL on stop(i)
_PROBE_STEP = 1.0  # seconds of readiness probing between two looks at the container
_LOG_LINES = 10  # how much of a container's log an error shows
_LOG_SCAN = 200  # how much of it is searched for the lines below
# Log lines after which the process stays up but never serves: waiting is pointless.
# youzan nsqlookupd (and older nsqd) with a wildcard --tcp-address host and no broadcast
# interface (docs/protocol.md#nsqlookupd-and-the-broadcast-address).
_NEVER_SERVES = ("can not decide the broadcast ip",)


class ContainerClusterError(ClusterError):
    """A dockerized cluster could not be started or driven (image missing, a container that
    exited, a node that never registered...)."""


class DockerUnavailableError(ContainerClusterError):
    """No Docker engine answers (or testcontainers is not installed)."""


def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers (``DOCKER_HOST`` or the default socket), else why not
    in one line; it asks the engine, so call it once (e.g. per test session)."""
    try:
        import docker  # type: ignore[import-untyped]
        import testcontainers  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed ({exc.name}): pip install testcontainers"
    where = os.environ.get("DOCKER_HOST") or "the default socket"
    try:
        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - every failure means the same: no engine
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"no Docker engine answers at {where}: {detail[:200]}"
    return None


def _require_docker() -> None:
    reason = docker_unavailable_reason()
    if reason is not None:
        raise DockerUnavailableError(reason)


def _docker_is_local() -> bool:
    """Published ports are on this machine (unix socket or npipe), so they can be bound to
    127.0.0.1 and chosen here; a remote engine publishes on its own interfaces."""
    host = os.environ.get("DOCKER_HOST", "")
    return host == "" or host.startswith(("unix://", "npipe://"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http_ready(port: int, path: str = "/ping") -> HttpWaitStrategy:
    from testcontainers.core.wait_strategies import HttpWaitStrategy

    return HttpWaitStrategy(port, path).for_status_code(200)


def _producers(body: str) -> list[dict[str, Any]]:
    """The ``producers`` of a ``/nodes`` answer, v1 or legacy envelope."""
    try:
        payload = json.loads(body)
    except ValueError:
        return []
    if isinstance(payload, dict) and isinstance(payload.get("data"), dict):
        payload = payload["data"]
    producers = payload.get("producers") if isinstance(payload, dict) else None
    return [p for p in producers or [] if isinstance(p, dict)]


def _has_lookupd_leader(body: str) -> bool:
    """A ``/listlookup`` answer names a leader (youzan elects one through etcd)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    if isinstance(payload, dict) and isinstance(payload.get("data"), dict):
        payload = payload["data"]
    leader = payload.get("lookupdleader") if isinstance(payload, dict) else None
    return isinstance(leader, dict) and bool(leader.get("NodeIP"))


class _ContainerState(NamedTuple):
    """What Docker says of a container: ``status`` ("running", "exited"...) and, once it
    stopped, its exit code."""

    status: str
    exit_code: int | None


def _diagnose(state: _ContainerState, log: str) -> str | None:
    """Why a starting container will never be ready, or None while it still may be: it is no
    longer running, or its log says it will not serve."""
    if state.status in ("exited", "dead"):
        code = f" with code {state.exit_code}" if state.exit_code is not None else ""
        return f"exited{code} before it was ready"
    lowered = log.lower()
    for marker in _NEVER_SERVES:
        if marker in lowered:
            return f"is running but will never serve (its log says {marker!r})"
    return None


def _log_tail(log: str) -> str:
    """The last lines of a log on one line, or why there are none."""
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    return " | ".join(lines[-_LOG_LINES:]) if lines else "(empty)"


@dataclass
class _Service:
    """One container of a cluster: ``name`` is its hostname and network alias."""

    name: str
    container: DockerContainer
    ports: tuple[int, ...]
    ready: Callable[[], WaitStrategy]
    published: dict[int, int] = field(default_factory=dict)
    ip: str = ""
    running: bool = False
    partitioned: bool = False


def _startup_error(service: _Service, problem: str, log: str) -> str:
    """The error of a container that did not come up: which one, what is wrong, and how its
    log ends."""
    return (
        f"container {service.name} ({service.container.image}) {problem}; "
        f"the last lines of its log: {_log_tail(log)}"
    )


class _Published:
    """A service as testcontainers' wait strategies see it, with this cluster's host address:
    its ports as published on the host (testcontainers would guess the host from its own
    surroundings, e.g. a gateway address when it runs inside a container)."""

    def __init__(self, service: _Service, host_ip: str) -> None:
        self._service = service
        self._host_ip = host_ip

    def get_container_host_ip(self) -> str:
        return self._host_ip

    def get_exposed_port(self, port: int) -> int:
        published = self._service.published.get(port)
        if published is None:
            raise ConnectionError(f"{self._service.name}:{port} is not published")
        return published

    def get_wrapped_container(self) -> Any:
        return self._service.container.get_wrapped_container()

    def get_logs(self) -> tuple[bytes, bytes]:
        return self._service.container.get_logs()

    def reload(self) -> None:
        self._service.container.reload()

    @property
    def status(self) -> str:
        return self._service.container.status


def _node_count(nodes: object) -> int:
    """``nodes`` checked: the clusters run 1 to 16 nsqd."""
    if type(nodes) is not int or not 1 <= nodes <= 16:
        raise ValidationError("nodes", "must be an int 1..16")
    return nodes


class ContainerCluster:
    """What the dockerized clusters share; see the module's documentation."""

    classic = False
    #: The service names of the nsqd containers, by node index.
    node_names: tuple[str, ...] = ()

    def __init__(self, *, startup_timeout: float = 120.0) -> None:
        if not startup_timeout > 0:
            raise ValidationError("startup_timeout", "must be > 0 seconds")
        self.startup_timeout = float(startup_timeout)
        self.id = uuid.uuid4().hex[:12]
        self._services: list[_Service] = []
        self._network: Network | None = None
        self._host_ip = "127.0.0.1"
        self._opened = False
        self._closed = False
        self.address_map = AddressMap(self.resolve)

    # ------------------------------------------------------------------ what subclasses say

    def _plan(self) -> list[_Service]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _wait_registered(self) -> None:
        """Block until the cluster takes publishes (subclasses add their conditions)."""

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> ContainerCluster:
        """Start every container in order, each waited for with its strategy, then wait until
        the nodes registered with nsqlookupd. Raises DockerUnavailableError without an
        engine, ContainerClusterError when a container does not come up (removing whatever
        was started): it names the container and quotes the end of its log, at once when the
        container exited or logged that it will never serve, else after the startup
        timeout."""
        if self._opened:
            raise ContainerClusterError("the cluster was opened already")
        self._opened = True
        _require_docker()
        from testcontainers.core.network import Network

        atexit.register(self.close)
        try:
            self._host_ip = "127.0.0.1" if _docker_is_local() else self._remote_host()
            self._network = Network().create()
            self._services = self._plan()
            for service in self._services:
                self._run(service)
            self._wait_registered()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Remove every container and the network (idempotent; errors of one removal do
        not stop the others)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        import docker.errors  # type: ignore[import-untyped]

        for service in reversed(self._services):
            with contextlib.suppress(docker.errors.DockerException):
                wrapped = service.container._container
                if wrapped is not None:
                    wrapped.remove(force=True, v=True)
            with contextlib.suppress(docker.errors.DockerException):
                service.container.get_docker_client().client.close()
            service.running = False
        if self._network is not None:
            with contextlib.suppress(docker.errors.DockerException):
                self._network.remove()

    def __enter__(self) -> ContainerCluster:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> ContainerCluster:
        await asyncio.to_thread(self.open)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    def _remote_host(self) -> str:
        from testcontainers.core.docker_client import DockerClient

        return DockerClient().host()

    def _container(self, image: str, name: str, command: Sequence[str]) -> DockerContainer:
        """A container of this cluster on its network, reachable there as ``name``."""
        from testcontainers.core.container import DockerContainer

        if self._network is None:
            raise ContainerClusterError("the cluster is not open")
        return (
            DockerContainer(image, hostname=name, labels={LABEL: self.id})
            .with_command(list(command))
            .with_network(self._network)
            .with_network_aliases(name)
        )

    def _publish(self, service: _Service) -> None:
        # docker-py port bindings: (host_ip, host_port), or (host_ip,) for a random port.
        ports: dict[str, Any] = service.container.ports
        for port in service.ports:
            if _docker_is_local():
                ports[f"{port}/tcp"] = ("127.0.0.1", _free_port())
            else:
                ports[f"{port}/tcp"] = None

    def _run(self, service: _Service) -> None:
        """Create and start ``service`` and wait until it is ready."""
        import docker.errors

        self._publish(service)
        try:
            service.container.start()
            self._refresh(service)
            self._wait(service, service.ready())
        except docker.errors.ImageNotFound as exc:
            raise ContainerClusterError(
                f"image {service.container.image!r} is not present and could not be pulled: "
                f"{exc.explanation or exc}"
            ) from None
        except docker.errors.APIError as exc:
            raise ContainerClusterError(
                f"{service.name} ({service.container.image}): {exc.explanation or exc}"
            ) from None
        service.running = True

    def _wait(self, service: _Service, strategy: WaitStrategy) -> None:
        """Wait for ``strategy`` on ``service``, within the startup timeout, probing in short
        steps: between them the container itself is checked, so one that exited or logged
        that it will never serve fails at once, named, with the end of its log."""
        deadline = time.monotonic() + self.startup_timeout
        target = _Published(service, self._host_ip)
        reason = "never answered"
        while True:
            state, log = self._inspect(service)
            problem = _diagnose(state, log)
            if problem is not None:
                raise ContainerClusterError(_startup_error(service, problem, log))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waited = f"was not ready within {self.startup_timeout:g} s ({reason})"
                raise ContainerClusterError(_startup_error(service, waited, log))
            strategy.with_startup_timeout(min(_PROBE_STEP, remaining))  # type: ignore[arg-type]
            try:
                strategy.wait_until_ready(target)
                return
            except (TimeoutError, RuntimeError) as exc:
                # RuntimeError: LogMessageWaitStrategy's "container exited" (testcontainers 4),
                # which the next inspection words
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    def _inspect(self, service: _Service) -> tuple[_ContainerState, str]:
        """The container's state and the end of its log (empty when Docker cannot tell)."""
        wrapped = service.container._container
        if wrapped is None:
            return _ContainerState("created", None), ""
        try:
            wrapped.reload()
            state = wrapped.attrs.get("State") or {}
            found = _ContainerState(
                str(state.get("Status") or wrapped.status), state.get("ExitCode")
            )
        except Exception:  # noqa: BLE001 - only for a diagnosis: the probe decides
            found = _ContainerState("unknown", None)
        try:
            log = bytes(wrapped.logs(tail=_LOG_SCAN)).decode(errors="replace")
        except Exception:  # noqa: BLE001 - only for an error message
            log = ""
        return found, log

    def _refresh(self, service: _Service) -> None:
        """Read the container's IP on the network and its published ports."""
        wrapped = service.container.get_wrapped_container()
        wrapped.reload()
        settings = wrapped.attrs.get("NetworkSettings") or {}
        networks = settings.get("Networks") or {}
        name = self._network.name if self._network is not None else ""
        service.ip = (networks.get(name) or {}).get("IPAddress") or ""
        # A running container reports its bindings; a stopped one only its configured host
        # ports (fixed on a local engine, so the addresses stay known while it is down).
        configured = (wrapped.attrs.get("HostConfig") or {}).get("PortBindings") or {}
        bindings = settings.get("Ports") or {}
        for port in service.ports:
            for binding in (bindings.get(f"{port}/tcp") or []) + (
                configured.get(f"{port}/tcp") or []
            ):
                if binding.get("HostPort"):
                    service.published[port] = int(binding["HostPort"])
                    break

    # ------------------------------------------------------------------ addresses

    def _service(self, name: str) -> _Service:
        for service in self._services:
            if service.name == name:
                return service
        raise ContainerClusterError(f"no service {name!r} in this cluster")

    def host_address(self, name: str, port: int) -> str:
        """``127.0.0.1:<published port>`` of ``port`` of the service ``name``."""
        service = self._service(name)
        published = service.published.get(port)
        if published is None:
            raise ContainerClusterError(f"{name}:{port} is not published (container stopped?)")
        return f"{self._host_ip}:{published}"

    def resolve(self, address: str) -> str:
        """The address map's resolver: an address the cluster announces (a service name or
        container IP, and a container port) -> its published address on the host; other
        addresses unchanged."""
        host, port = split_host_port(address)
        lowered = host.lower()
        for service in self._services:
            if lowered in (service.name, service.ip) and port in service.published:
                return f"{self._host_ip}:{service.published[port]}"
        return address

    @property
    def lookupd_url(self) -> str:
        """nsqlookupd's HTTP URL on the host, e.g. ``http://127.0.0.1:32768``."""
        return f"http://{self.host_address(*self._lookupd_http)}"

    _lookupd_http: tuple[str, int] = ("nsqlookupd", 4161)

    @property
    def container_ids(self) -> list[str]:
        """The id of every container of the cluster, in start order."""
        return [
            s.container._container.id
            for s in self._services
            if s.container._container is not None and s.container._container.id
        ]

    # ------------------------------------------------------------------ clients

    def producer(self, **options: Any) -> Producer:
        """A :class:`smartnsq.Producer` through nsqlookupd, with the cluster's address map."""
        from smartnsq.producer.producer import Producer

        return Producer(lookupd=[self.lookupd_url], address_map=self.address_map, **options)

    def consumer(self, topic: str, channel: str, **options: Any) -> Consumer:
        """A :class:`smartnsq.Consumer` through nsqlookupd, with the cluster's address map."""
        from smartnsq.consumer.consumer import Consumer

        return Consumer(
            topic, channel, lookupd=[self.lookupd_url], address_map=self.address_map, **options
        )

    def admin(self, **options: Any) -> Admin:
        """A :class:`smartnsq.admin.Admin` for this cluster (through nsqlookupd, with the
        cluster's address map)."""
        from smartnsq.admin import Admin

        return Admin([self.lookupd_url], address_map=self.address_map, **options)

    async def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replicas: int = 1,
        *,
        channels: Sequence[str] = (),
        **options: Any,
    ) -> None:
        """Create a topic with the admin API (youzan: on the lookupd leader, durable channels
        on every replica; classic: on the nsqd) and wait until it is writable."""
        async with self.admin() as admin:
            await admin.create_topic(topic, partitions, replicas, channels=channels, **options)

    async def create_channel(self, topic: str, channel: str, **options: Any) -> None:
        async with self.admin() as admin:
            await admin.create_channel(topic, channel, **options)

    async def delete_topic(self, topic: str) -> None:
        async with self.admin() as admin:
            await admin.delete_topic(topic)

    # ------------------------------------------------------------------ node faults

    def _node(self, index: int) -> _Service:
        if type(index) is not int or not 0 <= index < len(self.node_names):
            raise ValidationError("index", f"nodes are 0..{len(self.node_names) - 1}")
        return self._service(self.node_names[index])

    def stop(self, index: int) -> None:
        """Stop node ``index`` gracefully: SIGTERM, SIGKILL after 10 s (``docker stop``)."""
        service = self._node(index)
        service.container.get_wrapped_container().stop(timeout=_STOP_TIMEOUT)
        service.running = False
        self._refresh(service)

    def kill(self, index: int) -> None:
        """Kill node ``index`` at once (SIGKILL): a crash."""
        service = self._node(index)
        service.container.get_wrapped_container().kill(signal="SIGKILL")
        service.running = False
        self._refresh(service)

    def start(self, index: int) -> None:
        """Start a stopped or killed node again (same ports on the host) and wait until it
        is ready."""
        service = self._node(index)
        service.container.get_wrapped_container().start()
        self._refresh(service)
        self._wait(service, service.ready())
        service.running = True

    def pause(self, index: int) -> None:
        """Freeze node ``index`` (``docker pause``): its connections stay open, silent."""
        self._node(index).container.get_wrapped_container().pause()

    def unpause(self, index: int) -> None:
        self._node(index).container.get_wrapped_container().unpause()

    def partition(self, index: int) -> None:
        """Cut node ``index`` off the cluster's network (``docker network disconnect``), as
        a network partition. Between containers it is a true partition: packets are
        dropped, established connections stay open and silent, the node's name no longer
        resolves. From the host it is not silent: the published ports go with the
        network, so connections through them are closed and new ones refused until
        :meth:`heal` (for a silent link from the host, put a
        :class:`~smartnsq.testing.faults.FaultProxy` before the published port, or
        :meth:`pause` the node). Idempotent."""
        service = self._node(index)
        if service.partitioned:
            return
        self._docker_network(service).disconnect(service.container.get_wrapped_container())
        service.partitioned = True

    def heal(self, index: int) -> None:
        """Join node ``index`` to the cluster's network again under its name
        (``docker network connect``); its published ports come back on the same host
        ports. Idempotent."""
        service = self._node(index)
        if not service.partitioned:
            return
        wrapped = service.container.get_wrapped_container()
        self._docker_network(service).connect(wrapped, aliases=[service.name])
        service.partitioned = False
        self._refresh(service)

    def partitioned(self, index: int) -> bool:
        """Node ``index`` is cut off by :meth:`partition`."""
        return self._node(index).partitioned

    def _docker_network(self, service: _Service) -> Any:
        """The cluster's network as docker-py's object, through the service's client."""
        if self._network is None:
            raise ContainerClusterError("the cluster is not open")
        client = service.container.get_docker_client().client
        return client.networks.get(self._network.name)

    def logs(self, name: str) -> str:
        """The log (stdout and stderr) of the service ``name`` so far."""
        wrapped = self._service(name).container.get_wrapped_container()
        return bytes(wrapped.logs()).decode(errors="replace")

    # ------------------------------------------------------------------ waiting

    def _wait_nodes(self, count: int) -> None:
        """Wait until nsqlookupd lists ``count`` nsqd nodes (``/nodes``)."""
        strategy = (
            _http_ready(self._lookupd_http[1], "/nodes")
            .with_header("Accept", ACCEPT_V1)
            .for_response_predicate(lambda body: len(_producers(body)) >= count)
        )
        self._wait(self._service(self._lookupd_http[0]), strategy)


class EmbeddedContainerCluster(ContainerCluster):
    """``smartnsq cluster`` (the embedded emulator, youzan or ``classic``) in one container
    of the smartnsq image: nsqlookupd HTTP on 4161 inside, nsqd ``i`` on 4162+2i (TCP) and
    4163+2i (HTTP), all announced as ``smartnsq``. Node faults act on that one container:
    node 0 is the whole emulated cluster. ``topics`` (``name:partitions:replicas[:flags]``)
    and ``channels`` (``topic:channel``) are created before it reports ready."""

    node_names = ("smartnsq",)
    _lookupd_http = ("smartnsq", 4161)

    def __init__(
        self,
        nodes: int = 3,
        *,
        image: str | None = None,
        classic: bool = False,
        topics: Sequence[str] = (),
        channels: Sequence[str] = (),
        failover_delay: float = 0.0,
        allow_write_with_no_channels: bool = False,
        startup_timeout: float = 120.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.nodes = _node_count(nodes)
        self.classic = classic
        self.image = image or os.environ.get(ENV_EMBEDDED_IMAGE) or DEFAULT_EMBEDDED_IMAGE
        self.command = ["cluster", "--host", "0.0.0.0", "--lookupd-port", "4161"]
        self.command += ["--nodes", str(nodes), "--broadcast-address", "smartnsq"]
        self.command += ["--classic"] if classic else []
        self.command += [f"--failover-delay={failover_delay:g}"] if failover_delay else []
        if allow_write_with_no_channels:
            self.command.append("--allow-write-with-nochannels")
        self.command += [f"--topic={spec}" for spec in topics]
        self.command += [f"--channel={spec}" for spec in channels]

    def _plan(self) -> list[_Service]:
        from testcontainers.core.wait_strategies import LogMessageWaitStrategy

        ports = (4161, *range(4162, 4162 + 2 * self.nodes))
        container = self._container(self.image, "smartnsq", self.command)
        # Printed once every server listens and the topics exist.
        return [_Service("smartnsq", container, ports, lambda: LogMessageWaitStrategy("Ready;"))]

    def start(self, index: int) -> None:
        service = self._node(index)
        # The log of the previous run already holds "Ready;": wait on HTTP instead.
        service.container.get_wrapped_container().start()
        self._refresh(service)
        self._wait(service, _http_ready(4161))
        service.running = True

    @property
    def nsqd_addresses(self) -> list[str]:
        """Each emulated nsqd's TCP address on the host."""
        return [self.host_address("smartnsq", 4162 + 2 * i) for i in range(self.nodes)]


class YouzanContainerCluster(ContainerCluster):
    """A youzan HA cluster: etcd (v2 API on), one nsqlookupd and ``nodes`` nsqd, with the
    cluster flags of youzan's ``contrib/*.cfg.example`` (cluster id, etcd address, RPC
    ports, data paths) and ``--broadcast-interface`` emptied so that ``--broadcast-address``
    (the container's name) is what registers: youzan nsqd otherwise announces the address
    of ``eth0``, which changes when a container restarts.

    youzan publishes no image: build one from its repository (docs/guides/docker.md) and
    name it with ``image=`` or ``$SMARTNSQ_YOUZAN_IMAGE``."""

    def __init__(
        self,
        nodes: int = 3,
        *,
        image: str | None = None,
        etcd_image: str | None = None,
        allow_write_with_no_channels: bool = False,
        startup_timeout: float = 120.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.nodes = _node_count(nodes)
        self.image = image or os.environ.get(ENV_YOUZAN_IMAGE) or DEFAULT_YOUZAN_IMAGE
        self.etcd_image = etcd_image or os.environ.get(ENV_ETCD_IMAGE) or DEFAULT_ETCD_IMAGE
        self.allow_write_with_no_channels = allow_write_with_no_channels
        self.node_names = tuple(f"nsqd{i}" for i in range(nodes))

    def etcd_command(self) -> list[str]:
        """etcd's command line: one member, the v2 API on (youzan's coordinator uses it)."""
        return [
            "/usr/local/bin/etcd", "--name=etcd", "--data-dir=/tmp/etcd", "--enable-v2=true",
            "--listen-client-urls=http://0.0.0.0:2379", f"--advertise-client-urls={_ETCD_URL}",
            "--listen-peer-urls=http://0.0.0.0:2380",
            "--initial-advertise-peer-urls=http://etcd:2380",
            "--initial-cluster=etcd=http://etcd:2380",
        ]  # fmt: skip

    # The TCP addresses have an empty host (all interfaces): youzan nsqlookupd (and older nsqd)
    # take the IP they register from that host and fall back to --broadcast-address only
    # when it is empty; with 0.0.0.0, nsqlookupd logs "can not decide the broadcast ip" and
    # never serves (docs/protocol.md#nsqlookupd-and-the-broadcast-address). Every flag is one
    # of apps/nsqlookupd and apps/nsqd of youzan/nsq.

    def lookupd_command(self) -> list[str]:
        """nsqlookupd's command line."""
        command = [
            "nsqlookupd", *self._cluster_flags(),
            "--tcp-address=:4160", "--http-address=0.0.0.0:4161", "--rpc-port=4260",
            "--broadcast-address=nsqlookupd", "--broadcast-interface=", "--log-level=2",
        ]  # fmt: skip
        if self.allow_write_with_no_channels:
            command.append("--allow-write-with-nochannels=true")
        return command

    def nsqd_command(self, index: int) -> list[str]:
        """nsqd ``index``'s command line, announcing its container name."""
        name = self.node_names[index]
        return [
            "nsqd", *self._cluster_flags(),
            "--tcp-address=:4150", "--http-address=0.0.0.0:4151", "--rpc-port=4250",
            f"--broadcast-address={name}", "--broadcast-interface=",
            # The worker id seeds message ids: unique per node (it defaults to a hash of the
            # hostname).
            f"--worker-id={index + 1}", f"--data-path=/data/{name}",
            "--lookup-ping-interval=1s", "--log-level=2",
        ]  # fmt: skip

    @staticmethod
    def _cluster_flags() -> list[str]:
        return [f"--cluster-id={_CLUSTER_ID}", f"--cluster-leadership-addresses={_ETCD_URL}"]

    def _plan(self) -> list[_Service]:
        services = [
            _Service(
                "etcd",
                self._container(self.etcd_image, "etcd", self.etcd_command()),
                (2379,),
                lambda: _http_ready(2379, "/health").for_response_predicate(
                    lambda body: '"true"' in body
                ),
            ),
            _Service(
                "nsqlookupd",
                self._container(self.image, "nsqlookupd", self.lookupd_command()),
                (4161,),
                lambda: _http_ready(4161),
            ),
        ]
        for index, name in enumerate(self.node_names):
            services.append(
                _Service(
                    name,
                    self._container(self.image, name, self.nsqd_command(index)),
                    (4150, 4151),
                    lambda: _http_ready(4151),
                )
            )
        return services

    def _wait_registered(self) -> None:
        self._wait_nodes(self.nodes)
        # The coordinator elects a lookupd leader through etcd: topic creation needs it.
        strategy = (
            _http_ready(4161, "/listlookup")
            .with_header("Accept", ACCEPT_V1)
            .for_response_predicate(_has_lookupd_leader)
        )
        self._wait(self._service("nsqlookupd"), strategy)

    @property
    def nsqd_addresses(self) -> list[str]:
        return [self.host_address(name, 4150) for name in self.node_names]


class ClassicContainerCluster(ContainerCluster):
    """Classic NSQ: ``nsqlookupd`` and one ``nsqd`` of ``nsqio/nsq`` (``image=`` or
    ``$SMARTNSQ_CLASSIC_IMAGE``), nsqd registered as ``nsqd0`` (``--broadcast-address``)."""

    classic = True
    node_names = ("nsqd0",)

    def __init__(self, *, image: str | None = None, startup_timeout: float = 120.0) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.image = image or os.environ.get(ENV_CLASSIC_IMAGE) or DEFAULT_CLASSIC_IMAGE

    def _plan(self) -> list[_Service]:
        lookupd = self._container(
            self.image, "nsqlookupd", ["/nsqlookupd", "--broadcast-address=nsqlookupd"]
        )
        nsqd = self._container(
            self.image,
            "nsqd0",
            [
                "/nsqd", "--lookupd-tcp-address=nsqlookupd:4160",
                "--broadcast-address=nsqd0", "--data-path=/data",
            ],
        )  # fmt: skip
        return [
            _Service("nsqlookupd", lookupd, (4161,), lambda: _http_ready(4161)),
            _Service("nsqd0", nsqd, (4150, 4151), lambda: _http_ready(4151)),
        ]

    def _wait_registered(self) -> None:
        self._wait_nodes(1)

    @property
    def nsqd_addresses(self) -> list[str]:
        return [self.host_address("nsqd0", 4150)]
