"""Stream events -> the Responses API's typed SSE events, in OpenAI's order and framing
(`event: <type>\\ndata: <json>\\n\\n`, each with its `sequence_number` from 0).

    response.created, response.in_progress
    per block, in order (output_index 0, 1, ...):
      text:      output_item.added (message), content_part.added (output_text),
                 output_text.delta..., output_text.done, content_part.done, output_item.done
      thinking:  output_item.added (reasoning), then with summaries
                 reasoning_summary_part.added, reasoning_summary_text.delta..., .done,
                 reasoning_summary_part.done; else content_part.added (reasoning_text),
                 reasoning_text.delta..., .done, content_part.done; output_item.done
      tool use:  output_item.added (function_call), function_call_arguments.delta...,
                 function_call_arguments.done, output_item.done; a custom tool's call:
                 output_item.added (custom_tool_call), then at its end (its text is in the
                 JSON arguments) custom_tool_call_input.delta and .done, output_item.done
    response.completed (or response.incomplete)   -- `terminal`, held back: see below
    on failure: error, then response.failed

The terminal event is not among `feed`'s frames: the endpoint stores the response first
and sends it after (`terminal_frame`), so a caller chaining on `previous_response_id` as
soon as it reads it always finds it.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator._json import dumps
from orchestrator.errors import OrchestratorError
from orchestrator.providers._responses_format.answer import (
    caller_name,
    custom_call_item,
    custom_input,
    function_call_item,
    message_item,
    reasoning_item,
    response_object,
    status_of,
)
from orchestrator.providers._responses_format.items import item_id
from orchestrator.providers._responses_format.request import ResponsesRequest
from orchestrator.providers._types import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageEnd,
    MessageStart,
    StreamEvent,
    Usage,
)

__all__ = ["EventEncoder", "sse_event"]

JSON = dict[str, Any]


def sse_event(data: JSON) -> bytes:
    """One frame as OpenAI writes them: the event's type as the SSE event name."""
    name: str = data["type"]
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


class _Open:
    """The output item being streamed (a tool's name and namespace as the caller has them)."""

    def __init__(
        self,
        kind: str,
        id: str,
        index: int,
        name: str = "",
        call_id: str = "",
        namespace: str | None = None,
    ) -> None:
        self.kind = kind
        self.id = id
        self.index = index
        self.name = name
        self.call_id = call_id
        self.namespace = namespace
        self.text: list[str] = []


