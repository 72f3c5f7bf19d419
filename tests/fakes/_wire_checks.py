"""Explicit checks of the request bodies we send to the non-OpenAI fakes, against each
provider's documented required fields and field names (the OpenAI fake validates against
CreateChatCompletionRequest with tests/openai_schema.py). Each returns the problems found,
empty when the body is well formed; a fake answers 400 on any and records them in
`violations`, so a malformed request fails its test."""

from __future__ import annotations

from typing import Any

# Gemini GenerateContentRequest (ai.google.dev/api/generate-content#request-body): `contents`
# required; Content = {role: user|model, parts: [Part]}; a Part holds exactly one data field
# (plus the `thought`/`thoughtSignature` metadata); GenerationConfig field names.
GEMINI_TOP = {
    "contents",
    "tools",
    "toolConfig",
    "safetySettings",
    "systemInstruction",
    "generationConfig",
    "cachedContent",
}
GEMINI_PART_DATA = {
    "text",
    "inlineData",
    "functionCall",
    "functionResponse",
    "fileData",
    "executableCode",
    "codeExecutionResult",
}
GEMINI_PART_META = {"thought", "thoughtSignature", "videoMetadata", "partMetadata"}
GEMINI_CONFIG = {
    "stopSequences",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "responseModalities",
    "candidateCount",
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseLogprobs",
    "logprobs",
    "thinkingConfig",
    "mediaResolution",
}


def _content(c: Any, where: str, roles: set[str], out: list[str]) -> None:
    if not isinstance(c, dict):
        out.append(f"{where}: must be a Content object")
        return
    if "role" in c and c["role"] not in roles:
        out.append(f"{where}.role: {c['role']!r} not one of {sorted(roles)}")
    parts = c.get("parts")
    if not isinstance(parts, list) or not parts:
        out.append(f"{where}.parts: required non-empty array")
        return
    for j, part in enumerate(parts):
        keys = set(part) if isinstance(part, dict) else set()
        data = keys & GEMINI_PART_DATA
        if len(data) != 1:
            out.append(f"{where}.parts[{j}]: exactly one data field, got {sorted(data)}")
        unknown = keys - GEMINI_PART_DATA - GEMINI_PART_META
        if unknown:
            out.append(f"{where}.parts[{j}]: unknown fields {sorted(unknown)}")


def gemini_problems(body: Any) -> list[str]:
    out: list[str] = []
    if not isinstance(body, dict):
        return ["body: must be an object"]
    out += [f"{k}: not a GenerateContentRequest field" for k in sorted(set(body) - GEMINI_TOP)]
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        out.append("contents: required non-empty array")
    else:
        for i, c in enumerate(contents):
            _content(c, f"contents[{i}]", {"user", "model"}, out)
    if "systemInstruction" in body:
        _content(body["systemInstruction"], "systemInstruction", {"user", "system"}, out)
    config = body.get("generationConfig", {})
    out += [
        f"generationConfig.{k}: not a GenerationConfig field"
        for k in sorted(set(config) - GEMINI_CONFIG)
    ]
    if "responseSchema" in config and "responseJsonSchema" in config:
        out.append("generationConfig: responseSchema and responseJsonSchema are exclusive")
    if ("responseSchema" in config or "responseJsonSchema" in config) and config.get(
        "responseMimeType"
    ) != "application/json":
        out.append("generationConfig: a response schema needs responseMimeType application/json")
    for i, tool in enumerate(body.get("tools", [])):
        for k, decl in enumerate(tool.get("functionDeclarations", [])):
            if not isinstance(decl.get("name"), str):
                out.append(f"tools[{i}].functionDeclarations[{k}].name: required")
    return out


# Bedrock Converse (docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html):
# messages: role user|assistant, content [ContentBlock] with one member each;
# InferenceConfiguration has maxTokens, temperature, topP, stopSequences only.
BEDROCK_TOP = {
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "guardrailConfig",
    "additionalModelRequestFields",
    "additionalModelResponseFieldPaths",
    "promptVariables",
    "requestMetadata",
    "performanceConfig",
}
BEDROCK_BLOCKS = {
    "text",
    "image",
    "document",
    "video",
    "toolUse",
    "toolResult",
    "guardContent",
    "reasoningContent",
    "cachePoint",
    "citationsContent",
}
BEDROCK_INFERENCE = {"maxTokens", "temperature", "topP", "stopSequences"}


def bedrock_problems(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return ["body: must be an object"]
    out = [f"{k}: not a Converse request field" for k in sorted(set(body) - BEDROCK_TOP)]
    # `messages` is documented "Required: No" (a prompt-management ARN may stand in for it).
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        out.append("messages: must be an array")
        messages = []
    for i, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            out.append(f"messages[{i}].role: must be user or assistant")
        content = m.get("content")
        if not isinstance(content, list) or not content:
            out.append(f"messages[{i}].content: required non-empty array")
            continue
        for j, block in enumerate(content):
            if not isinstance(block, dict) or len(block) != 1 or set(block) - BEDROCK_BLOCKS:
                out.append(f"messages[{i}].content[{j}]: exactly one ContentBlock member")
    inference = body.get("inferenceConfig", {})
    out += [
        f"inferenceConfig.{k}: not an InferenceConfiguration field"
        for k in sorted(set(inference) - BEDROCK_INFERENCE)
    ]
    return out


# Ollama POST /api/chat (docs.ollama.com/api/chat, openapi.yaml): `model` and `messages`
# required; message role system|user|assistant|tool with string content; `format` "json" or
# a JSON schema; `think` bool or "low"/"medium"/"high"; `options` are ModelOptions.
OLLAMA_TOP = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"}
OLLAMA_MESSAGE = {"role", "content", "images", "tool_calls", "tool_name", "thinking"}
OLLAMA_OPTIONS = {
    "seed",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "stop",
    "num_ctx",
    "num_predict",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "typical_p",
    "num_keep",
}


def ollama_problems(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return ["body: must be an object"]
    out = [f"{k}: not an /api/chat field" for k in sorted(set(body) - OLLAMA_TOP)]
    if not isinstance(body.get("model"), str) or not body["model"]:
        out.append("model: required string")
    messages = body.get("messages")
    if not isinstance(messages, list):
        out.append("messages: required array")
        messages = []
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            out.append(f"messages[{i}].role: must be system, user, assistant or tool")
        if not isinstance(m.get("content", ""), str):
            out.append(f"messages[{i}].content: must be a string")
        out += [f"messages[{i}].{k}: unknown field" for k in sorted(set(m) - OLLAMA_MESSAGE)]
    fmt = body.get("format")
    if fmt is not None and fmt != "json" and not isinstance(fmt, dict):
        out.append("format: must be 'json' or a JSON schema object")
    think = body.get("think")
    if think is not None and think not in (True, False, "low", "medium", "high"):
        out.append("think: must be a boolean or low/medium/high")
    options = body.get("options", {})
    out += [f"options.{k}: not a ModelOptions field" for k in sorted(set(options) - OLLAMA_OPTIONS)]
    return out
