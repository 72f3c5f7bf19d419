"""The HTTP side of the launcher: the Starlette app (`LlamaServer`) with llama-server's
routes and API key check, the one turn that serializes generations, the answer and its
`chat.completion.chunk` stream, and `main` (uvicorn).

Separate from generation (which runs in a thread and knows no HTTP) and from reading the
request (which judges it before the turn is taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from orchestrator.inference._llama_server.engine import Engine, Outcome, Prepared
from orchestrator.inference._llama_server.options import ServerOptions, parse_args
from orchestrator.inference._llama_server.request import (
    ApiError,
    ChatBody,
    bad_request,
    chat_messages,
)

__all__ = ["Completion", "LlamaServer", "main", "sse", "usage"]

log = logging.getLogger("llama-server")


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
            return bad_request(detail).response()
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
