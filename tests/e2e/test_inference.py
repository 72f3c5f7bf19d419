"""Local inference through the service the README starts (`scripts/serve`): a real llama.cpp
instance (the bundled cyllama launcher serving SmolLM2) started with POST /inference on a
Ray actor, whose own port answers only the service (its API key), chatted with through the
service by the openai SDK, stopped; a binary that exits at once ends failed; stopping the
service leaves no model server behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.conftest import free_port
from tests.e2e.test_serve import ROOT, Service, _wait_for_ready_line
from tests.gguf import write_gguf

pytestmark = pytest.mark.e2e
SMOL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    base = tmp_path_factory.mktemp("inference-e2e")
    data_dir, models_dir = base / "data", base / "models"
    # Looks like GGUF (so it is discovered) but is no model: the wrapper refuses it at once.
    write_gguf(models_dir / "broken.gguf")
    wrapper = base / "llama-server"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# Exits at once for the broken model; everything else goes to the real launcher.\n"
        'case "$*" in *broken.gguf*) echo "error: cannot load broken.gguf" >&2; exit 7;; esac\n'
        f'exec "{ROOT / "scripts" / "llama-server"}" "$@"\n'
    )
    wrapper.chmod(0o755)
    log = base / "serve.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
    env.update(
        ORCH_MODELS_DIR=str(models_dir),
        ORCH_INFERENCE_BIN=str(wrapper),
        ORCH_INFERENCE_CTX_SIZE="2048",
        ORCH_INFERENCE_THREADS="2",
        ORCH_INFERENCE_POLL_INTERVAL_S="0.3",
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(ROOT / "scripts" / "serve"), "--data-dir", str(data_dir), "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        _wait_for_ready_line(proc, log)
        token = (data_dir / "admin_token").read_text().strip()
        yield Service(
            proc, f"http://127.0.0.1:{port}", data_dir, log, {"Authorization": f"Bearer {token}"}
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
        sys.stdout.write(log.read_text(errors="replace")[-3000:])


def _wait_state(service: Service, iid: str, states: set[str], within: float = 120) -> Any:
    deadline = time.monotonic() + within
    while True:
        body = service.get(f"/inference/{iid}", headers=service.admin).json()
        if body["state"] in states:
            return body
        assert time.monotonic() < deadline, f"{iid} stuck: {body}"
        time.sleep(0.2)


def _actor_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::InferenceInstance") and p.status() != "zombie":
            out.append(p)
    return out


def _gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def _instance_actor(service: Service, name: str) -> str:
    """The repr of the named actor, asked by a driver that joins the service's cluster."""
    runtime = json.loads((service.data_dir / "runtime.json").read_text())
    code = (
        "import ray, sys\n"
        f"ray.init(address={runtime['ray_address']!r}, namespace='orchestrator',"
        " logging_level='ERROR')\n"
        f"print(ray.get(ray.get_actor({name!r}).ready.remote()))\n"
    )
    # The service's cluster authenticates with the token in ~/.ray/auth_token.
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_discover_start_chat_stream_stop(service: Service) -> None:
    clients: list[openai.OpenAI] = []
    r = service.post("/discover", headers=service.admin)
    assert r.status_code == 200 and r.json()["discovered"] == 2  # SmolLM2 and broken
    models = {m["name"]: m for m in service.get("/models", headers=service.admin).json()["models"]}
    assert models[SMOL] == {
        "name": SMOL,
        "status": "available",
        "provider": "local",
        "ctx_size": 8192,
    }

    r = service.post("/inference", headers=service.admin, json={"model": SMOL})
    assert r.status_code == 200, r.text
    iid = r.json()["id"]
    assert r.json() == {"ok": True, "id": iid, "state": "starting"}
    ready = _wait_state(service, iid, {"ready"})
    models = {m["name"]: m for m in service.get("/models", headers=service.admin).json()["models"]}
    assert models[SMOL] == {"name": SMOL, "status": "loaded", "provider": "local", "ctx_size": 2048}

    # The actor named after the instance holds it, and the server is the actor's child.
    described = _instance_actor(service, f"orch-orchestrator-InferenceInstance-{iid}")
    assert described == (
        f"InferenceInstance(id={iid}, model={SMOL}, port={ready['port']}, state=ready)"
    )
    server = psutil.Process(ready["pid"])
    assert server.parent().cmdline()[0].startswith("ray::InferenceInstance")
    assert "--port" in server.cmdline() and str(ready["port"]) in server.cmdline()

    # Only the service reaches the instance's port: its server got a key of its own in its
    # environment (not on its command line, which any local user reads), and answers
    # everything but /health with 401 without it, the service's own tokens included.
    assert "--api-key" not in server.cmdline()
    key = server.environ()["LLAMA_API_KEY"]
    assert len(key) >= 32 and key not in service.log.read_text(errors="replace")
    root = ready["base_url"].removesuffix("/v1")
    assert httpx.get(f"{root}/health", timeout=10).status_code == 200
    for wrong in ("unused", service.admin["Authorization"].removeprefix("Bearer ")):
        outsider = openai.OpenAI(base_url=ready["base_url"], api_key=wrong, max_retries=0)
        clients.append(outsider)
        with pytest.raises(openai.AuthenticationError):
            outsider.chat.completions.create(
                model=SMOL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        with pytest.raises(openai.AuthenticationError):
            outsider.models.list()
    assert httpx.get(f"{root}/slots", timeout=10).status_code == 401

    # With the key (as the gateway calls it): plain, then streamed.
    client = openai.OpenAI(base_url=ready["base_url"], api_key=key, max_retries=0)
    clients.append(client)
    answer = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    assert answer.model == SMOL and answer.choices[0].message.content
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 24
    stream = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert 0 < chunks[-1].usage.completion_tokens <= 24

    # And through the service's own chat endpoint, which routes the name to the instance.
    token = service.admin["Authorization"].removeprefix("Bearer ")
    gateway = openai.OpenAI(base_url=f"{service.url}/api/v1", api_key=token, max_retries=0)
    clients.append(gateway)
    routed = gateway.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=12
    )
    assert routed.choices[0].message.content
    pieces = list(
        gateway.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=12, stream=True
        )
    )
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices).strip()

    for c in clients:  # their pooled sockets, not left to the garbage collector
        c.close()
    r = service.post("/stop", headers=service.admin, json={"id": iid})
    assert r.json() == {"ok": True, "id": iid, "state": "stopped"}
    assert _gone(ready["pid"])
    deadline = time.monotonic() + 15
    while _actor_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _actor_processes() == []
    types = [
        e["type"]
        for e in service.get("/events", headers=service.admin, params={"aggregate": SMOL}).json()[
            "data"
        ]
    ]
    assert types == [
        "model.discovered",
        "model.prepared",
        "model.started",
        "model.ready",
        "model.stopped",
    ]


