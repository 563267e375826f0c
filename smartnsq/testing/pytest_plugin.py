"""pytest plugin: ``nsq_cluster``, a started embedded NSQ cluster for each test.

Installed with smartnsq (entry point ``pytest11: smartnsq``)::

    import pytest

    async def test_publish(nsq_cluster):  # a youzan cluster of 3 nodes
        await nsq_cluster.create_topic("orders", 4, 2, channels=["billing"])
        ...

    @pytest.mark.nsq_cluster(nodes=1, classic=True)
    async def test_classic(nsq_cluster): ...

Dockerized clusters (:mod:`smartnsq.testing.containers`): the ``nsq_docker_cluster`` fixture
is a started container cluster for each test, removed after it::

    @pytest.mark.nsq_docker("embedded", topics=["orders:4:2"], channels=["orders:billing"])
    def test_in_docker(nsq_docker_cluster):
        producer = nsq_docker_cluster.producer()  # wired with the cluster's address map
        ...

Fault proxies (:mod:`smartnsq.testing.faults`): ``nsq_fault_proxies`` puts one in front of
every nsqd of ``nsq_cluster`` and gives the clients' ``address_map``; ``fault_proxy`` is a
factory of proxies to any ``host:port``; both are closed after the test::

    async def test_blackhole(nsq_cluster, nsq_fault_proxies):
        producer = smartnsq.Producer(
            lookupd=[nsq_cluster.lookupd_url], address_map=nsq_fault_proxies.address_map
        )
        nsq_fault_proxies[0].blackhole()  # node 0 goes silent
        ...

    @pytest.mark.nsq_fault_proxies(http=True, lookupd=True, seed=7)
    async def test_more(nsq_fault_proxies): ...

    async def test_one(nsq_cluster, fault_proxy):
        proxy = await fault_proxy(nsq_cluster.nsqd_addresses[0], seed=1)

``nsq_docker(kind, **options)``: kind ``"embedded"`` (default: the smartnsq image,
``$SMARTNSQ_TEST_IMAGE``), ``"youzan"`` (``$SMARTNSQ_YOUZAN_IMAGE``, ``$SMARTNSQ_ETCD_IMAGE``)
or ``"classic"`` (``$SMARTNSQ_CLASSIC_IMAGE``); options go to the cluster class. Without a
Docker engine the tests that use it are skipped, with the reason.

The marker takes :class:`smartnsq.testing.Cluster`'s arguments (``nodes``, ``classic``,
``lookupds``, ``failover_delay``, ``msg_timeout``...) and may be set on a test, a class or
a module (``pytestmark``); the closest one wins. The cluster is function-scoped and stopped
after the test. An ``async def`` test gets a cluster on its own event loop, which needs
pytest-asyncio (strict or auto mode). A plain ``def`` test (blocking code under test, such
as ``smartnsq.sync`` clients) gets one on an event loop in a thread of its own, which runs
while the test blocks: the test calls the cluster's coroutines (and anything that changes
it) through :meth:`~smartnsq.testing.Cluster.call_from_thread`::

    def test_blocking(nsq_cluster):
        nsq_cluster.call_from_thread(nsq_cluster.create_topic("orders", 1, 1, channels=["c"]))
        with smartnsq.sync.Producer(lookupd=[nsq_cluster.lookupd_url]) as producer:
            producer.publish("orders", b"x")

The fault proxies' fixtures need an ``async def`` test (their proxies run on its loop).

Deterministic simulation (:mod:`smartnsq.testing.sim`): ``nsq_sim`` is a
:class:`~smartnsq.testing.sim.harness.Simulation` for a plain ``def`` test, which runs its
own coroutine in it (``nsq_sim.run(main)``) on virtual time; its seed comes from
``--sim-seed N``, else the ``nsq_sim(seed=N)`` marker, else the test's id. A failing test
says its seed and the command that replays it::

    def test_my_handler_under_faults(nsq_sim):
        async def main(sim):
            async with Cluster(nodes=4) as cluster:
                ...
        nsq_sim.run(main)

``--sim-runs N`` is for tests that run many seeds (read it with
``request.config.getoption("sim_runs")``).

This module is imported by every pytest run where smartnsq is installed, so it imports
nothing but pytest; the fixture's module is loaded at configure time, the cluster when a
test asks for it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from smartnsq.testing.cluster import Cluster
    from smartnsq.testing.containers import ContainerCluster
    from smartnsq.testing.faults import ClusterProxies
    from smartnsq.testing.sim.harness import Simulation

__all__ = [
    "DOCKER_MARKER",
    "MARKER",
    "PROXIES_MARKER",
    "SIM_MARKER",
    "async_test_only",
    "cluster_from_marker",
    "cluster_in_a_thread",
    "docker_cluster_from_marker",
    "is_async_test",
    "proxies_from_marker",
]

MARKER = "nsq_cluster"
DOCKER_MARKER = "nsq_docker"
PROXIES_MARKER = "nsq_fault_proxies"
SIM_MARKER = "nsq_sim"
_SIM_SEED = pytest.StashKey[int]()
_FIXTURES = "smartnsq.testing._pytest_fixtures"
# Seconds a plain def test's cluster may take to start or stop on its loop thread.
_THREAD_TIMEOUT = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("smartnsq")
    group.addoption(
        "--sim-seed",
        type=int,
        default=None,
        help="run this simulation seed (the nsq_sim fixture's, and smartnsq's own "
        "simulation tests: that seed only), to replay a failure",
    )
    group.addoption(
        "--sim-runs",
        type=int,
        default=None,
        help="how many seeds a test that runs many simulations runs",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(nodes=3, classic=False, lookupds=1, failover_delay=0.0, **options): "
        "configure the nsq_cluster fixture (smartnsq.testing.Cluster arguments)",
    )
    config.addinivalue_line(
        "markers",
        f"{PROXIES_MARKER}(http=False, lookupd=False, seed=None): configure the "
        "nsq_fault_proxies fixture (smartnsq.testing.faults.cluster_proxies arguments)",
    )
    config.addinivalue_line(
        "markers",
        f"{DOCKER_MARKER}(kind='embedded', **options): configure the nsq_docker_cluster fixture "
        "(embedded, youzan or classic; options of smartnsq.testing.containers' classes)",
    )
    config.addinivalue_line(
        "markers",
        f"{SIM_MARKER}(seed=None, latency=0.0002): configure the nsq_sim fixture "
        "(smartnsq.testing.sim.Simulation arguments; --sim-seed wins over the seed)",
    )
    config.pluginmanager.register(_DockerFixtures(), "smartnsq-nsq-docker")
    config.pluginmanager.register(_SimFixtures(), "smartnsq-nsq-sim")
    if _asyncio_plugin_active(config):
        config.pluginmanager.import_plugin(_FIXTURES)
    else:
        config.pluginmanager.register(_WithoutAsyncio(), "smartnsq-nsq-cluster")


def _asyncio_plugin_active(config: pytest.Config) -> bool:
    # By module rather than by name: "-p pytest_asyncio" registers it under another name.
    return any(
        getattr(plugin, "__name__", None) == "pytest_asyncio.plugin"
        for plugin in config.pluginmanager.get_plugins()
    )


def _needs_asyncio(name: str) -> None:
    pytest.fail(
        f"the {name} fixture needs pytest-asyncio (pip install pytest-asyncio)", pytrace=False
    )


def is_async_test(request: pytest.FixtureRequest) -> bool:
    """Whether the test asking for a fixture is an ``async def`` (run on an event loop of
    pytest-asyncio's) rather than a plain function."""
    return inspect.iscoroutinefunction(request.function)


def async_test_only(request: pytest.FixtureRequest, name: str) -> None:
    """Fail at once when a plain ``def`` test asks for ``name``, whose servers run on the
    test's event loop: nothing runs that loop while such a test blocks."""
    if not is_async_test(request):
        pytest.fail(
            f"the {name} fixture needs an async test (async def test_...): its proxies run "
            "on the test's event loop; a plain def test gets nsq_cluster on a loop thread of "
            "its own, without proxies",
            pytrace=False,
        )


def cluster_in_a_thread(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The ``nsq_cluster`` of a plain ``def`` test: started on an event loop in a thread of
    its own (blocking code under test waits on the cluster, whose loop must run meanwhile),
    stopped and the thread ended after the test."""
    import asyncio
    import threading

    cluster = cluster_from_marker(request)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="nsq_cluster", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(cluster.start(), loop).result(_THREAD_TIMEOUT)
        try:
            yield cluster
        finally:
            asyncio.run_coroutine_threadsafe(cluster.stop(), loop).result(_THREAD_TIMEOUT)
            asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(
                _THREAD_TIMEOUT
            )
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_THREAD_TIMEOUT)
        if not thread.is_alive():
            loop.close()


class _WithoutAsyncio:
    """Stands in for the fixtures when pytest-asyncio is missing or disabled: a plain
    ``def`` test gets its cluster all the same (on a loop thread); asking for an async
    fixture fails with a clear message instead of pytest's generic one."""

    @pytest.fixture
    def nsq_cluster(self, request: pytest.FixtureRequest) -> Iterator[Cluster]:
        if is_async_test(request):
            _needs_asyncio("nsq_cluster")
        yield from cluster_in_a_thread(request)

    @pytest.fixture
    def nsq_fault_proxies(self) -> None:
        _needs_asyncio("nsq_fault_proxies")

    @pytest.fixture
    def fault_proxy(self) -> None:
        _needs_asyncio("fault_proxy")


def cluster_from_marker(request: pytest.FixtureRequest) -> Cluster:
    """A (not yet started) Cluster configured by the closest ``nsq_cluster`` marker."""
    from smartnsq.errors import ValidationError
    from smartnsq.testing.cluster import Cluster

    marker = request.node.get_closest_marker(MARKER)
    args: tuple[Any, ...] = marker.args if marker is not None else ()
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    try:
        inspect.signature(Cluster).bind(*args, **kwargs)
        return Cluster(*args, **kwargs)
    except (TypeError, ValidationError) as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)


def proxies_from_marker(request: pytest.FixtureRequest, cluster: Cluster) -> ClusterProxies:
    """(Not yet started) fault proxies before ``cluster``, configured by the closest
    ``nsq_fault_proxies`` marker."""
    from smartnsq.testing.faults import cluster_proxies

    marker = request.node.get_closest_marker(PROXIES_MARKER)
    args: tuple[Any, ...] = marker.args if marker is not None else ()
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    try:
        inspect.signature(cluster_proxies).bind(cluster, *args, **kwargs)
    except TypeError as exc:
        pytest.fail(f"@pytest.mark.{PROXIES_MARKER}: {exc}", pytrace=False)
    return cluster_proxies(cluster, *args, **kwargs)


class _DockerFixtures:
    """The ``nsq_docker_cluster`` fixture (blocking: usable from sync and async tests)."""

    _unavailable: str | bool | None = False  # False: not asked yet

    @pytest.fixture
    def nsq_docker_cluster(self, request: pytest.FixtureRequest) -> Iterator[ContainerCluster]:
        """A started dockerized NSQ cluster configured by the ``nsq_docker`` marker; skipped
        when no Docker engine answers, removed (containers and network) after the test."""
        from smartnsq.testing.containers import docker_unavailable_reason

        if self._unavailable is False:
            _DockerFixtures._unavailable = docker_unavailable_reason()  # once per session
        if isinstance(self._unavailable, str):
            pytest.skip(self._unavailable)
        cluster = docker_cluster_from_marker(request)
        with cluster:
            yield cluster


def docker_cluster_from_marker(request: pytest.FixtureRequest) -> ContainerCluster:
    """A (not yet opened) container cluster configured by the closest ``nsq_docker`` marker."""
    from smartnsq.errors import ValidationError
    from smartnsq.testing import containers

    marker = request.node.get_closest_marker(DOCKER_MARKER)
    args: tuple[Any, ...] = marker.args if marker is not None else ()
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    kind = args[0] if args else kwargs.pop("kind", "embedded")
    classes: dict[str, type[containers.ContainerCluster]] = {
        "embedded": containers.EmbeddedContainerCluster,
        "youzan": containers.YouzanContainerCluster,
        "classic": containers.ClassicContainerCluster,
    }
    cls = classes.get(kind)
    if cls is None or len(args) > 1:
        pytest.fail(
            f"@pytest.mark.{DOCKER_MARKER}: the kind is one of {', '.join(classes)}, "
            f"then keyword options; got {args!r}",
            pytrace=False,
        )
    try:
        inspect.signature(cls).bind(**kwargs)
        return cls(**kwargs)
    except (TypeError, ValidationError) as exc:
        pytest.fail(f"@pytest.mark.{DOCKER_MARKER}: {exc}", pytrace=False)


class _SimFixtures:
    """The ``nsq_sim`` fixture, and the seed a failing test reports."""

    @pytest.fixture
    def nsq_sim(self, request: pytest.FixtureRequest) -> Simulation:
        """A :class:`Simulation` seeded by ``--sim-seed``, the ``nsq_sim`` marker or the
        test's id (the same test, the same seed, run after run)."""
        import zlib

        from smartnsq.testing.sim.harness import Simulation

        if is_async_test(request):
            pytest.fail(
                "the nsq_sim fixture runs its own event loop: use it in a plain def test",
                pytrace=False,
            )
        marker = request.node.get_closest_marker(SIM_MARKER)
        kwargs: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
        seed = request.config.getoption("sim_seed")
        if seed is None:
            seed = kwargs.get("seed")
        if seed is None:
            seed = zlib.crc32(request.node.nodeid.encode())
        kwargs.pop("seed", None)
        try:
            inspect.signature(Simulation).bind(seed, **kwargs)
        except TypeError as exc:
            pytest.fail(f"@pytest.mark.{SIM_MARKER}: {exc}", pytrace=False)
        request.node.stash[_SIM_SEED] = seed
        return Simulation(seed, **kwargs)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[None]:
        outcome = yield
        report = outcome.get_result()  # type: ignore[attr-defined]
        seed = item.stash.get(_SIM_SEED, None)
        if seed is not None and report.failed:
            report.sections.append(
                (
                    "simulation",
                    f"seed {seed}; replay: pytest '{item.nodeid}' --sim-seed {seed}",
                )
            )
