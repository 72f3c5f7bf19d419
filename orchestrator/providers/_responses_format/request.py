"""A caller's `POST /responses` body, judged and decoded (OpenAI's Responses API).

Two products: a `ResponsesRequest` (the options echoed on the Response object and what the
store keeps) and, through `conversation`, the internal `ChatRequest` the gateway routes, as
for chat completions. Input items are first normalised to the stored shape (each with an
id, content as parts: OpenAI's `ItemResource`s, what `GET /responses/{id}/input_items`
lists), then the same `items_to_messages` turns a stored chain and the new input alike
into messages. Every field is checked; one we cannot honour is a 400 naming it, as the
chat decoder does (a provider-dependent one goes to `ChatRequest.params`, whose provider
tables decide).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

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

__all__ = [
    "INCLUDE_HONOURED",
    "ResponsesRequest",
    "conversation",
    "decode_request",
    "item_id",
    "items_to_messages",
]

JSON = dict[str, Any]

# `include` values: ours always (encrypted_content carries a thinking block's signature;
# input image URLs are kept as sent), or about built-in tools, which a request cannot
# declare here (so there is nothing to include). Logprobs are refused by name.
INCLUDE_HONOURED = frozenset(
    {
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)

# Fields passed to the provider tables under their chat-completions names (`_params.py`).
_PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "service_tier": (str,),
    "safety_identifier": (str,),
    "prompt_cache_key": (str,),
    "prompt_cache_retention": (str,),
    "prompt_cache_options": (dict,),
    "top_logprobs": (int,),
    "moderation": (dict, str, bool),
}
# Fields of CreateResponse we cannot do at all: a 400 naming each (when not null/false).
_REFUSED = {
    "background": "background responses are not supported (stream instead)",
    "conversation": "conversations are not supported: use previous_response_id",
    "prompt": "prompt templates are not supported: send instructions and input",
    "context_management": "context management is not supported",
}
_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "max_tool_calls",
        "temperature",
        "top_p",
        "metadata",
        "user",
        "text",
        "reasoning",
        "previous_response_id",
        "store",
        "truncation",
        "include",
        "stream",
        "stream_options",
        "client_metadata",
        *_PARAM_TYPES,
        *_REFUSED,
    }
)


def _invalid(field: str, message: str) -> NoReturn:
    raise ValidationFailed(
        f"invalid request: {field}: {message}",
        extra={"fields": [{"field": field, "message": message}]},
    )


def item_id(prefix: str) -> str:
    """An id in OpenAI's style: `<prefix>_` and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A decoded `POST /responses`: `items` is the new input, normalised (with ids), `chat`
    the internal request for that input alone (no previous turns: `conversation` adds them).
    The rest is echoed on the Response object (`tools` and `tool_choice` as sent)."""

    chat: ChatRequest
    items: list[JSON]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    summary: bool  # thinking answered as reasoning summaries (`reasoning.summary` set)
    reasoning: JSON | None
    text_format: JSON
    verbosity: str | None
    tools: list[JSON]
    tool_choice: Any
    parallel_tool_calls: bool
    metadata: dict[str, str]
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    user: str | None
    include: tuple[str, ...] = ()
    custom_tools: frozenset[str] = frozenset()  # their calls are custom_tool_call items
    # A namespaced function's name for providers -> (namespace, name) for the caller.
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    # What `drop_unsupported_params` dropped here (hosted tools, include values): listed in
    # X-Orchestrator-Dropped-Params with what the provider's table drops.
    dropped: tuple[str, ...] = ()
    client_metadata: dict[str, str] = field(default_factory=dict)  # Codex's; stored, not sent
    extra: JSON = field(default_factory=dict)  # other fields echoed as sent (service_tier...)


def decode_request(body: Any, *, drop: bool = False) -> ResponsesRequest:
    """A `POST /responses` body; `ValidationFailed` (400) naming the field for anything
    malformed or that we cannot do. With `drop` (`drop_unsupported_params`) hosted tools and
    include values we cannot fill are dropped and listed (`dropped`) instead."""
    if not isinstance(body, dict):
        _invalid("body", "must be a JSON object")
    for name in body:
        if name not in _FIELDS:
            _invalid(name, "unrecognized request argument (not a Responses API field)")
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, False):
            _invalid(name, why)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        _invalid("model", "must be a non-empty string")
    raw = body.get("input")
    if raw is None:
        _invalid("input", "is required")
    items = normalise_input(raw)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        _invalid("instructions", "must be a string")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        _invalid("previous_response_id", "must be a response id")
    stream = _bool(body, "stream", False)
    store = _bool(body, "store", True)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        _invalid("parallel_tool_calls", "must be a boolean")
    if body.get("truncation") not in (None, "disabled"):
        _invalid("truncation", "only 'disabled' is supported (input is never truncated)")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        _invalid("stream_options", "must be an object")
    max_calls = body.get("max_tool_calls")  # about built-in tools: none can be declared here
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int)):
        _invalid("max_tool_calls", "must be an integer")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        _invalid("user", "must be a string")
    params = _params_of(body)
    reasoning, summary = _reasoning(body.get("reasoning"), params)
    text_format, verbosity = _text(body.get("text"), params)
    if user is not None:
        params["user"] = user
    if parallel is not None:
        params["parallel_tool_calls"] = parallel
    tools = _Tools(drop)
    tools.read(body.get("tools"))
    include, dropped_include = _include(body.get("include"), drop)
    choice = body.get("tool_choice")
    system, messages = items_to_messages(items, "input")
    max_output = _max_output(body.get("max_output_tokens"))
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    chat = ChatRequest(
        model=model or "",
        messages=tuple(messages),
        system=_joined(instructions, system),
        tools=tuple(tools.defs),
        tool_choice=_tool_choice(choice),
        max_tokens=max_output,
        temperature=temperature,
        top_p=top_p,
        stream=stream,
        user=user,
        params=params,
    )
    return ResponsesRequest(
        chat=chat,
        items=items,
        instructions=instructions,
        previous_response_id=previous,
        store=store,
        stream=stream,
        summary=summary,
        reasoning=reasoning,
        text_format=text_format,
        verbosity=verbosity,
        tools=tools.wire,
        custom_tools=frozenset(tools.custom),
        namespaced=tools.namespaced,
        dropped=(*tools.dropped, *dropped_include),
        client_metadata=_metadata(body.get("client_metadata"), "client_metadata", None),
        tool_choice=choice if choice is not None else "auto",
        parallel_tool_calls=parallel if parallel is not None else True,
        metadata=_metadata(body.get("metadata")),
        temperature=temperature,
        top_p=top_p,
        max_output_tokens=max_output,
        user=user,
        include=include,
        extra={
            k: body[k]
            for k in ("service_tier", "safety_identifier", "prompt_cache_key")
            if isinstance(body.get(k), str)
        },
    )


def conversation(request: ResponsesRequest, history: list[JSON]) -> ChatRequest:
    """The internal request with the stored chain's items (inputs and outputs, oldest first)
    before the new input. Their system messages count; the stored instructions do not (as
    OpenAI documents: a previous response's instructions are not carried over)."""
    if not history:
        return _checked(request.chat)
    system, messages = items_to_messages([*history, *request.items], "input")
    chat = request.chat
    return _checked(
        ChatRequest(
            model=chat.model,
            messages=tuple(messages),
            system=_joined(request.instructions, system),
            tools=chat.tools,
            tool_choice=chat.tool_choice,
            max_tokens=chat.max_tokens,
            temperature=chat.temperature,
            top_p=chat.top_p,
            stream=chat.stream,
            user=chat.user,
            params=chat.params,
        )
    )


def _checked(chat: ChatRequest) -> ChatRequest:
    if not chat.messages:
        _invalid("input", "must hold at least one user, assistant or tool output item")
    return chat


def _joined(instructions: str | None, system: list[str]) -> str | None:
    parts = [p for p in (instructions, *system) if p]
    return "\n\n".join(parts) if parts else None


def _bool(body: JSON, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        _invalid(name, "must be a boolean")
    return value


def _number(body: JSON, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _invalid(key, "must be a number")
    if not low <= value <= high:
        _invalid(key, f"must be between {low:g} and {high:g}")
    return float(value)


def _max_output(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _invalid("max_output_tokens", "must be a positive integer")
    return value


def _params_of(body: JSON) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, types in _PARAM_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            _invalid(name, "has the wrong type")
        out[name] = value
    return out


def _metadata(value: Any, field: str = "metadata", most: int | None = 16) -> dict[str, str]:
    """String pairs; `metadata` within OpenAI's limits: 16 pairs, keys up to 64 characters,
    values up to 512."""
    if value is None:
        return {}
    if not isinstance(value, dict) or (most is not None and len(value) > most):
        _invalid(field, f"must be an object of {'at most 16 ' if most else ''}string pairs")
    for key, text in value.items():
        if not isinstance(text, str):
            _invalid(f"{field}.{key}", "values must be strings")
        if most is not None and (len(key) > 64 or len(text) > 512):
            _invalid(f"{field}.{key}", "keys up to 64 characters, values up to 512")
    return dict(value)


def _include(value: Any, drop: bool) -> tuple[tuple[str, ...], list[str]]:
    """The include values we fill (or have nothing to fill), and those dropped."""
    if value is None:
        return (), []
    if not isinstance(value, list):
        _invalid("include", "must be an array")
    kept: list[str] = []
    dropped: list[str] = []
    for i, name in enumerate(value):
        if name in INCLUDE_HONOURED:
            kept.append(name)
        elif drop and isinstance(name, str):
            dropped.append(f"include:{name}")
        else:
            _invalid(f"include[{i}]", f"{name!r} is not supported")
    return tuple(kept), dropped


def _reasoning(value: Any, params: dict[str, Any]) -> tuple[JSON | None, bool]:
    """`reasoning.effort` -> the `reasoning_effort` param (each provider's table maps it to
    its thinking switch or budget); `summary` says thinking comes back as summaries."""
    if value is None:
        return None, False
    if not isinstance(value, dict):
        _invalid("reasoning", "must be an object")
    for key in value:
        if key not in ("effort", "summary", "generate_summary"):
            _invalid(f"reasoning.{key}", "is not supported")
    effort = value.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            _invalid("reasoning.effort", "must be a string")
        params["reasoning_effort"] = effort
    summary = value.get("summary", value.get("generate_summary"))
    if summary not in (None, "auto", "concise", "detailed"):
        _invalid("reasoning.summary", "must be auto, concise or detailed")
    return {"effort": effort, "summary": summary}, summary is not None


def _text(value: Any, params: dict[str, Any]) -> tuple[JSON, str | None]:
    """`text.format` -> the internal `response_format` (chat completions' shape)."""
    if value is None:
        return {"type": "text"}, None
    if not isinstance(value, dict):
        _invalid("text", "must be an object")
    for key in value:
        if key not in ("format", "verbosity"):
            _invalid(f"text.{key}", "is not supported")
    verbosity = value.get("verbosity")
    if verbosity is not None:
        if verbosity not in ("low", "medium", "high"):
            _invalid("text.verbosity", "must be low, medium or high")
        params["verbosity"] = verbosity
    fmt = value.get("format")
    if fmt is None:
        return {"type": "text"}, verbosity
    if not isinstance(fmt, dict):
        _invalid("text.format", "must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return {"type": "text"}, verbosity
    if kind == "json_object":
        params["response_format"] = {"type": "json_object"}
        return {"type": "json_object"}, verbosity
    if kind != "json_schema":
        _invalid("text.format.type", "must be text, json_object or json_schema")
    name, schema = fmt.get("name"), fmt.get("schema")
    if not isinstance(name, str) or not name:
        _invalid("text.format.name", "is required for json_schema")
    if not isinstance(schema, dict):
        _invalid("text.format.schema", "must be a JSON Schema object")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        _invalid("text.format.strict", "must be a boolean")
    spec: JSON = {"name": name, "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    if isinstance(fmt.get("description"), str):
        spec["description"] = fmt["description"]
    params["response_format"] = {"type": "json_schema", "json_schema": spec}
    return {"type": "json_schema", **spec}, verbosity


# A custom (freeform) tool reaches providers as a function of one string argument.
CUSTOM_PARAMETERS: JSON = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


class _Tools:
    """The request's tools: what providers get (`defs`), what is echoed (`wire`), the
    custom tools' and namespaced functions' names, and hosted tools dropped (listed)."""

    def __init__(self, drop: bool) -> None:
        self.drop = drop
        self.wire: list[JSON] = []
        self.defs: list[ToolDef] = []
        self.custom: set[str] = set()
        self.namespaced: dict[str, tuple[str, str]] = {}  # provider name -> (namespace, name)
        self.dropped: list[str] = []

    def read(self, raw: Any) -> None:
        if raw is None:
            return
        if not isinstance(raw, list):
            _invalid("tools", "must be an array")
        for k, tool in enumerate(raw):
            where = f"tools[{k}]"
            if not isinstance(tool, dict):
                _invalid(where, "must be an object")
            kind = tool.get("type")
            if kind == "namespace":
                self.wire.append(self._namespace(tool, where))
            elif kind in ("function", "custom"):
                self.wire.append(self._tool(tool, where, None))
            elif self.drop and isinstance(kind, str):
                self.dropped.append(f"{where}:{kind}")  # a hosted tool nobody here runs
            else:
                _invalid(
                    f"{where}.type",
                    f"{kind!r} tools are not supported (function, custom and namespace tools"
                    " only; drop_unsupported_params drops the others)",
                )

    def _namespace(self, tool: JSON, where: str) -> JSON:
        """A namespace's functions reach providers flattened: `<namespace>__<name>` (in
        their name charset, at most 64 characters); calls come back namespaced."""
        name, inner = tool.get("name"), tool.get("tools")
        if not isinstance(name, str) or not _PROVIDER_NAME.fullmatch(name):
            _invalid(f"{where}.name", "must be 1-64 of A-Z a-z 0-9 _ -")
        if not isinstance(inner, list) or not inner:
            _invalid(f"{where}.tools", "must be a non-empty array")
        tools = []
        for k, member in enumerate(inner):
            at = f"{where}.tools[{k}]"
            if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                _invalid(f"{at}.type", "a namespace holds function and custom tools")
            tools.append(self._tool(member, at, name))
        echoed: JSON = {"type": "namespace", "name": name, "tools": tools}
        echoed["description"] = str(tool.get("description") or "")
        return echoed

    def _tool(self, tool: JSON, where: str, namespace: str | None) -> JSON:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            _invalid(f"{where}.name", "is required")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            _invalid(f"{where}.description", "must be a string")
        flat = name if namespace is None else _flat_name(namespace, name)
        if namespace is not None:
            self.namespaced[flat] = (namespace, name)
        if tool.get("type") == "custom":
            self.custom.add(flat)
            fmt = _custom_format(tool.get("format"), f"{where}.format")
            self.defs.append(ToolDef(flat, _with_grammar(description, fmt), CUSTOM_PARAMETERS))
            echoed: JSON = {"type": "custom", "name": name, "format": fmt}
            if description is not None:
                echoed["description"] = description
            return echoed
        params = tool.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        elif not isinstance(params, dict):
            _invalid(f"{where}.parameters", "must be a JSON Schema object")
        strict = tool.get("strict")
        self.defs.append(ToolDef(flat, description, params))
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": params,
            "strict": strict if isinstance(strict, bool) else True,
        }


_PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _flat_name(namespace: str, name: str) -> str:
    """`<namespace>__<name>`, or, past 64 characters, shortened with a digest (stable)."""
    flat = f"{namespace}__{name}"
    if _PROVIDER_NAME.fullmatch(flat):
        return flat
    digest = hashlib.sha256(flat.encode()).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", flat)
    return f"{clean[:55]}_{digest}"


def _custom_format(value: Any, where: str) -> JSON:
    if value is None:
        return {"type": "text"}
    if not isinstance(value, dict) or value.get("type") not in ("text", "grammar"):
        _invalid(where, "must be {type: text} or {type: grammar, syntax, definition}")
    if value["type"] == "text":
        return {"type": "text"}
    syntax, definition = value.get("syntax"), value.get("definition")
    if syntax not in ("lark", "regex") or not isinstance(definition, str):
        _invalid(where, "a grammar needs syntax (lark or regex) and a definition")
    return {"type": "grammar", "syntax": syntax, "definition": definition}


def _with_grammar(description: str | None, fmt: JSON) -> str | None:
    if fmt["type"] != "grammar":
        return description
    rule = f"The `input` argument must follow this {fmt['syntax']} grammar:\n{fmt['definition']}"
    return f"{description}\n\n{rule}" if description else rule


def _tool_choice(raw: Any) -> str | dict[str, str] | None:
    if raw is None:
        return None
    if raw in ("auto", "none"):
        return str(raw)
    if raw == "required":
        return "any"
    if isinstance(raw, dict) and raw.get("type") in ("function", "custom"):
        name = raw.get("name")
        if isinstance(name, str) and name:
            return {"name": name}
        _invalid("tool_choice.name", "is required")
    _invalid("tool_choice", "must be 'auto', 'none', 'required' or {type: function|custom, name}")


# --- input items ---------------------------------------------------------------------------
def normalise_input(raw: Any) -> list[JSON]:
    """The input as stored items: a string is one user message; each item gets its id."""
    if isinstance(raw, str):
        return [_message("user", [{"type": "input_text", "text": raw}])]
    if not isinstance(raw, list):
        _invalid("input", "must be a string or an array of items")
    return [_item(item, f"input[{i}]") for i, item in enumerate(raw)]


def _message(role: str, content: list[JSON], id: str | None = None) -> JSON:
    return {
        "id": id or item_id("msg"),
        "type": "message",
        "role": role,
        "content": content,
        "status": "completed",
    }


def _item(item: Any, where: str) -> JSON:
    if not isinstance(item, dict):
        _invalid(where, "must be an object")
    kind = item.get("type", "message")
    given = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            _invalid(f"{where}.role", "must be user, assistant, system or developer")
        content = _content(item.get("content"), role, f"{where}.content")
        return _message(role, content, given)
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not call_id:
            _invalid(f"{where}.call_id", "is required")
        if not isinstance(name, str) or not name:
            _invalid(f"{where}.name", "is required")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            _invalid(f"{where}.arguments", "must be a JSON string")
        _arguments(arguments, f"{where}.arguments")
        call: JSON = {
            "id": given or item_id("fc"),
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
        namespace = item.get("namespace")
        if namespace is not None:
            if not isinstance(namespace, str) or not _PROVIDER_NAME.fullmatch(namespace):
                _invalid(f"{where}.namespace", "must be 1-64 of A-Z a-z 0-9 _ -")
            call["namespace"] = namespace
        return call
    if kind in ("function_call_output", "custom_tool_call_output"):
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            _invalid(f"{where}.call_id", "is required")
        output = item.get("output")
        if isinstance(output, list):
            output = [_input_part(p, f"{where}.output[{k}]") for k, p in enumerate(output)]
        elif not isinstance(output, str):
            _invalid(f"{where}.output", "must be a string or an array of input parts")
        return {
            "id": given or item_id("fco" if kind == "function_call_output" else "ctco"),
            "type": kind,
            "call_id": call_id,
            "output": output,
            "status": "completed",
        }
    if kind == "custom_tool_call":
        call_id, name, text = item.get("call_id"), item.get("name"), item.get("input")
        if not isinstance(call_id, str) or not call_id:
            _invalid(f"{where}.call_id", "is required")
        if not isinstance(name, str) or not name:
            _invalid(f"{where}.name", "is required")
        if not isinstance(text, str):
            _invalid(f"{where}.input", "must be a string")
        custom: JSON = {
            "id": given or item_id("ctc"),
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": text,
            "status": "completed",
        }
        namespace = item.get("namespace")
        if namespace is not None:
            if not isinstance(namespace, str) or not _PROVIDER_NAME.fullmatch(namespace):
                _invalid(f"{where}.namespace", "must be 1-64 of A-Z a-z 0-9 _ -")
            custom["namespace"] = namespace
        return custom
    if kind == "reasoning":
        return _reasoning_item(item, given, where)
    _invalid(f"{where}.type", f"{kind!r} items are not supported")


def _reasoning_item(item: JSON, given: str | None, where: str) -> JSON:
    out: JSON = {"id": given or item_id("rs"), "type": "reasoning"}
    for key, part_type in (("summary", "summary_text"), ("content", "reasoning_text")):
        parts = item.get(key)
        if parts is None and key == "content":
            continue
        if not isinstance(parts, list):
            _invalid(f"{where}.{key}", "must be an array")
        for k, part in enumerate(parts):
            # Codex writes reasoning content parts as `text`: read as reasoning_text.
            if not isinstance(part, dict) or part.get("type") not in (part_type, "text"):
                _invalid(f"{where}.{key}[{k}]", f"must be a {part_type} part")
            if not isinstance(part.get("text"), str):
                _invalid(f"{where}.{key}[{k}].text", "must be a string")
        out[key] = [{"type": part_type, "text": p["text"]} for p in parts]
    encrypted = item.get("encrypted_content")
    if encrypted is not None:
        if not isinstance(encrypted, str):
            _invalid(f"{where}.encrypted_content", "must be a string")
        out["encrypted_content"] = encrypted
    return out


def _content(raw: Any, role: str, where: str) -> list[JSON]:
    assistant = role == "assistant"
    if isinstance(raw, str):
        if assistant:
            return [{"type": "output_text", "text": raw, "annotations": [], "logprobs": []}]
        return [{"type": "input_text", "text": raw}]
    if not isinstance(raw, list):
        _invalid(where, "must be a string or an array of content parts")
    parts: list[JSON] = []
    for k, part in enumerate(raw):
        at = f"{where}[{k}]"
        if not isinstance(part, dict):
            _invalid(at, "must be an object")
        kind = part.get("type")
        if assistant and kind in ("output_text", "refusal"):
            key = "text" if kind == "output_text" else "refusal"
            if not isinstance(part.get(key), str):
                _invalid(f"{at}.{key}", "must be a string")
            if kind == "refusal":
                parts.append({"type": "refusal", "refusal": part[key]})
            else:
                parts.append(
                    {"type": "output_text", "text": part[key], "annotations": [], "logprobs": []}
                )
        elif assistant:
            _invalid(f"{at}.type", "assistant content is output_text or refusal parts")
        elif role in ("system", "developer") and kind != "input_text":
            _invalid(f"{at}.type", f"only input_text parts are allowed for role {role!r}")
        else:
            parts.append(_input_part(part, at))
    return parts


def _input_part(part: Any, at: str) -> JSON:
    if not isinstance(part, dict):
        _invalid(at, "must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text"):  # output_text: an echoed answer, read as text
        if not isinstance(part.get("text"), str):
            _invalid(f"{at}.text", "must be a string")
        return {"type": "input_text", "text": part["text"]}
    if kind == "input_image":
        if part.get("file_id") is not None:
            _invalid(f"{at}.file_id", "file ids are not supported: send image_url")
        url = part.get("image_url")
        _image(url, f"{at}.image_url")
        detail = part.get("detail", "auto")
        if detail not in ("low", "high", "auto", "original"):
            _invalid(f"{at}.detail", "must be low, high, auto or original")
        return {"type": "input_image", "image_url": url, "detail": detail}
    if kind == "input_file":
        _invalid(f"{at}.type", "input_file parts are not supported yet")
    _invalid(f"{at}.type", f"unsupported content part type {kind!r}")


def _image(url: Any, where: str) -> ImageBlock:
    if not isinstance(url, str) or not url:
        _invalid(where, "is required")
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        media_type = header.removesuffix(";base64")
        if not sep or not header.endswith(";base64") or not media_type.startswith("image/"):
            _invalid(where, "a data URL must be data:image/<type>;base64,<data>")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            _invalid(where, "the data URL does not hold valid base64")
        return ImageBlock(media_type=media_type, data=data)
    if url.startswith(("http://", "https://")):
        return ImageBlock(url=url)
    _invalid(where, "must be an http(s) URL or a data: URL")


def _arguments(text: str, where: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        _invalid(where, "is not valid JSON")
    if not isinstance(parsed, dict):
        _invalid(where, "must encode a JSON object")
    return parsed


# --- items -> messages ---------------------------------------------------------------------
Role = Literal["user", "assistant"]


class _Turns:
    """Consecutive items of one side join one message: an assistant's reasoning, text and
    function calls one assistant message; tool outputs and the user text after them one
    user message (as the Messages format requires)."""

    def __init__(self) -> None:
        self.items: list[tuple[Role, list[Block]]] = []
        self._tools_open = False

    def add(self, role: Role, blocks: list[Block], *, tool_output: bool = False) -> None:
        last = self.items[-1] if self.items else None
        if last is not None and last[0] == role and (role == "assistant" or self._tools_open):
            last[1].extend(blocks)
        else:
            self.items.append((role, list(blocks)))
        self._tools_open = tool_output


def items_to_messages(items: list[JSON], field: str) -> tuple[list[str], list[Message]]:
    """Normalised items (stored or new) as system texts and messages."""
    system: list[str] = []
    turns = _Turns()
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            role = item["role"]
            if role in ("system", "developer"):
                system.append("".join(p.get("text", "") for p in item["content"]))
            elif role == "assistant":
                text = "".join(
                    p["text"] if p["type"] == "output_text" else p["refusal"]
                    for p in item["content"]
                )
                turns.add("assistant", [TextBlock(text)] if text else [])
            else:
                turns.add("user", [_block(p, f"{field}[{i}]") for p in item["content"]])
        elif kind == "function_call":
            arguments = _arguments(item["arguments"], f"{field}[{i}].arguments")
            namespace = item.get("namespace")
            name = _flat_name(namespace, item["name"]) if namespace else item["name"]
            turns.add("assistant", [ToolUseBlock(item["call_id"], name, arguments)])
        elif kind == "custom_tool_call":
            namespace = item.get("namespace")
            name = _flat_name(namespace, item["name"]) if namespace else item["name"]
            call = ToolUseBlock(item["call_id"], name, {"input": item["input"]})
            turns.add("assistant", [call])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item["output"]
            parts: tuple[TextBlock | ImageBlock, ...]
            if isinstance(output, str):
                parts = (TextBlock(output),) if output else ()
            else:
                parts = tuple(_block(p, f"{field}[{i}].output") for p in output)
            turns.add("user", [ToolResultBlock(item["call_id"], parts)], tool_output=True)
        elif kind == "reasoning":
            texts = [p["text"] for p in item.get("content") or item.get("summary") or []]
            signature = item.get("encrypted_content")
            if texts or signature:
                turns.add("assistant", [ThinkingBlock("\n\n".join(texts), signature)])
    messages = [Message(role, tuple(blocks)) for role, blocks in turns.items if blocks]
    return system, messages


def _block(part: JSON, where: str) -> TextBlock | ImageBlock:
    if part["type"] == "input_image":
        return _image(part["image_url"], where)
    return TextBlock(part["text"])
