"""A real loopback HTTP server that speaks Google's Generative Language API byte for byte.

    async with GeminiFake(api_key="test-key") as server:
        server.script(GeminiTurn(parts=[{"text": "Hel"}, {"text": "lo"}]))
        ...  # point an adapter at server.base_url (".../v1beta")

Routes (under `/v1beta`):
- `POST /models/{model}:streamGenerateContent?alt=sse`: SSE, one `data: <GenerateContentResponse>`
  event per scripted part, framed `\\r\\n\\r\\n` as Google does; every chunk carries
  `responseId`, `modelVersion` and a running `usageMetadata` (prompt count only); the last
  one adds `finishReason` and the final usage (`promptTokenCount`, `candidatesTokenCount`,
  `thoughtsTokenCount` when thinking, `totalTokenCount`, `promptTokensDetails`). Without
  `alt=sse` the same chunks come as one JSON array.
- `POST /models/{model}:generateContent`: one GenerateContentResponse; adjacent text parts
  of the turn (thought or not) are joined, as a non-streamed answer has them.
- `POST /models/{model}:batchEmbedContents`: `{embeddings: [{values}]}`, one per request, in
  order, for the models in `embed_models` (else Google's 404 NOT_FOUND); vectors are the
  words hashed into `embedding_dim` buckets, cut to `outputDimensionality` when asked; the
  body is checked with `gemini_embed_problems`; a scripted failing turn answers instead.
- `POST /models/{model}:countTokens`: `{totalTokens, promptTokensDetails}` (ai.google.dev/api/
  tokens): the body is `{contents}` or `{generateContentRequest}` (one of the two; the latter's
  `model` must be `models/{model}` and the rest is checked like a generateContent body);
  `token_count` answers, else the body's JSON size / 4.
- `GET /models`: `{models: [{name, version, displayName, ..., supportedGenerationMethods}]}`.

On the wire as Google's front end answers (checked against a recorded
`streamGenerateContent?alt=sse` exchange, google/adk-go
`agent/llmagent/testdata/TestLLMAgentStreamingModeSSE.httprr`): the stream is
`content-type: text/event-stream` with no charset, `content-disposition: attachment`,
`server: scaffolding on HTTPServer2`, `vary: Origin` / `X-Origin` / `Referer`,
`x-content-type-options: nosniff`, `x-frame-options: SAMEORIGIN`, `x-xss-protection: 0`,
`server-timing`; each event's JSON written with a bare `,` between members and `": "` after keys,
raw UTF-8. JSON answers are `application/json; charset=UTF-8`, indented by two spaces as
Google's APIs print them. `GeminiTurn.line_end` (default CRLF) and `byte_chunk` (the body cut
every K bytes, inside multi-byte characters too) change how a stream goes out.

The key must come in `x-goog-api-key` (or `?key=`): none is a 403 PERMISSION_DENIED, a wrong
one Google's 400 INVALID_ARGUMENT with ErrorInfo `API_KEY_INVALID`. Errors are
`{"error": {"code", "message", "status", "details"?}}`; `GeminiTurn.rate_limited()` adds a
RetryInfo `retryDelay`. Mid-stream: `fail_after=N` sends N events then drops the connection,
`error_after=N` sends N events then `data: {"error": {...}}`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from tests.fakes._loopback import (
    LoopbackServer,
    RecordedRequest,
    Send,
    hashed_embedding,
    reframe,
)
from tests.fakes._wire_checks import gemini_embed_problems, gemini_problems

__all__ = ["GeminiFake", "GeminiTurn", "google_error"]

_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def google_error(
    code: int, message: str, details: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": _STATUS.get(code, "UNKNOWN"),
    }
    if details:
        error["details"] = details
    return {"error": error}


@dataclass
class GeminiTurn:
    # Parts in the order they stream, one SSE event each: {"text"}, {"text", "thought": true},
    # {"functionCall": {"name", "args"}}, optionally with "thoughtSignature".
    parts: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = "STOP"
    prompt_tokens: int = 12
    candidates_tokens: int = 8
    thoughts_tokens: int = 0
    model_version: str = "gemini-2.0-flash-001"
    response_id: str = field(default_factory=lambda: uuid.uuid4().hex[:22])
    prompt_feedback: dict[str, Any] | None = None
    status: int = 200
    error: dict[str, Any] | None = None
    fail_after: int | None = None
    error_after: int | None = None
    line_end: str = "\r\n"
    byte_chunk: int | None = None

    @classmethod
    def rate_limited(cls, retry_delay: str = "37s") -> GeminiTurn:
        return cls(
            status=429,
            error=google_error(
                429,
                "You exceeded your current quota, please check your plan and billing details.",
                [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}],
            ),
        )

    @classmethod
    def failing(cls, status: int, message: str) -> GeminiTurn:
        return cls(status=status, error=google_error(status, message))


class GeminiFake(LoopbackServer):
    label = "Gemini"
    json_type = "application/json; charset=UTF-8"
    server_header = False  # Google's, below

    @classmethod
    def json_text(cls, obj: Any) -> str:
        return json.dumps(obj, ensure_ascii=False, indent=2)

    @classmethod
    def peer_headers(cls) -> list[tuple[str, str]]:
        return [
            ("vary", "Origin"),
            ("vary", "X-Origin"),
            ("vary", "Referer"),
            ("server", "scaffolding on HTTPServer2"),
            ("x-xss-protection", "0"),
            ("x-frame-options", "SAMEORIGIN"),
            ("x-content-type-options", "nosniff"),
        ]

    def __init__(self, *, api_key: str = "test-gemini-key", prefix: str = "/v1beta") -> None:
        super().__init__()
        self.api_key = api_key
        self.prefix = prefix
        self.base_url = f"{self.url}{prefix}"
        self.models = ["gemini-2.0-flash", "gemini-2.5-pro"]
        self.models_status = 200
        self.embed_models = {"gemini-embedding-001", "text-embedding-004"}
        self.embedding_dim = 768
        self.token_count: int | None = None  # countTokens' answer (None: body size / 4)

    @property
    def embed_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith(":batchEmbedContents")]

    @property
    def generate_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if "Content" in r.path]

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        query = parse_qs(request.query)
        key = request.headers.get("x-goog-api-key") or (query.get("key") or [""])[0]
        if not key:
            msg = (
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API."
            )
            await self.send_json(send, 403, google_error(403, msg))
            return
        if key != self.api_key:
            detail = {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
            msg = "API key not valid. Please pass a valid API key."
            await self.send_json(send, 400, google_error(400, msg, [detail]))
            return
        path = request.path.removeprefix(self.prefix)
        if request.method == "GET" and path == "/models":
            await self._models(send)
            return
        if request.method == "POST" and path.startswith("/models/") and ":" in path:
            model, _, method = path.removeprefix("/models/").partition(":")
            if method in ("generateContent", "streamGenerateContent"):
                await self._generate(request, send, model, method, query.get("alt") == ["sse"])
                return
            if method == "batchEmbedContents":
                await self._embed(request, send, model)
                return
            if method == "countTokens":
                await self._count(request, send, model)
                return
        await self.send_json(
            send, 404, google_error(404, f"Method not found: {request.method} {request.path}")
        )

    async def _models(self, send: Send) -> None:
        if self.models_status >= 400:
            await self.send_json(
                send,
                self.models_status,
                google_error(self.models_status, "Internal error encountered."),
            )
            return
        models = [
            {
                "name": f"models/{m}",
                "version": "001",
                "displayName": m,
                "inputTokenLimit": 1048576,
                "outputTokenLimit": 8192,
                "supportedGenerationMethods": ["generateContent", "countTokens"],
            }
            for m in self.models
        ]
        await self.send_json(send, 200, {"models": models})

    async def _embed(self, request: RecordedRequest, send: Send, model: str) -> None:
        try:
            body = request.json
        except ValueError:
            await self.send_json(send, 400, google_error(400, "Invalid JSON payload received."))
            return
        problems = gemini_embed_problems(body, model)
        if problems:
            self.violations.extend(problems)
            await self.send_json(send, 400, google_error(400, "; ".join(problems)))
            return
        turn = self.next_reply()  # a scripted failure (GeminiTurn.failing) answers instead
        if turn is not None and turn.status >= 400:
            await self.send_json(send, turn.status, turn.error or google_error(turn.status, ""))
            return
        if model not in self.embed_models:
            msg = (
                f"models/{model} is not found for API version v1beta, or is not supported for "
                "batchEmbedContents. Call ListModels to see the list of available models and "
                "their supported methods."
            )
            await self.send_json(send, 404, google_error(404, msg))
            return
        embeddings = []
        for r in body["requests"]:
            text = " ".join(str(p.get("text", "")) for p in r["content"]["parts"])
            values = hashed_embedding(text, self.embedding_dim)
            if r.get("outputDimensionality"):
                values = values[: r["outputDimensionality"]]
            embeddings.append({"values": values})
        await self.send_json(send, 200, {"embeddings": embeddings})

    async def _count(self, request: RecordedRequest, send: Send, model: str) -> None:
        body = request.json
        problems: list[str] = []
        if (
            not isinstance(body, dict)
            or len(set(body) & {"contents", "generateContentRequest"}) != 1
        ):
            problems.append("exactly one of contents, generateContentRequest")
        elif set(body) - {"contents", "generateContentRequest"}:
            problems.append(
                f"unknown fields {sorted(set(body) - {'contents', 'generateContentRequest'})}"
            )
        elif "generateContentRequest" in body:
            inner = dict(body["generateContentRequest"])
            if inner.pop("model", None) != f"models/{model}":
                problems.append(f"generateContentRequest.model: must be 'models/{model}'")
            problems += gemini_problems(inner)
        else:
            problems += gemini_problems({"contents": body["contents"]})
        if problems:
            self.violations.extend(problems)
            await self.send_json(send, 400, google_error(400, "; ".join(problems)))
            return
        total = self.token_count if self.token_count is not None else max(1, len(request.raw) // 4)
        details = [{"modality": "TEXT", "tokenCount": total}]
        await self.send_json(send, 200, {"totalTokens": total, "promptTokensDetails": details})

    async def _generate(
        self, request: RecordedRequest, send: Send, model: str, method: str, sse: bool
    ) -> None:
        try:
            body = request.json
        except ValueError:
            await self.send_json(send, 400, google_error(400, "Invalid JSON payload received."))
            return
        problems = gemini_problems(body)
        if problems:
            self.violations.extend(problems)
            await self.send_json(send, 400, google_error(400, "; ".join(problems)))
            return
        turn = self.next_reply() or _echo(body)
        if turn.status >= 400:
            await self.send_json(
                send, turn.status, turn.error or google_error(turn.status, "error")
            )
            return
        if method == "generateContent":
            await self.send_json(send, 200, self.whole(turn))
            return
        chunks = self.chunks(turn)
        if not sse:
            await self.send_json(send, 200, chunks)
            return
        frames = [b"data: " + _event_json(c).encode() + b"\n\n" for c in chunks]
        if turn.error_after is not None:
            err = google_error(500, "An internal error has occurred. Please retry.")
            frames = [*frames[: turn.error_after], b"data: " + _event_json(err).encode() + b"\n\n"]
        drop = turn.fail_after is not None
        if turn.fail_after is not None:
            frames = frames[: turn.fail_after]
        frames = reframe(frames, line_end=turn.line_end, byte_chunk=turn.byte_chunk)
        await self.send_stream(
            send,
            [
                ("content-type", "text/event-stream"),
                ("content-disposition", "attachment"),
                ("server-timing", "gfet4t7; dur=1312"),
            ],
            frames,
            fail_after=len(frames) if drop else None,
        )

    @staticmethod
    def _final_usage(turn: GeminiTurn) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "promptTokenCount": turn.prompt_tokens,
            "candidatesTokenCount": turn.candidates_tokens,
            "totalTokenCount": turn.prompt_tokens + turn.candidates_tokens + turn.thoughts_tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": turn.prompt_tokens}],
        }
        if turn.thoughts_tokens:
            usage["thoughtsTokenCount"] = turn.thoughts_tokens
        return usage

    def chunks(self, turn: GeminiTurn) -> list[dict[str, Any]]:
        """The streamed GenerateContentResponse objects, in order."""
        out: list[dict[str, Any]] = []
        parts = turn.parts or [{"text": ""}]
        for n, part in enumerate(parts):
            last = n == len(parts) - 1
            candidate: dict[str, Any] = {"content": {"parts": [part], "role": "model"}}
            if last and turn.finish_reason:
                candidate["finishReason"] = turn.finish_reason
            candidate["index"] = 0
            usage = (
                self._final_usage(turn)
                if last
                else {"promptTokenCount": turn.prompt_tokens, "totalTokenCount": turn.prompt_tokens}
            )
            chunk: dict[str, Any] = {
                "candidates": [candidate],
                "usageMetadata": usage,
                "modelVersion": turn.model_version,
                "responseId": turn.response_id,
            }
            out.append(chunk)
        if turn.prompt_feedback is not None:
            out = [
                {
                    "promptFeedback": turn.prompt_feedback,
                    "usageMetadata": self._final_usage(turn),
                    "modelVersion": turn.model_version,
                    "responseId": turn.response_id,
                }
            ]
        return out

    def whole(self, turn: GeminiTurn) -> dict[str, Any]:
        """The generateContent answer: the turn's parts with adjacent texts joined."""
        if turn.prompt_feedback is not None:
            return self.chunks(turn)[0]
        parts: list[dict[str, Any]] = []
        for part in turn.parts:
            prev = parts[-1] if parts else None
            if (
                prev is not None
                and "text" in part
                and "text" in prev
                and bool(part.get("thought")) == bool(prev.get("thought"))
                and "thoughtSignature" not in prev
            ):
                parts[-1] = {**prev, **part, "text": prev["text"] + part["text"]}
            else:
                parts.append(dict(part))
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if turn.finish_reason:
            candidate["finishReason"] = turn.finish_reason
        candidate["index"] = 0
        return {
            "candidates": [candidate],
            "usageMetadata": self._final_usage(turn),
            "modelVersion": turn.model_version,
            "responseId": turn.response_id,
        }


def _event_json(obj: Any) -> str:
    """A stream event's JSON as Google writes it: `,` alone between members and items, `": "`
    after keys, raw UTF-8."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ": "))


def _echo(body: Any) -> GeminiTurn:
    text = ""
    for content in (body or {}).get("contents") or []:
        if isinstance(content, dict) and content.get("role") == "user":
            text = "".join(str(p.get("text", "")) for p in content.get("parts") or [])
    return GeminiTurn(parts=[{"text": f"echo: {text}"}])
