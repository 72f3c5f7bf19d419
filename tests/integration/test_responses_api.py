"""OpenAI's Responses API (issue 34) over HTTP: the real app under uvicorn, real Postgres and
Redis, loopback upstreams speaking OpenAI chat completions and Anthropic Messages. Clients:
the official `openai` SDK (`client.responses.*`, unchanged) and raw httpx; every body and
every streamed event is validated against OpenAI's own schema (tests/reference)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pydantic
import pytest

from orchestrator.errors import NotFound
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import (
    FakeAnthropic,
    Reply,
    text_reply,
    thinking_reply,
    tool_reply,
)
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake
from tests.integration.test_gateway import ADMIN, app, gateway_settings, oai_client, upstreams
from tests.openai_schema import REFERENCE, validate
from tests.sse import sse_frames

__all__ = ["app", "upstreams"]  # fixtures shared with the gateway tests

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


def _event_schemas() -> dict[str, str]:
    """Each streamed event type -> its schema in ResponseStreamEvent's union."""
    doc = json.loads(REFERENCE.read_text())["components"]["schemas"]
    out: dict[str, str] = {}
    for ref in doc["ResponseStreamEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        out[doc[name]["properties"]["type"]["enum"][0]] = name
    return out


EVENT_SCHEMAS = _event_schemas()


def _http(app: ServedApp, headers: dict[str, str] = ADMIN) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=headers, timeout=30)


