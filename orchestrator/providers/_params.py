"""Declared per-provider tables of the optional request fields each provider kind honours.

A caller's `ChatRequest.params` (OpenAI field names; `thinking` is Anthropic's) reach an
upstream only through its kind's table: field -> a function writing the documented wire
form into the body the adapter built. A field absent from the table cannot be honoured: the
gateway answers 400 naming field and provider, or, with `drop_unsupported_params`, drops it
and the endpoint lists it in `X-Orchestrator-Dropped-Params` (never silently).

An entry may accept only some values of its field (`Limited`: DeepSeek and Zhipu document
`response_format` json_object but not json_schema); a value outside them is refused like an
absent field. A caller's `user` (end-user id) is in `params` too, so it is checked like the
others; the encoders write `ChatRequest.user` where the provider documents one (the agent
runner's own attribution, set without `params`, goes only where a provider takes it).

Caching hints (`prompt_cache_key`, `prompt_cache_retention`, `prompt_cache_options`:
`ADVISORY`) change no output: a provider without them drops them and the endpoint lists
them, never a 400 (issue 34).

Fields every kind honours without a table entry: `stop` (each adapter's stop sequences;
Zhipu: one at most), `max_tokens`/`max_completion_tokens` (the one output limit), and
`stream_options.include_usage` (the usage chunk is built by our encoder from the upstream's
usage, whatever the provider). `n` > 1 is in no table: one choice is all an answer carries.

Wire references (the providers' API references, as of 2026-11):
- OpenAI CreateChatCompletionRequest (tests/reference/openai-openapi-subset.json).
- Anthropic Messages: `thinking` {type: enabled, budget_tokens >= 1024, < max_tokens},
  `tool_choice.disable_parallel_tool_use`, `metadata.user_id`, and structured outputs
  (platform.claude.com/docs/en/build-with-claude/structured-outputs): the generally
  available form `output_config: {format: {type: "json_schema", schema}}`, no beta header
  (the beta `output_format` + `anthropic-beta: structured-outputs-2025-11-13` preceded it).
- Gemini GenerationConfig (`seed`, `presencePenalty`, `frequencyPenalty`, `responseMimeType`,
  `responseJsonSchema`, `thinkingConfig.thinkingBudget`); `reasoning_effort` uses the budgets
  of Gemini's own OpenAI compatibility (ai.google.dev/gemini-api/docs/openai): low 1024,
  medium 8192, high 24576, none 0 (no thinking).
- Bedrock Converse `inferenceConfig` (maxTokens, temperature, topP, stopSequences only:
  nothing else is portable across its models); Claude's `thinking` in
  `additionalModelRequestFields` (Bedrock's extended-thinking guide); `cachePoint` and
  `document` blocks (botocore's bedrock-runtime service model).
- Ollama /api/chat (`format`, `think`, `options.seed`, `options.presence_penalty`,
  `options.frequency_penalty`).
- Zhipu GLM chat completions (docs.bigmodel.cn / docs.z.ai): `response_format` {type: text |
  json_object}, `thinking` {type: enabled | disabled} (GLM-4.5 and later), `user_id`.
- DeepSeek create-chat-completion (api-docs.deepseek.com): `frequency_penalty`,
  `presence_penalty`, `response_format` {type: text | json_object}, `thinking` {type:
  enabled | disabled}; no seed, logit_bias or user.
- Qwen, DashScope compatible mode (help.aliyun.com/zh/model-studio, "OpenAI compatible"):
  `seed`, `presence_penalty`, `response_format` (json_object; json_schema on the models that
  support it), `parallel_tool_calls`, `enable_thinking` + `thinking_budget`; no user.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import ValidationFailed

__all__ = [
    "ADVISORY",
    "ANTHROPIC",
    "BEDROCK",
    "GEMINI",
    "LOCAL",
    "OLLAMA",
    "OPENAI",
    "PARAM_FIELDS",
    "REASONING_BUDGETS",
    "VERTEX_ANTHROPIC",
    "Limited",
    "apply",
    "fit",
    "portable",
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
    "n",
    "user",
    *(
        # Fields of OpenAI's CreateChatCompletionRequest no translation above handles, and
        # Anthropic's `top_k`/`service_tier`: kept under their own names so that each
        # provider's table decides (passed on where the provider documents them; else a
        # 400 naming field and provider, or dropped and listed). Never ignored silently.
        "top_k",
        "service_tier",
        "store",
        "prediction",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "verbosity",
        "logprobs",
        "top_logprobs",
        "audio",
        "modalities",
        "functions",
        "function_call",
        "moderation",
        "web_search_options",
    ),
    # Anthropic Messages fields beyond OpenAI's (decoded from /messages; see
    # _anthropic_format/request.py), and what the internal model carries that not every
    # provider takes: `cache_control` (anywhere), `document` (value: its source kinds).
    # Anthropic-only block and server-tool types come as `content.<type>` / `tools.<type>`.
    "output_config",
    "output_format",
    "context_management",
    "container",
    "mcp_servers",
    "inference_geo",
    "speed",
    "diagnostics",
    "fallbacks",
    "fallback_credit_token",
    "citations",
    "cache_control",
    "document",
)

# Fields a provider without them drops and lists (X-Orchestrator-Dropped-Params) even without
# `drop_unsupported_params`: caching hints (prompt_cache_*, Anthropic's cache breakpoints)
# change what a call costs, never the answer (OpenAI and Gemini cache prompts on their own and
# report the cached tokens all the same).
ADVISORY = frozenset(
    {"cache_control", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"}
)

# OpenAI `reasoning_effort` -> a thinking budget in tokens, for providers that take budgets
# (Anthropic, Gemini). Gemini's OpenAI compatibility documents low/medium/high as 1K/8K/24K;
# Anthropic documents no mapping, so the same one serves it (its minimum budget is 1024).
# `minimal` (OpenAI's gpt-5 level) takes the smallest budget; `none` turns thinking off.
REASONING_BUDGETS: Mapping[str, int] = {
    "none": 0,
    "minimal": 1024,
    "low": 1024,
    "medium": 8192,
    "high": 24576,
}


@dataclass(frozen=True, slots=True)
class Limited:
    """A table entry honouring only the values `accepts` approves (others: unsupported)."""

    put: Translate
    accepts: Callable[[Any], bool]

    def __call__(self, body: JSON, value: Any) -> None:
        self.put(body, value)


def _encoded(body: JSON, value: Any) -> None:
    """The adapter's encoder already wrote this field (`user`): declared, nothing to add."""


