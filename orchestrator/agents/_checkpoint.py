"""A parked agent task's conversation (issue 32): what a run stopped at a tool call under an
`ask` rule needs to go on, on any worker, once a person has decided.

Why sealed: it holds the raw tool arguments and results (secrets included, which events and
the API only ever show masked), so it is stored encrypted with the deployment's box
(`configured_box`, the one that seals channel tokens) and only the runner opens it.

Why every block type has its own case: the conversation goes back to the model as it was.
Anthropic refuses a tool turn whose thinking block lost its `signature`, and an image a
tool returned must still be there, so nothing is dropped or flattened to text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from orchestrator.providers import (
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from orchestrator.providers._types import Block

__all__ = ["VERSION", "Checkpoint", "CheckpointUnreadable", "seal", "unseal"]

VERSION = 1


class CheckpointUnreadable(Exception):
    """Sealed by another key, tampered with, or of an unknown version."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a run stopped: the conversation (its last message the assistant turn whose
    call `index` waits), this turn's results before that call (`done`), and the loop's
    counters, so limits count across the wait as they would have without it."""

    messages: tuple[Message, ...]
    done: tuple[ToolResultBlock, ...]
    index: int
    turn: int
    tool_calls: int
    model: str
    max_tokens: int
    calls: Mapping[str, int] = field(default_factory=dict)
    warned: tuple[str, ...] = ()
    note: str = ""  # the loop warning the waiting call's result carries, if any

    @property
    def uses(self) -> list[ToolUseBlock]:
        """The calls of the turn that waits."""
        return [b for b in self.messages[-1].content if isinstance(b, ToolUseBlock)]

    def to_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "messages": [
                {"role": m.role, "content": [_block(b) for b in m.content]} for m in self.messages
            ],
            "done": [_block(b) for b in self.done],
            "index": self.index,
            "turn": self.turn,
            "tool_calls": self.tool_calls,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "calls": dict(self.calls),
            "warned": list(self.warned),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        if data.get("v") != VERSION:
            raise CheckpointUnreadable(f"checkpoint version {data.get('v')!r}")
        done = tuple(_from_block(b) for b in data["done"])
        if not all(isinstance(b, ToolResultBlock) for b in done):
            raise CheckpointUnreadable("a done result is not a tool_result block")
        return cls(
            messages=tuple(
                Message(m["role"], tuple(_from_block(b) for b in m["content"]))
                for m in data["messages"]
            ),
            done=done,  # type: ignore[arg-type]
            index=int(data["index"]),
            turn=int(data["turn"]),
            tool_calls=int(data["tool_calls"]),
            model=str(data["model"]),
            max_tokens=int(data["max_tokens"]),
            calls={str(k): int(v) for k, v in data.get("calls", {}).items()},
            warned=tuple(data.get("warned", ())),
            note=str(data.get("note", "")),
        )


def seal(checkpoint: Checkpoint, box: Fernet) -> bytes:
    return box.encrypt(json.dumps(checkpoint.to_json(), separators=(",", ":")).encode())


def unseal(sealed: bytes, box: Fernet) -> Checkpoint:
    try:
        data = json.loads(box.decrypt(bytes(sealed)))
    except (InvalidToken, ValueError) as exc:
        raise CheckpointUnreadable("the checkpoint cannot be opened with this key") from exc
    try:
        return Checkpoint.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointUnreadable(f"malformed checkpoint: {exc!r}") from exc


def _block(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        return {
            "type": "image",
            "media_type": block.media_type,
            "data": block.data,
            "url": block.url,
        }
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "text": block.text, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):  # Anthropic's, kept for its next turn
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ToolResultBlock):
        return {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": [_block(b) for b in block.content],
            "is_error": block.is_error,
        }
    raise TypeError(f"no checkpoint case for {type(block).__name__}")


def _from_block(data: Mapping[str, Any]) -> Block:
    kind = data.get("type")
    if kind == "text":
        return TextBlock(data["text"])
    if kind == "image":
        return ImageBlock(data.get("media_type"), data.get("data"), data.get("url"))
    if kind == "thinking":
        return ThinkingBlock(data["text"], data.get("signature"))
    if kind == "redacted_thinking":
        return RedactedThinkingBlock(data["data"])
    if kind == "tool_use":
        return ToolUseBlock(data["id"], data["name"], dict(data["input"]))
    if kind == "tool_result":
        content = tuple(_from_block(b) for b in data["content"])
        if not all(isinstance(b, TextBlock | ImageBlock) for b in content):
            raise CheckpointUnreadable("a tool result holds only text and images")
        return ToolResultBlock(
            data["tool_use_id"],
            content,  # type: ignore[arg-type]
            bool(data.get("is_error", False)),
        )
    raise CheckpointUnreadable(f"unknown block type {kind!r}")
