"""Health, readiness, metrics and SLO: served without a token (see `exempt_paths`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from deployments.deps import Db, Metrics, ModelGateway, Pusher, Redis, Slo, StartedAt, WorkerPool
from orchestrator import SERVICE_VERSION, wire
from orchestrator.db import Database
from orchestrator.errors import ServiceUnavailable
from orchestrator.events import EventTypeCounts
from orchestrator.observability import SloQuery, uptime_ratio
from orchestrator.services import MetricsHub

router = APIRouter(tags=["operations"])
log = logging.getLogger(__name__)


async def _probe_store(db: Database) -> wire.StoreHealth:
    try:
        return wire.StoreHealth(status="ok", tables=await db.ping())
    except Exception as exc:  # noqa: BLE001 - any failure means the store is degraded
        log.warning("store probe failed: %r", exc)
        return wire.StoreHealth(status="degraded", tables=0)


async def _probe_messaging(redis: aioredis.Redis) -> bool:
    try:
        async with asyncio.timeout(2.0):
            await redis.ping()
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means messaging is degraded
        log.warning("messaging probe failed: %r", exc)
        return False


async def _gauges(hub: MetricsHub) -> dict[str, int]:
    try:
        async with asyncio.timeout(2.0):
            return await hub.gauges()
    except Exception as exc:  # noqa: BLE001 - the metrics hub is not a critical component
        log.warning("metrics hub unreachable: %r", exc)
        return {}


@router.get("/health", response_model=wire.Health)
async def health(
    db: Db,
    redis: Redis,
    metrics: Metrics,
    gateway: ModelGateway,
    worker_pool: WorkerPool,
    started_at: StartedAt,
) -> JSONResponse:
    store, redis_ok, gauges = await asyncio.gather(
        _probe_store(db), _probe_messaging(redis), _gauges(metrics)
    )
    messaging = wire.MessagingHealth(
        status="ok" if redis_ok else "degraded", sockets=gauges.get("stream_sockets", 0)
    )
    # Providers: configured ones, healthy = breaker not open and last probe (if any) reached
    # it; not critical (a provider down degrades models, not the service). Workers: each
    # AgentWorker reports 1 while it runs a task; the others of the pool are idle.
    total, healthy = gateway.summary()
    providers = wire.ProvidersHealth(total=total, healthy=healthy)
    active = gauges.get("active_workers", 0)
    workers = wire.WorkersHealth(active=active, idle=max(0, worker_pool - active))
    critical_ok = store.status == "ok" and messaging.status == "ok"
    body = wire.Health(
        status="ok" if critical_ok else "degraded",
        version=SERVICE_VERSION,
        uptime_seconds=round(time.time() - started_at, 3),
        components=wire.HealthComponents(
            store=store, messaging=messaging, providers=providers, workers=workers
        ),
    )
    return JSONResponse(body.model_dump(), status_code=200 if critical_ok else 503)


@router.get("/ready", response_class=PlainTextResponse)
async def ready() -> PlainTextResponse:
    return PlainTextResponse("OK")


@router.get("/metrics")
async def metrics(db: Db, hub: Metrics, pusher: Pusher) -> Response:
    # Push this replica's latest deltas first, so a scrape sees the requests just served here.
    await pusher.flush()
    # svc_event_total from the durable projection (exact across EventBus restarts: counts
    # the bus had not pushed yet when it died are not lost); the pushed counts without it.
    totals: dict[str, int] | None = None
    try:
        totals = await EventTypeCounts.read(db.pool)
    except Exception as exc:  # noqa: BLE001 - a scrape must not fail with the store down
        log.warning("event counts unavailable: %r", exc)
    try:
        body = await hub.render(totals)
    except Exception as exc:  # the Metrics actor restarting: a scrape to retry, not a 500
        log.warning("metrics unavailable: %r", exc)
        raise ServiceUnavailable("metrics are being restarted; scrape again") from exc
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/slo", response_model=wire.Slo)
async def slo(db: Db, hub: Metrics, pusher: Pusher, targets: Slo) -> dict[str, Any]:
    await pusher.flush()
    ratio: float | None = None
    try:
        ratio = await uptime_ratio(db.pool, now=time.time())
    except Exception as exc:  # noqa: BLE001 - without the store, uptime is unknown, not fatal
        log.warning("uptime unavailable: %r", exc)
    return await hub.slo(SloQuery(targets, ratio))


__all__ = ["router"]
