"""Interventions (issue 32): the decisions workflow steps wait for. List and read them (the
caller's as owner or decider; admins every one), approve or reject one, once. Rules and
storage live in `orchestrator.interventions`. After a decision the channel desk settles it
as it does a channel press (`InterventionDesk.settled`): the poster of the question's
channel is woken, so its message shows the outcome at once rather than at the poster's next
poll, and a workflow the decision released starts again on its shard (the shards' sweep
would otherwise, within a period)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from deployments.deps import ChannelDesk, Config, CurrentUser, Interventions, Offset
from orchestrator import wire
from orchestrator.errors import NotFound
from orchestrator.interventions import ID_PATTERN, MAX_TEXT, Decider, Intervention

router = APIRouter(tags=["interventions"])


class ApproveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str | None = Field(None, max_length=MAX_TEXT, description="Why, for the record")


class RejectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TEXT)
    ] = Field(description="Why: the agent (or the workflow's error) is told")


def _intervention_id(
    intervention_id: Annotated[str, Path(max_length=200, description="`iv-<number>`")],
) -> str:
    # An id that names nothing is a 404 whatever its shape (not a 400 quoting a pattern).
    if not ID_PATTERN.fullmatch(intervention_id):
        raise NotFound(f"intervention {intervention_id!r} not found")
    return intervention_id


InterventionId = Annotated[str, Depends(_intervention_id)]
StatusQ = Annotated[
    Literal["pending", "approved", "rejected", "expired"] | None,
    Query(description="Only interventions in this state"),
]
WorkflowQ = Annotated[
    str | None,
    Query(pattern=r"^wf-[0-9]{1,18}$", description="Only this workflow's interventions"),
]


def _wire(iv: Intervention) -> wire.Intervention:
    return wire.Intervention(**iv.wire())


@router.get("/interventions", response_model=wire.InterventionPage)
async def list_interventions(
    settings: Config,
    interventions: Interventions,
    caller: CurrentUser,
    status: StatusQ = None,
    workflow_id: WorkflowQ = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    offset: Offset = 0,
) -> wire.InterventionPage:
    """The caller's interventions (of their workflows, or theirs to decide), newest first;
    admins: everyone's."""
    limit = limit or settings.workflow_list_limit
    found, total = await interventions.page(
        caller, status=status, workflow_id=workflow_id, limit=limit, offset=offset
    )
    return wire.InterventionPage(
        data=[_wire(iv) for iv in found], total=total, limit=limit, offset=offset
    )


@router.get("/interventions/{intervention_id}", response_model=wire.Intervention)
async def get_intervention(
    intervention_id: InterventionId, interventions: Interventions, caller: CurrentUser
) -> wire.Intervention:
    return _wire(await interventions.get(intervention_id, caller))


@router.post("/interventions/{intervention_id}/approve", response_model=wire.InterventionDecided)
async def approve_intervention(
    intervention_id: InterventionId,
    interventions: Interventions,
    desk: ChannelDesk,
    caller: CurrentUser,
    body: ApproveBody | None = None,
) -> wire.InterventionDecided:
    """The call runs (or the approval step completes) and the workflow goes on. 409 once
    decided or expired; 403 for one you see but may not decide."""
    decided = await interventions.decide(
        intervention_id, Decider.of(caller), approve=True, note=body.note if body else None
    )
    # Committed whatever happens next: a failed wake or start is left to the poster's
    # poll and the sweep, not answered as a failure (a client's retry would be a 409).
    await desk.settled(decided)
    return wire.InterventionDecided(id=intervention_id, status="approved")


@router.post("/interventions/{intervention_id}/reject", response_model=wire.InterventionDecided)
async def reject_intervention(
    intervention_id: InterventionId,
    body: RejectBody,
    interventions: Interventions,
    desk: ChannelDesk,
    caller: CurrentUser,
) -> wire.InterventionDecided:
    """The agent is told the call was refused, with `reason` (an approval step fails, and
    compensation runs). 409 once decided or expired."""
    decided = await interventions.decide(
        intervention_id, Decider.of(caller), approve=False, reason=body.reason
    )
    # Committed whatever happens next: a failed wake or start is left to the poster's
    # poll and the sweep, not answered as a failure (a client's retry would be a 409).
    await desk.settled(decided)
    return wire.InterventionDecided(id=intervention_id, status="rejected")
