"""The event catalog: every SPEC part 6 type, its `data` model, aggregate key and versions."""

from __future__ import annotations

import pickle
from collections import defaultdict
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.events._catalog import (
    CATALOG,
    EventType,
    InvalidEventData,
    UnknownEventType,
    aggregate_of,
    event_type,
    stream_name,
    upcast,
    validate,
)

SPEC_TYPES: dict[str, set[str]] = {
    "task": {"task.created", "task.completed", "task.failed", "task.dispatched"},
    "model": {
        "model.started",
        "model.stopped",
        "model.failed",
        "model.ready",
        "model.discovered",
        "model.prepared",
        "model.start_failed",
    },
    "worker": {
        "worker.spawned",
        "worker.crashed",
        "worker.ready",
        "worker.task_started",
        "worker.task_completed",
        "worker.task_failed",
        "worker.spawn_failed",
        "worker.killed",
    },
    "inference": {
        "inference.request",
        "inference.complete",
        "inference.error",
        "inference.interrupted",
    },
    "scheduler": {
        "scheduler.job_created",
        "scheduler.job_executed",
        "scheduler.task_dispatched",
    },
    "workflow": {
        "workflow.started",
        "workflow.completed",
        "workflow.failed",
        "workflow.step_started",
        "workflow.cancelled",  # the fifth type the spec does not list (DESIGN.md)
        "workflow.step_completed",
        "workflow.step_failed",
        "workflow.step_retrying",  # a failed attempt retried (issue 32)
        "workflow.compensating",
    },
    "agent": {
        "agent.turn_started",
        "agent.turn_completed",
        "agent.context_overflow",
        "agent.diagnostic",
        "agent.loop_warning",
        "agent.loop_detected",
    },
    "audit": {
        "audit.tool_executed",
        "audit.tool_denied",
        "audit.permission_grant",
        "audit.permission_deny",
        "audit.llm_decision",
        "audit.intervention_pending",
        "audit.intervention_approved",
        "audit.intervention_rejected",
        "audit.workflow_override",
    },
    "memory": {
        "memory.stored",
        "memory.accessed",
        "memory.decayed",
        "memory.reflected",
        "memory.forgotten",
    },
    "team": {
        "team.created",
        "team.member_joined",
        "team.member_left",
        "team.mail_sent",
        "team.destroyed",
    },
}

CATEGORY_KEY = {
    "task": "task_id",
    "model": "model_name",
    "worker": "worker_id",
    "inference": "request_id",
    "scheduler": "job_id",
    "workflow": "workflow_id",
    "agent": "task_id",
    "audit": "task_id",
    "memory": "agent_id",
    "team": "team_id",
}
KEY_EXCEPTIONS = {
    "worker.task_started": "task_id",
    "worker.task_completed": "task_id",
    "worker.task_failed": "task_id",
    "audit.permission_grant": "user_uuid",
    "audit.permission_deny": "user_uuid",
    "audit.llm_decision": "request_id",
    "audit.workflow_override": "workflow_id",
}

# One sample value per required field name used anywhere in the catalog.
SAMPLES: dict[str, Any] = {
    "task_id": "task-1",
    "model_name": "llama-3-8b",
    "worker_id": "worker-1",
    "request_id": "req-1",
    "job_id": 7,
    "workflow_id": "wf-1",
    "user_uuid": "user-1",
    "agent_id": "agent-1",
    "team_id": "team-1",
    "status": "ok",
    "duration_ms": 1500,
    "error": "boom",
    "tool": "shell",
    "step": "fetch",
    "model": "llama-3-8b",
    "key": "notes",
    "intervention_id": "iv-1",
}

COMPLETED = {"task_id": "t-1", "worker_id": "w-1", "status": "ok", "duration_ms": 1500}


def minimal_data(kind: EventType) -> dict[str, Any]:
    return {n: SAMPLES[n] for n, f in kind.model.model_fields.items() if f.is_required()}


