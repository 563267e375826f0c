"""The pytest plugin (entry point ``pytest11: smartnsq``): the ``nsq_cluster`` fixture and
marker, run by a separate pytest through ``pytester`` so the installed entry point is what
loads it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

AUTO = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""

STRICT = AUTO.replace("auto", "strict")

USES_THE_FIXTURE = """
import asyncio

import pytest

from smartnsq.testing import Cluster

seen = []


async def _identify(address):
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"  V2IDENTIFY\\n" + len(b"{}").to_bytes(4, "big") + b"{}")
    await writer.drain()
    frame = await asyncio.wait_for(reader.readexactly(10), 5)
    writer.close()
    await writer.wait_closed()
    return frame


async def test_default_is_a_started_youzan_cluster_of_3(nsq_cluster):
    assert isinstance(nsq_cluster, Cluster)
    assert (len(nsq_cluster.nodes), nsq_cluster.classic, len(nsq_cluster.lookupds)) == (3, False, 1)
    await nsq_cluster.create_topic("orders", 2, 2, channels=["billing"])
    assert nsq_cluster.topology("orders")[0]["writable"]
    ok_frame = (6).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"OK"
    assert await _identify(nsq_cluster.nsqd_addresses[0]) == ok_frame
    seen.append(nsq_cluster)


async def test_each_test_gets_a_new_cluster_and_the_last_one_was_stopped(nsq_cluster):
    assert seen and seen[0] is not nsq_cluster
    with pytest.raises(OSError):
        await _identify(seen[0].nsqd_addresses[0])


@pytest.mark.nsq_cluster(nodes=1, classic=True)
async def test_marker_classic(nsq_cluster):
    assert nsq_cluster.classic
    assert len(nsq_cluster.nodes) == 1


@pytest.mark.nsq_cluster(2, lookupds=2, failover_delay=0.5, msg_timeout=5.0)
async def test_marker_options(nsq_cluster):
    assert len(nsq_cluster.nodes) == 2
    assert len(nsq_cluster.lookupds) == 2
    assert nsq_cluster.failover_delay == 0.5
    assert nsq_cluster.settings.msg_timeout == 5.0


@pytest.mark.nsq_cluster(nodes=4)
class TestClassMarker:
    async def test_class_marker(self, nsq_cluster):
        assert len(nsq_cluster.nodes) == 4

    @pytest.mark.nsq_cluster(nodes=1)
    async def test_closest_marker_wins(self, nsq_cluster):
        assert len(nsq_cluster.nodes) == 1
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=50)


def test_fixture_in_strict_mode(pytester: pytest.Pytester) -> None:
    pytester.makeini(STRICT)
    pytester.makepyfile(
        test_strict="""
        import pytest

        @pytest.mark.asyncio
        @pytest.mark.nsq_cluster(nodes=1)
        async def test_strict(nsq_cluster):
            assert len(nsq_cluster.nodes) == 1
            await nsq_cluster.create_topic("t", 1, 1)
        """
    )
    _run(pytester).assert_outcomes(passed=1)


def test_bad_marker_arguments_fail_the_test_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makeini(AUTO)
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.nsq_cluster(node=3)
        async def test_typo(nsq_cluster):
            pass

        @pytest.mark.nsq_cluster(nodes=0)
        async def test_invalid(nsq_cluster):
            pass
        """
    )
    result = _run(pytester)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.nsq_cluster: got an unexpected keyword argument 'node'*",
            "*@pytest.mark.nsq_cluster: nodes: must be >= 1*",
        ]
    )


def test_a_failing_simulation_says_its_seed_and_the_command_that_replays_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini(AUTO)
    pytester.makepyfile(
        test_sim="""
        import asyncio
        import random

        import pytest

        async def draw(sim):
            await asyncio.sleep(10)
            return random.random()

        @pytest.mark.nsq_sim(seed=41)
        def test_fails(nsq_sim):
            assert nsq_sim.run(draw) < 0

        def test_from_the_id(nsq_sim):
            assert nsq_sim.seed > 0

        async def test_async(nsq_sim):
            pass
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*nsq_sim fixture runs its own event loop: use it in a plain def test*",
            "*seed 41; replay: pytest 'test_sim.py::test_fails' --sim-seed 41*",
        ]
    )
    replayed = _run(pytester, "--sim-seed", "5", "-k", "test_fails")
    replayed.stdout.fnmatch_lines(["*seed 5; replay:*--sim-seed 5*"])


