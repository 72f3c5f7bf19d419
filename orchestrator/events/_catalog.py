"""Every event type the store accepts (SPEC part 6), each with a versioned model of its `data`.

The payload shapes are ours (the spec shows only task.completed's): each type requires its
aggregate key and the few fields that define it, declares the rest as optional and typed, and
lets producers add fields of their own (`extra="allow"`). Models are strict, so a declared
field of the wrong JSON type is rejected rather than coerced ("5" is not an int).

The catalog is a table: one category base per aggregate key, two mixins (a failure carries an
`error`, a tool event a `tool`), and one `_declare` line per type that names its model class
and its type-specific fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
    create_model,
)
from pydantic_core import PydanticSerializationError

from orchestrator._json import dumps

__all__ = [
    "CATALOG",
    "EventData",
    "EventType",
    "InvalidEventData",
    "UnknownEventType",
    "Upcaster",
    "aggregate_of",
    "event_type",
    "stream_name",
    "upcast",
    "validate",
]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns `data` written at version v into `data` at version v + 1."""

# Aggregate ids become `aggregate_id` (a string) on the stored event.
AggregateId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
MemoryAgentId = Annotated[str, StringConstraints(min_length=1, max_length=128)]  # SPEC part 8
JobId = Annotated[int, Field(ge=0)]  # the scheduler API's job ids are integers
Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Count = Annotated[int, Field(ge=0)]
Millis = Annotated[int, Field(ge=0)]  # durations and Unix times, in milliseconds
Port = Annotated[int, Field(ge=1, le=65535)]

_TRUNCATE_AT = 80


def _opt(annotation: Any) -> Any:
    """An optional declared field: typed when present, `None` when absent."""
    return (annotation | None, None)


# ---------------------------------------------------------------------------------------------
# Errors


class UnknownEventType(ValueError):
    """The store has no event type of this name."""


class InvalidEventData(ValueError):
    """`data` does not match its event type's model; `fields` names the offending fields."""

    def __init__(self, type_name: str, problems: Sequence[tuple[str, str]]) -> None:
        self.type_name = type_name
        self.problems = tuple(problems)
        self.fields = tuple(dict.fromkeys(f for f, _ in self.problems))
        detail = "; ".join(f"{f}: {msg}" for f, msg in self.problems)
        super().__init__(f"invalid data for event type {type_name!r}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The default Exception pickling would call __init__ with the message alone.
        return (type(self), (self.type_name, self.problems))


def _shorten(text: str) -> str:
    # Names come from callers: never echo an arbitrarily long one back.
    return text if len(text) <= _TRUNCATE_AT else text[:_TRUNCATE_AT] + "..."


# ---------------------------------------------------------------------------------------------
# Registry primitives


@dataclass(frozen=True)
class EventType:
    """One event type: its name, current schema version, aggregate key and `data` model."""

    name: str
    version: int
    aggregate_key: str
    model: type[BaseModel]
    # Keyed by the version an upcaster reads; excluded from eq/hash because dicts are unhashable.
    upcasters: Mapping[int, Upcaster] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"{self.name}: version must be >= 1")
        if set(self.upcasters) != set(range(1, self.version)):
            raise ValueError(f"{self.name}: needs one upcaster per version 1..{self.version - 1}")
        if self.aggregate_key not in self.model.model_fields:
            raise ValueError(f"{self.name}: {self.aggregate_key!r} is not a field of its model")
        object.__setattr__(self, "upcasters", MappingProxyType(dict(self.upcasters)))

    @property
    def category(self) -> str:
        return self.name.partition(".")[0]


class EventData(BaseModel):
    """Base of every `data` model: declared fields are type-checked, extra ones kept."""

    model_config = ConfigDict(extra="allow", strict=True)


# ---------------------------------------------------------------------------------------------
# Category bases (one per aggregate key) and mixins


class TaskData(EventData):
    task_id: AggregateId


class ModelData(EventData):
    model_name: AggregateId
    provider: str | None = None
    port: Port | None = None


class WorkerData(EventData):
    worker_id: AggregateId


