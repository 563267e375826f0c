"""One host:port parser for the whole client (``routing.addresses.split_host_port``), and the
check of ``nsqd=[...]`` / ``--nsqd`` built on it (a URL gets a hint towards ``lookupd=``)."""

from __future__ import annotations

import pytest

from smartnsq.cli import main
from smartnsq.consumer.consumer import Consumer
from smartnsq.errors import ValidationError
from smartnsq.producer.producer import Producer
from smartnsq.routing.addresses import split_host_port
from smartnsq.transport.connection import Connection
from smartnsq.transport.targets import check_nsqd_address

BAD = ["nsqd0", "nsqd0:", ":4150", "nsqd0:0", "nsqd0:65536", "nsqd0:41x", "a b:1", "h:+80", "h/x:1"]


def test_split_host_port_names_the_field() -> None:
    assert split_host_port("nsqd0:4150") == ("nsqd0", 4150)
    assert split_host_port("[::1]:4150") == ("::1", 4150)
    with pytest.raises(ValidationError) as info:
        split_host_port("a b:1", "nsqd", "seed")
    assert info.value.field == "nsqd"
    assert "seed 'a b:1'" in info.value.reason


@pytest.mark.parametrize("bad", BAD)
def test_connections_take_what_the_parser_takes(bad: str) -> None:
    # The connection used its own parser, which took a host with spaces and a signed port.
    with pytest.raises(ValidationError):
        Connection(bad)


@pytest.mark.parametrize("bad", BAD)
def test_nsqd_addresses_take_what_the_parser_takes(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_nsqd_address(bad)
    assert info.value.field == "nsqd"


@pytest.mark.parametrize("url", ["http://127.0.0.1:4151", "https://nsqd:4151", "tcp://h:4150"])
def test_a_url_given_as_nsqd_says_what_nsqd_wants(url: str) -> None:
    clients = [lambda: Producer(nsqd=[url]), lambda: Consumer("t", "c", nsqd=[url])]
    for build in clients:
        with pytest.raises(ValidationError) as info:
            build()
        assert info.value.field == "nsqd"
        assert "host:port" in info.value.reason
        assert "TCP" in info.value.reason
        assert "lookupd=" in info.value.reason


def test_the_cli_refuses_an_nsqd_url_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pub", "t", "--nsqd", "http://127.0.0.1:4151", "x"]) == 2
    err = capsys.readouterr().err
    assert "invalid nsqd address" in err
    assert "host:port" in err
    assert "lookupd" in err
