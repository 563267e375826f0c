"""PySpark data source for NSQ (pyspark >= 4.2 and pyarrow: ``pip install 'smartnsq[spark]'``).

``smartnsq.spark.register(spark)`` registers the data source ``nsq``:

* ``df.write.format("nsq").mode("append")`` and ``df.writeStream.format("nsq")`` publish a
  DataFrame's rows (``body``, optional ``sharding_key`` / ``partition``, ``trace_id``,
  ``ext``, ``delay_ms``, ``topic``) with the Producer's placement;
* ``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")`` read a topic. On youzan
  (the offsets mode) the executors read ranges of queue offsets, exactly-once into an
  idempotent sink; on classic nsqd (or ``mode=hold`` / ``journal=``) a consumer on the driver
  feeds a stream that finishes a message only once it is safe (at-least-once).

Guide: docs/guides/spark.md. ``import smartnsq`` never imports pyspark or pyarrow; this
package does.
"""

from __future__ import annotations

from smartnsq.spark.datasource import NsqDataSource, register

__all__ = ["NsqDataSource", "register"]
