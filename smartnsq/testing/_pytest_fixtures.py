"""The ``nsq_cluster`` fixture; the pytest plugin loads this module only when pytest-asyncio
is active (see ``smartnsq.testing.pytest_plugin``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from smartnsq.testing.pytest_plugin import cluster_from_marker

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["nsq_cluster"]


@pytest_asyncio.fixture
async def nsq_cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    """A started embedded NSQ cluster (youzan, 3 nodes unless the ``nsq_cluster`` marker
    says otherwise), stopped after the test."""
    cluster = cluster_from_marker(request)
    async with cluster:
        yield cluster
