"""The `azure_openai` kind against real loopback servers speaking Azure OpenAI's data plane
and Entra ID's token endpoint (tests/fakes/azure_openai_server.py): deployments, api-version,
`api-key` or an Entra bearer token, Azure's content-filter annotations in answers and
chunks, its errors; then through the gateway with the official openai SDK (and its own
AzureOpenAI client reading the fake, so the fake is what Azure's client expects)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from orchestrator.config import ConfigError, Settings
from orchestrator.errors import ErrorCode, RateLimited, ValidationFailed
from orchestrator.providers import (
    BlockDelta,
    ChatRequest,
    EmbedRequest,
    Message,
    MessageEnd,
    MessageStart,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextBlock,
    ToolDef,
    ToolUseBlock,
    _params,
    build_adapter,
    collect,
    configured_providers,
)
from orchestrator.providers._azure import AzureOpenAIAdapter
from tests.conftest import ADMIN_TOKEN, ServedApp, free_port
from tests.fakes.azure_openai_server import (
    AzureOpenAIFake,
    AzureRequest,
    EntraFake,
    azure_content_filtered,
    azure_rate_limited,
)
from tests.fakes.openai_server import FakeReply, FakeToolCall

KEY = "azure-test-key"
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[tuple[AzureOpenAIFake, EntraFake]]:
    async with EntraFake() as entra:
        fake = AzureOpenAIFake(
            api_key=KEY,
            entra=entra,
            deployments={"prod-4o": "gpt-4o", "gpt-4o-mini": "gpt-4o-mini"},
        )
        async with fake:
            yield fake, entra


@pytest.fixture
def azure(servers: tuple[AzureOpenAIFake, EntraFake]) -> AzureOpenAIFake:
    fake, entra = servers
    fake.reset()
    fake.filtered_output = False
    entra.requests.clear()
    return fake


def config(base_url: str, **extra: Any) -> ProviderConfig:
    kw: dict[str, Any] = {"timeout_s": extra.pop("timeout_s", 10), "connect_timeout_s": 2}
    api_key = extra.pop("api_key", KEY)
    values = {"api_version": "2024-10-21", "deployments": {"gpt-4o": "prod-4o"}, **extra}
    return ProviderConfig(
        "azure_openai", "azure_openai", base_url, api_key=api_key, extra=values, **kw
    )


def adapter(fake: AzureOpenAIFake, http: httpx.AsyncClient, **extra: Any) -> AzureOpenAIAdapter:
    built = build_adapter(config(fake.url, **extra), http)
    assert isinstance(built, AzureOpenAIAdapter)
    return built


def entra_extra(entra: EntraFake, **kw: Any) -> dict[str, Any]:
    return {
        "api_key": None,
        "tenant_id": entra.tenant_id,
        "client_id": entra.client_id,
        "client_secret": entra.client_secret,
        "authority": entra.url,
        **kw,
    }


def ask(text: str = "Hello?", model: str = "gpt-4o", **kw: Any) -> ChatRequest:
    return ChatRequest(model, (Message("user", (TextBlock(text),)),), **kw)


async def events_of(adapter: AzureOpenAIAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [e async for e in adapter.stream(request)]


def last(fake: AzureOpenAIFake) -> AzureRequest:
    request = fake.requests[-1]
    assert isinstance(request, AzureRequest)
    return request


# --- the adapter -----------------------------------------------------------------------------
async def test_complete_goes_to_the_deployment_with_api_version_and_key(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    azure.script([FakeReply(text="Hello from Azure", prompt_tokens=9, completion_tokens=3)])
    answer = await adapter(azure, http).complete(ask(max_tokens=50))
    assert answer.content == (TextBlock("Hello from Azure"),)
    assert (answer.stop_reason, answer.usage.input_tokens, answer.usage.output_tokens) == (
        "end_turn",
        9,
        3,
    )
    sent = last(azure)
    assert sent.path == "/openai/deployments/prod-4o/chat/completions"  # mapped
    assert sent.api_version == "2024-10-21"
    assert sent.headers["api-key"] == KEY and "authorization" not in sent.headers
    assert sent.json["max_completion_tokens"] == 50 and "max_tokens" not in sent.json
    assert not azure.violations


async def test_a_model_without_a_mapping_is_its_own_deployment(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    await adapter(azure, http).complete(ask(model="gpt-4o-mini"))
    assert last(azure).path == "/openai/deployments/gpt-4o-mini/chat/completions"


async def test_stream_skips_the_prompt_filter_chunk_and_reads_annotated_chunks(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    azure.script([FakeReply(text="Hello, world!", prompt_tokens=12, completion_tokens=4)])
    events = await events_of(adapter(azure, http), ask())
    start = events[0]
    assert isinstance(start, MessageStart) and start.id.startswith("chatcmpl-")
    assert start.model == "gpt-4o"  # not the empty id/model of Azure's opening chunk
    assert "".join(e.text for e in events if isinstance(e, BlockDelta)) == "Hello, world!"
    end = events[-1]
    assert isinstance(end, MessageEnd) and end.stop_reason == "end_turn"
    assert (end.usage.input_tokens, end.usage.output_tokens) == (12, 4)
    assert last(azure).json["stream_options"] == {"include_usage": True}


async def test_the_fake_streams_what_azure_streams(azure: AzureOpenAIFake) -> None:
    """Azure's opening chunk and annotations, keys sorted, byte for byte in the frames."""
    chunks = azure.chunks(FakeReply(text="Hi"), "gpt-4o", "chatcmpl-x", include_usage=True)
    assert chunks[0] == {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": chunks[0]["prompt_filter_results"],
    }
    assert chunks[0]["prompt_filter_results"][0]["content_filter_results"]["jailbreak"] == {
        "detected": False,
        "filtered": False,
    }
    assert chunks[1]["choices"][0]["content_filter_results"] == {}
    assert chunks[2]["choices"][0]["content_filter_results"]["hate"]["severity"] == "safe"
    assert list(chunks[2]) == sorted(chunks[2])


