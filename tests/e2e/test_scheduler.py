"""The scheduler through `scripts/serve` (the Scheduler actor, AgentWorkers, embedded
Postgres): an every-1s job fires repeatedly as its creator, run-now dispatches at once, and a
kill -9 of the Scheduler actor mid-run: Ray restarts it, the interrupted run is recorded as
an error, and no slot fires twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.drivers import last_json_line
from tests.e2e.test_serve import ROOT
from tests.e2e.test_workflows import Orchestrator, _actors, agent_config, running
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    work = tmp_path_factory.mktemp("scheduler-e2e")
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        with running(work, agent_config(llm)) as orch:
            yield orch


def _events(c: httpx.Client, types: str, **kw: Any) -> list[dict[str, Any]]:
    return list(c.get("/events", params={"types": types, "limit": 1000}, **kw).json()["data"])


def _wait(check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
    return got


def test_every_job_run_now_and_scheduler_kill(service: Orchestrator) -> None:
    with service.client() as c:
        made = c.post("/tokens", json={"user_uuid": "dana", "admin": True}).json()
        dana = {"Authorization": f"Bearer {made['token']}"}
        jid = c.post("/schedules", headers=dana, json={"prompt": "tick", "every": 1000}).json()[
            "id"
        ]
        _wait(lambda: len(_events(c, "scheduler.job_executed")) >= 3, 30)
        tasks = _events(c, "task.completed", headers=dana)
        assert len(tasks) >= 3
        assert all(e["data"]["task_id"].startswith(f"job-{jid}-run-") for e in tasks)
        assert (c.get(f"/schedules/{jid}").json())["last_result"] == "ok"
        assert c.post(f"/schedules/{jid}/pause").json()["status"] == "paused"

        # Run now: a job whose cron is a year away is dispatched within a second.
        slow = c.post("/schedules", json={"prompt": "[sleep 4]", "cron": "0 0 1 1 *"}).json()["id"]
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
        _wait(
            lambda: (
                sum(e["data"]["job_id"] == jid2 for e in _events(c, "scheduler.job_executed")) >= 2
            ),
            30,
        )
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
        made = c.post("/tokens", json={"user_uuid": "erik"}).json()
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
