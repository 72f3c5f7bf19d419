"""A llama-server compatible server on cyllama (llama.cpp bindings): the bundled default
`inference_bin`.

It accepts llama-server's flags (`-m`, `--host`, `--port`, `-c`, `-ngl`, `-t`, `-a`,
`-b`, `--api-key`, whose default is `LLAMA_API_KEY` from the environment as llama-server's;
others are ignored with a warning). With a key, every route but /health answers 401
`Invalid API Key` unless the request carries `Authorization: Bearer <key>`. It serves what
the orchestrator and OpenAI clients use: `GET /health` (503 while the model loads, as
llama-server), `GET /v1/models`, `GET /slots` (`is_processing`), `GET /props`
(`chat_template_caps`: no tools), and `POST /v1/chat/completions`, plain or streamed as
`chat.completion.chunk` SSE frames ending with `data: [DONE]`, under llama-server's
`Content-Type: text/event-stream` without a charset (bodies and chunks follow OpenAI's
schemas; `response_format` json_object/json_schema is enforced by a grammar; `n` > 1 (as
llama-server), tools (as llama-server without --jinja) and logprobs are a 400). One request
is generated at a time (llama-server with one slot); others wait their turn. Generation
runs in a thread, so the event loop keeps answering /health and /slots meanwhile.

Run it as `python -m orchestrator.inference.llama_server` or `scripts/llama-server`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

__all__ = [
    "ChatBody",
    "ServerOptions",
    "StopMatcher",
    "main",
    "parse_args",
]

log = logging.getLogger("llama-server")

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick a random seed"
MAX_PENDING_TOKENS = 8  # bytes of one UTF-8 character never span more tokens than this


# --- command line -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 4096
    gpu_layers: int = -1
    threads: int = -1
    batch_size: int = 2048
    alias: str | None = None
    api_key: str | None = None

    @property
    def model_id(self) -> str:
        return self.alias or self.model


def _layers(value: str) -> int:
    # llama-server also takes "auto" and "all"; both mean "as many as fit" here.
    return -1 if value in ("auto", "all") else int(value)


def parse_args(argv: Sequence[str]) -> tuple[ServerOptions, list[str]]:
    """The options and the llama-server flags this server does not implement."""
    parser = argparse.ArgumentParser(
        prog="llama-server",
        description="llama-server compatible server on cyllama",
        allow_abbrev=False,
    )
    parser.add_argument("-m", "--model", required=True, help="GGUF model file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-c", "--ctx-size", dest="ctx_size", type=int, default=4096)
    parser.add_argument(
        "-ngl", "--n-gpu-layers", "--gpu-layers", dest="gpu_layers", type=_layers, default=-1
    )
    parser.add_argument("-t", "--threads", type=int, default=-1)
    parser.add_argument("-b", "--batch-size", dest="batch_size", type=int, default=2048)
    parser.add_argument("-a", "--alias")
    # llama-server reads the key from LLAMA_API_KEY too: the environment keeps it out of the
    # command line, which every local user can read.
    parser.add_argument("--api-key", dest="api_key", default=os.environ.get("LLAMA_API_KEY"))
    known, unknown = parser.parse_known_args(list(argv))
    options = ServerOptions(
        model=known.model,
        host=known.host,
        port=known.port,
        ctx_size=known.ctx_size,
        gpu_layers=known.gpu_layers,
        threads=known.threads,
        batch_size=known.batch_size,
        alias=known.alias,
        api_key=known.api_key or None,
    )
    return options, unknown


# --- requests -----------------------------------------------------------------------------


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatBody(BaseModel):
    """The chat-completions fields this server reads; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessageIn] = Field(min_length=1)
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n_predict: int | None = None
    temperature: float = Field(0.8, ge=0)
    top_p: float = Field(0.95, ge=0, le=1)
    top_k: int = Field(40, ge=0)
    min_p: float = Field(0.05, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = Field(1.0, ge=0)
    repeat_last_n: int = Field(64, ge=-1)
    n: int = 1
    ignore_eos: bool = False  # llama-server's: generate until the limit
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None

    @property
    def limit(self) -> int | None:
        for value in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if value is not None:
                return None if value < 0 else value
        return None

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


class ApiError(Exception):
    """An error answered in llama-server's (OpenAI's) shape."""

    def __init__(self, status: int, message: str, kind: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.kind}}

    def response(self) -> JSONResponse:
        body = self.body()
        body["error"].update(self.extra)
        return JSONResponse(body, status_code=self.status)