def test_every_spec_category_holds_exactly_its_types() -> None:
    by_category: dict[str, set[str]] = defaultdict(set)
    for name in CATALOG:
        by_category[name.partition(".")[0]].add(name)
    assert dict(by_category) == SPEC_TYPES


def test_workflow_category_has_the_fifth_type_and_the_extras() -> None:
    workflow = {n for n in CATALOG if n.startswith("workflow.")}
    spec_listed = {"workflow.started", "workflow.completed", "workflow.failed"}
    assert spec_listed | {"workflow.step_started", "workflow.cancelled"} <= workflow
    assert {"workflow.step_completed", "workflow.step_failed", "workflow.compensating"} <= workflow


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_each_type_has_its_aggregate_key_and_a_named_model(name: str) -> None:
    kind = event_type(name)
    assert kind is CATALOG[name]
    assert kind.name == name
    assert kind.aggregate_key == KEY_EXCEPTIONS.get(name, CATEGORY_KEY[kind.category])
    assert issubclass(kind.model, BaseModel)
    assert kind.model.__name__ == "".join(p.capitalize() for p in name.replace(".", "_").split("_"))
    assert kind.model.model_fields[kind.aggregate_key].is_required()


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_each_type_accepts_its_required_fields_and_rejects_a_missing_aggregate_key(
    name: str,
) -> None:
    kind = event_type(name)
    data = minimal_data(kind)
    got, normalised = validate(name, data)
    assert got is kind
    assert aggregate_of(kind, normalised) == str(SAMPLES[kind.aggregate_key])
    del data[kind.aggregate_key]
    with pytest.raises(InvalidEventData) as caught:
        validate(name, data)
    assert kind.aggregate_key in caught.value.fields


def test_task_completed_is_version_2_with_its_four_fields() -> None:
    kind, data = validate("task.completed", COMPLETED)
    assert kind.version == 2
    assert data == COMPLETED


@pytest.mark.parametrize("missing", sorted(COMPLETED))
def test_task_completed_rejects_a_missing_field(missing: str) -> None:
    data = {k: v for k, v in COMPLETED.items() if k != missing}
    with pytest.raises(InvalidEventData) as caught:
        validate("task.completed", data)
    assert caught.value.fields == (missing,)
    assert "task.completed" in str(caught.value)
    assert missing in str(caught.value)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"duration_ms": "1500"}, "duration_ms"),  # strict: no string-to-int coercion
        ({"duration_ms": -1}, "duration_ms"),
        ({"duration_ms": True}, "duration_ms"),
        ({"worker_id": 5}, "worker_id"),
        ({"task_id": ""}, "task_id"),
        ({"task_id": "x" * 257}, "task_id"),
    ],
)
def test_invalid_data_names_the_type_and_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidEventData) as caught:
        validate("task.completed", {**COMPLETED, **bad})
    assert caught.value.fields == (field,)
    assert caught.value.type_name == "task.completed"
    message = str(caught.value)
    assert "task.completed" in message and field in message
    assert "x" * 257 not in message  # the bad input is not echoed back


def test_data_that_is_not_an_object_is_invalid() -> None:
    with pytest.raises(InvalidEventData, match="data"):
        validate("task.created", ["task-1"])  # type: ignore[arg-type]


def test_extra_fields_are_kept_and_optional_ones_normalised_to_null() -> None:
    _, data = validate("task.created", {"task_id": "t-1", "prompt": "hi", "trace": {"a": [1]}})
    assert data == {
        "task_id": "t-1",
        "prompt": "hi",
        "mode": None,
        "model": None,
        "user_uuid": None,
        "workflow_id": None,
        "trace": {"a": [1]},
    }


def test_declared_optional_fields_are_type_checked() -> None:
    with pytest.raises(InvalidEventData) as caught:
        validate("inference.complete", {"request_id": "r", "model": "m", "tokens_in": "ten"})
    assert caught.value.fields == ("tokens_in",)
    with pytest.raises(InvalidEventData) as caught:
        validate("scheduler.job_executed", {"job_id": 7, "result": "maybe"})
    assert caught.value.fields == ("result",)


