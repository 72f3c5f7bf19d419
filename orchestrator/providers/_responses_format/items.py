"""Input items of the Responses API: normalised to the stored shape, and turned into the
internal conversation's messages.

`normalise_input` judges a request's `input` (a string, or message, function_call,
function_call_output, custom_tool_call(_output) and reasoning items) and writes each item as
`GET /responses/{id}/input_items` lists it: OpenAI's `ItemResource` (an id, content as
parts). `items_to_messages` reads such items, new or stored (a `previous_response_id`
chain: earlier inputs and outputs), into system texts and merged turns. A namespaced
function's provider-side name (`flat_name`) is shared with the tools' module.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import secrets
from typing import Any, Literal, NoReturn

from orchestrator.errors import ValidationFailed
from orchestrator.providers._types import (
    Block,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "PROVIDER_NAME",
    "flat_name",
    "invalid",
    "item_id",
    "items_to_messages",
    "normalise_input",
]

JSON = dict[str, Any]


def invalid(field: str, message: str) -> NoReturn:
    raise ValidationFailed(
        f"invalid request: {field}: {message}",
        extra={"fields": [{"field": field, "message": message}]},
    )


def item_id(prefix: str) -> str:
    """An id in OpenAI's style: `<prefix>_` and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def flat_name(namespace: str, name: str) -> str:
    """`<namespace>__<name>`, or, past 64 characters, shortened with a digest (stable)."""
    flat = f"{namespace}__{name}"
    if PROVIDER_NAME.fullmatch(flat):
        return flat
    digest = hashlib.sha256(flat.encode()).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", flat)
    return f"{clean[:55]}_{digest}"


# --- input items ---------------------------------------------------------------------------
def normalise_input(raw: Any) -> list[JSON]:
    """The input as stored items: a string is one user message; each item gets its id."""
    if isinstance(raw, str):
        return [_message("user", [{"type": "input_text", "text": raw}])]
    if not isinstance(raw, list):
        invalid("input", "must be a string or an array of items")
    items = [_item(item, f"input[{i}]") for i, item in enumerate(raw)]
    seen: set[str] = set()
    for i, item in enumerate(items):
        # Ids are the cursors of GET /responses/{id}/input_items: a repeated one would page
        # forever (OpenAI refuses it too: "Duplicate item found with id").
        if item["id"] in seen:
            invalid(f"input[{i}].id", f"duplicate item id {item['id']!r}")
        seen.add(item["id"])
    return items


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
        invalid(where, "must be an object")
    kind = item.get("type", "message")
    given = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            invalid(f"{where}.role", "must be user, assistant, system or developer")
        content = _content(item.get("content"), role, f"{where}.content")
        return _message(role, content, given)
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not call_id:
            invalid(f"{where}.call_id", "is required")
        if not isinstance(name, str) or not name:
            invalid(f"{where}.name", "is required")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            invalid(f"{where}.arguments", "must be a JSON string")
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
            if not isinstance(namespace, str) or not PROVIDER_NAME.fullmatch(namespace):
                invalid(f"{where}.namespace", "must be 1-64 of A-Z a-z 0-9 _ -")
            call["namespace"] = namespace
        return call
    if kind in ("function_call_output", "custom_tool_call_output"):
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            invalid(f"{where}.call_id", "is required")
        output = item.get("output")
        if isinstance(output, list):
            output = [_input_part(p, f"{where}.output[{k}]") for k, p in enumerate(output)]
        elif not isinstance(output, str):
            invalid(f"{where}.output", "must be a string or an array of input parts")
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
            invalid(f"{where}.call_id", "is required")
        if not isinstance(name, str) or not name:
            invalid(f"{where}.name", "is required")
        if not isinstance(text, str):
            invalid(f"{where}.input", "must be a string")
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
            if not isinstance(namespace, str) or not PROVIDER_NAME.fullmatch(namespace):
                invalid(f"{where}.namespace", "must be 1-64 of A-Z a-z 0-9 _ -")
            custom["namespace"] = namespace
        return custom
    if kind == "reasoning":
        return _reasoning_item(item, given, where)
    invalid(f"{where}.type", f"{kind!r} items are not supported")


def _reasoning_item(item: JSON, given: str | None, where: str) -> JSON:
    out: JSON = {"id": given or item_id("rs"), "type": "reasoning"}
    for key, part_type in (("summary", "summary_text"), ("content", "reasoning_text")):
        parts = item.get(key)
        if parts is None and key == "content":
            continue
        if not isinstance(parts, list):
            invalid(f"{where}.{key}", "must be an array")
        for k, part in enumerate(parts):
            # Codex writes reasoning content parts as `text`: read as reasoning_text.
            if not isinstance(part, dict) or part.get("type") not in (part_type, "text"):
                invalid(f"{where}.{key}[{k}]", f"must be a {part_type} part")
            if not isinstance(part.get("text"), str):
                invalid(f"{where}.{key}[{k}].text", "must be a string")
        out[key] = [{"type": part_type, "text": p["text"]} for p in parts]
    encrypted = item.get("encrypted_content")
    if encrypted is not None:
        if not isinstance(encrypted, str):
            invalid(f"{where}.encrypted_content", "must be a string")
        out["encrypted_content"] = encrypted
    return out