def _json_object_only(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "json_object"


def _known_effort(value: Any) -> bool:
    return value in REASONING_BUDGETS


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
        # Request-side only: the answer keeps its shape (unlike logprobs, audio, modalities,
        # functions or web search, whose output ChatResponse does not carry: those are 400).
        "service_tier",
        "store",
        "prediction",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "verbosity",
        # The answer carries them: ChatResponse.logprobs / BlockDelta.logprobs.
        "logprobs",
        "top_logprobs",
    )
} | {
    "user": _encoded,
    # The encoder writes a base64 PDF as a `file` content part, plain text as a text part.
    "document": Limited(_encoded, lambda kinds: set(kinds) <= {"base64", "text"}),
}

# --- the local llama.cpp server (OpenAI-compatible): sampling and grammar-backed formats ---
LOCAL: Mapping[str, Translate] = {
    name: _same(name)
    for name in (
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "response_format",
        # llama-server returns OpenAI's logprobs shape (`n_probs` under its own name too).
        "logprobs",
        "top_logprobs",
    )
}


# --- Anthropic Messages -------------------------------------------------------------------
def _anthropic_parallel(body: JSON, value: Any) -> None:
    if value is False and body.get("tools"):
        choice = body.setdefault("tool_choice", {"type": "auto"})
        choice["disable_parallel_tool_use"] = True


