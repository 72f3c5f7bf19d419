"""orchestrator._json: orjson on the hot paths, with answers identical to `json`'s."""

from __future__ import annotations

import json

import pytest

from orchestrator._json import dumps, loads

EXACT = [
    "123456789012345678901234567890",  # past 64 bits: orjson alone reads a rounded float
    "18446744073709551616",
    "-9223372036854775809",
    "100000000000000000000",
    '{"big": 123456789012345678901234567890, "small": 1, "text": "1234567890123456789012"}',
    '[9223372036854775807, -9223372036854775808, 1.5, "x"]',  # within 64 bits
    '{"n": 1e20, "f": 0.12345678901234567891}',
    '{"a": NaN}',  # not JSON, but read by `json`, as before
]


@pytest.mark.parametrize("text", EXACT)
def test_loads_answers_as_json_does(text: str) -> None:
    expected = json.loads(text)
    for given in (text, text.encode()):
        got = loads(given)
        assert repr(got) == repr(expected)  # same types: an int stays an exact int


def test_a_big_integer_round_trips_exactly() -> None:
    body = {"id": 2**70 + 1, "nested": [{"n": -(2**65)}]}
    assert loads(dumps(body)) == body
    assert isinstance(loads(dumps(body))["id"], int)


def test_invalid_json_is_a_value_error() -> None:
    for bad in ("{", b"[1,", "12345678901234567890x"):
        with pytest.raises(ValueError):
            loads(bad)
