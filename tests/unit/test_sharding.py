"""Sharding keys to partitions: Java SDK and go-nsq/murmur3 rules, checked against published
vectors and against independent reference implementations written here from the specs."""

import os
import subprocess
import sys
from enum import Enum, IntEnum

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ValidationError
from smartnsq.routing import (
    Sharder,
    java_long_hash,
    java_partition,
    java_string_hash,
    key_bytes,
    murmur3_32,
)
from smartnsq.routing.sharding import _CHUNK, _SHORT

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# --------------------------------------------------------------------------- references
# Written from the Java Language Specification / MurmurHash3 description, deliberately
# naive (one step at a time, explicit wrap-around), sharing no code with smartnsq.


def ref_i32(x: int) -> int:
    """Two's complement wrap to a Java int."""
    x &= 0xFFFFFFFF
    return x - 2**32 if x >= 2**31 else x


def ref_utf16_units(s: str) -> list[int]:
    """UTF-16 code units computed by hand (no codec), lone surrogates kept as one unit."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    return units


def ref_string_hash(s: str) -> int:
    h = 0
    for unit in ref_utf16_units(s):
        h = ref_i32(ref_i32(31 * h) + unit)
    return h


def ref_long_hash(v: int) -> int:
    u = v & 0xFFFFFFFFFFFFFFFF  # the long's bits
    return ref_i32(u ^ (u >> 32))  # >>> on the bits, then the (int) cast keeps the low 32


def ref_java_rem(a: int, b: int) -> int:
    """Java int ``a % b``: the quotient truncates toward zero (JLS 15.17.3)."""
    q = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        q = -q
    return a - q * b


def ref_java_abs(a: int) -> int:
    """Java ``Math.abs(int)``: -(-2**31) overflows back to -2**31."""
    return ref_i32(-a) if a < 0 else a


def ref_java_partition(h: int, n: int) -> int:
    return ref_java_abs(ref_java_rem(h, n))


def ref_murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 (Austin Appleby's algorithm), written from its description."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix_k(k: int) -> int:
        k = (k * c1) & mask
        k = rotl(k, 15)
        return (k * c2) & mask

    h = seed
    nblocks = len(data) // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        h ^= mix_k(k)
        h = rotl(h, 13)
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[4 * nblocks :]
    if tail:
        h ^= mix_k(int.from_bytes(tail, "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


# --------------------------------------------------------------------------- vectors

JAVA_STRING_VECTORS = [
    # Printed by OpenJDK 17 (jshell): "...".hashCode()
    ("", 0),
    ("a", 97),
    ("abc", 96354),
    ("hello", 99162322),
    ("Hello World", -862545276),
    ("é", 233),
    ("中文", 646394),
    ("\U0001f600", 1772899),  # one emoji = surrogate pair D83D DE00 = two code units
    ("polygenelubricants", -(2**31)),  # the classic key whose hash is Integer.MIN_VALUE
]

JAVA_LONG_VECTORS = [
    # Long.valueOf(v).hashCode()
    (0, 0),
    (1, 1),
    (-1, 0),
    (2**32, 1),
    (-(2**32), -1),
    (INT64_MIN, -(2**31)),
    (INT64_MAX, -(2**31)),
    (INT32_MAX, INT32_MAX),
    (INT32_MIN, 2**31 - 1),  # 0xFFFFFFFF ^ 0x80000000 = 0x7FFFFFFF
]

MURMUR3_VECTORS = [
    # MurmurHash3_x86_32, seed 0, unsigned: published test vectors
    (b"", 0),
    (b"hello", 0x248BFA47),
    (b"The quick brown fox jumps over the lazy dog", 0x2E4FF723),
]


@pytest.mark.parametrize(("s", "expected"), JAVA_STRING_VECTORS)
def test_java_string_hash_vectors(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected
    assert ref_string_hash(s) == expected


@pytest.mark.parametrize(("v", "expected"), JAVA_LONG_VECTORS)
def test_java_long_hash_vectors(v: int, expected: int) -> None:
    assert java_long_hash(v) == expected
    assert ref_long_hash(v) == expected


@pytest.mark.parametrize(("data", "expected"), MURMUR3_VECTORS)
def test_murmur3_vectors(data: bytes, expected: int) -> None:
    assert murmur3_32(data) == expected
    assert mmh3.hash(data, 0, signed=False) == expected
    assert ref_murmur3_32(data) == expected


def test_java_partition_at_int32_min() -> None:
    # Java: Math.abs(Integer.MIN_VALUE % n); printed by OpenJDK 17 for n = 3, 7, 2**31-1.
    h = INT32_MIN
    for n, expected in [(1, 0), (2, 0), (3, 2), (7, 2), (16, 0), (2**31 - 1, 1)]:
        assert java_partition(h, n) == expected
        assert ref_java_partition(h, n) == expected
        assert abs(h) % n == expected  # the Python shortcut the module relies on
    assert Sharder("java").partition_for("polygenelubricants", 7) == 2


def test_java_string_hash_across_the_fast_path_boundaries() -> None:
    # Short keys use Horner's rule, longer ones chunked dot products: check every regime,
    # for ASCII, BMP and astral text (astral characters double the unit count).
    for length in sorted({0, 1, _SHORT - 1, _SHORT, _SHORT + 1, _CHUNK - 1, _CHUNK, _CHUNK + 1,
                          2 * _CHUNK, 2 * _CHUNK + 1, 1000}):  # fmt: skip
        for text in ("k" * length, "é中" * length, "x\U0001f600" * length):
            s = text[:length]
            assert java_string_hash(s) == ref_string_hash(s), (length, s[:4])


# --------------------------------------------------------------------------- properties

# ASCII, BMP, astral (surrogate pairs in UTF-16) and lone surrogates (Java strings can hold
# them too), mixed evenly so that every regime shows up in every run.
# With explicit code point bounds, st.characters() includes surrogates unless told not to.
valid_chars = (
    st.characters(max_codepoint=0x7F)
    | st.characters(min_codepoint=0x80, max_codepoint=0xFFFF, exclude_categories=["Cs"])
    | st.characters(min_codepoint=0x10000)
)
lone_surrogates = st.integers(0xD800, 0xDFFF).map(chr)
any_text = st.text(valid_chars | lone_surrogates, max_size=300)
valid_text = st.text(valid_chars, max_size=300)
java_longs = st.integers(INT64_MIN, INT64_MAX)
java_ints = st.integers(INT32_MIN, INT32_MAX)
partition_nums = st.integers(1, 2**31 - 1) | st.integers(1, 300)


@given(any_text)
def test_java_string_hash_matches_reference(s: str) -> None:
    h = java_string_hash(s)
    assert h == ref_string_hash(s)
    assert INT32_MIN <= h <= INT32_MAX


@given(java_longs)
def test_java_long_hash_matches_reference(v: int) -> None:
    h = java_long_hash(v)
    assert h == ref_long_hash(v)
    assert INT32_MIN <= h <= INT32_MAX


@given(java_ints, partition_nums)
def test_java_partition_matches_java_truncation(h: int, n: int) -> None:
    p = java_partition(h, n)
    assert p == ref_java_partition(h, n)
    assert 0 <= p < n


@given(st.binary(max_size=64))
def test_murmur3_matches_reference(data: bytes) -> None:
    assert murmur3_32(data) == ref_murmur3_32(data)
    assert murmur3_32(bytearray(data)) == murmur3_32(memoryview(data)) == murmur3_32(data)


@given(java_longs | any_text, partition_nums)
def test_java_sharder_in_range_deterministic_and_as_specified(key: object, n: int) -> None:
    sharder = Sharder("java")
    p = sharder.partition_for(key, n)
    assert 0 <= p < n
    assert p == sharder.partition_for(key, n) == Sharder().partition_for(key, n)
    h = ref_long_hash(key) if isinstance(key, int) else ref_string_hash(key)  # type: ignore[arg-type]
    assert sharder.hash32(key) == h
    assert p == ref_java_partition(h, n)


@given(java_longs | valid_text | st.binary(max_size=40), partition_nums)
def test_murmur3_sharder_in_range_deterministic_and_as_specified(key: object, n: int) -> None:
    sharder = Sharder("murmur3")
    p = sharder.partition_for(key, n)
    assert 0 <= p < n
    assert p == sharder.partition_for(key, n)
    if isinstance(key, int):
        data = str(key).encode()
    elif isinstance(key, str):
        data = key.encode()
    else:
        data = key  # type: ignore[assignment]
    assert sharder.hash32(key) == ref_murmur3_32(data)
    assert p == ref_murmur3_32(data) % n


def test_murmur3_key_bytes() -> None:
    # int keys hash as their decimal text, like Go's []byte(strconv.Itoa(id)).
    assert key_bytes(-42) == b"-42"
    assert key_bytes(12345678901234567890123) == b"12345678901234567890123"
    assert key_bytes("中") == "中".encode()
    assert key_bytes(bytearray(b"\x00\xff")) == b"\x00\xff"
    assert Sharder("murmur3").hash32(7) == mmh3.hash(b"7", 0, signed=False)
    assert Sharder("murmur3").hash32(b"hello") == 0x248BFA47


def test_hashing_does_not_depend_on_the_process() -> None:
    # Python's str hash() is randomised per process: prove it plays no part.
    code = (
        "from smartnsq.routing import Sharder\n"
        "ks = ['user-1', 'é中文\\U0001f600', '', 42, -2**63]\n"
        "print([(Sharder(s).partition_for(k, 7), Sharder(s).hash32(k))"
        " for s in ('java', 'murmur3') for k in ks])\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


# --------------------------------------------------------------------------- custom strategy


def test_callable_strategy_is_called_with_key_and_partition_num() -> None:
    seen = []

    def by_region(key: str, n: int) -> int:
        seen.append((key, n))
        return {"eu": 0, "us": 1}[key] % n

    sharder = Sharder(by_region)
    assert sharder.partition_for("us", 4) == 1
    assert sharder.partition_for("us", 1) == 0
    assert seen == [("us", 4), ("us", 1)]
    assert sharder.hash32("us") is None  # a callable has no hash to expose
    # A callable owns its key space: keys the built-in strategies refuse go through.
    assert Sharder(lambda key, n: len(key) % n).partition_for((1, 2, 3), 2) == 1


@pytest.mark.parametrize("bad", [4, -1, True, 1.0, None, "1"])
def test_callable_strategy_result_is_checked(bad: object) -> None:
    def broken(key: object, n: int) -> object:
        return bad

    with pytest.raises(ValidationError) as info:
        Sharder(broken).partition_for("k", 4)  # type: ignore[arg-type]
    assert info.value.field == "sharding"
    assert repr(bad) in str(info.value)
    assert "broken" in str(info.value)
    assert "0..3" in str(info.value)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("strategy", ["java", "murmur3", lambda key, n: 0])
@pytest.mark.parametrize("key", [True, False])
def test_bool_keys_are_refused(strategy: object, key: bool) -> None:
    sharder = Sharder(strategy)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="bool") as info:
        sharder.partition_for(key, 4)
    assert info.value.field == "sharding_key"
    with pytest.raises(ValidationError, match="bool"):
        sharder.hash32(key)


@pytest.mark.parametrize("key", [b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_bytes_keys_are_refused_by_java(key: object) -> None:
    with pytest.raises(ValidationError, match="murmur3") as info:
        Sharder("java").partition_for(key, 4)
    assert info.value.field == "sharding_key"
    assert "Java SDK has no byte-array keys" in str(info.value)


@pytest.mark.parametrize("key", [INT64_MAX + 1, INT64_MIN - 1, 2**100])
def test_ints_outside_int64_are_refused_by_java(key: int) -> None:
    with pytest.raises(ValidationError, match="64-bit") as info:
        Sharder("java").partition_for(key, 4)
    assert info.value.field == "sharding_key"
    with pytest.raises(ValidationError, match="64-bit"):
        java_long_hash(key)


@pytest.mark.parametrize("strategy", ["java", "murmur3"])
@pytest.mark.parametrize("key", [None, 1.5, ("a",), object()])
def test_unsupported_key_types(strategy: str, key: object) -> None:
    with pytest.raises(ValidationError) as info:
        Sharder(strategy).partition_for(key, 4)  # type: ignore[arg-type]
    assert info.value.field == "sharding_key"


def test_lone_surrogate_has_no_murmur3_bytes() -> None:
    with pytest.raises(ValidationError, match="surrogate"):
        Sharder("murmur3").partition_for("a\ud800", 4)


@pytest.mark.parametrize("strategy", ["java", "murmur3", lambda key, n: 0])
@pytest.mark.parametrize("n", [0, -1, True, 2.0, None])
def test_partition_num_must_be_a_positive_int(strategy: object, n: object) -> None:
    with pytest.raises(ValidationError) as info:
        Sharder(strategy).partition_for("k", n)  # type: ignore[arg-type]
    assert info.value.field == "partition_num"
    with pytest.raises(ValidationError):
        java_partition(1, n)  # type: ignore[arg-type]


@pytest.mark.parametrize("h", [INT32_MAX + 1, INT32_MIN - 1, True, 1.0])
def test_java_partition_wants_an_int32(h: object) -> None:
    with pytest.raises(ValidationError) as info:
        java_partition(h, 4)  # type: ignore[arg-type]
    assert info.value.field == "hash32"


@pytest.mark.parametrize("strategy", ["Java", "murmur", "", None, 3])
def test_unknown_strategy_is_refused_at_construction(strategy: object) -> None:
    with pytest.raises(ValidationError) as info:
        Sharder(strategy)  # type: ignore[arg-type]
    assert info.value.field == "sharding"


def test_low_level_functions_check_types() -> None:
    with pytest.raises(ValidationError):
        java_string_hash(b"abc")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        java_long_hash(True)
    with pytest.raises(ValidationError):
        java_long_hash("1")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        murmur3_32("abc")  # type: ignore[arg-type]
    assert issubclass(ValidationError, ValueError)


# --------------------------------------------------------------------------- the object


def test_sharder_is_a_frozen_value() -> None:
    assert Sharder() == Sharder("java") != Sharder("murmur3")
    assert repr(Sharder("murmur3")) == "Sharder(strategy='murmur3')"
    assert hash(Sharder("java")) == hash(Sharder("java"))
    with pytest.raises(AttributeError):
        Sharder().strategy = "murmur3"  # type: ignore[misc]
    assert not hasattr(Sharder(), "__dict__")


def test_enum_keys_hash_as_their_value() -> None:
    class Region(str, Enum):  # noqa: UP042 - a str-mixin enum, as users write them
        EU = "eu"

    class Shard(IntEnum):
        TEN = 10

    for strategy in ("java", "murmur3"):
        sharder = Sharder(strategy)
        assert sharder.hash32(Region.EU) == sharder.hash32("eu")
        assert sharder.hash32(Shard.TEN) == sharder.hash32(10)
