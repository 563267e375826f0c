"""pytest plugin: ``nsq_cluster``, a started embedded NSQ cluster for each test.

Installed with smartnsq (entry point ``pytest11: smartnsq``)::

    import pytest

    async def test_publish(nsq_cluster):  # a youzan cluster of 3 nodes
        await nsq_cluster.create_topic("orders", 4, 2, channels=["billing"])
        ...

    @pytest.mark.nsq_cluster(nodes=1, classic=True)
    async def test_classic(nsq_cluster): ...

The marker takes :class:`smartnsq.testing.Cluster`'s arguments (``nodes``, ``classic``,
``lookupds``, ``failover_delay``, ``msg_timeout``...) and may be set on a test, a class or
a module (``pytestmark``); the closest one wins. The cluster is function-scoped and stopped
after the test. The fixture needs pytest-asyncio (strict or auto mode).

This module is imported by every pytest run where smartnsq is installed, so it imports
nothing but pytest; the fixture's module is loaded at configure time, the cluster when a
test asks for it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["MARKER", "cluster_from_marker"]

MARKER = "nsq_cluster"
_FIXTURES = "smartnsq.testing._pytest_fixtures"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(nodes=3, classic=False, lookupds=1, failover_delay=0.0, **options): "
        "configure the nsq_cluster fixture (smartnsq.testing.Cluster arguments)",
    )
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


class _WithoutAsyncio:
    """Stands in for the fixture when pytest-asyncio is missing or disabled: asking for it
    fails with a clear message instead of pytest's generic one."""

    @pytest.fixture
    def nsq_cluster(self) -> None:
        pytest.fail(
            "the nsq_cluster fixture needs pytest-asyncio (pip install pytest-asyncio)",
            pytrace=False,
        )


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
