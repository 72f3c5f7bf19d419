"""A caller's `POST /responses` body, judged and decoded (OpenAI's Responses API).

Two products: a `ResponsesRequest` (the options echoed on the Response object and what the
store keeps) and, through `conversation`, the internal `ChatRequest` the gateway routes, as
for chat completions. Input items are normalised to the stored shape and read into
messages by `items` (a stored chain and the new input alike), tools by `tools`. Every field
is checked; one we cannot honour is a 400 naming it, as the chat decoder does (a
provider-dependent one goes to `ChatRequest.params`, whose provider tables decide).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from orchestrator.providers._responses_format.items import (
    invalid,
    items_to_messages,
    normalise_input,
)
from orchestrator.providers._responses_format.tools import Tools, tool_choice
from orchestrator.providers._types import ChatRequest, DocumentBlock

__all__ = ["INCLUDE_HONOURED", "ResponsesRequest", "conversation", "decode_request"]

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
        invalid("body", "must be a JSON object")
    for name in body:
        if name not in _FIELDS:
            invalid(name, "unrecognized request argument (not a Responses API field)")
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, False):
            invalid(name, why)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        invalid("model", "must be a non-empty string")
    raw = body.get("input")
    if raw is None:
        invalid("input", "is required")
    items = normalise_input(raw)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        invalid("instructions", "must be a string")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        invalid("previous_response_id", "must be a response id")
    stream = _bool(body, "stream", False)
    store = _bool(body, "store", True)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        invalid("parallel_tool_calls", "must be a boolean")
    if body.get("truncation") not in (None, "disabled"):
        invalid("truncation", "only 'disabled' is supported (input is never truncated)")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        invalid("stream_options", "must be an object")
    max_calls = body.get("max_tool_calls")  # about built-in tools: none can be declared here
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int)):
        invalid("max_tool_calls", "must be an integer")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        invalid("user", "must be a string")
    params = _params_of(body)
    reasoning, summary = _reasoning(body.get("reasoning"), params)
    text_format, verbosity = _text(body.get("text"), params)
    if user is not None:
        params["user"] = user
    if parallel is not None:
        params["parallel_tool_calls"] = parallel
    tools = Tools(drop)
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
        tool_choice=tool_choice(choice),
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
    """`chat` with at least one message, and its documents' kinds in `params["document"]`
    ("base64", "url"), as the chat-completions and Messages decoders record them: the
    provider's table then refuses (or drops and lists) what it cannot read, rather than an
    encoder sending a URL document as an empty PDF or one without documents losing it."""
    if not chat.messages:
        invalid("input", "must hold at least one user, assistant or tool output item")
    kinds: list[str] = []
    for message in chat.messages:
        for block in message.content:
            if isinstance(block, DocumentBlock):
                kind = "url" if block.url is not None else "base64"
                if kind not in kinds:
                    kinds.append(kind)
    if not kinds:
        return chat
    return dataclasses.replace(chat, params={**chat.params, "document": tuple(kinds)})


def _joined(instructions: str | None, system: list[str]) -> str | None:
    parts = [p for p in (instructions, *system) if p]
    return "\n\n".join(parts) if parts else None


def _bool(body: JSON, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        invalid(name, "must be a boolean")
    return value


def _number(body: JSON, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        invalid(key, "must be a number")
    if not low <= value <= high:
        invalid(key, f"must be between {low:g} and {high:g}")
    return float(value)


def _max_output(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        invalid("max_output_tokens", "must be a positive integer")
    return value


def _params_of(body: JSON) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, types in _PARAM_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            invalid(name, "has the wrong type")
        out[name] = value
    return out


def _metadata(value: Any, field: str = "metadata", most: int | None = 16) -> dict[str, str]:
    """String pairs; `metadata` within OpenAI's limits: 16 pairs, keys up to 64 characters,
    values up to 512."""
    if value is None:
        return {}
    if not isinstance(value, dict) or (most is not None and len(value) > most):
        invalid(field, f"must be an object of {'at most 16 ' if most else ''}string pairs")
    for key, text in value.items():
        if not isinstance(text, str):
            invalid(f"{field}.{key}", "values must be strings")
        if most is not None and (len(key) > 64 or len(text) > 512):
            invalid(f"{field}.{key}", "keys up to 64 characters, values up to 512")
    return dict(value)


def _include(value: Any, drop: bool) -> tuple[tuple[str, ...], list[str]]:
    """The include values we fill (or have nothing to fill), and those dropped."""
    if value is None:
        return (), []
    if not isinstance(value, list):
        invalid("include", "must be an array")
    kept: list[str] = []
    dropped: list[str] = []
    for i, name in enumerate(value):
        if name in INCLUDE_HONOURED:
            kept.append(name)
        elif drop and isinstance(name, str):
            dropped.append(f"include:{name}")
        else:
            invalid(f"include[{i}]", f"{name!r} is not supported")
    return tuple(kept), dropped


def _reasoning(value: Any, params: dict[str, Any]) -> tuple[JSON | None, bool]:
    """`reasoning.effort` -> the `reasoning_effort` param (each provider's table maps it to
    its thinking switch or budget); `summary` says thinking comes back as summaries."""
    if value is None:
        return None, False
    if not isinstance(value, dict):
        invalid("reasoning", "must be an object")
    for key in value:
        if key not in ("effort", "summary", "generate_summary"):
            invalid(f"reasoning.{key}", "is not supported")
    effort = value.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            invalid("reasoning.effort", "must be a string")
        params["reasoning_effort"] = effort
    summary = value.get("summary", value.get("generate_summary"))
    if summary not in (None, "auto", "concise", "detailed"):
        invalid("reasoning.summary", "must be auto, concise or detailed")
    return {"effort": effort, "summary": summary}, summary is not None


def _text(value: Any, params: dict[str, Any]) -> tuple[JSON, str | None]:
    """`text.format` -> the internal `response_format` (chat completions' shape)."""
    if value is None:
        return {"type": "text"}, None
    if not isinstance(value, dict):
        invalid("text", "must be an object")
    for key in value:
        if key not in ("format", "verbosity"):
            invalid(f"text.{key}", "is not supported")
    verbosity = value.get("verbosity")
    if verbosity is not None:
        if verbosity not in ("low", "medium", "high"):
            invalid("text.verbosity", "must be low, medium or high")
        params["verbosity"] = verbosity
    fmt = value.get("format")
    if fmt is None:
        return {"type": "text"}, verbosity
    if not isinstance(fmt, dict):
        invalid("text.format", "must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return {"type": "text"}, verbosity
    if kind == "json_object":
        params["response_format"] = {"type": "json_object"}
        return {"type": "json_object"}, verbosity
    if kind != "json_schema":
        invalid("text.format.type", "must be text, json_object or json_schema")
    name, schema = fmt.get("name"), fmt.get("schema")
    if not isinstance(name, str) or not name:
        invalid("text.format.name", "is required for json_schema")
    if not isinstance(schema, dict):
        invalid("text.format.schema", "must be a JSON Schema object")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        invalid("text.format.strict", "must be a boolean")
    spec: JSON = {"name": name, "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    if isinstance(fmt.get("description"), str):
        spec["description"] = fmt["description"]
    params["response_format"] = {"type": "json_schema", "json_schema": spec}
    return {"type": "json_schema", **spec}, verbosity
