"""Google's Generative Language API: `models/{model}:generateContent` and
`:streamGenerateContent?alt=sse`, key in `x-goog-api-key`.

Three things Gemini does its own way: function calls carry no ids (synthesised here), a
function *response* names the function instead of the call (found from the assistant turn
that made the call), and tool parameter schemas must be a subset of OpenAPI 3.0 (`Schema`),
so JSON Schema is narrowed to it.
"""

from __future__ import annotations

import contextlib
import json
import mimetypes
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from orchestrator.errors import BadRequest
from orchestrator.providers import _params
from orchestrator.providers._blocks import BlockWriter, new_message_id, tool_call_id
from orchestrator.providers._http import (
    error_message,
    iter_sse,
    json_answer,
    json_object,
    retry_after_of,
)
from orchestrator.providers._params import Translate
from orchestrator.providers._types import (
    Block,
    ChatRequest,
    ChatResponse,
    DocumentBlock,
    Embeddings,
    EmbedRequest,
    ImageBlock,
    Message,
    MessageStart,
    ProviderConfig,
    ProviderError,
    StopReason,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

__all__ = ["GeminiAdapter", "gemini_schema"]

# Documented placeholder for a function call whose thought signature we do not have (a
# conversation from another provider, or one we answered in another process): Gemini 3
# rejects the first function call of a turn without one.
SKIP_SIGNATURE = "skip_thought_signature_validator"

_STOP: dict[str, StopReason] = {
    "STOP": "end_turn",
    "MAX_TOKENS": "max_tokens",
    "SAFETY": "refusal",
    "RECITATION": "refusal",
    "BLOCKLIST": "refusal",
    "PROHIBITED_CONTENT": "refusal",
    "SPII": "refusal",
    "IMAGE_SAFETY": "refusal",
    "LANGUAGE": "refusal",
}

_TOOL_MODES = {"auto": "AUTO", "any": "ANY", "none": "NONE"}

# batchEmbedContents takes at most 100 requests per call.
EMBED_BATCH = 100


class GeminiAdapter:
    """Gemini through the Generative Language REST API (v1beta by default)."""

    params: Mapping[str, Translate] = _params.GEMINI

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        # Thought signatures of function calls this adapter returned, by synthesised call id,
        # so the next turn can echo them back; bounded, and a miss falls back to
        # SKIP_SIGNATURE, so losing one (another replica, a restart) is harmless.
        self._signatures: OrderedDict[str, str] = OrderedDict()

    # --- requests --------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["x-goog-api-key"] = self.config.api_key
        return headers

    def _url(self, request: ChatRequest, method: str) -> str:
        model = quote(request.model.removeprefix("models/"), safe="-._~")
        return f"{self.config.base_url}/models/{model}:{method}"

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        """The GenerateContentRequest body for `request` (same for both endpoints)."""
        names = _tool_names(request.messages)
        contents = []
        for message in request.messages:
            parts = (
                self._model_parts(message)
                if message.role == "assistant"
                else _user_parts(message, names)
            )
            if parts:
                contents.append(
                    {"role": "model" if message.role == "assistant" else "user", "parts": parts}
                )
        body: dict[str, Any] = {"contents": contents}
        if request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        if request.tools:
            declarations = []
            for tool in request.tools:
                declaration: dict[str, Any] = {"name": tool.name}
                if tool.description:
                    declaration["description"] = tool.description
                schema = gemini_schema(tool.parameters)
                # An OBJECT without properties is rejected: a tool without arguments
                # declares no parameters at all.
                if schema.get("properties"):
                    declaration["parameters"] = schema
                declarations.append(declaration)
            body["tools"] = [{"functionDeclarations": declarations}]
            choice = request.tool_choice
            if isinstance(choice, dict) and choice.get("name"):
                body["toolConfig"] = {
                    "functionCallingConfig": {
                        "mode": "ANY",
                        "allowedFunctionNames": [choice["name"]],
                    }
                }
            elif isinstance(choice, str) and choice in _TOOL_MODES:
                body["toolConfig"] = {"functionCallingConfig": {"mode": _TOOL_MODES[choice]}}
        config: dict[str, Any] = {}
        if request.max_tokens is not None:
            config["maxOutputTokens"] = request.max_tokens
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.top_p is not None:
            config["topP"] = request.top_p
        if request.stop:
            config["stopSequences"] = list(request.stop)
        if config:
            body["generationConfig"] = config
        return _params.apply(self, body, request.params)

    def _model_parts(self, message: Message) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        first_call = True
        for block in message.content:
            if isinstance(block, TextBlock) and block.text:
                parts.append({"text": block.text})
            elif isinstance(block, ThinkingBlock) and block.signature:
                # Unsigned thought text means nothing to Gemini: only signed thoughts go back.
                parts.append(
                    {"text": block.text, "thought": True, "thoughtSignature": block.signature}
                )
            elif isinstance(block, ToolUseBlock):
                part: dict[str, Any] = {"functionCall": {"name": block.name, "args": block.input}}
                signature = self._signatures.get(block.id) or (
                    SKIP_SIGNATURE if first_call else None
                )
                if signature:
                    part["thoughtSignature"] = signature
                first_call = False
                parts.append(part)
            elif isinstance(block, ImageBlock):
                parts.append(_image_part(block))
        return parts

    def _remember(self, call_id: str, signature: Any) -> None:
        if isinstance(signature, str) and signature:
            self._signatures[call_id] = signature
            while len(self._signatures) > 4096:
                self._signatures.popitem(last=False)

    # --- the adapter protocol --------------------------------------------------------------
    async def count_tokens(self, request: ChatRequest) -> int:
        """Gemini's own count (models/{model}:countTokens) of the whole request, given as a
        `generateContentRequest` so the system instruction and tools count too."""
        name = self.config.name
        model = request.model.removeprefix("models/")
        body = {"generateContentRequest": {"model": f"models/{model}", **self.build_body(request)}}
        async with self._request(
            "POST", self._url(request, "countTokens"), body, self._timeout
        ) as response:
            data = json_object(name, json_answer(name, await response.aread()))
        total = data.get("totalTokens")
        if not isinstance(total, int) or isinstance(total, bool):
            raise ProviderError(
                f"{name}: malformed countTokens answer", provider=name, upstream_status=200
            )
        return total

    async def complete(self, request: ChatRequest) -> ChatResponse:
        name = self.config.name
        async with self._request(
            "POST", self._url(request, "generateContent"), self.build_body(request), self._timeout
        ) as response:
            data = json_object(name, json_answer(name, await response.aread()))
        reply_id = str(data.get("responseId") or new_message_id(name))
        content: list[Block] = []
        stop: StopReason = "end_turn"
        candidates = data.get("candidates") or []
        if candidates:
            candidate = candidates[0]
            calls = 0
            for part in (candidate.get("content") or {}).get("parts") or []:
                if "functionCall" in part:
                    try:
                        call_id, fn_name, args = _function_call(
                            part["functionCall"], calls, reply_id
                        )
                    except ValueError as exc:
                        raise ProviderError(
                            f"{name}: malformed function call: {exc}",
                            provider=name,
                            upstream_status=200,
                        ) from exc
                    calls += 1
                    self._remember(call_id, part.get("thoughtSignature"))
                    content.append(ToolUseBlock(call_id, fn_name, args))
                elif part.get("thought"):
                    _append_thought(
                        content, str(part.get("text") or ""), part.get("thoughtSignature")
                    )
                elif "text" in part:
                    _append_text(content, str(part["text"]))
            stop = _stop_reason(name, candidate.get("finishReason"))
        elif (data.get("promptFeedback") or {}).get("blockReason"):
            stop = "refusal"
        if stop == "end_turn" and any(isinstance(b, ToolUseBlock) for b in content):
            stop = "tool_use"
        return ChatResponse(
            id=reply_id,
            model=str(data.get("modelVersion") or request.model),
            content=tuple(content),
            stop_reason=stop,
            usage=_usage(data.get("usageMetadata")),
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        name = self.config.name
        url = self._url(request, "streamGenerateContent") + "?alt=sse"
        async with self._request("POST", url, self.build_body(request), self._timeout) as response:
            writer = BlockWriter()
            started = False
            calls = 0
            reply_id = ""
            stop: StopReason | None = None
            usage = Usage()
            async for _event, data in iter_sse(response):
                chunk = json_answer(name, data.encode())
                if not isinstance(chunk, dict):
                    raise ProviderError(f"{name}: stream event is not an object", provider=name)
                if "error" in chunk:
                    raise _error(name, 500, data.encode(), None)
                if not started:
                    started = True
                    reply_id = str(chunk.get("responseId") or new_message_id(name))
                    prompt = (chunk.get("usageMetadata") or {}).get("promptTokenCount") or 0
                    yield MessageStart(
                        reply_id, str(chunk.get("modelVersion") or request.model), int(prompt)
                    )
                if chunk.get("usageMetadata"):
                    usage = _usage(chunk["usageMetadata"])  # cumulative: the last one is final
                candidates = chunk.get("candidates") or []
                if not candidates:
                    if (chunk.get("promptFeedback") or {}).get("blockReason"):
                        stop = "refusal"
                    continue
                candidate = candidates[0]
                for part in (candidate.get("content") or {}).get("parts") or []:
                    try:
                        if "functionCall" in part:
                            call_id, fn_name, args = _function_call(
                                part["functionCall"], calls, reply_id
                            )
                            calls += 1
                            self._remember(call_id, part.get("thoughtSignature"))
                            events = [
                                *writer.tool_start(call_id, call_id, fn_name),
                                *writer.tool_args(call_id, json.dumps(args)),
                            ]
                        elif part.get("thought"):
                            events = writer.thinking(str(part.get("text") or ""))
                        else:
                            events = writer.text(str(part.get("text") or ""))
                    except ValueError as exc:
                        raise ProviderError(
                            f"{name}: malformed stream: {exc}", provider=name, upstream_status=200
                        ) from exc
                    for event in events:
                        yield event
                if candidate.get("finishReason"):
                    stop = _stop_reason(name, candidate["finishReason"])
        if not started or stop is None:
            raise ProviderError(
                f"{name}: stream ended before a finish reason", provider=name, retryable=True
            )
        for event in writer.finish(stop, usage):
            yield event

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`POST models/{model}:batchEmbedContents`, one EmbedContentRequest per text (the
        same model, `outputDimensionality` for `dimensions`), EMBED_BATCH texts a call. The
        answer carries no token count: `input_tokens` stays 0."""
        model = request.model.removeprefix("models/")
        url = f"{self.config.base_url}/models/{quote(model, safe='-._~')}:batchEmbedContents"
        extra = {} if request.dimensions is None else {"outputDimensionality": request.dimensions}
        vectors: list[list[float]] = []
        for start in range(0, len(request.texts), EMBED_BATCH):
            batch = [
                {"model": f"models/{model}", "content": {"parts": [{"text": text}]}, **extra}
                for text in request.texts[start : start + EMBED_BATCH]
            ]
            body = {"requests": batch}
            async with self._request("POST", url, body, self._timeout) as response:
                data = json_answer(self.config.name, await response.aread())
            vectors += [[float(x) for x in e["values"]] for e in data["embeddings"]]
        return Embeddings(vectors)

    async def probe(self) -> None:
        async with self._request(
            "GET",
            f"{self.config.base_url}/models",
            None,
            httpx.Timeout(self.config.connect_timeout_s),
        ) as response:
            await response.aread()

    @contextlib.asynccontextmanager
    async def _request(
        self, method: str, url: str, body: dict[str, Any] | None, limits: httpx.Timeout
    ) -> AsyncIterator[httpx.Response]:
        """Like `open_stream`, but reading Gemini's error details (RetryInfo's retry delay,
        ErrorInfo's API_KEY_INVALID) that the generic error mapping cannot see."""
        name = self.config.name
        kw: dict[str, Any] = {"headers": self._headers(), "timeout": limits}
        if body is not None:
            kw["json"] = body
        try:
            async with self.http.stream(method, url, **kw) as response:
                if response.status_code >= 400:
                    raise _error(
                        name, response.status_code, await response.aread(), retry_after_of(response)
                    )
                yield response
        except httpx.TimeoutException as exc:
            raise ProviderError.timeout(name, f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise ProviderError.unreachable(name, f"{type(exc).__name__}: {exc}") from exc


# --- errors --------------------------------------------------------------------------------
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)s\s*$")


def _error(provider: str, status: int, body: bytes, retry_after: float | None) -> ProviderError:
    """`{error: {code, message, status, details}}` as a ProviderError. A bad key is a 400
    (INVALID_ARGUMENT) to Gemini but our credentials' fault: reported as 401 so the caller
    sees a gateway error, not a bad request of theirs."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, list) and data:
        data = data[0]
    err = data.get("error") if isinstance(data, dict) else None
    message = error_message(body)
    if isinstance(err, dict):
        if isinstance(err.get("code"), int) and status == 500 and err["code"] >= 400:
            status = err["code"]  # an error event inside a 200 stream carries its own code
        if err.get("status"):
            message = f"{err['status']}: {message}"
        for detail in err.get("details") or []:
            if not isinstance(detail, dict):
                continue
            kind = str(detail.get("@type", ""))
            if kind.endswith("google.rpc.ErrorInfo") and detail.get("reason") == "API_KEY_INVALID":
                status = 401
            if kind.endswith("google.rpc.RetryInfo") and retry_after is None:
                match = _DURATION.match(str(detail.get("retryDelay", "")))
                if match:
                    retry_after = float(match.group(1))
    return ProviderError.from_status(provider, status, message, retry_after)


# --- conversions ---------------------------------------------------------------------------
def _user_parts(message: Message, names: dict[str, str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock) and block.text:
            parts.append({"text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block))
        elif isinstance(block, DocumentBlock):
            # A PDF inline (Gemini reads application/pdf inlineData), plain text as text.
            if block.text is not None:
                parts.append({"text": block.text})
            else:
                parts.append({"inlineData": {"mimeType": "application/pdf", "data": block.data}})
        elif isinstance(block, ToolResultBlock):
            if block.tool_use_id not in names:
                raise BadRequest(
                    f"tool result for unknown tool call {block.tool_use_id!r}: Gemini needs the "
                    "function name, taken from the assistant turn that made the call"
                )
            # Gemini's convention: "output" holds the result, "error" a failure.
            key = "error" if block.is_error else "output"
            parts.append(
                {
                    "functionResponse": {
                        "name": names[block.tool_use_id],
                        "response": {key: block.text},
                    }
                }
            )
            parts.extend(_image_part(b) for b in block.content if isinstance(b, ImageBlock))
    return parts


def _image_part(block: ImageBlock) -> dict[str, Any]:
    inline = block.inline()
    if inline is not None:
        media, data = inline
        return {"inlineData": {"mimeType": media or "image/png", "data": data}}
    url = block.url or ""
    mime = block.media_type or mimetypes.guess_type(url)[0] or "image/jpeg"
    return {"fileData": {"mimeType": mime, "fileUri": url}}


def _function_call(call: Any, n: int, salt: str) -> tuple[str, str, dict[str, Any]]:
    """(id, name, args) of a functionCall: Gemini's id when it gives one, else
    `call_<n>_<hash>`, the same for the same reply (salted with its responseId)."""
    if not isinstance(call, dict) or not call.get("name"):
        raise ValueError(f"function call without a name: {call!r}")
    name = str(call["name"])
    args = call.get("args") or {}
    if not isinstance(args, dict):
        args = {"_value": args}
    return tool_call_id(call.get("id"), n, salt, name, args), name, args


def _append_text(content: list[Block], text: str) -> None:
    if not text:
        return
    if content and isinstance(content[-1], TextBlock):
        content[-1] = TextBlock(content[-1].text + text)
    else:
        content.append(TextBlock(text))


def _append_thought(content: list[Block], text: str, signature: Any) -> None:
    sig = signature if isinstance(signature, str) and signature else None
    if content and isinstance(content[-1], ThinkingBlock):
        last = content[-1]
        content[-1] = ThinkingBlock(last.text + text, sig or last.signature)
    elif text or sig:
        content.append(ThinkingBlock(text, sig))


def _stop_reason(provider: str, reason: Any) -> StopReason:
    if reason == "MALFORMED_FUNCTION_CALL":
        # Nothing usable was produced, and sampling again may well succeed.
        raise ProviderError(
            f"{provider}: the model produced a malformed function call",
            provider=provider,
            upstream_status=200,
            retryable=True,
        )
    return _STOP.get(str(reason), "end_turn")


def _usage(meta: Any) -> Usage:
    """Thinking tokens are output the caller pays for: counted in `output_tokens`, as
    OpenAI counts reasoning tokens in `completion_tokens`."""
    if not isinstance(meta, dict):
        return Usage()
    output = int(meta.get("candidatesTokenCount") or 0) + int(meta.get("thoughtsTokenCount") or 0)
    # Gemini caches prompts on its own (implicit caching): the cached part of the prompt.
    cached = int(meta.get("cachedContentTokenCount") or 0)
    return Usage(int(meta.get("promptTokenCount") or 0), output, cache_read_input_tokens=cached)


# --- JSON Schema -> Gemini Schema ----------------------------------------------------------
# Gemini's `Schema` (a subset of OpenAPI 3.0): any other key is rejected with a 400.
_SCHEMA_KEYS = frozenset(
    {
        "type",
        "format",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    }
)


def gemini_schema(schema: Any) -> dict[str, Any]:
    """A JSON Schema narrowed to what Gemini accepts: local `$ref`s inlined, `allOf` merged,
    `oneOf` read as `anyOf`, `type: [X, "null"]` and `anyOf [..., {type: null}]` as
    `nullable`, `const` as a one-value enum; `$schema`, `additionalProperties`, `title`,
    `$defs` and every other unknown keyword dropped."""
    if not isinstance(schema, dict):
        return {}
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            defs.update(schema[key])
    return _narrow(schema, defs, 0)


def _narrow(schema: dict[str, Any], defs: dict[str, Any], depth: int) -> dict[str, Any]:
    if depth > 24:  # a recursive $ref: Gemini cannot express it; stop with an open object
        return {"type": "object"}
    schema = _resolve(schema, defs, depth)
    out: dict[str, Any] = {}
    kind = schema.get("type")
    if isinstance(kind, list):
        types = [t for t in kind if t != "null"]
        if "null" in kind:
            out["nullable"] = True
        if len(types) == 1:
            kind = types[0]
        else:
            kind = None
            if types:
                out["anyOf"] = [{"type": t} for t in types]
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        options = [b for b in branches if isinstance(b, dict)]
        if any(b.get("type") == "null" for b in options):
            out["nullable"] = True
            options = [b for b in options if b.get("type") != "null"]
        narrowed = [_narrow(b, defs, depth + 1) for b in options]
        if len(narrowed) == 1:
            merged = {**narrowed[0], **({"nullable": True} if out.get("nullable") else {})}
            out = merged
            kind = kind or merged.get("type")
        elif narrowed:
            out["anyOf"] = narrowed
    if "const" in schema and "enum" not in schema:
        schema = {**schema, "enum": [schema["const"]]}
    for key, value in schema.items():
        if key not in _SCHEMA_KEYS or key in ("type", "anyOf"):
            continue
        if key == "properties" and isinstance(value, dict):
            props = {
                prop: _narrow(sub, defs, depth + 1)
                for prop, sub in value.items()
                if isinstance(sub, dict)
            }
            if props:
                out["properties"] = props
        elif key == "items":
            if isinstance(value, list):  # tuple form: Gemini has no tuples
                value = value[0] if value else {}
            if isinstance(value, dict):
                out["items"] = _narrow(value, defs, depth + 1)
        elif key == "enum" and isinstance(value, list):
            # Gemini enums are strings, on STRING only.
            if kind in (None, "string"):
                out["enum"] = [
                    str(v).lower() if isinstance(v, bool) else str(v)
                    for v in value
                    if v is not None
                ]
                kind = "string"
        elif key == "required" and isinstance(value, list):
            declared = schema.get("properties")
            names = declared if isinstance(declared, dict) else {}
            required = [r for r in value if isinstance(r, str) and r in names]
            if required:
                out["required"] = required
        else:
            out[key] = value
    if kind:
        out["type"] = kind
    return out


def _resolve(schema: dict[str, Any], defs: dict[str, Any], depth: int) -> dict[str, Any]:
    """Inline a local `$ref` and merge `allOf` into one schema (sibling keys win)."""
    if depth > 24:
        return {"type": "object"}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1]) if ref.startswith("#/") else None
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        resolved = _resolve(target, defs, depth + 1) if isinstance(target, dict) else {}
        schema = {**resolved, **rest}
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        merged: dict[str, Any] = {}
        for part in all_of:
            if isinstance(part, dict):
                part = _resolve(part, defs, depth + 1)
                props = {**merged.get("properties", {}), **part.get("properties", {})}
                required = [*merged.get("required", []), *part.get("required", [])]
                merged.update(part)
                if props:
                    merged["properties"] = props
                if required:
                    merged["required"] = required
        schema = {**merged, **{k: v for k, v in schema.items() if k != "allOf"}}
    return schema


def _tool_names(messages: Sequence[Message]) -> dict[str, str]:
    return {
        b.id: b.name
        for m in messages
        if m.role == "assistant"
        for b in m.content
        if isinstance(b, ToolUseBlock)
    }
