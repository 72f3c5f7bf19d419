"""A chat-completions request as this server reads it: the body's fields (`ChatBody`), the
checks that make an unsupported one a 400 before the one turn is taken (`chat_messages`), the
`response_format` schema and its grammar, and errors in llama-server's shape (`ApiError`).

Separate from generation (which takes a request already judged) and from HTTP (which only
turns `ApiError` into a response).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

__all__ = [
    "ApiError",
    "ChatBody",
    "ChatMessageIn",
    "StreamOptions",
    "bad_request",
    "chat_messages",
    "json_grammar",
    "json_schema",
]


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatBody(BaseModel):
    """The chat-completions fields this server reads; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessageIn] = Field(min_length=1)
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n_predict: int | None = None
    temperature: float = Field(0.8, ge=0)
    top_p: float = Field(0.95, ge=0, le=1)
    top_k: int = Field(40, ge=0)
    min_p: float = Field(0.05, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = Field(1.0, ge=0)
    repeat_last_n: int = Field(64, ge=-1)
    n: int = 1
    ignore_eos: bool = False  # llama-server's: generate until the limit
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None

    @property
    def limit(self) -> int | None:
        for value in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if value is not None:
                return None if value < 0 else value
        return None

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


class ApiError(Exception):
    """An error answered in llama-server's (OpenAI's) shape."""

    def __init__(self, status: int, message: str, kind: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.kind}}

    def response(self) -> JSONResponse:
        body = self.body()
        body["error"].update(self.extra)
        return JSONResponse(body, status_code=self.status)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def chat_messages(body: ChatBody) -> list[dict[str, str]]:
    """Plain {role, content} messages for the chat template."""
    if body.n != 1:
        raise bad_request("only one choice (n=1) is supported")
    if body.tools:
        # llama-server answers the same without --jinja.
        raise bad_request("tools are not supported by this server")
    if body.logprobs or body.top_logprobs:
        # Not computed here: answering `logprobs: null` to a caller who asked would look
        # like an answer.
        raise bad_request("logprobs are not supported by this server")
    json_schema(body)  # a bad response_format is a 400 before the turn is taken
    out: list[dict[str, str]] = []
    for i, m in enumerate(body.messages):
        role = "system" if m.role == "developer" else m.role
        if role not in ("system", "user", "assistant"):
            raise bad_request(f"messages[{i}]: role {m.role!r} is not supported")
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            parts: list[str] = []
            for part in m.content:
                if part.get("type") != "text":
                    raise bad_request(
                        f"messages[{i}]: {part.get('type')!r} content is not supported "
                        "(this server has no multimodal projector)"
                    )
                parts.append(str(part.get("text") or ""))
            text = "".join(parts)
        out.append({"role": role, "content": text})
    return out


def json_schema(body: ChatBody) -> dict[str, Any] | None:
    """The JSON schema `response_format` asks the answer to follow (None: free text), as
    llama-server: `json_object` any JSON object, `json_schema` its `schema`."""
    fmt = body.response_format or {}
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        given = fmt.get("schema")  # llama-server's extension
        return given if isinstance(given, dict) else {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise bad_request("response_format.json_schema.schema must be an object")
        schema: dict[str, Any] = spec.get("schema") or {}
        return schema
    raise bad_request(
        f"response_format: type {kind!r} is not supported (text, json_object, json_schema)"
    )


SPACE_RULE = re.compile(r"^space ::= .*$", re.MULTILINE)


def json_grammar(schema: dict[str, Any]) -> str:
    """GBNF for `schema` (llama.cpp's converter, as cyllama ships it); 400 if it cannot."""
    from cyllama.utils.json_schema_to_grammar import json_schema_to_grammar

    try:
        grammar = str(json_schema_to_grammar(schema))
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise bad_request(f"response_format: the schema cannot be enforced: {exc}") from None
    # The converter lets whitespace be up to two newlines and 20 tabs, after the closing
    # brace too: a small model then pads with whitespace until max_tokens instead of ending
    # (seen with SmolLM2). One optional space keeps the JSON compact and, once the object is
    # closed, leaves the end of generation as the only choice.
    return SPACE_RULE.sub('space ::= | " "', grammar)
