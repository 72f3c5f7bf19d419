"""Agent teams (issue 33): GET /teams/{id}, a team with its members and its mail log. Its
owner and admins see it (anyone else: 404, decided in the store); the mail text is shown to
the owner only. Teams are made by the agents of coordinate steps (orchestrator/teams)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from deployments.deps import CurrentUser, TeamRecords
from orchestrator import wire

router = APIRouter(tags=["teams"])


@router.get("/teams/{team_id}", response_model=wire.Team)
async def get_team(
    team_id: Annotated[str, Path(max_length=200, description="`team-<n>`")],
    teams: TeamRecords,
    caller: CurrentUser,
) -> wire.Team:
    """The team, its members (role, state, tools, task id, times) and its mail log."""
    return wire.Team(**await teams.detail(team_id, caller))
