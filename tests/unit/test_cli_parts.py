"""Pure pieces of the command line: progress throttling, argument plumbing, the demo's
order checker. The commands themselves are tested as subprocesses in
tests/integration/test_cli.py."""

from __future__ import annotations

import io
import json
from collections import Counter
from types import SimpleNamespace
from typing import Any, Literal

import pytest

import smartnsq
from smartnsq.cli import UsageError, _options, _positionals, main
from smartnsq.cli._common import Progress, dash, table
from smartnsq.cli.demo import _Checker, _events, _trace_sample
from smartnsq.cli.pub import parse_sharding_key
from smartnsq.routing.sharding import INT64_MAX, INT64_MIN, Sharder


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_throttled_and_cleared() -> None:
    stream = io.StringIO()
    clock = FakeClock()
    progress = Progress(stream, enabled=True, interval=1.0, clock=clock)
    calls: list[int] = []

    def text() -> str:
        calls.append(1)
        return f"done {len(calls)}"

    progress.update(text)  # too early: the first line comes after one interval
    clock.now += 1.0
    progress.update(text)
    clock.now += 0.5
    progress.update(text)
    clock.now += 0.6
    progress.update(text)
    progress.clear()
    progress.clear()
    assert stream.getvalue() == "\rdone 1\x1b[K\rdone 2\x1b[K\r\x1b[K"
    assert len(calls) == 2  # the text is only built when shown


def test_progress_is_silent_off_a_terminal() -> None:
    stream = io.StringIO()  # isatty() is False
    clock = FakeClock()
    progress = Progress(stream, clock=clock)
    clock.now += 10
    progress.update(lambda: "x")
    progress.clear()
    assert not progress.enabled
    assert stream.getvalue() == ""


def test_dash_shows_none_as_a_dash() -> None:
    assert [dash(None), dash(0), dash(12), dash("x")] == ["-", "0", "12", "x"]


def test_table_aligns_columns_and_strips_trailing_blanks() -> None:
    rows = [("0", "127.0.0.1:4150", "2"), ("10", "h:1", "")]
    assert table(("PARTITION", "LEADER", "REPLICAS"), rows) == [
        "  PARTITION  LEADER          REPLICAS",
        "  0          127.0.0.1:4150  2",
        "  10         h:1",
    ]
    assert table(("partition", "leader"), [("1", "node 2")], indent="") == [
        "partition  leader",
        "1          node 2",
    ]
    assert table(("a", "b"), []) == ["  a  b"]


def test_extra_positionals() -> None:
    assert _positionals(["a", "b"]) == ["a", "b"]
    assert _positionals(["a", "--", "-b", "--"]) == ["a", "-b", "--"]
    assert _positionals(["-"]) == ["-"]
    assert _positionals(["a", "--bogus"]) is None
    assert _options(["a", "--bogus", "-", "--", "-x"]) == ["--bogus"]