def _bad_request(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def chat_messages(body: ChatBody) -> list[dict[str, str]]:
    """Plain {role, content} messages for the chat template."""
    if body.n != 1:
        raise _bad_request("only one choice (n=1) is supported")
    if body.tools:
        # llama-server answers the same without --jinja.
        raise _bad_request("tools are not supported by this server")
    if body.logprobs or body.top_logprobs:
        # Not computed here: answering `logprobs: null` to a caller who asked would look
        # like an answer.
        raise _bad_request("logprobs are not supported by this server")
    json_schema(body)  # a bad response_format is a 400 before the turn is taken
    out: list[dict[str, str]] = []
    for i, m in enumerate(body.messages):
        role = "system" if m.role == "developer" else m.role
        if role not in ("system", "user", "assistant"):
            raise _bad_request(f"messages[{i}]: role {m.role!r} is not supported")
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            parts: list[str] = []
            for part in m.content:
                if part.get("type") != "text":
                    raise _bad_request(
                        f"messages[{i}]: {part.get('type')!r} content is not supported "
                        "(this server has no multimodal projector)"
                    )
                parts.append(str(part.get("text") or ""))
            text = "".join(parts)
        out.append({"role": role, "content": text})
    return out


def json_schema(body: ChatBody) -> dict[str, Any] | None:
    """The JSON schema `response_format` asks the answer to follow (None: free text), as
    llama-server: `json_object` any JSON object, `json_schema` its `schema`."""
    fmt = body.response_format or {}
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        given = fmt.get("schema")  # llama-server's extension
        return given if isinstance(given, dict) else {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad_request("response_format.json_schema.schema must be an object")
        schema: dict[str, Any] = spec.get("schema") or {}
        return schema
    raise _bad_request(
        f"response_format: type {kind!r} is not supported (text, json_object, json_schema)"
    )


SPACE_RULE = re.compile(r"^space ::= .*$", re.MULTILINE)


def json_grammar(schema: dict[str, Any]) -> str:
    """GBNF for `schema` (llama.cpp's converter, as cyllama ships it); 400 if it cannot."""
    from cyllama.utils.json_schema_to_grammar import json_schema_to_grammar

    try:
        grammar = str(json_schema_to_grammar(schema))
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise _bad_request(f"response_format: the schema cannot be enforced: {exc}") from None
    # The converter lets whitespace be up to two newlines and 20 tabs, after the closing
    # brace too: a small model then pads with whitespace until max_tokens instead of ending
    # (seen with SmolLM2). One optional space keeps the JSON compact and, once the object is
    # closed, leaves the end of generation as the only choice.
    return SPACE_RULE.sub('space ::= | " "', grammar)


# --- generation ---------------------------------------------------------------------------


class StopMatcher:
    """Holds back text that may be the start of a stop string; cuts at the first one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._buffer = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if not self._stops:
            return text
        self._buffer += text
        hits = [i for i in (self._buffer.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self._buffer = self._buffer[: min(hits)], ""
            return out
        keep = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._buffer)), 0, -1):
                if self._buffer.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        out = self._buffer[: len(self._buffer) - keep]
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return out

    def flush(self) -> str:
        out, self._buffer = self._buffer, ""
        return out


@dataclass
class Prepared:
    tokens: list[int]
    limit: int
    biases: list[tuple[int, float]] = field(default_factory=list)
    grammar: str | None = None  # GBNF the answer must follow (response_format)


@dataclass
class Outcome:
    completion_tokens: int = 0
    finish_reason: Literal["stop", "length"] = "stop"
    pieces: list[str] = field(default_factory=list)


class Engine:
    """The model and one context, used by one generation at a time."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.n_ctx = 0
        self.meta: dict[str, Any] = {}
        self._lib: Any = None
        self._model: Any = None
        self._vocab: Any = None
        self._ctx: Any = None
        self._template: str | None = None
        self._eog: list[int] = []
        self.fingerprint = ""

    def load(self) -> None:
        """Blocking: load the model and create the context."""
        from cyllama.llama import llama_cpp as lib
        from cyllama.utils.validation import validate_gguf_file

        validate_gguf_file(self.options.model, kind="GGUF model")
        lib.disable_logging()
        lib.ggml_backend_load_all()
        model_params = lib.LlamaModelParams()
        model_params.n_gpu_layers = self.options.gpu_layers
        model = lib.LlamaModel(self.options.model, model_params)
        n_ctx = self.options.ctx_size if self.options.ctx_size > 0 else model.n_ctx_train
        threads = self.options.threads if self.options.threads > 0 else (os.cpu_count() or 4)
        ctx_params = lib.LlamaContextParams()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = min(self.options.batch_size, n_ctx)
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.no_perf = True
        self._ctx = lib.LlamaContext(model, ctx_params)
        self._lib, self._model, self._vocab = lib, model, model.get_vocab()
        self._template = model.get_default_chat_template() or None
        vocab = self._vocab
        self._eog = [t for t in range(vocab.n_vocab) if vocab.is_eog(t)]
        self.n_ctx = n_ctx
        self.meta = {
            "n_ctx_train": model.n_ctx_train,
            "n_params": model.n_params,
            "size": model.size,
            "n_vocab": self._vocab.n_vocab,
        }
        self.fingerprint = _fingerprint(lib, self.options, self.meta, n_ctx, threads)

    def prompt(self, messages: list[dict[str, str]]) -> str:
        lib = self._lib
        chat = [lib.LlamaChatMessage(role=m["role"], content=m["content"]) for m in messages]
        if self._template:
            try:
                return str(self._model.chat_apply_template(self._template, chat, True))
            except (RuntimeError, ValueError) as exc:
                # As llama-server: a template llama.cpp does not know falls back to chatml.
                log.warning("chat template not supported (%s); using chatml", exc)
        return str(self._model.chat_apply_template("chatml", chat, True))

    def prepare(self, messages: list[dict[str, str]], body: ChatBody) -> Prepared:
        """The prompt's tokens and the sampling inputs; raises ApiError (400) before any
        answer is sent."""
        biases = self._biases(body)
        schema = json_schema(body)
        grammar = None if schema is None else json_grammar(schema)
        limit = body.limit
        tokens = list(self._vocab.tokenize(self.prompt(messages), True, True))
        room = self.n_ctx - len(tokens)
        if room <= 0:
            raise ApiError(
                400,
                "the request exceeds the available context size, try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=len(tokens),
                n_ctx=self.n_ctx,
            )
        return Prepared(tokens, room if limit is None else min(limit, room), biases, grammar)

    def _biases(self, body: ChatBody) -> list[tuple[int, float]]:
        biases: dict[int, float] = {}
        for key, bias in (body.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise _bad_request(f"logit_bias: {key!r} is not a token id") from None
            if not 0 <= token < self._vocab.n_vocab:
                raise _bad_request(f"logit_bias: token {token} is out of the vocabulary")
            biases[token] = float(bias)
        if body.ignore_eos:
            biases.update((t, float("-inf")) for t in self._eog)
        return list(biases.items())

    def _sampler(self, body: ChatBody, prepared: Prepared) -> Any:
        lib, biases = self._lib, prepared.biases
        params = lib.LlamaSamplerChainParams()
        params.no_perf = True
        sampler = lib.LlamaSampler(params)
        if prepared.grammar is not None:
            # First in the chain: the others then choose among the tokens it allows.
            sampler.add_grammar(self._vocab, prepared.grammar, "root")
        if biases:
            sampler.add_logit_bias(self._vocab.n_vocab, biases)
        if body.repeat_last_n != 0 and (
            body.repeat_penalty != 1.0 or body.frequency_penalty or body.presence_penalty
        ):
            sampler.add_penalties(
                body.repeat_last_n,
                body.repeat_penalty,
                body.frequency_penalty,
                body.presence_penalty,
            )
        if body.temperature <= 0:
            sampler.add_greedy()
            return sampler
        sampler.add_top_k(body.top_k)
        sampler.add_top_p(body.top_p, 1)
        sampler.add_min_p(body.min_p, 1)
        sampler.add_temp(body.temperature)
        sampler.add_dist(DEFAULT_SEED if body.seed is None else body.seed & 0xFFFFFFFF)
        return sampler

    def _decode(self, tokens: list[int], position: int) -> None:
        status = self._ctx.decode(self._lib.llama_batch_get_one(tokens, position))
        if status not in (None, 0):
            raise RuntimeError(f"llama_decode failed with status {status}")

    def _text_after(self, anchor: int | None, tokens: list[int]) -> str:
        """The text of `tokens`, decoded together. Decoded after the token before them and
        cut off again, because llama.cpp drops a leading space from the first token."""
        head = [] if anchor is None else [anchor]
        size = 16 * (len(tokens) + 2)
        full = str(self._vocab.detokenize(head + tokens, size, False, False))
        before = str(self._vocab.detokenize(head, size, False, False)) if head else ""
        return full[len(before) :] if full.startswith(before) else full

    def generate(
        self,
        prepared: Prepared,
        body: ChatBody,
        emit: Callable[[str], object],
        cancel: threading.Event,
    ) -> Outcome:
        """Blocking: sample up to `prepared.limit` tokens, calling `emit` with text."""
        vocab, outcome = self._vocab, Outcome()
        stops = StopMatcher(body.stops)
        self._ctx.kv_cache_clear()
        batch = min(self.options.batch_size, self.n_ctx)
        for start in range(0, len(prepared.tokens), batch):
            self._decode(prepared.tokens[start : start + batch], start)
        sampler = self._sampler(body, prepared)
        position = len(prepared.tokens)
        pending: list[int] = []
        anchor: int | None = None  # the last token whose text was emitted whole
        outcome.finish_reason = "length"
        while outcome.completion_tokens < prepared.limit and not cancel.is_set():
            token = sampler.sample(self._ctx, -1)
            if vocab.is_eog(token):
                outcome.finish_reason = "stop"
                break
            outcome.completion_tokens += 1
            piece = vocab.token_to_piece(token, 0, False)
            if pending or "\ufffd" in piece:
                # Part of a multi-byte character: decode the tokens together.
                pending.append(token)
                piece = self._text_after(anchor, pending)
                if piece.endswith("\ufffd") and len(pending) < MAX_PENDING_TOKENS:
                    piece = ""
                else:
                    pending = []
            if not pending:
                anchor = token
            if piece:
                text = stops.feed(piece)
                if text:
                    emit(text)
                if stops.stopped:
                    outcome.finish_reason = "stop"
                    break
            if position + 1 >= self.n_ctx:
                break  # the context is full
            self._decode([token], position)
            position += 1
        if pending and not stops.stopped:
            text = stops.feed(self._text_after(anchor, pending))
            if text:
                emit(text)
        if not stops.stopped and (rest := stops.flush()):
            emit(rest)
        return outcome


def _fingerprint(
    lib: Any, options: ServerOptions, meta: dict[str, Any], n_ctx: int, threads: int
) -> str:
    """OpenAI's `system_fingerprint` (a string, never null in its schema): what a seeded
    answer depends on, so callers comparing answers see when the backend changed. llama.cpp
    build, cyllama, the model, the window and the CPU threads (their reductions round
    differently)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        binding = version("cyllama")
    except PackageNotFoundError:
        binding = "unknown"
    config = [lib.ggml_version(), lib.ggml_commit(), binding, meta, n_ctx, threads]
    config += [options.gpu_layers, options.batch_size]
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    return f"fp_{digest.hexdigest()[:10]}"


# --- HTTP ---------------------------------------------------------------------------------


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass
class Completion:
    """One chat completion's identity, shared by all of its chunks."""

    model: str
    fingerprint: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(
        self,
        delta: dict[str, Any] | None,
        finish_reason: str | None = None,
        usage: dict[str, int] | None = None,
        *,
        with_usage: bool = False,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if with_usage or usage is not None:
            out["usage"] = usage
        return out

    def response(self, text: str, outcome: Outcome, prompt_tokens: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": outcome.finish_reason,
                }
            ],
            "usage": usage(prompt_tokens, outcome.completion_tokens),
        }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class LlamaServer:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.engine = Engine(options)
        self.loaded = False
        self.load_error: str | None = None
        self.on_fatal: Callable[[], None] = lambda: None
        self.started = int(time.time())
        self._turn = asyncio.Lock()  # one generation at a time
        self._processing = False
        self._cancels: set[threading.Event] = set()

    # --- lifecycle ----------------------------------------------------------------------

    async def load(self) -> None:
        try:
            await asyncio.to_thread(self.engine.load)
        except (OSError, ValueError, RuntimeError, ImportError) as exc:
            self.load_error = f"failed to load model {self.options.model!r}: {exc}"
            log.error("main: %s", self.load_error)
            self.on_fatal()
            return
        self.loaded = True
        log.info("main: model loaded (n_ctx = %d); ready", self.engine.n_ctx)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        loader = asyncio.create_task(self.load())
        try:
            yield
        finally:
            loader.cancel()
            for cancel in list(self._cancels):
                cancel.set()

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health),
            Route("/v1/health", self.health),
            Route("/models", self._keyed(self.models)),
            Route("/v1/models", self._keyed(self.models)),
            Route("/slots", self._keyed(self.slots)),
            Route("/props", self._keyed(self.props)),
            Route("/chat/completions", self._keyed(self.chat), methods=["POST"]),
            Route("/v1/chat/completions", self._keyed(self.chat), methods=["POST"]),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan)

    def _keyed(
        self, endpoint: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """`endpoint` behind the API key (when the server has one): only /health is open."""

        async def guarded(request: Request) -> Response:
            if (denied := self._denied(request)) is not None:
                return denied
            return await endpoint(request)

        return guarded

    # --- endpoints ----------------------------------------------------------------------

    async def health(self, _request: Request) -> Response:
        if not self.loaded:
            return ApiError(503, "Loading model", "unavailable_error").response()
        return JSONResponse({"status": "ok"})

    async def models(self, _request: Request) -> Response:
        meta = self.engine.meta if self.loaded else None
        model = {
            "id": self.options.model_id,
            "object": "model",
            "created": self.started,
            "owned_by": "llamacpp",
            "meta": meta,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def slots(self, _request: Request) -> Response:
        return JSONResponse(
            [{"id": 0, "n_ctx": self.engine.n_ctx, "is_processing": self._processing}]
        )

    async def props(self, _request: Request) -> Response:
        """llama-server's /props, the fields its clients read: this server renders no tool
        definitions or calls (as llama-server without --jinja), and says so."""
        return JSONResponse(
            {
                "default_generation_settings": {"n_ctx": self.engine.n_ctx},
                "total_slots": 1,
                "model_path": self.options.model,
                "chat_template_caps": {
                    "supports_system_role": True,
                    "supports_tools": False,
                    "supports_tool_calls": False,
                    "supports_parallel_tool_calls": False,
                },
                "modalities": {"vision": False, "audio": False},
                "is_sleeping": False,
            }
        )

    def _denied(self, request: Request) -> Response | None:
        key = self.options.api_key
        if not key:
            return None
        given = request.headers.get("authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, f"Bearer {key}".encode()):
            return ApiError(401, "Invalid API Key", "authentication_error").response()
        return None

    async def chat(self, request: Request) -> Response:
        if not self.loaded:
            return ApiError(503, "Loading model", "unavailable_error").response()
        try:
            body = ChatBody.model_validate(await request.json())
            messages = chat_messages(body)
        except ValueError as exc:  # not JSON, or pydantic's ValidationError
            detail = (
                "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
                if isinstance(exc, ValidationError)
                else f"invalid JSON body: {exc}"
            )
            return _bad_request(detail).response()
        except ApiError as exc:
            return exc.response()
        await self._turn.acquire()
        self._processing = True
        try:
            prepared = await asyncio.to_thread(self.engine.prepare, messages, body)
        except ApiError as exc:
            self._release()
            return exc.response()
        except BaseException:
            self._release()
            raise
        completion = Completion(self.options.model_id, self.engine.fingerprint)
        if body.stream:
            claim = _TurnClaim(self._release)
            return _TurnStream(self._stream(completion, prepared, body, claim), claim)
        pieces: list[str] = []
        outcome = await self._generate(prepared, body, pieces.append)
        return JSONResponse(completion.response("".join(pieces), outcome, len(prepared.tokens)))

    def _release(self) -> None:
        self._processing = False
        self._turn.release()

    def _start(
        self,
        prepared: Prepared,
        body: ChatBody,
        emit: Callable[[str], object],
        cancel: threading.Event,
    ) -> asyncio.Future[Outcome]:
        """Generate in a thread of its own (the turn is released when it ends); the future
        resolves with the outcome."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        self._cancels.add(cancel)

        def settle(result: Outcome | BaseException) -> None:
            self._cancels.discard(cancel)
            self._release()
            if done.cancelled():
                return
            if isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(result)

        def work() -> None:
            result: Outcome | BaseException
            try:
                result = self.engine.generate(prepared, body, emit, cancel)
            except Exception as exc:  # noqa: BLE001 - handed to the request that waits for it
                result = exc
            loop.call_soon_threadsafe(settle, result)

        # A daemon thread: a generation in progress must not hold the process at shutdown.
        threading.Thread(target=work, name="generate", daemon=True).start()
        return done

    async def _generate(
        self, prepared: Prepared, body: ChatBody, emit: Callable[[str], object]
    ) -> Outcome:
        cancel = threading.Event()
        done = self._start(prepared, body, emit, cancel)
        try:
            return await asyncio.shield(done)
        finally:
            cancel.set()  # if the client went away: stop at the next token
            done.add_done_callback(_consume)

    async def _stream(
        self, completion: Completion, prepared: Prepared, body: ChatBody, claim: _TurnClaim
    ) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()
        cancel = threading.Event()
        claim.hand_over()  # no await before _start: from here the generation releases it
        done = self._start(
            prepared, body, lambda text: loop.call_soon_threadsafe(queue.put_nowait, text), cancel
        )
        with_usage = bool(body.stream_options and body.stream_options.include_usage)
        getter: asyncio.Future[str] | None = None
        try:
            yield sse(completion.chunk({"role": "assistant", "content": ""}, with_usage=with_usage))
            while True:
                getter = asyncio.ensure_future(queue.get())
                waiting: set[asyncio.Future[Any]] = {getter, done}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    text = getter.result()
                    yield sse(completion.chunk({"content": text}, with_usage=with_usage))
                    continue
                getter.cancel()
                while not queue.empty():
                    text = queue.get_nowait()
                    yield sse(completion.chunk({"content": text}, with_usage=with_usage))
                break
            try:
                outcome = done.result()
            except Exception as exc:  # noqa: BLE001 - reported in the stream, as llama-server
                log.error("generation failed: %r", exc)
                yield sse(ApiError(500, str(exc), "server_error").body())
                return
            counts = usage(len(prepared.tokens), outcome.completion_tokens)
            if with_usage:
                yield sse(completion.chunk({}, outcome.finish_reason, with_usage=True))
                yield sse(completion.chunk(None, usage=counts))
            else:
                # Without include_usage, llama-server puts the usage on the final chunk.
                yield sse(completion.chunk({}, outcome.finish_reason, usage=counts))
            yield sse("[DONE]")
        finally:
            cancel.set()
            if getter is not None:
                getter.cancel()
            # The client may be gone: nobody else will look at the outcome.
            done.add_done_callback(_consume)


class _TurnClaim:
    """The turn, held by a streaming request until its generation takes it over."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._held = True

    def hand_over(self) -> None:
        self._held = False

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._release()


class _TurnStream(StreamingResponse):
    """A stream that gives the turn back if it ends before its body started: a client that
    went away while the response waited to be sent never runs the body (nor its
    `finally`), and the turn would otherwise be held forever."""

    def __init__(self, body: AsyncIterator[bytes], claim: _TurnClaim) -> None:
        # llama.cpp's server (cpp-httplib) names no charset: neither does this one, so every
        # client of the bundled server meets what a real llama-server sends.
        super().__init__(
            body,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
        self._claim = claim

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._claim.give_back()


def _consume(future: asyncio.Future[Outcome]) -> None:
    if not future.cancelled():
        future.exception()


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    options, unknown = parse_args(sys.argv[1:] if argv is None else argv)
    if unknown:
        log.warning("main: ignoring llama-server flags this server does not implement: %s", unknown)
    server = LlamaServer(options)
    config = uvicorn.Config(
        server.app(),
        host=options.host,
        port=options.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    uv = uvicorn.Server(config)

    def fatal() -> None:
        uv.should_exit = True

    server.on_fatal = fatal
    log.info(
        "main: loading model %s (n_ctx %s, n_gpu_layers %s, threads %s)",
        options.model,
        options.ctx_size,
        options.gpu_layers,
        options.threads,
    )
    log.info("main: server is listening on http://%s:%s", options.host, options.port)
    uv.run()
    if server.load_error or not uv.started:
        return 1
    return 0
