"""Actors owned by the application, through `orchestrator serve --address` on a `ray start`
cluster (Postgres and Redis outside the service, as on a shared cluster, so they outlive it):

- a redeploy that changes only settings the HTTP replicas read (the log level, the rate
  limit) restarts those replicas and keeps the actors: the same processes, not nine new ones;
- a redeploy with changed settings gets a new actor generation that runs with them (the
  agent workers report the new values, their CPU reservation included), the old generation
  is gone, and a workflow running across the redeploy completes;
- Serve restarting a replica (the ingress, or the Runtime replica that owns the actors) does
  not make a second generation;
- SIGTERM of the service leaves no actor of ours alive on the cluster, and a job due every
  second fires no more."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest
import yaml

from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis
from tests.conftest import free_port
from tests.e2e.drivers import last_json_line
from tests.e2e.test_join_cluster import _stop_cluster, ray_env, start_head
from tests.e2e.test_serve import ROOT, _wait_for_ready_line
from tests.e2e.test_workflows import MODEL
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e

# A driver on the cluster: `ours()` are the names of our namespace's live actors.
PRELUDE = """
import json, sys, time
import ray
# The cluster's own output (raylet warnings, actor logs) stays off this driver's stdout,
# whose last line is the result.
ray.init(address=sys.argv[1], namespace="orchestrator", logging_level="ERROR",
         log_to_driver=False)

def ours():
    return sorted(
        n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
        if n["namespace"] == "orchestrator"
    )

def wait(check, within, what):
    deadline = time.monotonic() + within
    while not (got := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}: {ours()}")
        time.sleep(0.5)
    return got

def version(name):  # orch-<app>-<version8>-<Kind>[-<i>]
    return name.split("-")[2]
"""


@dataclass
class Cluster:
    root: Path
    gcs: str
    env: dict[str, str]
    database_url: str
    llm: OpenAIFake
    temp_dir: str
    # Serve's proxy keeps the port of the first service started on the cluster: every
    # service of the module uses it.
    http_port: int = field(default_factory=free_port)

    def driver(self, code: str, timeout: float = 300) -> Any:
        """Run `code` (after PRELUDE) in a driver joined to the cluster; its last line, JSON."""
        out = subprocess.run(
            [sys.executable, "-c", PRELUDE + code, self.gcs],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env,
            cwd=ROOT,
        )
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
        return last_json_line(out.stdout)


@dataclass
class Service:
    cluster: Cluster
    work: Path
    proc: subprocess.Popen[bytes] | None = None
    # Settings over the defaults below (other modules' services: tests/e2e/test_in_cluster.py).
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.cluster.http_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    def client(self) -> httpx.Client:
        token = (self.work / "data" / "admin_token").read_text().strip()
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def start(self) -> None:
        config = self.work / "orchestrator.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "providers": {
                        "openai": {
                            "base_url": self.cluster.llm.base_url,
                            "api_key": "sk-agent",
                            "models": [MODEL],
                        }
                    },
                    "default_model": MODEL,
                    "rate_limit_per_minute": 0,
                    "api_replicas": 1,
                    "generation_drain_s": 10,
                    **self.settings,
                }
            )
        )
        log = self.work / "serve.log"
        offset = log.stat().st_size if log.exists() else 0
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(ROOT / "scripts" / "serve"),
                    "--address",
                    self.cluster.gcs,
                    "--config",
                    str(config),
                    "--data-dir",
                    str(self.work / "data"),
                    "--port",
                    str(self.port),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.cluster.env,
            )
        _wait_for_ready_line(self.proc, log, offset)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, as an operator stops it; its exit code."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("generations")
    pg, redis = EmbeddedPostgres(root / "pg"), EmbeddedRedis(root / "redis")
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    gcs_port = free_port()
    env = ray_env()
    try:
        with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
            database_url = pg.start()
            env["ORCH_DATABASE_URL"] = database_url
            env["ORCH_REDIS_URL"] = redis.start()
            start_head(env, gcs_port, temp_dir)
            yield Cluster(root, f"127.0.0.1:{gcs_port}", env, database_url, llm, temp_dir)
    finally:
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        redis.stop()
        pg.stop()


@pytest.fixture(scope="module")
def holder(cluster: Cluster) -> Iterator[dict[str, Service]]:
    """The module's service, started on demand (a test that stops it leaves it stopped)."""
    services: dict[str, Service] = {}
    yield services
    for service in services.values():
        service.stop()
        sys.stdout.write((service.work / "serve.log").read_text(errors="replace")[-3000:])


