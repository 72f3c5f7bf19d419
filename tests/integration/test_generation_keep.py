"""The Runtime replica keeps its generation without polling Ray: `keep` awaits a member's
`watch` call, which fails only when the actor dies. A member killed for good is created
again under its name; one Ray restarts is left to Ray (no second actor).

Real local Ray and a real generation member (the Metrics actor: no database needed)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray.exceptions import RayActorError

from actors import NAMESPACE, Generation
from actors.generation import Member, create, keep
from actors.metrics import KIND as METRICS
from actors.metrics import Metrics
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.supervisor import Supervisor

QUICK = Backoff(base=0.05, cap=0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _actor_id(name: str) -> str | None:
    try:
        return str(ray.get_actor(name, namespace=NAMESPACE)._actor_id.hex())
    except ValueError:
        return None


async def _until(probe: Any, within: float = 60.0) -> Any:
    """The probe's first truthy answer (Ray's state is in other processes: polled)."""
    deadline = time.monotonic() + within
    while not (found := await asyncio.to_thread(probe)):
        assert time.monotonic() < deadline, "not observed in time"
        await asyncio.sleep(0.1)
    return found


async def _answers(handle: Any, within: float = 60.0) -> None:
    """Until a call to the actor answers (a call in flight when it restarts fails)."""
    deadline = time.monotonic() + within
    while True:
        try:
            await asyncio.wait_for(handle.gauges.remote(), 10)
            return
        except (RayActorError, TimeoutError):
            assert time.monotonic() < deadline, "the actor did not come back"
            await asyncio.sleep(0.1)


async def test_a_member_killed_for_good_is_created_again(
    cluster: None, caplog: pytest.LogCaptureFixture
) -> None:
    generation = Generation("keep", "0123456789abcdef")
    member = Member(METRICS, generation.name(METRICS), Metrics, (60.0,), start="gauges")
    handles = await create([member], started_within_s=30)
    supervisor = Supervisor("test-runtime")
    supervisor.spawn("keep", lambda: keep(member, handles, QUICK))
    try:
        first = _actor_id(member.name)
        assert first is not None
        with caplog.at_level(logging.WARNING, logger="actors.generation"):
            ray.kill(handles[member.name], no_restart=True)
            second = await _until(lambda: (got := _actor_id(member.name)) != first and got)
        assert second != first
        # The new actor serves, through the handle the generation holds.
        gauges = await asyncio.wait_for(handles[member.name].gauges.remote(), 30)
        assert gauges == {"stream_sockets": 0, "active_workers": 0}
        assert any("created it again" in r.getMessage() for r in caplog.records)

        # A crash Ray restarts is Ray's: the same actor comes back, keep creates none.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="actors.generation"):
            ray.kill(handles[member.name], no_restart=False)
            await _answers(handles[member.name])
            await asyncio.sleep(1.0)  # past keep's look at it
        assert _actor_id(member.name) == second
        assert not any("created it again" in r.getMessage() for r in caplog.records)
        assert supervisor.restarts() == {}
    finally:
        await supervisor.aclose()
        for handle in handles.values():
            ray.kill(handle, no_restart=True)
