"""SPEC part 4, workflows: create (inline or from a template), list, detail, cancel, delete,
templates. Reads and writes go to Postgres from the replica; running and cancelling go to
the workflow's shard (the `WorkflowDriver`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from deployments.deps import (
    Catalog,
    Channels,
    Config,
    CurrentUser,
    Idempotent,
    Market,
    ModelGateway,
    Offset,
    WorkflowDriver,
    Workflows,
)
from orchestrator import wire
from orchestrator.agents import tools_refused
from orchestrator.auth import Principal
from orchestrator.channels import ChannelStore, ask_missing
from orchestrator.config import Settings
from orchestrator.errors import BadRequest, Forbidden, NotFound
from orchestrator.idempotency import Answer
from orchestrator.providers import Gateway
from orchestrator.tools import ToolCatalog
from orchestrator.workflows import (
    SpecLimits,
    WorkflowSpec,
    WorkflowState,
    fill_template,
    pin_skills,
    resolve_request,
    template_variables,
    tool_steps,
    tree_size,
)
from orchestrator.workflows._approval import notify_fields

router = APIRouter(tags=["workflows"])

WORKFLOW_ID = r"^wf-[0-9]{1,18}$"
NAME = r"^[A-Za-z0-9][A-Za-z0-9._:\- ]{0,127}$"


class StepIn(BaseModel):
    """A step as SPEC part 2 gives it; `type: spawn` and `compensate` are ours (docs/api)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="Step identifier, unique in the workflow")
    prompt: str | None = Field(None, description="Task prompt (normal steps)")
    mode: str | None = Field(
        None, description="build, plan, explore, review, general or coordinate"
    )
    tools: list[str] | None = Field(None, description="Restricted tool set")
    timeout: float | None = Field(None, description="Step timeout in seconds")
    condition: str | None = Field(None, description="Run only when this expression holds")
    type: str | None = Field(None, description="`branch` or `spawn`; omitted for a task step")
    conditions: dict[str, Any] | None = Field(
        None, description="Branch steps: name -> {match?, pattern?, then}"
    )
    workflows: list[dict[str, Any]] | None = Field(
        None, description="Spawn steps: child workflows, {name, steps} or {template, variables}"
    )
    compensate: str | dict[str, Any] | None = Field(
        None, description="Compensation: a prompt, or {notify: text}"
    )
    skills: list[str] | None = Field(
        None,
        description="Task steps: marketplace skills, `name`, `name@<version>` or"
        " `<author>/name[@<version>]`, pinned to a version when the workflow is created",
    )
    approvers: list[str] | None = Field(
        None, description="Approval steps: user ids who decide (default: the owner)"
    )
    approval_timeout_s: int | None = Field(
        None, description="Task and approval steps: seconds a question waits for a decision"
    )
    notify: dict[str, Any] | None = Field(
        None, description="Task and approval steps: {channel_id} questions are posted to"
    )


class WorkflowCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200, description="Inline: workflow name")
    steps: list[StepIn] | None = Field(None, description="Inline: the steps, in order")
    template: str | None = Field(None, max_length=128, description="A template's name")
    variables: dict[str, Any] | None = Field(None, description="Template variables")
    model: str | None = Field(None, max_length=256, description="Model for every step")
    notify: dict[str, Any] | None = Field(
        None, description="{channel_id}: where the workflow's questions to people are posted"
    )


class TemplateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME, description="Template name")
    steps: list[StepIn] = Field(min_length=1, description="Steps with {{var}} placeholders")
    shared: bool = Field(False, description="Admins only: visible to every user")


def _workflow_id(
    workflow_id: Annotated[str, Path(max_length=200, description="`wf-<number>`")],
) -> str:
    # An id that names nothing is a 404 whatever its shape (not a 400 quoting a pattern).
    if not re.fullmatch(WORKFLOW_ID, workflow_id):
        raise NotFound(f"workflow {workflow_id!r} not found")
    return workflow_id