@pytest.fixture
def service(cluster: Cluster, holder: dict[str, Service]) -> Service:
    current = holder.get("service")
    if current is None or not current.running:
        current = Service(cluster, cluster.root / "service")
        current.work.mkdir(exist_ok=True)
        holder["service"] = current
        current.start()
    return current


def _ray_processes(cluster: Cluster, title: str) -> list[psutil.Process]:
    """Live Ray worker processes of this module's cluster whose title starts with `title`
    (`ray::AgentWorker`...)."""
    found = []
    for root in psutil.process_iter(["cmdline"]):
        if cluster.temp_dir not in " ".join(root.info["cmdline"] or []):
            continue
        with contextlib.suppress(psutil.Error):
            for p in root.children(recursive=True):
                cmd = p.cmdline()
                if cmd and cmd[0].startswith(title) and p.status() != psutil.STATUS_ZOMBIE:
                    if p not in found:
                        found.append(p)
    return found


def test_agent_workers_yield_the_cpu_to_the_control_plane(service: Service) -> None:
    """The AgentWorkers run `agent_worker_niceness` (4) nicer than the other actors, every
    thread of them: a burst of agent work waits for the scheduler, the shards, the bus.
    (Ray sets its workers' main thread to 15; their other threads, the event loop's among
    them, keep the niceness they started with.)"""
    with service.client() as c:
        assert c.get("/ready").status_code == 200
    deadline = time.monotonic() + 120
    while not (workers := _ray_processes(service.cluster, "ray::AgentWorker")) or not (
        schedulers := _ray_processes(service.cluster, "ray::Scheduler")
    ):
        assert time.monotonic() < deadline, "the generation's actors did not start"
        time.sleep(0.5)
    control = {psutil.Process(t.id).nice() for t in schedulers[0].threads()}
    assert min(control) < 15
    for worker in workers:
        threads = {psutil.Process(t.id).nice() for t in worker.threads()}
        assert threads == {min(19, n + 4) for n in control}, (worker.pid, threads, control)


def _replicas(cluster: Cluster, deployment: str) -> list[psutil.Process]:
    """The live replica processes of `deployment` on this module's cluster (descendants of
    its `ray start` processes: other services on the machine have replicas too)."""
    found = []
    for root in psutil.process_iter(["cmdline"]):
        if cluster.temp_dir not in " ".join(root.info["cmdline"] or []):
            continue
        with contextlib.suppress(psutil.Error):
            for p in root.children(recursive=True):
                cmd = p.cmdline()
                if cmd and cmd[0].startswith(f"ray::ServeReplica:orchestrator:{deployment}"):
                    if p.status() != psutil.STATUS_ZOMBIE and p not in found:
                        found.append(p)
    return found


REPLICA_ONLY = """
from ray import serve
from deployments.app import APP_NAME, build_app
before = {n: ray.get_actor(n)._actor_id.hex() for n in ours()}
scheduler = ray.get_actor(next(n for n in before if n.endswith("-Scheduler")))
settings = ray.get(scheduler.settings.remote())
new = settings.model_copy(update={"log_level": "DEBUG", "rate_limit_per_minute": 100000})
serve.run(build_app({"settings": new}), name=APP_NAME, route_prefix="/", blocking=False)
time.sleep(5)  # a generation replaced would be draining by now
after = {n: ray.get_actor(n)._actor_id.hex() for n in ours()}
print(json.dumps({"before": before, "after": after}))
"""


