"""One router per part of the spec."""

from fastapi import APIRouter

from deployments.routers import (
    channels,
    embeddings,
    events,
    gateway,
    inference,
    interventions,
    marketplace,
    memory,
    operations,
    responses,
    scheduler,
    teams,
    tokens,
    tools,
    workflow_actions,
    workflows,
    workspace,
)

# Hot paths first: a request's route is found by trying the routes in this order, by
# FastAPI and, on every request, by Serve (the route label of its metrics): the gateway's
# call was 25 us of Serve's matching behind four routers, 3 us in front. No two routers
# serve the same path, so the order changes nothing else. The model endpoints are before
# all of these, on the app's own router (gateway.py `add_model_routes`).
ROUTERS: tuple[APIRouter, ...] = (
    gateway.router,
    memory.router,
    events.router,
    workflows.router,
    workflow_actions.router,
    interventions.router,
    teams.router,
    operations.router,
    embeddings.router,
    inference.router,
    tokens.router,
    scheduler.router,
    channels.router,
    marketplace.router,
    tools.router,
    workspace.router,
    responses.router,
)

__all__ = ["ROUTERS"]
