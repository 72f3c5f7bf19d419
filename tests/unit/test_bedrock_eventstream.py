"""The AWS event-stream framing: frames built by the Bedrock fake's encoder decode, through
botocore's parser in the adapter's `EventStreamDecoder`, into the right events however the
bytes are split; exception frames and damaged frames become ProviderErrors."""

from __future__ import annotations

import json
import random
import struct

import pytest
from botocore.eventstream import EventStreamBuffer

from orchestrator.providers import ProviderError
from orchestrator.providers._bedrock import EventStreamDecoder
from tests.fakes.bedrock_server import (
    BedrockTurn,
    encode_frame,
    event_frame,
    exception_frame,
)

TURN = BedrockTurn(
    text="Hello, world!",
    reasoning="Think first.",
    reasoning_signature="sig-abc",
    tool_uses=[{"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Paris"}}],
    stop_reason="tool_use",
    input_tokens=31,
    output_tokens=17,
)


def _expected() -> list[tuple[str, dict[str, object]]]:
    return [
        (kind, {**payload, "p": "abcdefgh"[: 1 + n % 8]})
        for n, (kind, payload) in enumerate(TURN.events())
    ]


def _body() -> bytes:
    return b"".join(
        event_frame(kind, payload, pad=1 + n % 8) for n, (kind, payload) in enumerate(TURN.events())
    )


def _decode(chunks: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    decoder = EventStreamDecoder("bedrock")
    out = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    decoder.finish()
    return out


def test_encoder_frames_are_what_botocore_parses() -> None:
    frame = event_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}})
    buffer = EventStreamBuffer()
    buffer.add_data(frame)
    [message] = list(buffer)
    assert message.prelude.total_length == len(frame)
    assert message.headers == {
        ":event-type": "contentBlockDelta",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    assert json.loads(message.payload) == {"contentBlockIndex": 0, "delta": {"text": "Hi"}}
    # Layout: total length, headers length, prelude CRC, headers, payload, message CRC.
    total, headers_length = struct.unpack("!II", frame[:8])
    assert total == len(frame)
    assert 12 + headers_length + len(message.payload) + 4 == total


def test_whole_body_decodes_into_the_turns_events() -> None:
    assert _decode([_body()]) == _expected()
    kinds = [kind for kind, _ in _expected()]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]


def test_every_two_way_split_decodes_the_same() -> None:
    body = _body()
    expected = _expected()
    for cut in range(1, len(body)):
        assert _decode([body[:cut], body[cut:]]) == expected, cut


def test_byte_by_byte_and_random_chunks_decode_the_same() -> None:
    body = _body()
    expected = _expected()
    assert _decode([body[i : i + 1] for i in range(len(body))]) == expected
    rng = random.Random(7)
    for _ in range(50):
        chunks, i = [], 0
        while i < len(body):
            step = rng.randint(1, 97)
            chunks.append(body[i : i + step])
            i += step
        assert _decode(chunks) == expected


def test_events_are_released_as_soon_as_their_frame_is_complete() -> None:
    first = event_frame("messageStart", {"role": "assistant"})
    second = event_frame("messageStop", {"stopReason": "end_turn"})
    decoder = EventStreamDecoder("bedrock")
    assert decoder.feed(first[:-1]) == []
    assert decoder.feed(first[-1:] + second[:5]) == [("messageStart", {"role": "assistant"})]
    assert decoder.feed(second[5:]) == [("messageStop", {"stopReason": "end_turn"})]
    decoder.finish()


@pytest.mark.parametrize(
    ("exception", "status", "retryable"),
    [
        ("throttlingException", 429, True),
        ("validationException", 400, False),
        ("internalServerException", 500, True),
        ("modelStreamErrorException", 424, True),
        ("serviceUnavailableException", 503, True),
    ],
)
def test_exception_frames_raise_provider_errors(
    exception: str, status: int, retryable: bool
) -> None:
    decoder = EventStreamDecoder("bedrock")
    body = event_frame("messageStart", {"role": "assistant"}) + exception_frame(
        exception, "Something went wrong."
    )
    with pytest.raises(ProviderError) as info:
        decoder.feed(body)
    err = info.value
    assert err.upstream_status == status
    assert err.retryable is retryable
    assert err.message == f"bedrock: {exception}: Something went wrong."
    assert err.provider == "bedrock"


def test_error_frames_raise_with_their_code_and_message() -> None:
    frame = encode_frame(
        [
            (":message-type", "error"),
            (":error-code", "InternalFailure"),
            (":error-message", "We encountered an internal error."),
        ],
        b"",
    )
    with pytest.raises(ProviderError) as info:
        EventStreamDecoder("bedrock").feed(frame)
    assert info.value.upstream_status == 500
    assert "InternalFailure: We encountered an internal error." in info.value.message


def test_a_damaged_frame_is_a_provider_error() -> None:
    frame = bytearray(
        event_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "x"}})
    )
    frame[-6] ^= 0xFF  # inside the payload: the message CRC no longer matches
    with pytest.raises(ProviderError, match="corrupt event stream"):
        EventStreamDecoder("bedrock").feed(bytes(frame))
    prelude = bytearray(event_frame("messageStart", {"role": "assistant"}))
    prelude[9] ^= 0x01  # the prelude CRC
    with pytest.raises(ProviderError, match="corrupt event stream"):
        EventStreamDecoder("bedrock").feed(bytes(prelude))


def test_a_body_ending_inside_a_frame_is_a_provider_error() -> None:
    frame = event_frame("messageStart", {"role": "assistant"})
    decoder = EventStreamDecoder("bedrock")
    assert decoder.feed(frame + frame[:10]) == [("messageStart", {"role": "assistant"})]
    with pytest.raises(ProviderError, match="ended inside a frame") as info:
        decoder.finish()
    assert info.value.retryable is True
