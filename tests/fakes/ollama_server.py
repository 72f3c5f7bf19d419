"""A real loopback HTTP server that speaks Ollama's native API byte for byte.

    async with OllamaFake() as server:
        server.script(OllamaTurn(content="Hello!", prompt_eval_count=26, eval_count=3))
        ...  # point an adapter at server.url
        server.requests[-1].json

Routes:
- `POST /api/chat`: answers the next scripted `OllamaTurn` (or an echo of the last user
  text). With `"stream": true` (Ollama's default when the field is absent) the answer is
  NDJSON (`application/x-ndjson`), one object per line: thinking pieces
  (`message.thinking`), content pieces (`message.content`, `chunk` characters each), one line
  per tool call (`message.tool_calls` with complete `arguments` objects, as Ollama streams
  them), then `{done: true, done_reason, total_duration, load_duration, prompt_eval_count,
  prompt_eval_duration, eval_count, eval_duration}` with an empty message. With
  `"stream": false`: one object holding the whole message and the statistics.
- `POST /api/embed`: `{model, embeddings: [[...]], total_duration, load_duration,
  prompt_eval_count}` for the models in `embed_models` (`name` or `name:latest`; another is
  Ollama's 404 `model "x" not found, try pulling it first`); vectors are the words hashed into
  `embedding_dim` buckets, cut to `dimensions` when asked; the body is checked with
  `ollama_embed_problems`.
- `GET /api/tags`: `{models: [{name, model, modified_at, size, digest, details}]}`.
- `POST /api/show` `{model}`: `{modelfile, parameters, template, details, model_info,
  capabilities}` for a model of `models` (`name`, or without `:latest`), `model_info` holding
  `general.architecture` and `<arch>.context_length`; another is a 404 `model 'x' not found`.

On the wire as Ollama's Go server (gin, net/http) answers, checked against ollama
`server/routes.go` (`streamResponse`: `c.Header("Content-Type", "application/x-ndjson")`, one
`json.Marshal` value and `\n` per write, flushed: chunked) and gin's `c.JSON`
(`application/json; charset=utf-8`): the NDJSON stream names no charset; header names in Go's
canonical case (`Content-Type`, `Date`, no `Server`); JSON as Go's encoder writes it (raw
UTF-8, `<`, `>`, `&`, U+2028 and U+2029 escaped as `\u003c`...). `OllamaTurn.line_end` and
`byte_chunk` change how a stream goes out (CRLF line ends; the body cut every K bytes, inside
multi-byte characters too).

Errors are Ollama's `{"error": "<message>"}` with the turn's status. Mid-stream:
`fail_after=N` sends N lines then drops the connection; `error_after=N` sends N lines then an
`{"error": ...}` line (how Ollama reports a failure after the 200). With `api_key` set a
request without `Authorization: Bearer <key>` gets 401 (Ollama behind an authenticating
proxy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.fakes._loopback import (
    LoopbackServer,
    RecordedRequest,
    Send,
    hashed_embedding,
    http_date,
    pieces,
    reframe,
)
from tests.fakes._wire_checks import ollama_embed_problems, ollama_problems

__all__ = ["OllamaFake", "OllamaTurn"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class OllamaTurn:
    content: str = ""
    thinking: str = ""
    # {"name": ..., "arguments": {...}} each (Ollama's tool calls carry no id)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    done_reason: str = "stop"
    prompt_eval_count: int = 26
    eval_count: int = 9
    model: str | None = None  # default: the request's model
    created_at: str = field(default_factory=_now)
    chunk: int = 4
    status: int = 200
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    fail_after: int | None = None
    error_after: int | None = None
    line_end: str = "\n"
    byte_chunk: int | None = None


# What Go's encoding/json escapes besides what Python's json.dumps(ensure_ascii=False) does.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def go_json(obj: Any) -> str:
    """`obj` as Go's json.Marshal writes it: compact, raw UTF-8, HTML-safe escapes (only
    inside strings can these characters occur, so escaping them in the text is exact)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(_GO_ESCAPES)


