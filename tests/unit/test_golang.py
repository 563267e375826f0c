"""The Go behaviours the emulated servers show: %q quoting, nsqd's number parsing and the
fastjson parser youzan nsqd validates ext headers with (acceptance and messages)."""

import pytest

from smartnsq.testing.golang import (
    JsonNumber,
    JsonObject,
    JsonParseError,
    JsonString,
    byte_to_base10,
    go_parse_bool,
    go_parse_int,
    go_quote,
    json_get_string,
    json_keys,
    parse_json,
    to_int64,
)
from smartnsq.testing.publish import go_atoi
from tests.fixtures import wire


def test_go_quote() -> None:
    assert go_quote(b"bad!topic") == '"bad!topic"'
    assert go_quote(b'a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote(b"\n\t\r\x07\x00\x7f") == '"\\n\\t\\r\\a\\x00\\x7f"'
    assert go_quote(b"\xff\xc3\xa9") == '"\\xffé"'  # invalid UTF-8 byte, then é
    assert go_quote("\u2028\U0001f600".encode()) == '"\\u2028\U0001f600"'


def test_byte_to_base10() -> None:
    assert byte_to_base10(b"") == 0
    assert byte_to_base10(b"2500") == 2500
    assert to_int64(byte_to_base10(b"18446744073709551615")) == -1  # wraps like uint64
    for bad in (b"-1", b"+1", b" 1", b"1.0", b"\xd9\xa1"):
        with pytest.raises(ValueError, match="failed to convert to Base10"):
            byte_to_base10(bad)


def test_strconv_messages() -> None:
    assert go_parse_int(b"-12") == -12
    assert go_atoi("+7") == 7
    with pytest.raises(ValueError, match=r'^strconv.Atoi: parsing "abc": invalid syntax$'):
        go_atoi("abc")
    with pytest.raises(ValueError, match=r'^strconv.ParseInt: parsing "": invalid syntax$'):
        go_parse_int(b"")
    with pytest.raises(ValueError, match="value out of range"):
        go_atoi("9223372036854775808")
    assert go_parse_bool(b"T") is True
    with pytest.raises(ValueError, match=r'^strconv.ParseBool: parsing "yes": invalid syntax$'):
        go_parse_bool(b"yes")


def test_fastjson_message_of_the_capture() -> None:
    """The invalid header of tcp_ext.txt gets the recorded text."""
    errors = wire()["errors"]
    recorded = next(e["text"] for e in errors if e["text"].startswith("E_INVALID_JSON_HEADER"))
    with pytest.raises(JsonParseError) as caught:
        parse_json(b"{not json")
    assert recorded == f"E_INVALID_JSON_HEADER fail to parse json header:{caught.value}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", 'cannot parse JSON: cannot parse empty string; unparsed tail: ""'),
        (b" \t", 'cannot parse JSON: cannot parse empty string; unparsed tail: ""'),
        (b"{", "cannot parse JSON: cannot parse object: missing '}'; unparsed tail: \"\""),
        (
            b'{"a"',
            "cannot parse JSON: cannot parse object: missing ':' after object key; "
            'unparsed tail: ""',
        ),
        (
            b'{"a":1,}',
            'cannot parse JSON: cannot parse object: cannot find opening \'"" for '
            'object key; unparsed tail: "}"',
        ),
        (
            b"[1",
            'cannot parse JSON: cannot parse array: unexpected end of array; unparsed tail: ""',
        ),
        (b'"x', 'cannot parse JSON: cannot parse string: missing closing \'"\'; unparsed tail: ""'),
        (b"nul", 'cannot parse JSON: unexpected value found: "nul"; unparsed tail: "nul"'),
        (b"{} x", 'unexpected tail: "x"'),
    ],
)
def test_fastjson_messages(data: bytes, message: str) -> None:
    with pytest.raises(JsonParseError) as caught:
        parse_json(data)
    assert str(caught.value) == message


def test_fastjson_is_lenient_where_fastjson_is() -> None:
    assert parse_json(b"[1]") == [JsonNumber(b"1")]  # any value, not only objects
    assert parse_json(b'{"n":1-2}') == JsonObject(((b"n", JsonNumber(b"1-2")),))
    assert parse_json(b'"\\q"') == JsonString(b"\\q")  # escapes are not checked
    with pytest.raises(JsonParseError, match="too big depth for the nested JSON; it exceeds 300"):
        parse_json(b"[" * 301 + b"]" * 301)
    assert parse_json(b"[" * 300 + b"]" * 300) is not None


def test_json_get_string() -> None:
    header = parse_json(b'{"##trace_id":"12","##trace_id":"34","k\\u0041":"\\u00e9","n":1}')
    assert json_get_string(header, "##trace_id") == "12"  # the first of duplicated keys
    assert json_get_string(header, "kA") == "é"
    assert json_get_string(header, "missing") is None
    assert json_get_string(parse_json(b"[1]"), "k") is None
    with pytest.raises(TypeError):
        json_get_string(header, "n")
    with pytest.raises(TypeError):
        json_get_string(parse_json(b'{"k":null}'), "k")
    assert json_keys(header) == ["##trace_id", "##trace_id", "kA", "n"]
    assert json_keys(parse_json(b'"s"')) == []
