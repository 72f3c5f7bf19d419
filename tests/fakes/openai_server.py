"""A real loopback HTTP server that speaks OpenAI chat completions byte for byte.

It plays OpenAI (and the compatible upstreams: GLM, DeepSeek, Qwen, llama-server) for tests,
the gateway, e2e runs with the official `openai` SDK, and benchmarks. A raw ASGI app under
uvicorn in a thread, on a free port:

    async with OpenAIFake(api_key="sk-test") as server:
        server.script([FakeReply(text="hi"), FakeReply.rate_limited(retry_after=2)])
        ...  # point a client at server.base_url (".../v1")
        server.requests[-1].json        # what the client sent
        server.requests[-1].headers     # lower-cased header names

Routes (`prefix` defaults to "/v1"):
- `POST {prefix}/chat/completions` (also without the prefix): answers the next scripted
  `FakeReply`, or, when the script is empty, `default_reply(body)` (an echo of the last user
  text). `"stream": true` gets SSE: `data: <chunk json>\\n\\n` frames, then
  `data: [DONE]\\n\\n`. A first chunk `{role: assistant, content: ""}`; reasoning as
  `delta.reasoning_content` (DeepSeek style); text as `delta.content`, `text_chunk`
  characters each; each tool call as a first chunk with index, id, type, name and
  `arguments: ""`, then argument fragments of `args_chunk` characters; a final chunk with an
  empty delta and the finish_reason; with `stream_options.include_usage` one more chunk with
  `choices: []` and the usage, and `usage: null` on the others (OpenAI's framing). With
  `usage_on_last_choice` the usage rides on the finish chunk instead (GLM, llama-server).
- `GET {prefix}/models`: `{object: list, data: [{id, object: model, created, owned_by}]}`,
  status `models_status` (an OpenAI error body when >= 400).
- `POST {prefix}/embeddings`: OpenAI's `{object: list, data: [{object: embedding, index,
  embedding}], model, usage: {prompt_tokens, total_tokens}}` for `input` (a string or a list
  of strings); vectors from `embed(text)` (default: words hashed into `embedding_dim`
  buckets, L2-normalised, so texts sharing words are close); status `embeddings_status`.
- `POST /apply-template` and `POST /tokenize` (profile llamacpp): llama-server's prompt of a
  chat and its tokens (see `_template_or_tokens`).
- `GET /health` and `GET {prefix}/health`: llama-server's `{"status": "ok"}`, or with
  `health_status` 503 its `{"error": {"code": 503, "message": "Loading model", ...}}`.

`profile` picks which OpenAI-compatible server the fake is on the wire, headers included
(each checked against that server's source or a recorded exchange; docs/design-notes.md):
- `"openai"` (default): api.openai.com behind Cloudflare. Streams `text/event-stream;
  charset=utf-8`; JSON `application/json` (no charset), indented by two spaces, chunked (no
  Content-Length); `openai-organization`, `openai-processing-ms`, `openai-project`,
  `openai-version`, `x-ratelimit-*`, `x-request-id`, `access-control-expose-headers`,
  `strict-transport-security`, `set-cookie: __cf_bm=...`, `server: cloudflare`, `cf-ray`,
  `cf-cache-status`, `x-content-type-options`, `alt-svc`; lower-case names (HTTP/2's).
- `"llamacpp"`: llama.cpp's `llama-server` (cpp-httplib; tools/server/server-http.cpp,
  server-common.cpp). Streams `Content-Type: text/event-stream` with NO charset,
  `X-Accel-Buffering: no`, `Server: llama.cpp`, `Access-Control-Allow-Origin` (the request's
  Origin, empty without one), `Keep-Alive: timeout=5, max=100`, `Transfer-Encoding: chunked`,
  no Date; names in that case (served by h11, which keeps it); JSON `application/json;
  charset=utf-8` with Content-Length, `Connection: close` on errors; its own 401/404 bodies.
- `"vllm"`: vLLM's OpenAI server (FastAPI `StreamingResponse(media_type="text/event-stream")`
  under uvicorn, so Starlette adds `; charset=utf-8`; `JSONResponse`): uvicorn's `date`,
  `server: uvicorn`, lower-case names, compact JSON with Content-Length.
All of them write JSON as raw UTF-8 (compact in stream events). `FakeReply.line_end` (e.g.
CRLF) and `FakeReply.byte_chunk` (the stream cut every K bytes, inside multi-byte characters
too) change how a stream goes out, whatever the profile.

With `api_key` set, a request without `Authorization: Bearer <api_key>` gets OpenAI's 401
(`invalid_api_key`). Errors are `{"error": {"message", "type", "param", "code"}}` with the
reply's status and headers (`FakeReply.rate_limited` sets `Retry-After`). Failing mid-stream:
`fail_after=N` sends N chunks, then closes the connection without finishing the chunked body
(`fail_with="close"`) or sends `data: {"error": {...}}` and ends (`fail_with="error_chunk"`).
Every request is recorded in `requests` (method, path, headers, raw body, parsed JSON);
`chat_requests` and `last_request` filter it; a request with `logprobs: true` gets OpenAI's
`choices[].logprobs` ({content: [{token, logprob, bytes, top_logprobs}], refusal}, one token
per 3 characters of text, `top_logprobs` alternatives each), `top_logprobs` without
`logprobs: true` is OpenAI's 400; `FakeReply.cached_tokens` is the usage's
prompt_tokens_details.cached_tokens; `reset()` empties the script and the record
(for a server shared by a module's tests); `completion()` and `chunks()` return the exact
objects a reply produces.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import json
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn

from tests.fakes._loopback import http_date, reframe
from tests.fakes._sockets import bound_socket
from tests.openai_schema import errors as schema_errors

__all__ = ["FakeReply", "FakeToolCall", "OpenAIFake", "Profile", "RecordedRequest", "echo_reply"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Profile = Literal["openai", "llamacpp", "vllm"]
Headers = list[tuple[str, str]]

_ERRORS: dict[int, dict[str, Any]] = {
    400: {"message": "Invalid request.", "type": "invalid_request_error", "code": None},
    401: {
        "message": "Incorrect API key provided: sk-wrong. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    },
    404: {
        "message": "The model `nope` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "code": "model_not_found",
    },
    429: {
        "message": "Rate limit reached for requests. Please try again later.",
        "type": "requests",
        "code": "rate_limit_exceeded",
    },
    500: {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "code": None,
    },
    503: {"message": "The engine is currently overloaded.", "type": "server_error", "code": None},
}


def error_object(status: int, message: str | None = None) -> dict[str, Any]:
    base = _ERRORS.get(status) or _ERRORS[500 if status >= 500 else 400]
    err = {"message": base["message"], "type": base["type"], "param": None, "code": base["code"]}
    if message is not None:
        err["message"] = message
    return err


@dataclass
class FakeToolCall:
    name: str
    arguments: str | dict[str, Any] = "{}"  # a dict is sent as its JSON text
    id: str | None = None  # default: a fresh call_... id

    @property
    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass
class FakeReply:
    """One scripted answer. Status >= 400 answers an error body (`error` or a default for
    the status) whatever the request's `stream`."""

    text: str = ""
    reasoning: str = ""
    tool_calls: Sequence[FakeToolCall] = ()
    finish_reason: str | None = None  # default: tool_calls when calling tools, else stop
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens (OpenAI's own cache)
    status: int = 200
    error: dict[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # replace the profile's by name
    model: str | None = None  # default: the request's model
    id: str | None = None
    text_chunk: int = 3
    args_chunk: int = 4
    usage_on_last_choice: bool = False
    fail_after: int | None = None
    fail_with: Literal["close", "error_chunk"] = "close"
    delay_s: float = 0.0  # before the answer and between stream chunks
    body: bytes | None = None  # sent verbatim instead of a generated body
    line_end: str = "\n"  # "\r\n": the stream's lines end with CRLF
    byte_chunk: int | None = None  # the stream's body cut every K bytes

    @classmethod
    def rate_limited(cls, retry_after: float = 1, message: str | None = None) -> FakeReply:
        return cls(
            status=429,
            error=error_object(429, message),
            headers={"Retry-After": f"{retry_after:g}"},
        )

    @classmethod
    def server_error(cls, status: int = 500, message: str | None = None) -> FakeReply:
        return cls(status=status, error=error_object(status, message))

    @classmethod
    def unauthorized(cls) -> FakeReply:
        return cls(status=401, error=error_object(401))

    @property
    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None


def echo_reply(body: Any) -> FakeReply:
    """The answer when nothing is scripted: `echo: <last user text>`."""
    text = ""
    for m in (body or {}).get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(
                    p.get("text", "") for p in content if isinstance(p, dict) and "text" in p
                )
            text = str(content or "")
    return FakeReply(text=f"echo: {text}")


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _compact(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _openai_headers() -> Headers:
    """What every api.openai.com answer carries besides its content type (a recorded
    answer's set, the values made up)."""
    ray = uuid.uuid4().hex[:16]
    return [
        ("access-control-expose-headers", "X-Request-ID"),
        ("openai-organization", "user-fakeorg0000000000000000"),
        ("openai-processing-ms", "212"),
        ("openai-project", "proj_fake000000000000000000"),
        ("openai-version", "2020-10-01"),
        ("x-ratelimit-limit-requests", "10000"),
        ("x-ratelimit-limit-tokens", "30000000"),
        ("x-ratelimit-remaining-requests", "9999"),
        ("x-ratelimit-remaining-tokens", "29999985"),
        ("x-ratelimit-reset-requests", "6ms"),
        ("x-ratelimit-reset-tokens", "0s"),
        ("x-request-id", f"req_{uuid.uuid4().hex}"),
        ("strict-transport-security", "max-age=31536000; includeSubDomains; preload"),
        ("cf-cache-status", "DYNAMIC"),
        (
            "set-cookie",
            f"__cf_bm={ray}; path=/; expires={http_date()}; domain=.api.openai.com; "
            "HttpOnly; Secure; SameSite=None",
        ),
        ("x-content-type-options", "nosniff"),
        ("server", "cloudflare"),
        ("cf-ray", f"{ray}-SJC"),
        ("alt-svc", 'h3=":443"; ma=86400'),
    ]


# The Origin of the request being answered (llama-server echoes it); per request task.
_ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("origin", default="")

# llama-server's own error bodies (server-http.cpp), not OpenAI's.
_LLAMACPP_ERRORS = {
    401: {"message": "Invalid API Key", "type": "authentication_error", "code": 401},
    404: {"message": "File Not Found", "type": "not_found_error", "code": 404},
}


class OpenAIFake:
    """The server; see the module docstring. Use as `async with OpenAIFake() as server`."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        prefix: str = "/v1",
        models: Iterable[str] = ("gpt-4o-mini", "gpt-4o"),
        default_reply: Callable[[Any], FakeReply] = echo_reply,
        embedding_dim: int = 1536,
        profile: Profile = "openai",
    ) -> None:
        self.profile: Profile = profile
        self.api_key = api_key
        self.embedding_dim = embedding_dim
        self.embeddings_status = 200
        self.embed: Callable[[str], list[float]] = self.hashed_words
        self.prefix = prefix.rstrip("/")
        self.models = list(models)
        self.default_reply = default_reply
        self.models_status = 200
        self.health_status = 200
        self.requests: list[RecordedRequest] = []
        # CreateChatCompletionRequest mismatches of chat bodies received (answered with 400).
        self.violations: list[str] = []
        self._script: collections.deque[FakeReply] = collections.deque()
        self._logprobs: int | None = None  # the current request's top_logprobs, if asked
        self._lock = threading.Lock()
        self._socket = bound_socket()
        # Closed when the server stops, or when the fake is dropped without starting.
        weakref.finalize(self, self._socket.close)
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}{self.prefix}"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,  # uvicorn's records go to pytest's capture, not the terminal
            log_level="warning",
            access_log=False,
            lifespan="off",
            interface="asgi3",
            timeout_graceful_shutdown=1,
            # h11 writes header names in the case given (httptools lower-cases them), and
            # llama-server sends neither uvicorn's Server nor a Date; vLLM is uvicorn.
            http="h11" if profile == "llamacpp" else "auto",
            server_header=profile == "vllm",
            date_header=profile != "llamacpp",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    # --- scripting and inspection ---------------------------------------------------------
    def script(self, replies: Iterable[FakeReply]) -> None:
        """Queue answers for the next chat-completions requests, in order."""
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()
        self.models_status = self.health_status = self.embeddings_status = 200

    def hashed_words(self, text: str) -> list[float]:
        vector = [0.0] * self.embedding_dim
        for word in text.lower().split():
            digest = uuid.uuid5(uuid.NAMESPACE_OID, word.strip(".,!?")).int
            vector[digest % self.embedding_dim] += 1.0
        norm = sum(v * v for v in vector) ** 0.5 or 1.0
        return [v / norm for v in vector]

    @property
    def pending(self) -> int:
        return len(self._script)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def last_request(self) -> RecordedRequest:
        return self.requests[-1]

    # --- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> OpenAIFake:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                raise RuntimeError("the fake OpenAI server failed to start")
            await asyncio.sleep(0.01)
        raise RuntimeError("the fake OpenAI server did not start in time")

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)
        self._socket.close()

    def __enter__(self) -> OpenAIFake:
        """Synchronous start, for module-scoped fixtures outside an event loop."""
        self.thread.start()
        deadline = time.monotonic() + 5
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake OpenAI server failed to start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self._socket.close()

    # --- the ASGI app ---------------------------------------------------------------------
    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        self.requests.append(RecordedRequest(method, path, headers, raw))
        _ORIGIN.set(headers.get("origin", ""))

        if method == "GET" and path in ("/health", f"{self.prefix}/health"):
            await self._health(send)
            return
        llamacpp = self.profile == "llamacpp"
        public = llamacpp and method == "GET" and path in ("/models", f"{self.prefix}/models")
        if (
            self.api_key is not None
            and not public
            and headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            error = _LLAMACPP_ERRORS[401] if llamacpp else error_object(401)
            await self._json(send, 401, {"error": error})
            return
        if method == "GET" and path == f"{self.prefix}/models":
            await self._list_models(send)
        elif method == "POST" and path in (
            f"{self.prefix}/chat/completions",
            "/chat/completions",
        ):
            await self._chat(send, raw)
        elif method == "POST" and path == f"{self.prefix}/embeddings":
            await self._embeddings(send, raw)
        elif llamacpp and method == "POST" and path in ("/apply-template", "/tokenize"):
            await self._template_or_tokens(send, path, json.loads(raw or b"{}"))
        elif llamacpp:
            await self._json(send, 404, {"error": _LLAMACPP_ERRORS[404]})
        else:
            await self._json(
                send, 404, {"error": error_object(404, f"Invalid URL ({method} {path})")}
            )

    async def _template_or_tokens(self, send: Send, path: str, body: Any) -> None:
        """llama-server's `/apply-template` ({messages, tools?} -> {prompt}: here each message
        as `<|role|>content`) and `/tokenize` ({content, add_special?} -> {tokens}: one token
        a word, plus BOS with add_special), from its tools/server README."""
        if path == "/apply-template":
            messages = body.get("messages") if isinstance(body, dict) else None
            if not isinstance(messages, list):
                await self._json(send, 400, {"error": error_object(400, "messages required")})
                return

            def text(content: Any) -> str:
                return content if isinstance(content, str) else json.dumps(content)

            prompt = "".join(f"<|{m.get('role')}|>{text(m.get('content'))}" for m in messages)
            await self._json(send, 200, {"prompt": prompt})
            return
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, str):
            await self._json(send, 400, {"error": error_object(400, "content required")})
            return
        tokens = list(range(len(content.split()) + (1 if body.get("add_special") else 0)))
        await self._json(send, 200, {"tokens": tokens})

    async def _embeddings(self, send: Send, raw: bytes) -> None:
        if self.embeddings_status >= 400:
            await self._json(send, self.embeddings_status, {"error": error_object(500)})
            return
        body = json.loads(raw)
        given = body.get("input")
        texts = [given] if isinstance(given, str) else list(given or [])
        tokens = sum(len(t.split()) for t in texts)
        await self._json(
            send,
            200,
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": self.embed(t)}
                    for i, t in enumerate(texts)
                ],
                "model": body.get("model"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    async def _json(
        self, send: Send, status: int, obj: Any, extra: Mapping[str, str] | None = None
    ) -> None:
        if self.profile == "openai":
            text = json.dumps(obj, ensure_ascii=False, indent=2)  # OpenAI prints its JSON
        else:
            text = _compact(obj)
        await self._bytes(send, status, text.encode(), extra)

    def _headers(self, content_type: str, status: int, length: int | None) -> Headers:
        """The answer's headers as the profile's server writes them (`length`: a whole
        body's, None for a stream)."""
        if self.profile == "llamacpp":
            connection = (
                ("Connection", "close") if status >= 400 else ("Keep-Alive", "timeout=5, max=100")
            )
            headers = [("Server", "llama.cpp"), ("Access-Control-Allow-Origin", _ORIGIN.get())]
            if length is None:
                headers.append(("X-Accel-Buffering", "no"))
            headers += [("Content-Type", content_type), connection]
            if length is not None:
                headers.append(("Content-Length", str(length)))
            return headers
        if self.profile == "vllm":
            headers = [("content-type", content_type)]
            return headers if length is None else [*headers, ("content-length", str(length))]
        # api.openai.com answers chunked even when the body is whole
        return [("content-type", content_type), *_openai_headers()]

    async def _bytes(
        self, send: Send, status: int, body: bytes, extra: Mapping[str, str] | None = None
    ) -> None:
        json_type = (
            "application/json; charset=utf-8" if self.profile == "llamacpp" else "application/json"
        )
        headers = _merged(self._headers(json_type, status, len(body)), extra or {})
        await send({"type": "http.response.start", "status": status, "headers": _encoded(headers)})
        await send({"type": "http.response.body", "body": body})

    async def _health(self, send: Send) -> None:
        if self.health_status == 200:
            await self._json(send, 200, {"status": "ok"})
        else:
            err = {"code": self.health_status, "message": "Loading model"}
            await self._json(
                send, self.health_status, {"error": {**err, "type": "unavailable_error"}}
            )

    async def _list_models(self, send: Send) -> None:
        if self.models_status >= 400:
            await self._json(send, self.models_status, {"error": error_object(self.models_status)})
            return
        data = [
            {"id": m, "object": "model", "created": 1715367049, "owned_by": "system"}
            for m in self.models
        ]
        await self._json(send, 200, {"object": "list", "data": data})

    async def _chat(self, send: Send, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            msg = "We could not parse the JSON body of your request."
            await self._json(send, 400, {"error": error_object(400, msg)})
            return
        problems = schema_errors(body, "CreateChatCompletionRequest")
        if problems:
            self.violations.extend(problems)
            await self._json(send, 400, {"error": error_object(400, "; ".join(problems))})
            return
        with self._lock:
            reply = self._script.popleft() if self._script else None
        if reply is None:
            reply = self.default_reply(body)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status >= 400:
            payload = (
                reply.body
                or json.dumps({"error": reply.error or error_object(reply.status)}).encode()
            )
            await self._bytes(send, reply.status, payload, reply.headers)
            return
        if reply.body is not None:
            await self._bytes(send, reply.status, reply.body, reply.headers)
            return
        model = reply.model or str(body.get("model") or "gpt-4o-mini")
        completion_id = reply.id or f"chatcmpl-{uuid.uuid4().hex[:29]}"
        if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
            msg = "logprobs must be set to true if top_logprobs is set."
            self.violations.append(msg)
            await self._json(send, 400, {"error": error_object(400, msg)})
            return
        # logprobs: true asks for each text token's logprob (and top_logprobs alternatives).
        top = body.get("top_logprobs") if body.get("logprobs") is True else None
        self._logprobs = (top or 0) if body.get("logprobs") is True else None
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            await self._stream(send, reply, model, completion_id, include_usage)
        else:
            await self._json(send, 200, self.completion(reply, model, completion_id), reply.headers)

    def _token_logprobs(self, text: str) -> dict[str, Any] | None:
        """OpenAI's `choices[].logprobs` for `text` (one token a piece of 3 characters) when
        the request asked for logprobs, else None."""
        top = self._logprobs
        if top is None:
            return None

        def entry(token: str, logprob: float) -> dict[str, Any]:
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        content = [
            {**entry(t, -0.25), "top_logprobs": [entry(t, -0.25 - k) for k in range(top)]}
            for t in _pieces(text, 3)
        ]
        return {"content": content, "refusal": None}

    @staticmethod
    def _call_ids(reply: FakeReply) -> list[str]:
        return [c.id or f"call_{uuid.uuid4().hex[:24]}" for c in reply.tool_calls]

    def completion(self, reply: FakeReply, model: str, completion_id: str) -> dict[str, Any]:
        """The non-streaming `chat.completion` object for `reply`."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text if reply.text or not reply.tool_calls else None,
            "refusal": None,
            "annotations": [],
        }
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_text},
                }
                for c, call_id in zip(reply.tool_calls, self._call_ids(reply), strict=True)
            ]
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": self._token_logprobs(reply.text),
                    "finish_reason": reply.finish,
                }
            ],
            "usage": reply.usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def chunks(
        self, reply: FakeReply, model: str, completion_id: str, include_usage: bool
    ) -> list[dict[str, Any]]:
        """The `chat.completion.chunk` objects streamed for `reply`, in order."""
        created = int(time.time())

        def chunk(
            delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
        ) -> dict[str, Any]:
            c: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
                ],
            }
            if include_usage:
                c["usage"] = None
            return c

        out = [chunk({"role": "assistant", "content": "", "refusal": None})]
        out += [
            chunk({"content": None, "reasoning_content": p})
            for p in _pieces(reply.reasoning, reply.text_chunk)
        ]
        out += [
            chunk({"content": p}, logprobs=self._token_logprobs(p))
            for p in _pieces(reply.text, reply.text_chunk)
        ]
        for i, (call, call_id) in enumerate(
            zip(reply.tool_calls, self._call_ids(reply), strict=True)
        ):
            first = {
                "index": i,
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            out.append(chunk({"tool_calls": [first]}))
            out += [
                chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]})
                for p in _pieces(call.arguments_text, reply.args_chunk)
            ]
        last = chunk({}, reply.finish)
        if reply.usage_on_last_choice:
            last["usage"] = reply.usage()
        out.append(last)
        if include_usage and not reply.usage_on_last_choice:
            usage_chunk = chunk({})
            usage_chunk["choices"], usage_chunk["usage"] = [], reply.usage()
            out.append(usage_chunk)
        return out

    async def _stream(
        self,
        send: Send,
        reply: FakeReply,
        model: str,
        completion_id: str,
        include_usage: bool,
    ) -> None:
        stream_type = "text/event-stream"
        if self.profile != "llamacpp":
            stream_type += "; charset=utf-8"
        headers = _merged(self._headers(stream_type, 200, None), reply.headers)
        await send({"type": "http.response.start", "status": 200, "headers": _encoded(headers)})
        frames: list[bytes] = []
        dropped = False
        for n, c in enumerate(self.chunks(reply, model, completion_id, include_usage)):
            if reply.fail_after is not None and n >= reply.fail_after:
                if reply.fail_with == "close":
                    dropped = True
                    break
                err = error_object(500, "The server had an error while responding.")
                frames.append(b"data: " + _compact({"error": err}).encode() + b"\n\n")
                break
            frames.append(b"data: " + _compact(c).encode() + b"\n\n")
        else:
            frames.append(b"data: [DONE]\n\n")
        for n, piece in enumerate(
            reframe(frames, line_end=reply.line_end, byte_chunk=reply.byte_chunk)
        ):
            if reply.delay_s and n:
                await asyncio.sleep(reply.delay_s)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        if dropped:
            # Returning without the final empty body leaves the chunked response unfinished;
            # uvicorn then drops the connection, as a dying upstream does.
            return
        await send({"type": "http.response.body", "body": b""})


def _merged(headers: Headers, extra: Mapping[str, str]) -> Headers:
    """`headers` with a reply's own: one of the same name replaces the profile's (a test can
    give a stream another Content-Type)."""
    names = {k.lower() for k in extra}
    return [h for h in headers if h[0].lower() not in names] + list(extra.items())


def _encoded(headers: Headers) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in headers]