class EventEncoder:
    """One streamed Response. `feed` returns the events for each stream event; `final` is
    the Response object once the stream ended (completed, incomplete or failed), the one
    to store; `terminal_frame` the held-back last event."""

    def __init__(self, request: ResponsesRequest, *, id: str, model: str, created_at: int) -> None:
        self.request = request
        self.id = id
        self.model = model
        self.created_at = created_at
        self.output: list[JSON] = []
        self.final: JSON | None = None
        self.terminal: JSON | None = None
        self._seq = 0
        self._started = False
        self._open: _Open | None = None
        self._input_tokens = 0

    def _event(self, type: str, **fields: Any) -> JSON:
        event = {"type": type, **fields, "sequence_number": self._seq}
        self._seq += 1
        return event

    def _response(self, status: str, usage: Usage | None = None, **extra: Any) -> JSON:
        return response_object(
            self.request,
            id=self.id,
            model=self.model,
            created_at=self.created_at,
            status=status,
            output=list(self.output),
            usage=usage,
            **extra,
        )

    def _start(self) -> list[JSON]:
        self._started = True
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    def feed(self, event: StreamEvent) -> list[JSON]:
        out = [] if self._started else self._start()
        if isinstance(event, MessageStart):
            self._input_tokens = event.input_tokens
        elif isinstance(event, BlockStart):
            out.extend(self._open_block(event))
        elif isinstance(event, BlockDelta):
            out.extend(self._delta(event.text))
        elif isinstance(event, BlockStop):
            out.extend(self._close_block(getattr(event, "signature", None)))
        elif isinstance(event, MessageEnd):
            out.extend(self._close_block(None))
            usage = event.usage
            if not usage.input_tokens and self._input_tokens:
                usage = Usage(self._input_tokens, usage.output_tokens)
            status, incomplete = status_of(event.stop_reason)
            self.final = self._response(status, usage, incomplete=incomplete)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            self.terminal = self._event(kind, response=self.final)
        return out

    def frames(self, event: StreamEvent) -> bytes:
        return b"".join(sse_event(e) for e in self.feed(event))

    def terminal_frame(self) -> bytes:
        return sse_event(self.terminal) if self.terminal is not None else b""

    def error_frames(self, exc: OrchestratorError) -> bytes:
        """A failure mid-stream: OpenAI's `error` event, then `response.failed` (with what
        was produced so far)."""
        out = [] if self._started else self._start()
        code = "rate_limit_exceeded" if exc.status_code == 429 else "server_error"
        out.append(self._event("error", code=code, message=exc.message, param=None))
        self._open = None  # an item cut short is not part of the output
        self.final = self._response("failed", error={"code": code, "message": exc.message})
        self.terminal = None  # a failure after the end: no response.completed after this
        out.append(self._event("response.failed", response=self.final))
        return b"".join(sse_event(e) for e in out)

    # --- items ---------------------------------------------------------------------------
    def _open_block(self, event: BlockStart) -> list[JSON]:
        out = self._close_block(None)  # one block at a time: a missing stop closes it
        index = len(self.output)
        summary = self.request.summary
        if event.block_type == "tool_use":
            namespace, name = caller_name(self.request, event.name or "")
            custom = event.name in self.request.custom_tools
            kind, prefix = ("custom", "ctc") if custom else ("function_call", "fc")
            block = _Open(kind, item_id(prefix), index, name, event.id or "", namespace)
            if custom:
                item = custom_call_item(block.id, block.call_id, name, "", "in_progress", namespace)
            else:
                item = function_call_item(
                    block.id, block.call_id, name, "", "in_progress", namespace
                )
            self._open = block
            return [*out, self._event("response.output_item.added", output_index=index, item=item)]
        if event.block_type == "thinking":
            block = _Open("reasoning", item_id("rs"), index)
            item = reasoning_item(block.id, None, None, summary, "in_progress")
            self._open = block
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            if summary:
                part = {"type": "summary_text", "text": ""}
                out.append(self._summary_event("response.reasoning_summary_part.added", part=part))
            else:
                part = {"type": "reasoning_text", "text": ""}
                out.append(self._part_event("response.content_part.added", part=part))
            return out
        if event.block_type != "text":  # a kind this format has no item for: skipped
            self._open = _Open("skip", "", index)
            return out
        block = _Open("message", item_id("msg"), index)
        self._open = block
        item = message_item(block.id, "", "in_progress")
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        text_part: JSON = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        out.append(self._part_event("response.content_part.added", part=text_part))
        return out

    def _part_event(self, type: str, **fields: Any) -> JSON:
        assert self._open is not None
        return self._event(
            type, item_id=self._open.id, output_index=self._open.index, content_index=0, **fields
        )

    def _summary_event(self, type: str, **fields: Any) -> JSON:
        assert self._open is not None
        return self._event(
            type, item_id=self._open.id, output_index=self._open.index, summary_index=0, **fields
        )

    def _delta(self, text: str) -> list[JSON]:
        block = self._open
        if block is None or not text or block.kind == "skip":
            return []
        block.text.append(text)
        if block.kind == "custom":
            return []  # JSON fragments: the text is known once they are all in
        if block.kind == "function_call":
            return [
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=block.id,
                    output_index=block.index,
                    delta=text,
                )
            ]
        if block.kind == "reasoning":
            if self.request.summary:
                return [self._summary_event("response.reasoning_summary_text.delta", delta=text)]
            return [self._part_event("response.reasoning_text.delta", delta=text)]
        return [self._part_event("response.output_text.delta", delta=text, logprobs=[])]

    def _close_block(self, signature: str | None) -> list[JSON]:
        block = self._open
        if block is None:
            return []
        self._open = None
        if block.kind == "skip":
            return []
        text = "".join(block.text)
        out: list[JSON] = []
        if block.kind == "custom":
            try:
                parsed = json.loads(text) if text else {}
            except ValueError:
                parsed = {"input": text}
            given = custom_input(parsed if isinstance(parsed, dict) else {"input": text})
            item = custom_call_item(
                block.id, block.call_id, block.name, given, "completed", block.namespace
            )
            where = {"item_id": block.id, "output_index": block.index}
            out.append(self._event("response.custom_tool_call_input.delta", **where, delta=given))
            out.append(self._event("response.custom_tool_call_input.done", **where, input=given))
        elif block.kind == "function_call":
            arguments = text or "{}"
            item = function_call_item(
                block.id, block.call_id, block.name, arguments, "completed", block.namespace
            )
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=block.id,
                    name=block.name,
                    output_index=block.index,
                    arguments=arguments,
                )
            )
        elif block.kind == "reasoning":
            self._open = block  # for the part events' ids
            if self.request.summary:
                part = {"type": "summary_text", "text": text}
                out.append(self._summary_event("response.reasoning_summary_text.done", text=text))
                out.append(self._summary_event("response.reasoning_summary_part.done", part=part))
            else:
                part = {"type": "reasoning_text", "text": text}
                out.append(self._part_event("response.reasoning_text.done", text=text))
                out.append(self._part_event("response.content_part.done", part=part))
            self._open = None
            item = reasoning_item(block.id, text, signature, self.request.summary)
        else:
            self._open = block
            text_part: JSON = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": [],
            }
            out.append(self._part_event("response.output_text.done", text=text, logprobs=[]))
            out.append(self._part_event("response.content_part.done", part=text_part))
            self._open = None
            item = message_item(block.id, text)
        self.output.append(item)
        out.append(self._event("response.output_item.done", output_index=block.index, item=item))
        return out
