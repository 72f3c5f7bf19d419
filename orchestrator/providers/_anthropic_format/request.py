"""A caller's Messages API request (`POST /api/v1/messages`), decoded into a `ChatRequest`
and validated.

Separate from the rest of the format because it is the one part that judges input: every
field is checked and a malformed or unknown one is a 400 naming it (`ValidationFailed`, as
Anthropic's "extra inputs are not permitted").

What it accepts is the Messages API of anthropic-sdk-python 0.121.0 (commit 009b035,
2026-08-07; `types/message_create_params.py` and `types/beta/message_create_params.py`), the
beta surface included: every top-level field, every request block type, `role: system`
messages. The caller's body is kept (`ChatRequest.native`) for an Anthropic-format upstream,
which receives it verbatim. For the others it is decoded into the internal model; what that
model cannot carry is named in `params` (the Anthropic-only fields under their own names,
`cache_control` wherever it appears, `document` with its source kinds, Anthropic-only block
and server-tool types as `content.<type>` / `tools.<type>`) so that each provider's table
(`_params.py`) passes, translates, drops-and-lists or refuses it by name. Mid-conversation
system messages (`role: system`, `mid_conv_system` blocks) join the system prompt in order,
as OpenAI `system`/`developer` messages do on /chat/completions.
"""

from __future__ import annotations

from typing import Any, NoReturn

