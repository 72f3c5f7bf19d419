"""Fault tolerance of the whole service (`scripts/serve`: Serve, every actor kind, embedded
Postgres and Redis) under a steady load of acknowledged writes (memory entries) and
workflows: SIGKILL each actor kind in turn, restart Postgres, kill Redis. Afterwards every
write that was acknowledged is there, every workflow finished, and the service is healthy.
(A killed InferenceInstance coming back is tests/e2e/test_inference.py's.)"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis
from tests.e2e.test_workflows import Orchestrator, _actors, agent_config, running
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

ACTOR_KINDS = ("EventBus", "WorkflowShard", "AgentWorker", "Scheduler", "ChannelHub", "Metrics")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    work = tmp_path_factory.mktemp("faults")
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        with running(work, agent_config(llm, agent_workers=2, workflow_shards=2)) as orch:
            yield orch


class Load:
    """Memory writes (recording the acknowledged ones) and workflows, from a thread."""

    def __init__(self, orch: Orchestrator, tag: str) -> None:
        self.orch = orch
        self.tag = tag
        self.acked: dict[str, str] = {}
        self.workflows: list[str] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        i = 0
        with self.orch.client() as c:
            while not self._stop.is_set():
                key, value = f"{self.tag}-{i}", f"value {i}"
                try:
                    r = c.post(
                        "/memory/faults/store", json={"key": key, "value": value}, timeout=10
                    )
                    if r.status_code == 200:
                        self.acked[key] = value
                    else:
                        self.errors += 1
                    if i % 10 == 0:
                        r = c.post(
                            "/workflows",
                            json={
                                "name": f"{self.tag}{i}",
                                "steps": [{"name": "a", "prompt": "x"}],
                            },
                            timeout=10,
                        )
                        if r.status_code == 200:
                            self.workflows.append(r.json()["id"])
                        else:
                            self.errors += 1
                except httpx.HTTPError:
                    self.errors += 1
                i += 1
                time.sleep(0.02)

    def check(self, c: httpx.Client) -> None:
        """Every acknowledged write is there; every acknowledged workflow finishes."""
        assert self.acked, "the load made no write at all"
        have: dict[str, str] = {}
        while True:
            page = c.get("/memory/faults/list", params={"limit": 1000, "offset": len(have)}).json()[
                "entries"
            ]
            have.update({e["key"]: e["value"] for e in page})
            if len(page) < 1000:
                break
        missing = {k for k in self.acked if have.get(k) != self.acked[k]}
        assert not missing, sorted(missing)[:10]
        deadline = time.monotonic() + 120
        for wid in self.workflows:
            while (status := c.get(f"/workflows/{wid}").json()["status"]) not in (
                "completed",
                "failed",
            ):
                assert time.monotonic() < deadline, (wid, status)
                time.sleep(0.3)
            assert status == "completed", wid


def _wait(check: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return got


def _healthy(c: httpx.Client) -> bool:
    try:
        return c.get("/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigkill_each_actor_kind_under_load(service: Orchestrator) -> None:
    with service.client() as c, Load(service, "kill") as load:
        time.sleep(2)
        for kind in ACTOR_KINDS:
            victims = _actors(kind)
            assert victims, f"no {kind} process"
            pids = {p.pid for p in victims}
            for p in victims:
                p.send_signal(signal.SIGKILL)
            # Ray restarts it (or a replica creates it again) under the same name.
            _wait(
                lambda k=kind, old=pids: [p for p in _actors(k) if p.pid not in old],
                90,
                f"{kind} did not come back",
            )
            time.sleep(1)
        time.sleep(2)
    with service.client() as c:
        _wait(lambda: _healthy(c), 60, "not healthy after the kills")
        load.check(c)
        assert c.get("/metrics").status_code == 200


def test_postgres_restart_under_load(service: Orchestrator) -> None:
    pg = EmbeddedPostgres(service.work / "data")
    pg.start()  # adopts the service's running server
    with service.client() as c, Load(service, "pg") as load:
        time.sleep(2)
        pg.stop()
        _wait(lambda: c.get("/health", timeout=10).status_code == 503, 30, "health not 503")
        time.sleep(2)
        pg.restart()
        t0 = time.monotonic()
        _wait(lambda: _healthy(c), 60, "not healthy again")
        recovered = time.monotonic() - t0
        assert recovered <= 10, f"recovery took {recovered:.1f}s"
        time.sleep(2)
    with service.client() as c:
        load.check(c)


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE  # not ours to reap
    except psutil.NoSuchProcess:
        return True


def _redis_server(service: Orchestrator) -> psutil.Process:
    marker = str(service.work / "data")
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and "redis-server" in cmd[0] and marker in " ".join([*cmd, p.cwd()]):
            return p
    raise AssertionError("no embedded redis-server")


def test_redis_killed_nothing_lost_and_cache_rebuilt(
    service: Orchestrator, request: pytest.FixtureRequest
) -> None:
    redis = _redis_server(service)
    with service.client() as c, Load(service, "redis") as load:
        time.sleep(1)
        redis.send_signal(signal.SIGKILL)
        _wait(lambda: _dead(redis), 10, "redis-server still running")
        _wait(lambda: c.get("/health", timeout=10).status_code == 503, 30, "health not 503")
        time.sleep(2)  # writes and reads go on against Postgres meanwhile
        key = next(iter(load.acked))
        assert c.get(f"/memory/faults/{key}").json()["value"] == load.acked[key]
        # Redis comes back (empty: it was only a cache).
        fresh = EmbeddedRedis(service.work / "data")  # the same socket
        fresh.start()
        request.addfinalizer(fresh.stop)
        _wait(lambda: _healthy(c), 60, "not healthy once Redis is back")
        time.sleep(1)
    with service.client() as c:
        load.check(c)
        # Overwrites after the outage are read back at once (no stale cached copy).
        key = next(iter(load.acked))
        c.post("/memory/faults/store", json={"key": key, "value": "fresh"})
        assert c.get(f"/memory/faults/{key}").json()["value"] == "fresh"