def test_a_killed_actor_comes_back_and_respawns_its_server(service: Service) -> None:
    iid = service.post("/inference", headers=service.admin, json={"model": SMOL}).json()["id"]
    first = _wait_state(service, iid, {"ready"})
    actor = psutil.Process(first["pid"]).parent()
    actor.kill()
    # The server dies with its actor (no orphan); Ray restarts the actor, which reads the
    # record and starts a new server.
    assert _gone(first["pid"])
    deadline = time.monotonic() + 120
    while True:
        now = service.get(f"/inference/{iid}", headers=service.admin).json()
        if now["state"] == "ready" and now["pid"] != first["pid"]:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert psutil.Process(now["pid"]).parent().pid != actor.pid
    types = [
        e["type"]
        for e in service.get(
            "/events",
            headers=service.admin,
            params={"aggregate": SMOL, "from_seq": 6},  # after the first test's five
        ).json()["data"]
    ]
    assert types == [
        "model.prepared",
        "model.started",
        "model.ready",
        "model.started",
        "model.ready",
    ]
    # The respawned server requires the instance's key too, and the service still has it.
    assert psutil.Process(now["pid"]).environ()["LLAMA_API_KEY"]
    root = now["base_url"].removesuffix("/v1")
    assert httpx.get(f"{root}/v1/models", timeout=10).status_code == 401
    token = service.admin["Authorization"].removeprefix("Bearer ")
    with openai.OpenAI(base_url=f"{service.url}/api/v1", api_key=token, max_retries=0) as gw:
        reply = gw.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
    assert reply.choices[0].message.content is not None
    assert service.post("/stop", headers=service.admin, json={"id": iid}).json()["state"] == (
        "stopped"
    )
    assert _gone(now["pid"])


