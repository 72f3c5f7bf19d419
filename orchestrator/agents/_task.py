"""What an agent task is, what it returns, and who runs it (the dispatcher protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from orchestrator.config import Settings
from orchestrator.events import NewEvent

MODES: dict[str, str] = {
    "general": (
        "You are a capable assistant agent. Answer the task directly and completely. Use a "
        "tool only when it gives you something you cannot know otherwise."
    ),
    "build": (
        "You are a builder agent. Produce the requested artifact (code, text, configuration) "
        "in full, ready to use. Use the workspace tools to read and write files when given."
    ),
    "plan": (
        "You are a planning agent. Break the task into a short, ordered list of concrete "
        "steps with what each needs and produces. Do not carry the steps out."
    ),
    "explore": (
        "You are an exploring agent. Investigate: gather facts with the tools you have, "
        "compare options, and report what you found with the evidence."
    ),
    "review": (
        "You are a reviewing agent. Check the work in the context against the task: list "
        "the defects found, most serious first, and say whether it is acceptable."
    ),
    "coordinate": (
        "You are a coordinating agent. Combine the results of the earlier steps into one "
        "consistent outcome, resolving conflicts between them, and say what remains open."
    ),
}
"""System prompt per mode (SPEC part 2, step `mode`)."""

# "waiting": the task stopped at a tool call that needs a person's approval and holds
# nothing meanwhile (issue 32: its intervention, `TaskResult.intervention_id`, resumes it).
TaskStatus = Literal["completed", "failed", "timeout", "waiting"]


COORDINATOR = "coordinator"


@dataclass(frozen=True, slots=True)
class TeamSeat:
    """A task's place in an agent team (issue 33, orchestrator/teams): the coordinator of a
    `coordinate` step with `team` (its run opens the team, keyed by the workflow and step:
    `team_id` None) or a member (`member` its name in team `team_id`)."""

    member: str = COORDINATOR
    max_members: int = 4
    team_id: str | None = None

    @property
    def coordinates(self) -> bool:
        return self.member == COORDINATOR


@dataclass(frozen=True, slots=True)
class AgentTask:
    """One unit of agent work. `user_uuid` is the creator's: every event, tool call and
    file the task touches is theirs."""

    task_id: str
    user_uuid: str
    prompt: str
    context: tuple[tuple[str, str], ...] = ()  # (label, text): original prompt, step results
    mode: str = "general"
    tools: tuple[str, ...] | None = None  # None: every registered tool; (): none
    timeout_s: float | None = None  # None: settings.agent_task_timeout_s
    model: str | None = None  # None: settings.default_model
    workflow_id: str | None = None
    step: str | None = None
    idempotency_key: str | None = None  # a workflow step attempt: "<wf>:<step>:<attempt>"
    announced: bool = False  # task.created already recorded (with the step's start)
    # Marketplace skills pinned when the workflow was created: (label, body), given to the
    # agent as instructions after its mode's.
    skills: tuple[tuple[str, str], ...] = ()
    # Interventions (issue 32). `can_wait`: a call under an `ask` rule may wait for a
    # person (a workflow task step only; any other task refuses it as a deny).
    can_wait: bool = False
    notify_channel: str | None = None  # the channel the question is posted to (`notify`)
    approval_timeout_s: int | None = None  # None: settings.intervention_timeout_s
    resume: str | None = None  # the decided intervention this run continues
    team: TeamSeat | None = None  # in an agent team (issue 33): its team tools


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    status: TaskStatus
    result: str | None
    error: str | None
    duration_ms: int
    worker_id: str
    turns: int = 0
    intervention_id: str | None = None  # status "waiting": what it waits for

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class TaskDispatcher(Protocol):
    """Runs a task somewhere (in process, or on the AgentWorker pool) and returns how it
    ended. Never raises for the task's own failure: that is a failed/timeout result."""

    async def run(self, task: AgentTask) -> TaskResult: ...


def created_event(task: AgentTask, settings: Settings) -> NewEvent:
    return NewEvent(
        "task.created",
        task_payload(
            task,
            "task.created",
            {
                "prompt": task.prompt[:2000],
                "mode": task.mode,
                "model": task.model or settings.default_model,
                "user_uuid": task.user_uuid,
            },
        ),
        task.user_uuid,
    )


def task_payload(task: AgentTask, type_: str, data: dict[str, Any]) -> dict[str, Any]:
    payload = {"task_id": task.task_id, **{k: v for k, v in data.items() if v is not None}}
    if task.workflow_id and type_.startswith(("task.", "worker.task_")):
        payload.setdefault("workflow_id", task.workflow_id)
        if task.step:
            payload.setdefault("step", task.step)
    return payload


def tools_refused(model: str) -> str:
    """Why a step that names tools cannot run on `model` (its server takes none)."""
    return (
        f"model {model!r} takes no tools (its server says so): name no tools for its "
        "steps, or serve it with a server and chat template that take tools"
    )
