"""tests/docker: against a real Docker engine (``.ci/docker-engine`` starts one in CI).

Every test here is marked ``docker``. Without an engine they are all skipped with one reason;
with one, the session ends by checking that no container or network it created is left.
With ``$SMARTNSQ_REQUIRE_DOCKER`` set (CI) a missing engine is an error instead.
The smartnsq image comes from ``$SMARTNSQ_TEST_IMAGE`` (CI builds it); the youzan and classic
clusters run only when ``$SMARTNSQ_YOUZAN_IMAGE`` / ``$SMARTNSQ_CLASSIC_IMAGE`` name images.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartnsq.testing.containers import (
    DEFAULT_EMBEDDED_IMAGE,
    ENV_EMBEDDED_IMAGE,
    docker_unavailable_reason,
)

HERE = Path(__file__).parent
_REASON: list[str | None] = []


def unavailable() -> str | None:
    if not _REASON:
        _REASON.append(docker_unavailable_reason())
    return _REASON[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if Path(str(item.fspath)).is_relative_to(HERE)]
    if not mine:
        return
    reason = unavailable()
    if reason is not None and os.environ.get("SMARTNSQ_REQUIRE_DOCKER"):
        raise pytest.UsageError(f"$SMARTNSQ_REQUIRE_DOCKER is set, but {reason}")
    for item in mine:
        item.add_marker(pytest.mark.docker)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def embedded_image() -> str:
    return os.environ.get(ENV_EMBEDDED_IMAGE) or DEFAULT_EMBEDDED_IMAGE


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """After the session: nothing that this session's testcontainers created is left."""
    yield
    if unavailable() is not None:
        return
    import docker
    from testcontainers.core.labels import LABEL_SESSION_ID, SESSION_ID

    client = docker.from_env()
    try:
        selector = {"label": f"{LABEL_SESSION_ID}={SESSION_ID}"}
        containers = [c.name for c in client.containers.list(all=True, filters=selector)]
        networks = [n.name for n in client.networks.list(filters=selector)]
    finally:
        client.close()
    assert containers == [], f"containers left behind: {containers}"
    assert networks == [], f"networks left behind: {networks}"
