"""The scheduler through `scripts/serve` (the Scheduler actor, AgentWorkers, embedded
Postgres): an every-1s job fires repeatedly as its creator, run-now dispatches at once, and a
kill -9 of the Scheduler actor mid-run: Ray restarts it, the interrupted run is recorded as
an error, and no slot fires twice. On the e2e modules' shared service (tests/e2e/shared.py):
its users are its own, it counts its own jobs' events, and it deletes the jobs it made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.drivers import last_json_line
from tests.e2e.shared import SharedService
from tests.e2e.test_serve import ROOT
from tests.e2e.test_workflows import Orchestrator, _actors

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def service(shared_service: SharedService) -> Orchestrator:
    return shared_service.orch


def _events(
    c: httpx.Client, types: str, user: str | None = None, **kw: Any
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"types": types, "limit": 1000}
    if user is not None:
        params["user_uuid"] = user  # an admin's view narrowed to that user's events
    return list(c.get("/events", params=params, **kw).json()["data"])


def _executed(c: httpx.Client, job_id: int) -> int:
    return sum(e["data"]["job_id"] == job_id for e in _events(c, "scheduler.job_executed"))


def _name(user: str) -> str:
    """A user of this run's own (the service is shared, and outlives a module)."""
    return f"{user}-{uuid.uuid4().hex[:8]}"


