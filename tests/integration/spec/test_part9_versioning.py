"""SPEC part 9, "Versioning": the path prefix /api/v1, each event's integer `version`, and
the health response's `version` string."""

from __future__ import annotations

import httpx

from tests.integration.spec._kit import ADMIN, Spec, create_workflow, events, finished


async def test_path_prefix(spec: Spec) -> None:
    """SPEC part 9: "The interface is versioned by the path prefix /api/v1" (and SPEC's
    opening: "Every path below starts with /api/v1")."""
    async with httpx.AsyncClient(base_url=spec.url) as c:
        assert (await c.get("/api/v1/ready")).status_code == 200
        for path in ("/ready", "/health", "/api/v2/ready", "/api/ready"):
            assert (await c.get(path, headers=ADMIN)).status_code == 404, path
        assert (await c.get("/workflows", headers=ADMIN)).status_code == 404


async def test_event_version(spec: Spec) -> None:
    """SPEC part 9: "Each event carries an integer `version` for its schema"."""
    h = await spec.user("p9")
    wid = await create_workflow(spec.c, h, name="p9", steps=[{"name": "a", "prompt": "x"}])
    await finished(spec.c, h, wid)
    evs = await events(spec.c, "all", h)
    assert evs
    for e in evs:
        assert (
            isinstance(e["version"], int)
            and not isinstance(e["version"], bool)
            and e["version"] >= 1
        )


async def test_health_version(spec: Spec) -> None:
    """SPEC part 9: "The health response carries a `version` string for the running service"."""
    body = (await spec.c.get("/health")).json()
    assert isinstance(body["version"], str) and body["version"]
