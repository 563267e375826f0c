"""One SparkSession for the whole run (it takes 10-20 s to start), with the nsq data source
registered; the embedded cluster runs on its own loop thread (ThreadedCluster) because Spark's
calls block the test's thread while its workers talk to the cluster.

The master is ``local-cluster[2,1,1024]``: a standalone cluster of two workers, each running
an executor in a JVM of its own with its own Python workers, so what runs on the executors
(the offsets mode's reads) really runs outside the driver's processes (``SMARTNSQ_SPARK_MASTER``
overrides it, e.g. ``local[2]``).

These tests need pyspark, pyarrow (the dev extra) and a JVM; they fail, never skip, when one
is missing: CI must run them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.threaded_cluster import ThreadedCluster

# A Spark job's first run in a session starts Python workers; a shared 2-core machine can
# make that slow. Generous, but still bounded.
TIMEOUT = 300
MASTER = os.environ.get("SMARTNSQ_SPARK_MASTER", "local-cluster[2,1,1024]")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.timeout(TIMEOUT))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the Spark tests need a JVM: install a JDK 17 (java on PATH)", pytrace=False)
    # Workers must run this interpreter (the venv), not whatever "python3" is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # local-cluster's workers keep their executors' files here (by default: inside pyspark)
    work = tempfile.mkdtemp(prefix="smartnsq-spark-work-")
    os.environ["SPARK_WORKER_DIR"] = work
    from pyspark.sql import SparkSession

    import smartnsq.spark

    session = (
        SparkSession.builder.master(MASTER)
        .appName("smartnsq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    smartnsq.spark.register(session)
    session.dataSource.register(_discard_source())
    # Start the Python workers of the data source paths once, here, rather than in the
    # first test that writes.
    session.range(0, 2, 1, 2).write.format("discard").mode("append").save()
    try:
        yield session
    finally:
        session.stop()
        os.environ.pop("SPARK_WORKER_DIR", None)
        shutil.rmtree(work, ignore_errors=True)


def _discard_source() -> Any:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Writer(DataSourceArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class Discard(DataSource):
        @classmethod
        def name(cls) -> str:
            return "discard"

        def writer(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    return Discard


@dataclass(frozen=True)
class Subscription:
    """A TCP subscription the embedded nsqd accepted: who (IDENTIFY's client_id is
    ``host:pid``) and the command lines of that process and its ancestors, read while it ran."""

    node: int
    topic: str
    partition: int
    pid: int
    lineage: tuple[str, ...]


@pytest.fixture
def subscriptions(monkeypatch: pytest.MonkeyPatch) -> list[Subscription]:
    """Every SUB / SUB_ADVANCED / SUB_ORDERED the embedded cluster accepts during the test."""
    from smartnsq.testing.nsqd import ClientSession

    seen: list[Subscription] = []
    original = ClientSession._subscribe

    def subscribe(self: ClientSession, command: Any, kind: str) -> Any:
        answer = original(self, command, kind)
        channel = self.channel
        client_id = self.peer.client_id
        pid = int(client_id.rsplit(":", 1)[-1]) if ":" in client_id else -1
        if channel is not None:
            log_ = channel.log
            seen.append(
                Subscription(self.node.index, log_.topic_name, log_.partition, pid, _lineage(pid))
            )
        return answer

    monkeypatch.setattr(ClientSession, "_subscribe", subscribe)
    return seen


def _lineage(pid: int) -> tuple[str, ...]:
    """The command lines of ``pid`` and its ancestors (Linux /proc; empty elsewhere)."""
    lines = []
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        lines.append(cmdline.replace(b"\0", b" ").decode("utf-8", "replace"))
        parent = [line.split()[1] for line in status.splitlines() if line.startswith("PPid:")]
        pid = int(parent[0]) if parent else 0
    return tuple(lines)


@pytest.fixture
def youzan() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(nodes=2) as cluster:
        yield cluster


@pytest.fixture
def classic() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(classic=True) as cluster:
        yield cluster