def test_an_extra_field_without_a_json_form_is_invalid() -> None:
    with pytest.raises(InvalidEventData):
        validate("task.created", {"task_id": "t-1", "handle": object()})


def test_team_mail_keeps_the_from_key() -> None:
    _, data = validate("team.mail_sent", {"team_id": "t", "from": "ada", "to": ["bob", "eve"]})
    assert data["from"] == "ada"
    assert data["to"] == ["bob", "eve"]
    assert "sender" not in data


def test_an_unknown_type_is_rejected_with_the_categories() -> None:
    with pytest.raises(UnknownEventType) as caught:
        validate("task.exploded", {"task_id": "t"})
    message = str(caught.value)
    assert "task.exploded" in message
    assert all(category in message for category in SPEC_TYPES)
    with pytest.raises(UnknownEventType) as caught:
        event_type("x" * 10_000)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("task.completed", COMPLETED, "t-1"),
        ("model.ready", {"model_name": "qwen"}, "qwen"),
        ("worker.spawned", {"worker_id": "w-9"}, "w-9"),
        ("worker.task_started", {"worker_id": "w-9", "task_id": "t-9"}, "t-9"),
        ("worker.task_failed", {"worker_id": "w-9", "task_id": "t-9", "error": "x"}, "t-9"),
        ("inference.request", {"request_id": "r-1"}, "r-1"),
        ("scheduler.job_executed", {"job_id": 7}, "7"),
        ("workflow.step_started", {"workflow_id": "wf-1", "step": "a"}, "wf-1"),
        ("agent.loop_detected", {"task_id": "t-2"}, "t-2"),
        ("audit.tool_executed", {"task_id": "t-3", "tool": "shell"}, "t-3"),
        ("audit.permission_grant", {"user_uuid": "u-1", "admin": True}, "u-1"),
        ("audit.permission_deny", {"user_uuid": "u-2"}, "u-2"),
        ("audit.llm_decision", {"request_id": "r-2"}, "r-2"),
        ("audit.workflow_override", {"workflow_id": "wf-2"}, "wf-2"),
        ("memory.stored", {"agent_id": "default", "key": "k"}, "default"),
        ("team.created", {"team_id": "team-a"}, "team-a"),
    ],
)
def test_aggregate_of_reads_the_categorys_key(
    name: str, data: dict[str, Any], expected: str
) -> None:
    kind, normalised = validate(name, data)
    assert aggregate_of(kind, normalised) == expected


def test_scheduler_job_id_stays_an_integer() -> None:
    kind, data = validate("scheduler.job_created", {"job_id": 7, "schedule_type": "cron"})
    assert data["job_id"] == 7 and isinstance(data["job_id"], int)
    assert aggregate_of(kind, data) == "7"
    for bad in ("7", True, 7.0):
        with pytest.raises(InvalidEventData):
            validate("scheduler.job_created", {"job_id": bad})


def test_worker_task_types_still_require_the_worker() -> None:
    with pytest.raises(InvalidEventData) as caught:
        validate("worker.task_started", {"task_id": "t-1"})
    assert caught.value.fields == ("worker_id",)


def test_memory_agent_id_is_capped_at_128() -> None:
    validate("memory.accessed", {"agent_id": "a" * 128})
    with pytest.raises(InvalidEventData):
        validate("memory.accessed", {"agent_id": "a" * 129})


@pytest.mark.parametrize("data", [{}, {"task_id": ""}, {"task_id": None}, {"task_id": {}}])
def test_aggregate_of_rejects_a_missing_or_empty_id(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidEventData) as caught:
        aggregate_of(event_type("task.created"), data)
    assert caught.value.fields == ("task_id",)


def test_upcast_task_completed_from_v1_to_v2() -> None:
    v1 = {"task_id": "t-1", "worker_id": "w-1", "status": "ok", "duration": 1.5}
    v2 = upcast("task.completed", 1, v1)
    assert v2 == {"task_id": "t-1", "worker_id": "w-1", "status": "ok", "duration_ms": 1500}
    assert v1["duration"] == 1.5  # the stored data is not mutated
    _, validated = validate("task.completed", v2)
    assert validated == v2


