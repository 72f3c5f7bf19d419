"""Workflow and step state machines (SPEC part 3): declared transition tables, checked in
one function. Compensation is a phase of `running` (the `ending` column says whether the
workflow will end failed or cancelled); the workflow enters failed or cancelled only once
every compensation has run."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from orchestrator.errors import Conflict


class WorkflowState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


W, S = WorkflowState, StepState

WORKFLOW_TRANSITIONS: dict[WorkflowState, frozenset[WorkflowState]] = {
    W.PENDING: frozenset({W.RUNNING, W.CANCELLED}),  # started; cancelled before it ran
    W.RUNNING: frozenset({W.COMPLETED, W.FAILED, W.CANCELLED}),
    W.COMPLETED: frozenset(),
    W.FAILED: frozenset(),
    W.CANCELLED: frozenset(),
}

STEP_TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    S.PENDING: frozenset({S.RUNNING, S.SKIPPED}),  # runs; condition false or jumped over
    # Re-dispatched after a crash (a new attempt); ends; skipped when the workflow is
    # cancelled while it runs.
    S.RUNNING: frozenset({S.RUNNING, S.COMPLETED, S.FAILED, S.SKIPPED}),
    # A branch jumping back to an earlier step runs it (and those after it) again.
    S.COMPLETED: frozenset({S.PENDING}),
    S.FAILED: frozenset(),
    S.SKIPPED: frozenset({S.PENDING}),
}

FINISHED = frozenset({W.COMPLETED, W.FAILED, W.CANCELLED})
DELETABLE = frozenset({W.COMPLETED, W.CANCELLED})


def check_transition(
    kind: Literal["workflow", "step"], current: str, target: str, what: str = ""
) -> None:
    """Raise Conflict unless `current -> target` is in the declared table."""
    table: dict[str, frozenset[str]]
    table = WORKFLOW_TRANSITIONS if kind == "workflow" else STEP_TRANSITIONS  # type: ignore[assignment]
    if current not in table:
        raise Conflict(f"{what or kind} is in an unknown state {current!r}")
    if target not in table[current]:
        raise Conflict(
            f"{what or kind} cannot go from {current} to {target}", extra={"status": current}
        )
