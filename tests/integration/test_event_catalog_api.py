"""Every type of the event catalog, triggered through the public API and seen on
`GET /api/v1/events` as a client sees it, with its aggregate key (issue 33).

One test, so that its completeness check sees everything it triggered whatever process
(`-n 2`) runs it. Two parts run at once:

- The HTTP part: the real app under uvicorn (its in-process engine, agent runner, scheduler
  and local inference), real Postgres and Redis, a loopback OpenAI-format model steered by
  directives in the prompts (tests/fakes/agent_llm.py, plus `[malformed]` and `[cut]` here),
  and a fake llama-server (a script serving /health, then exiting) for the `model.*` types.
  A `coordinate` step's team gives the `team.*` types. Everything is done as the user alice
  and read back with alice's token; what has no owner (a worker's life) is read with the
  admin's.
- The Ray part, for `worker.*` beyond the task types: one AgentWorker created as the
  generation creates it, on the same database. Its data directory's secret key is corrupt
  at first (a crash on start: worker.spawn_failed, retried by its supervisor), then fixed
  (worker.spawned, worker.ready); its process is killed (Ray restarts it: worker.crashed);
  its generation is drained (worker.killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import ray
from cryptography.fernet import Fernet

from actors import NAMESPACE, Generation
from actors.agent_worker import KIND as WORKER
from actors.dispatch import worker_name
from actors.generation import create, drain, members
from orchestrator.events import CATALOG
from orchestrator.inference import InProcessInference
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply, steps_directive, task_prompt
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake
from tests.gguf import write_gguf

T = TypeVar("T")
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "fake-agent"

# A llama-server stand-in: a model whose file name says "broken" fails to load (exit 3);
# any other serves /health (and an empty /slots) and exits a second after its first health
# check: a server that dies after it was ready.
FAKE_SERVER = """#!{python}
import http.server, os, sys, threading, time
args = sys.argv[1:]
if "broken" in args[args.index("-m") + 1]:
    print("error: failed to load model", file=sys.stderr)
    sys.exit(3)
checked = threading.Event()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"[]" if self.path == "/slots" else b'{{"status": "ok"}}'
        if self.path == "/health":
            checked.set()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