def _anthropic_format(body: JSON, value: Any) -> None:
    # json_object has no schema: a permissive one (any object) asks for JSON all the same.
    schema = value["json_schema"].get("schema", {}) if value.get("type") == "json_schema" else {}
    schema = schema or {"type": "object"}
    body.setdefault("output_config", {})["format"] = {"type": "json_schema", "schema": schema}


def _anthropic_effort(body: JSON, value: Any) -> None:
    budget = REASONING_BUDGETS[value]
    if budget == 0:
        body["thinking"] = {"type": "disabled"}
        return
    body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    # Anthropic wants budget_tokens < max_tokens; OpenAI counts reasoning inside the limit,
    # so the caller's limit is what the answer may use on top of the budget.
    if body.get("max_tokens", 0) <= budget:
        body["max_tokens"] = budget + body.get("max_tokens", 0)


class _NativeTable(dict[str, Translate]):
    """Anthropic's table: its fixed entries, and every Anthropic-only block or tool type
    (`content.<type>`, `tools.<type>`), which reach it in the caller's own body."""

    def __missing__(self, key: str) -> Translate:
        if key.startswith(NATIVE_PREFIXES):
            return _encoded
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or (
            isinstance(key, str) and key.startswith(NATIVE_PREFIXES)
        )


NATIVE_PREFIXES = ("content.", "tools.")


def _anthropic_config(body: JSON, value: Any) -> None:
    body.setdefault("output_config", {}).update(value)


_ANTHROPIC_FIXED: dict[str, Translate] = {
    "thinking": _same("thinking"),
    "parallel_tool_calls": _anthropic_parallel,
    "response_format": _anthropic_format,
    "reasoning_effort": Limited(_anthropic_effort, _known_effort),
    "user": _encoded,  # metadata.user_id
    "top_k": _same("top_k"),
    "service_tier": Limited(_same("service_tier"), lambda v: v in ("auto", "standard_only")),
    "output_config": _anthropic_config,
    # The encoder writes cache breakpoints and documents where the blocks carry them.
    "cache_control": _encoded,
    "document": _encoded,
    "citations": _encoded,
}
ANTHROPIC: Mapping[str, Translate] = _NativeTable(
    _ANTHROPIC_FIXED
    | {
        name: _same(name)
        for name in (
            "output_format",
            "context_management",
            "container",
            "mcp_servers",
            "inference_geo",
            "speed",
            "diagnostics",
            "fallbacks",
            "fallback_credit_token",
        )
    }
)

# Claude on Vertex AI: Anthropic's table without the caller-body-only entries. Its body is
# encoded from the internal model (`encode_request`), which has no place for server tools
# (`tools.<type>`) or server-tool blocks (`content.<type>`): honoured here they would be
# lost without a word, so they are refused by name (or dropped and listed) instead.
VERTEX_ANTHROPIC: Mapping[str, Translate] = dict(ANTHROPIC)


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


def _gemini_effort(body: JSON, value: Any) -> None:
    budget = REASONING_BUDGETS[value]
    body.setdefault("generationConfig", {})["thinkingConfig"] = {"thinkingBudget": budget}


GEMINI: Mapping[str, Translate] = {
    "seed": _under("generationConfig", "seed"),
    "frequency_penalty": _under("generationConfig", "frequencyPenalty"),
    "presence_penalty": _under("generationConfig", "presencePenalty"),
    "response_format": _gemini_format,
    "thinking": Limited(_gemini_thinking, lambda v: _switched(v)),
    "reasoning_effort": Limited(_gemini_effort, _known_effort),
    "top_k": _under("generationConfig", "topK"),
    # inlineData (base64 PDF) and text parts; Gemini fetches no arbitrary URL.
    "document": Limited(_encoded, lambda kinds: set(kinds) <= {"base64", "text"}),
}