async def test_tools_stream_and_complete(azure: AzureOpenAIFake, http: httpx.AsyncClient) -> None:
    call = FakeToolCall("get_weather", {"city": "Paris"}, id="call_az1")
    azure.script([FakeReply(tool_calls=[call]), FakeReply(tool_calls=[call])])
    azure_adapter = adapter(azure, http)
    answer = await azure_adapter.complete(ask(tools=(WEATHER,), tool_choice="auto"))
    assert answer.content == (ToolUseBlock("call_az1", "get_weather", {"city": "Paris"}),)
    assert answer.stop_reason == "tool_use"
    streamed = await collect(azure_adapter.stream(ask(tools=(WEATHER,))))
    assert streamed.content == answer.content and streamed.stop_reason == "tool_use"
    assert last(azure).json["tools"][0]["function"]["name"] == "get_weather"


async def test_content_filter_finish_is_a_refusal(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    azure.filtered_output = True
    azure.script(
        [
            FakeReply(text="Partial", finish_reason="content_filter"),
            FakeReply(text="Partial", finish_reason="content_filter"),
        ]
    )
    azure_adapter = adapter(azure, http)
    assert (await azure_adapter.complete(ask())).stop_reason == "refusal"
    assert (await collect(azure_adapter.stream(ask()))).stop_reason == "refusal"


async def test_a_filtered_prompt_is_azures_400(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    azure.script([azure_content_filtered()])
    with pytest.raises(ProviderError) as info:
        await adapter(azure, http).complete(ask())
    assert info.value.upstream_status == 400 and not info.value.retryable
    assert "content management policy" in info.value.message


async def test_rate_limit_carries_retry_after(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    azure.script([azure_rate_limited(6), azure_rate_limited(2)])
    azure_adapter = adapter(azure, http)
    with pytest.raises(ProviderError) as info:
        await azure_adapter.complete(ask())
    err = info.value
    assert (err.upstream_status, err.retry_after, err.retryable) == (429, 6.0, True)
    assert "exceeded token rate limit" in err.message
    assert isinstance(err.to_http(), RateLimited)
    with pytest.raises(ProviderError) as info:
        await events_of(azure_adapter, ask())
    assert (info.value.upstream_status, info.value.retry_after) == (429, 2.0)


async def test_server_errors_are_retryable(azure: AzureOpenAIFake, http: httpx.AsyncClient) -> None:
    azure.script([FakeReply.server_error(500), FakeReply.server_error(503)])
    azure_adapter = adapter(azure, http)
    for call in (azure_adapter.complete(ask()), events_of(azure_adapter, ask())):
        with pytest.raises(ProviderError) as info:
            await call
        assert info.value.retryable and info.value.to_http().status_code == 502


async def test_a_wrong_key_an_unknown_deployment_and_a_bad_api_version(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    with pytest.raises(ProviderError) as info:
        await adapter(azure, http, api_key="wrong").complete(ask())
    assert (info.value.upstream_status, info.value.retryable) == (401, False)
    assert "invalid subscription key" in info.value.message
    assert info.value.to_http().status_code == 502  # our key, not the caller's fault

    with pytest.raises(ProviderError) as info:
        await adapter(azure, http).complete(ask(model="gpt-5-nowhere"))
    assert info.value.upstream_status == 404 and "deployment" in info.value.message

    with pytest.raises(ProviderError) as info:
        await adapter(azure, http, api_version="2019-01-01").complete(ask())
    assert info.value.upstream_status == 400 and "API version not supported" in info.value.message


async def test_entra_id_token_is_fetched_once_and_sent_as_bearer(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    entra = azure.entra
    assert entra is not None
    azure_adapter = adapter(azure, http, **entra_extra(entra))
    await azure_adapter.complete(ask())
    await collect(azure_adapter.stream(ask()))
    await azure_adapter.probe()
    assert len(entra.token_requests) == 1  # cached until near expiry
    form = entra.token_requests[0].raw.decode()
    assert "grant_type=client_credentials" in form
    assert "scope=https%3A%2F%2Fcognitiveservices.azure.com%2F.default" in form
    assert entra.token_requests[0].path == f"/{entra.tenant_id}/oauth2/v2.0/token"
    for sent in azure.requests:
        assert sent.headers["authorization"] == f"Bearer {entra.issued[0]}"
        assert "api-key" not in sent.headers


async def test_with_entra_configured_a_leftover_key_is_never_sent(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    """A key (AZURE_OPENAI_API_KEY) beside Entra settings: the bearer alone goes out, on
    every call, not only on the probe (the headers are built once, at construction)."""
    entra = azure.entra
    assert entra is not None
    azure_adapter = adapter(azure, http, **entra_extra(entra, api_key="stale-key"))
    await azure_adapter.complete(ask())
    await collect(azure_adapter.stream(ask()))
    await azure_adapter.probe()
    assert len(azure.requests) == 3
    for sent in azure.requests:
        assert "api-key" not in sent.headers
        assert sent.headers["authorization"].startswith("Bearer ")


async def test_a_short_lived_entra_token_is_renewed(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    entra = azure.entra
    assert entra is not None
    entra.expires_in = 0  # renewed at half its life: every call asks again
    try:
        azure_adapter = adapter(azure, http, **entra_extra(entra))
        await azure_adapter.complete(ask())
        await azure_adapter.complete(ask())
    finally:
        entra.expires_in = 3599
    assert len(entra.token_requests) == 2
    assert azure.requests[-1].headers["authorization"] == f"Bearer {entra.issued[-1]}"


async def test_refused_entra_credentials_are_a_gateway_error(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    entra = azure.entra
    assert entra is not None
    azure_adapter = adapter(azure, http, **entra_extra(entra, client_secret="wrong"))
    with pytest.raises(ProviderError) as info:
        await azure_adapter.complete(ask())
    err = info.value
    assert err.upstream_status == 401 and not err.retryable
    assert "invalid_client" in err.message and "AADSTS7000215" in err.message
    assert "wrong" not in err.message  # the secret is never repeated
    assert err.to_http().status_code == 502
    assert not azure.requests  # no model call without a token


async def test_connection_refused_and_timeouts(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    gone = build_adapter(config(f"http://127.0.0.1:{free_port()}"), http)
    for call in (gone.complete(ask()), events_of(gone, ask()), gone.probe()):  # type: ignore[arg-type]
        with pytest.raises(ProviderError) as info:
            await call
        assert info.value.code == ErrorCode.UPSTREAM_UNAVAILABLE
    slow = adapter(azure, http, timeout_s=0.2)
    azure.script([FakeReply(text="late", delay_s=0.8)])
    with pytest.raises(ProviderError) as info:
        await slow.complete(ask())
    assert info.value.code == ErrorCode.UPSTREAM_TIMEOUT and info.value.retryable


async def test_probe_lists_models_with_the_api_version(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    await adapter(azure, http).probe()
    sent = last(azure)
    assert (sent.method, sent.path, sent.api_version) == ("GET", "/openai/models", "2024-10-21")
    with pytest.raises(ProviderError) as info:
        await adapter(azure, http, api_key="wrong").probe()
    assert info.value.upstream_status == 401


async def test_embeddings_go_to_the_embedding_deployment(
    azure: AzureOpenAIFake, http: httpx.AsyncClient
) -> None:
    got = await adapter(azure, http).embed(
        EmbedRequest("text-embedding-3-small", ("red apple", "green pear"), dimensions=None)
    )
    assert len(got.vectors) == 2 and len(got.vectors[0]) == 1536 and got.input_tokens == 4
    sent = last(azure)
    assert sent.path == "/openai/deployments/text-embedding-3-small/embeddings"
    assert sent.json == {"input": ["red apple", "green pear"], "encoding_format": "float"}
    assert not azure.violations


def test_the_declared_table_is_openais() -> None:
    assert AzureOpenAIAdapter.params is _params.OPENAI
    with pytest.raises(ValidationFailed):
        _params.fit(
            {"thinking": {"type": "enabled"}}, AzureOpenAIAdapter, "azure_openai", drop=False
        )


async def test_params_reach_the_body(azure: AzureOpenAIFake, http: httpx.AsyncClient) -> None:
    params = {"seed": 7, "response_format": {"type": "json_object"}}
    await adapter(azure, http).complete(ask(params=params))
    assert last(azure).json["seed"] == 7
    assert last(azure).json["response_format"] == {"type": "json_object"}


def test_settings_need_the_endpoint_and_all_of_entra() -> None:
    with pytest.raises(ConfigError, match="resource endpoint"):
        Settings.load(environ={}, providers={"azure_openai": {"api_key": "k"}})
    with pytest.raises(ConfigError, match="tenant_id, client_id and client_secret"):
        Settings.load(
            environ={},
            providers={
                "azure_openai": {"base_url": "https://x.openai.azure.com", "tenant_id": "t"}
            },
        )
    # The openai SDK's variable pair configures the kind; the key alone does not.
    alone = Settings.load(environ={"AZURE_OPENAI_API_KEY": "k"})
    assert "azure_openai" not in alone.providers
    pair = Settings.load(
        environ={"AZURE_OPENAI_API_KEY": "k", "AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com"}
    )
    (config,) = configured_providers(pair)
    assert (config.kind, config.base_url, config.api_key) == (
        "azure_openai",
        "https://x.openai.azure.com",
        "k",
    )
    assert config.extra["api_version"] == "2024-10-21"
    assert config.extra["authority"] == "https://login.microsoftonline.com"


# --- the fake against Azure's own client -------------------------------------------------
async def test_the_openai_sdks_azure_client_reads_the_fake(azure: AzureOpenAIFake) -> None:
    client = openai.AsyncAzureOpenAI(
        azure_endpoint=azure.url, api_key=KEY, api_version="2024-10-21"
    )
    async with client:
        azure.script([FakeReply(text="Hi there"), FakeReply(text="Streamed")])
        done = await client.chat.completions.create(
            model="prod-4o", messages=[{"role": "user", "content": "x"}]
        )
        assert done.choices[0].message.content == "Hi there"
        stream = await client.chat.completions.create(
            model="prod-4o",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "Streamed"
    assert last(azure).path == "/openai/deployments/prod-4o/chat/completions"


# --- through the gateway ---------------------------------------------------------------------
def gateway_settings(make_settings: Any, azure: AzureOpenAIFake, **kw: Any) -> Any:
    entra = azure.entra
    assert entra is not None
    providers = {
        "azure_openai": {
            "base_url": azure.url,
            "deployments": {
                "gpt-4o": "prod-4o",
                "text-embedding-3-small": "text-embedding-3-small",
            },
            "tenant_id": entra.tenant_id,
            "client_id": entra.client_id,
            "client_secret": entra.client_secret,
            "authority": entra.url,
        }
    }
    return make_settings(
        providers=providers, provider_retry_backoff_s=0.01, rate_limit_per_minute=0, **kw
    )


async def test_through_the_gateway_with_the_openai_sdk(
    make_settings: Any, azure: AzureOpenAIFake
) -> None:
    call = FakeToolCall("get_weather", {"city": "Oslo"}, id="call_gw1")
    azure.script(
        [
            azure_rate_limited(0),  # retried by the gateway after Retry-After
            FakeReply(text="Sunny", prompt_tokens=5, completion_tokens=2),
            FakeReply(tool_calls=[call]),
        ]
    )
    async with ServedApp(gateway_settings(make_settings, azure)) as app:
        client = openai.AsyncOpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN)
        async with client:
            done = await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Weather?"}]
            )
            assert done.choices[0].message.content == "Sunny"
            assert done.usage is not None and done.usage.prompt_tokens == 5
            stream = await client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=[
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "parameters": WEATHER.parameters,
                        },
                    }
                ],
                stream=True,
            )
            calls = []
            async for chunk in stream:
                for choice in chunk.choices:
                    calls += choice.delta.tool_calls or []
            assert calls[0].function is not None and calls[0].function.name == "get_weather"
            vectors = await client.embeddings.create(
                model="text-embedding-3-small", input=["a b", "c"]
            )
            assert len(vectors.data) == 2
        # Anthropic's SDK to an Azure deployment: the Messages body translated; a field
        # OpenAI's table does not declare is a 400 naming the provider.
        claude_sdk = anthropic.AsyncAnthropic(
            base_url=f"{app.url}/api", api_key=ADMIN_TOKEN, max_retries=0
        )
        async with claude_sdk:
            azure.script([FakeReply(text="Bonjour")])
            message = await claude_sdk.messages.create(
                model="gpt-4o", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
            )
            assert message.content[0].type == "text" and message.content[0].text == "Bonjour"
            with pytest.raises(anthropic.BadRequestError) as bad:
                await claude_sdk.messages.create(
                    model="gpt-4o",
                    max_tokens=4000,
                    messages=[{"role": "user", "content": "Hi"}],
                    thinking={"type": "enabled", "budget_tokens": 2000},
                )
            assert "not supported by provider azure_openai" in bad.value.response.text
        async with httpx.AsyncClient(
            base_url=f"{app.url}/api/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as admin:
            health = (await admin.get("/providers/health/azure_openai")).json()
    assert health["configured"] is True and health["reachable"] is True, health
    chats = [r for r in azure.requests if r.path.endswith("/chat/completions")]
    assert len(chats) == 4 and all(r.path.startswith("/openai/deployments/prod-4o/") for r in chats)
    entra = azure.entra
    assert entra is not None and len(entra.token_requests) == 1
    assert not azure.violations
