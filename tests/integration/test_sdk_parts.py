"""Every part of the API through the SDK, against the real app (uvicorn on loopback, real
Postgres and Redis, a loopback OpenAI peer for the models): events (pages, the iterator, the
live stream reconnecting through a proxy that drops it), workflows and schedules iterators,
memory, workspace files, marketplace, channels, inference instances, models, providers
health, chat completions and messages (streamed and not)."""

from __future__ import annotations

import asyncio
import base64
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from orchestrator.sdk import ApiError, AsyncClient, Client, Event
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import MODEL, agent_settings

T = TypeVar("T")


def until(check: Callable[[], T | None], seconds: float = 20) -> T:
    deadline = time.monotonic() + seconds
    while (found := check()) is None or found is False:
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return found


class DroppingProxy:
    """A TCP proxy in front of the app that can cut every open connection (a load balancer
    restarting, a network blip); it keeps the head of each request it forwarded."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record and data.split(b" ", 1)[0] in (b"GET", b"POST", b"PUT", b"DELETE"):
                    self.requests.append(data)  # a request's head (keep-alive: several)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def drop(self) -> None:
        with self.lock:
            sockets, self.open = self.open, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.drop()
        self.listener.close()

    def last_event_ids(self, path: bytes) -> list[str | None]:
        found = []
        for raw in self.requests:
            if b" " + path in raw.split(b"\r\n", 1)[0]:
                headers = dict(
                    line.split(b": ", 1) for line in raw.split(b"\r\n")[1:] if b": " in line
                )
                value = {k.lower(): v for k, v in headers.items()}.get(b"last-event-id")
                found.append(None if value is None else value.decode())
        return found


STEPS: list[Any] = [{"name": "a", "prompt": "[answer ok]"}]


async def test_events_workflows_and_schedules(make_settings: Any) -> None:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as app:
            proxy = DroppingProxy(app.port)
            try:
                await asyncio.to_thread(_events_part, app.url, proxy)
            finally:
                proxy.close()
            async with AsyncClient(app.url, ADMIN_TOKEN) as api:
                seen = [e async for e in api.iter_events(types=["workflow.started"], page_size=2)]
                assert len(seen) == 4
                assert [w.id async for w in api.iter_workflows(page_size=3)] == [
                    w.id for w in (await api.workflows(limit=100)).data
                ]
                made = [
                    (await api.create_schedule(f"p{i}", name=f"j{i}", every=3_600_000)).id
                    for i in range(3)
                ]
                assert sorted([j.id async for j in api.iter_schedules(page_size=2)]) == made


def _events_part(url: str, proxy: DroppingProxy) -> None:
    with Client(url, ADMIN_TOKEN) as api:
        first = api.create_workflow("w0", STEPS)
        until(lambda: api.workflow(first.id).finished)  # no more events from it
        # Pages: the iterator walks every page and agrees with one big page.
        everything = api.events(limit=1000).data
        assert [e.position for e in api.iter_events(page_size=3)] == [
            e.position for e in everything
        ]
        assert api.events(limit=2, offset=1).data == everything[1:3]
        start = max(e.position for e in everything)

    # The live stream, through a proxy that cuts the connection mid-stream.
    with Client(proxy.url, ADMIN_TOKEN) as api:
        got: queue.Queue[Event] = queue.Queue()
        wanted: set[str] = set()

        def listen() -> None:
            for event in api.sync_events(types=["workflow.started"], last_event_id=start):
                got.put(event)
                if event.aggregate_id in wanted:
                    return

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        second = api.create_workflow("w1", STEPS)
        before = got.get(timeout=20)
        assert before.aggregate_id == second.id and before.type == "workflow:started"
        proxy.drop()  # the stream (and the client's pooled connections) are cut
        third = api.create_workflow("w2", STEPS)
        wanted.add(third.id)
        after = got.get(timeout=20)
        listener.join(10)
        assert after.aggregate_id == third.id and after.position > before.position
        assert got.empty()  # nothing repeated
        assert proxy.last_event_ids(b"/api/v1/sync-events")[:2] == [
            str(start),
            str(before.position),
        ]
        api.create_workflow("w3", STEPS)


async def test_memory_and_workspace(make_settings: Any) -> None:
    async with ServedApp(make_settings(rate_limit_per_minute=0)) as app:
        await asyncio.to_thread(_memory_and_workspace_part, app.url)
        async with AsyncClient(app.url, ADMIN_TOKEN) as api:
            assert (await api.read_file("notes/a.txt")).content == "hello, SDK"
            assert [e.key async for e in api.iter_memory("sdk", page_size=2)]


def _memory_and_workspace_part(url: str) -> None:
    dim = 384
    admin = Client(url, ADMIN_TOKEN)
    ann = Client(url, admin.create_token("ann").token)
    with admin, ann:
        for i in range(5):
            vector = [0.0] * dim
            vector[i] = 1.0
            assert ann.memory_store("sdk", f"k{i}", f"value {i}", embedding=vector).status == "ok"
        assert ann.memory_get("sdk", "k1").value == "value 1"
        assert [e.key for e in ann.memory_search("sdk", "value").results]
        assert sorted(e.key for e in ann.iter_memory("sdk", page_size=2)) == [
            f"k{i}" for i in range(5)
        ]
        probe = [0.0] * dim
        probe[3] = 1.0
        near = ann.memory_vector_search("sdk", embedding=probe, limit=1).results
        assert near[0].key == "k3" and near[0].similarity > 0.99
        assert ann.memory_pin("sdk", "k0").pinned is True
        assert ann.memory_reflections("sdk").reflections == []
        assert ann.memory_delete("sdk", "k4").status == "ok"
        with pytest.raises(ApiError) as caught:
            ann.memory_get("sdk", "k4")
        assert caught.value.status == 404
        # Admin-only parts, and an admin reading ann's entry by owner.
        assert admin.memory_get("sdk", "k1", user_uuid="ann").value == "value 1"
        assert admin.memory_stats().total_entries >= 4
        assert admin.memory_decay().forgotten >= 0
        assert admin.memory_share("sdk", "copy", pattern="k*").copied >= 0
        with pytest.raises(ApiError) as caught:
            ann.memory_decay()
        assert caught.value.status == 403
        assert ann.memory_clear("sdk").cleared == 4
        assert admin.memory_store("sdk", "kept", "for the async part").status == "ok"

        # Workspace files.
        written = admin.write_file("notes/a.txt", "hello, world")
        assert written.created and written.size == 12
        assert admin.edit_file("notes/a.txt", "world", "SDK").replacements == 1
        read = admin.read_file("notes/a.txt")
        assert (read.content, read.encoding) == ("hello, SDK", "utf-8")
        raw = base64.b64encode(b"\x00\xff").decode()
        assert admin.write_file("bin/b.dat", raw, encoding="base64").size == 2
        assert admin.read_file("bin/b.dat").encoding == "base64"
        assert [h.path for h in admin.search_files("**/*.txt").results] == ["notes/a.txt"]
        listing = admin.list_files(recursive=True)
        assert {e.path for e in listing.entries} >= {"notes", "notes/a.txt", "bin/b.dat"}
        assert listing.entries[0].type in ("file", "directory")
        with pytest.raises(ApiError) as caught:
            admin.edit_file("notes/a.txt", "absent", "x")
        assert caught.value.status in (400, 404, 409, 422)


async def test_marketplace_channels_and_tokens(make_settings: Any) -> None:
    async with ServedApp(make_settings(rate_limit_per_minute=0)) as app:
        await asyncio.to_thread(_marketplace_and_channels_part, app.url)


def _marketplace_and_channels_part(url: str) -> None:
    admin = Client(url, ADMIN_TOKEN)
    ann_token = admin.create_token("ann", description="sdk parts").token
    bob_token = admin.create_token("bob").token
    with Client(url, ann_token) as ann, Client(url, bob_token) as bob, admin:
        assert ann.whoami().user_uuid == "ann"
        for i in range(3):
            made = ann.publish_skill(f"tool-{i}", f"body {i}", description="d", tags=["sdk"])
            assert made.created and made.author == "ann"
        assert ann.browse_skills(limit=2).has_more
        assert sorted(s.name for s in bob.iter_skills(tags=["sdk"], page_size=2)) == [
            "tool-0",
            "tool-1",
            "tool-2",
        ]
        assert [s.name for s in bob.iter_skills("tool", page_size=1)]
        assert bob.search_skills("tool").total == 3
        detail = bob.skill("tool-1")
        assert (detail.body, detail.author, detail.tags) == ("body 1", "ann", ["sdk"])
        assert bob.report_skill("tool-1", "spam").author == "ann"
        reports = [r.reason for r in admin.iter_skill_reports(page_size=1)]
        assert reports == ["spam"] and admin.skill_reports().total == 1
        assert admin.dismiss_reports("tool-1", author="ann").dismissed == 1
        assert ann.delete_skill("tool-2").deleted is True
        with pytest.raises(ApiError) as caught:
            bob.skill("tool-2")
        assert caught.value.status == 404

        # Channels: a generic webhook channel, paused, its webhook, rotated, deleted.
        created = ann.create_channel("webhook", "hook", {})
        channel_id, token = created.data.id, created.data.webhook_token
        assert [c.id for c in ann.channels().data] == [channel_id]
        assert ann.channel(channel_id).status == "active"
        assert ann.update_channel(channel_id, status="paused").data.status == "paused"
        ack = admin.channel_webhook(token, {"text": "hi", "user": "zed"})
        assert (ack.accepted, ack.ignored) == (False, "channel paused")
        rotated = ann.update_channel(channel_id, name="renamed", rotate_token=True)
        assert rotated.webhook_token and rotated.webhook_token != token
        assert rotated.data.name == "renamed"
        with pytest.raises(ApiError) as caught:
            bob.channel(channel_id)
        assert caught.value.status == 404
        assert ann.delete_channel(channel_id).deleted == channel_id
        assert ann.revoke_token(ann_token[:12]).revoked == 1


async def test_inference_models_providers_and_chat(make_settings: Any) -> None:
    async with OpenAIFake(api_key="sk-agent") as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as app:
            await asyncio.to_thread(_inference_and_chat_part, app.url)
            async with AsyncClient(app.url, ADMIN_TOKEN) as api:
                chunks = [
                    c
                    async for c in api.chat_completion_stream(
                        [{"role": "user", "content": "yo"}], model=MODEL
                    )
                ]
                assert "".join(c.choices[0].delta.get("content") or "" for c in chunks if c.choices)
                events = [
                    e.type
                    async for e in api.message_stream(
                        [{"role": "user", "content": "a"}], model=MODEL
                    )
                ]
                assert events[0] == "message_start" and events[-1] == "message_stop"


def _inference_and_chat_part(url: str) -> None:
    with Client(url, ADMIN_TOKEN) as api:
        assert api.instances().data == []
        with pytest.raises(ApiError) as caught:
            api.instance("inf-404")
        assert caught.value.status == 404
        with pytest.raises(ApiError) as caught:
            api.stop_instance("inf-404")
        assert caught.value.status == 404
        assert api.stop_all_instances().stopped == []
        assert MODEL in {m.name for m in api.models().models}
        assert api.discover_models().discovered >= 0
        health = api.providers_health()
        assert health.providers["openai"].configured and health.configured >= 1
        one = api.provider_health("openai")
        assert (one.provider, one.reachable, one.kind) == ("openai", True, "openai")
        # These answers have no schema in the OpenAPI document: the SDK's models must know
        # every field the server sent (nothing left over as an unknown extra).
        assert [p.model_extra for p in health.providers.values()] == [{}] * len(health.providers)
        assert one.model_extra == {} and health.model_extra == {}
        assert api.instances().model_extra == {}

        hello = [{"role": "user", "content": "hello there"}]
        completion = api.chat_completion(hello, model=MODEL, max_tokens=20)
        assert completion.choices[0].message.content and completion.model == MODEL
        chunks = list(api.chat_completion_stream(hello, model=MODEL))
        text = "".join(c.choices[0].delta.get("content") or "" for c in chunks if c.choices)
        assert text == completion.choices[0].message.content
        message = api.message(hello, model=MODEL, extra_body={"system": "be brief"})
        assert message.text == completion.choices[0].message.content
        kinds = [e.type for e in api.message_stream(hello, model=MODEL)]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert "content_block_delta" in kinds
        counted = api.count_message_tokens(hello, model=MODEL, extra_body={"system": "be brief"})
        assert counted.input_tokens >= 1 and counted.model_extra == {}  # OpenAI: estimated
        with pytest.raises(ApiError) as caught:
            api.chat_completion(hello, model="no-such-model")
        assert caught.value.status in (400, 404)