class WorkerTaskData(WorkerData):
    """A worker's task events are keyed by the task but still say which worker ran it."""

    task_id: AggregateId


class InferenceData(EventData):
    request_id: AggregateId
    model: str | None = None


class SchedulerData(EventData):
    job_id: JobId


class WorkflowData(EventData):
    workflow_id: AggregateId


class WorkflowStepData(WorkflowData):
    step: Name


class AgentData(TaskData):
    """An agent loop's events are keyed by the task the agent is running."""

    turn: Count | None = None


class UserData(EventData):
    user_uuid: AggregateId


class MemoryData(EventData):
    agent_id: MemoryAgentId
    key: str | None = None


class TeamData(EventData):
    team_id: AggregateId


class Failure(EventData):
    error: str


class ToolUse(EventData):
    tool: Name
    arguments: dict[str, JsonValue] | None = None


class Intervention(TaskData):
    """A person's decision a workflow step waits for (issue 32), keyed by the step attempt's
    task id: a tool call under an `ask` rule (`tool`, masked `arguments`) or an approval
    step. `decided_by`: `user:<uuid>` or `<platform>:<platform user id>`."""

    intervention_id: AggregateId
    workflow_id: AggregateId
    step: Name
    kind: Literal["tool", "approval"] | None = None
    tool: str | None = None
    decided_by: str | None = None
    via: str | None = None
    reason: str | None = None


# ---------------------------------------------------------------------------------------------
# The catalog