async def _streamed(app: ServedApp, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a streamed response, each checked: SSE name = its type, sequence
    numbers 0, 1, 2..., and OpenAI's ResponseStreamEvent schema."""
    events: list[dict[str, Any]] = []
    async with _http(app) as http, http.stream("POST", "/responses", json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        assert answer.headers["content-type"].startswith("text/event-stream")
        async for frame in sse_frames(answer):
            if "comment" in frame:
                continue
            data = json.loads(frame["data"])
            assert frame["event"] == data["type"], frame
            validate(data, EVENT_SCHEMAS[data["type"]])  # names the mismatch precisely
            validate(data, "ResponseStreamEvent")
            events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


async def test_text_through_the_sdk_and_raw_bodies_match_the_schema(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    oai.script([FakeReply(text="Hello there!", prompt_tokens=9, completion_tokens=3)])
    client = oai_client(app)
    r = await asyncio.to_thread(
        client.responses.create, model="gpt-4o-mini", input="hi", instructions="be brief"
    )
    assert r.output_text == "Hello there!" and r.status == "completed"
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (9, 3, 12)
    sent = oai.chat_requests[-1].json
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    async with _http(app) as http:
        stored = (await http.get(f"/responses/{r.id}")).json()
    validate(stored, "Response")
    assert stored["output"][0]["content"][0]["text"] == "Hello there!"
    assert stored["instructions"] == "be brief" and stored["store"] is True

    # Streamed, through the SDK's helper: its snapshot and final response are ours.
    oai.script([FakeReply(text="Streamed words here.")])

    def stream() -> tuple[list[str], Any]:
        with client.responses.stream(model="gpt-4o-mini", input="hi again") as events:
            kinds = [e.type for e in events]
            return kinds, events.get_final_response()

    kinds, final = await asyncio.to_thread(stream)
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output_text == "Streamed words here."
    retrieved = await asyncio.to_thread(client.responses.retrieve, final.id)
    assert retrieved.output_text == "Streamed words here."

    # Raw: every event matches OpenAI's schema, and the completed response is GET's.
    oai.script([FakeReply(text="Raw stream.")])
    events = await _streamed(app, {"model": "gpt-4o-mini", "input": "once more", "stream": True})
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Raw stream."
    done = events[-1]
    assert done["type"] == "response.completed"
    async with _http(app) as http:
        again = (await http.get(f"/responses/{done['response']['id']}")).json()
    assert again == done["response"]


async def test_tool_round_trip_from_anthropic_with_previous_response_id(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    _, ant = upstreams
    ant.enqueue(tool_reply("get_weather", {"city": "Paris"}, id="toolu_1", text="Checking."))
    events = await _streamed(
        app,
        {
            "model": "claude-sonnet-4-5",
            "input": [{"role": "user", "content": "weather in Paris?"}],
            "instructions": "use tools",
            "tools": [WEATHER],
            "tool_choice": "auto",
            "stream": True,
        },
    )
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds
    args_done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(args_done["arguments"]) == {"city": "Paris"}
    first = events[-1]["response"]
    call = next(item for item in first["output"] if item["type"] == "function_call")
    assert (call["call_id"], call["name"]) == ("toolu_1", "get_weather")
    sent = ant.requests[-1].json
    assert sent["system"] == "use tools" and sent["tools"][0]["name"] == "get_weather"

    # The tool's output continues the stored conversation (instructions not carried over).
    ant.enqueue(text_reply("It is sunny in Paris."))
    client = oai_client(app)
    second = await asyncio.to_thread(
        client.responses.create,
        model="claude-sonnet-4-5",
        previous_response_id=first["id"],
        input=[{"type": "function_call_output", "call_id": "toolu_1", "output": "sunny, 24C"}],
        tools=[WEATHER],
    )
    assert second.output_text == "It is sunny in Paris."
    assert second.previous_response_id == first["id"]
    sent = ant.requests[-1].json
    assert "system" not in sent
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assistant = sent["messages"][1]["content"]
    assert assistant[0] == {"type": "text", "text": "Checking."}
    assert assistant[1]["type"] == "tool_use" and assistant[1]["id"] == "toolu_1"
    result = sent["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_1"


async def test_store_false_tenancy_delete_and_chain(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    client = oai_client(app)
    oai.script([FakeReply(text="one"), FakeReply(text="two"), FakeReply(text="three")])
    r1 = await asyncio.to_thread(client.responses.create, model="gpt-4o", input="first")
    r2 = await asyncio.to_thread(
        client.responses.create, model="gpt-4o", input="second", previous_response_id=r1.id
    )
    assert [m["content"] for m in oai.chat_requests[-1].json["messages"]] == [
        "first",
        "one",
        "second",
    ]
    ephemeral = await asyncio.to_thread(
        client.responses.create, model="gpt-4o", input="x", store=False
    )
    assert ephemeral.store is False
    async with _http(app) as http:
        assert (await http.get(f"/responses/{ephemeral.id}")).status_code == 404
        made = await http.post("/tokens", json={"user_uuid": "mallory"})
        mallory = {"Authorization": f"Bearer {made.json()['token']}"}
        async with _http(app, mallory) as other:
            for path in (f"/responses/{r1.id}", f"/responses/{r1.id}/input_items"):
                answer = await other.get(path)
                assert answer.status_code == 404, answer.text
                assert answer.json()["ok"] is False
            assert (await other.delete(f"/responses/{r1.id}")).status_code == 404
            chained = await other.post(
                "/responses",
                json={"model": "gpt-4o", "input": "hi", "previous_response_id": r1.id},
            )
            assert chained.status_code == 404, chained.text
        gone = await http.delete(f"/responses/{r2.id}")
        assert gone.json() == {"id": r2.id, "object": "response", "deleted": True}
        assert (await http.get(f"/responses/{r2.id}")).status_code == 404
        assert (await http.delete(f"/responses/{r2.id}")).status_code == 404
    await asyncio.to_thread(client.responses.delete, r1.id)  # the SDK's delete
    with pytest.raises(openai.NotFoundError):
        await asyncio.to_thread(client.responses.retrieve, r1.id)


async def test_input_items_paging(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    oai.script([FakeReply(text="ok")])
    words = ["a", "b", "c", "d", "e"]
    async with _http(app) as http:
        made = await http.post(
            "/responses",
            json={
                "model": "gpt-4o-mini",
                "input": [{"role": "user", "content": w} for w in words],
                "metadata": {"case": "paging"},
            },
        )
        body = made.json()
        validate(body, "Response")
        assert body["metadata"] == {"case": "paging"}
        rid = body["id"]
        first = (await http.get(f"/responses/{rid}/input_items", params={"limit": 2})).json()
        validate(first, "ResponseItemList")
        assert [i["content"][0]["text"] for i in first["data"]] == ["e", "d"]  # desc default
        assert first["has_more"] is True and first["last_id"] == first["data"][-1]["id"]
        page = await http.get(
            f"/responses/{rid}/input_items",
            params={"limit": 2, "order": "asc", "after": first["data"][0]["id"]},
        )
        assert page.json()["data"] == [] and page.json()["has_more"] is False
        asc = (await http.get(f"/responses/{rid}/input_items", params={"order": "asc"})).json()
        assert [i["content"][0]["text"] for i in asc["data"]] == words
        middle = await http.get(
            f"/responses/{rid}/input_items",
            params={"order": "asc", "after": asc["data"][0]["id"], "limit": 2},
        )
        assert [i["content"][0]["text"] for i in middle.json()["data"]] == ["b", "c"]
        assert middle.json()["has_more"] is True
        bad = await http.get(f"/responses/{rid}/input_items", params={"limit": 0})
        assert bad.status_code == 400
    client = oai_client(app)
    listed = await asyncio.to_thread(
        lambda: [i.id for i in client.responses.input_items.list(rid, limit=2, order="asc")]
    )
    assert listed == [i["id"] for i in asc["data"]]  # the SDK's auto-paging follows `after`


async def test_json_schema_to_both_upstreams_and_fields_refused_by_name(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "place", "schema": schema, "strict": True}
    oai.script([FakeReply(text='{"city": "Oslo"}')])
    ant.enqueue(text_reply('{"city": "Rome"}'))
    async with _http(app) as http:
        for model in ("gpt-4o-mini", "claude-sonnet-4-5"):
            answer = await http.post(
                "/responses", json={"model": model, "input": "a city", "text": {"format": fmt}}
            )
            assert answer.status_code == 200, answer.text
            validate(answer.json(), "Response")
            assert answer.json()["text"]["format"]["type"] == "json_schema"
        assert oai.chat_requests[-1].json["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "place", "schema": schema, "strict": True},
        }
        assert ant.requests[-1].json["output_config"]["format"]["schema"] == schema

    # The SDK's structured outputs (`responses.parse` with a pydantic model) read it back.
    class Place(pydantic.BaseModel):
        city: str

    ant.enqueue(text_reply('{"city": "Lima"}'))
    parsed = await asyncio.to_thread(
        oai_client(app).responses.parse,
        model="claude-sonnet-4-5",
        input="a city",
        text_format=Place,
    )
    assert parsed.output_parsed == Place(city="Lima")
    async with _http(app) as http:
        refused = [
            ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
            ({"background": True}, "background"),
            ({"include": ["message.output_text.logprobs"]}, "include[0]"),
            ({"truncation": "auto"}, "truncation"),
            ({"conversation": "conv_1"}, "conversation"),
            ({"frobnicate": 1}, "frobnicate"),
            (
                {
                    "input": [
                        {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_file", "file_id": "file_1"}],
                        }
                    ]
                },
                "input[0].content[0].file_id",
            ),
        ]
        for extra, field in refused:
            body = {"model": "gpt-4o-mini", "input": "hi", **extra}
            answer = await http.post("/responses", json=body)
            assert answer.status_code == 400, (extra, answer.text)
            assert field in [f["field"] for f in answer.json()["fields"]], answer.json()
        # A field the provider's table does not honour: 400 naming field and provider.
        answer = await http.post(
            "/responses",
            json={"model": "claude-sonnet-4-5", "input": "hi", "service_tier": "flex"},
        )
        assert answer.status_code == 400, answer.text
        assert "service_tier" in answer.json()["error"] and "anthropic" in answer.json()["error"]
        # ... named as the caller wrote it (`reasoning.effort`, not the table's name).
        answer = await http.post(
            "/responses",
            json={"model": "claude-sonnet-4-5", "input": "hi", "reasoning": {"effort": "xhigh"}},
        )
        assert answer.status_code == 400, answer.text
        assert [f["field"] for f in answer.json()["fields"]] == ["reasoning.effort"]


async def test_unsupported_fields_dropped_and_listed_when_configured(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant, drop_unsupported_params=True)
    ant.enqueue(text_reply("ok"), text_reply("streamed ok"))
    body = {
        "model": "claude-sonnet-4-5",
        "input": "hi",
        "service_tier": "flex",
        "reasoning": {"effort": "xhigh"},
    }
    async with ServedApp(settings) as served, _http(served) as http:
        answer = await http.post("/responses", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Orchestrator-Dropped-Params"] == "service_tier,reasoning.effort"
        async with http.stream("POST", "/responses", json={**body, "stream": True}) as streamed:
            assert streamed.headers["X-Orchestrator-Dropped-Params"] == (
                "service_tier,reasoning.effort"
            )
            await streamed.aread()
    sent = ant.requests[-1].json
    assert "service_tier" not in sent and "thinking" not in sent


async def test_thinking_as_reasoning_items_round_trips_statelessly(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    _, ant = upstreams
    ant.enqueue(thinking_reply("Let me think.", "42.", signature="sig-1"))
    body = {
        "model": "claude-sonnet-4-5",
        "input": "the answer?",
        "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
    }
    async with _http(app) as http:
        answer = (await http.post("/responses", json=body)).json()
    validate(answer, "Response")
    reasoning, message = answer["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert reasoning["encrypted_content"] == "sig-1"
    assert message["content"][0]["text"] == "42."
    assert ant.requests[-1].json["thinking"] == {"type": "enabled", "budget_tokens": 1024}

    # Sent back as input (no store): the thinking block with its signature reaches Anthropic.
    ant.enqueue(text_reply("Yes."))
    follow = {
        "model": "claude-sonnet-4-5",
        "input": [
            {"role": "user", "content": "the answer?"},
            reasoning,
            message,
            {"role": "user", "content": "sure?"},
        ],
        "store": False,
    }
    async with _http(app) as http:
        assert (await http.post("/responses", json=follow)).status_code == 200
    thinking = ant.requests[-1].json["messages"][1]["content"][0]
    assert thinking == {"type": "thinking", "thinking": "Let me think.", "signature": "sig-1"}

    # Streamed: the summary events, each valid.
    ant.enqueue(thinking_reply("Hmm.", "Done."))
    events = await _streamed(app, {**body, "stream": True})
    kinds = [e["type"] for e in events]
    assert "response.reasoning_summary_text.delta" in kinds
    assert kinds.index("response.reasoning_summary_part.added") < kinds.index(
        "response.output_text.delta"
    )


async def test_incomplete_and_failed_streams(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    ant.enqueue(Reply([{"type": "text", "text": "cut"}], stop_reason="max_tokens"))
    events = await _streamed(
        app,
        {"model": "claude-sonnet-4-5", "input": "long", "max_output_tokens": 16, "stream": True},
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert ant.requests[-1].json["max_tokens"] == 16

    oai.script([FakeReply(text="a long answer that breaks", fail_after=3)])
    events = await _streamed(app, {"model": "gpt-4o-mini", "input": "x", "stream": True})
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    async with _http(app) as http:  # stored as failed
        assert (await http.get(f"/responses/{failed['id']}")).json()["status"] == "failed"


async def test_function_tool_call_from_openai_upstream_through_the_sdk_stream(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    oai.script([FakeReply(tool_calls=[FakeToolCall("get_weather", {"city": "Oslo"}, id="call_7")])])
    client = oai_client(app)

    def run() -> Any:
        stream = client.responses.create(
            model="gpt-4o-mini",
            input="weather in Oslo?",
            tools=[WEATHER],  # type: ignore[list-item]
            parallel_tool_calls=False,
            stream=True,
        )
        return [event for event in stream]

    events = await asyncio.to_thread(run)
    final = events[-1].response
    call = final.output[0]
    assert call.type == "function_call" and call.call_id == "call_7"
    assert json.loads(call.arguments) == {"city": "Oslo"}
    sent = oai.chat_requests[-1].json
    assert sent["parallel_tool_calls"] is False
    assert sent["tools"][0]["function"]["name"] == "get_weather"


async def test_custom_tool_as_codex_declares_apply_patch(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    oai.script([FakeReply(tool_calls=[FakeToolCall("apply_patch", {"input": patch}, id="call_p")])])
    tool = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Use this tool to edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"},
    }
    body = {"model": "gpt-4o-mini", "input": "add a.txt", "tools": [tool], "store": False}
    events = await _streamed(app, {**body, "stream": True})
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == patch
    call = events[-1]["response"]["output"][0]
    assert (call["type"], call["call_id"], call["input"]) == ("custom_tool_call", "call_p", patch)
    sent = oai.chat_requests[-1].json["tools"][0]["function"]
    assert sent["name"] == "apply_patch" and "start: begin_patch" in sent["description"]

    oai.script([FakeReply(text="Added.")])
    follow = {
        **body,
        "input": [
            {"role": "user", "content": "add a.txt"},
            call,
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."},
        ],
    }
    async with _http(app) as http:
        answer = await http.post("/responses", json=follow)
    assert answer.status_code == 200, answer.text
    messages = oai.chat_requests[-1].json["messages"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == json.dumps({"input": patch})
    assert messages[2] == {"role": "tool", "tool_call_id": "call_p", "content": "Success."}


async def test_store_expiry_purge_and_chain_scoping(database_url: str) -> None:
    """The store on a real database: the retention is the setting's, expired rows read as
    missing before any purge, the purge deletes only them, and a chain never crosses owners
    or an expired link."""
    from orchestrator.db import connect
    from orchestrator.responses import ResponseStore

    db = await connect(database_url)
    try:
        store = ResponseStore(db.pool, retention_s=2_592_000)

        async def save(owner: str, rid: str, previous: str | None = None) -> None:
            answer = {"id": rid, "model": "m", "status": "completed", "output": []}
            item = {"id": f"msg_{rid}", "type": "message", "role": "user", "content": []}
            await store.save(
                owner, answer, [item], instructions=None, previous_response_id=previous
            )

        await save("ann", "resp_1")
        await save("ann", "resp_2", "resp_1")
        await save("bob", "resp_3", "resp_2")  # names ann's response: never followed
        await save("ann", "resp_4", "resp_3")  # names bob's: the chain ends there
        ttl = await db.pool.fetchval("SELECT expires_at - created_at FROM responses LIMIT 1")
        assert ttl == 2_592_000_000
        assert [i["id"] for i in await store.history("ann", "resp_2")] == [
            "msg_resp_1",
            "msg_resp_2",
        ]
        assert [i["id"] for i in await store.history("bob", "resp_3")] == ["msg_resp_3"]
        assert [i["id"] for i in await store.history("ann", "resp_4")] == ["msg_resp_4"]
        for missing in (("bob", "resp_1"), ("ann", "resp_3")):
            with pytest.raises(NotFound):
                await store.get(*missing)
        await db.pool.execute("UPDATE responses SET expires_at = 0 WHERE id = 'resp_1'")
        with pytest.raises(NotFound):
            await store.get("ann", "resp_1")  # expired: gone before any purge
        assert [i["id"] for i in await store.history("ann", "resp_2")] == ["msg_resp_2"]
        assert await store.purge_expired() == 1 and await store.purge_expired() == 0
        ids = await db.pool.fetch("SELECT id FROM responses ORDER BY id")
        assert [r["id"] for r in ids] == ["resp_2", "resp_3", "resp_4"]
    finally:
        await db.close()


async def test_the_service_sdk_creates_reads_lists_and_deletes(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    from orchestrator.sdk import AsyncClient

    oai, _ = upstreams
    oai.script([FakeReply(text="one"), FakeReply(text="two")])
    async with AsyncClient(app.url, ADMIN_TOKEN) as api:
        first = await api.create_response("hi", model="gpt-4o-mini", instructions="be brief")
        assert first.output_text == "one" and first.instructions == "be brief"
        second = await api.create_response(
            [{"role": "user", "content": "and?"}],
            model="gpt-4o-mini",
            previous_response_id=first.id,
        )
        assert second.output_text == "two" and second.previous_response_id == first.id
        assert (await api.response(second.id)).output == second.output
        page = await api.response_input_items(second.id, order="asc")
        assert [i["content"][0]["text"] for i in page.data] == ["and?"]
        assert (await api.delete_response(first.id)).deleted is True
