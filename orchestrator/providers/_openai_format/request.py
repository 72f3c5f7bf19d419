"""A caller's `POST /chat/completions` body, decoded into a `ChatRequest` and validated.

Separate from the rest of the format because it is the one part that judges input: every
field is checked and a malformed or unknown one is a 400 naming it (`ValidationFailed`), as
OpenAI answers. What it builds is read by the answer and upstream modules, never the other
way round.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Literal, NoReturn

from orchestrator.errors import ValidationFailed
from orchestrator.providers._types import (
    Block,
    ChatRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = ["decode_request", "wants_usage"]

JSON = dict[str, Any]


def _invalid(field: str, message: str) -> NoReturn:
    raise ValidationFailed(
        f"invalid request: {field}: {message}",
        extra={"fields": [{"field": field, "message": message}]},
    )


def wants_usage(body: Any) -> bool:
    """True when a streaming caller asked for the final usage chunk."""
    if not isinstance(body, dict) or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def decode_request(body: Any) -> ChatRequest:
    """A `POST /chat/completions` body as a `ChatRequest`; `ValidationFailed` (400) naming
    the field for anything malformed or unsupported."""
    if not isinstance(body, dict):
        _invalid("body", "must be a JSON object")
    model = body.get("model")
    if model is None:
        _invalid("model", "is required")
    if not isinstance(model, str) or not model.strip():
        _invalid("model", "must be a non-empty string")
    raw = body.get("messages")
    if raw is None:
        _invalid("messages", "is required")
    if not isinstance(raw, list) or not raw:
        _invalid("messages", "must be a non-empty array")
    documents: set[str] = set()
    system, messages = _decode_messages(raw, documents)
    if not messages:
        _invalid("messages", "must hold at least one user or assistant message")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        _invalid("stream", "must be a boolean")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        _invalid("user", "must be a string")
    return ChatRequest(
        model=model,
        messages=tuple(messages),
        system=system,
        tools=_decode_tools(body.get("tools")),
        tool_choice=_decode_tool_choice(body.get("tool_choice")),
        max_tokens=_max_tokens(body),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        stop=_stop(body.get("stop")),
        stream=bool(stream),
        user=user,
        params=_params_of(body) | ({"document": tuple(documents)} if documents else {}),
    )


# Each optional field's accepted JSON type (shape beyond that is the provider's to judge).
_PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "seed": (int,),
    "frequency_penalty": (int, float),
    "presence_penalty": (int, float),
    "logit_bias": (dict,),
    "response_format": (dict,),
    "reasoning_effort": (str,),
    "parallel_tool_calls": (bool,),
    "metadata": (dict,),
    "n": (int,),
    "user": (str,),
    # Kept for the providers' tables to decide (see `_params.PARAM_FIELDS`).
    "top_k": (int,),
    "service_tier": (str,),
    "store": (bool,),
    "prediction": (dict,),
    "prompt_cache_key": (str,),
    "prompt_cache_retention": (str,),
    "prompt_cache_options": (dict,),
    "safety_identifier": (str,),
    "verbosity": (str,),
    "logprobs": (bool,),
    "top_logprobs": (int,),
    "audio": (dict,),
    "modalities": (list,),
    "functions": (list,),
    "function_call": (str, dict),
    "moderation": (dict, str, bool),
    "web_search_options": (dict,),
}
# Every field a caller may send: the ones decoded into ChatRequest, then the optional ones.
# Anything else is a 400 naming it, as OpenAI answers an unrecognized argument: a field is
# never ignored silently.
_FIELDS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "user",
        "tools",
        "tool_choice",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        *_PARAM_TYPES,
    }
)


def _params_of(body: JSON) -> dict[str, Any]:
    """The optional generation fields the caller set (null = unset), type-checked."""
    for name in body:
        if name not in _FIELDS:
            _invalid(name, "unrecognized request argument (not a chat completions field)")
    out: dict[str, Any] = {}
    for name, types in _PARAM_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types:
            _invalid(name, "has the wrong type")
        if not isinstance(value, types):
            _invalid(name, "has the wrong type")
        out[name] = value
    if out.get("n") == 1:
        del out["n"]  # one choice: what every answer carries
    elif "n" in out and out["n"] < 1:
        _invalid("n", "must be at least 1")
    response_format = out.get("response_format")
    if response_format is not None:
        kind = response_format.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            _invalid("response_format.type", "must be text, json_object or json_schema")
        if kind == "text":
            del out["response_format"]  # the default of every provider
        elif kind == "json_schema" and not isinstance(response_format.get("json_schema"), dict):
            _invalid("response_format.json_schema", "is required for type json_schema")
    return out


class _Turns:
    """Collects messages; tool results join one user message with what follows them."""

    def __init__(self) -> None:
        self.items: list[tuple[Literal["user", "assistant"], list[Block]]] = []
        self._tool_group = False

    def user(self, blocks: list[Block]) -> None:
        if self._tool_group:
            self.items[-1][1].extend(blocks)
        else:
            self.items.append(("user", blocks))
        self._tool_group = False

    def tool_result(self, block: ToolResultBlock) -> None:
        if self._tool_group:
            self.items[-1][1].append(block)
        else:
            self.items.append(("user", [block]))
            self._tool_group = True

    def assistant(self, blocks: list[Block]) -> None:
        self.items.append(("assistant", blocks))
        self._tool_group = False


def _decode_messages(raw: list[Any], documents: set[str]) -> tuple[str | None, list[Message]]:
    system: list[str] = []
    turns = _Turns()
    for i, m in enumerate(raw):
        field = f"messages[{i}]"
        if not isinstance(m, dict):
            _invalid(field, "must be an object")
        role = m.get("role")
        content = m.get("content")
        if role in ("system", "developer"):
            system.append(_plain_text(content, f"{field}.content"))
        elif role == "user":
            turns.user(_user_blocks(content, f"{field}.content", documents))
        elif role == "assistant":
            turns.assistant(_assistant_blocks(m, field))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                _invalid(f"{field}.tool_call_id", "is required for role 'tool'")
            text = _plain_text(content, f"{field}.content")
            parts = (TextBlock(text),) if text else ()
            turns.tool_result(ToolResultBlock(call_id, parts))
        elif role is None:
            _invalid(f"{field}.role", "is required")
        else:
            _invalid(f"{field}.role", f"unsupported role {role!r}")
    messages = [Message(role, tuple(blocks)) for role, blocks in turns.items]
    return ("\n\n".join(system) if system else None), messages


def _plain_text(content: Any, field: str) -> str:
    """Content that may only be text: a string, null, or an array of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _invalid(field, "must be a string or an array of content parts")
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            _invalid(f"{field}[{k}]", "only text parts are allowed here")
        texts.append(_text_part(part, f"{field}[{k}]"))
    return "".join(texts)