# --- Bedrock Converse: inferenceConfig carries only what ChatRequest already has -----------
# Its encoder writes `cachePoint` blocks after cached system, message and tool entries (the
# Anthropic and Nova models on Bedrock cache; others answer Bedrock's own 400) and
# `document` blocks (bytes: PDF or text; Bedrock takes no URL).
BEDROCK: Mapping[str, Translate] = {
    # Claude on Bedrock takes Anthropic's `thinking` (enabled with budget_tokens, adaptive on
    # the models that have it) in the model-specific `additionalModelRequestFields`; another
    # model answers Bedrock's own 400.
    "thinking": _under("additionalModelRequestFields", "thinking"),
    "cache_control": _encoded,
    "document": Limited(_encoded, lambda kinds: set(kinds) <= {"base64", "text"}),
}


# --- Ollama /api/chat ------------------------------------------------------------------------
def _ollama_format(body: JSON, value: Any) -> None:
    kind = value.get("type")
    if kind == "json_object":
        body["format"] = "json"
    elif kind == "json_schema":
        body["format"] = value["json_schema"].get("schema", {})


def _ollama_effort(body: JSON, value: Any) -> None:
    body["think"] = {"none": False, "minimal": "low"}.get(value, value)


OLLAMA: Mapping[str, Translate] = {
    "seed": _under("options", "seed"),
    "frequency_penalty": _under("options", "frequency_penalty"),
    "presence_penalty": _under("options", "presence_penalty"),
    "response_format": _ollama_format,
    # `think` takes true/false, or "low"/"medium"/"high" for models that grade it.
    "reasoning_effort": Limited(_ollama_effort, _known_effort),
    "thinking": Limited(
        lambda body, value: body.__setitem__("think", value.get("type") == "enabled"),
        lambda v: _switched(v),
    ),
    "top_k": _under("options", "top_k"),
}


# --- OpenAI-compatible providers: each documents a subset --------------------------------
def _switch(body: JSON, value: Any) -> None:
    """Anthropic's `thinking` as the on/off switch Zhipu and DeepSeek document (no budget)."""
    body["thinking"] = {"type": "enabled" if value.get("type") == "enabled" else "disabled"}


def _switched(value: Any) -> bool:
    """A `thinking` these tables translate: enabled or disabled (adaptive is translated to
    an effort first, `portable`)."""
    return isinstance(value, dict) and value.get("type") in ("enabled", "disabled")


ZHIPU: Mapping[str, Translate] = {
    "response_format": Limited(_same("response_format"), _json_object_only),
    "thinking": Limited(_switch, _switched),
    "user": _encoded,  # user_id (6-128 characters), written by the adapter
}

DEEPSEEK: Mapping[str, Translate] = {
    "frequency_penalty": _same("frequency_penalty"),
    "presence_penalty": _same("presence_penalty"),
    "response_format": Limited(_same("response_format"), _json_object_only),
    "thinking": Limited(_switch, _switched),
}


def _qwen_thinking(body: JSON, value: Any) -> None:
    enabled = value.get("type") == "enabled"
    body["enable_thinking"] = enabled
    if enabled and value.get("budget_tokens"):
        body["thinking_budget"] = value["budget_tokens"]


QWEN: Mapping[str, Translate] = {
    "seed": _same("seed"),
    "presence_penalty": _same("presence_penalty"),
    "response_format": _same("response_format"),
    "parallel_tool_calls": _same("parallel_tool_calls"),
    "thinking": Limited(_qwen_thinking, _switched),
}


def table_of(adapter: object, model: str | None = None) -> Mapping[str, Translate]:
    """The adapter's declared table; an adapter declaring none honours no optional field.
    An adapter whose table depends on the model (Vertex: Gemini's or Anthropic's) declares
    `params_for(model)`."""
    params_for = getattr(adapter, "params_for", None)
    if model is not None and callable(params_for):
        by_model: Mapping[str, Translate] = params_for(model)
        return by_model
    table: Mapping[str, Translate] = getattr(adapter, "params", {})
    return table


