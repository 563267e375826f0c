"""docker-compose.yml: it validates, and its embedded profile comes up, takes a publish and
a consume through the addresses it announces (127.0.0.1:4161...), and goes away."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smartnsq import sync

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="no docker-compose on PATH")
PORTS = range(4161, 4168)  # the embedded profile's fixed host ports


def compose(*args: str, project: str, image: str, timeout: float = 120) -> str:
    if COMPOSE is None:
        raise RuntimeError("no docker-compose")
    done = subprocess.run(
        [COMPOSE, "-f", str(ROOT / "docker-compose.yml"), "-p", project, *args],
        env={**os.environ, "SMARTNSQ_IMAGE": image},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stderr}"
    return done.stdout


@needs_compose
@pytest.mark.parametrize("profiles", [(), ("classic",), ("embedded",), ("classic", "embedded")])
def test_the_file_validates(profiles: tuple[str, ...], embedded_image: str) -> None:
    options = [f"--profile={p}" for p in profiles]
    compose(*options, "config", "-q", project="smartnsq-validate", image=embedded_image)


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def embedded_profile(embedded_image: str) -> Iterator[str]:
    taken = [p for p in PORTS if _port_taken(p)]
    assert not taken, f"the embedded profile publishes ports {list(PORTS)}; in use: {taken}"
    project = f"smartnsq-test-{uuid.uuid4().hex[:8]}"
    try:
        compose("--profile=embedded", "up", "-d", "smartnsq", project=project, image=embedded_image)
        yield project
    finally:
        compose("--profile=embedded", "down", "-v", project=project, image=embedded_image)
    _assert_nothing_left(project)


def _assert_nothing_left(project: str) -> None:
    import docker

    client = docker.from_env()
    try:
        selector = {"label": f"com.docker.compose.project={project}"}
        assert client.containers.list(all=True, filters=selector) == []
        assert client.networks.list(filters=selector) == []
        assert client.volumes.list(filters=selector) == []
    finally:
        client.close()


def _wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/lookup", params={"topic": "orders"}, timeout=2).is_success:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer within {timeout} s")
        time.sleep(0.2)


@needs_compose
def test_embedded_profile_publish_and_consume(embedded_profile: str) -> None:
    lookupd = "http://127.0.0.1:4161"
    _wait_ready(lookupd)
    with sync.Producer(lookupd=[lookupd]) as producer:
        result = producer.publish("orders", b"through compose", sharding_key=7)
    assert result.address in {f"127.0.0.1:{port}" for port in (4162, 4164, 4166)}

    received: list[bytes] = []
    got = threading.Event()

    def handle(message: sync.Message) -> None:
        received.append(message.body)
        got.set()

    # max_in_flight >= the 4 partitions: every connection may receive at once.
    with sync.Consumer(
        "orders", "billing", lookupd=[lookupd], handler=handle, max_in_flight=10
    ) as consumer:
        runner = threading.Thread(target=consumer.run)
        runner.start()
        assert got.wait(20)
        consumer.close()
        runner.join(20)
    assert received == [b"through compose"]