def test_a_redeploy_of_replica_settings_keeps_the_actors(service: Service) -> None:
    """log_level and rate_limit_per_minute are not in the generation's version: the Api
    replica restarts with them, the Runtime replica and its actors stay as they are."""
    [api] = _replicas(service.cluster, "Api")
    [runtime] = _replicas(service.cluster, "Runtime")
    got = service.cluster.driver(REPLICA_ONLY)
    assert got["before"] and got["after"] == got["before"]  # same names, same actors
    assert [p.pid for p in _replicas(service.cluster, "Runtime")] == [runtime.pid]
    deadline = time.monotonic() + 120
    while [p.pid for p in _replicas(service.cluster, "Api")] in ([], [api.pid]):
        assert time.monotonic() < deadline, "the Api replica did not restart"
        time.sleep(0.5)
    with service.client() as c:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if c.get("/ready").text == "OK":
                    break
            assert time.monotonic() < deadline, "the new Api replica did not become ready"
            time.sleep(0.5)


REDEPLOY = """
from ray import serve
from deployments.app import APP_NAME, build_app
before = ours()
worker = ray.get_actor(next(n for n in before if "-AgentWorker-" in n))
was = ray.get(worker.describe.remote())
old = f"orch-orchestrator-{was['generation'][:8]}-"
scheduler = ray.get_actor(next(n for n in before if n.endswith("-Scheduler")))
settings = ray.get(scheduler.settings.remote())
new = settings.model_copy(update={"provider_retries": 4, "agent_worker_cpus": 0.05,
                                  "workflow_shards": settings.workflow_shards + 1})
serve.run(build_app({"settings": new}), name=APP_NAME, route_prefix="/", blocking=False)
after = wait(lambda: (n := ours()) and not any(x.startswith(old) for x in n)
             and sum("-AgentWorker-" in x for x in n) == new.agent_workers and n, 240,
             "the old generation to go and the new one to come")
reports = [ray.get(ray.get_actor(n).describe.remote()) for n in after if "-AgentWorker-" in n]
print(json.dumps({"before": before, "after": after, "was": was, "reports": reports,
                  "shards": new.workflow_shards}))
"""


def test_redeploy_reaches_the_workers_and_retires_the_old_generation(service: Service) -> None:
    """A redeploy with changed settings, `workflow_shards` among them (re-sharding while a
    workflow runs): new actors with the new settings, none of the old generation, and the
    workflow in flight moves to the new shards through its claim: completed, no step lost,
    no step attempt's task dispatched twice."""
    with service.client() as c:
        # A workflow whose steps run across the redeploy.
        r = c.post(
            "/workflows",
            json={
                "name": "across",
                "steps": [{"name": f"s{i}", "prompt": "[sleep 2]"} for i in range(4)],
            },
        )
        assert r.status_code == 200, r.text
        wid = r.json()["id"]
    got = service.cluster.driver(REDEPLOY)
    before, after, was = got["before"], got["after"], got["was"]
    assert was["settings"]["provider_retries"] == 2
    assert was["resources"].get("CPU") == pytest.approx(0.1)
    old = f"orch-orchestrator-{was['generation'][:8]}-"
    assert all(n.startswith(old) for n in before)
    # The same actors, under the new version only: none of the old one is alive.
    assert not [n for n in after if n.startswith(old)]
    assert {_version(n) for n in after} == {got["reports"][0]["generation"][:8]}
    others = sorted(_kind(n) for n in before if "WorkflowShard" not in n)
    assert sorted(_kind(n) for n in after if "WorkflowShard" not in n) == others
    assert sum("-WorkflowShard-" in n for n in after) == got["shards"]
    assert len(got["reports"]) == 2
    for report in got["reports"]:
        assert report["generation"] != was["generation"]
        assert report["settings"]["provider_retries"] == 4
        assert report["resources"].get("CPU") == pytest.approx(0.05)
    # The new generation serves: the workflow started before the redeploy completes.
    with service.client() as c:
        deadline = time.monotonic() + 120
        while (body := c.get(f"/workflows/{wid}").json())["status"] not in (
            "completed",
            "failed",
            "cancelled",
        ):
            assert time.monotonic() < deadline, body
            time.sleep(0.5)
        assert body["status"] == "completed", body
        assert [s["status"] for s in body["steps"]] == ["completed"] * 4
        dispatched = c.get("/events", params={"types": "task.dispatched", "limit": 1000}).json()
        tasks = Counter(
            e["data"]["task_id"] for e in dispatched["data"] if e["data"].get("workflow_id") == wid
        )
        assert len(tasks) >= 4 and max(tasks.values()) == 1, tasks