def _text_part(part: JSON, field: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        _invalid(f"{field}.text", "must be a string")
    return text


def _user_blocks(content: Any, field: str, documents: set[str]) -> list[Block]:
    if isinstance(content, str):
        return [TextBlock(content)]
    if content is None:
        _invalid(field, "is required for role 'user'")
    if not isinstance(content, list):
        _invalid(field, "must be a string or an array of content parts")
    blocks: list[Block] = []
    for k, part in enumerate(content):
        where = f"{field}[{k}]"
        if not isinstance(part, dict):
            _invalid(where, "must be an object")
        kind = part.get("type")
        if kind == "text":
            blocks.append(TextBlock(_text_part(part, where)))
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url"), f"{where}.image_url"))
        elif kind == "file":
            blocks.append(_file(part.get("file"), f"{where}.file"))
            documents.add("base64")
        else:
            _invalid(f"{where}.type", f"unsupported content part type {kind!r}")
    return blocks


def _image(value: Any, field: str) -> ImageBlock:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        _invalid(f"{field}.url", "is required")
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        media_type = header.removesuffix(";base64")
        if not sep or not header.endswith(";base64") or not media_type.startswith("image/"):
            _invalid(f"{field}.url", "a data URL must be data:image/<type>;base64,<data>")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            _invalid(f"{field}.url", "the data URL does not hold valid base64")
        return ImageBlock(media_type=media_type, data=data)
    if url.startswith(("http://", "https://")):
        return ImageBlock(url=url)
    _invalid(f"{field}.url", "must be an http(s) URL or a data: URL")


def _file(value: Any, field: str) -> DocumentBlock:
    """OpenAI's `file` content part with inline `file_data` (a base64 PDF, as a data URL or
    bare): the internal document block. A `file_id` names a file in OpenAI's Files API,
    which no other provider can read: refused by name."""
    if not isinstance(value, dict):
        _invalid(field, "must be an object")
    if value.get("file_id") is not None:
        _invalid(f"{field}.file_id", "not supported: send the file inline as file_data")
    data = value.get("file_data")
    if not isinstance(data, str) or not data:
        _invalid(f"{field}.file_data", "is required")
    if data.startswith("data:"):
        header, sep, data = data[5:].partition(",")
        if not sep or header != "application/pdf;base64":
            _invalid(f"{field}.file_data", "a data URL must be data:application/pdf;base64,<data>")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        _invalid(f"{field}.file_data", "does not hold valid base64")
    filename = value.get("filename")
    if filename is not None and not isinstance(filename, str):
        _invalid(f"{field}.filename", "must be a string")
    return DocumentBlock(media_type="application/pdf", data=data, title=filename)


def _assistant_blocks(m: JSON, field: str) -> list[Block]:
    blocks: list[Block] = []
    reasoning = m.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        _invalid(f"{field}.reasoning_content", "must be a string")
    if reasoning:
        blocks.append(ThinkingBlock(reasoning))
    content = m.get("content")
    if isinstance(content, list):
        texts: list[str] = []
        for k, part in enumerate(content):
            where = f"{field}.content[{k}]"
            if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
                _invalid(where, "only text and refusal parts are allowed for role 'assistant'")
            key = "text" if part["type"] == "text" else "refusal"
            value = part.get(key)
            if not isinstance(value, str):
                _invalid(f"{where}.{key}", "must be a string")
            texts.append(value)
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        _invalid(f"{field}.content", "must be a string, an array of parts or null")
    if content:
        blocks.append(TextBlock(content))
    calls = m.get("tool_calls")
    if calls is None:
        return blocks
    if not isinstance(calls, list):
        _invalid(f"{field}.tool_calls", "must be an array")
    for k, call in enumerate(calls):
        blocks.append(_tool_call(call, f"{field}.tool_calls[{k}]"))
    return blocks


def _tool_call(call: Any, field: str) -> ToolUseBlock:
    if not isinstance(call, dict):
        _invalid(field, "must be an object")
    if call.get("type", "function") != "function":
        _invalid(f"{field}.type", "must be 'function'")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        _invalid(f"{field}.id", "is required")
    fn = call.get("function")
    if not isinstance(fn, dict):
        _invalid(f"{field}.function", "is required")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        _invalid(f"{field}.function.name", "is required")
    args = fn.get("arguments")
    if isinstance(args, dict):
        return ToolUseBlock(call_id, name, args)
    if args is None or args == "":
        return ToolUseBlock(call_id, name, {})
    if not isinstance(args, str):
        _invalid(f"{field}.function.arguments", "must be a JSON string")
    try:
        parsed = json.loads(args)
    except ValueError:
        _invalid(f"{field}.function.arguments", "is not valid JSON")
    if not isinstance(parsed, dict):
        _invalid(f"{field}.function.arguments", "must encode a JSON object")
    return ToolUseBlock(call_id, name, parsed)


def _decode_tools(raw: Any) -> tuple[ToolDef, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        _invalid("tools", "must be an array")
    tools: list[ToolDef] = []
    for k, tool in enumerate(raw):
        field = f"tools[{k}]"
        if not isinstance(tool, dict):
            _invalid(field, "must be an object")
        if tool.get("type", "function") != "function":
            _invalid(f"{field}.type", "only 'function' tools are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            _invalid(f"{field}.function", "is required")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            _invalid(f"{field}.function.name", "is required")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            _invalid(f"{field}.function.description", "must be a string")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        elif not isinstance(params, dict):
            _invalid(f"{field}.function.parameters", "must be a JSON Schema object")
        tools.append(ToolDef(name, description, params))
    return tuple(tools)


def _decode_tool_choice(raw: Any) -> str | dict[str, str] | None:
    if raw is None:
        return None
    if raw in ("auto", "none"):
        return str(raw)
    if raw == "required":
        return "any"
    if isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            return {"name": name}
        _invalid("tool_choice.function.name", "is required")
    _invalid("tool_choice", "must be 'auto', 'none', 'required' or a function choice")


def _max_tokens(body: JSON) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _invalid(key, "must be a positive integer")
        return value
    return None


def _number(body: JSON, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _invalid(key, "must be a number")
    if not low <= value <= high:
        _invalid(key, f"must be between {low:g} and {high:g}")
    return float(value)


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return tuple(raw)
    _invalid("stop", "must be a string or an array of strings")
