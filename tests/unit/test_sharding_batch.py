"""``Sharder.partitions_for``: the batch form of ``partition_for`` (used by
``publish_many(sharding_keys=...)``) gives exactly the same partitions, key by key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ValidationError
from smartnsq.routing.sharding import INT64_MAX, INT64_MIN, Sharder

KEYS = st.lists(
    st.one_of(
        st.integers(INT64_MIN, INT64_MAX),
        st.integers(-5, 5),
        st.text(max_size=60),
        st.sampled_from(["a", "kunde-ü", "😀", "x" * 100]),
    ),
    max_size=50,
)


@given(keys=KEYS, partition_num=st.integers(1, 300))
@pytest.mark.parametrize("strategy", ["java", "murmur3"])
def test_same_partitions_as_one_by_one(
    strategy: str, keys: list[object], partition_num: int
) -> None:
    sharder = Sharder(strategy)  # type: ignore[arg-type]
    expected = [sharder.partition_for(k, partition_num) for k in keys]
    assert sharder.partitions_for(keys, partition_num) == expected


def test_custom_strategy_and_bytes() -> None:
    sharder = Sharder(lambda key, n: len(key) % n)
    assert sharder.partitions_for(["a", "bb", "ccc", b"dddd"], 3) == [1, 2, 0, 1]
    assert Sharder("murmur3").partitions_for([b"k", "k", 7], 5) == [
        Sharder("murmur3").partition_for(k, 5) for k in (b"k", "k", 7)
    ]


@pytest.mark.parametrize(
    ("keys", "index"),
    [([1, True], 1), ([1, 2**63], 1), (["a", 1.5], 1), ([b"raw"], 0), ([None], 0)],
)
def test_bad_keys_name_their_index(keys: list[object], index: int) -> None:
    with pytest.raises(ValidationError) as raised:
        Sharder("java").partitions_for(keys, 4)
    assert raised.value.field == f"sharding_keys[{index}]"


def test_partition_count_is_checked() -> None:
    with pytest.raises(ValidationError):
        Sharder().partitions_for([1], 0)