def test_upcast_leaves_current_newer_and_unknown_data_alone() -> None:
    assert upcast("task.completed", 2, COMPLETED) is COMPLETED
    assert upcast("task.completed", 3, {"future": True}) == {"future": True}
    assert upcast("task.retired", 1, {"a": 1}) == {"a": 1}
    assert upcast("task.created", 1, {"task_id": "t"}) == {"task_id": "t"}


def test_upcast_keeps_a_v1_duration_it_cannot_convert() -> None:
    v1 = {"task_id": "t", "worker_id": "w", "status": "ok", "duration": "slow"}
    assert upcast("task.completed", 1, v1) == v1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("workflow.started", "workflow:started"),
        ("workflow.completed", "workflow:completed"),
        ("workflow.failed", "workflow:failed"),
        ("workflow.cancelled", "workflow:cancelled"),
        ("workflow.compensating", "workflow:compensating"),
        ("workflow.step_started", "workflow:step:started"),
        ("workflow.step_completed", "workflow:step:completed"),
        ("workflow.step_failed", "workflow:step:failed"),
        ("workflow.step_retrying", "workflow:step:retrying"),
        ("task.completed", "task.completed"),
        ("worker.task_started", "worker.task_started"),
        ("audit.workflow_override", "audit.workflow_override"),
    ],
)
def test_stream_name(name: str, expected: str) -> None:
    assert stream_name(name) == expected


def test_workflow_stream_names_cover_the_spec_list() -> None:
    # The spec's list, and a failed attempt that is retried (issue 32).
    spec = {
        "workflow:step:retrying",
        "workflow:started",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:step:failed",
        "workflow:completed",
        "workflow:failed",
        "workflow:cancelled",
        "workflow:compensating",
    }
    assert {stream_name(n) for n in CATALOG if n.startswith("workflow.")} == spec


def test_invalid_event_data_pickles() -> None:
    error = InvalidEventData("task.completed", [("duration_ms", "Field required")])
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, InvalidEventData)
    assert str(copy) == str(error)
    assert copy.fields == ("duration_ms",)


def test_event_type_checks_its_own_consistency() -> None:
    model = CATALOG["task.created"].model
    with pytest.raises(ValueError, match="upcaster"):
        EventType("task.x", 2, "task_id", model)
    with pytest.raises(ValueError, match="not a field"):
        EventType("task.x", 1, "job_id", model)
    with pytest.raises(ValueError, match="version"):
        EventType("task.x", 0, "task_id", model)


@pytest.mark.parametrize(
    "name",
    ["audit.intervention_pending", "audit.intervention_approved", "audit.intervention_rejected"],
)
@pytest.mark.parametrize("missing", ["intervention_id", "workflow_id", "step"])
def test_an_intervention_event_names_its_intervention_workflow_and_step(
    name: str, missing: str
) -> None:
    data = {"task_id": "wf-1:a:1", "intervention_id": "iv-1", "workflow_id": "wf-1", "step": "a"}
    kind, _ = validate(name, data)
    assert kind.version == 1 and kind.aggregate_key == "task_id"
    del data[missing]
    with pytest.raises(InvalidEventData) as caught:
        validate(name, data)
    assert missing in caught.value.fields


def test_a_pending_intervention_carries_its_question_and_masked_arguments() -> None:
    data = {
        "task_id": "wf-1:a:1",
        "intervention_id": "iv-1",
        "workflow_id": "wf-1",
        "step": "a",
        "kind": "tool",
        "tool": "http__pay",
        "arguments": {"amount": 5, "api_key": "***"},
        "question": "Run http__pay?",
        "deciders": ["alice"],
        "expires_at": 1_700_000_000_000,
    }
    _, normalised = validate("audit.intervention_pending", data)
    assert {k: v for k, v in normalised.items() if v is not None} == data
    with pytest.raises(InvalidEventData):
        validate("audit.intervention_pending", {**data, "kind": "other"})
