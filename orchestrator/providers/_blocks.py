"""`BlockWriter`: turns flat deltas (text, reasoning, tool-call fragments keyed by the
provider's tool index) into the ordered block events of the internal stream; and the ids an
adapter makes where its provider gives none (a message's, a tool call's)."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from orchestrator.providers._types import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageEnd,
    StopReason,
    StreamEvent,
    Usage,
)

__all__ = ["BlockWriter", "new_message_id", "tool_call_id"]


def new_message_id(provider: str) -> str:
    return f"{provider}-{uuid.uuid4().hex[:24]}"


def tool_call_id(given: Any, n: int, salt: str, name: str, args: dict[str, Any]) -> str:
    """The provider's id of the n-th tool call of a reply when it `given` one, else
    `call_<n>_<hash>`: the same for the same reply (stable across a retry of the decoding),
    different across replies (`salt`: the reply's id or timestamp)."""
    if isinstance(given, str) and given:
        return given
    digest = hashlib.sha256(
        json.dumps([salt, n, name, args], sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()[:16]
    return f"call_{n}_{digest}"


@dataclass
class BlockWriter:
    """One open block at a time, indices 0, 1, 2... A change of kind (text -> tool call, or
    tool call 0 -> tool call 1) closes the open block first. Each method returns the events
    to emit, in order."""

    _next: int = 0
    _open: tuple[str, object] | None = None  # (kind, key) of the open block
    _open_index: int = -1
    _tool_blocks: dict[object, int] = field(default_factory=dict)
    _signature: str | None = None
    saw_tool: bool = False

    def _switch(self, kind: str, key: object, start: BlockStart | None) -> list[StreamEvent]:
        if self._open == (kind, key):
            return []
        out: list[StreamEvent] = self.close()
        self._open, self._open_index = (kind, key), self._next
        self._next += 1
        if start is not None:
            out.append(
                BlockStart(self._open_index, start.block_type, start.id, start.name)  # reindexed
            )
        return out

    def text(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        out = self._switch("text", None, BlockStart(0, "text"))
        out.append(BlockDelta(self._open_index, text))
        return out

    def thinking(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        out = self._switch("thinking", None, BlockStart(0, "thinking"))
        out.append(BlockDelta(self._open_index, text))
        return out

    def tool_start(self, key: object, id: str, name: str) -> list[StreamEvent]:
        """A tool call begins (`key`: the provider's tool-call index or id)."""
        self.saw_tool = True
        out = self._switch("tool", key, BlockStart(0, "tool_use", id, name))
        self._tool_blocks[key] = self._open_index
        return out

    def tool_args(self, key: object, fragment: str) -> list[StreamEvent]:
        """More argument text for a started call. A fragment for a call that is not the
        open block (providers do not interleave, but be safe) is dropped only if empty."""
        if not fragment:
            return []
        if self._open != ("tool", key):
            # Arguments for an earlier call after another block opened: cannot be
            # represented in a strictly sequential block stream. Providers stream calls
            # one after another; treat a stray fragment as a protocol error upstream.
            raise ValueError(f"tool-call fragment for call {key!r} after it was closed")
        return [BlockDelta(self._open_index, fragment)]

    def sign(self, signature: str) -> None:
        """The open thinking block's signature (sent with its BlockStop)."""
        self._signature = (self._signature or "") + signature

    def close(self) -> list[StreamEvent]:
        if self._open is None:
            return []
        index, signature = self._open_index, self._signature
        self._open, self._open_index, self._signature = None, -1, None
        return [BlockStop(index, signature=signature)]

    def finish(self, stop_reason: StopReason, usage: Usage) -> list[StreamEvent]:
        """Close the open block and end the message. A provider that reports `stop` while
        having called tools is reported as `tool_use` (what the caller must act on)."""
        if self.saw_tool and stop_reason == "end_turn":
            stop_reason = "tool_use"
        return [*self.close(), MessageEnd(stop_reason, usage)]