from orchestrator.errors import ValidationFailed
from orchestrator.providers._types import (
    Block,
    ChatRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    NativeRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = ["decode_request"]


def _invalid(path: str, message: str) -> NoReturn:
    raise ValidationFailed(
        f"invalid request: {path}: {message}",
        extra={"fields": [{"field": path, "message": message}]},
    )


def _obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _invalid(path, "must be an object")
    return value


def _str(value: Any, path: str, *, required: bool = True) -> str:
    if not isinstance(value, str) or (required and not value):
        _invalid(path, "must be a non-empty string" if required else "must be a string")
    return value


def _number(value: Any, path: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _invalid(path, "must be a number")
    if not low <= value <= high:
        _invalid(path, f"must be between {low:g} and {high:g}")
    return float(value)


class _Decoding:
    """What decoding one request collects besides the conversation: the `params` naming
    what only some providers honour, and mid-conversation system text."""

    __slots__ = ("params", "system")

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.system: list[str] = []

    def cache(self, block: dict[str, Any], path: str) -> dict[str, Any] | None:
        value = block.get("cache_control")
        if value is None:
            return None
        control = _obj(value, f"{path}.cache_control")
        if control.get("type") != "ephemeral":
            _invalid(f"{path}.cache_control.type", "must be 'ephemeral'")
        self.params["cache_control"] = True
        return control

    def only_anthropic(self, name: str) -> None:
        self.params[name] = True

    def document_kind(self, kind: str) -> None:
        kinds = self.params.get("document", ())
        if kind not in kinds:
            self.params["document"] = (*kinds, kind)


def _image(block: dict[str, Any], path: str, d: _Decoding) -> ImageBlock:
    source = _obj(block.get("source"), f"{path}.source")
    kind = source.get("type")
    cache = d.cache(block, path)
    if kind == "base64":
        return ImageBlock(
            media_type=_str(source.get("media_type"), f"{path}.source.media_type"),
            data=_str(source.get("data"), f"{path}.source.data"),
            cache_control=cache,
        )
    if kind == "url":
        return ImageBlock(url=_str(source.get("url"), f"{path}.source.url"), cache_control=cache)
    if kind == "file":
        _str(source.get("file_id"), f"{path}.source.file_id")
        d.only_anthropic("content.image.file")
        return ImageBlock(cache_control=cache)
    _invalid(f"{path}.source.type", "must be 'base64', 'url' or 'file'")


def _document(block: dict[str, Any], path: str, d: _Decoding) -> DocumentBlock:
    source = _obj(block.get("source"), f"{path}.source")
    kind = source.get("type")
    title, context = block.get("title"), block.get("context")
    if title is not None:
        title = _str(title, f"{path}.title", required=False)
    if context is not None:
        context = _str(context, f"{path}.context", required=False)
    citations = block.get("citations")
    if citations is not None:
        citations = _obj(citations, f"{path}.citations")
        d.only_anthropic("citations")
    common: dict[str, Any] = {
        "title": title,
        "context": context,
        "citations": citations,
        "cache_control": d.cache(block, path),
    }
    spath = f"{path}.source"
    if kind == "base64":
        if source.get("media_type") != "application/pdf":
            _invalid(f"{spath}.media_type", "must be 'application/pdf'")
        data = _str(source.get("data"), f"{spath}.data")
        out = DocumentBlock(media_type="application/pdf", data=data, **common)
    elif kind == "text":
        if source.get("media_type") != "text/plain":
            _invalid(f"{spath}.media_type", "must be 'text/plain'")
        text = _str(source.get("data"), f"{spath}.data", required=False)
        out = DocumentBlock(media_type="text/plain", text=text, **common)
    elif kind == "url":
        out = DocumentBlock(url=_str(source.get("url"), f"{spath}.url"), **common)
    elif kind == "content":
        # Content blocks as a custom document: text for the others, verbatim for Anthropic.
        parts = _tool_result_content(source.get("content"), f"{spath}.content", d)
        text = "\n\n".join(p.text for p in parts if isinstance(p, TextBlock))
        out = DocumentBlock(media_type="text/plain", text=text, **common)
    elif kind == "file":
        out = DocumentBlock(file_id=_str(source.get("file_id"), f"{spath}.file_id"), **common)
    else:
        _invalid(f"{spath}.type", "must be 'base64', 'text', 'url', 'content' or 'file'")
    d.document_kind(str(kind))
    return out


def _tool_result_content(
    value: Any, path: str, d: _Decoding
) -> tuple[TextBlock | ImageBlock | DocumentBlock, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (TextBlock(value),)
    if not isinstance(value, list):
        _invalid(path, "must be a string or an array of content blocks")
    out: list[TextBlock | ImageBlock | DocumentBlock] = []
    for i, item in enumerate(value):
        block = _obj(item, f"{path}.{i}")
        kind = block.get("type")
        if kind == "text":
            out.append(_text(block, f"{path}.{i}", d))
        elif kind == "image":
            out.append(_image(block, f"{path}.{i}", d))
        elif kind == "document":
            out.append(_document(block, f"{path}.{i}", d))
            d.only_anthropic("content.tool_result.document")
        elif isinstance(kind, str) and kind in _ANTHROPIC_ONLY_BLOCKS:
            d.only_anthropic(f"content.{kind}")
        else:
            _invalid(f"{path}.{i}.type", f"unsupported content block type {kind!r}")
    return tuple(out)


def _text(block: dict[str, Any], path: str, d: _Decoding) -> TextBlock:
    if block.get("citations"):
        d.only_anthropic("citations")
    text = _str(block.get("text"), f"{path}.text", required=False)
    return TextBlock(text, cache_control=d.cache(block, path))


# Request block types only Anthropic takes (server tools' calls and results, search results,
# MCP, container uploads, compaction, tool addition/removal, fallbacks: SDK 0.121.0's
# BetaContentBlockParam): passed to Anthropic, named for the others.
_ANTHROPIC_ONLY_BLOCKS = frozenset(
    {
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "advisor_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "compaction",
        "tool_addition",
        "tool_removal",
        "fallback",
        "tool_reference",
    }
)


def _block(item: Any, path: str, d: _Decoding) -> Block | None:
    """One request content block; None for blocks only Anthropic takes (named in params)
    and mid-conversation system blocks (joined to the system prompt)."""
    block = _obj(item, path)
    kind = block.get("type")
    if kind == "text":
        return _text(block, path, d)
    if kind == "image":
        return _image(block, path, d)
    if kind == "document":
        return _document(block, path, d)
    if kind == "tool_use":
        tool_input = block.get("input", {})
        return ToolUseBlock(
            id=_str(block.get("id"), f"{path}.id"),
            name=_str(block.get("name"), f"{path}.name"),
            input=_obj(tool_input, f"{path}.input"),
            cache_control=d.cache(block, path),
        )
    if kind == "tool_result":
        is_error = block.get("is_error", False)
        if not isinstance(is_error, bool):
            _invalid(f"{path}.is_error", "must be a boolean")
        return ToolResultBlock(
            tool_use_id=_str(block.get("tool_use_id"), f"{path}.tool_use_id"),
            content=_tool_result_content(block.get("content"), f"{path}.content", d),
            is_error=is_error,
            cache_control=d.cache(block, path),
        )
    if kind == "thinking":
        signature = block.get("signature")
        if signature is not None:
            signature = _str(signature, f"{path}.signature", required=False)
        return ThinkingBlock(
            _str(block.get("thinking"), f"{path}.thinking", required=False), signature or None
        )
    if kind == "redacted_thinking":
        return RedactedThinkingBlock(_str(block.get("data"), f"{path}.data", required=False))
    if kind == "mid_conv_system":
        d.cache(block, path)
        d.system.append(_system_text(block.get("content"), f"{path}.content", d))
        return None
    if isinstance(kind, str) and kind in _ANTHROPIC_ONLY_BLOCKS:
        d.cache(block, path)
        d.only_anthropic(f"content.{kind}")
        return None
    _invalid(f"{path}.type", f"unsupported content block type {kind!r}")


def _message(item: Any, path: str, d: _Decoding) -> Message | None:
    msg = _obj(item, path)
    role = msg.get("role")
    if role not in ("user", "assistant", "system"):
        _invalid(f"{path}.role", "must be 'user', 'assistant' or 'system'")
    content = msg.get("content")
    if role == "system":
        # Beta: system instructions at this point of the conversation.
        d.system.append(_system_text(content, f"{path}.content", d))
        return None
    if isinstance(content, str):
        return Message(role, (TextBlock(content),))
    if not isinstance(content, list):
        _invalid(f"{path}.content", "must be a string or an array of content blocks")
    blocks = [_block(b, f"{path}.content.{j}", d) for j, b in enumerate(content)]
    return Message(role, tuple(b for b in blocks if b is not None))


def _system_text(value: Any, path: str, d: _Decoding) -> str:
    if isinstance(value, str):
        return value
    return "\n\n".join(b.text for b in _system_blocks(value, path, d))


def _system_blocks(value: Any, path: str, d: _Decoding) -> list[TextBlock]:
    if not isinstance(value, list):
        _invalid(path, "must be a string or an array of text blocks")
    out: list[TextBlock] = []
    for i, item in enumerate(value):
        block = _obj(item, f"{path}.{i}")
        kind = block.get("type")
        if kind in ("tool_addition", "tool_removal"):
            d.only_anthropic(f"content.{kind}")
            continue
        if kind != "text":
            _invalid(f"{path}.{i}.type", "must be 'text'")
        out.append(_text(block, f"{path}.{i}", d))
    return out


def _system(value: Any, d: _Decoding) -> tuple[str | None, tuple[TextBlock, ...]]:
    """The system prompt's text, and its blocks when any carries a cache breakpoint."""
    if value is None:
        return None, ()
    if isinstance(value, str):
        return value or None, ()
    blocks = _system_blocks(value, "system", d)
    cached = tuple(blocks) if any(b.cache_control for b in blocks) else ()
    return "\n\n".join(b.text for b in blocks) or None, cached


# Fields of a custom tool beyond name, description and input_schema: Anthropic's only.
_TOOL_EXTRAS = ("allowed_callers", "defer_loading", "eager_input_streaming", "input_examples")


def _tools(value: Any, d: _Decoding) -> tuple[ToolDef, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        _invalid("tools", "must be an array")
    out: list[ToolDef] = []
    for i, item in enumerate(value):
        tool = _obj(item, f"tools.{i}")
        kind = tool.get("type") or "custom"
        if kind != "custom":
            # A server tool (web search, bash, text editor, MCP toolset...): Anthropic's.
            _str(kind, f"tools.{i}.type")
            d.cache(tool, f"tools.{i}")
            d.only_anthropic(f"tools.{kind}")
            continue
        description = tool.get("description")
        if description is not None:
            description = _str(description, f"tools.{i}.description", required=False)
        for extra in _TOOL_EXTRAS:
            if tool.get(extra) not in (None, False, []):
                d.only_anthropic(f"tools.{extra}")
        if tool.get("strict") is True:
            d.only_anthropic("tools.strict")
        out.append(
            ToolDef(
                name=_str(tool.get("name"), f"tools.{i}.name"),
                description=description,
                parameters=_obj(tool.get("input_schema"), f"tools.{i}.input_schema"),
                cache_control=d.cache(tool, f"tools.{i}"),
            )
        )
    return tuple(out)


def _tool_choice(value: Any) -> str | dict[str, str] | None:
    if value is None:
        return None
    choice = _obj(value, "tool_choice")
    kind = choice.get("type")
    if kind in ("auto", "any", "none"):
        return str(kind)
    if kind == "tool":
        return {"name": _str(choice.get("name"), "tool_choice.name")}
    _invalid("tool_choice.type", "must be 'auto', 'any', 'none' or 'tool'")


def decode_request(
    body: Any,
    *,
    beta_header: str | None = None,
    beta_query: bool = False,
    count: bool = False,
) -> ChatRequest:
    """A Messages API request body -> `ChatRequest`; `ValidationFailed` names the bad field.
    A missing `model` decodes to "" (the endpoint applies its default model). `count`: a
    `/messages/count_tokens` body (no `max_tokens`, fewer fields). The body is kept, with
    the caller's `anthropic-beta` header and `?beta=true`, for an Anthropic upstream."""
    data = _obj(body, "body")
    _check_fields(data, _COUNT_FIELDS if count else _FIELDS)
    d = _Decoding()
    # An absent model is left empty for the caller's default model; a given one must be valid.
    model = "" if data.get("model") is None else _str(data.get("model"), "model")
    max_tokens = data.get("max_tokens")
    if max_tokens is None and not count:
        _invalid("max_tokens", "field required")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
    ):
        _invalid("max_tokens", "must be a non-negative integer")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        _invalid("messages", "must be a non-empty array")
    temperature = data.get("temperature")
    top_p = data.get("top_p")
    stop = data.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        _invalid("stop_sequences", "must be an array of strings")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        _invalid("stream", "must be a boolean")
    user = None
    if data.get("metadata") is not None:
        metadata = _obj(data["metadata"], "metadata")
        if metadata.get("user_id") is not None:
            user = _str(metadata["user_id"], "metadata.user_id", required=False) or None
    system, system_blocks = _system(data.get("system"), d)
    decoded = [_message(m, f"messages.{i}", d) for i, m in enumerate(messages)]
    if d.system:
        system = "\n\n".join([*([system] if system else []), *d.system])
        if system_blocks:
            system_blocks = (*system_blocks, *(TextBlock(t) for t in d.system))
    _params_of(data, d)
    if user is not None:
        d.params["user"] = user
    return ChatRequest(
        model=model,
        messages=tuple(m for m in decoded if m is not None),
        system=system,
        tools=_tools(data.get("tools"), d),
        tool_choice=_tool_choice(data.get("tool_choice")),
        max_tokens=max_tokens,
        temperature=None if temperature is None else _number(temperature, "temperature", 0, 1),
        top_p=None if top_p is None else _number(top_p, "top_p", 0, 1),
        stop=tuple(stop),
        stream=stream,
        user=user,
        params=d.params,
        system_blocks=system_blocks,
        native=NativeRequest(data, beta_header or None, beta_query),
    )


# Every Messages API field a caller may send (SDK 0.121.0, beta fields included; `betas` and
# `user_profile_id` travel as headers); anything else is a 400 naming it (Anthropic's own
# "extra inputs are not permitted"): a field is never ignored silently.
_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
        "cache_control",
        "container",
        "context_management",
        "diagnostics",
        "fallback_credit_token",
        "fallbacks",
        "inference_geo",
        "mcp_servers",
        "output_config",
        "output_format",
        "speed",
    }
)
# /messages/count_tokens (MessageCountTokensParams, beta included).
_COUNT_FIELDS = frozenset(
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
# Top-level fields only Anthropic takes as they are: kept under their own names for the
# tables (some are translated for other providers: `_params.portable`).
_ANTHROPIC_FIELDS = (
    "container",
    "context_management",
    "diagnostics",
    "fallback_credit_token",
    "fallbacks",
    "inference_geo",
    "mcp_servers",
    "output_format",
    "speed",
)
_EFFORTS = ("low", "medium", "high", "xhigh", "max")


def _check_fields(data: dict[str, Any], allowed: frozenset[str]) -> None:
    for name in data:
        if name not in allowed:
            _invalid(name, "extra inputs are not permitted (not a Messages API field)")


def _params_of(data: dict[str, Any], d: _Decoding) -> None:
    """Optional fields kept for the provider's declared table (`_params.py`): `thinking`,
    `top_k`, `service_tier`, `output_config`, the Anthropic-only fields, and
    `tool_choice.disable_parallel_tool_use` as OpenAI's `parallel_tool_calls: false`
    (`metadata.user_id` joins them as `user` in `decode_request`)."""
    out = d.params
    top_k = data.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            _invalid("top_k", "must be a positive integer")
        out["top_k"] = top_k
    tier = data.get("service_tier")
    if tier is not None:
        out["service_tier"] = _str(tier, "service_tier")
    thinking = data.get("thinking")
    if thinking is not None:
        thinking = _obj(thinking, "thinking")
        if thinking.get("type") not in ("enabled", "disabled", "adaptive"):
            _invalid("thinking.type", "must be enabled, disabled or adaptive")
        out["thinking"] = thinking
    config = data.get("output_config")
    if config is not None:
        config = _obj(config, "output_config")
        if config.get("effort") is not None and config["effort"] not in _EFFORTS:
            _invalid("output_config.effort", f"must be one of {', '.join(_EFFORTS)}")
        if config.get("format") is not None:
            fmt = _obj(config["format"], "output_config.format")
            if fmt.get("type") != "json_schema":
                _invalid("output_config.format.type", "must be 'json_schema'")
            _obj(fmt.get("schema"), "output_config.format.schema")
        if config:
            out["output_config"] = config
    if data.get("cache_control") is not None:
        d.cache(data, "body")
    for name in _ANTHROPIC_FIELDS:
        if data.get(name) is not None:
            out[name] = data[name]
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
