"""A real loopback HTTP server that speaks Anthropic's Messages API byte for byte.

Usage::

    async with FakeAnthropic() as fake:        # or `with FakeAnthropic() as fake:` (sync)
        fake.enqueue(text_reply("Hello!"), tool_reply("get_weather", {"city": "Paris"}))
        client = anthropic.AsyncAnthropic(base_url=fake.url, api_key=fake.api_key)
        ...
        fake.requests[-1].json["messages"], fake.requests[-1].headers["x-api-key"]

`fake.url` is the API root (`http://127.0.0.1:<port>`, like https://api.anthropic.com; the
endpoints are under `/v1`). Served by uvicorn on a free loopback port, in a thread.

Endpoints:
- `POST /v1/messages`: the next scripted reply (a `Reply`, an `ErrorReply`, or a callable
  taking the request JSON and returning one); with none queued, `FakeAnthropic.default`
  (by default an echo: `text_reply("echo: <last user text>")`). `stream: true` answers with
  `text/event-stream` in Anthropic's exact event sequence: `message_start`,
  `content_block_start`, a `ping` after the first block start, `content_block_delta`s
  (`text_delta`, `thinking_delta` + one `signature_delta`, `input_json_delta` starting with
  an empty fragment, all cut every `Reply.chunk` characters, so JSON splits mid-token),
  `content_block_stop`, `message_delta` (stop reason, cumulative `output_tokens`),
  `message_stop`. Otherwise a Message JSON object.
- `POST /v1/messages/count_tokens`: `{"input_tokens": N}` (`fake.token_count`, or the
  request's JSON size / 4), the body checked like a Messages body without `max_tokens`.
- `GET /v1/models`: the `models` list in Anthropic's page format (ModelInfo: id, type,
  display_name, created_at, `max_input_tokens` from `fake.context` (default 200000),
  `max_tokens`), paged by `limit` / `after_id` (`has_more`, `last_id`), or
  `fake.models_error`.

Checks, each answered as Anthropic does (`{"type":"error","error":{type,message},
"request_id"}` with a `request-id` header): a wrong or missing `x-api-key` (when `api_key`
is set) -> 401 authentication_error; no `anthropic-version` header, a body without `model`,
`max_tokens` or `messages`, and (with `strict`, the default) roles that do not alternate,
a first message that is not `user`, empty text blocks or empty content, a thinking block
without signature, `thinking` enabled without `budget_tokens` >= 1024 and < `max_tokens`,
`output_config.format` that is not `{type: json_schema, schema: {...}}` -> 400
invalid_request_error. The fields and blocks accepted are those of anthropic-sdk-python
0.121.0 (commit 009b035, `types/message_create_params.py`; with `?beta=true`, as the SDK's beta
client sends, `types/beta/message_create_params.py`): any other top-level field is
"<field>: Extra inputs are not permitted" (Anthropic's pydantic message); a `system`-role
message, `context_management` and the other beta-only fields need `?beta=true` or an
`anthropic-beta` header; `thinking`
is enabled (budget), disabled or adaptive; `output_config.effort` one of low, medium, high,
xhigh, max; `cache_control` is `{type: ephemeral, ttl?: 5m|1h}` on at most 4 blocks
(system, message blocks, tools, and the top-level one), else "A maximum of 4 blocks with
cache_control may be provided. Found N."; a `document` block's source is base64
(application/pdf), text (text/plain), url, content or file. `Reply.cache_creation_input_tokens`
and `cache_read_input_tokens` are the cache usage answered (message_start and the Message).

Failure modes: `ErrorReply(status, type, message, headers)` (helpers `rate_limited(retry_after)`
429 with `retry-after`, `overloaded()` 529, `unauthorized()` 401); `Reply.error_after=n`:
`event: error` (`Reply.error`, default overloaded_error) after n stream frames, then the body
ends cleanly; `Reply.drop_after=n`: the connection is closed after n frames without ending
the chunked body (the client sees a broken stream); `Reply.delay_s`: a pause before every
frame. `message_events(reply, model, id)` returns the (event, data) list a stream sends.

On the wire as api.anthropic.com answers (its Messages streaming and errors documentation,
the rate-limit headers of its rate-limits page): the stream is `content-type:
text/event-stream; charset=utf-8` with `cache-control: no-cache`; every answer carries
`request-id`, `anthropic-organization-id`, the `anthropic-ratelimit-*` headers and the
Cloudflare front's `server: cloudflare`, `cf-ray`, `cf-cache-status`, `via`, `x-robots-tag`;
JSON answers are `application/json` (no charset); JSON is compact and raw UTF-8 in events,
as Anthropic writes it. `Reply.line_end` (e.g. CRLF) and `Reply.byte_chunk` (the body cut
every K bytes, inside multi-byte characters too) change how a stream goes out.

The problem of each body refused by these checks is recorded in `fake.violations`. Every
request is recorded in `fake.requests` (`Received`: method, path, lowercase headers, raw
body, parsed JSON).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from tests.fakes._loopback import reframe

__all__ = [
    "DEFAULT_MODELS",
    "ErrorReply",
    "FakeAnthropic",
    "Received",
    "Reply",
    "error_reply",
    "message_events",
    "overloaded",
    "rate_limited",
    "text_reply",
    "thinking_reply",
    "tool_reply",
    "unauthorized",
]

DEFAULT_MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")
ORGANIZATION = "5f2a0c1e-7d3b-4e8a-9c6f-1b2d3e4f5a6b"


@dataclass
class Reply:
    """One successful answer. `content`: Anthropic response content blocks (dicts)."""

    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    input_tokens: int = 12
    output_tokens: int = 7
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    model: str | None = None  # default: the model the request named
    id: str | None = None  # default: a new msg_... id
    chunk: int = 3  # characters per streamed delta
    ping: bool = True
    delay_s: float = 0.0
    error_after: int | None = None
    error: tuple[str, str] = ("overloaded_error", "Overloaded")
    drop_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    line_end: str = "\n"
    byte_chunk: int | None = None


@dataclass
class ErrorReply:
    status: int
    type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any


Script = Reply | ErrorReply | Callable[[dict[str, Any]], "Reply | ErrorReply"]


def text_reply(text: str, **kw: Any) -> Reply:
    return Reply([{"type": "text", "text": text}], **kw)


def tool_reply(
    name: str,
    tool_input: dict[str, Any],
    *,
    id: str | None = None,
    text: str | None = None,
    **kw: Any,
) -> Reply:
    """A tool call (after an optional text block), stop_reason tool_use."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    tool_id = id or f"toolu_{uuid.uuid4().hex[:24]}"
    blocks.append({"type": "tool_use", "id": tool_id, "name": name, "input": tool_input})
    kw.setdefault("stop_reason", "tool_use")
    return Reply(blocks, **kw)


