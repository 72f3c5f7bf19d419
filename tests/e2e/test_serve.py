"""The service started the way the README starts it (`scripts/serve`), driven over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.db import connect
from orchestrator.events import EventStore, NewEvent
from orchestrator.runtime import EmbeddedPostgres
from tests.conftest import free_port
from tests.sse import sse_frames

SSE = {"Accept": "text/event-stream"}

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log: Path
    admin: dict[str, str]

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(f"{self.url}/api/v1{path}", timeout=10, **kw)  # type: ignore[arg-type]

    def post(self, path: str, **kw: object) -> httpx.Response:
        return httpx.post(f"{self.url}/api/v1{path}", timeout=10, **kw)  # type: ignore[arg-type]


def _wait_for_ready_line(
    proc: subprocess.Popen[bytes], log: Path, offset: int = 0, line: str = "Orchestrator ready at"
) -> None:
    """Until the service logs its ready line (after byte `offset`: a log reused by a restart),
    or another `line` (ACTORS_RUNNING: its actors have started too)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if line in log.read_bytes()[offset:].decode(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"orchestrator serve exited early:\n{log.read_text()[-4000:]}")
        time.sleep(0.25)
    proc.kill()
    pytest.fail(f"orchestrator serve did not become ready:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data_dir = tmp_path_factory.mktemp("e2e") / "data"
    log = data_dir.parent / "serve.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
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


def test_served_through_haproxy(service: Service) -> None:
    log = service.log.read_text(errors="replace")
    assert "throughput-optimized Serve with HAProxy" in log
    assert "falling back to the standard proxy" not in log
    assert "admin token:" in log and "(generated now)" in log


def test_auth_required_and_admin_token_works(service: Service) -> None:
    r = service.get("/whoami")
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    assert r.json()["request_id"] == r.headers["x-request-id"]
    r = service.get("/whoami", headers=service.admin)
    assert r.status_code == 200 and r.json() == {"ok": True, "user_uuid": "admin", "admin": True}
    # A client's own request id is never the request's (docs/design-notes.md, "Request
    # ids"): the answer names the one it got, in its header and its error body.
    r = service.get("/whoami", headers={"X-Request-ID": "trace-e2e-42"})
    assert r.headers["x-request-id"] != "trace-e2e-42"
    assert r.json()["request_id"] == r.headers["x-request-id"]


def test_token_creation_through_the_api_and_the_cli(service: Service) -> None:
    r = service.post("/tokens", headers=service.admin, json={"user_uuid": "alice"})
    assert r.status_code == 200
    alice = {"Authorization": f"Bearer {r.json()['token']}"}
    assert service.get("/whoami", headers=alice).json()["user_uuid"] == "alice"
    assert service.post("/tokens", headers=alice, json={"user_uuid": "x"}).status_code == 403
    # The CLI works against the same data directory while the service runs.
    out = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "orchestrator"),
            "token",
            "create",
            "--user",
            "carol",
            "--data-dir",
            str(service.data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    carol = {"Authorization": f"Bearer {out.stdout.strip()}"}
    assert service.get("/whoami", headers=carol).json() == {
        "ok": True,
        "user_uuid": "carol",
        "admin": False,
    }


async def test_a_revoked_token_gets_401_on_every_replica_within_a_second(
    service: Service,
) -> None:
    """Replicas cache verified tokens (issue 17); DELETE /tokens reaches every replica's cache
    by NOTIFY. Requests go in concurrent batches, so HAProxy spreads them over the replicas."""
    # From an address of its own: the revoked token's failures trip the failed-auth throttle
    # of the address they come from, which must not be the other tests' 127.0.0.1.
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(
        base_url=f"{service.url}/api/v1", timeout=10, transport=transport
    ) as client:
        r = await client.post("/tokens", headers=service.admin, json={"user_uuid": "rita"})
        created = r.json()
        rita = {"Authorization": f"Bearer {created['token']}"}

        async def batch() -> set[int]:
            answers = await asyncio.gather(
                *(client.get("/whoami", headers=rita) for _ in range(16))
            )
            return {a.status_code for a in answers}

        # Every replica has verified (and cached) it.
        assert await batch() | await batch() == {200}
        r = await client.delete(f"/tokens/{created['prefix']}", headers=service.admin)
        assert r.json() == {"ok": True, "revoked": 1}
        revoked_at = time.monotonic()
        # 401, or 429 once its failures trip the failed-auth throttle (asked only for a token
        # that is not cached): never 200.
        refused = {401, 429}
        while True:
            codes = await batch()
            if codes <= refused:
                break
            assert time.monotonic() - revoked_at < 1.0, f"still accepted after 1 s: {codes}"
        assert await batch() <= refused


def test_health_ready_slo(service: Service) -> None:
    r = service.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and isinstance(body["uptime_seconds"], (int, float))
    components = body["components"]
    assert components["store"]["status"] == "ok" and components["store"]["tables"] >= 4
    assert components["messaging"] == {"status": "ok", "sockets": 0}
    assert set(components["providers"]) == {"total", "healthy"}
    assert set(components["workers"]) == {"active", "idle"}
    r = service.get("/ready")
    assert r.status_code == 200 and r.text == "OK"
    for _ in range(5):
        service.get("/whoami", headers=service.admin)
    slo = service.get("/slo").json()
    assert set(slo) == {"latency_p99", "uptime_7d", "error_rate"}
    for entry in slo.values():
        assert isinstance(entry["target"], float) and isinstance(entry["compliant"], bool)
    assert (
        slo["latency_p99"]["target"],
        slo["uptime_7d"]["target"],
        slo["error_rate"]["target"],
    ) == (0.5, 99.9, 0.01)
    # Requests were just served: a real p99, no server errors, uptime measured or full.
    assert 0 < slo["latency_p99"]["current"] < 60
    assert slo["error_rate"]["current"] == 0.0 and slo["error_rate"]["compliant"] is True
    assert 0 < slo["uptime_7d"]["current"] <= 100


def test_metrics_count_the_traffic_just_sent(service: Service) -> None:
    def whoami_count() -> float:
        text = service.get("/metrics").text
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "svc_http_requests_total"
            and s.labels == {"method": "GET", "path": "/api/v1/whoami", "status": "200"}
        )

    before = whoami_count()
    for _ in range(7):
        assert service.get("/whoami", headers=service.admin).status_code == 200
    # The answering replica pushes its own counts before a scrape; other replicas push theirs
    # every second.
    deadline = time.monotonic() + 5
    while (seen := whoami_count()) < before + 7 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert seen == before + 7
    text = service.get("/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "svc_http_requests",
        "svc_provider_latency_seconds",
        "svc_circuit_breaker_state",
        "svc_active_workers",
        "svc_memory_bytes",
        "svc_event",
        "svc_background_restarts",
    } <= names


