"""Each option is written out once beside its client's public constructor: the Producer's and
the Consumer's keyword arguments are their options values' fields (names, defaults and
annotations), every option reads back from the client, and the reference prints the same
signatures."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.options import ConsumerOptions
from smartnsq.producer.options import ProducerOptions
from smartnsq.producer.producer import Producer

REFERENCE = Path(__file__).parents[2] / "docs" / "reference.md"
CLIENTS = [(Producer, ProducerOptions, ()), (Consumer, ConsumerOptions, ("topic", "channel"))]
IDS = ["producer", "consumer"]


def _keywords(client: type, positional: tuple[str, ...]) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(client.__init__).parameters  # type: ignore[misc]
    return {n: p for n, p in parameters.items() if n not in ("self", *positional)}


@pytest.mark.parametrize(("client", "options", "positional"), CLIENTS, ids=IDS)
def test_the_constructor_takes_exactly_the_options(
    client: type, options: type, positional: tuple[str, ...]
) -> None:
    keywords = _keywords(client, positional)
    fields = {f.name: f for f in dataclasses.fields(options) if f.init}
    assert sorted(keywords) == sorted(fields)
    for name, parameter in keywords.items():
        option = fields[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameter.default == option.default, name
        assert parameter.annotation == option.type, name


# Names a client uses for something of its own: Consumer.start() subscribes, and
# Consumer.max_in_flight is the budget now (set_max_in_flight changes it).
OWN = {"start", "max_in_flight"}


@pytest.mark.parametrize(("client", "options", "positional"), CLIENTS, ids=IDS)
def test_every_option_reads_back_from_the_client(
    client: type, options: type, positional: tuple[str, ...]
) -> None:
    instance: Any = client(*positional, lookupd=["127.0.0.1:4161"], client_id="me")
    assert isinstance(instance.options, options)
    for option in dataclasses.fields(options):
        attribute = inspect.getattr_static(client, option.name)
        if option.name in OWN:
            assert attribute.__doc__ != f"``options.{option.name}`` (read-only)"
            continue
        assert isinstance(attribute, property), option.name
        assert getattr(instance, option.name) is getattr(instance.options, option.name)
    assert instance.client_id == "me"
    with pytest.raises(AttributeError):
        instance.client_id = "you"


def _documented(name: str) -> dict[str, Any]:
    """The keyword arguments and their defaults of ``name(...)`` as the reference prints it."""
    found = re.search(rf"```\n{name}\((.*?)\)\n```", REFERENCE.read_text(), re.DOTALL)
    assert found, f"no signature of {name} in {REFERENCE.name}"
    function = ast.parse(f"def {name}({found.group(1)}): pass").body[0]
    assert isinstance(function, ast.FunctionDef)
    arguments = function.args
    keywords = zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    return {argument.arg: ast.literal_eval(default) for argument, default in keywords}  # type: ignore[arg-type]


@pytest.mark.parametrize(("client", "options", "positional"), CLIENTS, ids=IDS)
def test_the_reference_prints_the_constructor(
    client: type, options: type, positional: tuple[str, ...]
) -> None:
    documented = _documented(client.__name__)
    keywords = _keywords(client, positional)
    assert sorted(documented) == sorted(keywords)
    for name, default in documented.items():
        assert default == keywords[name].default, name