def thinking_reply(thinking: str, text: str, *, signature: str = "sig-fake", **kw: Any) -> Reply:
    blocks = [
        {"type": "thinking", "thinking": thinking, "signature": signature},
        {"type": "text", "text": text},
    ]
    return Reply(blocks, **kw)


def error_reply(status: int, type: str, message: str, **headers: str) -> ErrorReply:
    return ErrorReply(status, type, message, dict(headers))


def rate_limited(retry_after: int = 7) -> ErrorReply:
    return ErrorReply(
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit",
        {"retry-after": str(retry_after)},
    )


def overloaded() -> ErrorReply:
    return ErrorReply(529, "overloaded_error", "Overloaded")


def unauthorized() -> ErrorReply:
    return ErrorReply(401, "authentication_error", "invalid x-api-key")


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def _usage(reply: Reply, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "cache_creation_input_tokens": reply.cache_creation_input_tokens,
        "cache_read_input_tokens": reply.cache_read_input_tokens,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _message(reply: Reply, model: str, message_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": reply.content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "usage": _usage(reply, reply.output_tokens),
    }


def _block_events(index: int, block: dict[str, Any], chunk: int) -> list[tuple[str, Any]]:
    kind = block.get("type")
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"], chunk)]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        pieces = _pieces(block["thinking"], chunk)
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        pieces = ["", *_pieces(json.dumps(block["input"]), chunk)]
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    else:
        start = block  # redacted_thinking and server-tool blocks arrive whole
    events: list[tuple[str, Any]] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def message_events(reply: Reply, model: str, message_id: str) -> list[tuple[str, Any]]:
    """The (event name, data) pairs of a streamed `reply`, as Anthropic sends them."""
    start = _message(reply, model, message_id)
    start.update(content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = _usage(reply, min(1, reply.output_tokens))
    events: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(reply.content):
        block_events = _block_events(index, block, reply.chunk)
        if index == 0 and reply.ping:
            block_events.insert(1, ("ping", {"type": "ping"}))
        events += block_events
    if not reply.content and reply.ping:
        events.append(("ping", {"type": "ping"}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence},
                "usage": {"output_tokens": reply.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _frame(name: str, data: Any) -> bytes:
    if name == "ping":
        return b'event: ping\ndata: {"type": "ping"}\n\n'
    return f"event: {name}\ndata: {_compact(data)}\n\n".encode()


def _compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _api_headers(request_id: str) -> dict[str, str]:
    """What every api.anthropic.com answer carries besides its content type."""
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    headers = {"request-id": request_id, "anthropic-organization-id": ORGANIZATION}
    for kind, limit in (("requests", 4000), ("input-tokens", 2000000), ("output-tokens", 400000)):
        prefix = f"anthropic-ratelimit-{kind}"
        headers |= {
            f"{prefix}-limit": str(limit),
            f"{prefix}-remaining": str(limit - 1),
            f"{prefix}-reset": reset,
        }
    return headers | {
        "via": "1.1 google",
        "cf-cache-status": "DYNAMIC",
        "x-robots-tag": "none",
        "server": "cloudflare",
        "cf-ray": f"{uuid.uuid4().hex[:16]}-SJC",
    }


def _echo(body: dict[str, Any]) -> Reply:
    text = ""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                text = content
            else:
                text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
            break
    return text_reply(f"echo: {text}")


# MessageCreateParams of anthropic-sdk-python 0.121.0, and the beta one's extra fields.
FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "cache_control",
        "container",
        "inference_geo",
        "metadata",
        "output_config",
        "service_tier",
        "stop_sequences",
        "stream",
        "system",
        "temperature",
        "thinking",
        "tool_choice",
        "tools",
        "top_k",
        "top_p",
    }
)
BETA_FIELDS = FIELDS | {
    "context_management",
    "diagnostics",
    "fallback_credit_token",
    "fallbacks",
    "mcp_servers",
    "output_format",
    "speed",
}
# MessageCountTokensParams (beta included).
COUNT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "cache_control",
        "context_management",
        "mcp_servers",
        "output_config",
        "output_format",
        "speed",
    }
)
EFFORTS = ("low", "medium", "high", "xhigh", "max")
DOCUMENT_SOURCES = {
    "base64": ("media_type", "application/pdf"),
    "text": ("media_type", "text/plain"),
    "url": ("url", None),
    "content": ("content", None),
    "file": ("file_id", None),
}