WorkflowId = Annotated[str, Depends(_workflow_id)]
StatusQ = Annotated[WorkflowState | None, Query(description="Only workflows in this state")]
ParentQ = Annotated[
    str | None, Query(pattern=WORKFLOW_ID, description="Only children of this workflow")
]


async def _check_step_tools(
    spec: WorkflowSpec,
    settings: Settings,
    catalog: ToolCatalog,
    gateway: Gateway,
    user_uuid: str,
) -> None:
    """A step that names a tool the creator has none of (GET /tools), or names tools for a
    model whose server says it takes none, is a 400 now, not a failed step later (a model
    that nothing serves yet is judged when the step runs). Spawn steps' children too
    (resolved inline): the field names the child's step."""
    steps = tool_steps(spec, settings.default_model)
    names = (name for _, _, named in steps for name in named)
    unknown = set(await catalog.unknown(names, user_uuid))
    for where, _, named in steps:
        for k, name in enumerate(named):
            if name in unknown:
                at = f"{where}[{k}]"
                bad = {"field": at, "message": f"no tool {name!r} (GET /tools lists yours)"}
                raise BadRequest(f"{at}: {bad['message']}", extra={"fields": [bad]})
    asked: dict[str, bool | None] = {}  # one question per model, however many steps use it
    for where, model, _ in steps:
        if model is None:
            continue
        if model not in asked:
            asked[model] = await gateway.takes_tools(model)
        if asked[model] is False:
            # The shape of every other field-level 400 (orchestrator/workflows/_spec.py _bad).
            bad = {"field": where, "message": f"{model} takes no tools"}
            raise BadRequest(f"{where}: {tools_refused(model)}", extra={"fields": [bad]})


async def _check_notify(spec: WorkflowSpec, channels: ChannelStore, caller: Principal) -> None:
    """Every `notify` names a channel the creator can see that can post a question and lists
    `approvers` (issue 32): else a 400 naming the field, not a question posted nowhere or
    where nobody may answer it."""
    for where, channel_id in notify_fields(spec):
        try:
            channel = await channels.get(channel_id, caller)
        except NotFound:
            error = f"no channel {channel_id!r} (GET /channels)"
        else:
            settings = {k for k, v in channel.config.items() if v} | set(channel.secrets)
            missing = ask_missing(channel.type, settings)
            if not missing:
                continue
            error = (
                f"channel {channel_id} cannot ask for a decision: set its config."
                + ", config.".join(missing)
                + " first (approvers: the platform users who may decide)"
            )
        bad = {"field": where, "message": error}
        raise BadRequest(f"{where}: {error}", extra={"fields": [bad]})


def _created(workflow_id: str) -> wire.WorkflowCreated:
    return wire.WorkflowCreated(id=workflow_id, status="pending")


@router.post("/workflows", response_model=wire.WorkflowCreated)
async def create_workflow(
    body: WorkflowCreate,
    settings: Config,
    workflows: Workflows,
    marketplace: Market,
    catalog: Catalog,
    gateway: ModelGateway,
    workflow_runner: WorkflowDriver,
    caller: CurrentUser,
    once: Idempotent,
    channels: Channels,
) -> wire.WorkflowCreated | Response:
    """Inline (`name`, `steps`) or from a template (`template`, `variables`); starts at once.
    Past a limit of docs/security.md: 400, or 429 for the user's live workflows, naming it.
    With an `Idempotency-Key`, a retry answers the first creation again (200, same id)."""

    async def create(answer: Answer) -> wire.WorkflowCreated:
        given = body.model_dump(exclude_none=True)
        if "steps" in given:
            given["steps"] = [step.model_dump(exclude_none=True) for step in body.steps or []]
        limits = SpecLimits.from_settings(settings)
        spec = await resolve_request(workflows, given, caller.user_uuid, limits=limits)
        spec = await pin_skills(spec, marketplace)
        await _check_step_tools(spec, settings, catalog, gateway, caller.user_uuid)
        await _check_notify(spec, channels, caller)
        workflow_id = await workflows.create_within(
            spec,
            caller.user_uuid,
            starts=tree_size(spec),
            ceiling=settings.workflow_max_live_per_user,
            before_commit=answer.in_transaction(_created),
        )
        # Committed (and its answer with it): a start that fails here leaves it to the
        # shards' sweep, and a retry with the key gets this id.
        await workflow_runner.start(workflow_id)
        return _created(workflow_id)

    return await once.run(create)


