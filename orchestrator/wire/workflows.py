"""Workflows and templates (SPEC parts 2 and 4, workflows): what POST /workflows, the list,
the detail, cancel, delete and the templates answer."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orchestrator.wire._base import ApiModel, left_out_when_none

__all__ = [
    "StepAttempt",
    "TemplateSaved",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowCreated",
    "WorkflowDeleted",
    "WorkflowOverridden",
    "WorkflowPage",
    "WorkflowRerun",
    "WorkflowStep",
    "WorkflowSummary",
    "WorkflowTemplate",
    "WorkflowTemplates",
]


class WorkflowCreated(ApiModel):
    ok: bool = True
    id: str
    status: str


class StepAttempt(ApiModel):
    """One attempt of a step (issue 32): its task is `<workflow>:<step>:<attempt>`."""

    attempt: int
    started_at: int | None = Field(None, description="Unix ms")
    ended_at: int | None = Field(
        None, description="Unix ms; absent while it runs", exclude_if=left_out_when_none
    )
    error: str | None = Field(
        None, description="Why it failed (absent when it succeeded)", exclude_if=left_out_when_none
    )
    lost: bool | None = Field(
        None,
        description="True: its worker or driver stopped before it answered; it was not sent "
        "again, the next attempt was",
        exclude_if=left_out_when_none,
    )


class WorkflowStep(ApiModel):
    """A step as the detail shows it (SPEC part 2, Step output): the optional fields are sent
    only when they have a value."""

    name: str
    status: str
    result: str | None = Field(
        None, description="Present once the step has completed", exclude_if=left_out_when_none
    )
    error: str | None = Field(
        None,
        description="Why the step failed (or was cancelled)",
        exclude_if=left_out_when_none,
    )
    skills: list[dict[str, Any]] | None = Field(
        None,
        description="Its marketplace skills as pinned: {name, author, version, body}",
        exclude_if=left_out_when_none,
    )
    attempt: int | None = Field(
        None,
        description="Its current or last attempt (1, 2, ...); absent before it first ran",
        exclude_if=left_out_when_none,
    )
    attempts: list[StepAttempt] | None = Field(
        None,
        description="Every attempt of its latest run, oldest first (failed ones were retried)",
        exclude_if=left_out_when_none,
    )
    next_attempt_at: int | None = Field(
        None,
        description="Unix ms: an attempt failed and the next is due then (the step is running)",
        exclude_if=left_out_when_none,
    )
    intervention: dict[str, Any] | None = Field(
        None,
        description="The running step waits for a person: {id, kind, status, tool?}"
        " (GET /interventions/{id})",
        exclude_if=left_out_when_none,
    )
    team_id: str | None = Field(
        None,
        description="A coordinate step's agent team, once its run opened it (GET /teams/{id})",
        exclude_if=left_out_when_none,
    )


class Workflow(ApiModel):
    id: str
    name: str
    status: str
    steps: list[WorkflowStep]
    parent_id: str | None
    children: list[str]
    created_at: int = Field(description="Unix ms")
    updated_at: int = Field(description="Unix ms")
    error: str | None = Field(None, description="Why the workflow failed or was cancelled")
    rerun_of: str | None = Field(
        None,
        description="The workflow this one re-runs (POST /workflows/{id}/rerun)",
        exclude_if=left_out_when_none,
    )

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


class WorkflowSummary(ApiModel):
    id: str
    name: str
    status: str
    created_at: int
    updated_at: int
    parent_id: str | None


class WorkflowPage(ApiModel):
    ok: bool = True
    data: list[WorkflowSummary]
    total: int
    limit: int
    offset: int


class WorkflowCancelled(ApiModel):
    ok: bool = True
    id: str
    status: str


class WorkflowOverridden(ApiModel):
    """A retry, skip or resume done (issue 32): the workflow runs again from `step`."""

    ok: bool = True
    id: str
    status: str = Field(description="`running`: its driver goes on from the step")
    action: str = Field(description="retry, skip or resume")
    step: str = Field(description="The step acted on (resume: the one it stopped at)")


class WorkflowRerun(ApiModel):
    """A re-run created (issue 32): a new workflow `id`, linked to `rerun_of`."""

    ok: bool = True
    id: str
    status: str
    rerun_of: str
    from_step: str


class WorkflowDeleted(ApiModel):
    ok: bool = True
    id: str


class TemplateSaved(ApiModel):
    ok: bool = True
    name: str


class WorkflowTemplate(ApiModel):
    name: str
    steps: list[dict[str, Any]]
    variables: list[str]
    shared: bool
    owner: str | None
    created_at: int


class WorkflowTemplates(ApiModel):
    ok: bool = True
    data: list[WorkflowTemplate]