def _wait(check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
    return got


@pytest.fixture
def made_jobs(service: Orchestrator) -> Iterator[list[int]]:
    """Jobs a test made, deleted after it: nothing of it fires on while other modules run."""
    jobs: list[int] = []
    yield jobs
    with service.client() as c:
        for job_id in jobs:
            c.delete(f"/schedules/{job_id}")


def test_every_job_run_now_and_scheduler_kill(service: Orchestrator, made_jobs: list[int]) -> None:
    dana_uuid = _name("dana")
    with service.client() as c:
        made = c.post("/tokens", json={"user_uuid": dana_uuid, "admin": True}).json()
        dana = {"Authorization": f"Bearer {made['token']}"}
        jid = c.post("/schedules", headers=dana, json={"prompt": "tick", "every": 1000}).json()[
            "id"
        ]
        made_jobs.append(jid)
        _wait(lambda: _executed(c, jid) >= 3, 30)
        tasks = _events(c, "task.completed", user=dana_uuid, headers=dana)
        assert len(tasks) >= 3
        assert all(e["data"]["task_id"].startswith(f"job-{jid}-run-") for e in tasks)
        assert (c.get(f"/schedules/{jid}").json())["last_result"] == "ok"
        assert c.post(f"/schedules/{jid}/pause").json()["status"] == "paused"

        # Run now: a job whose cron is a year away is dispatched within a second.
        slow = c.post("/schedules", json={"prompt": "[sleep 4]", "cron": "0 0 1 1 *"}).json()["id"]
        made_jobs.append(slow)
        asked = time.time() * 1000
        assert c.post(f"/schedules/{slow}/run").json()["status"] == "dispatched"
        dispatched = _wait(
            lambda: [
                e for e in _events(c, "scheduler.task_dispatched") if e["data"]["job_id"] == slow
            ],
            10,
        )
        assert dispatched[0]["timestamp"] - asked < 1500
        # Kill the Scheduler while that run goes on: Ray restarts it; the run is recorded
        # as interrupted (an error), and nothing fires twice.
        killed = _actors("Scheduler", service)
        assert len(killed) == 1
        killed[0].send_signal(signal.SIGKILL)

        def interrupted() -> dict[str, Any] | None:
            job = c.get(f"/schedules/{slow}").json()
            return job if job["last_result"] == "error" else None

        job = _wait(interrupted, 60)
        assert "interrupted" in (job["last_error"] or "")
        assert job["consecutive_errors"] == 1 and job["running"] is False
        jid2 = c.post("/schedules", json={"prompt": "after", "every": 1000}).json()["id"]
        made_jobs.append(jid2)
        _wait(lambda: _executed(c, jid2) >= 2, 30)
        # Each dispatch moved the job to its next slot: a slot fired twice would repeat one.
        for job_id in (jid, jid2):
            slots = Counter(
                e["data"].get("next_run")
                for e in _events(c, "scheduler.task_dispatched")
                if e["data"]["job_id"] == job_id
            )
            assert all(n == 1 for n in slots.values()), slots


def test_error_codes_through_serve(service: Orchestrator) -> None:
    """SPEC part 7's scheduler errors, through the Serve ingress."""
    with service.client() as c:
        made = c.post("/tokens", json={"user_uuid": _name("erik")}).json()
        erik = {"Authorization": f"Bearer {made['token']}"}
        assert c.post("/schedules", json={"every": 1000}).status_code == 400  # no prompt
        r = c.post("/schedules", json={"prompt": "x", "cron": "99 * * * *"})
        assert r.status_code == 400 and "invalid cron expression" in r.json()["error"]
        r = c.post("/schedules", json={"prompt": "x", "schedule": "now and then"})
        assert r.status_code == 400 and r.json()["code"] == "validation_error"
        assert (
            c.post("/schedules", headers=erik, json={"prompt": "x", "every": 1000}).status_code
            == 403
        )
        slow = c.post("/schedules", json={"prompt": "[sleep 4]", "cron": "0 0 1 1 *"}).json()["id"]
        assert c.get("/schedules/x1").status_code == 400
        assert c.get("/schedules/987654").status_code == 404
        assert c.delete(f"/schedules/{slow}", headers=erik).status_code == 403
        assert c.delete("/schedules/987654").status_code == 404
        assert c.post("/schedules/987654/run").status_code == 404
        # Answered once dispatched (issue 33): the run's task is named, and it is running.
        ran = c.post(f"/schedules/{slow}/run").json()
        assert ran["status"] == "dispatched" and ran["id"] == slow
        assert ran["task_id"].startswith(f"job-{slow}-run-")
        assert c.get(f"/schedules/{slow}").json()["running"]
        assert c.post(f"/schedules/{slow}/run").status_code == 409
        assert c.delete(f"/schedules/{slow}").status_code == 409
        _wait(lambda: not c.get(f"/schedules/{slow}").json()["running"], 15)
        assert c.post(f"/schedules/{slow}/pause").json()["status"] == "paused"
        r = c.post(f"/schedules/{slow}/run")
        assert r.status_code == 400 and "unpause" in r.json()["error"]
        assert c.get("/schedules", headers=erik).json()["items"] == []
        assert c.delete(f"/schedules/{slow}").json()["status"] == "deleted"


def test_a_second_scheduler_actor_waits(service: Orchestrator) -> None:
    """Start a second Scheduler actor on the service's cluster: it waits for the lease the
    first one holds, so exactly one is active."""
    runtime = json.loads((service.work / "data" / "runtime.json").read_text())
    code = (
        "import json, time, ray\n"
        f"ray.init(address={runtime['ray_address']!r}, namespace='orchestrator',"
        " logging_level='ERROR')\n"
        "from actors import Generation\n"
        "from actors.scheduler import Scheduler\n"
        "[name] = [n for n in ray.util.list_named_actors() if n.endswith('-Scheduler')]\n"
        "first = ray.get_actor(name)\n"
        "settings = ray.get(first.settings.remote())\n"
        "second = Scheduler.options(name='scheduler-b', namespace='orchestrator')"
        ".remote(settings, Generation.of_actor_name(name), 'scheduler-b')\n"
        "time.sleep(4)\n"
        "print(json.dumps([ray.get(first.status.remote()), ray.get(second.status.remote())]))\n"
        "ray.kill(second, no_restart=True)\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = last_json_line(out.stdout)
    assert first["active"] is True and second["active"] is False
    assert second["name"] == "scheduler-b"
