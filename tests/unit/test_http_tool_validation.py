"""What `POST /tools/http` accepts (orchestrator/tools/_http.py `validate_http_tool`): each
rule of the spec refuses with a 400 naming its field, a valid body comes back normalised,
and a PUT's partial body is checked field by field. The name, URL and header rules are the
ones MCP servers get (orchestrator/tools/_validate.py): the same limits for both kinds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.egress import EgressPolicy
from orchestrator.errors import ValidationFailed
from orchestrator.tools._http import placeholders, validate_http_tool
from orchestrator.tools._registration import ToolLimits, validate_mcp_server

PUBLIC = EgressPolicy()


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "units": {"type": "string"}},
            "required": ["city"],
        },
        "method": "GET",
        "url": "https://api.example.com/v1/weather/{city}?units={units}",
        "headers": {"X-Api-Key": "s3cret"},
    }
    for key, value in changes.items():
        if value is ...:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def _refused(
    body: dict[str, Any], egress: EgressPolicy = PUBLIC, *, partial: bool = False
) -> tuple[str, str]:
    with pytest.raises(ValidationFailed) as caught:
        validate_http_tool(body, egress, partial=partial)
    assert caught.value.status_code == 400
    [entry] = caught.value.extra["fields"]
    assert caught.value.message == f"{entry['field']}: {entry['message']}"
    return entry["field"], entry["message"]


def _props(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def test_a_valid_body_comes_back_normalised() -> None:
    out = validate_http_tool(_body(method="post"), PUBLIC)
    assert out == {**_body(), "method": "POST"}
    without_headers = validate_http_tool(_body(headers=...), PUBLIC)
    assert without_headers["headers"] == {}
    assert validate_http_tool(_body(headers=None), PUBLIC)["headers"] == {}


@pytest.mark.parametrize("field", ["name", "description", "parameters", "method", "url"])
def test_each_field_is_required_on_create(field: str) -> None:
    assert _refused(_body(**{field: ...})) == (field, "required")


def test_an_unknown_field_is_named() -> None:
    assert _refused(_body(timeout=5)) == ("timeout", "unknown field")


def test_a_body_must_be_an_object() -> None:
    assert _refused(["x"])[0] == "body"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["", "x" * 33, "Weather", "a b", "a.b", "wé", 5, "gh__repo", "__", "a___b", "x__"]
)
def test_bad_names(name: Any) -> None:
    assert _refused(_body(name=name))[0] == "name"


def test_a_name_may_not_hold_two_underscores_in_a_row() -> None:
    """`__` separates a tool name's parts: an MCP server `gh__repo` would offer
    `mcp__gh__repo__delete`, the name of shared server `gh`'s tool `repo__delete`."""
    message = "1-32 characters of a-z 0-9 _ -, no two _ in a row"
    assert _refused(_body(name="gh__repo")) == ("name", message)
    with pytest.raises(ValidationFailed) as caught:
        validate_mcp_server({"name": "gh__repo", "url": "https://a.example/mcp"}, ToolLimits())
    assert caught.value.extra["fields"] == [{"field": "name", "message": message}]


@pytest.mark.parametrize("name", ["a", "x" * 32, "my-tool_2", "a_b_c", "_a_", "a-_-b", "a--b"])
def test_good_names(name: str) -> None:
    assert validate_http_tool(_body(name=name), PUBLIC)["name"] == name


@pytest.mark.parametrize("description", ["", "   ", "x" * 1025, 3, None])
def test_bad_descriptions(description: Any) -> None:
    assert _refused(_body(description=description))[0] == "description"


def test_the_longest_description_is_accepted() -> None:
    assert len(validate_http_tool(_body(description="d" * 1024), PUBLIC)["description"]) == 1024


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ("object", "parameters"),
        ([], "parameters"),
        ({"properties": {}}, "parameters.type"),
        ({"type": "array"}, "parameters.type"),
        ({"type": "object", "properties": []}, "parameters.properties"),
        ({"type": "object", "properties": {"a": "string"}}, "parameters.properties.a"),
        ({"type": "object", "properties": {"a b": {}}}, "parameters.properties.a b"),
        ({"type": "object", "properties": {"x" * 65: {}}}, f"parameters.properties.{'x' * 65}"),
        ({"type": "object", "properties": {"a": {}}, "required": "a"}, "parameters.required"),
        ({"type": "object", "properties": {"a": {}}, "required": [1]}, "parameters.required"),
        ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "parameters.required"),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["a", "a"]},
            "parameters.required",
        ),
        (_props(65), "parameters.properties"),
        (
            {"type": "object", "properties": {"a": {"description": "d" * 16 * 1024}}},
            "parameters",
        ),
        ({"type": "object", "properties": {"a": {"default": float("nan")}}}, "parameters"),
    ],
)
def test_bad_parameters(parameters: Any, field: str) -> None:
    body = _body(parameters=parameters, url="https://api.example.com/")
    assert _refused(body)[0] == field


