"""One router per part of the spec."""

from fastapi import APIRouter

from deployments.routers import (
    channels,
    embeddings,
    events,
    gateway,
    inference,
    marketplace,
    memory,
    operations,
    scheduler,
    tokens,
    workflows,
    workspace,
)

ROUTERS: tuple[APIRouter, ...] = (
    operations.router,
    tokens.router,
    workflows.router,
    inference.router,
    gateway.router,
    embeddings.router,
    events.router,
    scheduler.router,
    channels.router,
    marketplace.router,
    memory.router,
    workspace.router,
)

__all__ = ["ROUTERS"]
