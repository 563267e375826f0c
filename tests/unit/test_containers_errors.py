"""smartnsq.testing.containers without a Docker engine: one clear error, no traceback of the
Docker SDK; the youzan command lines; a container that will never be ready diagnosed at once
(fake containers; the engine-backed tests are in tests/docker)."""

from __future__ import annotations

import time

import pytest

from smartnsq.errors import ValidationError
from smartnsq.routing.addresses import AddressMap
from smartnsq.testing import containers
from smartnsq.testing.containers import (
    ClassicContainerCluster,
    ContainerClusterError,
    DockerUnavailableError,
    EmbeddedContainerCluster,
    YouzanContainerCluster,
    _ContainerState,
    _diagnose,
    _Service,
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


# --------------------------------------------------------------------------- youzan flags


def test_youzan_tcp_addresses_have_an_empty_host() -> None:
    """youzan nsqlookupd registers the host of --tcp-address; 0.0.0.0 there makes it log "can
    not decide the broadcast ip" and never serve, so it must fall back to
    --broadcast-address (docker_real_images.txt)."""
    cluster = YouzanContainerCluster(2, allow_write_with_no_channels=True)
    lookupd = cluster.lookupd_command()
    assert "--tcp-address=:4160" in lookupd
    assert "--broadcast-address=nsqlookupd" in lookupd
    assert lookupd[-1] == "--allow-write-with-nochannels=true"
    for index in (0, 1):
        nsqd = cluster.nsqd_command(index)
        assert "--tcp-address=:4150" in nsqd
        assert f"--broadcast-address=nsqd{index}" in nsqd
        assert f"--worker-id={index + 1}" in nsqd
    assert not any(
        "0.0.0.0:41" in flag for flag in (*lookupd, *cluster.nsqd_command(0)) if "tcp" in flag
    )
    assert "--enable-v2=true" in cluster.etcd_command()


# --------------------------------------------------------------------------- failing fast


class _FakeWrapped:
    """The docker-py container a _Service wraps: a status, an exit code and a log."""

    def __init__(self, status: str, log: str, exit_code: int | None = None) -> None:
        self.status = status
        self.attrs: dict[str, object] = {"State": {"Status": status, "ExitCode": exit_code}}
        self.log = log
        self.reloads = 0

    def reload(self) -> None:
        self.reloads += 1

    def logs(self, tail: int = 0) -> bytes:
        lines = self.log.splitlines(keepends=True)
        return "".join(lines[-tail:] if tail else lines).encode()


class _FakeContainer:
    image = "youzan-nsq:test"

    def __init__(self, wrapped: _FakeWrapped) -> None:
        self._container = wrapped

    def get_wrapped_container(self) -> _FakeWrapped:
        return self._container


class _NeverReady:
    """A wait strategy whose probe never succeeds (it takes its whole timeout)."""

    def __init__(self) -> None:
        self.timeout = 0.0
        self.probes = 0

    def with_startup_timeout(self, timeout: float) -> _NeverReady:
        self.timeout = timeout
        return self

    def wait_until_ready(self, container: object) -> None:
        self.probes += 1
        time.sleep(self.timeout)
        raise TimeoutError("HTTP endpoint not ready within 1 seconds. Endpoint: ...")


def _waiting(wrapped: _FakeWrapped, startup_timeout: float) -> tuple[str, _NeverReady]:
    cluster = YouzanContainerCluster(startup_timeout=startup_timeout)
    service = _Service("nsqlookupd", _FakeContainer(wrapped), (4161,), _NeverReady)  # type: ignore[arg-type]
    strategy = _NeverReady()
    with pytest.raises(ContainerClusterError) as caught:
        cluster._wait(service, strategy)  # type: ignore[arg-type]
    return str(caught.value), strategy


NEVER_SERVES_LOG = (
    "".join(f"I1124 10:00:0{i}.000000 1 nsqlookupd.go:80] starting {i}\n" for i in range(12))
    + "E1124 10:00:09.000000 1 nsqlookupd.go:94] can not decide the broadcast ip: 0.0.0.0\n"
)


def test_a_container_that_says_it_will_never_serve_fails_at_once() -> None:
    text, strategy = _waiting(_FakeWrapped("running", NEVER_SERVES_LOG), 120)
    assert strategy.probes == 0  # no waiting for the 120 s of the startup timeout
    assert text.startswith("container nsqlookupd (youzan-nsq:test) is running but will never serve")
    assert "can not decide the broadcast ip: 0.0.0.0" in text  # the last lines of its log
    assert "starting 11" in text
    assert "starting 1 |" not in text  # only the last 10 lines
    assert "\n" not in text


def test_a_container_that_exited_fails_at_once_with_its_exit_code() -> None:
    wrapped = _FakeWrapped("exited", "FATAL: listen (0.0.0.0:4161) failed\n", exit_code=1)
    text, strategy = _waiting(wrapped, 120)
    assert strategy.probes == 0
    assert text == (
        "container nsqlookupd (youzan-nsq:test) exited with code 1 before it was ready; "
        "the last lines of its log: FATAL: listen (0.0.0.0:4161) failed"
    )


def test_a_silent_container_times_out_named_with_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containers, "_PROBE_STEP", 0.1)
    wrapped = _FakeWrapped("running", "I1124 nsqlookupd.go:80] waiting for etcd\n")
    text, strategy = _waiting(wrapped, 0.35)
    assert strategy.probes >= 3  # probed in steps, the container looked at before each
    assert wrapped.reloads == strategy.probes + 1
    assert text.startswith("container nsqlookupd (youzan-nsq:test) was not ready within 0.35 s ")
    assert "(HTTP endpoint not ready within 1 seconds. Endpoint: ...)" in text
    assert text.endswith("the last lines of its log: I1124 nsqlookupd.go:80] waiting for etcd")
    silent = _FakeWrapped("running", "")
    assert _waiting(silent, 0.1)[0].endswith("the last lines of its log: (empty)")


def test_diagnose() -> None:
    assert _diagnose(_ContainerState("running", None), "all fine\n") is None
    assert _diagnose(_ContainerState("created", None), "") is None
    assert _diagnose(_ContainerState("dead", None), "") == "exited before it was ready"
    assert "will never serve" in (
        _diagnose(_ContainerState("running", None), "CAN NOT DECIDE THE BROADCAST IP: 0.0.0.0")
        or ""
    )


def test_partition_names_a_node_of_an_open_cluster() -> None:
    cluster = YouzanContainerCluster(2)
    with pytest.raises(ValidationError, match="index"):
        cluster.partition(2)
    with pytest.raises(ContainerClusterError, match="no service 'nsqd0'"):
        cluster.partition(0)  # not opened: no containers yet
    with pytest.raises(ContainerClusterError, match="no service 'nsqd1'"):
        cluster.heal(1)
