"""The official `openai` and `anthropic` SDKs against the service started as the README says
(`scripts/serve` with a config file), each routed to an OpenAI-format and an Anthropic-format
upstream (real loopback servers speaking those wire formats); Bedrock signed with the
temporary AWS keys (session token included) of the environment the service starts in; and
streams from upstreams whose Content-Type names no charset (llama.cpp's server, Ollama)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml

from tests.conftest import free_port
from tests.e2e.test_serve import _wait_for_ready_line
from tests.fakes.anthropic_server import FakeAnthropic, text_reply, tool_reply
from tests.fakes.bedrock_server import ACCESS_KEY, SECRET_KEY, BedrockFake, BedrockTurn
from tests.fakes.ollama_server import OllamaFake, OllamaTurn
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

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
OPENAI_MODEL, ANTHROPIC_MODEL = "gpt-4o-mini", "claude-sonnet-4-5"
BEDROCK_MODEL, AWS_TOKEN = "nova", "IQoJb3JpZ2luX2VjE2E2ESESSIONTOKEN"
LLAMACPP_MODEL, OLLAMA_MODEL = "local-llama", "llama3.2"
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
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gateway")
    with (
        OpenAIFake(api_key="sk-o") as oai,
        FakeAnthropic(api_key="sk-a") as ant,
        BedrockFake(session_token=AWS_TOKEN) as bedrock,
        OpenAIFake(profile="llamacpp", models=[LLAMACPP_MODEL]) as llamacpp,
        OllamaFake() as ollama,
    ):
        config = work / "orchestrator.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "providers": {
                        "openai": {
                            "base_url": oai.base_url,
                            "api_key": "sk-o",
                            "models": [OPENAI_MODEL],
                        },
                        "anthropic": {
                            "base_url": ant.url,
                            "api_key": "sk-a",
                            "models": [ANTHROPIC_MODEL],
                        },
                        # No keys here: the AWS variables below sign (botocore's chain).
                        "bedrock": {
                            "base_url": bedrock.url,
                            "models": [BEDROCK_MODEL],
                            "model_id": "amazon.nova-lite-v1:0",
                        },
                        "ollama": {"base_url": ollama.url, "models": [OLLAMA_MODEL]},
                    },
                    "custom_providers": [
                        {
                            "id": "llamacpp",
                            "format": "openai",
                            "base_url": llamacpp.base_url,
                            "models": [LLAMACPP_MODEL],
                        }
                    ],
                    "rate_limit_per_minute": 0,
                }
            )
        )
        data_dir, log, port = work / "data", work / "serve.log", free_port()
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_", "AWS_"))
        }
        env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_SESSION_TOKEN=AWS_TOKEN,
            AWS_REGION="us-east-1",
            AWS_CONFIG_FILE=str(work / "no-aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(work / "no-aws-credentials"),
            AWS_EC2_METADATA_DISABLED="true",
        )
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(ROOT / "scripts" / "serve"),
                    "--config",
                    str(config),
                    "--data-dir",
                    str(data_dir),
                    "--port",
                    str(port),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        try:
            _wait_for_ready_line(proc, log)
            token = (data_dir / "admin_token").read_text().strip()
            served = Gateway(f"http://127.0.0.1:{port}", token, oai, ant, bedrock, llamacpp, ollama)
            yield served
            for client in served.clients:
                client.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
            sys.stdout.write(log.read_text(errors="replace")[-2000:])


@pytest.fixture(autouse=True)
def fresh_upstreams(gateway: Gateway) -> None:
    gateway.oai.reset()
    gateway.ant.requests.clear()
    gateway.bedrock.requests.clear()
    gateway.llamacpp.reset()
    gateway.ollama.requests.clear()


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
