"""`orchestrator serve` with `log_format: json`: the driver's output, the replicas' Serve log
files and Serve's controller and proxy logs are one JSON object per line, and a request's
access line (found by its request id) has the request fields."""

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
from pathlib import Path

import httpx
import psutil
import pytest

from deployments.launcher import ACTORS_RUNNING
from tests.conftest import free_port
from tests.e2e.test_serve import ROOT, Service, _wait_for_ready_line, answer_a_real_500

pytestmark = pytest.mark.e2e
_SESSION = re.compile(r"(/tmp/ray/session_[0-9_\-]+)")
BASE_FIELDS = {"time", "level", "logger", "message"}
ORCHESTRATOR = [sys.executable, "-m", "orchestrator.cli"]
OUR_ACTORS = ("Metrics", "EventBus", "AgentWorker", "WorkflowShard", "Scheduler", "ChannelHub")


def _session_dir(pid: int) -> Path:
    """The Ray session of the cluster this service started (from its raylet's arguments)."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            found = _SESSION.search(" ".join(child.cmdline()))
        except psutil.Error:
            continue
        if found:
            return Path(found.group(1))
    raise AssertionError("no Ray process of this service names its session directory")


@pytest.fixture(scope="module")
def json_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path]]:
    data_dir = tmp_path_factory.mktemp("e2e-json") / "data"
    log = data_dir.parent / "serve.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
    env.update(ORCH_LOG_FORMAT="json", ORCH_ACCESS_LOG="true")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*ORCHESTRATOR, "serve", "--data-dir", str(data_dir), "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        _wait_for_ready_line(proc, log)
        session = _session_dir(proc.pid)
        token = (data_dir / "admin_token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        yield Service(proc, f"http://127.0.0.1:{port}", data_dir, log, auth), session
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()


def _json_lines(path: Path) -> list[dict[str, object]]:
    parsed = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{path.name}:{number} is not JSON: {line[:300]}")
        assert isinstance(entry, dict), f"{path.name}:{number}: {line[:300]}"
        parsed.append(entry)
    return parsed


def _access_line(session: Path, request_id: str) -> dict[str, object] | None:
    for path in (session / "logs" / "serve").glob("replica_*Api*.log"):
        for entry in _json_lines(path):
            if entry.get("logger") == "orchestrator.access" and entry.get("request_id") == (
                request_id
            ):
                return entry
    return None


def test_every_line_is_json_and_the_request_line_has_its_fields(
    json_service: tuple[Service, Path],
) -> None:
    service, session = json_service
    r = httpx.get(f"{service.url}/api/v1/workflows/wf-none", headers=service.admin, timeout=10)
    assert r.status_code == 404
    request_id = r.headers["x-request-id"]
    deadline = time.monotonic() + 30
    while (line := _access_line(session, request_id)) is None:
        assert time.monotonic() < deadline, f"no access line for {request_id}"
        time.sleep(0.5)
    assert BASE_FIELDS <= set(line)
    assert line["route"] == "/api/v1/workflows/{workflow_id}"
    assert line["method"] == "GET" and line["status"] == 404 and line["user"] == "admin"
    assert isinstance(line["duration_ms"], int | float)
    assert line["level"] == "INFO" and line["logger"] == "orchestrator.access"

    # Every part has logged once the actors run too (they start after the API serves).
    _wait_for_ready_line(service.proc, service.log, line=ACTORS_RUNNING)
    serve_logs = list((session / "logs" / "serve").glob("*.log"))
    kinds = {p.name.split("_")[0] for p in serve_logs}
    assert {"replica", "controller", "proxy"} <= kinds, kinds
    for path in serve_logs:
        assert _json_lines(path), f"{path.name} is empty"
    replicas = [p for p in serve_logs if p.name.startswith("replica_")]
    assert any("Runtime" in p.name for p in replicas) and any("Api" in p.name for p in replicas)
    for path in replicas:
        for entry in _json_lines(path):
            assert BASE_FIELDS <= set(entry), f"{path.name}: {entry}"

    token = service.admin["Authorization"].split()[1]
    for path in [*serve_logs, service.log]:
        assert token not in path.read_text(errors="replace"), path.name


def test_our_actors_write_json_lines(json_service: tuple[Service, Path]) -> None:
    """Every line our actors write to their worker's stderr is JSON (Ray's own `:actor_name:`
    markers aside)."""
    _, session = json_service
    seen: set[str] = set()
    for path in (session / "logs").glob("worker-*.err"):
        text = path.read_text(errors="replace")
        kinds = {k for k in OUR_ACTORS if f":actor_name:{k}" in text}
        if not kinds:
            continue
        seen |= kinds
        for line in text.splitlines():
            if line.strip() and not line.startswith(":"):
                entry = json.loads(line)  # raises on a line that is not JSON
                assert BASE_FIELDS <= set(entry), f"{path.name}: {line[:300]}"
    assert {"WorkflowShard", "ChannelHub", "EventBus"} <= seen, seen


def _error_record(session: Path, request_id: str) -> dict[str, object] | None:
    for path in (session / "logs" / "serve").glob("replica_*Api*.log"):
        for entry in _json_lines(path):
            if entry.get("level") == "ERROR" and entry.get("request_id") == request_id:
                return entry
    return None


async def test_a_500s_traceback_is_one_exc_info_string(
    json_service: tuple[Service, Path],
) -> None:
    """A real 500's record in the replica's log is one JSON object whose `exc_info` is the
    traceback as Python prints it (it was a run of tuple reprs under `exc`)."""
    service, session = json_service
    request_id = await answer_a_real_500(service)
    deadline = time.monotonic() + 30
    while (entry := await asyncio.to_thread(_error_record, session, request_id)) is None:
        assert time.monotonic() < deadline, f"no ERROR record for {request_id}"
        await asyncio.sleep(0.5)
    assert entry["logger"] == "orchestrator.http" and "exc" not in entry
    assert "GET /api/v1/marketplace/browse" in str(entry["message"])
    trace = entry["exc_info"]
    assert isinstance(trace, str) and trace.startswith("Traceback (most recent call last):\n")
    lines = trace.split("\n")
    assert any(
        re.fullmatch(r'  File "/.+/deployments/routers/marketplace\.py", line \d+, in \w+', line)
        for line in lines
    ), trace
    assert lines[-1] == "asyncpg.exceptions.UndefinedColumnError: column s.downloads does not exist"
    assert "',)('" not in trace and not any(line.startswith("('") for line in lines)


def test_the_driver_output_is_json_to_the_last_line(json_service: tuple[Service, Path]) -> None:
    """Runs last in this module: it stops the service."""
    service, _ = json_service
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(90) == 0
    lines = _json_lines(service.log)
    assert all(BASE_FIELDS <= set(entry) for entry in lines)
    messages = [str(entry["message"]) for entry in lines]
    assert any(m.startswith("Orchestrator ready at") for m in messages)
    assert messages[-1] == "stopped"