@dataclass
class OllamaModel:
    name: str
    size: int = 1_321_098_329
    family: str = "llama"
    parameter_size: str = "1.2B"
    context_length: int = 131_072


class OllamaFake(LoopbackServer):
    label = "Ollama"
    http = "h11"  # header names as Go writes them
    server_header = False  # Go's net/http sends no Server header
    date_header = False  # its own, in Go's case (below)

    @classmethod
    def json_text(cls, obj: Any) -> str:
        return go_json(obj)

    @classmethod
    def peer_headers(cls) -> list[tuple[str, str]]:
        return [("Date", http_date())]

    def __init__(self, *, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key
        self.models = [OllamaModel("llama3.2:latest"), OllamaModel("llava:7b", 4_733_363_377)]
        self.tags_status = 200
        self.embed_models = {"nomic-embed-text", "all-minilm"}
        self.embedding_dim = 768

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/api/chat"]

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if self.api_key is not None and (
            request.headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            await self.send_json(send, 401, {"error": "unauthorized"})
        elif request.method == "GET" and request.path == "/api/tags":
            await self._tags(send)
        elif request.method == "POST" and request.path == "/api/chat":
            await self._chat(request, send)
        elif request.method == "POST" and request.path == "/api/embed":
            await self._embed(request, send)
        elif request.method == "POST" and request.path == "/api/show":
            await self._show(request, send)
        else:
            await self.send_body(send, 404, b"404 page not found", [("Content-Type", "text/plain")])

    async def _tags(self, send: Send) -> None:
        if self.tags_status >= 400:
            await self.send_json(send, self.tags_status, {"error": "server busy"})
            return
        models = [
            {
                "name": m.name,
                "model": m.name,
                "modified_at": "2025-05-01T10:12:13.123456789Z",
                "size": m.size,
                "digest": "a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": m.family,
                    "families": [m.family],
                    "parameter_size": m.parameter_size,
                    "quantization_level": "Q4_K_M",
                },
            }
            for m in self.models
        ]
        await self.send_json(send, 200, {"models": models})

    async def _show(self, request: RecordedRequest, send: Send) -> None:
        body = request.json
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            await self.send_json(send, 400, {"error": "model is required"})
            return
        found = [m for m in self.models if name in (m.name, m.name.removesuffix(":latest"))]
        if not found:
            await self.send_json(send, 404, {"error": f"model '{name}' not found"})
            return
        m = found[0]
        details = {
            "parent_model": "",
            "format": "gguf",
            "family": m.family,
            "families": [m.family],
            "parameter_size": m.parameter_size,
            "quantization_level": "Q4_K_M",
        }
        info = {
            "general.architecture": m.family,
            "general.parameter_count": 1_235_814_432,
            f"{m.family}.context_length": m.context_length,
            f"{m.family}.embedding_length": 2048,
        }
        await self.send_json(
            send,
            200,
            {
                "modelfile": f"FROM {m.name}\n",
                "parameters": 'stop "<|eot_id|>"',
                "template": "{{ .Prompt }}",
                "details": details,
                "model_info": info,
                "capabilities": ["completion", "tools"],
                "modified_at": "2025-05-01T10:12:13.123456789Z",
            },
        )

    @property
    def embed_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/api/embed"]

    async def _embed(self, request: RecordedRequest, send: Send) -> None:
        try:
            body = request.json
        except ValueError:
            await self.send_json(send, 400, {"error": "invalid character 'x' looking for value"})
            return
        problems = ollama_embed_problems(body)
        if problems:
            self.violations.extend(problems)
            await self.send_json(send, 400, {"error": "; ".join(problems)})
            return
        model = str(body["model"])
        if model.removesuffix(":latest") not in self.embed_models:
            await self.send_json(
                send, 404, {"error": f'model "{model}" not found, try pulling it first'}
            )
            return
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        dim = body.get("dimensions") or self.embedding_dim
        answer = {
            "model": model,
            "embeddings": [hashed_embedding(t, self.embedding_dim)[:dim] for t in texts],
            "total_duration": 14143917,
            "load_duration": 1019500,
            "prompt_eval_count": sum(len(t.split()) for t in texts),
        }
        await self.send_json(send, 200, answer)

    async def _chat(self, request: RecordedRequest, send: Send) -> None:
        try:
            body = request.json
        except ValueError:
            await self.send_json(send, 400, {"error": "invalid character 'x' looking for value"})
            return
        problems = ollama_problems(body)
        if problems:
            self.violations.extend(problems)
            await self.send_json(send, 400, {"error": "; ".join(problems)})
            return
        turn = self.next_reply() or _echo(body)
        if turn.status >= 400:
            await self.send_json(
                send,
                turn.status,
                {"error": turn.error or "internal error"},
                list(turn.headers.items()),
            )
            return
        model = turn.model or str(body.get("model"))
        if body.get("stream", True) is False:
            await self.send_json(send, 200, self.whole(turn, model))
            return
        lines = self.lines(turn, model)
        if turn.error_after is not None:
            error = go_json(
                {"error": turn.error or "an error was encountered while running the model"}
            )
            lines = [*lines[: turn.error_after], error]
        frames = [line.encode() + b"\n" for line in lines]
        drop = turn.fail_after is not None
        if turn.fail_after is not None:
            frames = frames[: turn.fail_after]
        frames = reframe(frames, line_end=turn.line_end, byte_chunk=turn.byte_chunk)
        await self.send_stream(
            send,
            [("Content-Type", "application/x-ndjson")],
            frames,
            fail_after=len(frames) if drop else None,
        )

    @staticmethod
    def _stats(turn: OllamaTurn) -> dict[str, Any]:
        return {
            "done_reason": turn.done_reason,
            "done": True,
            "total_duration": 4883583458,
            "load_duration": 1334875,
            "prompt_eval_count": turn.prompt_eval_count,
            "prompt_eval_duration": 342546000,
            "eval_count": turn.eval_count,
            "eval_duration": 4535599000,
        }

    @staticmethod
    def _calls(turn: OllamaTurn) -> list[dict[str, Any]]:
        return [
            {"function": {"index": i, "name": c["name"], "arguments": c.get("arguments", {})}}
            for i, c in enumerate(turn.tool_calls)
        ]

    def whole(self, turn: OllamaTurn, model: str) -> dict[str, Any]:
        """The `"stream": false` answer."""
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.thinking:
            message["thinking"] = turn.thinking
        if turn.tool_calls:
            message["tool_calls"] = self._calls(turn)
        return {
            "model": model,
            "created_at": turn.created_at,
            "message": message,
            **self._stats(turn),
        }

    def lines(self, turn: OllamaTurn, model: str) -> list[str]:
        """The NDJSON lines of the streamed answer, without their newlines."""

        def line(message: dict[str, Any]) -> str:
            obj = {
                "model": model,
                "created_at": turn.created_at,
                "message": {"role": "assistant", **message},
                "done": False,
            }
            return go_json(obj)

        out = [line({"content": "", "thinking": p}) for p in pieces(turn.thinking, turn.chunk)]
        out += [line({"content": p}) for p in pieces(turn.content, turn.chunk)]
        out += [line({"content": "", "tool_calls": [call]}) for call in self._calls(turn)]
        final = {
            "model": model,
            "created_at": turn.created_at,
            "message": {"role": "assistant", "content": ""},
            **self._stats(turn),
        }
        out.append(go_json(final))
        return out


def _echo(body: Any) -> OllamaTurn:
    text = ""
    for m in (body or {}).get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            text = str(m.get("content") or "")
    return OllamaTurn(content=f"echo: {text}")
