"""Ollama's native chat API: `POST /api/chat`, NDJSON when streaming, `GET /api/tags`.

Ollama's tool calls carry no ids (older servers) and tool results name the *function*
(`role: tool`, `tool_name`), so ids are synthesised here, deterministically from the reply, and
a result's function name is found from the assistant turn that made the call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from orchestrator.errors import BadRequest
from orchestrator.providers import _params
from orchestrator.providers._blocks import BlockWriter, new_message_id, tool_call_id
from orchestrator.providers._http import (
    iter_ndjson,
    json_answer,
    json_object,
    open_stream,
    post_json,
)
from orchestrator.providers._params import Translate
from orchestrator.providers._types import (
    Block,
    ChatRequest,
    ChatResponse,
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

__all__ = ["OllamaAdapter"]


class OllamaAdapter:
    """A local (or remote) Ollama server. No key is needed; a configured one is sent as a
    bearer token (for Ollama behind an authenticating proxy)."""

    params: Mapping[str, Translate] = _params.OLLAMA

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)

    # --- requests --------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        """The `/api/chat` body for `request`."""
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        names = _tool_names(request.messages)
        for message in request.messages:
            if message.role == "assistant":
                messages.append(_assistant_message(message))
            else:
                messages.extend(_user_messages(message, names))
        body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": stream}
        # Ollama has no tool_choice: "none" is honoured by not offering the tools at all.
        if request.tools and request.tool_choice != "none":
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        **({"description": tool.description} if tool.description else {}),
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        options: dict[str, Any] = {}
        if request.temperature is not None:
            options["temperature"] = request.temperature
        if request.top_p is not None:
            options["top_p"] = request.top_p
        if request.max_tokens is not None:
            options["num_predict"] = request.max_tokens
        if request.stop:
            options["stop"] = list(request.stop)
        if options:
            body["options"] = options
        return _params.apply(self, body, request.params)

    # --- the adapter protocol --------------------------------------------------------------
    async def complete(self, request: ChatRequest) -> ChatResponse:
        name = self.config.name
        data = await post_json(
            self.http,
            name,
            f"{self.config.base_url}/api/chat",
            self.build_body(request, stream=False),
            self._headers(),
            self._timeout,
        )
        data = json_object(name, data)
        if "error" in data:
            raise _stream_error(name, data)
        message = data.get("message") or {}
        content: list[Block] = []
        if message.get("thinking"):
            content.append(ThinkingBlock(str(message["thinking"])))
        if message.get("content"):
            content.append(TextBlock(str(message["content"])))
        salt = str(data.get("created_at") or "")
        for n, call in enumerate(message.get("tool_calls") or []):
            try:
                call_id, fn_name, args = _tool_call(call, n, salt)
            except ValueError as exc:
                raise ProviderError(
                    f"{name}: malformed tool call: {exc}", provider=name, upstream_status=200
                ) from exc
            content.append(ToolUseBlock(call_id, fn_name, args))
        stop = _stop_reason(data.get("done_reason"))
        if any(isinstance(b, ToolUseBlock) for b in content) and stop == "end_turn":
            stop = "tool_use"
        return ChatResponse(
            id=new_message_id(name),
            model=str(data.get("model") or request.model),
            content=tuple(content),
            stop_reason=stop,
            usage=_usage(data),
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        name = self.config.name
        async with open_stream(
            self.http,
            name,
            "POST",
            f"{self.config.base_url}/api/chat",
            json_body=self.build_body(request, stream=True),
            headers=self._headers(),
            request_timeout=self._timeout,
        ) as response:
            writer = BlockWriter()
            started = False
            calls = 0
            try:
                async for chunk in iter_ndjson(response):
                    if not isinstance(chunk, dict):
                        raise ProviderError(f"{name}: stream line is not an object", provider=name)
                    if "error" in chunk:
                        raise _stream_error(name, chunk)
                    if not started:
                        started = True
                        yield MessageStart(
                            new_message_id(name), str(chunk.get("model") or request.model)
                        )
                    message = chunk.get("message") or {}
                    for event in writer.thinking(str(message.get("thinking") or "")):
                        yield event
                    for event in writer.text(str(message.get("content") or "")):
                        yield event
                    salt = str(chunk.get("created_at") or "")
                    for call in message.get("tool_calls") or []:
                        call_id, fn_name, args = _tool_call(call, calls, salt)
                        calls += 1
                        for event in writer.tool_start(call_id, call_id, fn_name):
                            yield event
                        for event in writer.tool_args(call_id, json.dumps(args)):
                            yield event
                    if chunk.get("done"):
                        for event in writer.finish(
                            _stop_reason(chunk.get("done_reason")), _usage(chunk)
                        ):
                            yield event
                        return
            except ValueError as exc:  # a line that is not JSON, or a call fragment out of order
                raise ProviderError(
                    f"{name}: malformed stream: {exc}", provider=name, upstream_status=200
                ) from exc
        raise ProviderError(
            f"{name}: stream ended before the final message", provider=name, retryable=True
        )

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`POST /api/embed` `{model, input: [...], dimensions?}` -> `{embeddings,
        prompt_eval_count}`, the native API as for chat."""
        body: dict[str, Any] = {"model": request.model, "input": list(request.texts)}
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        data = await post_json(
            self.http,
            self.config.name,
            f"{self.config.base_url}/api/embed",
            body,
            self._headers(),
            self._timeout,
        )
        vectors = [[float(x) for x in v] for v in data["embeddings"]]
        return Embeddings(vectors, int(data.get("prompt_eval_count") or 0))

    async def probe(self) -> None:
        await self._get_json("/api/tags")

    async def list_models(self) -> list[dict[str, Any]]:
        """The models this server has pulled (`GET /api/tags`): name, size, details."""
        data = await self._get_json("/api/tags")
        models = data.get("models") if isinstance(data, dict) else None
        return [
            {
                "name": str(m.get("name") or m.get("model") or ""),
                "size": int(m.get("size") or 0),
                "details": dict(m.get("details") or {}),
            }
            for m in models or []
            if isinstance(m, dict)
        ]

    async def _get_json(self, path: str) -> Any:
        name = self.config.name
        async with open_stream(
            self.http,
            name,
            "GET",
            f"{self.config.base_url}{path}",
            headers=self._headers(),
            request_timeout=httpx.Timeout(self.config.connect_timeout_s),
        ) as response:
            return json_answer(name, await response.aread())


