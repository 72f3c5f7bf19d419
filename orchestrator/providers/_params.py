"""Declared per-provider tables of the optional request fields each provider kind honours.

A caller's `ChatRequest.params` (OpenAI field names; `thinking` is Anthropic's) reach an
upstream only through its kind's table: field -> a function writing the documented wire
form into the body the adapter built. A field absent from the table cannot be honoured: the
gateway answers 400 naming field and provider, or, with `drop_unsupported_params`, drops it
and the endpoint lists it in `X-Orchestrator-Dropped-Params` (never silently).

Wire references: OpenAI CreateChatCompletionRequest; Anthropic Messages (`thinking`,
`tool_choice.disable_parallel_tool_use`); Gemini GenerationConfig (`seed`, `presencePenalty`,
`frequencyPenalty`, `responseMimeType`, `responseJsonSchema`, `thinkingConfig.thinkingBudget`);
Bedrock Converse `inferenceConfig` (maxTokens, temperature, topP, stopSequences only: nothing
else is portable across its models); Ollama /api/chat (`format`, `think`, `options.seed`,
`options.presence_penalty`, `options.frequency_penalty`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.errors import ValidationFailed

__all__ = [
    "ANTHROPIC",
    "BEDROCK",
    "GEMINI",
    "LOCAL",
    "OLLAMA",
    "OPENAI",
    "PARAM_FIELDS",
    "apply",
    "fit",
    "unsupported",
]

JSON = dict[str, Any]
Translate = Callable[[JSON, Any], None]

# Every optional field a caller may send; the decoders keep exactly these in `params`.
PARAM_FIELDS = (
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "response_format",
    "reasoning_effort",
    "thinking",
    "parallel_tool_calls",
    "metadata",
)


def _same(name: str) -> Translate:
    def put(body: JSON, value: Any) -> None:
        body[name] = value

    return put


def _under(outer: str, name: str) -> Translate:
    def put(body: JSON, value: Any) -> None:
        body.setdefault(outer, {})[name] = value

    return put


# --- OpenAI: the caller's format, passed as is ---------------------------------------------
OPENAI: Mapping[str, Translate] = {
    name: _same(name)
    for name in (
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "response_format",
        "reasoning_effort",
        "parallel_tool_calls",
        "metadata",
    )
}

# --- the local llama.cpp server (OpenAI-compatible): sampling and grammar-backed formats ---
LOCAL: Mapping[str, Translate] = {
    name: _same(name)
    for name in ("seed", "frequency_penalty", "presence_penalty", "logit_bias", "response_format")
}


# --- Anthropic Messages -------------------------------------------------------------------
def _anthropic_parallel(body: JSON, value: Any) -> None:
    if value is False and body.get("tools"):
        choice = body.setdefault("tool_choice", {"type": "auto"})
        choice["disable_parallel_tool_use"] = True


ANTHROPIC: Mapping[str, Translate] = {
    "thinking": _same("thinking"),
    "parallel_tool_calls": _anthropic_parallel,
}


# --- Gemini generateContent ----------------------------------------------------------------
def _gemini_format(body: JSON, value: Any) -> None:
    config = body.setdefault("generationConfig", {})
    kind = value.get("type")
    if kind in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
    if kind == "json_schema":
        config["responseJsonSchema"] = value["json_schema"].get("schema", {})


def _gemini_thinking(body: JSON, value: Any) -> None:
    budget = value.get("budget_tokens", 0) if value.get("type") == "enabled" else 0
    body.setdefault("generationConfig", {})["thinkingConfig"] = {"thinkingBudget": budget}


GEMINI: Mapping[str, Translate] = {
    "seed": _under("generationConfig", "seed"),
    "frequency_penalty": _under("generationConfig", "frequencyPenalty"),
    "presence_penalty": _under("generationConfig", "presencePenalty"),
    "response_format": _gemini_format,
    "thinking": _gemini_thinking,
}

# --- Bedrock Converse: inferenceConfig carries only what ChatRequest already has -----------
BEDROCK: Mapping[str, Translate] = {}


# --- Ollama /api/chat ------------------------------------------------------------------------
def _ollama_format(body: JSON, value: Any) -> None:
    kind = value.get("type")
    if kind == "json_object":
        body["format"] = "json"
    elif kind == "json_schema":
        body["format"] = value["json_schema"].get("schema", {})


OLLAMA: Mapping[str, Translate] = {
    "seed": _under("options", "seed"),
    "frequency_penalty": _under("options", "frequency_penalty"),
    "presence_penalty": _under("options", "presence_penalty"),
    "response_format": _ollama_format,
    # `think` takes true/false, or "low"/"medium"/"high" for models that grade it.
    "reasoning_effort": _same("think"),
    "thinking": lambda body, value: body.__setitem__("think", value.get("type") == "enabled"),
}


def table_of(adapter: object) -> Mapping[str, Translate]:
    """The adapter's declared table; an adapter declaring none honours no optional field."""
    table: Mapping[str, Translate] = getattr(adapter, "params", {})
    return table


def unsupported(adapter: object, params: Mapping[str, Any]) -> list[str]:
    table = table_of(adapter)
    return [name for name in params if name not in table]


def fit(params: Mapping[str, Any], adapter: object, provider: str, *, drop: bool) -> dict[str, Any]:
    """`params` narrowed to what `provider` honours; 400 naming the rest unless `drop`."""
    missing = unsupported(adapter, params)
    if missing and not drop:
        fields = ", ".join(missing)
        raise ValidationFailed(
            f"invalid request: {fields}: not supported by provider {provider}",
            extra={
                "provider": provider,
                "fields": [
                    {"field": m, "message": f"not supported by provider {provider}"}
                    for m in missing
                ],
            },
        )
    return {k: v for k, v in params.items() if k not in missing}


def apply(adapter: object, body: JSON, params: Mapping[str, Any]) -> JSON:
    """Write each of `params` into `body` through the adapter's table (already `fit`)."""
    table = table_of(adapter)
    for name, value in params.items():
        if name in table:
            table[name](body, value)
    return body
