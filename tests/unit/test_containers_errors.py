"""smartnsq.testing.containers without a Docker engine: one clear error, no traceback of the
Docker SDK (the engine-backed tests are in tests/docker)."""

from __future__ import annotations

import pytest

from smartnsq.errors import ValidationError
from smartnsq.routing.addresses import AddressMap
from smartnsq.testing.containers import (
    ClassicContainerCluster,
    DockerUnavailableError,
    EmbeddedContainerCluster,
    YouzanContainerCluster,
    docker_unavailable_reason,
)

NOWHERE = "unix:///nonexistent/smartnsq-test-docker.sock"


def test_no_engine_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NOWHERE)
    reason = docker_unavailable_reason()
    assert reason is not None
    assert reason.startswith(f"no Docker engine answers at {NOWHERE}: ")
    assert "\n" not in reason
    for cluster in (
        EmbeddedContainerCluster(),
        YouzanContainerCluster(),
        ClassicContainerCluster(),
    ):
        with pytest.raises(DockerUnavailableError) as caught:
            cluster.open()
        assert str(caught.value) == reason
        assert caught.value.__cause__ is None
        cluster.close()  # nothing to remove, and no error


def test_images_come_from_arguments_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMARTNSQ_TEST_IMAGE", "smartnsq:env")
    monkeypatch.setenv("SMARTNSQ_YOUZAN_IMAGE", "youzan:env")
    monkeypatch.delenv("SMARTNSQ_ETCD_IMAGE", raising=False)
    monkeypatch.delenv("SMARTNSQ_CLASSIC_IMAGE", raising=False)
    assert EmbeddedContainerCluster().image == "smartnsq:env"
    assert EmbeddedContainerCluster(image="mine").image == "mine"
    youzan = YouzanContainerCluster(2)
    assert (youzan.image, youzan.etcd_image) == ("youzan:env", "quay.io/coreos/etcd:v3.4.33")
    assert youzan.node_names == ("nsqd0", "nsqd1")
    assert ClassicContainerCluster().image == "nsqio/nsq:v1.3.0"


def test_embedded_command_and_arguments() -> None:
    cluster = EmbeddedContainerCluster(
        2, classic=False, topics=["orders:4:2"], channels=["orders:billing"]
    )
    assert cluster.command[:4] == ["cluster", "--host", "0.0.0.0", "--lookupd-port"]
    assert "--broadcast-address" in cluster.command
    assert cluster.command[-2:] == ["--topic=orders:4:2", "--channel=orders:billing"]
    with pytest.raises(ValidationError):
        EmbeddedContainerCluster(0)
    with pytest.raises(ValidationError):
        YouzanContainerCluster(nodes=0)
    with pytest.raises(ValidationError):
        EmbeddedContainerCluster(startup_timeout=0)


def test_the_address_map_is_the_clusters_resolver() -> None:
    cluster = EmbeddedContainerCluster()
    assert isinstance(cluster.address_map, AddressMap)
    # Before it runs, nothing is published: addresses pass through unchanged.
    assert cluster.address_map.resolve("smartnsq:4162") == "smartnsq:4162"