def _honoured(table: Mapping[str, Translate], name: str, value: Any) -> bool:
    entry = table.get(name)
    if entry is None:
        return False
    return not isinstance(entry, Limited) or entry.accepts(value)


# Anthropic's output_config.effort as OpenAI's reasoning_effort (OpenAI has no level above
# high; Anthropic's adaptive thinking defaults to high effort).
_EFFORT: Mapping[str, str] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def portable(table: Mapping[str, Translate], params: Mapping[str, Any]) -> Mapping[str, Any]:
    """Anthropic's forms of a field, for a provider whose table lacks them, as the OpenAI
    forms it may honour: `output_config.effort` -> `reasoning_effort`, `output_config.format`
    and `output_format` -> `response_format` (json_schema), `thinking: adaptive` ->
    `reasoning_effort` (or `thinking: enabled` with that effort's budget). A form whose
    translation the provider does not honour either stays, to be refused by its own name.
    Only requests that carry these fields pay for the copy."""
    if not ("output_config" in params or "output_format" in params or "thinking" in params) or (
        table.get("output_config") is not None and table.get("output_format") is not None
    ):
        return params
    out = dict(params)
    config = out.get("output_config")
    if isinstance(config, dict) and "output_config" not in table:
        rest = dict(config)
        effort = _EFFORT.get(rest.get("effort") or "")
        wanted = effort and "reasoning_effort" not in out
        if wanted and _honoured(table, "reasoning_effort", effort):
            out["reasoning_effort"] = effort
            del rest["effort"]
        fmt = rest.get("format")
        if isinstance(fmt, dict) and "response_format" not in out:
            as_openai = _json_schema(fmt)
            if _honoured(table, "response_format", as_openai):
                out["response_format"] = as_openai
                del rest["format"]
        if rest:
            out["output_config"] = rest
        else:
            del out["output_config"]
    fmt = out.get("output_format")
    if isinstance(fmt, dict) and "output_format" not in table and "response_format" not in out:
        as_openai = _json_schema(fmt)
        if _honoured(table, "response_format", as_openai):
            out["response_format"] = as_openai
            del out["output_format"]
    thinking = out.get("thinking")
    if isinstance(thinking, dict) and not _honoured(table, "thinking", thinking):
        if thinking.get("type") == "adaptive":
            effort = out.get("reasoning_effort") or _EFFORT.get(
                (config or {}).get("effort") or "", "high"
            )
            budget = {"type": "enabled", "budget_tokens": REASONING_BUDGETS.get(effort, 24576)}
            if _honoured(table, "reasoning_effort", effort):
                out["reasoning_effort"] = effort
                del out["thinking"]
            elif _honoured(table, "thinking", budget):
                out["thinking"] = budget
    return out


def _json_schema(fmt: Mapping[str, Any]) -> dict[str, Any]:
    schema = fmt.get("schema") or {"type": "object"}
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def unsupported(adapter: object, params: Mapping[str, Any], model: str | None = None) -> list[str]:
    table = table_of(adapter, model)
    params = portable(table, params)
    return [name for name, value in params.items() if not _honoured(table, name, value)]


def fit(
    params: Mapping[str, Any],
    adapter: object,
    provider: str,
    *,
    drop: bool,
    model: str | None = None,
) -> dict[str, Any]:
    """`params` narrowed to what `provider` honours for `model` (where the table depends on
    it; Anthropic's forms translated where it honours the OpenAI ones: `portable`); 400
    naming the rest unless `drop` (advisory fields are dropped and listed all the same)."""
    params = portable(table_of(adapter, model), params)
    missing = unsupported(adapter, params, model)
    if missing and not drop and any(m not in ADVISORY for m in missing):
        missing = [m for m in missing if m not in ADVISORY]
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
