"""Users' HTTP tools: a request a user describes once (`POST /tools/http`) that agents call as
`http__<name>`. The URL may hold `{param}` placeholders filled from the call's arguments
(URL-encoded: a value cannot add a `/`, and `.` or `..`, which would walk the path, is
refused); the other arguments go in the query string (GET) or as a JSON body (POST, PUT,
PATCH, DELETE).

The destination is the user's choice, so everything goes through the egress guard
(orchestrator/egress.py): a refused destination is a 400 when the tool is saved (its host
resolved by the store), each connect is checked again on the address it resolves to, and
redirects are never followed (a 3xx is an error result naming the Location). The answer is
read as a stream no further than `tool_result_max_bytes` (+1, to know there was more), so a
huge or endless body costs at most that much memory, and cut there with the runner's cut
(`cut_utf8`). The tool's headers are secrets: sent, never logged, never in an error text.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import re
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from orchestrator.agents._tools import REST_UNKNOWN, cut_utf8
from orchestrator.config import Settings
from orchestrator.egress import DestinationNotAllowed, EgressPolicy, egress_client
from orchestrator.tools._model import CallOutcome, HttpTool
from orchestrator.tools._validate import (
    MAX_URL,
    PLACEHOLDER,
    REFUSED_HEADERS,
    invalid,
    validate_headers,
    validate_name,
    validate_url,
)

__all__ = [
    "METHODS",
    "call_http_tool",
    "http_tools_client",
    "placeholders",
    "validate_http_tool",
]

log = logging.getLogger(__name__)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_QUERY_METHODS = ("GET",)  # the others send what the URL does not use as a JSON body
_FIELDS = ("name", "description", "parameters", "method", "url", "headers")

MAX_DESCRIPTION = 1024
MAX_PROPERTIES = 64
MAX_PARAMETERS_BYTES = 16 * 1024

# Property names as model providers accept them in a tool's input schema (Anthropic's rule).
_PROPERTY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DOT_SEGMENTS = (".", "..")

USER_AGENT = "orchestrator-http-tool"
ACCEPT = "application/json, text/*;q=0.9, */*;q=0.1"


def placeholders(url: str) -> list[str]:
    """The `{param}` names of `url`, in order, each once."""
    return list(dict.fromkeys(PLACEHOLDER.findall(url)))


# --- validation ---------------------------------------------------------------------------


def validate_http_tool(
    raw: Mapping[str, Any], egress: EgressPolicy, *, partial: bool = False
) -> dict[str, Any]:
    """A create body (`partial=False`) or a PUT's changes (`partial=True`: only the fields
    present are checked and returned), normalised: method upper-cased, headers defaulting to
    `{}`. Raises ValidationFailed naming the first bad field.

    A URL's placeholders are checked against `parameters` only when both are present: a
    caller applying a partial change validates the merged tool (`partial=False`) too."""
    if not isinstance(raw, Mapping):
        raise invalid("body", "must be a JSON object")
    for key in raw:
        if key not in _FIELDS:
            raise invalid(str(key), "unknown field")
    if not partial:
        for key in ("name", "description", "parameters", "method", "url"):
            if raw.get(key) is None:
                raise invalid(key, "required")
    out: dict[str, Any] = {}
    if "name" in raw:
        out["name"] = validate_name(raw["name"])
    if "description" in raw:
        out["description"] = _description(raw["description"])
    if "parameters" in raw:
        out["parameters"] = _parameters(raw["parameters"])
    if "method" in raw:
        out["method"] = _method(raw["method"])
    if "url" in raw:
        out["url"] = validate_url(raw["url"], egress, templated=True)
    if "url" in out and "parameters" in out:
        properties = out["parameters"].get("properties", {})
        for param in placeholders(out["url"]):
            if param not in properties:
                raise invalid("url", f"the placeholder {{{param}}} names no property of parameters")
    if "headers" in raw and raw["headers"] is not None:
        out["headers"] = validate_headers(raw["headers"])
    elif not partial:
        out["headers"] = {}
    return out


def _description(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise invalid("description", "a non-empty string")
    if len(value) > MAX_DESCRIPTION:
        raise invalid("description", f"at most {MAX_DESCRIPTION} characters")
    return value


def _parameters(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise invalid("parameters", 'a JSON Schema object: {"type": "object", "properties": {...}}')
    if value.get("type") != "object":
        raise invalid("parameters.type", 'must be "object"')
    properties = value.get("properties", {})
    if not isinstance(properties, Mapping):
        raise invalid("parameters.properties", "must be an object of property schemas")
    if len(properties) > MAX_PROPERTIES:
        raise invalid("parameters.properties", f"at most {MAX_PROPERTIES} properties")
    for key, schema in properties.items():
        if not isinstance(key, str) or not _PROPERTY.fullmatch(key):
            raise invalid(
                f"parameters.properties.{key}", "a name of 1-64 characters of A-Z a-z 0-9 _ . -"
            )
        if not isinstance(schema, Mapping):
            raise invalid(f"parameters.properties.{key}", "must be a JSON Schema object")
    required = value.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise invalid("parameters.required", "must be a list of property names")
    for name in required:
        if name not in properties:
            raise invalid("parameters.required", f"{name!r} is not a property")
    if len(set(required)) != len(required):
        raise invalid("parameters.required", "a property is named twice")
    try:
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError):
        raise invalid("parameters", "must be plain JSON") from None
    if size > MAX_PARAMETERS_BYTES:
        raise invalid("parameters", f"at most {MAX_PARAMETERS_BYTES} bytes serialised")
    out = dict(value)
    out["properties"] = dict(properties)
    return out


def _method(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in METHODS:
        raise invalid("method", "one of GET, POST, PUT, PATCH, DELETE")
    return value.upper()


# --- calling ------------------------------------------------------------------------------


def http_tools_client(settings: Settings) -> httpx.AsyncClient:
    """The client HTTP tools are called through: egress-guarded, no redirects, the read
    timeout `http_tool_timeout_s` (also each call's total deadline, `call_http_tool`)."""
    timeout = settings.http_tool_timeout_s
    return egress_client(
        settings.outbound_allowed_cidrs,
        (),
        httpx.Timeout(timeout, connect=min(5.0, timeout)),
    )


def _text(value: Any) -> str:
    """An argument as it goes into a URL: bools lower-case, other non-scalars as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _Refused(Exception):
    """A call that cannot be made from its arguments: the message is the error result."""


def _filled(template: str, arguments: Mapping[str, Any]) -> str:
    """`template` with its placeholders filled, each value URL-encoded (a `/` in one stays in
    its segment). A path segment the values make `.` or `..` is refused: the client resolves
    it (`/users/{id}/profile` with `..` is `/profile`), and the tool's headers would go where
    its author never pointed them."""

    def fill(part: str) -> str:
        return PLACEHOLDER.sub(lambda m: quote(_text(arguments[m.group(1)]), safe=""), part)

    path, mark, query = template.partition("?")
    filled = fill(path)
    for before, after in zip(path.split("/"), filled.split("/"), strict=True):
        if after in _DOT_SEGMENTS and before != after:
            names = " and ".join(repr(n) for n in placeholders(before))
            raise _Refused(
                f"the argument {names} may not make the path segment {after!r}: it would "
                "change which URL is called (nothing was sent)"
            )
    return filled + mark + fill(query)


def _request_parts(
    tool: HttpTool, arguments: Mapping[str, Any]
) -> tuple[str, dict[str, str], bytes | None]:
    """The URL, the headers and the body of a call of `tool` with `arguments`."""
    used = placeholders(tool.url)
    for param in used:
        if arguments.get(param) is None:
            raise _Refused(f"missing argument {param!r}: the URL needs it ({{{param}}})")
    url = _filled(tool.url, arguments).split("#", 1)[0]
    rest = {k: v for k, v in arguments.items() if k not in used}
    headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT, "Accept-Encoding": "identity"}
    body: bytes | None = None
    if tool.method in _QUERY_METHODS:
        pairs = [(str(k), _text(v)) for k, v in rest.items() if v is not None]
        if pairs:
            query = urlencode(pairs, quote_via=quote, safe="")
            joiner = "" if url.endswith(("?", "&")) else "&" if "?" in url else "?"
            url = f"{url}{joiner}{query}"
    else:
        try:
            body = json.dumps(
                rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode()
        except (TypeError, ValueError):
            raise _Refused("the arguments are not plain JSON") from None
        headers["Content-Type"] = "application/json"
    # The tool's own headers win over the defaults above, whatever their case.
    for name, value in tool.headers.items():
        if name.lower() in REFUSED_HEADERS:
            continue
        for default in [h for h in headers if h.lower() == name.lower()]:
            del headers[default]
        headers[name] = value
    return url, headers, body


class _Decoder:
    """The answer's bytes as sent, decoded when a server compresses although asked not to
    (`Accept-Encoding: identity`); a decompressed chunk is bounded by what is still wanted,
    so a small compressed body cannot inflate past the cut."""

    def __init__(self, encoding: str) -> None:
        encoding = encoding.strip().lower()
        self._z: zlib._Decompress | None
        if encoding in ("", "identity"):
            self._z = None
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj()
        else:
            raise _Refused(f"the answer's Content-Encoding {encoding[:40]!r} is not supported")

    def decode(self, chunk: bytes, wanted: int) -> bytes:
        if self._z is None:
            return chunk[:wanted]
        try:
            return self._z.decompress(self._z.unconsumed_tail + chunk, wanted)
        except zlib.error:
            raise _Refused("the answer's compressed body is corrupt") from None


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """The body, read no further than `max_bytes` + 1 bytes, and whether it went past
    `max_bytes` (then it is cut, and there may be more that was never read)."""
    decoder = _Decoder(response.headers.get("content-encoding", ""))
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += decoder.decode(chunk, max_bytes + 1 - len(body))
        if len(body) > max_bytes:
            return bytes(body), True
    return bytes(body), False


def _as_text(body: bytes, cut: bool, headers: httpx.Headers) -> tuple[str, int | None]:
    """The body as text, and what `cut_utf8` is told of the bytes never read (`omitted`):
    None when the body was read whole, their number when the answer gave its length, else
    REST_UNKNOWN."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    # Not final when cut: a character the read split in two is dropped, not shown as U+FFFD.
    text = decoder.decode(body, final=not cut)
    if not cut:
        return text, None
    read = len(body) - len(decoder.getstate()[0])
    encoding = headers.get("content-encoding", "").strip().lower()
    try:
        total = int(headers.get("content-length", ""))
    except ValueError:
        return text, REST_UNKNOWN
    if encoding not in ("", "identity") or total < read:
        return text, REST_UNKNOWN  # (a compressed body's length is not the text's)
    return text, total - read


async def call_http_tool(
    tool: HttpTool,
    arguments: Mapping[str, Any],
    client: httpx.AsyncClient,
    max_bytes: int,
    *,
    timeout_s: float | None = None,
) -> CallOutcome:
    """Call `tool` with `arguments` through `client` (`http_tools_client`): a 2xx gives the
    body (in at most `max_bytes`, the note of a cut included), anything else an error result
    saying what happened. The whole call, body included, ends within `timeout_s` (default:
    the client's read timeout). Never raises but CancelledError."""
    if not isinstance(arguments, Mapping):
        return CallOutcome("the arguments must be a JSON object", is_error=True)
    deadline = timeout_s if timeout_s is not None else client.timeout.read
    try:
        url, headers, body = _request_parts(tool, arguments)
        async with asyncio.timeout(deadline):
            async with client.stream(
                tool.method, url, headers=headers, content=body, follow_redirects=False
            ) as response:
                status = response.status_code
                answered = response.headers
                location = answered.get("location")
                if 300 <= status < 400 and location is not None:
                    return CallOutcome(
                        f"HTTP {status}: redirects are not followed "
                        f"(the answer points to {location[:MAX_URL]})",
                        is_error=True,
                    )
                raw, cut = await _read_capped(response, max_bytes)
    except _Refused as exc:
        return CallOutcome(str(exc), is_error=True)
    except TimeoutError:
        return CallOutcome(f"the request timed out after {deadline:g} s", is_error=True)
    except httpx.TimeoutException:
        return CallOutcome("the request timed out", is_error=True)
    except DestinationNotAllowed:
        return CallOutcome(
            "destination not allowed: the host resolves to a private, loopback, link-local "
            "or metadata address (outbound_allowed_cidrs)",
            is_error=True,
        )
    except httpx.ConnectError as exc:
        return CallOutcome(f"could not connect: {exc}", is_error=True)
    except httpx.LocalProtocolError as exc:
        # Our side of the request: its message could quote a header value.
        return CallOutcome(f"the request could not be sent ({type(exc).__name__})", is_error=True)
    except httpx.HTTPError as exc:
        return CallOutcome(f"the request failed: {type(exc).__name__}: {exc}", is_error=True)
    except httpx.InvalidURL:
        return CallOutcome("the URL is not valid once its placeholders are filled", is_error=True)
    except Exception as exc:  # noqa: BLE001 - a tool call's failure is its error result
        # The message could quote a header value: only the type is logged.
        log.warning("HTTP tool %s failed unexpectedly: %s", tool.id, type(exc).__name__)
        return CallOutcome(f"the request failed ({type(exc).__name__})", is_error=True)
    text, omitted = _as_text(raw, cut, answered)
    if 200 <= status < 300:
        return CallOutcome(cut_utf8(text, max_bytes, omitted=omitted))
    if not text:
        reason = f" {response.reason_phrase}" if response.reason_phrase else ""
        return CallOutcome(f"HTTP {status}{reason}", is_error=True)
    # The status counts in the limit: what the model gets is never cut again.
    return CallOutcome(cut_utf8(f"HTTP {status}: {text}", max_bytes, omitted=omitted), True)
