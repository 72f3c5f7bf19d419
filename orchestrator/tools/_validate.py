"""The checks an MCP server's registration (`_registration.py`) and an HTTP tool (`_http.py`)
share: a name, a URL the service will call (through the egress guard, as webhooks), and
headers whose values are secrets. One set of rules and limits for both kinds, so a header
or a URL one accepts the other does not refuse for another reason; a message names the bad
field and never quotes a header value."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from orchestrator.egress import EgressPolicy
from orchestrator.errors import ValidationFailed
from orchestrator.tools._model import NAME_PATTERN, NAME_RULE

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_NAME",
    "MAX_HEADER_VALUE",
    "MAX_URL",
    "MCP_CLIENT_HEADERS",
    "PLACEHOLDER",
    "REFUSED_HEADERS",
    "URL_REFUSED",
    "invalid",
    "validate_headers",
    "validate_name",
    "validate_url",
]

MAX_URL = 2048
MAX_HEADERS = 32
MAX_HEADER_NAME = 256
MAX_HEADER_VALUE = 8192
# The framing and routing of a request are the service's: a header that set them could
# smuggle a second request or aim the guarded connection at another virtual host.
REFUSED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
# The MCP client frames its requests and keeps its session in these (refused for MCP
# servers only: an HTTP tool may set its own Content-Type and Accept).
MCP_CLIENT_HEADERS = frozenset({"content-type", "accept", "mcp-session-id", "mcp-protocol-version"})
URL_REFUSED = "destination not allowed (outbound_allowed_cidrs)"

# `{param}`: an HTTP tool's URL placeholder (a property name as providers accept one).
PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.-]{1,64})\}")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_URL_CHARS = re.compile(r"[\x21-\x7e]+")  # no space, no control, no non-ASCII


def invalid(field_name: str, message: str) -> ValidationFailed:
    """The 400 of one bad field (DESIGN.md's error body names it)."""
    return ValidationFailed(
        f"{field_name}: {message}",
        extra={"fields": [{"field": field_name, "message": message}]},
    )


def validate_name(value: Any) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise invalid("name", NAME_RULE)
    return value


def validate_url(value: Any, egress: EgressPolicy, *, templated: bool = False) -> str:
    """An absolute http(s) URL the service will call: no credentials (they go in headers,
    kept secret), no fragment, not a literal address the egress guard refuses (a host name is
    resolved by the store: `destination_refused`). `templated`: `{param}` placeholders may
    stand in its path and query (an HTTP tool's); elsewhere a brace is refused."""
    if not isinstance(value, str) or not value:
        raise invalid("url", "an absolute http or https URL")
    if len(value) > MAX_URL:
        raise invalid("url", f"at most {MAX_URL} characters")
    if not _URL_CHARS.fullmatch(value):
        raise invalid("url", "no spaces, control or non-ASCII characters (percent-encode them)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise invalid("url", "not a valid URL (its host or port)") from None
    if parts.scheme not in ("http", "https"):
        raise invalid("url", "an absolute http or https URL")
    if templated and ("{" in parts.netloc or "}" in parts.netloc):
        raise invalid("url", "placeholders may be in the path and query only, not in the host")
    if "@" in parts.netloc:
        raise invalid("url", "no credentials in the URL: put them in headers (kept secret)")
    if not parts.hostname:
        raise invalid("url", "names no host")
    if parts.fragment or value.endswith("#"):
        raise invalid("url", "no fragment: it is never sent")
    rest = PLACEHOLDER.sub("", value) if templated else value
    if "{" in rest or "}" in rest:
        if templated:
            message = "a { or } that is not a {param} placeholder (percent-encode it: %7B %7D)"
        else:
            message = "no { or } (percent-encode them: %7B %7D)"
        raise invalid("url", message)
    if egress.literal_refused(value):
        raise invalid("url", URL_REFUSED)
    return value


def validate_headers(value: Any, *, refused: frozenset[str] = frozenset()) -> dict[str, str]:
    """Header names to values (secrets: no message quotes one). `refused`: lower-case names
    refused besides `REFUSED_HEADERS` (an MCP server's: `MCP_CLIENT_HEADERS`). `***` is a
    valid value here: the store puts the stored value of that name in its place."""
    if not isinstance(value, Mapping):
        raise invalid("headers", "must be an object of header names to string values")
    if len(value) > MAX_HEADERS:
        raise invalid("headers", f"at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    out: dict[str, str] = {}
    for name, header in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME:
            raise invalid("headers", f"{str(name)[:64]!r} is not a valid header name")
        lower = name.lower()
        if lower in REFUSED_HEADERS or lower in refused:
            raise invalid(f"headers.{name}", "set by the service, not by a tool's settings")
        if lower in seen:
            raise invalid(f"headers.{name}", "given twice (header names ignore case)")
        seen.add(lower)
        if not isinstance(header, str) or not _PRINTABLE.fullmatch(header):
            raise invalid(f"headers.{name}", "the value must be a string of printable ASCII")
        if len(header) > MAX_HEADER_VALUE:
            raise invalid(f"headers.{name}", f"the value is at most {MAX_HEADER_VALUE} characters")
        out[name] = header
    return out