def _content(raw: Any, role: str, where: str) -> list[JSON]:
    assistant = role == "assistant"
    if isinstance(raw, str):
        if assistant:
            return [{"type": "output_text", "text": raw, "annotations": [], "logprobs": []}]
        return [{"type": "input_text", "text": raw}]
    if not isinstance(raw, list):
        invalid(where, "must be a string or an array of content parts")
    parts: list[JSON] = []
    for k, part in enumerate(raw):
        at = f"{where}[{k}]"
        if not isinstance(part, dict):
            invalid(at, "must be an object")
        kind = part.get("type")
        if assistant and kind in ("output_text", "refusal"):
            key = "text" if kind == "output_text" else "refusal"
            if not isinstance(part.get(key), str):
                invalid(f"{at}.{key}", "must be a string")
            if kind == "refusal":
                parts.append({"type": "refusal", "refusal": part[key]})
            else:
                parts.append(
                    {"type": "output_text", "text": part[key], "annotations": [], "logprobs": []}
                )
        elif assistant:
            invalid(f"{at}.type", "assistant content is output_text or refusal parts")
        elif role in ("system", "developer") and kind != "input_text":
            invalid(f"{at}.type", f"only input_text parts are allowed for role {role!r}")
        else:
            parts.append(_input_part(part, at))
    return parts


def _input_part(part: Any, at: str) -> JSON:
    if not isinstance(part, dict):
        invalid(at, "must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text"):  # output_text: an echoed answer, read as text
        if not isinstance(part.get("text"), str):
            invalid(f"{at}.text", "must be a string")
        return {"type": "input_text", "text": part["text"]}
    if kind == "input_image":
        if part.get("file_id") is not None:
            invalid(f"{at}.file_id", "file ids are not supported: send image_url")
        url = part.get("image_url")
        _image(url, f"{at}.image_url")
        detail = part.get("detail", "auto")
        if detail not in ("low", "high", "auto", "original"):
            invalid(f"{at}.detail", "must be low, high, auto or original")
        return {"type": "input_image", "image_url": url, "detail": detail}
    if kind == "input_file":
        return _input_file(part, at)
    invalid(f"{at}.type", f"unsupported content part type {kind!r}")


def _input_file(part: JSON, at: str) -> JSON:
    """A PDF inline (`file_data`: a data URL or bare base64) or by `file_url`; a `file_id`
    names a file in OpenAI's Files API, which no provider behind us can read."""
    if part.get("file_id") is not None:
        invalid(f"{at}.file_id", "file ids are not supported: send file_data or file_url")
    filename = part.get("filename")
    if filename is not None and not isinstance(filename, str):
        invalid(f"{at}.filename", "must be a string")
    out: JSON = {"type": "input_file"}
    if filename is not None:
        out["filename"] = filename
    url = part.get("file_url")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            invalid(f"{at}.file_url", "must be an http(s) URL")
        return {**out, "file_url": url}
    _pdf(part.get("file_data"), f"{at}.file_data")
    return {**out, "file_data": part["file_data"]}


def _pdf(data: Any, where: str) -> str:
    """The base64 of a PDF given as `data:application/pdf;base64,...` or bare base64."""
    if not isinstance(data, str) or not data:
        invalid(where, "is required (or file_url)")
    if data.startswith("data:"):
        header, sep, data = data[5:].partition(",")
        if not sep or header != "application/pdf;base64":
            invalid(where, "a data URL must be data:application/pdf;base64,<data>")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        invalid(where, "does not hold valid base64")
    return str(data)


def _image(url: Any, where: str) -> ImageBlock:
    if not isinstance(url, str) or not url:
        invalid(where, "is required")
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        media_type = header.removesuffix(";base64")
        if not sep or not header.endswith(";base64") or not media_type.startswith("image/"):
            invalid(where, "a data URL must be data:image/<type>;base64,<data>")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            invalid(where, "the data URL does not hold valid base64")
        return ImageBlock(media_type=media_type, data=data)
    if url.startswith(("http://", "https://")):
        return ImageBlock(url=url)
    invalid(where, "must be an http(s) URL or a data: URL")


def _arguments(text: str, where: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        invalid(where, "is not valid JSON")
    if not isinstance(parsed, dict):
        invalid(where, "must encode a JSON object")
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
            name = flat_name(namespace, item["name"]) if namespace else item["name"]
            turns.add("assistant", [ToolUseBlock(item["call_id"], name, arguments)])
        elif kind == "custom_tool_call":
            namespace = item.get("namespace")
            name = flat_name(namespace, item["name"]) if namespace else item["name"]
            call = ToolUseBlock(item["call_id"], name, {"input": item["input"]})
            turns.add("assistant", [call])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item["output"]
            parts: tuple[TextBlock | ImageBlock, ...]
            if isinstance(output, str):
                parts = (TextBlock(output),) if output else ()
            else:
                blocks = [_block(p, f"{field}[{i}].output") for p in output]
                if any(isinstance(b, DocumentBlock) for b in blocks):
                    invalid(f"{field}[{i}].output", "input_file parts are not supported here")
                parts = tuple(b for b in blocks if not isinstance(b, DocumentBlock))
            turns.add("user", [ToolResultBlock(item["call_id"], parts)], tool_output=True)
        elif kind == "reasoning":
            texts = [p["text"] for p in item.get("content") or item.get("summary") or []]
            signature = item.get("encrypted_content")
            if texts or signature:
                turns.add("assistant", [ThinkingBlock("\n\n".join(texts), signature)])
    messages = [Message(role, tuple(blocks)) for role, blocks in turns.items if blocks]
    return system, messages


def _block(part: JSON, where: str) -> TextBlock | ImageBlock | DocumentBlock:
    if part["type"] == "input_image":
        return _image(part["image_url"], where)
    if part["type"] == "input_file":
        title = part.get("filename")
        if "file_url" in part:
            return DocumentBlock(url=part["file_url"], title=title)
        data = _pdf(part["file_data"], f"{where}.file_data")
        return DocumentBlock(media_type="application/pdf", data=data, title=title)
    return TextBlock(part["text"])
