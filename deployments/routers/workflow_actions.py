"""Acting on a workflow (issue 32): retry or skip a step, resume it, re-run it from a step.
The owner or an admin acts (another tenant's workflow is a 404); each action is one locked
transaction in Postgres with its `audit.workflow_override` (orchestrator/workflows/
_overrides.py), after which the workflow's shard is asked to drive it (its sweep would
take it up anyway). Apart from routers/workflows.py: the workflow's life, not its creation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import Config, CurrentUser, WorkflowDriver, Workflows
from deployments.routers.workflows import WorkflowId
from orchestrator import wire
from orchestrator.workflows import Override, WorkflowOverrides

router = APIRouter(tags=["workflows"])

# `{step:path}`: a step's name may hold `/` (and be `.` or `..`), which uvicorn hands over
# percent-decoded; the path convertor lets it span segments up to the `/retry` or `/skip`.
StepName = Annotated[str, Path(max_length=200, description="A step's name in the workflow")]


REASON = Field(
    None, max_length=2000, description="Why (kept in audit.workflow_override's `reason`)"
)


class OverrideIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = REASON


class RerunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_step: str = Field(
        max_length=200, description="The first step to run again; earlier steps keep results"
    )
    reason: str | None = REASON


def _done(outcome: Override) -> wire.WorkflowOverridden:
    return wire.WorkflowOverridden(
        id=outcome.workflow_id,
        status=outcome.status,
        action=outcome.action,
        step=outcome.step or "",
    )


@router.post(
    "/workflows/{workflow_id}/steps/{step:path}/retry", response_model=wire.WorkflowOverridden
)
async def retry_step(
    workflow_id: WorkflowId,
    step: StepName,
    settings: Config,
    workflows: Workflows,
    workflow_runner: WorkflowDriver,
    caller: CurrentUser,
    body: OverrideIn | None = None,
) -> wire.WorkflowOverridden:
    """A new attempt of the failed step of a failed workflow (it runs again from there) or
    of the running step of a running one (the attempt in flight is abandoned). 404: no such
    workflow (or step); 409: the step or workflow is in a state this does not apply to."""
    done = await WorkflowOverrides(workflows, settings).retry(
        workflow_id, step, caller, reason=body.reason if body else None
    )
    await workflow_runner.start(workflow_id)
    return _done(done)


@router.post(
    "/workflows/{workflow_id}/steps/{step:path}/skip", response_model=wire.WorkflowOverridden
)
async def skip_step(
    workflow_id: WorkflowId,
    step: StepName,
    settings: Config,
    workflows: Workflows,
    workflow_runner: WorkflowDriver,
    caller: CurrentUser,
    body: OverrideIn | None = None,
) -> wire.WorkflowOverridden:
    """The failed (or running) step becomes `skipped` and the next one starts."""
    done = await WorkflowOverrides(workflows, settings).skip(
        workflow_id, step, caller, reason=body.reason if body else None
    )
    await workflow_runner.start(workflow_id)
    return _done(done)


@router.post("/workflows/{workflow_id}/resume", response_model=wire.WorkflowOverridden)
async def resume_workflow(
    workflow_id: WorkflowId,
    settings: Config,
    workflows: Workflows,
    workflow_runner: WorkflowDriver,
    caller: CurrentUser,
    body: OverrideIn | None = None,
) -> wire.WorkflowOverridden:
    """A failed (or stuck running) workflow goes on from the step it stopped at, with a new
    attempt of it. 409 for a completed, cancelled, pending or compensating workflow."""
    done = await WorkflowOverrides(workflows, settings).resume(
        workflow_id, caller, reason=body.reason if body else None
    )
    await workflow_runner.start(workflow_id)
    return _done(done)


@router.post("/workflows/{workflow_id}/rerun", response_model=wire.WorkflowRerun)
async def rerun_workflow(
    workflow_id: WorkflowId,
    body: RerunIn,
    settings: Config,
    workflows: Workflows,
    workflow_runner: WorkflowDriver,
    caller: CurrentUser,
) -> wire.WorkflowRerun:
    """A new workflow (same spec and owner) whose steps before `from_step` keep the
    original's results and are not run again; it starts at once. 400 naming `from_step`
    when the workflow has no such step; 409 unless the original has finished."""
    done = await WorkflowOverrides(workflows, settings).rerun(
        workflow_id, body.from_step, caller, reason=body.reason
    )
    assert done.rerun_id is not None
    await workflow_runner.start(done.rerun_id)
    return wire.WorkflowRerun(
        id=done.rerun_id, status="pending", rerun_of=workflow_id, from_step=body.from_step
    )