def test_parameters_at_their_limits_are_accepted() -> None:
    body = _body(parameters=_props(64), url="https://api.example.com/{p63}")
    assert len(validate_http_tool(body, PUBLIC)["parameters"]["properties"]) == 64
    near = {"type": "object", "properties": {"a": {"description": ""}}}
    near["properties"]["a"]["description"] = "d" * (16 * 1024 - len(json.dumps(near)))
    body = _body(parameters=near, url="https://api.example.com/")
    assert validate_http_tool(body, PUBLIC)["parameters"] == near


def test_parameters_may_have_no_properties() -> None:
    body = _body(parameters={"type": "object"}, url="https://api.example.com/now")
    assert validate_http_tool(body, PUBLIC)["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize("method", ["get", "Post", "PUT", "patch", "DELETE"])
def test_methods_are_upper_cased(method: str) -> None:
    assert validate_http_tool(_body(method=method), PUBLIC)["method"] == method.upper()


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "CONNECT", "TRACE", "", 1, None])
def test_other_methods_are_refused(method: Any) -> None:
    assert _refused(_body(method=method))[0] == "method"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "absolute"),
        (7, "absolute"),
        ("/v1/weather", "absolute"),
        ("ftp://api.example.com/x", "absolute"),
        ("file:///etc/passwd", "absolute"),
        ("api.example.com/weather", "absolute"),
        ("https://", "no host"),
        ("https://api.example.com/" + "x" * 2030, "2048"),
        ("https://api.example.com/a b", "spaces"),
        ("https://api.example.com/\n", "spaces"),
        ("https://api.example.com/é", "non-ASCII"),
        ("https://{host}/x", "host"),
        ("https://api.{city}.com/x", "host"),
        ("https://api.example.com:{city}/x", "host"),
        ("https://user:pw@api.example.com/x", "credentials"),
        ("https://api.example.com:99999/x", "port"),
        ("https://[::1/x", "valid URL"),
        ("https://api.example.com/x#top", "fragment"),
        ("https://api.example.com/{city", "placeholder"),
        ("https://api.example.com/city}", "placeholder"),
        ("https://api.example.com/{a+b}", "placeholder"),
        ("https://api.example.com/{}", "placeholder"),
        ("https://api.example.com/{country}", "{country}"),
        ("https://api.example.com/x?units={unit}", "{unit}"),
    ],
)
def test_bad_urls(url: Any, says: str) -> None:
    field, message = _refused(_body(url=url))
    assert field == "url"
    assert says in message


def test_the_longest_url_is_accepted() -> None:
    url = "https://api.example.com/" + "x" * (2048 - len("https://api.example.com/"))
    assert validate_http_tool(_body(url=url), PUBLIC)["url"] == url


def test_placeholders_in_path_and_query_are_accepted() -> None:
    url = "http://api.example.com:8080/v1/{city}/{units}?q={city}&u={units}"
    assert validate_http_tool(_body(url=url), PUBLIC)["url"] == url
    assert placeholders(url) == ["city", "units"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://10.0.0.5/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0x7f000001/x",  # 127.0.0.1 spelt as the resolver accepts it
        "http://192.168.1.1/{city}",
    ],
)
def test_a_literal_internal_address_is_refused(url: str) -> None:
    assert _refused(_body(url=url)) == (
        "url",
        "destination not allowed (outbound_allowed_cidrs)",
    )


def test_allowed_cidrs_open_a_literal_address() -> None:
    opened = EgressPolicy(["127.0.0.0/8"])
    url = "http://127.0.0.1:8080/x/{city}"
    assert validate_http_tool(_body(url=url), opened)["url"] == url
    # A host name is resolved by the store when the tool is saved (no I/O here).
    url = "http://localhost/x"
    assert validate_http_tool(_body(url=url), PUBLIC)["url"] == url


MCP_URL = "https://mcp.example.com/mcp"


def _mcp_refused(raw: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationFailed) as caught:
        validate_mcp_server(raw, ToolLimits())
    [entry] = caught.value.extra["fields"]
    return entry["field"], entry["message"]


@pytest.mark.parametrize(
    ("headers", "http_tool_ok"),
    [
        ({"X-Key": "v" * 8192}, True),  # one limit for both kinds (the larger)
        ({f"X-H{i}": "v" for i in range(32)}, True),
        ({"x" * 256: "v"}, True),
        ({"Content-Type": "application/x+json"}, True),  # the MCP client's own headers:
        ({"Accept": "text/csv"}, True),  # refused for MCP servers only
        ({"Mcp-Session-Id": "s"}, True),
        ({"MCP-Protocol-Version": "2025-06-18"}, True),
    ],
)
def test_headers_are_checked_alike_for_both_kinds(
    headers: dict[str, str], http_tool_ok: bool
) -> None:
    assert validate_http_tool(_body(headers=headers), PUBLIC)["headers"] == headers
    name = next(iter(headers))
    mcp = {"name": "x", "url": MCP_URL, "headers": headers}
    if name.lower() in ("content-type", "accept", "mcp-session-id", "mcp-protocol-version"):
        assert _mcp_refused(mcp) == (
            f"headers.{name}",
            "set by the service, not by a tool's settings",
        )
    else:
        assert validate_mcp_server(mcp, ToolLimits())["headers"] == headers