def test_unknown_option_after_bodies_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Only the option is named, on every Python (3.11's argparse leaves the body "a" among
    the unknown arguments, 3.13's takes it as a body)."""
    assert main(["pub", "t", "--nsqd", "h:1", "a", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "smartnsq pub: error: unrecognized arguments: --bogus (see 'smartnsq pub --help')\n"
    )


def _message(customer: int, seq: int, partition: int, attempts: int = 1) -> Any:
    body = json.dumps({"customer": customer, "seq": seq}).encode()
    return SimpleNamespace(body=body, partition=partition, attempts=attempts)


async def _feed(checker: _Checker, *messages: Any) -> None:
    for message in messages:
        await checker.handle(message)


async def test_checker_accepts_each_key_in_order() -> None:
    checker = _Checker(Counter({1: 2, 2: 1}))
    await _feed(checker, _message(1, 1, 0), _message(2, 1, 3), _message(1, 2, 0))
    assert checker.complete.is_set()
    assert (checker.violations, checker.lost, checker.received) == (0, 0, 3)
    assert checker.per_partition == {0: 2, 3: 1}


async def test_checker_counts_gaps_reordering_and_partition_changes() -> None:
    checker = _Checker(Counter({1: 4, 2: 2}))
    await _feed(
        checker,
        _message(1, 2, 0),  # 1 is missing
        _message(1, 1, 0),  # backwards, not a redelivery
        _message(1, 3, 1),  # another partition
        _message(2, 1, 2),
        _message(2, 1, 2, attempts=2),  # a redelivery: skipped, not a violation
    )
    assert checker.violations == 3
    assert checker.redelivered == 1
    assert checker.lost == 1 + 1  # customer 1 stopped at 3 of 4, customer 2 at 1 of 2
    assert not checker.complete.is_set()
    assert checker.examples == [
        "customer 1: seq 2 after 0 (partition 0)",
        "customer 1: seq 1 after 2 (partition 0)",
        "customer 1: partitions 0 and 1",
    ]


def test_events_number_each_customer_from_one() -> None:
    events = _events(1000, 7, seed=3)
    assert events == _events(1000, 7, seed=3)
    assert len(events) == 1000
    per_customer: dict[int, list[int]] = {}
    for customer, seq in events:
        per_customer.setdefault(customer, []).append(seq)
    assert set(per_customer) == set(range(7))
    for seqs in per_customer.values():
        assert seqs == list(range(1, len(seqs) + 1))


def test_trace_sample_pairs_publish_and_consume_lines() -> None:
    lines = [
        ("publish", 1000, "p1000"),
        ("publish", 2000, "p2000"),
        ("consume", 1000, "c1000"),
        ("publish", 3000, "p3000"),
        ("consume", 2000, "c2000"),
        ("consume", 3000, "c3000"),
    ]
    assert _trace_sample(lines) == ["p1000", "c1000", "p2000", "c2000"]


def test_readme_first_setup_command_runs_the_demo() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    setup = readme.split("## Set up on a fresh machine", 1)[1]
    first = setup.split("```sh\n", 1)[1].split("\n", 1)[0]
    assert first.endswith("&& .venv/bin/smartnsq demo")


# --------------------------------------------------------------------------- pub keys


@pytest.mark.parametrize("strategy", ["java", "murmur3"])
def test_decimal_keys_are_the_api_int_keys(strategy: Literal["java", "murmur3"]) -> None:
    """--sharding-key 10 goes where sharding_key=10 goes (issue 13: it went where "10" goes,
    a different partition for 750 of the keys 0-999 with java sharding)."""
    sharder = Sharder(strategy)
    for number in [*range(-1000, 1000), INT64_MIN, INT64_MAX, 2**31, -(2**31) - 1]:
        key = parse_sharding_key(str(number))
        assert type(key) is int
        assert key == number
        for partitions in (1, 3, 4, 16):
            assert sharder.partition_for(key, partitions) == sharder.partition_for(
                number, partitions
            )


def test_keys_that_are_not_plain_64_bit_integers_are_strings() -> None:
    for text in [
        str(INT64_MAX + 1), str(INT64_MIN - 1), "007", "00", "+5", "-0", "1e3", "0x1f",
        "1_000", " 7", "7 ", "7\n", "١٢", "²", "", "-", "customer-7", "10.0",
    ]:  # fmt: skip
        assert parse_sharding_key(text) == text, text


def test_key_type_forces_the_key_type() -> None:
    assert parse_sharding_key("10", "str") == "10"
    assert parse_sharding_key("10", "int") == 10
    assert parse_sharding_key("007", "int") == 7
    assert parse_sharding_key("+5", "int") == 5
    assert parse_sharding_key("-0", "int") == 0
    assert parse_sharding_key(str(INT64_MAX + 1), "int") == INT64_MAX + 1  # murmur3 takes it
    for text in ["1_000", "١٢", " 7", "0x1f", "", "k"]:
        with pytest.raises(UsageError, match="is not an integer"):
            parse_sharding_key(text, "int")


PUB_MISTAKES = [
    (["--sharding-key", str(INT64_MAX + 1), "--key-type", "int"],
     f"--sharding-key '{INT64_MAX + 1}': {INT64_MAX + 1} is outside the signed 64-bit range"),
    (["--sharding-key", "1_000", "--key-type", "int"],
     "--sharding-key '1_000' is not an integer (--key-type int)"),
    (["--key-type", "str"], "--key-type needs --sharding-key"),
    (["--sharding", "murmur3"], "--sharding needs --sharding-key"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "expected"), PUB_MISTAKES)
def test_pub_key_options_are_checked_before_connecting(
    capsys: pytest.CaptureFixture[str], options: list[str], expected: str
) -> None:
    # Nothing listens on port 1: exit 2 means it stopped before connecting.
    assert main(["pub", "orders", "--nsqd", "127.0.0.1:1", *options, "x"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"smartnsq pub: error: {expected}"), line


def test_pub_without_arguments_asks_for_the_topic_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """BODY is optional (stdin is read without it): only TOPIC is required."""
    with pytest.raises(SystemExit) as exited:
        main(["pub"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "smartnsq pub: error: the following arguments are required: TOPIC "
        "(see 'smartnsq pub --help')\n"
    )
    with pytest.raises(SystemExit):
        main(["pub", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "TOPIC [BODY ...]" in usage
    assert "BODY message bodies (none: one message per stdin line)" in usage
    assert "--skip-empty" in usage


def test_tail_help_says_when_the_offset_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tail", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "ordered subscriptions only" not in usage
    assert 'P and O are "-" on classic nsqd' in usage
    assert "every youzan message carries its queue offset" in usage


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"smartnsq {smartnsq.__version__}\n"


def test_pub_waits_as_long_as_the_api_by_default() -> None:
    from smartnsq.cli import build_parser
    from smartnsq.producer.producer import DEFAULT_PUBLISH_TIMEOUT

    args = build_parser().parse_args(["pub", "orders", "x"])
    assert args.timeout == DEFAULT_PUBLISH_TIMEOUT
