"""What both clients share: errors, the description of a call, reading answers, the retry
policy, environment defaults and Server-Sent Events parsing.

Nothing here does I/O, and nothing here is generated: `AsyncClient` (orchestrator/sdk/_async)
and `Client` (its generated twin, orchestrator/sdk/_sync) send the `Call`s their methods
build with these, so the two cannot disagree about a retry or how an answer is read.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from orchestrator.runtime.backoff import Backoff

__all__ = [
    "API_PREFIX",
    "DEFAULT_BASE_URL",
    "IDEMPOTENCY_HEADER",
    "ApiError",
    "AsyncPages",
    "Call",
    "RetryPolicy",
    "SseFrame",
    "SseParser",
    "SyncPages",
    "normalise_base_url",
]

API_PREFIX = "/api/v1"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
USER_AGENT = "orchestrator-sdk/0.2"
REQUEST_ID_HEADER = "X-Request-ID"
BASE_URL_ENV = "ORCH_BASE_URL"
API_KEY_ENV = "ORCH_API_KEY"

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# One page of a paged list, from its offset: what the clients' iterators walk. Two names
# because the async client's fetch is a coroutine; the generator maps one to the other.
AsyncPages = Callable[[int], Awaitable[Sequence[T]]]
SyncPages = Callable[[int], Sequence[T]]


class ApiError(Exception):
    """The service answered with an error (or with something that is not a valid answer).

    `code` is the service's snake_case error code (`unauthorized`, `not_found`, ...);
    `body` is the decoded JSON error body, or None when the body was not JSON (for example
    a proxy's own error page). Network failures are not ApiErrors: httpx raises those.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        request_id: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.body = body

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.code, self.message, self.request_id, self.body))

    def __str__(self) -> str:
        rid = f", request_id={self.request_id}" if self.request_id else ""
        return f"{self.status} {self.code}: {self.message}{rid}"

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, code={self.code!r}, message={self.message!r}, "
            f"request_id={self.request_id!r})"
        )