def test_health_503_while_postgres_is_down(service: Service) -> None:
    pg = EmbeddedPostgres(service.data_dir)
    pg.start()  # adopts the service's running server
    pg.stop()
    try:
        r = service.get("/health")
        assert r.status_code == 503
        assert r.json()["components"]["store"]["status"] == "degraded"
        assert service.get("/ready").status_code == 200
    finally:
        pg.restart()
    deadline = time.monotonic() + 30
    while service.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "health did not recover after Postgres restarted"
        time.sleep(0.5)
    assert service.get("/whoami", headers=service.admin).status_code == 200


def _kill_event_bus(service: Service) -> None:
    """ray.kill the EventBus actor for good (no restart), from a separate driver: the
    application's Runtime replica creates it again and the replicas resubscribe from their
    positions."""
    runtime = json.loads((service.data_dir / "runtime.json").read_text())
    address = runtime["ray_address"]
    code = (
        f"import ray; ray.init(address={address!r}, namespace='orchestrator', "
        "logging_level='ERROR'); [bus] = [n for n in ray.util.list_named_actors() "
        "if n.endswith('-EventBus')]; ray.kill(ray.get_actor(bus))"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", code],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )


async def test_event_stream_live_resume_bus_restart_and_tenancy(service: Service) -> None:
    runtime = json.loads((service.data_dir / "runtime.json").read_text())
    async with httpx.AsyncClient(base_url=f"{service.url}/api/v1", timeout=30) as c:
        users = {}
        for user in ("erin", "fred"):
            made = await c.post("/tokens", headers=service.admin, json={"user_uuid": user})
            users[user] = {"Authorization": f"Bearer {made.json()['token']}"}
        db = await connect(runtime["database_url"], migrate=False)
        store = EventStore(db.pool)
        appended: list[int] = []
        received: list[int] = []

        async def append(n: int, user: str = "erin") -> list[int]:
            events = await store.append(
                [
                    NewEvent("task.created", {"task_id": f"{user}-{time.time_ns()}-{i}"}, user)
                    for i in range(n)
                ]
            )
            return [e.position for e in events]

        try:
            last: int | None = None
            async with c.stream("GET", "/sync-events", headers=users["erin"]) as r:
                frames = sse_frames(r)
                assert (await anext(frames)) == {"comment": "connected"}
                appended += await append(1)
                await append(1, user="fred")  # never on Erin's stream
                # Delivered live (how fast is scripts/bench.py events' figure, not a test's).
                frame = await asyncio.wait_for(anext(f async for f in frames if "id" in f), 30)
                received.append(int(frame["id"]))
                last = received[-1]

                # Kill the EventBus while Erin is connected; keep appending meanwhile.
                _kill_event_bus(service)
                appended += await append(5)
                deadline = time.monotonic() + 30
                async for frame in frames:
                    if "id" in frame:
                        received.append(int(frame["id"]))
                        last = received[-1]
                    if len(received) >= len(appended) or time.monotonic() > deadline:
                        break
            # Disconnected; more happens; reconnect with Last-Event-ID.
            appended += await append(3)
            headers = {**users["erin"], "Last-Event-ID": str(last), "Accept": "text/event-stream"}
            async with c.stream("GET", "/events", headers=headers) as r:
                async for frame in sse_frames(r):
                    if "id" in frame:
                        received.append(int(frame["id"]))
                    if len(received) >= len(appended):
                        break
            assert received == appended  # nothing missed, nothing twice, in order

            # Tenancy on the read API too.
            fred_page = (await c.get("/events", headers=users["fred"])).json()
            assert fred_page["total"] == 2  # his grant and his one task
            for e in fred_page["data"]:
                if e["type"] == "task.created":
                    assert e["aggregate_id"].startswith("fred-")
                else:
                    assert e["type"] == "audit.permission_grant"
                    assert e["data"]["user_uuid"] == "fred"
            erin_types = {
                e["aggregate_id"].split("-")[0]
                for e in (
                    await c.get(
                        "/events",
                        headers=users["erin"],
                        params={"types": "task.created", "limit": 1000},
                    )
                ).json()["data"]
            }
            assert erin_types == {"erin"}

            # Issue 33, through the service: a stream that is refused is refused before its
            # 200, on both endpoints; on the stream a workflow event has one name.
            freds = {"user_uuid": "fred"}
            for path, accept in (("/sync-events", {}), ("/events", SSE)):
                headers = {**users["erin"], **accept}
                async with c.stream("GET", path, headers=headers, params=freds) as r:
                    await r.aread()
                    assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
            only = {"types": "workflow:step:started"}
            async with c.stream("GET", "/sync-events", headers=users["erin"], params=only) as r:
                frames = sse_frames(r)
                assert (await anext(frames)) == {"comment": "connected"}
                wf = {"workflow_id": f"erin-wf-{time.time_ns()}", "step": "s"}
                [step] = await store.append([NewEvent("workflow.step_started", wf, "erin")])
                frame = await asyncio.wait_for(anext(f async for f in frames if "id" in f), 30)
                assert int(frame["id"]) == step.position
                name = json.loads(frame["data"])["type"]
                assert frame["event"] == name == "workflow:step:started"

            # svc_event_total counts committed events cluster-wide (the EventBus projection):
            # at least Erin's and Fred's task.created events of this test.
            def counted(text: str) -> float:
                return sum(
                    s.value
                    for f in text_string_to_metric_families(text)
                    for s in f.samples
                    if s.name == "svc_event_total" and s.labels == {"type": "task.created"}
                )

            async def scraped() -> float:
                r = await c.get("/metrics")
                return counted(r.text) if r.status_code == 200 else -1.0

            deadline = time.monotonic() + 30  # metrics are pushed every few seconds
            while await scraped() < len(appended) + 1:
                assert time.monotonic() < deadline, "svc_event_total did not count the events"
                await asyncio.sleep(0.5)
        finally:
            await db.close()


def _replica_logs_naming(text: str) -> list[str]:
    found = []
    for path in Path("/tmp/ray").glob("session_*/logs/serve/replica_*Api*.log"):
        content = path.read_text(errors="replace")
        if text in content:
            found.append(content)
    return found


async def test_a_500_is_logged_with_its_request_id_and_traceback(service: Service) -> None:
    """A real internal error (a column the route reads is gone) answers 500 with a request
    id, and the replica's Serve log holds that id, the route and the traceback."""
    runtime = json.loads((service.data_dir / "runtime.json").read_text())
    db = await connect(runtime["database_url"], migrate=False)
    try:
        await db.pool.execute("ALTER TABLE skills RENAME COLUMN downloads TO downloads_gone")
        try:
            r = service.get("/marketplace/browse", headers=service.admin)
        finally:
            await db.pool.execute("ALTER TABLE skills RENAME COLUMN downloads_gone TO downloads")
    finally:
        await db.close()
    assert r.status_code == 500 and r.json()["code"] == "internal_error"
    request_id = r.json()["request_id"]
    deadline = time.monotonic() + 30
    while True:
        logged = await asyncio.to_thread(_replica_logs_naming, request_id)
        if logged:
            break
        assert time.monotonic() < deadline, "the 500's request id is in no replica log"
        await asyncio.sleep(0.5)
    text = logged[0][logged[0].index(request_id) :][:5000]
    assert "GET /api/v1/marketplace/browse" in text and "Traceback" in text
    assert "downloads" in text  # the database's own error, for the operator


async def answer_a_real_500(service: Service) -> str:
    """A real internal error: a column the marketplace route reads is gone while it runs
    (asyncpg's UndefinedColumnError). Returns the 500's request id."""
    runtime = json.loads((service.data_dir / "runtime.json").read_text())
    db = await connect(runtime["database_url"], migrate=False)
    try:
        await db.pool.execute("ALTER TABLE skills RENAME COLUMN downloads TO downloads_gone")
        try:
            r = await asyncio.to_thread(service.get, "/marketplace/browse", headers=service.admin)
        finally:
            await db.pool.execute("ALTER TABLE skills RENAME COLUMN downloads_gone TO downloads")
    finally:
        await db.close()
    assert r.status_code == 500 and r.json()["code"] == "internal_error"
    return str(r.json()["request_id"])


# Where a record of Serve's text format starts: "ERROR 2026-11-27 17:14:08,398 ...".
_TEXT_RECORD = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{4}-\d\d-\d\d ", re.M)


async def test_a_500s_traceback_is_the_usual_multi_line_text(service: Service) -> None:
    """The 500's record in the replica's Serve log carries the traceback as Python prints
    it, one line per line (Serve's replacement of `print` wrote it as a run of tuple reprs,
    `('Traceback (most recent call last):\\n',)('  File ...',)`), and the driver's output
    holds no such run either."""
    request_id = await answer_a_real_500(service)
    head = f"unhandled error (request_id={request_id})"
    deadline = time.monotonic() + 30
    while not (logged := await asyncio.to_thread(_replica_logs_naming, head)):
        assert time.monotonic() < deadline, f"no replica log holds {head!r}"
        await asyncio.sleep(0.5)
    content = logged[0]
    start = content.rfind("\n", 0, content.index(head)) + 1
    following = _TEXT_RECORD.search(content, content.index("\n", start) + 1)
    record = content[start : following.start() if following else None].rstrip("\n")
    first, *trace = record.split("\n")
    assert first.startswith("ERROR ") and first.endswith("GET /api/v1/marketplace/browse")
    assert trace and trace[0] == "Traceback (most recent call last):", record[:2000]
    files = [line for line in trace if re.fullmatch(r'  File "/.+\.py", line \d+, in \S+', line)]
    assert any("/deployments/routers/marketplace.py" in line for line in files), record
    assert trace[-1] == "asyncpg.exceptions.UndefinedColumnError: column s.downloads does not exist"
    assert "',)('" not in record and not any(line.startswith("('") for line in trace)
    assert "('Traceback" not in service.log.read_text(errors="replace")


def test_sigterm_stops_everything_it_started(service: Service) -> None:
    """Runs last in this module: it stops the service."""
    proc = psutil.Process(service.proc.pid)
    started = [p for p in proc.children(recursive=True)]
    postmaster = int((service.data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    commands = []
    for p in started:
        try:
            commands.append(" ".join(p.cmdline()))
        except psutil.Error:  # a worker that just exited, or a zombie not yet reaped
            continue
    assert any("redis-server" in cmd for cmd in commands)
    assert any("raylet" in cmd for cmd in commands)
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(90) == 0
    time.sleep(2)
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"still running: {[(p.pid, p.name()) for p in alive]}"
    assert (
        not psutil.pid_exists(postmaster)
        or psutil.Process(postmaster).status() == psutil.STATUS_ZOMBIE
    )
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(service.data_dir) in " ".join(p.info["cmdline"] or [])
        and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert leftovers == [], f"processes still using the data dir: {leftovers}"
    assert not (service.data_dir / "runtime.json").exists()
