"""Explicit checks of the request bodies we send to the non-OpenAI fakes, against each
provider's documented required fields and field names (the OpenAI fake validates against
CreateChatCompletionRequest with tests/openai_schema.py). Each returns the problems found,
empty when the body is well formed; a fake answers 400 on any and records them in
`violations`, so a malformed request fails its test."""

from __future__ import annotations

import re
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
# botocore's bedrock-runtime 2023-09-30 service model: CachePointBlock {type: default, ttl?:
# 5m|1h}; DocumentBlock {format?, name (alphanumerics, single whitespace, hyphens,
# parentheses, square brackets; 1-200), source: one of bytes|s3Location|text|content};
# SystemContentBlock and Tool entries: one member each.
BEDROCK_DOC_FORMATS = {"pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md"}
_DOC_NAME = re.compile(r"^(?!.*\s\s)[0-9A-Za-z\s\-()\[\]]{1,200}$")


def _bedrock_block(block: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    if "cachePoint" in block:
        point = block["cachePoint"]
        if not isinstance(point, dict) or point.get("type") != "default":
            out.append(f"{where}.cachePoint.type: must be 'default'")
        elif set(point) - {"type", "ttl"} or point.get("ttl", "5m") not in ("5m", "1h"):
            out.append(f"{where}.cachePoint: unknown member or ttl not 5m|1h")
    if "document" in block:
        doc = block["document"]
        if doc.get("format") not in BEDROCK_DOC_FORMATS:
            out.append(f"{where}.document.format: not a DocumentFormat")
        if not isinstance(doc.get("name"), str) or not _DOC_NAME.match(doc["name"]):
            out.append(f"{where}.document.name: invalid characters")
        source = doc.get("source")
        if (
            not isinstance(source, dict)
            or len(source) != 1
            or set(source)
            - {
                "bytes",
                "s3Location",
                "text",
                "content",
            }
        ):
            out.append(f"{where}.document.source: exactly one DocumentSource member")
    return out


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
            else:
                out += _bedrock_block(block, f"messages[{i}].content[{j}]")
    for i, entry in enumerate(body.get("system") or []):
        if (
            not isinstance(entry, dict)
            or len(entry) != 1
            or set(entry)
            - {
                "text",
                "guardContent",
                "cachePoint",
            }
        ):
            out.append(f"system[{i}]: exactly one SystemContentBlock member")
        else:
            out += _bedrock_block(entry, f"system[{i}]")
    for i, tool in enumerate((body.get("toolConfig") or {}).get("tools") or []):
        if (
            not isinstance(tool, dict)
            or len(tool) != 1
            or set(tool)
            - {
                "toolSpec",
                "systemTool",
                "cachePoint",
            }
        ):
            out.append(f"toolConfig.tools[{i}]: exactly one Tool member")
        else:
            out += _bedrock_block(tool, f"toolConfig.tools[{i}]")
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


# --- embeddings ----------------------------------------------------------------------------
# Gemini batchEmbedContents (ai.google.dev/api/embeddings#method:-models.batchembedcontents):
# `requests` required, each an EmbedContentRequest with `model` ("models/{model}", the model
# of the URL) and `content` (text parts) required; taskType, title, outputDimensionality
# optional.
GEMINI_EMBED = {"model", "content", "taskType", "title", "outputDimensionality"}


def gemini_embed_problems(body: Any, model: str) -> list[str]:
    if not isinstance(body, dict):
        return ["body: must be an object"]
    out = [f"{k}: not a BatchEmbedContentsRequest field" for k in sorted(set(body) - {"requests"})]
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        return [*out, "requests: required non-empty array"]
    for i, r in enumerate(requests):
        if not isinstance(r, dict):
            out.append(f"requests[{i}]: must be an object")
            continue
        out += [f"requests[{i}].{k}: unknown field" for k in sorted(set(r) - GEMINI_EMBED)]
        if r.get("model") != f"models/{model}":
            out.append(f"requests[{i}].model: must be 'models/{model}', got {r.get('model')!r}")
        _content(r.get("content"), f"requests[{i}].content", {"user"}, out)
        dim = r.get("outputDimensionality")
        if dim is not None and (not isinstance(dim, int) or dim < 1):
            out.append(f"requests[{i}].outputDimensionality: must be a positive integer")
    return out


# Bedrock InvokeModel bodies of the embedding models
# (docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-titan-embed-text.html,
# .../model-parameters-embed.html): Titan Text Embeddings v2 `{inputText (required),
# dimensions?, normalize?, embeddingTypes?}`, v1 `{inputText}` only; Cohere Embed `{texts
# (required, at most 96), input_type (required), truncate?, embedding_types?}`.
TITAN_V2 = {"inputText", "dimensions", "normalize", "embeddingTypes"}
COHERE_EMBED = {"texts", "input_type", "truncate", "embedding_types", "images"}
COHERE_INPUT_TYPES = {"search_document", "search_query", "classification", "clustering", "image"}


def bedrock_embed_problems(body: Any, model_id: str) -> list[str]:
    if not isinstance(body, dict):
        return ["body: must be an object"]
    if model_id.startswith("amazon.titan-embed-text"):
        allowed = TITAN_V2 if "-v2" in model_id else {"inputText"}
        out = [f"{k}: not a {model_id} request field" for k in sorted(set(body) - allowed)]
        if not isinstance(body.get("inputText"), str) or not body["inputText"]:
            out.append("inputText: required string")
        if "normalize" in body and not isinstance(body["normalize"], bool):
            out.append("normalize: must be a boolean")
        return out
    if model_id.startswith("cohere.embed"):
        out = [f"{k}: not a Cohere Embed field" for k in sorted(set(body) - COHERE_EMBED)]
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            out.append("texts: required array of strings")
        elif len(texts) > 96:
            out.append("texts: at most 96 per call")
        if body.get("input_type") not in COHERE_INPUT_TYPES:
            out.append(f"input_type: required, one of {sorted(COHERE_INPUT_TYPES)}")
        return out
    return [f"{model_id}: not an embedding model"]


# Ollama POST /api/embed (docs.ollama.com/api/embed): `model` and `input` (a string or an
# array of strings) required; truncate, dimensions, keep_alive, options optional.
OLLAMA_EMBED = {"model", "input", "truncate", "dimensions", "keep_alive", "options"}


def ollama_embed_problems(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return ["body: must be an object"]
    out = [f"{k}: not an /api/embed field" for k in sorted(set(body) - OLLAMA_EMBED)]
    if not isinstance(body.get("model"), str) or not body["model"]:
        out.append("model: required string")
    value = body.get("input")
    if not (
        isinstance(value, str)
        or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))
    ):
        out.append("input: required string or array of strings")
    dim = body.get("dimensions")
    if dim is not None and (not isinstance(dim, int) or dim < 1):
        out.append("dimensions: must be a positive integer")
    return out
