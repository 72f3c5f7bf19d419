"""A caller's Messages API request (`POST /api/v1/messages`), decoded into a `ChatRequest`
and validated.

Separate from the rest of the format because it is the one part that judges input: every
field is checked and a malformed or unknown one is a 400 naming it (`ValidationFailed`, as
Anthropic's "extra inputs are not permitted").
"""

from __future__ import annotations

from typing import Any, NoReturn

from orchestrator.errors import ValidationFailed
from orchestrator.providers._types import (
    Block,
    ChatRequest,
    ImageBlock,
    Message,
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


def _image(block: dict[str, Any], path: str) -> ImageBlock:
    source = _obj(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        return ImageBlock(
            media_type=_str(source.get("media_type"), f"{path}.source.media_type"),
            data=_str(source.get("data"), f"{path}.source.data"),
        )
    if kind == "url":
        return ImageBlock(url=_str(source.get("url"), f"{path}.source.url"))
    _invalid(f"{path}.source.type", "must be 'base64' or 'url'")


def _tool_result_content(value: Any, path: str) -> tuple[TextBlock | ImageBlock, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (TextBlock(value),)
    if not isinstance(value, list):
        _invalid(path, "must be a string or an array of content blocks")
    out: list[TextBlock | ImageBlock] = []
    for i, item in enumerate(value):
        block = _obj(item, f"{path}.{i}")
        kind = block.get("type")
        if kind == "text":
            out.append(TextBlock(_str(block.get("text"), f"{path}.{i}.text", required=False)))
        elif kind == "image":
            out.append(_image(block, f"{path}.{i}"))
        else:
            _invalid(f"{path}.{i}.type", "must be 'text' or 'image'")
    return tuple(out)


def _block(item: Any, path: str) -> Block | None:
    """One request content block; None for blocks that carry nothing we can forward."""
    block = _obj(item, path)
    kind = block.get("type")
    if kind == "text":
        return TextBlock(_str(block.get("text"), f"{path}.text", required=False))
    if kind == "image":
        return _image(block, path)
    if kind == "tool_use":
        tool_input = block.get("input", {})
        return ToolUseBlock(
            id=_str(block.get("id"), f"{path}.id"),
            name=_str(block.get("name"), f"{path}.name"),
            input=_obj(tool_input, f"{path}.input"),
        )
    if kind == "tool_result":
        is_error = block.get("is_error", False)
        if not isinstance(is_error, bool):
            _invalid(f"{path}.is_error", "must be a boolean")
        return ToolResultBlock(
            tool_use_id=_str(block.get("tool_use_id"), f"{path}.tool_use_id"),
            content=_tool_result_content(block.get("content"), f"{path}.content"),
            is_error=is_error,
        )
    if kind == "thinking":
        signature = block.get("signature")
        if signature is not None:
            signature = _str(signature, f"{path}.signature", required=False)
        return ThinkingBlock(
            _str(block.get("thinking"), f"{path}.thinking", required=False), signature or None
        )
    if kind == "redacted_thinking":
        # Encrypted reasoning only Anthropic can read; no other provider can take it.
        return None
    _invalid(f"{path}.type", f"unsupported content block type {kind!r}")


def _message(item: Any, path: str) -> Message:
    msg = _obj(item, path)
    role = msg.get("role")
    if role not in ("user", "assistant"):
        _invalid(f"{path}.role", "must be 'user' or 'assistant'")
    content = msg.get("content")
    if isinstance(content, str):
        return Message(role, (TextBlock(content),))
    if not isinstance(content, list):
        _invalid(f"{path}.content", "must be a string or an array of content blocks")
    blocks = [_block(b, f"{path}.content.{j}") for j, b in enumerate(content)]
    return Message(role, tuple(b for b in blocks if b is not None))


def _system(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if not isinstance(value, list):
        _invalid("system", "must be a string or an array of text blocks")
    parts: list[str] = []
    for i, item in enumerate(value):
        block = _obj(item, f"system.{i}")
        if block.get("type") != "text":
            _invalid(f"system.{i}.type", "must be 'text'")
        parts.append(_str(block.get("text"), f"system.{i}.text", required=False))
    return "\n\n".join(parts) or None


def _tools(value: Any) -> tuple[ToolDef, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        _invalid("tools", "must be an array")
    out: list[ToolDef] = []
    for i, item in enumerate(value):
        tool = _obj(item, f"tools.{i}")
        if tool.get("type", "custom") != "custom":
            _invalid(f"tools.{i}.type", f"server tool {tool.get('type')!r} is not supported")
        description = tool.get("description")
        if description is not None:
            description = _str(description, f"tools.{i}.description", required=False)
        out.append(
            ToolDef(
                name=_str(tool.get("name"), f"tools.{i}.name"),
                description=description,
                parameters=_obj(tool.get("input_schema"), f"tools.{i}.input_schema"),
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


def decode_request(body: Any) -> ChatRequest:
    """A Messages API request body -> `ChatRequest`; `ValidationFailed` names the bad field.
    A missing `model` decodes to "" (the endpoint applies its default model)."""
    data = _obj(body, "body")
    # An absent model is left empty for the caller's default model; a given one must be valid.
    model = "" if data.get("model") is None else _str(data.get("model"), "model")
    max_tokens = data.get("max_tokens")
    if max_tokens is None:
        _invalid("max_tokens", "field required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        _invalid("max_tokens", "must be a positive integer")
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
    return ChatRequest(
        model=model,
        messages=tuple(_message(m, f"messages.{i}") for i, m in enumerate(messages)),
        system=_system(data.get("system")),
        tools=_tools(data.get("tools")),
        tool_choice=_tool_choice(data.get("tool_choice")),
        max_tokens=max_tokens,
        temperature=None if temperature is None else _number(temperature, "temperature", 0, 1),
        top_p=None if top_p is None else _number(top_p, "top_p", 0, 1),
        stop=tuple(stop),
        stream=stream,
        user=user,
        params=_params_of(data) | ({"user": user} if user is not None else {}),
    )


# Every Messages API field a caller may send; anything else is a 400 naming it (Anthropic's
# own "extra inputs are not permitted"): a field is never ignored silently.
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
    }
)


def _params_of(data: dict[str, Any]) -> dict[str, Any]:
    """Optional fields kept for the provider's declared table (`_params.py`): `thinking`,
    `top_k`, `service_tier`, and `tool_choice.disable_parallel_tool_use` as OpenAI's
    `parallel_tool_calls: false` (`metadata.user_id` joins them as `user` in
    `decode_request`)."""
    for name in data:
        if name not in _FIELDS:
            _invalid(name, "extra inputs are not permitted (not a Messages API field)")
    out: dict[str, Any] = {}
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
        if thinking.get("type") not in ("enabled", "disabled"):
            _invalid("thinking.type", "must be enabled or disabled")
        out["thinking"] = thinking
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out