def _task_completed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 carried `duration` in seconds (float); v2 carries `duration_ms` (int)."""
    upgraded = dict(data)
    duration = upgraded.get("duration")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        if math.isfinite(duration):
            del upgraded["duration"]
            upgraded["duration_ms"] = round(duration * 1000)
    # Anything else is left in place for validation to report, never silently dropped.
    return upgraded


def _class_name(type_name: str) -> str:
    # "worker.task_started" -> "WorkerTaskStarted"
    return "".join(part.capitalize() for part in type_name.replace(".", "_").split("_"))


def _declare(
    name: str,
    aggregate_key: str,
    base: type[EventData] | tuple[type[EventData], ...],
    /,
    *,
    version: int = 1,
    upcasters: Mapping[int, Upcaster] | None = None,
    **fields: Any,
) -> EventType:
    model = create_model(
        _class_name(name),
        __base__=base,
        __module__=__name__,
        __doc__=f"`data` of a {name} event (version {version}).",
        **fields,
    )
    return EventType(name, version, aggregate_key, model, dict(upcasters or {}))


_TYPES: tuple[EventType, ...] = (
    # Task (task_id)
    _declare(
        "task.created",
        "task_id",
        TaskData,
        prompt=_opt(str),
        mode=_opt(str),
        model=_opt(str),
        user_uuid=_opt(str),
        workflow_id=_opt(str),
    ),
    _declare(
        "task.completed",
        "task_id",
        TaskData,
        version=2,
        upcasters={1: _task_completed_v1_to_v2},
        worker_id=(AggregateId, ...),
        status=(Name, ...),
        duration_ms=(Millis, ...),
    ),
    _declare("task.failed", "task_id", (TaskData, Failure), worker_id=_opt(str)),
    _declare("task.dispatched", "task_id", TaskData, worker_id=_opt(str), model=_opt(str)),
    # Model (model_name)
    _declare("model.started", "model_name", ModelData, pid=_opt(int)),
    _declare("model.stopped", "model_name", ModelData, reason=_opt(str)),
    _declare("model.failed", "model_name", (ModelData, Failure)),
    _declare("model.ready", "model_name", ModelData, ctx_size=_opt(Count), tools=_opt(bool)),
    _declare("model.discovered", "model_name", ModelData, path=_opt(str), size_bytes=_opt(Count)),
    _declare("model.prepared", "model_name", ModelData, path=_opt(str)),
    _declare("model.start_failed", "model_name", (ModelData, Failure)),
    # Worker (worker_id; task_id for worker.task_*)
    _declare("worker.spawned", "worker_id", WorkerData, pid=_opt(int), model=_opt(str)),
    _declare("worker.crashed", "worker_id", WorkerData, error=_opt(str), exit_code=_opt(int)),
    _declare("worker.ready", "worker_id", WorkerData, model=_opt(str)),
    _declare("worker.task_started", "task_id", WorkerTaskData),
    _declare(
        "worker.task_completed",
        "task_id",
        WorkerTaskData,
        status=_opt(str),
        duration_ms=_opt(Millis),
    ),
    _declare("worker.task_failed", "task_id", (WorkerTaskData, Failure)),
    # A try to start a worker failed; the next comes within `retry_within_ms`.
    _declare(
        "worker.spawn_failed",
        "worker_id",
        (WorkerData, Failure),
        attempt=_opt(Count),
        retry_within_ms=_opt(Millis),
    ),
    # Stopped on purpose (its generation drained: redeploy, scale change, shutdown).
    _declare(
        "worker.killed",
        "worker_id",
        WorkerData,
        reason=_opt(str),
        signal=_opt(int),
        running=_opt(Count),
        queued=_opt(Count),
    ),
    # Inference (request_id)
    _declare(
        "inference.request",
        "request_id",
        InferenceData,
        task_id=_opt(str),
        stream=_opt(bool),
        messages=_opt(Count),
        turn=_opt(Count),
    ),
    _declare(
        "inference.complete",
        "request_id",
        InferenceData,
        model=(Name, ...),
        tokens_in=_opt(Count),
        tokens_out=_opt(Count),
        duration_ms=_opt(Millis),
        finish_reason=_opt(str),
    ),
    _declare("inference.error", "request_id", (InferenceData, Failure), status_code=_opt(int)),
    _declare(
        "inference.interrupted",
        "request_id",
        InferenceData,
        reason=_opt(str),
        tokens_out=_opt(Count),
    ),
    # Scheduler (job_id)
    _declare(
        "scheduler.job_created",
        "job_id",
        SchedulerData,
        name=_opt(str),
        schedule_type=_opt(Literal["cron", "every", "at"]),
        next_run=_opt(Millis),
        user_uuid=_opt(str),
    ),
    _declare(
        "scheduler.job_executed",
        "job_id",
        SchedulerData,
        result=_opt(Literal["ok", "error", "timeout"]),
        error=_opt(str),
        task_id=_opt(str),
        duration_ms=_opt(Millis),
    ),
    _declare(
        "scheduler.task_dispatched", "job_id", SchedulerData, task_id=_opt(str), catchup=_opt(bool)
    ),
    # Workflow (workflow_id)
    _declare(
        "workflow.started",
        "workflow_id",
        WorkflowData,
        name=_opt(str),
        user_uuid=_opt(str),
        steps=_opt(list[str]),
    ),
    _declare(
        "workflow.completed",
        "workflow_id",
        WorkflowData,
        duration_ms=_opt(Millis),
        output=_opt(JsonValue),
    ),
    _declare("workflow.failed", "workflow_id", WorkflowData, step=_opt(str), error=_opt(str)),
    _declare("workflow.cancelled", "workflow_id", WorkflowData, reason=_opt(str)),
    _declare(
        "workflow.step_started",
        "workflow_id",
        WorkflowStepData,
        attempt=_opt(Count),
        lost_attempt=_opt(Count),
    ),
    _declare(
        "workflow.step_completed",
        "workflow_id",
        WorkflowStepData,
        duration_ms=_opt(Millis),
        output=_opt(JsonValue),
    ),
    _declare(
        "workflow.step_failed",
        "workflow_id",
        WorkflowStepData,
        error=_opt(str),
        attempt=_opt(Count),
    ),
    # A task step's attempt failed and the next is due at retry_at (issue 32): the step
    # stays running; only its last failure is a workflow.step_failed.
    _declare(
        "workflow.step_retrying",
        "workflow_id",
        WorkflowStepData,
        attempt=_opt(Count),
        error=_opt(str),
        next_attempt=_opt(Count),
        max_attempts=_opt(Count),
        delay_ms=_opt(Millis),
        retry_at=_opt(Millis),
    ),
    _declare(
        "workflow.compensating",
        "workflow_id",
        WorkflowData,
        step=_opt(str),
        reason=_opt(str),
        steps=_opt(list[str]),
    ),
    # Agent (task_id)
    _declare("agent.turn_started", "task_id", AgentData, model=_opt(str)),
    _declare(
        "agent.turn_completed",
        "task_id",
        AgentData,
        tokens_in=_opt(Count),
        tokens_out=_opt(Count),
        tool_calls=_opt(Count),
    ),
    _declare(
        "agent.context_overflow",
        "task_id",
        AgentData,
        tokens=_opt(Count),
        limit=_opt(Count),
        action=_opt(str),
    ),
    _declare(
        "agent.diagnostic",
        "task_id",
        AgentData,
        # malformed_arguments, unknown_tool, output_truncated, context_trimmed
        kind=_opt(str),
        detail=_opt(str),
        level=_opt(Literal["debug", "info", "warning", "error"]),
        tool=_opt(str),
    ),
    _declare("agent.loop_warning", "task_id", AgentData, tool=_opt(str), repeats=_opt(Count)),
    _declare(
        "agent.loop_detected",
        "task_id",
        AgentData,
        tool=_opt(str),
        repeats=_opt(Count),
        action=_opt(str),
    ),
    # Audit (task_id; user_uuid for permission_*; request_id for llm_decision; workflow_id for
    # workflow_override)
    _declare(
        "audit.tool_executed",
        "task_id",
        (TaskData, ToolUse),
        ok=_opt(bool),
        duration_ms=_opt(Millis),
        user_uuid=_opt(str),
    ),
    _declare("audit.tool_denied", "task_id", (TaskData, ToolUse), reason=_opt(str)),
    _declare(
        "audit.permission_grant",
        "user_uuid",
        UserData,
        admin=_opt(bool),
        permission=_opt(str),
        granted_by=_opt(str),
    ),
    _declare(
        "audit.permission_deny",
        "user_uuid",
        UserData,
        permission=_opt(str),
        reason=_opt(str),
        denied_by=_opt(str),
    ),
    _declare(
        "audit.llm_decision",
        "request_id",
        InferenceData,
        task_id=_opt(str),
        decision=_opt(str),
        rationale=_opt(str),
    ),
    _declare(
        "audit.intervention_pending",
        "task_id",
        Intervention,
        arguments=_opt(dict[str, JsonValue]),  # secrets masked
        question=_opt(str),
        deciders=_opt(list[str]),  # besides admins
        approvers=_opt(dict[str, JsonValue]),  # {channel_id, platform, ids}
        expires_at=_opt(Millis),
    ),
    _declare("audit.intervention_approved", "task_id", Intervention, note=_opt(str)),
    _declare("audit.intervention_rejected", "task_id", Intervention),
    _declare(
        "audit.workflow_override",
        "workflow_id",
        WorkflowData,
        step=_opt(str),
        action=_opt(str),  # retry, skip, resume, rerun
        user_uuid=_opt(str),
        reason=_opt(str),
    ),
    # Memory (agent_id)
    _declare("memory.stored", "agent_id", MemoryData, key=(Name, ...), ttl_ms=_opt(Millis)),
    _declare("memory.accessed", "agent_id", MemoryData, hit=_opt(bool)),
    _declare("memory.decayed", "agent_id", MemoryData, count=_opt(Count)),
    _declare("memory.reflected", "agent_id", MemoryData, count=_opt(Count), summary=_opt(str)),
    _declare(
        "memory.forgotten",
        "agent_id",
        MemoryData,
        keys=_opt(list[str]),
        count=_opt(Count),
        reason=_opt(Literal["deleted", "cleared", "decayed"]),
    ),
    # Team (team_id)
    _declare(
        "team.created",
        "team_id",
        TeamData,
        name=_opt(str),
        members=_opt(list[str]),
        created_by=_opt(str),
        workflow_id=_opt(str),  # a team belongs to a coordinate step (issue 33)
        step=_opt(str),
        max_members=_opt(Count),
    ),
    _declare(
        "team.member_joined",
        "team_id",
        TeamData,
        member=_opt(str),
        role=_opt(str),
        task_id=_opt(str),  # the member's own agent task
        tools=_opt(list[str]),
    ),
    _declare(
        "team.member_left",
        "team_id",
        TeamData,
        member=_opt(str),
        reason=_opt(str),
        why=_opt(Literal["dismissed", "finished", "failed", "stopped"]),
    ),
    _declare(
        "team.mail_sent",
        "team_id",
        TeamData,
        # "from" is a keyword in Python, not in the payload.
        sender=(str | None, Field(None, alias="from")),
        to=_opt(str | list[str]),
        subject=_opt(str),
        message_id=_opt(str),
        size=_opt(Count),  # bytes of the message; its text is never in an event
    ),
    _declare("team.destroyed", "team_id", TeamData, reason=_opt(str)),
)

CATALOG: Mapping[str, EventType] = MappingProxyType({t.name: t for t in _TYPES})
if len(CATALOG) != len(_TYPES):
    raise RuntimeError("duplicate event type in the catalog")

_CATEGORIES = ", ".join(dict.fromkeys(t.category for t in _TYPES))


# ---------------------------------------------------------------------------------------------
# Lookups


def event_type(name: str) -> EventType:
    try:
        return CATALOG[name]
    except (KeyError, TypeError):
        raise UnknownEventType(
            f"unknown event type {_shorten(str(name))!r}; categories: {_CATEGORIES}"
        ) from None


def validate(name: str, data: Mapping[str, Any]) -> tuple[EventType, dict[str, Any]]:
    """Check `data` against the current model of `name`; return it normalised to JSON types."""
    kind = event_type(name)
    if not isinstance(data, Mapping):
        raise InvalidEventData(kind.name, [("data", "must be an object")])
    try:
        # Strict models take only a dict, not any Mapping.
        parsed = kind.model.model_validate(dict(data))
        normalised = parsed.model_dump(mode="json", by_alias=True, exclude_none=False)
    except ValidationError as exc:
        problems = [
            (".".join(str(part) for part in err["loc"]) or "data", err["msg"])
            for err in exc.errors(include_url=False, include_input=False)
        ]
        raise InvalidEventData(kind.name, problems) from None
    except PydanticSerializationError as exc:
        # An extra field held something that has no JSON form.
        raise InvalidEventData(kind.name, [("data", str(exc))]) from None
    if b"\\u0000" in dumps(normalised):
        # Postgres text and jsonb cannot hold NUL: refuse it here, as bad input, rather than
        # fail the database write (and with it every append grouped into the same commit).
        raise InvalidEventData(kind.name, [("data", "strings must not contain NUL (\\u0000)")])
    return kind, normalised


def upcast(name: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
    """Bring `data` stored at `version` up to the current version of `name`.

    Unknown types and versions at or beyond the current one (written by a newer build) are
    returned unchanged: reading old or foreign events must never fail here.
    """
    kind = CATALOG.get(name)
    if kind is None or version < 1 or version >= kind.version:
        return data
    for from_version in range(version, kind.version):
        data = kind.upcasters[from_version](data)
    return data


def aggregate_of(event_type: EventType, data: Mapping[str, Any]) -> str:
    """The aggregate id of an event: its aggregate-key field, as a string."""
    value = data.get(event_type.aggregate_key)
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise InvalidEventData(
            event_type.name, [(event_type.aggregate_key, "aggregate id missing or empty")]
        )
    return str(value)


def stream_name(name: str) -> str:
    """The SSE event name: workflow types colon-style, every other type unchanged."""
    category, dot, rest = name.partition(".")
    if category != "workflow" or not dot:
        return name
    step, underscore, action = rest.partition("_")
    if step == "step" and underscore:
        return f"workflow:step:{action}"
    return f"workflow:{rest}"