def normalise_base_url(base_url: str) -> str:
    """`http://host:port`, with or without a trailing `/api/v1` (and slash) -> `.../api/v1`."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    return url if url.endswith(API_PREFIX) else url + API_PREFIX


def resolve_options(
    base_url: str | None, api_key: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str, str | None]:
    """Arguments first, then ORCH_BASE_URL / ORCH_API_KEY (read when the client is made,
    as openai-python reads OPENAI_BASE_URL / OPENAI_API_KEY), then the local default."""
    env = os.environ if environ is None else environ
    url = base_url or env.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    return normalise_base_url(url), api_key or env.get(API_KEY_ENV) or None


# --- reading answers ----------------------------------------------------------------------


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def error_of(response: httpx.Response) -> ApiError:
    body = json_object(response)
    header_id = response.headers.get(REQUEST_ID_HEADER)
    if body is not None and isinstance(body.get("error"), str):
        return ApiError(
            status=response.status_code,
            code=str(body.get("code") or f"http_{response.status_code}"),
            message=body["error"],
            request_id=body.get("request_id") or header_id,
            body=body,
        )
    if body is not None and isinstance(body.get("error"), dict):
        # Anthropic's shape ({"type": "error", "error": {"type", "message"}}) on /messages.
        inner = body["error"]
        return ApiError(
            response.status_code,
            str(inner.get("type") or f"http_{response.status_code}"),
            str(inner.get("message") or ""),
            header_id,
            body,
        )
    text = response.text.strip()
    message = text[:200] if text else (response.reason_phrase or "error")
    return ApiError(response.status_code, f"http_{response.status_code}", message, header_id, body)


def invalid(response: httpx.Response, why: str) -> ApiError:
    return ApiError(
        response.status_code,
        "invalid_response",
        why,
        response.headers.get(REQUEST_ID_HEADER),
        json_object(response),
    )


def model_of(cls: type[M]) -> Callable[[httpx.Response], M]:
    """Reads an answer into its wire model. Fields the model does not name are kept as
    attributes (a newer server's, or a provider's own such as DeepSeek's
    `reasoning_content`), not refused."""

    def parse(response: httpx.Response) -> M:
        body = json_object(response)
        if body is None:
            raise invalid(response, f"expected a JSON object for {cls.__name__}")
        try:
            return cls.model_validate(body, extra="allow")
        except ValidationError as exc:
            raise invalid(response, f"response is not a valid {cls.__name__}: {exc}") from exc

    return parse


def text_of(response: httpx.Response) -> str:
    return response.text


def no_body(_: object) -> None:
    """The answer of a streamed call: read frame by frame, not here."""
    return None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to make, and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    body: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    # Error statuses whose body is still a valid answer (a degraded /health is 503).
    answers: frozenset[int] = field(default_factory=frozenset)


def streamed(call: Call[Any]) -> Call[None]:
    """The same request, answered as Server-Sent Events."""
    return Call(
        call.method, call.path, no_body, body=call.body, headers={"Accept": "text/event-stream"}
    )


def read(call: Call[T], response: httpx.Response) -> T:
    if response.is_success:
        return call.parse(response)
    if response.status_code in call.answers:
        try:
            return call.parse(response)
        except ApiError:
            # Not the documented body (e.g. a proxy's own 503 page): report the error itself.
            pass
    raise error_of(response)


# --- retries -------------------------------------------------------------------------------

RETRY_STATUSES = frozenset({429, 503})
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# Failures where the request cannot have reached the service: safe to resend any method.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# A POST sent with this header is safe to resend too: the service answers a repeat with the
# first answer (docs/api/basics.md), and answers 409 with this code (and Retry-After) while
# the first is still running.
IDEMPOTENCY_HEADER = "Idempotency-Key"
KEY_IN_USE = "idempotency_key_in_use"


def carries_key(call: Call[Any]) -> bool:
    """Whether `call` carries an Idempotency-Key."""
    return any(name.lower() == IDEMPOTENCY_HEADER.lower() for name in call.headers or ())


@dataclass(frozen=True)
class RetryPolicy:
    """429 and 503 (not a documented answer such as a degraded /health), and connection
    failures, are retried `max_retries` times. The wait is the answer's Retry-After (seconds
    or an HTTP date; Retry-After-Ms too) when it gives one of at most `max_retry_after`
    seconds, else `initial` * 2^attempt with jitter, capped at `max_delay`.

    A failure after the request may have been sent (a read error or timeout) is retried for
    idempotent methods only, so a POST that may have created something is never sent twice,
    unless it carries an Idempotency-Key: then a resend is answered with the first answer,
    and the 409 `idempotency_key_in_use` (the first is still running) is retried too.
    """

    max_retries: int = 2
    initial: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def should_retry_status(self, call: Call[Any], response: httpx.Response) -> bool:
        if response.status_code == 409 and carries_key(call):
            body = json_object(response)  # a keyed call is never streamed: its body is read
            return body is not None and body.get("code") == KEY_IN_USE
        return response.status_code in RETRY_STATUSES and response.status_code not in call.answers

    def should_retry_error(
        self, method: str, exc: httpx.TransportError, *, keyed: bool = False
    ) -> bool:
        """`keyed`: the request carries an Idempotency-Key."""
        return isinstance(exc, NOT_SENT) or method.upper() in IDEMPOTENT or keyed

    def backoff(self, attempt: int) -> float:
        # The service's one policy (pure stdlib); jitter: clients do not retry in step.
        return Backoff(base=self.initial, cap=self.max_delay, jitter=0.25).delay(attempt + 1)

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        given = retry_after(response) if response is not None else None
        if given is not None and given <= self.max_retry_after:
            return given
        return self.backoff(attempt)


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the answer asks us to wait, or None when it does not say (or says nonsense)."""
    millis = response.headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# --- Server-Sent Events --------------------------------------------------------------------


@dataclass(frozen=True)
class SseFrame:
    event: str | None
    data: str
    id: str | None


@dataclass
class SseParser:
    """The WHATWG event-stream rules, fed line by line (comments and pings are skipped).
    `retry_ms` is the latest `retry:` the server sent: how soon to reconnect."""

    retry_ms: int | None = None
    _event: str | None = None
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, lines: Iterable[str]) -> list[SseFrame]:
        frames = []
        for line in lines:
            frame = self.line(line)
            if frame is not None:
                frames.append(frame)
        return frames

    def line(self, line: str) -> SseFrame | None:
        if line == "":
            if not self._data and self._event is None:
                return None
            frame = SseFrame(self._event, "\n".join(self._data), self._id)
            self._event, self._data, self._id = None, [], None
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


def stream_error(frame: SseFrame, status: int) -> ApiError:
    """An error sent inside a stream: `event: error` (e.g. subscriber_too_slow), an OpenAI
    `data: {"error": {...}}` or an Anthropic `{"type": "error", "error": {...}}`."""
    try:
        body = json.loads(frame.data)
    except json.JSONDecodeError:
        body = {"error": frame.data}
    if not isinstance(body, dict):
        body = {"error": str(body)}
    inner = body.get("error")
    if isinstance(inner, dict):
        code = str(inner.get("code") or inner.get("type") or "stream_error")
        return ApiError(status, code, str(inner.get("message") or code), None, body)
    code = str(body.get("code") or "stream_error")
    return ApiError(status, code, str(inner or code), None, body)


def headers_for(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def reconnect_delay(policy: RetryPolicy, parser: SseParser, failures: int) -> float:
    """The server's `retry:` after a clean end; backoff (never less) after failures."""
    given = parser.retry_ms / 1000 if parser.retry_ms is not None else policy.initial
    return given if failures == 0 else max(given, policy.backoff(failures - 1))
