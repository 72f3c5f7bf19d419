"""BedrockAdapter against a real loopback server speaking Converse / ConverseStream (binary
event stream) that verifies every request's SigV4 signature."""

from __future__ import annotations

import base64
import re
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from botocore.credentials import DeferredRefreshableCredentials

from orchestrator.config import Settings
from orchestrator.errors import BadRequest
from orchestrator.providers import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    MessageEnd,
    MessageStart,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    _bedrock,
)
from orchestrator.providers._bedrock import BedrockAdapter
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.bedrock_server import ACCESS_KEY, SECRET_KEY, BedrockFake, BedrockTurn

ARN = (
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
    "us.anthropic.claude-3-5-sonnet-20241022-v2:0"
)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), "
    r"Signature=(?P<sig>[0-9a-f]{64})$"
)


@pytest.fixture
async def server() -> AsyncIterator[BedrockFake]:
    async with BedrockFake() as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def adapter(server: BedrockFake, http: httpx.AsyncClient, **extra: Any) -> BedrockAdapter:
    config = ProviderConfig(
        "bedrock",
        "bedrock",
        server.url,
        models=("claude",),
        timeout_s=10,
        connect_timeout_s=2,
        extra={
            "region": "us-east-1",
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "model_id": ARN,
            **extra,
        },
    )
    return BedrockAdapter(config, http)


def ask(text: str = "Hi", model: str = "claude", **kw: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=(Message("user", (TextBlock(text),)),), **kw)


