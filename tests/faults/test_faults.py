"""Fault tolerance of the whole service (`scripts/serve`: Serve, every actor kind, embedded
Postgres and Redis) under a steady load of acknowledged writes (memory entries) and
workflows: SIGKILL each actor kind in turn, restart Postgres, kill Redis.

What is asserted, for each fault (each test has a service of its own, so each passes alone
and in any order):
- before the fault the load runs without a single error;
- during the fault errors are bounded, and they end within the recovery time (every error
  lies within RECOVERY_S of the fault that caused it); writes then go on succeeding;
- a Redis outage costs no write at all (Redis is a cache);
- afterwards every acknowledged write reads back with its value, and every acknowledged
  workflow completes.
Waits are on the event that matters (a new process, N successful writes after a moment),
never a fixed sleep followed by a count. (A killed InferenceInstance coming back is
tests/e2e/test_inference.py's.)"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
# How long a fault may cost errors: a Ray actor restart or a pool reconnecting to a restarted
# Postgres, with the 2-core machine busy.
RECOVERY_S = 30.0
# Most errors one actor kill may cost (writes every ~20 ms: a few in-flight requests at most;
# memory writes do not go through any actor, workflow creation does).
MAX_ERRORS_PER_KILL = 5


@pytest.fixture
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    work = tmp_path_factory.mktemp("faults")
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        with running(work, agent_config(llm, agent_workers=2, workflow_shards=2)) as orch:
            yield orch


@dataclass(frozen=True)
class Outcome:
    at: float  # time.monotonic() when the answer (or the failure) came
    ok: bool
    what: str  # "memory" or "workflow"
    detail: str = ""


class Load:
    """Memory writes (recording the acknowledged ones) and workflows, from a thread, with the
    outcome of every request in time order."""

    def __init__(self, orch: Orchestrator, tag: str) -> None:
        self.orch = orch
        self.tag = tag
        self.acked: dict[str, str] = {}
        self.workflows: list[str] = []
        self.outcomes: list[Outcome] = []
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _record(self, ok: bool, what: str, detail: str = "") -> None:
        with self._changed:
            self.outcomes.append(Outcome(time.monotonic(), ok, what, detail))
            self._changed.notify_all()

    def _request(self, c: httpx.Client, what: str, path: str, body: dict[str, Any]) -> Any:
        try:
            r = c.post(path, json=body, timeout=10)
        except httpx.HTTPError as exc:
            self._record(False, what, repr(exc))
            return None
        if r.status_code != 200:
            self._record(False, what, f"{r.status_code} {r.text[:200]}")
            return None
        self._record(True, what)
        return r.json()

    def _run(self) -> None:
        i = 0
        with self.orch.client() as c:
            while not self._stop.is_set():
                key, value = f"{self.tag}-{i}", f"value {i}"
                if self._request(c, "memory", "/memory/faults/store", {"key": key, "value": value}):
                    self.acked[key] = value
                if i % 10 == 0:
                    body = {"name": f"{self.tag}{i}", "steps": [{"name": "a", "prompt": "x"}]}
                    if made := self._request(c, "workflow", "/workflows", body):
                        self.workflows.append(made["id"])
                i += 1
                time.sleep(0.02)

    def progress(
        self, n: int, within: float, what: str = "memory", after: float | None = None
    ) -> float:
        """Wait for `n` successful `what` requests from now on (or from the moment `after`,
        which may lie ahead); the time of the n-th."""
        since = time.monotonic() if after is None else after
        deadline = max(time.monotonic(), since) + within
        with self._changed:
            while True:
                done = [o for o in self.outcomes if o.ok and o.what == what and o.at >= since]
                if len(done) >= n:
                    return done[n - 1].at
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(done)}/{n} {what} requests succeeded in {within}s"
                self._changed.wait(left)

    def errors(self, since: float = 0.0, until: float = math.inf) -> list[Outcome]:
        with self._changed:
            return [o for o in self.outcomes if not o.ok and since <= o.at < until]

    def check(self, c: httpx.Client) -> None:
        """Every acknowledged write is there; every acknowledged workflow completes."""
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
        assert self.workflows, "the load started no workflow"
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


def _unhealthy(c: httpx.Client) -> bool:
    try:
        return c.get("/health", timeout=10).status_code == 503
    except httpx.HTTPError:
        return False


def _steady(load: Load) -> float:
    """The load is running (writes and a workflow acknowledged) and has had no error."""
    load.progress(1, 60, "workflow")
    started = load.progress(20, 60)
    assert not load.errors(), load.errors()[:5]
    return started


def test_sigkill_each_actor_kind_under_load(service: Orchestrator) -> None:
    kills: list[tuple[str, float]] = []
    with service.client() as c, Load(service, "kill") as load:
        _steady(load)
        for kind in ACTOR_KINDS:
            victims = _actors(kind, service)
            assert victims, f"no {kind} process"
            pids = {p.pid for p in victims}
            kills.append((kind, time.monotonic()))
            for p in victims:
                p.send_signal(signal.SIGKILL)
            # Ray restarts it (or a replica creates it again) under the same name.
            _wait(
                lambda k=kind, old=pids: [p for p in _actors(k, service) if p.pid not in old],
                90,
                f"{kind} did not come back",
            )
            # Writes and workflows go on after it is back.
            load.progress(10, RECOVERY_S)
            load.progress(1, RECOVERY_S, "workflow")
        # Past the last kill's recovery time, the load still runs (to see errors ended).
        end = load.progress(20, RECOVERY_S, after=kills[-1][1] + RECOVERY_S)
    # Every error is charged to the kill before it: bounded per kill, and none later than
    # RECOVERY_S after it.
    per_kill: dict[str, list[Outcome]] = {kind: [] for kind in ACTOR_KINDS}
    assert not load.errors(until=kills[0][1])
    for error in load.errors(since=kills[0][1]):
        kind, at = max((k for k in kills if k[1] <= error.at), key=lambda k: k[1])
        assert error.at - at <= RECOVERY_S, (kind, error)
        per_kill[kind].append(error)
    for kind, errors in per_kill.items():
        assert len(errors) <= MAX_ERRORS_PER_KILL, (kind, errors)
    assert len(load.errors(since=kills[-1][1] + RECOVERY_S, until=end)) == 0
    with service.client() as c:
        _wait(lambda: _healthy(c), 60, "not healthy after the kills")
        load.check(c)
        assert c.get("/metrics").status_code == 200


def test_postgres_restart_under_load(service: Orchestrator) -> None:
    pg = EmbeddedPostgres(service.work / "data")
    pg.start()  # adopts the service's running server
    with service.client() as c, Load(service, "pg") as load:
        _steady(load)
        stopped = time.monotonic()
        pg.stop()
        _wait(lambda: _unhealthy(c), 30, "health not 503")
        # The outage is real: writes fail while Postgres is down (and nothing is acknowledged).
        _wait(lambda: load.errors(since=stopped), 30, "writes still succeed without Postgres")
        restarted = time.monotonic()
        pg.restart()
        _wait(lambda: _healthy(c), 60, "not healthy again")
        recovered = time.monotonic() - restarted
        assert recovered <= 10, f"recovery took {recovered:.1f}s"
        load.progress(1, RECOVERY_S, "workflow")
        # Past the recovery time, the load still runs (to see errors ended).
        end = load.progress(20, RECOVERY_S, after=restarted + RECOVERY_S)
    # Errors only while Postgres was away, and for at most RECOVERY_S after it came back.
    assert not load.errors(until=stopped)
    late = load.errors(since=restarted + RECOVERY_S, until=end)
    assert not late, late[:5]
    with service.client() as c:
        load.check(c)


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE  # not ours to reap
    except psutil.NoSuchProcess:
        return True


def _redis_server(service: Orchestrator) -> psutil.Process:
    assert service.proc is not None
    for p in psutil.Process(service.proc.pid).children(recursive=True):
        try:
            if "redis-server" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    raise AssertionError("no embedded redis-server")


def test_redis_killed_no_write_lost_and_cache_rebuilt(
    service: Orchestrator, request: pytest.FixtureRequest
) -> None:
    redis = _redis_server(service)
    with service.client() as c, Load(service, "redis") as load:
        _steady(load)
        killed = time.monotonic()
        redis.send_signal(signal.SIGKILL)
        _wait(lambda: _dead(redis), 10, "redis-server still running")
        _wait(lambda: _unhealthy(c), 30, "health not 503")
        # Writes and reads go on against Postgres while Redis is away.
        load.progress(50, RECOVERY_S)
        load.progress(2, RECOVERY_S, "workflow")
        key = next(iter(load.acked))
        assert c.get(f"/memory/faults/{key}").json()["value"] == load.acked[key]
        assert _unhealthy(c), "Redis came back by itself?"
        # Redis comes back (empty: it was only a cache) on the same socket.
        fresh = EmbeddedRedis(service.work / "data")
        fresh.start()
        request.addfinalizer(fresh.stop)
        _wait(lambda: _healthy(c), 60, "not healthy once Redis is back")
        load.progress(20, RECOVERY_S)
    # Not a single failed request: Redis is a cache.
    assert not load.errors(since=killed), load.errors(since=killed)[:5]
    with service.client() as c:
        load.check(c)
        # Overwrites after the outage are read back at once (no stale cached copy).
        key = next(iter(load.acked))
        assert c.post("/memory/faults/store", json={"key": key, "value": "fresh"}).is_success
        assert c.get(f"/memory/faults/{key}").json()["value"] == "fresh"