@router.get("/workflows", response_model=wire.WorkflowPage)
async def list_workflows(
    settings: Config,
    workflows: Workflows,
    caller: CurrentUser,
    status: StatusQ = None,
    parent: ParentQ = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    offset: Offset = 0,
) -> wire.WorkflowPage:
    """The caller's workflows, newest first (admins: everyone's)."""
    limit = limit or settings.workflow_list_limit
    rows, total = await workflows.page(
        caller, status=str(status) if status else None, parent=parent, limit=limit, offset=offset
    )
    return wire.WorkflowPage(
        data=[wire.WorkflowSummary(**r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/workflows/templates", response_model=wire.WorkflowTemplates)
async def list_templates(workflows: Workflows, caller: CurrentUser) -> wire.WorkflowTemplates:
    """The caller's templates and the shared ones (admins: all)."""
    return wire.WorkflowTemplates(
        data=[wire.WorkflowTemplate(**t) for t in await workflows.list_templates(caller)]
    )


@router.post("/workflows/templates", response_model=wire.TemplateSaved)
async def save_template(
    body: TemplateIn, settings: Config, workflows: Workflows, caller: CurrentUser
) -> wire.TemplateSaved:
    """Store (or replace) a template; `{{var}}` placeholders are filled at creation."""
    if body.shared and not caller.is_admin:
        raise Forbidden("only admins publish shared templates")
    steps = [step.model_dump(exclude_none=True) for step in body.steps]
    # A template must make a valid workflow once its variables have values, within the
    # limits a workflow is created under (its children are counted when it is used).
    limits = SpecLimits.from_settings(settings)
    probe = {v: "x" for v in template_variables(steps)}
    filled = fill_template(steps, probe, max_chars=limits.max_chars)
    WorkflowSpec.parse(body.name, filled, where="", limits=limits)
    await workflows.save_template(body.name, steps, caller, shared=body.shared)
    return wire.TemplateSaved(name=body.name)


@router.get("/workflows/{workflow_id}", response_model=wire.Workflow)
async def get_workflow(
    workflow_id: WorkflowId, workflows: Workflows, caller: CurrentUser
) -> wire.Workflow:
    return wire.Workflow(**await workflows.detail(workflow_id, caller))


@router.post("/workflows/{workflow_id}/cancel", response_model=wire.WorkflowCancelled)
async def cancel_workflow(
    workflow_id: WorkflowId,
    workflows: Workflows,
    workflow_runner: WorkflowDriver,
    caller: CurrentUser,
) -> wire.WorkflowCancelled:
    """Cancel a pending or running workflow and its descendants; compensation runs first
    (409 when it has finished)."""
    await workflows.get(workflow_id, caller)  # 404 for another tenant's
    status = await workflow_runner.cancel(workflow_id)
    return wire.WorkflowCancelled(id=workflow_id, status=status)


@router.delete("/workflows/{workflow_id}", response_model=wire.WorkflowDeleted)
async def delete_workflow(
    workflow_id: WorkflowId, workflows: Workflows, caller: CurrentUser
) -> wire.WorkflowDeleted:
    """Remove a completed or cancelled workflow (and its descendants); 409 otherwise."""
    await workflows.delete(workflow_id, caller)
    return wire.WorkflowDeleted(id=workflow_id)