async def events_of(bedrock: BedrockAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [event async for event in bedrock.stream(request)]


async def test_streams_reasoning_and_text_from_binary_frames(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    server.script(
        BedrockTurn(
            text="Hello there",
            reasoning="Think.",
            reasoning_signature="sig",
            input_tokens=31,
            output_tokens=17,
            byte_chunk=7,  # frames cut anywhere on the wire
        )
    )
    request = ask(system="Be brief.", max_tokens=64, temperature=0.2, top_p=0.9, stop=("END",))
    events = await events_of(adapter(server, http), request)

    assert isinstance(events[0], MessageStart)
    assert str(uuid.UUID(events[0].id)) == events[0].id  # the x-amzn-requestid
    assert events[0].model == ARN
    assert events[1:] == [
        BlockStart(0, "thinking"),
        BlockDelta(0, "Thin"),
        BlockDelta(0, "k."),
        BlockStop(0, signature="sig"),  # the reasoning's signature delta, with its end
        BlockStart(1, "text"),
        BlockDelta(1, "Hell"),
        BlockDelta(1, "o th"),
        BlockDelta(1, "ere"),
        BlockStop(1),
        MessageEnd("end_turn", Usage(31, 17)),
    ]
    [sent] = server.requests
    assert sent.method == "POST"
    assert (
        sent.raw_path
        == "/model/" + ARN.replace(":", "%3A").replace("/", "%2F") + "/converse-stream"
    )
    assert server.model_ids == [ARN]
    assert sent.headers["accept"] == "application/vnd.amazon.eventstream"
    assert sent.headers["content-type"] == "application/json"
    assert sent.json == {
        "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {
            "maxTokens": 64,
            "temperature": 0.2,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
    }
    # A SigV4 signature for service bedrock in the region, that the fake recomputed.
    auth = AUTH.match(sent.headers["authorization"])
    assert auth is not None
    assert (auth["key"], auth["region"], auth["service"]) == (ACCESS_KEY, "us-east-1", "bedrock")
    assert auth["date"] == sent.headers["x-amz-date"][:8]
    assert {"content-type", "host", "x-amz-date"} <= set(auth["signed"].split(";"))
    assert server.rejected == []


async def test_complete_uses_converse(server: BedrockFake, http: httpx.AsyncClient) -> None:
    server.script(
        BedrockTurn(
            text="Hello!",
            reasoning="Think.",
            reasoning_signature="sig",
            input_tokens=9,
            output_tokens=4,
        )
    )
    response = await adapter(server, http).complete(ask())
    assert server.requests[0].raw_path.endswith("/converse")
    assert server.requests[0].headers["accept"] == "application/json"
    assert response.content == (ThinkingBlock("Think.", "sig"), TextBlock("Hello!"))
    assert response.usage == Usage(9, 4)
    assert response.stop_reason == "end_turn"
    assert response.model == ARN
    assert str(uuid.UUID(response.id)) == response.id


async def test_a_model_that_is_not_an_alias_is_sent_as_is(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    await adapter(server, http).complete(ask(model="amazon.nova-lite-v1:0"))
    assert server.model_ids == ["amazon.nova-lite-v1:0"]
    assert server.requests[0].raw_path == "/model/amazon.nova-lite-v1%3A0/converse"


async def test_a_session_token_is_sent_and_signed(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    await adapter(server, http, session_token="FwoGZXIvYXdzEXAMPLETOKEN").complete(ask())
    sent = server.requests[0]
    assert sent.headers["x-amz-security-token"] == "FwoGZXIvYXdzEXAMPLETOKEN"
    auth = AUTH.match(sent.headers["authorization"])
    assert auth is not None and "x-amz-security-token" in auth["signed"].split(";")
    assert server.rejected == []


async def test_a_wrong_secret_is_rejected_by_the_signature_check(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    bedrock = adapter(server, http, secret_access_key="not-the-secret")
    with pytest.raises(ProviderError) as info:
        await bedrock.complete(ask())
    assert info.value.upstream_status == 403
    assert "The request signature we calculated does not match" in info.value.message
    assert info.value.retryable is False
    assert info.value.to_http().status_code == 502
    assert server.rejected[0][0] == "InvalidSignatureException"
    with pytest.raises(ProviderError) as streamed:
        await anext(bedrock.stream(ask()))
    assert streamed.value.upstream_status == 403


@pytest.mark.parametrize(
    ("aws", "stop"),
    [
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("guardrail_intervened", "refusal"),
        ("content_filtered", "refusal"),
    ],
)
async def test_stop_reasons(
    server: BedrockFake, http: httpx.AsyncClient, aws: str, stop: str
) -> None:
    turn = BedrockTurn(text="cut", stop_reason=aws)
    server.script(turn, turn)
    bedrock = adapter(server, http)
    assert (await bedrock.complete(ask())).stop_reason == stop
    assert (await events_of(bedrock, ask()))[-1] == MessageEnd(stop, Usage(25, 12))


async def test_tool_use_streams_and_round_trips(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    turn = BedrockTurn(
        text="Let me check.",
        tool_uses=[
            {"toolUseId": "tooluse_a1", "name": "get_weather", "input": {"city": "Paris"}},
            {"toolUseId": "tooluse_b2", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
        stop_reason="tool_use",
        byte_chunk=13,
    )
    server.script(turn, turn)
    bedrock = adapter(server, http)
    request = ask("Weather?", tools=(WEATHER,), tool_choice={"name": "get_weather"})

    events = await events_of(bedrock, request)
    assert [e for e in events if isinstance(e, BlockStart)] == [
        BlockStart(0, "text"),
        BlockStart(1, "tool_use", "tooluse_a1", "get_weather"),
        BlockStart(2, "tool_use", "tooluse_b2", "get_weather"),
    ]
    args = "".join(e.text for e in events if isinstance(e, BlockDelta) and e.index == 1)
    assert args == '{"city": "Paris"}'
    assert events[-1] == MessageEnd("tool_use", Usage(25, 12))
    assert server.requests[0].json["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "inputSchema": {"json": WEATHER.parameters},
                }
            }
        ],
        "toolChoice": {"tool": {"name": "get_weather"}},
    }

    response = await bedrock.complete(request)
    assert response.content == (
        TextBlock("Let me check."),
        ToolUseBlock("tooluse_a1", "get_weather", {"city": "Paris"}),
        ToolUseBlock("tooluse_b2", "get_weather", {"city": "Oslo"}),
    )
    assert response.stop_reason == "tool_use"

    server.script(BedrockTurn(text="Sunny in Paris."))
    follow_up = ChatRequest(
        model="claude",
        messages=(
            request.messages[0],
            Message("assistant", response.content),
            Message("user", (ToolResultBlock("tooluse_a1", (TextBlock("18C"),)),)),
            # A second user turn in a row: merged, Converse wants alternating roles.
            Message(
                "user", (ToolResultBlock("tooluse_b2", (TextBlock("no data"),), is_error=True),)
            ),
        ),
        tools=(WEATHER,),
        tool_choice="any",
    )
    assert (await bedrock.complete(follow_up)).text == "Sunny in Paris."
    sent = server.requests[-1].json
    assert sent["messages"] == [
        {"role": "user", "content": [{"text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"text": "Let me check."},
                {
                    "toolUse": {
                        "toolUseId": "tooluse_a1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                },
                {
                    "toolUse": {
                        "toolUseId": "tooluse_b2",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    }
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "tooluse_a1",
                        "content": [{"text": "18C"}],
                        "status": "success",
                    }
                },
                {
                    "toolResult": {
                        "toolUseId": "tooluse_b2",
                        "content": [{"text": "no data"}],
                        "status": "error",
                    }
                },
            ],
        },
    ]
    assert sent["toolConfig"]["toolChoice"] == {"any": {}}


async def test_tool_choice_none(server: BedrockFake, http: httpx.AsyncClient) -> None:
    bedrock = adapter(server, http)
    await bedrock.complete(ask(tools=(WEATHER,), tool_choice="none"))
    assert "toolConfig" not in server.requests[-1].json
    history = ChatRequest(
        model="claude",
        messages=(
            Message("user", (TextBlock("Weather?"),)),
            Message("assistant", (ToolUseBlock("t1", "get_weather", {"city": "Rome"}),)),
            Message("user", (ToolResultBlock("t1", (TextBlock("21C"),)),)),
        ),
        tools=(WEATHER,),
        tool_choice="none",
    )
    await bedrock.complete(history)
    # Tool blocks in the history need a toolConfig; no choice is forced.
    assert set(server.requests[-1].json["toolConfig"]) == {"tools"}


async def test_images_need_inline_bytes(server: BedrockFake, http: httpx.AsyncClient) -> None:
    bedrock = adapter(server, http)
    request = ChatRequest(
        model="claude",
        messages=(
            Message(
                "user",
                (TextBlock("What is it?"), ImageBlock("image/png", PNG), ImageBlock(data=PNG)),
            ),
        ),
    )
    await bedrock.complete(request)
    image = {"image": {"format": "png", "source": {"bytes": PNG}}}
    assert server.requests[0].json["messages"][0]["content"] == [
        {"text": "What is it?"},
        image,
        image,
    ]
    remote = ChatRequest(
        model="claude", messages=(Message("user", (ImageBlock(url="https://example.com/a.png"),)),)
    )
    with pytest.raises(BadRequest, match="inline"):
        await bedrock.complete(remote)
    with pytest.raises(BadRequest, match="png, jpeg, gif and webp"):
        await bedrock.complete(
            ChatRequest(
                model="claude", messages=(Message("user", (ImageBlock("image/tiff", "AAAA"),)),)
            )
        )
    assert len(server.requests) == 1


async def test_throttling_is_retryable_and_a_retry_succeeds(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    server.script(
        BedrockTurn.error(
            429, "ThrottlingException", "Too many requests, please wait before trying again."
        ),
        BedrockTurn(text="ok"),
    )
    bedrock = adapter(server, http)
    with pytest.raises(ProviderError) as info:
        await bedrock.complete(ask())
    assert (info.value.upstream_status, info.value.retryable) == (429, True)
    assert info.value.message == "bedrock: Too many requests, please wait before trying again."
    assert info.value.to_http().status_code == 429
    assert (await bedrock.complete(ask())).text == "ok"


@pytest.mark.parametrize(
    ("status", "error_type", "message", "retryable", "http_status"),
    [
        (400, "ValidationException", "The provided model identifier is invalid.", False, 400),
        (500, "InternalServerException", "The server encountered an internal error.", True, 502),
        (503, "ServiceUnavailableException", "The service is unavailable.", True, 502),
    ],
)
async def test_error_statuses(
    server: BedrockFake,
    http: httpx.AsyncClient,
    status: int,
    error_type: str,
    message: str,
    retryable: bool,
    http_status: int,
) -> None:
    server.script(
        BedrockTurn.error(status, error_type, message),
        BedrockTurn.error(status, error_type, message),
    )
    bedrock = adapter(server, http)
    with pytest.raises(ProviderError) as info:
        await bedrock.complete(ask())
    assert (info.value.upstream_status, info.value.retryable) == (status, retryable)
    assert info.value.message == f"bedrock: {message}"
    assert info.value.to_http().status_code == http_status
    with pytest.raises(ProviderError) as streamed:
        await anext(bedrock.stream(ask()))
    assert streamed.value.upstream_status == status


async def test_an_exception_event_mid_stream_raises_from_the_iterator(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    server.script(
        BedrockTurn(text="a long answer", exception_after=3),
        BedrockTurn(
            text="a long answer",
            exception_after=2,
            exception=("validationException", "Input is too long for requested model."),
        ),
    )
    bedrock = adapter(server, http)
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in bedrock.stream(ask()):
            seen.append(event)
    assert [e for e in seen if isinstance(e, BlockDelta)] == [
        BlockDelta(0, "a lo"),
        BlockDelta(0, "ng a"),
    ]
    assert (info.value.upstream_status, info.value.retryable) == (429, True)
    assert "throttlingException: Too many requests" in info.value.message
    with pytest.raises(ProviderError) as invalid:
        async for _ in bedrock.stream(ask()):
            pass
    assert (invalid.value.upstream_status, invalid.value.retryable) == (400, False)


async def test_a_dropped_connection_mid_stream_raises_from_the_iterator(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    server.script(BedrockTurn(text="a long answer", fail_after=3))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in adapter(server, http).stream(ask()):
            seen.append(event)
    assert BlockDelta(0, "a lo") in seen
    assert not any(isinstance(e, MessageEnd) for e in seen)
    assert info.value.retryable is True


async def test_probe_is_a_signed_list_of_foundation_models(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    await adapter(server, http).probe()
    probe = server.requests[-1]
    assert (probe.method, probe.raw_path, probe.raw) == ("GET", "/foundation-models", b"")
    assert AUTH.match(probe.headers["authorization"]) is not None
    assert server.rejected == []
    with pytest.raises(ProviderError) as wrong:
        await adapter(server, http, secret_access_key="nope").probe()
    assert wrong.value.upstream_status == 403
    server.models_status = 403
    with pytest.raises(ProviderError) as denied:
        await adapter(server, http).probe()
    assert denied.value.upstream_status == 403
    assert "You don't have access" in denied.value.message


async def test_probe_of_a_server_that_is_not_there(http: httpx.AsyncClient) -> None:
    async with BedrockFake() as fake:
        gone = fake
    bedrock = adapter(gone, http)
    with pytest.raises(ProviderError) as info:
        await bedrock.probe()
    assert info.value.code == "upstream_unavailable"


async def test_the_fake_rejects_a_body_or_path_that_differs_from_the_signed_one(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    bedrock = adapter(server, http)
    url = f"{server.url}/model/amazon.nova-lite-v1%3A0/converse"
    signed = await bedrock.signed_headers(
        "POST", url, b'{"messages":[]}', {"Content-Type": "application/json"}
    )
    ok = await http.post(url, content=b'{"messages":[]}', headers=signed)
    assert ok.status_code == 200
    tampered = await http.post(url, content=b'{"messages":[1]}', headers=signed)
    assert tampered.status_code == 403
    assert tampered.headers["x-amzn-errortype"].startswith("InvalidSignatureException:")
    assert tampered.json()["message"].startswith("The request signature we calculated")
    moved = await http.post(
        url.replace("nova-lite", "nova-pro"), content=b'{"messages":[]}', headers=signed
    )
    assert moved.status_code == 403
    unsigned = await http.post(url, content=b"{}", headers={"Content-Type": "application/json"})
    assert unsigned.status_code == 403
    assert unsigned.json() == {"message": "Missing Authentication Token"}


def _no_configured_keys(server: BedrockFake, http: httpx.AsyncClient) -> BedrockAdapter:
    config = ProviderConfig(
        "bedrock",
        "bedrock",
        server.url,
        timeout_s=10,
        connect_timeout_s=2,
        extra={"region": "us-east-1"},
    )
    return BedrockAdapter(config, http)


def _isolate_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


async def test_without_configured_keys_the_default_credential_chain_signs(
    server: BedrockFake, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    _isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    server.script(BedrockTurn(text="from the environment"))
    response = await _no_configured_keys(server, http).complete(ask(model="amazon.nova-lite-v1:0"))
    assert response.text == "from the environment"
    assert server.rejected == []


async def test_without_any_credentials_the_call_fails_cleanly(
    server: BedrockFake, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    _isolate_aws(monkeypatch, tmp_path)
    with pytest.raises(ProviderError, match="no AWS credentials"):
        await _no_configured_keys(server, http).complete(ask(model="amazon.nova-lite-v1:0"))
    assert server.requests == []


async def test_the_default_chain_is_asked_again_after_finding_nothing(
    server: BedrockFake,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    _isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setattr(_bedrock, "CHAIN_RETRY_S", 0.0)
    bedrock = _no_configured_keys(server, http)
    with pytest.raises(ProviderError, match="no AWS credentials"):
        await bedrock.complete(ask(model="amazon.nova-lite-v1:0"))
    # The credentials appear later (a role attached, a variable set): no restart needed.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    assert (await bedrock.complete(ask(model="amazon.nova-lite-v1:0"))).text == "echo"


async def test_expiring_credentials_are_refreshed_off_the_event_loop(
    server: BedrockFake, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore refreshes temporary credentials (STS, the metadata service) with blocking
    calls: they run in a thread, never on the loop that serves every other request."""
    loop_thread = threading.get_ident()
    refreshed_on: list[int] = []
    tokens = iter(["TOKEN-ONE", "TOKEN-TWO"])

    def refresh() -> dict[str, str]:
        refreshed_on.append(threading.get_ident())
        # Inside botocore's advisory window already: the next signing refreshes again.
        soon = datetime.now(UTC) + timedelta(minutes=5)
        return {
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "token": next(tokens),
            "expiry_time": soon.isoformat(),
        }

    chain = DeferredRefreshableCredentials(refresh, "sts-assume-role")
    monkeypatch.setattr(_bedrock, "_default_credentials", lambda: chain)
    bedrock = _no_configured_keys(server, http)
    for _ in range(2):
        assert (await bedrock.complete(ask(model="m"))).text == "echo"
    sent = [r.headers["x-amz-security-token"] for r in server.requests]
    assert sent == ["TOKEN-ONE", "TOKEN-TWO"] and server.rejected == []
    assert len(refreshed_on) == 2 and loop_thread not in refreshed_on


# --- through the app: the settings and the environment the service is started with ----------
AWS_TOKEN = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN"


async def _chat_via_app(settings: Any, fake: BedrockFake) -> httpx.Response:
    fake.script(BedrockTurn(text="signed with the session token"))
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        return await c.post(
            "/api/v1/chat/completions",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            json={"model": "nova", "messages": [{"role": "user", "content": "Hi"}]},
        )


async def test_a_session_token_in_the_settings_is_sent(make_settings: Any) -> None:
    async with BedrockFake(session_token=AWS_TOKEN) as fake:
        settings = make_settings(
            providers={
                "bedrock": {
                    "base_url": fake.url,
                    "region": "us-east-1",
                    "access_key_id": ACCESS_KEY,
                    "secret_access_key": SECRET_KEY,
                    "session_token": AWS_TOKEN,
                    "models": ["nova"],
                    "model_id": "amazon.nova-lite-v1:0",
                }
            }
        )
        r = await _chat_via_app(settings, fake)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "signed with the session token"
    assert fake.rejected == []
    assert fake.requests[0].headers["x-amz-security-token"] == AWS_TOKEN


async def test_temporary_keys_from_the_environment_keep_their_session_token(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """AWS_ACCESS_KEY_ID/SECRET/SESSION_TOKEN where the service starts (and so where its
    replicas run): the settings name Bedrock, botocore's chain signs with all three."""
    _isolate_aws(monkeypatch, tmp_path)
    aws = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": AWS_TOKEN,
        "AWS_REGION": "us-east-1",
    }
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    async with BedrockFake(session_token=AWS_TOKEN) as fake:
        base = make_settings()
        settings = Settings.load(
            environ=aws,
            database_url=base.database_url,
            redis_url=base.redis_url,
            data_dir=base.data_dir,
            admin_token=ADMIN_TOKEN,
            providers={
                "bedrock": {
                    "base_url": fake.url,
                    "models": ["nova"],
                    "model_id": "amazon.nova-lite-v1:0",
                }
            },
        )
        r = await _chat_via_app(settings, fake)
    assert r.status_code == 200, r.text
    assert fake.rejected == []
    assert fake.requests[0].headers["x-amz-security-token"] == AWS_TOKEN


async def test_cache_breakpoints_and_documents_as_converse_blocks(
    server: BedrockFake, http: httpx.AsyncClient
) -> None:
    """Anthropic's cache_control on system, tools and blocks becomes a Converse `cachePoint`
    after the entry (its ttl kept); documents are `document` blocks with bytes (a PDF, plain
    text as txt) and a name Bedrock takes; the cache usage comes back in Usage."""
    ephemeral = {"type": "ephemeral"}
    server.script(
        BedrockTurn(text="Read.", cache_read_input_tokens=1024, cache_write_input_tokens=10)
    )
    pdf = base64.b64encode(b"%PDF-1.4 minimal").decode()
    request = ChatRequest(
        model="claude",
        system="Static.\n\nDynamic.",
        system_blocks=(TextBlock("Static.", cache_control=ephemeral), TextBlock("Dynamic.")),
        tools=(
            ToolDef("lookup", None, {"type": "object"}, cache_control={**ephemeral, "ttl": "1h"}),
        ),
        messages=(
            Message(
                "user",
                (
                    DocumentBlock(media_type="application/pdf", data=pdf, title="report.pdf"),
                    DocumentBlock(media_type="text/plain", text="Notes."),
                    TextBlock("Summarise.", cache_control=ephemeral),
                ),
            ),
        ),
        params={
            "cache_control": True,
            "document": ("base64", "text"),
            "thinking": {"type": "enabled", "budget_tokens": 2048},
        },
    )
    response = await adapter(server, http).complete(request)
    assert server.violations == []
    body = server.requests[-1].json
    assert body["system"] == [
        {"text": "Static."},
        {"cachePoint": {"type": "default"}},
        {"text": "Dynamic."},
    ]
    assert body["toolConfig"]["tools"][1] == {"cachePoint": {"type": "default", "ttl": "1h"}}
    assert body["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 2048}
    }
    assert body["messages"][0]["content"] == [
        {"document": {"format": "pdf", "name": "report-pdf", "source": {"bytes": pdf}}},
        {
            "document": {
                "format": "txt",
                "name": "document",
                "source": {"bytes": base64.b64encode(b"Notes.").decode()},
            }
        },
        {"text": "Summarise."},
        {"cachePoint": {"type": "default"}},
    ]
    assert response.usage == Usage(
        25 + 1024 + 10, 12, cache_creation_input_tokens=10, cache_read_input_tokens=1024
    )
    # A document by URL cannot go to Bedrock (it takes bytes or S3 only).
    url_doc = Message("user", (DocumentBlock(url="https://x.test/a.pdf"),))
    with pytest.raises(BadRequest):
        await adapter(server, http).complete(ChatRequest(model="claude", messages=(url_doc,)))


async def test_count_tokens_is_bedrocks_own(server: BedrockFake, http: httpx.AsyncClient) -> None:
    server.token_count = 77
    request = ask("How many?", system="Be brief.", tools=(ToolDef("f", None, {"type": "object"}),))
    assert await adapter(server, http).count_tokens(request) == 77
    sent = server.requests[-1]
    assert sent.raw_path.endswith("/count-tokens") and server.violations == []
    converse = sent.json["input"]["converse"]
    assert converse["system"] == [{"text": "Be brief."}] and "toolConfig" in converse
