"""The SDK against the real app (uvicorn on loopback, real Postgres and Redis)."""

import asyncio
import time

import pytest

from orchestrator.sdk import ApiError, AsyncClient, Client
from tests.conftest import ADMIN_TOKEN, ServedApp


async def test_sync_and_async_clients_against_the_real_api(make_settings) -> None:
    async with ServedApp(make_settings()) as app:

        def sync_part() -> tuple[str, str]:
            with Client(app.url, token=ADMIN_TOKEN) as api:
                health = api.health()
                assert health.status == "ok" and health.components.store.tables >= 4
                assert api.ready() == "OK"
                assert api.whoami().admin is True
                created = api.create_token("dora", description="sdk test")
                assert created.user_uuid == "dora" and not created.admin
                assert created.expires_at is None
                brief = api.create_token("dora", expires_in=3600)
                assert brief.expires_at is not None
                assert abs(brief.expires_at - (time.time() + 3600) * 1000) < 60_000
                assert "svc_http_requests_total" in api.metrics()
                assert set(api.slo().model_dump()) >= {"latency_p99", "uptime_7d", "error_rate"}
                with pytest.raises(ApiError) as info:
                    api.create_token("")
                assert info.value.status == 400 and info.value.code == "validation_error"
                return created.token, created.prefix

        token, prefix = await asyncio.to_thread(sync_part)
        async with AsyncClient(app.url + "/api/v1/", token=token) as dora:
            assert (await dora.whoami()).user_uuid == "dora"
            with pytest.raises(ApiError) as info:
                await dora.create_token("x")
            assert info.value.status == 403 and info.value.request_id
            assert (await dora.revoke_token(prefix)).revoked == 1
            with pytest.raises(ApiError) as info:
                await dora.whoami()
            assert info.value.status == 401 and info.value.code == "unauthorized"
