"""Sharder("java") against a real JVM: compile compat/java/ShardingCompat.java, feed it
thousands of keys once per module, and require the same hash and partitions for every key.

Skipped when no JDK (``javac`` and ``java``) is on PATH.
"""

import base64
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from smartnsq.routing import Sharder

SOURCE = Path(__file__).resolve().parents[2] / "compat" / "java" / "ShardingCompat.java"
PARTITION_COUNTS = (1, 2, 3, 4, 7, 16, 100, 255, 1000, 2**31 - 1)
SEED = 20240611
TIMEOUT = 120  # seconds, for javac and for the java run each

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The subprocess timeouts bound the fixture; the project-wide 60 s per test could cut a cold
# javac on a slow CI machine.
pytestmark = pytest.mark.timeout(3 * TIMEOUT)


def _long_keys(rnd: random.Random) -> list[int]:
    edges = [0, 1, -1, 2, -2, 31, -31, 255, 256]
    for bound in (INT32_MIN, INT32_MAX, INT64_MIN, INT64_MAX, 2**32, -(2**32), 2**31, 2**53):
        edges += [bound - 1, bound, bound + 1]
    keys = [k for k in edges if INT64_MIN <= k <= INT64_MAX]
    keys += [rnd.randint(INT64_MIN, INT64_MAX) for _ in range(2000)]
    keys += [rnd.randint(-1000, 1000) for _ in range(300)]
    keys += [rnd.randint(INT32_MIN, INT32_MAX) for _ in range(300)]
    # Only the high or only the low half set, to exercise the v ^ (v >>> 32) fold.
    keys += [rnd.getrandbits(31) << 32 for _ in range(100)]
    keys += [-(rnd.getrandbits(31) << 32) for _ in range(100)]
    return keys


_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:./",
    "éèàçüöñßøÆ",
    "中文用户订单编号东南西北",
    "\U0001f600\U0001f680\U0001f4a9\U00010348\U0010ffff",
    "\t\n\r \x00\x7f\u2028\ufeff\uffff",
]


def _string_keys(rnd: random.Random) -> list[str]:
    keys = [
        "",
        "hello",
        "polygenelubricants",
        "é",
        "中文",
        "\U0001f600",
        "user-1234567",
        "123",
        "-1",
        "tab\there",
        "new\nline",
        "\r\n",
        "a" * 10_000,
        "中\U0001f600" * 50_000,
    ]
    for _ in range(3000):
        alphabet = rnd.choice([*_ALPHABETS, "".join(_ALPHABETS)])
        length = rnd.choice([1, 2, 5, 12, 20, 39, 40, 41, 63, 64, 65, 130, 500])
        keys.append("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, length))))
    return keys


def _lone_surrogate_keys(rnd: random.Random) -> list[str]:
    # Valid in a Java String and a Python str, but not in UTF-8: sent as UTF-16 code units.
    keys = ["\ud800", "\udfff", "a\udc00b", "\ude00\ud83d"]
    for _ in range(200):
        units = [
            rnd.choice([rnd.randint(0xD800, 0xDFFF), rnd.randint(0x20, 0x7E)])
            for _ in range(rnd.randint(1, 9))
        ]
        keys.append("".join(map(chr, units)))
    return keys


@dataclass(frozen=True)
class JavaRun:
    keys: list[object]
    hashes: list[int]
    partitions: list[list[int]]


def _encode(key: object, lone_surrogates: bool) -> str:
    if isinstance(key, int):
        return f"L\t{key}"
    assert isinstance(key, str)
    if lone_surrogates:
        return "U\t" + base64.b64encode(key.encode("utf-16-be", "surrogatepass")).decode()
    return "S\t" + base64.b64encode(key.encode("utf-8")).decode()


@pytest.fixture(scope="module")
def java_run(tmp_path_factory: pytest.TempPathFactory) -> JavaRun:
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.skip("no JDK on PATH (javac and java are needed to run the Java SDK's rule)")
    classes = tmp_path_factory.mktemp("sharding-compat")
    compiled = subprocess.run(
        [javac, "-Xlint:all", "-Werror", "-encoding", "UTF-8", "-d", str(classes), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if compiled.returncode != 0:
        pytest.fail(f"javac failed:\n{compiled.stdout}{compiled.stderr}")

    rnd = random.Random(SEED)
    longs, strings, lone = _long_keys(rnd), _string_keys(rnd), _lone_surrogate_keys(rnd)
    keys: list[object] = [*longs, *strings, *lone]
    lines = [f"N\t{','.join(map(str, PARTITION_COUNTS))}"]
    lines += [_encode(k, False) for k in [*longs, *strings]]
    lines += [_encode(k, True) for k in lone]
    ran = subprocess.run(
        [java, "-XX:TieredStopAtLevel=1", "-cp", str(classes), "ShardingCompat"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        encoding="ascii",
        timeout=TIMEOUT,
        check=False,
    )
    if ran.returncode != 0:
        pytest.fail(f"java ShardingCompat failed ({ran.returncode}):\n{ran.stderr}")
    out = ran.stdout.splitlines()
    assert len(out) == len(keys), "one output line per key"
    hashes, partitions = [], []
    for row in out:
        hash_text, parts_text = row.split("\t")
        hashes.append(int(hash_text))
        partitions.append([int(p) for p in parts_text.split(",")])
    return JavaRun(keys, hashes, partitions)


def _show(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:57]}... ({len(key)} chars)"  # type: ignore[arg-type]


def test_the_key_set_covers_what_it_claims(java_run: JavaRun) -> None:
    keys = java_run.keys
    ints = [k for k in keys if isinstance(k, int)]
    strs = [k for k in keys if isinstance(k, str)]
    assert len(ints) > 2000
    assert len(strs) > 3000
    assert {INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX, 0, -1} <= set(ints)
    assert any(k < 0 for k in ints)
    assert "" in strs
    assert max(map(len, strs)) >= 100_000
    assert any("\t" in k for k in strs)
    assert any("\n" in k for k in strs)
    assert any(any(ord(c) > 0xFFFF for c in k) for k in strs)  # surrogate pairs in UTF-16
    assert any(any(0xD800 <= ord(c) <= 0xDFFF for c in k) for k in strs)  # lone surrogates
    assert len(set(java_run.hashes)) > 1000  # the JVM really hashed distinct keys


def test_hashes_match_java(java_run: JavaRun) -> None:
    sharder = Sharder("java")
    mismatches = [
        f"{_show(key)}: java {expected}, smartnsq {sharder.hash32(key)}"
        for key, expected in zip(java_run.keys, java_run.hashes, strict=True)
        if sharder.hash32(key) != expected
    ]
    assert not mismatches, f"{len(mismatches)} hash mismatches, first: {mismatches[:5]}"


def test_partitions_match_java(java_run: JavaRun) -> None:
    sharder = Sharder("java")
    mismatches = []
    for key, expected in zip(java_run.keys, java_run.partitions, strict=True):
        ours = [sharder.partition_for(key, n) for n in PARTITION_COUNTS]
        if ours != expected:
            mismatches.append(f"{_show(key)}: java {expected}, smartnsq {ours}")
    assert not mismatches, f"{len(mismatches)} partition mismatches, first: {mismatches[:5]}"
    assert {p[-1] for p in java_run.partitions} != {0}  # not a degenerate all-zero answer
