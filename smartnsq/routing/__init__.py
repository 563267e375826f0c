"""Routing (pure, no I/O): which partition a publish goes to.

For now the sharding-key rules of the other NSQ SDKs (:mod:`smartnsq.routing.sharding`).
"""

from smartnsq.routing.sharding import (
    Sharder,
    ShardingFunc,
    ShardingStrategy,
    java_long_hash,
    java_partition,
    java_string_hash,
    key_bytes,
    murmur3_32,
)

__all__ = [
    "Sharder",
    "ShardingFunc",
    "ShardingStrategy",
    "java_long_hash",
    "java_partition",
    "java_string_hash",
    "key_bytes",
    "murmur3_32",
]
