"""Local instances end to end without Ray: the real app with `InProcessInference` (the same
supervisor the actor runs), the bundled cyllama launcher serving SmolLM2 on its own port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from orchestrator.db import connect
from orchestrator.inference import InProcessInference, ready_endpoints
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.gguf import write_gguf
from tests.sse import sse_frames

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SMOL = "SmolLM2-135M-Instruct.Q4_1"


class InferenceApp(ServedApp):
    """`ServedApp` with local inference run by this process."""

    def __init__(self, settings: Any) -> None:
        from deployments.api import create_app

        self.local = InProcessInference(settings)
        super().__init__(settings, create_app(settings, local_inference=self.local))


def _settings(make_settings, tmp_path: Path, **overrides: Any):
    values: dict[str, Any] = {
        "models_dir": tmp_path / "models",
        "inference_poll_interval_s": 0.2,
        "inference_health_timeout_s": 2.0,
        "inference_start_timeout_s": 60.0,
        "inference_threads": 2,
        "inference_ctx_size": 2048,
    }
    values.update(overrides)
    return make_settings(**values)


async def _token(c: httpx.AsyncClient, user: str) -> dict[str, str]:
    made = (await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": user})).json()
    return {"Authorization": f"Bearer {made['token']}"}


async def wait_state(
    c: httpx.AsyncClient, instance_id: str, states: set[str], within: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        body = (await c.get(f"/api/v1/inference/{instance_id}", headers=ADMIN)).json()
        if body["state"] in states:
            return body
        assert time.monotonic() < deadline, f"{instance_id} stuck in {body}"
        await asyncio.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited: its parent just has not reaped it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def _events(c: httpx.AsyncClient, aggregate: str) -> list[dict[str, Any]]:
    page = (
        await c.get("/api/v1/events", headers=ADMIN, params={"aggregate": aggregate, "limit": 500})
    ).json()
    return page["data"]


async def test_smollm2_instance_lifecycle(make_settings, tmp_path: Path) -> None:
    settings = _settings(make_settings, tmp_path)
    async with InferenceApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        bob = await _token(c, "bob")

        # Validation names the field; an unknown model is a clear 404.
        r = await c.post("/api/v1/inference", headers=bob, json={"model": SMOL, "ctx_size": 5})
        assert r.status_code == 400 and r.json()["fields"][0]["field"] == "ctx_size"
        r = await c.post("/api/v1/inference", headers=bob, json={})
        assert r.status_code == 400 and r.json()["fields"][0]["field"] == "model"
        r = await c.post("/api/v1/inference", headers=bob, json={"model": "no-such-model"})
        assert r.status_code == 404 and r.json()["code"] == "model_not_found"
        assert "no-such-model" in r.json()["error"] and "POST /discover" in r.json()["error"]
        r = await c.post("/api/v1/inference", headers=bob, json={"model": "../etc/passwd"})
        assert r.status_code == 404

        # The bundled model starts by its file name without a discovery first.
        r = await c.post("/api/v1/inference", headers=bob, json={"model": f"{SMOL}.gguf"})
        assert r.status_code == 200, r.text
        started = r.json()
        assert started["ok"] is True and started["state"] == "starting"
        iid = started["id"]
        assert iid.startswith("inf-") and iid[4:].isdigit()

        ready = await wait_state(c, iid, {"ready"})
        assert ready["model"] == SMOL and ready["ctx_size"] == 2048 and ready["threads"] == 2
        assert ready["gpu_layers"] == 99 and ready["user_uuid"] == "bob" and ready["error"] is None
        assert ready["tools"] is False  # its /props: the bundled server takes no tools
        base_url = ready["base_url"]
        assert base_url == f"http://127.0.0.1:{ready['port']}/v1"
        pid = ready["pid"]
        assert _alive(pid)

        models = (await c.get("/api/v1/models", headers=bob)).json()["models"]
        assert {"name": SMOL, "status": "loaded", "provider": "local", "ctx_size": 2048} in models

        # The gateway's view: one indexed query, with the key the instance's server requires.
        db = await connect(settings.database_url)
        try:
            endpoints = await ready_endpoints(db.pool)
        finally:
            await db.close()
        assert [(e.id, e.model, e.base_url, e.ctx_size, e.tools) for e in endpoints] == [
            (iid, SMOL, base_url, 2048, False)
        ]
        key = endpoints[0].api_key
        assert len(key) >= 32 and key not in repr(endpoints)
        for shown in (ready, (await c.get("/api/v1/inference", headers=bob)).json()):
            assert key not in json.dumps(shown)
        assert key not in " ".join(psutil.Process(pid).cmdline())  # readable by any local user

        # Only the service reaches the instance's port: without its key (or with another,
        # e.g. a user's token), everything but /health is a 401.
        root = base_url.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=30) as outsider:
            assert (await outsider.get(f"{root}/health")).status_code == 200
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            for auth in ({}, {"Authorization": "Bearer wrong"}, bob, {"Authorization": key}):
                for method, path, body in (
                    ("POST", "/v1/chat/completions", chat),
                    ("POST", "/chat/completions", chat),
                    ("GET", "/v1/models", None),
                    ("GET", "/models", None),
                    ("GET", "/slots", None),
                ):
                    r = await outsider.request(method, f"{root}{path}", json=body, headers=auth)
                    assert r.status_code == 401, (path, auth, r.text)
                    assert r.json()["error"]["type"] == "authentication_error"

        # Instances are shared capacity: another user's chat through the service runs on it.
        carol = await _token(c, "carol")
        r = await c.post(
            "/api/v1/chat/completions",
            headers=carol,
            json={"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]

        # Chat straight to the instance with its key: plain, then streamed with usage.
        keyed = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=keyed) as llm:
            r = await llm.post(
                "/chat/completions",
                json={
                    "model": SMOL,
                    "messages": [{"role": "user", "content": "Say hello."}],
                    "max_tokens": 16,
                    "temperature": 0,
                },
            )
            assert r.status_code == 200
            answer = r.json()
            assert answer["object"] == "chat.completion" and answer["model"] == SMOL
            assert answer["choices"][0]["message"]["content"].strip()
            assert answer["choices"][0]["finish_reason"] in ("stop", "length")
            assert answer["usage"]["prompt_tokens"] > 0
            assert 0 < answer["usage"]["completion_tokens"] <= 16

            chunks: list[dict[str, Any]] = []
            async with llm.stream(
                "POST",
                "/chat/completions",
                json={
                    "model": SMOL,
                    "messages": [{"role": "user", "content": "Count from one to ten."}],
                    "max_tokens": 24,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                frames = [f async for f in sse_frames(stream)]
            assert frames[-1] == {"data": "[DONE]"}
            chunks = [json.loads(f["data"]) for f in frames[:-1]]
            assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
            assert len({ch["id"] for ch in chunks}) == 1
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            text = "".join(
                ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"]
            )
            assert text.strip()
            finish = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
            assert len(finish) == 1 and chunks[-1]["choices"] == []
            # include_usage: every other chunk has "usage": null, the last one the counts.
            assert all(ch["usage"] is None for ch in chunks[:-1])
            counted = chunks[-1]["usage"]
            pieces = [ch for ch in chunks[1:] if ch["choices"] and ch["choices"][0]["delta"]]
            assert 0 < len(pieces) <= counted["completion_tokens"] <= 24
            assert (
                counted["total_tokens"] == counted["prompt_tokens"] + counted["completion_tokens"]
            )

            # llama-server's errors: a prompt larger than the context, a bad logit_bias.
            r = await llm.post(
                "/chat/completions",
                json={"messages": [{"role": "user", "content": "word " * 3000}]},
            )
            assert r.status_code == 400
            error = r.json()["error"]
            assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 2048
            assert error["n_prompt_tokens"] > 2048
            r = await llm.post(
                "/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}], "logit_bias": {"a": 1}},
            )
            assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]

            # While a long answer is generated the instance is running, then ready again.
            long_answer = asyncio.create_task(
                llm.post(
                    "/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": "Write a long story."}],
                        "max_tokens": 300,
                        "ignore_eos": True,  # llama-server's: exactly max_tokens tokens
                    },
                )
            )
            await wait_state(c, iid, {"running"}, within=20)
            long = await long_answer
            assert long.status_code == 200 and long.json()["usage"]["completion_tokens"] == 300
            assert long.json()["choices"][0]["finish_reason"] == "length"
            await wait_state(c, iid, {"ready"}, within=20)

        # Tenancy: another user neither sees nor stops it; an admin sees everything.
        assert (await c.get(f"/api/v1/inference/{iid}", headers=carol)).status_code == 404
        assert (await c.post("/api/v1/stop", headers=carol, json={"id": iid})).status_code == 404
        assert (await c.get("/api/v1/inference", headers=carol)).json()["data"] == []
        assert [
            i["id"] for i in (await c.get("/api/v1/inference", headers=bob)).json()["data"]
        ] == [iid]

        r = await c.post("/api/v1/stop", headers=bob, json={"id": iid})
        assert r.json() == {"ok": True, "id": iid, "state": "stopped"}
        assert not _alive(pid)
        assert (await c.post("/api/v1/stop", headers=bob, json={"id": iid})).json()["state"] == (
            "stopped"
        )
        models = (await c.get("/api/v1/models", headers=bob)).json()["models"]
        assert {
            "name": SMOL,
            "status": "available",
            "provider": "local",
            "ctx_size": 8192,
        } in models

        events = await _events(c, SMOL)
        assert [e["type"] for e in events] == [
            "model.discovered",  # registered on first use
            "model.prepared",
            "model.started",
            "model.ready",
            "model.stopped",
        ]
        started_event = events[2]["data"]
        assert started_event["instance_id"] == iid and started_event["pid"] == pid
        assert started_event["port"] == ready["port"]
        assert events[3]["data"]["ctx_size"] == 2048
        assert events[4]["data"]["reason"] == "stopped by bob"
        # The owner sees the instance's events on their own stream.
        mine = (await c.get("/api/v1/events", headers=bob, params={"aggregate": SMOL})).json()
        assert mine["total"] == 4


@pytest.fixture
def exits_at_once(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "broken-server"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho \"error: failed to load model '$2'\" >&2\nexit 3\n")
    script.chmod(0o755)
    return script


async def test_binary_that_exits_at_once_fails(make_settings, tmp_path: Path, exits_at_once):
    write_gguf(tmp_path / "models" / "tiny.gguf")
    settings = _settings(make_settings, tmp_path, inference_bin=str(exits_at_once))
    async with InferenceApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        iid = (await c.post("/api/v1/inference", headers=ADMIN, json={"model": "tiny"})).json()[
            "id"
        ]
        failed = await wait_state(c, iid, {"failed"}, within=20)
        assert "exited with code 3" in failed["error"]
        assert "failed to load model" in failed["error"] and "tiny.gguf" in failed["error"]
        assert failed["base_url"] is None
        models = (await c.get("/api/v1/models", headers=ADMIN)).json()["models"]
        assert {"name": "tiny", "status": "error", "provider": "local", "ctx_size": 2048} in models
        types = [e["type"] for e in await _events(c, "tiny")]
        assert types[-3:] == ["model.prepared", "model.started", "model.start_failed"]
        # A failed instance is stopped for the record.
        r = await c.post("/api/v1/stop", headers=ADMIN, json={"id": iid})
        assert r.json()["state"] == "stopped"
        assert (await _events(c, "tiny"))[-1]["type"] == "model.stopped"


async def test_crash_and_silence_after_ready_are_failures(make_settings, tmp_path: Path):
    settings = _settings(make_settings, tmp_path)
    async with InferenceApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        # Two instances of one model at once, on different ports.
        ids = [
            (await c.post("/api/v1/inference", headers=ADMIN, json={"model": SMOL})).json()["id"]
            for _ in range(2)
        ]
        crashed, silent = [await wait_state(c, i, {"ready"}) for i in ids]
        assert crashed["port"] != silent["port"]

        os.kill(crashed["pid"], signal.SIGKILL)
        failed = await wait_state(c, crashed["id"], {"failed"}, within=10)
        assert "exited with code -9" in failed["error"]
        assert (await _events(c, SMOL))[-1]["type"] == "model.failed"
        # The other one serves on.
        assert (await c.get(f"/api/v1/inference/{silent['id']}", headers=ADMIN)).json()[
            "state"
        ] == "ready"

        # A server that stops answering (frozen) fails after inference_health_timeout_s.
        os.kill(silent["pid"], signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            failed = await wait_state(c, silent["id"], {"failed"}, within=15)
            assert 1.5 < time.monotonic() - t0 < 10
            assert "has not answered" in failed["error"]
        finally:
            if _alive(silent["pid"]):
                os.kill(silent["pid"], signal.SIGCONT)
        assert not _alive(silent["pid"])  # killed when it was declared failed

        # stop-all stops the caller's instances that are not stopped yet (failed ones too).
        third = (await c.post("/api/v1/inference", headers=ADMIN, json={"model": SMOL})).json()
        r = await c.post("/api/v1/stop-all", headers=ADMIN)
        assert sorted(r.json()["stopped"]) == sorted([*ids, third["id"]])
        states = {
            i["id"]: i["state"]
            for i in (await c.get("/api/v1/inference", headers=ADMIN)).json()["data"]
        }
        assert set(states.values()) == {"stopped"}