# --- conversions ---------------------------------------------------------------------------
def _tool_names(messages: Sequence[Message]) -> dict[str, str]:
    return {
        block.id: block.name
        for message in messages
        if message.role == "assistant"
        for block in message.content
        if isinstance(block, ToolUseBlock)
    }


def _assistant_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.text}
    thinking = "".join(b.text for b in message.content if isinstance(b, ThinkingBlock))
    if thinking:
        out["thinking"] = thinking
    calls = [
        {"function": {"name": b.name, "arguments": b.input}}
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    if calls:
        out["tool_calls"] = calls
    return out


def _user_messages(message: Message, names: dict[str, str]) -> list[dict[str, Any]]:
    """Tool results become `role: tool` messages (first: they answer the previous assistant
    turn), the rest one `role: user` message."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    images: list[str] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            # Ollama has no error flag on a tool result: say it in the text the model reads.
            result: dict[str, Any] = {
                "role": "tool",
                "content": f"Error: {block.text}" if block.is_error else block.text,
            }
            if block.tool_use_id in names:
                result["tool_name"] = names[block.tool_use_id]
            result_images = [_image_data(b) for b in block.content if isinstance(b, ImageBlock)]
            if result_images:
                result["images"] = result_images
            out.append(result)
        elif isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ImageBlock):
            images.append(_image_data(block))
    if text or images:
        user: dict[str, Any] = {"role": "user", "content": "".join(text)}
        if images:
            user["images"] = images
        out.append(user)
    return out


def _image_data(block: ImageBlock) -> str:
    """Base64 image bytes: Ollama takes inline images only (a data: URL is inline too)."""
    inline = block.inline()
    if inline is not None:
        return inline[1]
    raise BadRequest("ollama accepts inline (base64) images only, not image URLs")


def _tool_call(call: Any, n: int, salt: str) -> tuple[str, str, dict[str, Any]]:
    """(id, name, arguments) of one Ollama tool call. The id is Ollama's when it sends one;
    otherwise `call_<n>_<hash>`, the same for the same reply bytes (stable), different across
    turns (the reply's timestamp is part of the hash)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not fn.get("name"):
        raise ValueError(f"tool call without a function name: {call!r}")
    name = str(fn["name"])
    args = fn.get("arguments")
    if isinstance(args, str):  # some templates emit the arguments as a JSON string
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        args = {"_value": args}
    return tool_call_id(call.get("id"), n, salt, name, args), name, args


def _stop_reason(done_reason: Any) -> StopReason:
    # Ollama says "stop" for both a natural end and a stop sequence: they cannot be told apart.
    return "max_tokens" if done_reason == "length" else "end_turn"


def _usage(data: dict[str, Any]) -> Usage:
    return Usage(int(data.get("prompt_eval_count") or 0), int(data.get("eval_count") or 0))


def _stream_error(provider: str, data: dict[str, Any]) -> ProviderError:
    """An `{"error": "..."}` object in place of an answer (Ollama reports failures that
    happen after the 200 this way)."""
    return ProviderError.from_status(provider, 500, str(data.get("error") or "unknown error"))
