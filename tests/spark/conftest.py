"""One local[2] SparkSession for the whole run (it takes 10-20 s to start), with the nsq data
source registered; the embedded cluster runs on its own loop thread (ThreadedCluster) because
Spark's calls block the test's thread while its workers talk to the cluster.

These tests need pyspark, pyarrow (the dev extra) and a JVM; they fail, never skip, when one
is missing: CI must run them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.threaded_cluster import ThreadedCluster

# A Spark job's first run in a session starts Python workers; a shared 2-core machine can
# make that slow. Generous, but still bounded.
TIMEOUT = 300


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
    from pyspark.sql import SparkSession

    import smartnsq.spark

    session = (
        SparkSession.builder.master("local[2]")
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


@pytest.fixture
def youzan() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(nodes=2) as cluster:
        yield cluster


@pytest.fixture
def classic() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(classic=True) as cluster:
        yield cluster
