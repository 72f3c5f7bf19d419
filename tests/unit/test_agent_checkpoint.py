"""A parked task's sealed conversation (orchestrator/agents/_checkpoint.py, issue 32): every
content block type comes back as it went in (a thinking block's signature, an image, a tool
result's image and error flag included), the counters too; another key, a tampered box and
an unknown version cannot be opened."""

from __future__ import annotations

import json

import pytest
from cryptography.fernet import Fernet

from orchestrator.agents._checkpoint import (
    Checkpoint,
    CheckpointUnreadable,
    seal,
    unseal,
)
from orchestrator.providers import (
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
    "awAAAABJRU5ErkJggg=="
)


def _checkpoint() -> Checkpoint:
    first = ToolUseBlock("call-1", "http__pay", {"amount": 5, "api_key": "sk-live-1", "to": [1]})
    second = ToolUseBlock("call-2", "calculate", {"expression": "6*7"})
    return Checkpoint(
        messages=(
            Message(
                "user",
                (
                    TextBlock("## Task\npay the invoice"),
                    ImageBlock(media_type="image/png", data=PNG),
                    ImageBlock(url="https://example.com/invoice.png"),
                ),
            ),
            Message(
                "assistant",
                (
                    ThinkingBlock("the user wants it paid", signature="EqQBCkYIBRgCKkD=="),
                    ThinkingBlock("unsigned reasoning"),
                    RedactedThinkingBlock("EmwKAhgBEgy3va3pzix"),
                    TextBlock("Paying."),
                    ToolUseBlock("call-0", "lookup", {}),
                ),
            ),
            Message(
                "user",
                (
                    ToolResultBlock(
                        "call-0",
                        (TextBlock("found"), ImageBlock(media_type="image/png", data=PNG)),
                        is_error=False,
                    ),
                ),
            ),
            Message("assistant", (TextBlock("both"), first, second)),
        ),
        done=(ToolResultBlock("call-x", (TextBlock("error: nope"),), is_error=True),),
        index=0,
        turn=2,
        tool_calls=3,
        model="fake-agent",
        max_tokens=1024,
        calls={"lookup:{}": 1, 'http__pay:{"amount": 5}': 1},
        warned=("lookup:{}",),
        note="\n[warning: ...]",
    )


def test_every_block_type_round_trips() -> None:
    box = Fernet(Fernet.generate_key())
    original = _checkpoint()
    sealed = seal(original, box)
    back = unseal(sealed, box)
    assert back == original
    assert back.messages[1].content[0] == ThinkingBlock(
        "the user wants it paid", signature="EqQBCkYIBRgCKkD=="
    )
    assert isinstance(back.messages[2].content[0], ToolResultBlock)
    assert back.messages[2].content[0].content[1] == ImageBlock(media_type="image/png", data=PNG)
    assert [u.id for u in back.uses] == ["call-1", "call-2"]
    assert dict(back.calls) == dict(original.calls) and back.warned == ("lookup:{}",)


def test_sealed_means_nothing_readable_is_stored() -> None:
    box = Fernet(Fernet.generate_key())
    sealed = seal(_checkpoint(), box)
    for plain in (b"sk-live-1", b"http__pay", b"invoice"):
        assert plain not in sealed


def test_another_key_or_a_tampered_box_cannot_unseal() -> None:
    sealed = seal(_checkpoint(), Fernet(Fernet.generate_key()))
    with pytest.raises(CheckpointUnreadable):
        unseal(sealed, Fernet(Fernet.generate_key()))
    box = Fernet(Fernet.generate_key())
    good = bytearray(seal(_checkpoint(), box))
    good[40] ^= 1
    with pytest.raises(CheckpointUnreadable):
        unseal(bytes(good), box)


def test_an_unknown_version_or_block_is_refused() -> None:
    box = Fernet(Fernet.generate_key())
    data = _checkpoint().to_json()
    with pytest.raises(CheckpointUnreadable):
        unseal(box.encrypt(json.dumps({**data, "v": 99}).encode()), box)
    data["messages"][0]["content"].append({"type": "audio", "data": "x"})
    with pytest.raises(CheckpointUnreadable):
        unseal(box.encrypt(json.dumps(data).encode()), box)
