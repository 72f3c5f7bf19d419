"""The agent task of a workflow's task step (or of a step's compensation): its prompt and
context from the workflow as recorded, and the `task.created` event its step's start commits
with. Pure functions of the workflow record; the engine (_engine.py) runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from orchestrator.agents import AgentTask, TeamSeat, created_event
from orchestrator.config import Settings
from orchestrator.events import NewEvent
from orchestrator.workflows._records import WorkflowRecord
from orchestrator.workflows._spec import StepSpec, fill_refs
from orchestrator.workflows._states import StepState

__all__ = ["Announcer", "announcer", "chainable", "pinned_skills", "step_task"]

# A step start's extra events, given its attempt's key.
Announcer = Callable[[str], list[NewEvent]]


def step_task(record: WorkflowRecord, spec: StepSpec, task_id: str, prompt: str) -> AgentTask:
    """The agent task running `prompt` for step `spec`: the creator's user, the step's or
    the workflow's model; context: the original prompt (the first step's) and every earlier
    completed result; the skills pinned for the step. It can wait for a person (a call
    under an `ask` rule parks it: issue 32), asking in the step's or the workflow's `notify`
    channel; a compensation's task is made to not wait (`replace(..., can_wait=False)`)."""
    context: list[tuple[str, str]] = []
    first = record.spec.steps[0]
    if spec is not first and first.prompt:
        context.append(("Original prompt", fill_refs(first.prompt, record.lookup)))
    for s in record.steps:
        if s.status == StepState.COMPLETED and s.result is not None and s.name != spec.name:
            context.append((f"Result of step {s.name}", s.result))
    return AgentTask(
        task_id=task_id,
        user_uuid=record.user_uuid,
        prompt=fill_refs(prompt, record.lookup),
        context=tuple(context),
        mode=spec.mode,
        tools=spec.tools,
        timeout_s=spec.timeout,
        model=spec.model or record.spec.model,
        workflow_id=record.id,
        step=spec.name,
        idempotency_key=task_id,
        skills=pinned_skills(spec),
        can_wait=True,
        notify_channel=spec.notify or record.spec.notify,
        approval_timeout_s=spec.approval_timeout_s,
        # A coordinate step with `team` (issue 33): its run opens the step's team.
        team=TeamSeat(max_members=spec.team) if spec.team is not None else None,
    )


def pinned_skills(spec: StepSpec) -> tuple[tuple[str, str], ...]:
    """`(label, body)` of the step's skills, as pinned when the workflow was created. A
    reference left unpinned (a workflow not created through the API) has no body to give."""
    return tuple(
        (f"{s['name']} v{s['version']} by {s['author']}", s["body"])
        for s in spec.skills
        if isinstance(s, dict)
    )


def announcer(
    record: WorkflowRecord, spec: StepSpec, tasks: list[AgentTask], settings: Settings
) -> Announcer:
    """The events a task step's start commits with: its task's task.created (the task is
    appended to `tasks`, for the caller to dispatch once that commit is done)."""
    assert spec.prompt is not None
    prompt = spec.prompt

    def created(key: str) -> list[NewEvent]:
        task = replace(step_task(record, spec, key, prompt), announced=True)
        tasks.append(task)
        return [created_event(task, settings)]

    return created


def chainable(
    record: WorkflowRecord, tasks: list[AgentTask], settings: Settings, *, draining: bool
) -> tuple[int, Announcer] | None:
    """The next step, when it is a plain task step that may start in the transaction
    recording the previous one's result (no condition, no budget or drain to look at
    first); None leaves it to the drive loop."""
    idx = record.cursor
    if (
        draining
        or record.ending is not None
        or idx >= len(record.steps)
        or record.executed >= settings.workflow_max_steps
    ):
        return None
    spec = record.spec.steps[idx]
    if (
        spec.type in ("branch", "spawn", "approval")
        or spec.condition is not None
        or record.steps[idx].status != StepState.PENDING
    ):
        return None
    return idx, announcer(record, spec, tasks, settings)