USES_THE_PROXIES = """
import asyncio

import pytest

import smartnsq
from smartnsq.testing.faults import ClusterProxies, FaultProxy

seen = []


async def test_proxies_before_every_node(nsq_cluster, nsq_fault_proxies):
    assert isinstance(nsq_fault_proxies, ClusterProxies)
    assert len(nsq_fault_proxies) == 3
    assert nsq_fault_proxies.nsqd_http == []
    await nsq_cluster.create_topic("t", 1, 1, channels=["c"])
    async with smartnsq.Producer(
        lookupd=[nsq_cluster.lookupd_url], address_map=nsq_fault_proxies.address_map
    ) as producer:
        result = await producer.publish("t", b"x")
    assert result.address in nsq_fault_proxies.nsqd_addresses
    nsq_fault_proxies[0].blackhole()  # left on: the fixture closes it
    seen.append(nsq_fault_proxies)


async def test_the_last_ones_were_closed(nsq_fault_proxies):
    assert seen and all(p.stats().open == 0 for p in seen[0].all)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", seen[0][0].port)


@pytest.mark.nsq_cluster(classic=True)
@pytest.mark.nsq_fault_proxies(http=True, lookupd=True, seed=3)
async def test_marker(nsq_cluster, nsq_fault_proxies):
    assert len(nsq_fault_proxies.all) == 3
    assert nsq_fault_proxies.lookupd_urls != nsq_cluster.lookupd_urls


async def test_factory(nsq_cluster, fault_proxy):
    proxy = await fault_proxy(nsq_cluster.nsqd_addresses[1], seed=9)
    assert isinstance(proxy, FaultProxy)
    assert (proxy.upstream, proxy.seed) == (nsq_cluster.nsqd_addresses[1], 9)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    await proxy.wait_for(lambda: proxy.stats().open == 1)
    writer.close()
"""


@pytest.mark.parametrize(
    ("module", "tests"), [(USES_THE_FIXTURE, 6), (USES_THE_PROXIES, 4)], ids=["cluster", "proxies"]
)
def test_fixtures_and_markers_in_auto_mode(
    pytester: pytest.Pytester, module: str, tests: int
) -> None:
    pytester.makeini(AUTO)
    pytester.makepyfile(test_uses=module)
    result = _run(pytester, "-v", "--strict-markers", "-W", "error")
    result.assert_outcomes(passed=tests)


def test_bad_proxies_marker_fails_the_test_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makeini(AUTO)
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.nsq_fault_proxies(htp=True)
        async def test_typo(nsq_fault_proxies):
            pass
        """
    )
    result = _run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.nsq_fault_proxies: got an unexpected keyword argument 'htp'*"]
    )


def test_runs_that_do_not_use_it_are_unaffected(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    # Strict markers and warnings as errors, without pytest-asyncio and then with it (which
    # wants its loop scope configured, or warns itself).
    _run(pytester, "-p", "no:asyncio", "--strict-markers", "-W", "error").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    _run(pytester, "--strict-markers", "-W", "error").assert_outcomes(passed=1)


def test_without_pytest_asyncio_the_fixture_explains_itself(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_async="async def test_wants_it(nsq_cluster):\n    pass\n")
    result = _run(pytester, "-p", "no:asyncio")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*the nsq_cluster fixture needs pytest-asyncio*"])
    pytester.makepyfile(test_async="def test_wants_it(fault_proxy):\n    pass\n")
    result = _run(pytester, "-p", "no:asyncio")
    result.stdout.fnmatch_lines(["*the fault_proxy fixture needs pytest-asyncio*"])


SYNC_TESTS = """
import threading