def _check(body: Any, strict: bool, *, beta: bool = False, count: bool = False) -> str | None:
    """Anthropic's 400 message for a request it would reject, else None."""
    if not isinstance(body, dict):
        return "body: Input should be an object"
    allowed = COUNT_FIELDS if count else BETA_FIELDS if beta else FIELDS
    for key in body:
        if key not in allowed:
            return f"{key}: Extra inputs are not permitted"
    for key in ("model", "messages") if count else ("model", "max_tokens", "messages"):
        if key not in body:
            return f"{key}: Field required"
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    roles = ("user", "assistant", "system") if beta else ("user", "assistant")
    for i, message in enumerate(messages):
        if message.get("role") not in roles:
            return f"messages.{i}.role: Input should be {' or '.join(map(repr, roles))}"
    problem = _check_cache_and_documents(body)
    if problem is not None or not strict:
        return problem
    turns = [m for m in messages if m.get("role") != "system"]
    if not turns or turns[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    for i, message in enumerate(messages):
        role = message.get("role")
        if i and messages[i - 1].get("role") == role and role != "system":
            return (
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row'
            )
        content = message.get("content")
        if content == [] or content == "":
            return f"messages.{i}: all messages must have non-empty content"
        for j, block in enumerate(content if isinstance(content, list) else []):
            if block.get("type") == "text" and not block.get("text"):
                return f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
            if block.get("type") == "thinking" and not block.get("signature"):
                return f"messages.{i}.content.{j}.thinking.signature: Field required"
            if block.get("type") == "redacted_thinking" and not block.get("data"):
                return f"messages.{i}.content.{j}.redacted_thinking.data: Field required"
    if "tool_choice" in body and not body.get("tools"):
        return "tool_choice: tool_choice may only be specified while providing tools"
    return _check_options(body, count=count)


def _blocks(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every block of the request that may carry cache_control, with its path."""
    out: list[tuple[str, dict[str, Any]]] = []
    system = body.get("system")
    if isinstance(system, list):
        out += [(f"system.{i}", b) for i, b in enumerate(system) if isinstance(b, dict)]
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            out.append((f"messages.{i}.content.{j}", block))
            inner = block.get("content")
            if block.get("type") == "tool_result" and isinstance(inner, list):
                out += [(f"messages.{i}.content.{j}.content.{k}", b) for k, b in enumerate(inner)]
    out += [(f"tools.{i}", t) for i, t in enumerate(body.get("tools") or [])]
    return out


def _check_cache_and_documents(body: dict[str, Any]) -> str | None:
    blocks = _blocks(body)
    marked = [(p, b["cache_control"]) for p, b in blocks if b.get("cache_control") is not None]
    if body.get("cache_control") is not None:
        marked.append(("cache_control", body["cache_control"]))
    for path, control in marked:
        if not isinstance(control, dict) or control.get("type") != "ephemeral":
            return f"{path}.cache_control.type: Input should be 'ephemeral'"
        if set(control) - {"type", "ttl"} or control.get("ttl", "5m") not in ("5m", "1h"):
            return f"{path}.cache_control.ttl: Input should be '5m' or '1h'"
    if len(marked) > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {len(marked)}."
    for path, block in blocks:
        if block.get("type") != "document":
            continue
        source = block.get("source") if isinstance(block.get("source"), dict) else {}
        kind = source.get("type")
        if kind not in DOCUMENT_SOURCES:
            return f"{path}.source: Input tag {kind!r} does not match the document sources"
        key, media = DOCUMENT_SOURCES[kind]
        if media is not None and source.get(key) != media:
            return f"{path}.source.media_type: Input should be '{media}'"
        if media is None and not source.get(key):
            return f"{path}.source.{key}: Field required"
        if kind in ("base64", "text") and not isinstance(source.get("data"), str):
            return f"{path}.source.data: Field required"
    return None


def _check_options(body: dict[str, Any], *, count: bool = False) -> str | None:
    """`thinking` and `output_config` as the Messages reference documents them."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if not count and budget >= body["max_tokens"]:
            return "`max_tokens` must be greater than `thinking.budget_tokens`"
    elif thinking is not None and not (
        isinstance(thinking, dict) and thinking.get("type") in ("disabled", "adaptive")
    ):
        return "thinking: Input tag does not match 'enabled', 'disabled', 'adaptive'"
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"effort", "format", "task_budget"}:
            return "output_config: Extra inputs are not permitted"
        if config.get("effort") is not None and config["effort"] not in EFFORTS:
            return f"output_config.effort: Input should be {', '.join(map(repr, EFFORTS))}"
        fmt = config.get("format")
        if fmt is not None and (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(fmt.get("schema"), dict)
            or set(fmt) - {"type", "schema"}
        ):
            return "output_config.format: expected {type: 'json_schema', schema: {...}}"
    return None


class FakeAnthropic:
    """The fake API server; see the module docstring."""

    def __init__(
        self,
        *,
        api_key: str | None = "sk-ant-fake-key",
        models: tuple[str, ...] = DEFAULT_MODELS,
        strict: bool = True,
        default: Callable[[dict[str, Any]], Reply | ErrorReply] = _echo,
    ) -> None:
        self.api_key = api_key
        self.models = models
        self.strict = strict
        self.default = default
        self.models_error: ErrorReply | None = None
        # model id -> max_input_tokens in GET /v1/models (others: 200000)
        self.context: dict[str, int] = {}
        # The count /v1/messages/count_tokens answers (None: the body's JSON size / 4), or
        # an ErrorReply.
        self.token_count: int | ErrorReply | None = None
        # Problems `_check` found in /v1/messages bodies (each answered with a 400).
        self.violations: list[str] = []
        self.requests: list[Received] = []
        self._script: collections.deque[Script] = collections.deque()
        self._lock = threading.Lock()
        self.port = 0
        self.url = ""
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
            server_header=False,  # Anthropic's front says `server: cloudflare`
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    # --- scripting ----------------------------------------------------------------------
    def enqueue(self, *replies: Script) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet used."""
        return len(self._script)

    def _next(self, body: dict[str, Any]) -> Reply | ErrorReply:
        with self._lock:
            item = self._script.popleft() if self._script else self.default
        return item(body) if callable(item) else item

    # --- lifecycle ----------------------------------------------------------------------
    def _started(self) -> bool:
        if not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the fake Anthropic server failed to start")
            return False
        self.port = int(self.server.servers[0].sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        return True

    def start(self) -> FakeAnthropic:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self._started():
            if time.monotonic() > deadline:
                raise RuntimeError("the fake Anthropic server did not start in time")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeAnthropic:
        self.thread.start()
        for _ in range(1000):
            if self._started():
                return self
            await asyncio.sleep(0.01)
        raise RuntimeError("the fake Anthropic server did not start in time")

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)

    # --- the ASGI app -------------------------------------------------------------------
    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        method, path = scope["method"], scope["path"]
        self.requests.append(Received(method, path, headers, raw, parsed))
        request_id = f"req_{uuid.uuid4().hex[:24]}"

        # anthropic-python >= 2 sends `Authorization: Bearer <key>`; earlier ones `x-api-key`.
        keys = {headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")}
        if self.api_key is not None and self.api_key not in keys:
            return await self._error(send, unauthorized(), request_id)
        if "anthropic-version" not in headers:
            error = ErrorReply(
                400, "invalid_request_error", "anthropic-version: header is required"
            )
            return await self._error(send, error, request_id)
        query = scope.get("query_string", b"").decode()
        # The beta surface: the SDK's beta client marks it with ?beta=true, the API gates it
        # on the anthropic-beta header; either opens it here.
        beta = urllib.parse.parse_qs(query).get("beta") == ["true"] or bool(
            headers.get("anthropic-beta")
        )
        if method == "GET" and path == "/v1/models":
            return await self._models(send, request_id, query)
        if method == "POST" and path == "/v1/messages/count_tokens":
            return await self._count(send, request_id, raw, parsed, beta)
        if method != "POST" or path != "/v1/messages":
            error = ErrorReply(404, "not_found_error", "Not found")
            return await self._error(send, error, request_id)
        if raw and parsed is None:
            error = ErrorReply(400, "invalid_request_error", "There was an error parsing the body")
            return await self._error(send, error, request_id)
        problem = _check(parsed, self.strict, beta=beta)
        if problem is not None:
            self.violations.append(problem)
            return await self._error(
                send, ErrorReply(400, "invalid_request_error", problem), request_id
            )
        reply = self._next(parsed)
        if isinstance(reply, ErrorReply):
            return await self._error(send, reply, request_id)
        model = reply.model or parsed["model"]
        message_id = reply.id or f"msg_{uuid.uuid4().hex[:24]}"
        if parsed.get("stream"):
            return await self._stream(receive, send, reply, model, message_id, request_id)
        body = json.dumps(_message(reply, model, message_id), ensure_ascii=False).encode()
        await self._respond(send, 200, body, "application/json", request_id, reply.headers)

    async def _respond(
        self,
        send: Any,
        status: int,
        body: bytes,
        content_type: str,
        request_id: str,
        extra: dict[str, str],
    ) -> None:
        headers = {"content-type": content_type, **_api_headers(request_id), **extra}
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _error(self, send: Any, error: ErrorReply, request_id: str) -> None:
        body = {
            "type": "error",
            "error": {"type": error.type, "message": error.message},
            "request_id": request_id,
        }
        headers = {
            "x-should-retry": "true"
            if error.status in (408, 409, 429) or error.status >= 500
            else "false"
        }
        headers.update(error.headers)
        data = json.dumps(body).encode()
        await self._respond(send, error.status, data, "application/json", request_id, headers)

    async def _count(self, send: Any, request_id: str, raw: bytes, parsed: Any, beta: bool) -> None:
        if raw and parsed is None:
            error = ErrorReply(400, "invalid_request_error", "There was an error parsing the body")
            return await self._error(send, error, request_id)
        problem = _check(parsed, self.strict, beta=beta, count=True)
        if problem is not None:
            self.violations.append(problem)
            error = ErrorReply(400, "invalid_request_error", problem)
            return await self._error(send, error, request_id)
        if isinstance(self.token_count, ErrorReply):
            return await self._error(send, self.token_count, request_id)
        count = self.token_count if self.token_count is not None else max(1, len(raw) // 4)
        body = json.dumps({"input_tokens": count}).encode()
        await self._respond(send, 200, body, "application/json", request_id, {})

    async def _models(self, send: Any, request_id: str, query: str = "") -> None:
        if self.models_error is not None:
            return await self._error(send, self.models_error, request_id)
        args = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
        limit = int(args.get("limit", "20"))
        ids = list(self.models)
        start = ids.index(args["after_id"]) + 1 if args.get("after_id") in ids else 0
        data = [
            {
                "type": "model",
                "id": m,
                "display_name": m,
                "created_at": "2025-05-14T00:00:00Z",
                "max_input_tokens": self.context.get(m, 200_000),
                "max_tokens": 64_000,
            }
            for m in ids[start : start + limit]
        ]
        page = {
            "data": data,
            "has_more": start + limit < len(ids),
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
        await self._respond(
            send, 200, json.dumps(page).encode(), "application/json", request_id, {}
        )

    async def _stream(
        self,
        receive: Any,
        send: Any,
        reply: Reply,
        model: str,
        message_id: str,
        request_id: str,
    ) -> None:
        # A client that hangs up ends the stream (a slow reply must not outlive its test).
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            await self._send_events(send, reply, model, message_id, request_id, gone)
        finally:
            watcher.cancel()

    async def _send_events(
        self,
        send: Any,
        reply: Reply,
        model: str,
        message_id: str,
        request_id: str,
        gone: asyncio.Event,
    ) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            **_api_headers(request_id),
            **reply.headers,
        }
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        frames: list[bytes] = []
        dropped = False
        for sent, (name, data) in enumerate(message_events(reply, model, message_id)):
            if reply.drop_after is not None and sent >= reply.drop_after:
                dropped = True
                break
            if reply.error_after is not None and sent >= reply.error_after:
                kind, text = reply.error
                frames.append(
                    _frame("error", {"type": "error", "error": {"type": kind, "message": text}})
                )
                break
            frames.append(_frame(name, data))
        for piece in reframe(frames, line_end=reply.line_end, byte_chunk=reply.byte_chunk):
            if reply.delay_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), reply.delay_s)
            if gone.is_set():
                return
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        if dropped:
            # Returning without the final body message makes uvicorn close the connection
            # mid-body: the client sees an unterminated chunked stream.
            return
        await send({"type": "http.response.body", "body": b""})
