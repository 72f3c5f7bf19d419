"""A WorkflowShard actor's supervised loops report their restarts to the generation's
Metrics actor (svc_background_restarts_total{task}), as the in-process service does.

Real local Ray, a real Metrics actor and shard under the generation's names, the real
database: the failure is the listener's Postgres connection being terminated (what a
Postgres restart or failover does to it), which ends the loop and makes the supervisor
restart it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import asyncpg
import pytest
import ray

from actors import NAMESPACE, Generation
from actors.metrics import KIND as METRICS
from actors.metrics import ActorMetricsHub, Metrics
from actors.workflow_shard import KIND, WorkflowShard

T = TypeVar("T")
RESTARTED = 'svc_background_restarts_total{task="workflow-listener"}'


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


async def _listener_pids(conn: asyncpg.Connection) -> list[int]:
    rows = await conn.fetch(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
    )
    return [row["pid"] for row in rows]


async def _restarts_line(hub: ActorMetricsHub) -> str:
    text = (await hub.render()).decode()
    return next((ln for ln in text.splitlines() if ln.startswith(RESTARTED)), "")


async def _polled(probe: Callable[[], Awaitable[T]], within: float = 30.0) -> T:
    """The probe's first truthy answer: the state polled lives in other processes (Postgres,
    the Metrics actor), so there is no local event to wait on."""
    deadline = time.monotonic() + within
    while not (found := await probe()):
        assert time.monotonic() < deadline, "not observed in time"
        await asyncio.sleep(0.2)
    return found


async def test_a_shard_listener_restart_reaches_the_metrics_hub(
    cluster: None, make_settings: Any
) -> None:
    settings = make_settings(workflow_shards=1)
    generation = Generation.of("restarts", settings)
    metrics = Metrics.options(name=generation.name(METRICS), namespace=NAMESPACE).remote()  # type: ignore[attr-defined]
    shard = WorkflowShard.options(name=generation.name(KIND, 0), namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
        settings, 0, 1, generation
    )
    hub = ActorMetricsHub(generation)
    conn = await asyncpg.connect(settings.database_url)
    try:
        await shard.ready.remote()
        # The engine listens once it drives something; a start of an unknown id is enough.
        await shard.start.remote("wf-none")
        pids = await _polled(lambda: _listener_pids(conn))
        assert RESTARTED not in (await hub.render()).decode()
        for pid in pids:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
        text = await _polled(lambda: _restarts_line(hub))
        assert float(text.split()[-1]) >= 1
    finally:
        await conn.close()
        ray.kill(shard)
        ray.kill(metrics)