def _version(name: str) -> str:
    return name.split("-")[2]  # orch-<app>-<version8>-<Kind>[-<i>]


def _kind(name: str) -> str:
    return name.split("-", 3)[3]


LIST = """
print(json.dumps(ours()))
"""


def test_replicas_restarting_make_no_second_generation(service: Service) -> None:
    before = service.cluster.driver(LIST)
    assert before and len({_version(n) for n in before}) == 1
    # The ingress replica dies: Serve starts another; it finds the generation, makes none.
    [api] = _replicas(service.cluster, "Api")
    api.kill()
    deadline = time.monotonic() + 120
    while not [p for p in _replicas(service.cluster, "Api") if p.pid != api.pid]:
        assert time.monotonic() < deadline, "Serve did not replace the Api replica"
        time.sleep(0.5)
    with service.client() as c:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if c.get("/ready").text == "OK":
                    break
            assert time.monotonic() < deadline, "the new Api replica did not become ready"
            time.sleep(0.5)
    assert service.cluster.driver(LIST) == before
    # The Runtime replica dies: its actors die with it (they are not detached), and its
    # replacement creates the same generation again: the same names, one set of them.
    [runtime] = _replicas(service.cluster, "Runtime")
    runtime.kill()
    again = service.cluster.driver(
        f"""
wait(lambda: ours() == {before!r}, 180, "the generation to come back")
time.sleep(3)  # and not a second one after it
print(json.dumps(ours()))
"""
    )
    assert again == before


def test_shutdown_leaves_no_actor_and_no_job_fires(
    service: Service, holder: dict[str, Service]
) -> None:
    cluster = service.cluster
    with service.client() as c:
        fired = len(cluster.llm.chat_requests)
        r = c.post("/schedules", json={"prompt": "tick", "every": 1000})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        while len(cluster.llm.chat_requests) < fired + 2:
            assert time.monotonic() < deadline, "the every-second job did not fire"
            time.sleep(0.2)
    assert service.stop() == 0
    holder.pop("service", None)
    left = cluster.driver("print(json.dumps(ours()))")
    assert left == [], f"actors of ours still alive after shutdown: {left}"

    async def runs() -> int:
        conn = await asyncpg.connect(cluster.database_url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM scheduled_runs"))
        finally:
            await conn.close()

    counted, hits = asyncio.run(runs()), len(cluster.llm.chat_requests)
    # Proving that nothing happens takes a window: five of the job's periods.
    time.sleep(5)
    assert asyncio.run(runs()) == counted
    assert len(cluster.llm.chat_requests) == hits


DELETE = """
from ray import serve

@ray.remote(num_cpus=0)
class Probe:  # stands in for an inference instance: detached, outlives generations
    def ping(self):
        return "pong"

    def stop(self, reason):
        return "stopped"

probe = Probe.options(
    name="orch-orchestrator-InferenceInstance-probe", namespace="orchestrator",
    lifetime="detached",
).remote()
ray.get(probe.ping.remote())
generation = [n for n in ours() if "InferenceInstance" not in n]
serve.delete("orchestrator")
wait(lambda: ours() == [], 60, "no actor of ours alive")
print(json.dumps({"generation": generation, "left": ours()}))
"""


def test_serve_delete_leaves_no_actor(service: Service, holder: dict[str, Service]) -> None:
    """Serve's own `delete` (no `orchestrator serve` involved): the Runtime replica drains
    and kills its generation and, the application being deleted, the inference instances."""
    got = service.cluster.driver(DELETE)
    assert got["generation"] and got["left"] == []
    assert service.stop() == 0
    holder.pop("service", None)