server = http.server.ThreadingHTTPServer((host, port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
checked.wait(60)
time.sleep(1.0)
os._exit(7)
"""


def reply(body: Any) -> FakeReply:
    """agent_reply, and `[malformed]`: a call of `calculate` whose arguments are not JSON,
    then an answer; `[cut]`: an answer stopped at the token limit."""
    prompt = task_prompt(body)
    messages = body.get("messages") or [{}]
    if "[malformed]" in prompt:
        if messages[-1].get("role") == "tool":
            return FakeReply(text="answered after malformed arguments")
        return FakeReply(tool_calls=[FakeToolCall("calculate", '{"expression": 6*')])
    if "[cut]" in prompt:
        return FakeReply(text="half an ans", finish_reason="length")
    return agent_reply(body)


async def until(probe: Callable[[], Awaitable[T]], within: float = 60.0) -> T:
    """The probe's first truthy answer (the state is in the app, Ray's actors, Postgres)."""
    deadline = time.monotonic() + within
    while not (found := await probe()):
        assert time.monotonic() < deadline, "not observed in time"
        await asyncio.sleep(0.2)
    return found


async def _answer(ref: Any) -> Any:
    return await ref


async def all_events(c: httpx.AsyncClient, h: dict[str, str]) -> list[dict[str, Any]]:
    """Every event `h` may see, in position order (paged by position)."""
    seen: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await c.get("/events", headers=h, params={"from_seq": after, "limit": 1000})
        assert r.status_code == 200, r.text
        page = r.json()["data"]
        seen += page
        if len(page) < 1000:
            return seen
        after = page[-1]["position"] + 1


class CatalogApp(ServedApp):
    """The app with local inference run by this process (the `model.*` types)."""

    def __init__(self, settings: Any) -> None:
        from deployments.api import create_app

        self.local = InProcessInference(settings)
        super().__init__(settings, create_app(settings, local_inference=self.local))


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=reply) as server:
        yield server


def _settings(make_settings: Any, llm: OpenAIFake, tmp_path: Path, **kw: Any) -> Any:
    server = tmp_path / "bin" / "fake-llama-server"
    server.parent.mkdir(exist_ok=True)
    server.write_text(FAKE_SERVER.format(python=sys.executable))
    server.chmod(0o755)
    for name in ("tiny", "broken"):
        write_gguf(tmp_path / "models" / f"{name}.gguf")
    values: dict[str, Any] = {
        "providers": {
            "openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}
        },
        "default_model": MODEL,
        "rate_limit_per_minute": 0,
        "provider_retries": 0,
        "agent_loop_warn": 2,
        "agent_loop_limit": 3,
        "agent_ctx_tokens": 1000,  # a 5,000-character prompt passes it; the others do not
        "stream_heartbeat_s": 0.3,
        "models_dir": tmp_path / "models",
        "inference_bin": str(server),
        "inference_poll_interval_s": 0.2,
        "inference_health_timeout_s": 2.0,
        "inference_start_timeout_s": 30.0,
    }
    values.update(kw)
    return make_settings(**values)


async def _workflow(c: httpx.AsyncClient, h: dict[str, str], *steps: dict[str, Any]) -> str:
    r = await c.post("/workflows", headers=h, json={"name": "catalog", "steps": list(steps)})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


async def _status(c: httpx.AsyncClient, wid: str, *states: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = (await c.get(f"/workflows/{wid}", headers=ADMIN)).json()
        return body if body["status"] in states else None

    return await until(reached)


async def _decide(c: httpx.AsyncClient, wid: str, verdict: str) -> None:
    async def asked() -> list[dict[str, Any]]:
        params = {"workflow_id": wid, "status": "pending"}
        return list((await c.get("/interventions", headers=ADMIN, params=params)).json()["data"])

    [iv] = await until(asked)
    body = {"reason": "not now"} if verdict == "reject" else {}
    r = await c.post(f"/interventions/{iv['id']}/{verdict}", headers=ADMIN, json=body)
    assert r.status_code == 200, r.text


async def _through_the_api(c: httpx.AsyncClient, alice: dict[str, str]) -> dict[str, str]:
    """Trigger every type the app emits, as alice; the ids the checks look for."""
    ids: dict[str, str] = {}
    approval = [
        {"name": "prepare", "prompt": "[answer READY]", "compensate": {"notify": "undo"}},
        {"name": "ok", "type": "approval", "prompt": "Ship {{prepare.result}}?"},
    ]
    calc = {"tools": ["calculate"]}
    ok = await _workflow(
        c,
        alice,
        {"name": "a", "prompt": "[answer A]"},
        {"name": "calc", "prompt": '[tool calculate {"expression": "6*7"}]', **calc},
        {"name": "deny", "prompt": "[tool current_time {}]", **calc},
        {"name": "unknown", "prompt": "[tool no_such_tool {}]", **calc},
        {"name": "malformed", "prompt": "[malformed]", **calc},
        {"name": "cut", "prompt": "[cut]"},
        {"name": "big", "prompt": "P" * 5000 + " [answer BIG]"},
    )
    failing = await _workflow(
        c,
        alice,
        {"name": "setup", "prompt": "[answer SET]", "compensate": {"notify": "undo setup"}},
        {
            "name": "loop",
            "prompt": '[loop calculate {"expression": "1+1"}]',
            "retry": {"max_attempts": 2, "backoff_ms": 50, "max_backoff_ms": 50},
            **calc,
        },
    )
    cancelled = await _workflow(c, alice, {"name": "wait", "prompt": "[sleep 10]"})
    approved = await _workflow(c, alice, *approval)
    rejected = await _workflow(c, alice, *approval)
    # A team: the coordinator spawns one member, which mails it; it reads the mail, answers.
    member = steps_directive(("team_send", {"to": "coordinator", "message": "done"}))
    lead = steps_directive(
        ("team_spawn", {"role": "helper", "instructions": member}),
        ("team_receive", {"timeout_s": 20}),
    )
    team = await _workflow(
        c, alice, {"name": "lead", "prompt": lead, "mode": "coordinate", "team": {}}
    )
    ids.update(ok=ok, failing=failing, cancelled=cancelled, team=team)

    # The gateway: an answer, an upstream error, a stream the client leaves.
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    r = await c.post("/chat/completions", headers=alice, json=chat)
    assert r.status_code == 200, r.text
    ids["chat"] = r.headers["x-request-id"]
    failed = {"model": MODEL, "messages": [{"role": "user", "content": "[fail]"}]}
    assert (await c.post("/chat/completions", headers=alice, json=failed)).status_code >= 400
    slow = {**chat, "messages": [{"role": "user", "content": "[sleep 5]"}], "stream": True}
    async with c.stream("POST", "/chat/completions", headers=alice, json=slow) as stream:
        assert stream.status_code == 200
        async for _ in stream.aiter_raw():
            break  # the first heartbeat: the stream has started; the client leaves

    # Memory: store, read, a reflection, delete, clear; a decay (admin); a 403 for alice.
    store = "/memory/notes/store"
    for key in ("k1", "reflection:r1"):
        r = await c.post(store, headers=alice, json={"key": key, "value": "v"})
        assert r.status_code == 200, r.text
    assert (await c.get("/memory/notes/k1", headers=alice)).status_code == 200
    assert (await c.delete("/memory/notes/k1", headers=alice)).status_code == 200
    await c.post("/memory/scratch/store", headers=alice, json={"key": "s", "value": "v"})
    assert (await c.delete("/memory/scratch/clear", headers=alice)).json()["cleared"] == 1
    assert (await c.post("/memory/decay", headers=alice)).status_code == 403
    assert (await c.post("/memory/decay", headers=ADMIN)).status_code == 200

    # A schedule (an admin's: only admins schedule), run now.
    r = await c.post("/schedules", headers=ADMIN, json={"prompt": "[answer S]", "every": 60000})
    assert r.status_code == 200, r.text
    ids["job"] = str(r.json()["id"])
    assert (await c.post(f"/schedules/{ids['job']}/run", headers=ADMIN)).status_code == 200

    # Local model servers: one dies after it was ready, one cannot start; both stopped.
    for model in ("tiny", "broken"):
        r = await c.post("/inference", headers=alice, json={"model": model})
        assert r.status_code == 200, r.text
        iid = r.json()["id"]

        async def ended(iid: str = iid) -> bool:
            body = (await c.get(f"/inference/{iid}", headers=alice)).json()
            return bool(body["state"] == "failed")

        await until(ended)
        assert (await c.post("/stop", headers=alice, json={"id": iid})).status_code == 200

    # People decide; a cancel; a person's retry of the failed step.
    await _decide(c, approved, "approve")
    await _decide(c, rejected, "reject")
    await _status(c, cancelled, "running")
    assert (await c.post(f"/workflows/{cancelled}/cancel", headers=alice)).status_code == 200
    await _status(c, failing, "failed")
    r = await c.post(f"/workflows/{failing}/steps/loop/retry", headers=alice, json={})
    assert r.status_code == 200, r.text
    await _status(c, ok, "completed")
    await _status(c, approved, "completed")
    await _status(c, rejected, "failed")
    await _status(c, cancelled, "cancelled")
    done = await _status(c, team, "completed")
    ids["team_id"] = done["steps"][0]["team_id"]
    return ids


async def _worker_lifecycle(settings: Any, key_file: Path, seen: Callable[[str], Any]) -> None:
    """Start, fail to start, start, crash, drain one AgentWorker, and create another that
    Ray cannot place (their events are checked on /events by the caller; `seen(type)` waits
    until the admin sees the first worker's first event of that type)."""
    # Not cancelled midway (the other part failing): shut down only once it has started.
    started = asyncio.ensure_future(
        asyncio.to_thread(
            ray.init,
            num_cpus=1,
            include_dashboard=False,
            namespace=NAMESPACE,
            log_to_driver=False,
        )
    )
    try:
        await asyncio.shield(started)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await started
        await asyncio.to_thread(ray.shutdown)
        raise
    generation = Generation.of("catalog", settings)
    member, second = [m for m in members(settings, generation) if m.kind == WORKER]
    # More CPUs than the cluster has: Ray cannot place it (the generation's wait records it).
    unplaced = dataclasses.replace(second, options={**second.options, "num_cpus": 64})
    worker = member.actor_class.options(
        name=member.name, namespace=NAMESPACE, **member.options
    ).remote(*member.args)
    handles: dict[str, Any] = {}
    try:
        handles = await create([unplaced], started_within_s=2, database_url=settings.database_url)
        await seen("worker.spawn_failed")
        await asyncio.to_thread(key_file.write_bytes, Fernet.generate_key())
        await asyncio.wait_for(_answer(worker.ready.remote()), 60)
        await seen("worker.ready")
        ray.kill(worker, no_restart=False)  # its process dies; Ray restarts it
        await seen("worker.crashed")
        await asyncio.wait_for(_answer(worker.ready.remote()), 60)
        await drain([member], {member.name: worker}, 30, reason="test: shutdown")
        await seen("worker.killed")
    finally:
        for handle in (worker, *handles.values()):
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        await asyncio.to_thread(ray.shutdown)


async def test_every_type_of_the_catalog_is_seen_on_events(
    make_settings: Any, llm: OpenAIFake, tmp_path: Path
) -> None:
    settings = _settings(make_settings, llm, tmp_path)
    # The worker's own data directory, its secret key corrupt (a crash on start).
    worker_dir = tmp_path / "worker-data"
    worker_dir.mkdir()
    key_file = worker_dir / "channel_key"
    key_file.write_bytes(b"not a key\n")
    worker_settings = _settings(make_settings, llm, tmp_path, data_dir=worker_dir, agent_workers=2)

    async with CatalogApp(settings) as app:
        async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", timeout=30) as c:
            made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": "alice"})
            alice = {"Authorization": f"Bearer {made.json()['token']}"}

            async def seen(type_: str) -> None:
                async def found() -> bool:
                    params = {"types": type_, "aggregate": worker_name(0)}
                    r = await c.get("/events", headers=ADMIN, params=params)
                    return bool(r.json()["data"])

                await until(found, within=90)

            # Both parts at once; one failing cancels the other.
            async with asyncio.TaskGroup() as both:
                api = both.create_task(_through_the_api(c, alice))
                both.create_task(_worker_lifecycle(worker_settings, key_file, seen))
            ids = api.result()
            expected = set(CATALOG)

            def seen_types(mine: list[Any], every: list[Any]) -> set[str]:
                # Each event as its owner's client sees it: alice's with her token, the
                # admin's own and the owner-less with the admin's.
                return {e["type"] for e in mine} | {
                    e["type"] for e in every if e["user_uuid"] != "alice"
                }

            async def everything() -> tuple[list[Any], list[Any]] | None:
                mine, every = await all_events(c, alice), await all_events(c, ADMIN)
                return (mine, every) if expected <= seen_types(mine, every) else None

            try:
                mine, every = await until(everything, within=30)
            except AssertionError:
                mine, every = await all_events(c, alice), await all_events(c, ADMIN)
                missing = sorted(expected - seen_types(mine, every))
                pytest.fail(f"never seen on /events: {missing}")

    # Scoped as a client sees it: alice sees exactly her own events, all of them (up to
    # where both reads reached: a retried step may still be appending); what has no owner
    # is the admin's to see.
    assert {e["user_uuid"] for e in mine} == {"alice"}
    upto = min(mine[-1]["position"], every[-1]["position"])
    assert {e["id"] for e in mine if e["position"] <= upto} == {
        e["id"] for e in every if e["user_uuid"] == "alice" and e["position"] <= upto
    }
    # Each with its aggregate key.
    for event in every:
        kind = CATALOG[event["type"]]
        assert event["aggregate_id"] == str(event["data"][kind.aggregate_key]), event

    def of(type_: str, source: list[dict[str, Any]] = mine) -> list[dict[str, Any]]:
        return [e for e in source if e["type"] == type_]

    ok, failing = ids["ok"], ids["failing"]
    requests = {e["aggregate_id"] for e in of("inference.request")}
    assert ids["chat"] in requests and f"{ok}:a:1:turn-1" in requests
    chat_request = [e for e in of("inference.request") if e["aggregate_id"] == ids["chat"]]
    assert chat_request[0]["seq"] == 1 and chat_request[0]["data"]["model"] == MODEL
    diagnostics = {e["data"]["kind"]: e for e in of("agent.diagnostic")}
    assert set(diagnostics) == {
        "malformed_arguments",
        "unknown_tool",
        "output_truncated",
        "context_trimmed",
    }
    for kind, step in (
        ("malformed_arguments", "malformed"),
        ("unknown_tool", "unknown"),
        ("output_truncated", "cut"),
        ("context_trimmed", "big"),
    ):
        assert diagnostics[kind]["aggregate_id"] == f"{ok}:{step}:1", diagnostics[kind]
    assert "6*" not in str(diagnostics["malformed_arguments"]["data"])  # never the arguments
    forgotten = {e["data"]["reason"]: e for e in of("memory.forgotten")}
    assert forgotten["deleted"]["data"]["keys"] == ["k1"]
    assert forgotten["cleared"]["aggregate_id"] == "scratch"
    assert {e["aggregate_id"] for e in of("scheduler.task_dispatched", every)} == {ids["job"]}
    assert failing in {e["aggregate_id"] for e in of("audit.workflow_override")}
    assert {e["aggregate_id"] for e in of("workflow.cancelled")} == {ids["cancelled"]}
    team = [e for e in mine if e["type"].startswith("team.")]
    assert {e["aggregate_id"] for e in team} == {ids["team_id"]}
    assert team[0]["type"] == "team.created" and team[-1]["type"] == "team.destroyed"
    assert "done" not in str([e["data"] for e in of("team.mail_sent")])  # sizes, not text
    # A worker's life: no owner, keyed by the worker.
    life = [e for e in every if e["type"].startswith("worker.") and e["user_uuid"] is None]
    assert {e["aggregate_id"] for e in life} == {worker_name(0), worker_name(1)}
    [unplaced] = [e["data"] for e in life if e["aggregate_id"] == worker_name(1)]
    assert unplaced["error"].startswith("not started within 2s: Ray has not placed it")
    kinds = [e["type"] for e in life if e["aggregate_id"] == worker_name(0)]
    assert kinds[0] == "worker.spawn_failed" and kinds[-1] == "worker.killed", kinds
    assert kinds.index("worker.crashed") > kinds.index("worker.ready")
    failure = next(e for e in life if e["aggregate_id"] == worker_name(0))["data"]
    assert "Fernet key" in failure["error"] and failure["attempt"] == 1
    assert failure["retry_within_ms"] > 0
    assert of("worker.killed", every)[0]["data"]["reason"] == "test: shutdown"
