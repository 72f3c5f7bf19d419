"""The composition root (orchestrator/services/): each role gets its services built
completely, frozen, with its own pool size; what a build opened is closed with its stack, also
when the build fails halfway."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from orchestrator.config import Settings
from orchestrator.observability import MetricsRecorder
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.services import (
    AgentWorkerServices,
    ApiPeers,
    ApiServices,
    ChannelHubServices,
    Core,
    EventBusServices,
    InstanceServices,
    LocalMetricsHub,
    SchedulerServices,
    WorkflowShardServices,
    build_services,
)

MakeSettings = Callable[..., Settings]


async def _other_connections(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return count
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("role", "pool", "own"),
    [
        (EventBusServices, 4, set()),
        (InstanceServices, 2, {"instances"}),
        (WorkflowShardServices, 8, {"workflows", "interventions"}),
        (SchedulerServices, 6, {"jobs", "run_jobs"}),
        (ChannelHubServices, 4, {"channels", "egress"}),
        (AgentWorkerServices, 8, {"gateway", "memory", "tool_clients", "runner", "interventions"}),
    ],
)
async def test_an_actor_role_gets_only_its_services_frozen_and_closed_with_its_stack(
    make_settings: MakeSettings, role: type[Core], pool: int, own: set[str]
) -> None:
    settings = make_settings()
    assert settings.database_url
    async with contextlib.AsyncExitStack() as stack:
        services = await build_services(settings, role, stack, recorder=MetricsRecorder("t"))
        assert {f.name for f in dataclasses.fields(services)} == {
            "settings",
            "db",
            "events",
            "recorder",
            *own,
        }
        assert services.db.pool.get_max_size() == pool
        with pytest.raises(dataclasses.FrozenInstanceError):
            services.db = None  # type: ignore[misc]
        assert await _other_connections(settings.database_url) >= 1
    assert services.db.pool.is_closing()
    assert await _other_connections(settings.database_url) == 0


async def test_the_api_role_is_built_whole_and_unwound_in_reverse(
    make_settings: MakeSettings,
) -> None:
    settings = make_settings()
    supervisor = Supervisor("t")
    async with contextlib.AsyncExitStack() as stack:
        services = await build_services(
            settings,
            ApiServices,
            stack,
            recorder=MetricsRecorder("t"),
            supervisor=supervisor,
            peers=ApiPeers(metrics=LocalMetricsHub(), run_scheduler=False),
        )
        # Every service is there before anything serves; the Teams cache is an object.
        assert services.teams_verifiers.for_audience("bot") is (
            services.teams_verifiers.for_audience("bot")
        )
        assert services.scheduler is None and services.worker_pool == 1
    assert services.gateway.http.is_closed
    assert services.db.pool.is_closing()


async def test_a_build_that_fails_halfway_closes_what_it_opened(
    make_settings: MakeSettings,
) -> None:
    settings = make_settings(redis_url=None)  # the API role refuses after its pool is open
    assert settings.database_url
    seen: list[Any] = []
    with pytest.raises(RuntimeError, match="redis_url"):
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(seen.append, "closed")
            await build_services(
                settings,
                ApiServices,
                stack,
                recorder=MetricsRecorder("t"),
                supervisor=Supervisor("t"),
                peers=ApiPeers(metrics=LocalMetricsHub()),
            )
    assert seen == ["closed"]
    assert await _other_connections(settings.database_url) == 0