def test_binary_that_exits_at_once_ends_failed(service: Service) -> None:
    r = service.post("/inference", headers=service.admin, json={"model": "broken"})
    assert r.status_code == 200, r.text
    iid = r.json()["id"]
    failed = _wait_state(service, iid, {"failed"}, within=60)
    assert "exited with code 7" in failed["error"] and "cannot load broken.gguf" in failed["error"]
    events = service.get("/events", headers=service.admin, params={"aggregate": "broken"}).json()[
        "data"
    ]
    assert events[-1]["type"] == "model.start_failed"
    assert events[-1]["data"]["instance_id"] == iid
    # Its actor gave its resources back and is gone for good.
    deadline = time.monotonic() + 15
    while _actor_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _actor_processes() == []
    models = {m["name"]: m for m in service.get("/models", headers=service.admin).json()["models"]}
    assert models["broken"]["status"] == "error"


def test_a_two_step_workflow_on_the_bundled_model_with_default_steps(service: Service) -> None:
    """The first workflow a newcomer runs: steps that name no tools, on the bundled model,
    whose server takes none (its /props says so): they run without tools and complete. A
    step that names tools for that model is a 400 naming it."""
    r = service.post("/inference", headers=service.admin, json={"model": SMOL})
    assert r.status_code == 200, r.text
    iid = r.json()["id"]
    ready = _wait_state(service, iid, {"ready"})
    assert ready["tools"] is False  # read from the server's /props
    steps = [
        {"name": "plan", "prompt": "List three fruits."},
        {"name": "pick", "prompt": "Pick one fruit of the list and name it."},
    ]
    r = service.post(
        "/workflows", headers=service.admin, json={"name": "demo", "model": SMOL, "steps": steps}
    )
    assert r.status_code == 200, r.text
    wid = r.json()["id"]
    deadline = time.monotonic() + 240
    while True:
        detail = service.get(f"/workflows/{wid}", headers=service.admin).json()
        if detail["status"] in ("completed", "failed", "cancelled"):
            break
        assert time.monotonic() < deadline, detail
        time.sleep(0.5)
    assert detail["status"] == "completed", detail
    assert [s["status"] for s in detail["steps"]] == ["completed", "completed"]
    assert all(s.get("result") for s in detail["steps"]), detail

    named = [{"name": "clock", "prompt": "What time is it?", "tools": ["current_time"]}]
    r = service.post(
        "/workflows", headers=service.admin, json={"name": "tooled", "model": SMOL, "steps": named}
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert (
        body["code"] == "bad_request"
        and SMOL in body["error"]
        and "takes no tools" in body["error"]
    )
    assert body["fields"] == [{"field": "steps[0].tools", "message": f"{SMOL} takes no tools"}]
    assert service.post("/stop", headers=service.admin, json={"id": iid}).json()["state"] == (
        "stopped"
    )
    assert _gone(ready["pid"])


def test_stopping_the_service_leaves_no_model_server(service: Service) -> None:
    r = service.post("/inference", headers=service.admin, json={"model": SMOL})
    ready = _wait_state(service, r.json()["id"], {"ready"})
    service.proc.send_signal(signal.SIGTERM)
    service.proc.wait(90)
    assert _gone(ready["pid"], within=15)