import pytest

import smartnsq.sync
from smartnsq.testing import Cluster, ClusterError

seen = []


@pytest.mark.nsq_cluster(classic=True)
def test_blocking_code_reaches_the_cluster(nsq_cluster):
    with smartnsq.sync.Producer(nsqd=nsq_cluster.nsqd_addresses, connect_timeout=5) as producer:
        producer.publish("events", b"hello")


def test_a_plain_test_gets_a_running_cluster(nsq_cluster):
    assert isinstance(nsq_cluster, Cluster)
    nsq_cluster.call_from_thread(nsq_cluster.create_topic("orders", 2, 1, channels=["c"]))
    with smartnsq.sync.Producer(lookupd=[nsq_cluster.lookupd_url]) as producer:
        assert producer.publish("orders", b"hello", partition=1).partition == 1
    bodies = nsq_cluster.call_from_thread(lambda: [r.body for r in nsq_cluster.messages("orders")])
    assert bodies == [b"hello"]
    received = []
    with smartnsq.sync.Consumer(
        "orders", "c", lookupd=[nsq_cluster.lookupd_url], handler=received.append
    ) as consumer:
        nsq_cluster.call_from_thread(
            nsq_cluster.wait_for(lambda: nsq_cluster.unfinished("orders", "c") == 0, 10)
        )
    assert [m.body for m in received] == [b"hello"]
    seen.append(nsq_cluster)


@pytest.mark.nsq_cluster(nodes=1, classic=True)
def test_the_last_one_was_stopped_and_the_marker_applies(nsq_cluster):
    assert nsq_cluster.classic and len(nsq_cluster.nodes) == 1
    with pytest.raises(ClusterError, match="not running"):
        seen[0].call_from_thread(lambda: None)
    assert [t.name for t in threading.enumerate()].count("nsq_cluster") == 1


async def test_an_async_test_still_gets_its_own_loop(nsq_cluster):
    await nsq_cluster.create_topic("t", 1, 1)
    with pytest.raises(ClusterError, match="own event loop"):
        nsq_cluster.call_from_thread(nsq_cluster.create_topic("u", 1, 1))
"""


@pytest.mark.parametrize("mode", ["auto", "strict", "without pytest-asyncio"])
def test_a_plain_def_test_gets_a_cluster_on_a_loop_thread(
    pytester: pytest.Pytester, mode: str
) -> None:
    """Blocking code under test (smartnsq.sync clients) needs the cluster's loop to run
    while the test blocks: it runs in a thread of its own (issue 34: the cluster never
    answered, "no nsqlookupd answered" after 5 s)."""
    module = SYNC_TESTS
    args: tuple[str, ...] = ()
    if mode == "auto":
        pytester.makeini(AUTO)
    elif mode == "strict":
        pytester.makeini(STRICT)
        module = module.replace("\nasync def", "\n@pytest.mark.asyncio\nasync def")
    else:
        args = ("-p", "no:asyncio")
        module = module[: module.index("\nasync def")]
    pytester.makepyfile(test_sync=module)
    result = _run(pytester, "-v", "-W", "error", *args)
    result.assert_outcomes(passed=3 if mode == "without pytest-asyncio" else 4)


def test_the_proxies_fixtures_fail_at_once_in_a_plain_def_test(pytester: pytest.Pytester) -> None:
    pytester.makeini(AUTO)
    pytester.makepyfile(
        test_sync="""
        def test_proxies(nsq_fault_proxies):
            pass

        def test_factory(fault_proxy):
            pass
        """
    )
    result = _run(pytester, "--durations=0")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*the nsq_fault_proxies fixture needs an async test (async def test_...)*",
            "*the fault_proxy fixture needs an async test (async def test_...)*",
        ]
    )


def test_the_plugin_is_cheap_to_import() -> None:
    code = (
        "import sys; import smartnsq.testing.pytest_plugin; "
        "print(sorted(m for m in ('asyncio', 'smartnsq.testing.cluster', 'httpx') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "[]"