@pytest.mark.parametrize(
    ("headers", "field", "says"),
    [
        ({"X-Key": "v" * 8193}, "headers.X-Key", "8192"),
        ({f"X-H{i}": "v" for i in range(33)}, "headers", "32"),
        ({"x" * 257: "v"}, "headers", "not a valid header name"),
        ({"Host": "h"}, "headers.Host", "set by the service"),
        ({"X-Key": "a\r\nb"}, "headers.X-Key", "printable ASCII"),
        ({"A": "1", "a": "2"}, "headers.a", "twice"),
    ],
)
def test_mcp_headers_meet_the_same_rules(headers: Any, field: str, says: str) -> None:
    named, message = _mcp_refused({"name": "x", "url": MCP_URL, "headers": headers})
    assert named == field and says in message
    assert _refused(_body(headers=headers))[0] == field


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://mcp.example.com/" + "x" * 2030, "2048"),
        ("https://user:pw@mcp.example.com/mcp", "credentials"),
        ("https://mcp.example.com/mcp#x", "fragment"),
        ("https://mcp.example.com/{x}", "{ or }"),  # no placeholders in an MCP server's URL
        ("ftp://mcp.example.com/mcp", "absolute"),
        ("http://169.254.169.254/mcp", "outbound_allowed_cidrs"),
    ],
)
def test_mcp_urls_meet_the_same_rules(url: str, says: str) -> None:
    field, message = _mcp_refused({"name": "x", "url": url})
    assert field == "url" and says in message


@pytest.mark.parametrize(
    ("headers", "field", "says"),
    [
        ("X-Api-Key: x", "headers", "object"),
        ([["X-Api-Key", "x"]], "headers", "object"),
        ({f"X-H{i}": "v" for i in range(33)}, "headers", "32"),
        ({"": "v"}, "headers", "not a valid header name"),
        ({"X Api": "v"}, "headers", "not a valid header name"),
        ({"X-Api:": "v"}, "headers", "not a valid header name"),
        ({"X-Ápi": "v"}, "headers", "not a valid header name"),
        ({"x" * 257: "v"}, "headers", "not a valid header name"),
        ({"Host": "evil.example"}, "headers.Host", "set by the service"),
        ({"content-length": "0"}, "headers.content-length", "set by the service"),
        ({"Transfer-Encoding": "chunked"}, "headers.Transfer-Encoding", "set by the service"),
        ({"CONNECTION": "close"}, "headers.CONNECTION", "set by the service"),
        ({"X-Key": 5}, "headers.X-Key", "printable ASCII"),
        ({"X-Key": None}, "headers.X-Key", "printable ASCII"),
        ({"X-Key": "a\r\nHost: evil"}, "headers.X-Key", "printable ASCII"),
        ({"X-Key": "caf\u00e9"}, "headers.X-Key", "printable ASCII"),
        ({"X-Key": "a\tb"}, "headers.X-Key", "printable ASCII"),
        ({"X-Key": "v" * 8193}, "headers.X-Key", "8192"),
        ({"X-Key": "a", "x-key": "b"}, "headers.x-key", "twice"),
    ],
)
def test_bad_headers(headers: Any, field: str, says: str) -> None:
    named, message = _refused(_body(headers=headers))
    assert named == field
    assert says in message


def test_a_header_value_is_never_in_the_message() -> None:
    with pytest.raises(ValidationFailed) as caught:
        validate_http_tool(_body(headers={"Authorization": "Bearer hunter2\x7f"}), PUBLIC)
    assert "hunter2" not in str(caught.value.message)
    assert "hunter2" not in json.dumps(caught.value.extra)


def test_headers_at_their_limits_are_accepted() -> None:
    headers = {f"X-H{i}": "v" for i in range(31)}
    headers["Authorization"] = "B" * 8192
    headers["X-Empty"] = ""
    headers.pop("X-H0")
    assert validate_http_tool(_body(headers=headers), PUBLIC)["headers"] == headers


def test_a_partial_body_checks_only_what_it_holds() -> None:
    assert validate_http_tool({}, PUBLIC, partial=True) == {}
    assert validate_http_tool({"method": "patch"}, PUBLIC, partial=True) == {"method": "PATCH"}
    assert validate_http_tool({"headers": {"X-K": "v"}}, PUBLIC, partial=True) == {
        "headers": {"X-K": "v"}
    }
    # A URL alone: its placeholders are checked once merged with the stored parameters.
    assert validate_http_tool({"url": "https://a.example/{new}"}, PUBLIC, partial=True) == {
        "url": "https://a.example/{new}"
    }
    assert _refused({"name": "Bad"}, partial=True)[0] == "name"
    assert _refused({"url": "http://127.0.0.1/"}, partial=True)[0] == "url"
    assert _refused({"headers": {"Host": "x"}}, partial=True)[0] == "headers.Host"
    assert _refused({"nope": 1}, partial=True)[0] == "nope"
    # Both present: the cross-check runs.
    assert (
        "{new}"
        in _refused(
            {"url": "https://a.example/{new}", "parameters": {"type": "object"}}, partial=True
        )[1]
    )
