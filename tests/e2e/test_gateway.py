"""The official `openai` and `anthropic` SDKs against the service started as the README says
(`scripts/serve` with a config file: the e2e modules' shared one, tests/e2e/shared.py), each
routed to an OpenAI-format and an Anthropic-format upstream (real loopback servers speaking
those wire formats, declared as custom providers of each format); Bedrock signed with the
temporary AWS keys (session token included) of the environment the service starts in; and
streams from upstreams whose Content-Type names no charset (llama.cpp's server, Ollama)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.shared import (
    ANTHROPIC_MODEL,
    AWS_TOKEN,
    BEDROCK_MODEL,
    LLAMACPP_MODEL,
    OLLAMA_MODEL,
    OPENAI_MODEL,
    SharedService,
)
from tests.fakes.anthropic_server import FakeAnthropic, text_reply, tool_reply
from tests.fakes.bedrock_server import BedrockFake, BedrockTurn
from tests.fakes.ollama_server import OllamaFake, OllamaTurn
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

pytestmark = pytest.mark.e2e

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}
ANT_TOOL = {
    "name": "lookup",
    "description": "Look a word up",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
}
# 2-, 3- and 4-byte UTF-8 characters, which the upstreams below cut across chunks.
MULTIBYTE = "Grüße, 你好世界 — café € 😀 𝄞 fin"


@dataclass
class Gateway:
    url: str
    token: str
    oai: OpenAIFake
    ant: FakeAnthropic
    bedrock: BedrockFake
    llamacpp: OpenAIFake  # llama-server's headers: `text/event-stream`, no charset
    ollama: OllamaFake  # `application/x-ndjson`, no charset
    # The sync clients handed out, closed with the service (left to the garbage collector,
    # their pooled sockets are reported unclosed in a later test).
    clients: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    def openai(self) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{self.url}/api/v1", api_key=self.token, max_retries=0)
        self.clients.append(client)
        return client

    def async_openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/api/v1", api_key=self.token, max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=f"{self.url}/api", api_key=self.token, max_retries=0)
        self.clients.append(client)
        return client


@pytest.fixture(scope="module")
def gateway(shared_service: SharedService) -> Iterator[Gateway]:
    """The shared service (tests/e2e/shared.py): its configuration routes each model here to
    its loopback upstream, and it starts with the AWS variables Bedrock signs with."""
    s = shared_service
    served = Gateway(s.base_url, s.admin_token, s.oai, s.ant, s.bedrock, s.llamacpp, s.ollama)
    yield served
    for client in served.clients:
        client.close()


@pytest.fixture(autouse=True)
def fresh_upstreams(gateway: Gateway, shared_service: SharedService) -> None:
    shared_service.reset()


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_openai_sdk_sync_text_stream_and_tools(gateway: Gateway, model: str) -> None:
    upstream_is_openai = model == OPENAI_MODEL
    if upstream_is_openai:
        gateway.oai.script(
            [
                FakeReply(text="plain answer", prompt_tokens=9, completion_tokens=2),
                FakeReply(text="streamed answer"),
                FakeReply(tool_calls=[FakeToolCall("lookup", {"word": "ray"}, id="call_1")]),
            ]
        )
    else:
        gateway.ant.enqueue(
            text_reply("plain answer", input_tokens=9, output_tokens=2),
            text_reply("streamed answer"),
            tool_reply("lookup", {"word": "ray"}, id="call_1"),
        )
    client = gateway.openai()
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "plain answer" and r.choices[0].finish_reason == "stop"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (9, 2)

    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "streamed answer"
    )

    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "define ray"}],
        tools=[TOOL],  # type: ignore[list-item]
    )
    client.close()  # its pooled connection to the service, not left to the GC
    call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.id == "call_1" and call.function.name == "lookup"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"word": "ray"}  # type: ignore[union-attr]
    sent = gateway.oai.chat_requests if upstream_is_openai else gateway.ant.requests
    assert len(sent) == 3


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
async def test_openai_sdk_async_streaming_tools(gateway: Gateway, model: str) -> None:
    if model == OPENAI_MODEL:
        gateway.oai.script(
            [FakeReply(text="ok", tool_calls=[FakeToolCall("lookup", {"word": "x"}, id="c9")])]
        )
    else:
        gateway.ant.enqueue(tool_reply("lookup", {"word": "x"}, id="c9", text="ok"))
    client = gateway.async_openai()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "x"}],
        tools=[TOOL],  # type: ignore[list-item]
        stream=True,
        stream_options={"include_usage": True},
    )
    text, args, finish, usage = "", "", None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        text += chunk.choices[0].delta.content or ""
        for tc in chunk.choices[0].delta.tool_calls or []:
            args += tc.function.arguments or ""  # type: ignore[union-attr]
        finish = chunk.choices[0].finish_reason or finish
    await client.close()
    assert text == "ok" and json.loads(args) == {"word": "x"} and finish == "tool_calls"
    assert usage is not None and usage.total_tokens > 0


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_anthropic_sdk_create_and_stream(gateway: Gateway, model: str) -> None:
    if model == OPENAI_MODEL:
        gateway.oai.script(
            [
                FakeReply(text="hello there", prompt_tokens=4, completion_tokens=2),
                FakeReply(
                    text="Using it.",
                    tool_calls=[FakeToolCall("lookup", {"word": "y"}, id="toolu_7")],
                ),
            ]
        )
    else:
        gateway.ant.enqueue(
            text_reply("hello there", input_tokens=4, output_tokens=2),
            tool_reply("lookup", {"word": "y"}, id="toolu_7", text="Using it."),
        )
    client = gateway.anthropic()
    message = client.messages.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].text == "hello there"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 2)

    with client.messages.stream(
        model=model,
        max_tokens=64,
        tools=[ANT_TOOL],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "define y"}],
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    client.close()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert final.content[0].text == "Using it."  # type: ignore[union-attr]
    assert final.content[1].input == {"word": "y"}  # type: ignore[union-attr]


def test_bedrock_signs_with_the_session_token_of_the_environment(gateway: Gateway) -> None:
    """Temporary AWS keys in the environment `scripts/serve` starts in reach the replicas'
    botocore chain whole: the session token is sent (and signed), and AWS's check passes."""
    gateway.bedrock.script(
        BedrockTurn(text="signed with the session token"), BedrockTurn(text="streamed too")
    )
    ask = [{"role": "user", "content": "Hi"}]
    with gateway.openai() as client:
        answer = client.chat.completions.create(model=BEDROCK_MODEL, messages=ask)
        assert answer.choices[0].message.content == "signed with the session token"
        chunks = client.chat.completions.create(model=BEDROCK_MODEL, messages=ask, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed too"
    assert gateway.bedrock.rejected == []
    sent = [r.headers.get("x-amz-security-token") for r in gateway.bedrock.requests]
    assert sent == [AWS_TOKEN, AWS_TOKEN]
    # The model id holds ':', sent percent-encoded as the AWS SDKs do (and as signed).
    assert gateway.bedrock.model_ids == ["amazon.nova-lite-v1:0"] * 2
    assert "%3A" in gateway.bedrock.requests[0].raw_path


def _script_multibyte(gateway: Gateway, model: str, n: int) -> None:
    """`n` streamed answers of MULTIBYTE with CRLF line ends, the body cut every 3 bytes."""
    if model == LLAMACPP_MODEL:
        gateway.llamacpp.script(
            [FakeReply(text=MULTIBYTE, line_end="\r\n", byte_chunk=3) for _ in range(n)]
        )
    else:
        gateway.ollama.script(
            *[OllamaTurn(content=MULTIBYTE, line_end="\r\n", byte_chunk=3) for _ in range(n)]
        )


@pytest.mark.parametrize("model", [LLAMACPP_MODEL, OLLAMA_MODEL])
def test_streams_from_upstreams_that_name_no_charset(gateway: Gateway, model: str) -> None:
    """Issue 28: llama-server answers `Content-Type: text/event-stream` and Ollama
    `application/x-ndjson`, neither with a charset; every streamed call through them was a
    500. Both SDKs stream the multi-byte text whole, through both endpoints."""
    _script_multibyte(gateway, model, 3)
    ask: Any = [{"role": "user", "content": "grüß dich"}]
    with gateway.openai() as oai:
        chunks = oai.chat.completions.create(model=model, messages=ask, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == MULTIBYTE
        chunks = oai.chat.completions.create(
            model=model, messages=ask, stream=True, stream_options={"include_usage": True}
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == MULTIBYTE
    with (
        gateway.anthropic() as ant,
        ant.messages.stream(model=model, max_tokens=64, messages=ask) as stream,
    ):
        assert "".join(stream.text_stream) == MULTIBYTE
        assert stream.get_final_message().stop_reason == "end_turn"
    upstream = (
        gateway.llamacpp.chat_requests if model == LLAMACPP_MODEL else gateway.ollama.chat_requests
    )
    assert len(upstream) == 3
