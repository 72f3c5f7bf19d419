"""A prompt's size in tokens where no provider counts it (`/messages/count_tokens` for a
model whose provider has no counting endpoint, or whose counting failed).

The estimate is the rule memory already uses for a provider's tokens (orchestrator/memory:
UTF-8 bytes / 4, OpenAI's rule of thumb), applied to what the model reads: the system
prompt, every block's text (tool calls' and results' JSON included), the tool definitions,
and a fixed cost per image or document. It is marked as an estimate to the caller.
"""

from __future__ import annotations

import json

from orchestrator.providers._types import (
    Block,
    ChatRequest,
    DocumentBlock,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = ["BYTES_PER_TOKEN", "estimate_tokens"]

BYTES_PER_TOKEN = 4
# Anthropic's guide: an image of about 1000x1000 px costs ~1300 tokens; a PDF page ~1500-3000.
IMAGE_TOKENS = 1300
DOCUMENT_TOKENS = 2000


def _size(block: Block) -> tuple[int, int]:
    """(UTF-8 bytes of text, tokens counted directly) of one block."""
    if isinstance(block, (TextBlock, ThinkingBlock)):
        return len(block.text.encode()), 0
    if isinstance(block, ToolUseBlock):
        return len(block.name) + len(json.dumps(block.input).encode()), 0
    if isinstance(block, ToolResultBlock):
        parts = [_size(b) for b in block.content]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(block, ImageBlock):
        return 0, IMAGE_TOKENS
    if isinstance(block, DocumentBlock):
        if block.text is not None:
            return len(block.text.encode()), 0
        return 0, DOCUMENT_TOKENS
    if isinstance(block, RedactedThinkingBlock):
        return len(block.data) * 3 // 4, 0
    return 0, 0


def estimate_tokens(request: ChatRequest) -> int:
    """The prompt of `request` in tokens, estimated (at least 1)."""
    size = len((request.system or "").encode())
    direct = 0
    for message in request.messages:
        for block in message.content:
            b, t = _size(block)
            size, direct = size + b, direct + t
    for tool in request.tools:
        size += len(tool.name) + len((tool.description or "").encode())
        size += len(json.dumps(tool.parameters).encode())
    return max(1, -(-size // BYTES_PER_TOKEN) + direct)
