"""Step retries (issue 32): the `retry` field of a task step as checked on the way in (400
naming the field), its defaults from the settings, how it is kept with the workflow, and the
backoff schedule between attempts."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.config import Settings
from orchestrator.errors import ValidationFailed
from orchestrator.workflows import RetryPolicy, SpecLimits, StepRecord, StepState, WorkflowSpec


def _parse(retry: Any, limits: SpecLimits | None = None, **step: Any) -> RetryPolicy:
    raw = {"name": "s", "prompt": "p", "retry": retry, **step}
    return WorkflowSpec.parse("w", [raw], limits=limits).steps[0].retry


def _limits(**settings: Any) -> SpecLimits:
    return SpecLimits.from_settings(Settings(**settings))


# --- parsing --------------------------------------------------------------------------------


def test_a_full_retry_is_taken_as_given() -> None:
    policy = _parse({"max_attempts": 3, "backoff_ms": 200, "max_backoff_ms": 1000})
    assert policy == RetryPolicy(3, 200, 1000)


def test_without_retry_a_step_runs_once_by_default() -> None:
    assert WorkflowSpec.parse("w", [{"name": "s", "prompt": "p"}]).steps[0].retry.max_attempts == 1
    assert _parse(None, _limits()).max_attempts == 1


def test_left_out_fields_come_from_the_settings() -> None:
    limits = _limits(
        step_retry_max_attempts=4, step_retry_backoff_ms=300, step_retry_max_backoff_ms=5000
    )
    assert _parse(None, limits) == RetryPolicy(4, 300, 5000)
    assert _parse({"max_attempts": 2}, limits) == RetryPolicy(2, 300, 5000)
    # A given backoff above the default cap raises the cap to it; a given cap below the
    # default backoff lowers the backoff to it.
    assert _parse({"backoff_ms": 9000}, limits) == RetryPolicy(4, 9000, 9000)
    assert _parse({"max_backoff_ms": 100}, limits) == RetryPolicy(4, 100, 100)


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"max_attempts": 0}, "steps[0].retry.max_attempts"),
        ({"max_attempts": 11}, "steps[0].retry.max_attempts"),
        ({"max_attempts": "3"}, "steps[0].retry.max_attempts"),
        ({"max_attempts": True}, "steps[0].retry.max_attempts"),
        ({"max_attempts": 2.5}, "steps[0].retry.max_attempts"),
        ({"backoff_ms": -1}, "steps[0].retry.backoff_ms"),
        ({"backoff_ms": 1.5}, "steps[0].retry.backoff_ms"),
        ({"max_backoff_ms": -5}, "steps[0].retry.max_backoff_ms"),
        ({"max_backoff_ms": 86_400_001}, "steps[0].retry.max_backoff_ms"),
        ({"backoff_ms": 500, "max_backoff_ms": 100}, "steps[0].retry.max_backoff_ms"),
        ({"tries": 3}, "steps[0].retry.tries"),
        (3, "steps[0].retry"),
        ([3], "steps[0].retry"),
    ],
)
def test_bad_retries_are_400_naming_the_field(retry: Any, field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        _parse(retry, _limits())
    assert caught.value.status_code == 400
    assert caught.value.extra["fields"][0]["field"] == field
    assert str(caught.value).startswith(f"{field}: ")


def test_only_task_steps_have_retry() -> None:
    steps = [
        {"name": "a", "prompt": "p"},
        {
            "name": "b",
            "type": "branch",
            "conditions": {"x": {"then": "a"}},
            "retry": {"max_attempts": 2},
        },
    ]
    with pytest.raises(ValidationFailed) as caught:
        WorkflowSpec.parse("w", steps)
    assert caught.value.extra["fields"][0]["field"] == "steps[1].retry"


def test_the_policy_is_kept_with_the_workflow() -> None:
    """Admitted (with limits), a retrying step's policy is written into the stored spec, so
    a settings change never alters a running workflow; a step that runs once holds none."""
    limits = _limits(step_retry_backoff_ms=250)
    spec = WorkflowSpec.parse(
        "w",
        [
            {"name": "a", "prompt": "p", "retry": {"max_attempts": 3}},
            {"name": "b", "prompt": "p"},
        ],
        limits=limits,
    )
    stored = spec.to_json()
    assert stored["steps"][0]["retry"] == {
        "max_attempts": 3,
        "backoff_ms": 250,
        "max_backoff_ms": 60_000,
    }
    assert "retry" not in stored["steps"][1]
    again = WorkflowSpec.from_json(stored)  # as read back, without limits
    assert again.steps[0].retry == RetryPolicy(3, 250, 60_000)
    assert again.steps[1].retry.max_attempts == 1


def test_settings_refuse_a_cap_below_the_backoff() -> None:
    with pytest.raises(ValueError, match="step_retry_max_backoff_ms"):
        Settings(step_retry_backoff_ms=5000, step_retry_max_backoff_ms=1000)
    with pytest.raises(ValueError):
        Settings(step_retry_max_attempts=11)


# --- the schedule ---------------------------------------------------------------------------


def test_the_waits_double_up_to_the_cap() -> None:
    assert RetryPolicy(6, 100, 1000).schedule() == [100, 200, 400, 800, 1000]
    assert RetryPolicy(1, 100, 1000).schedule() == []
    assert RetryPolicy(3, 0, 0).schedule() == [0, 0]


def test_each_wait_is_jittered_down_to_half_at_most() -> None:
    policy = RetryPolicy(10, 1000, 30_000)
    for failures, longest in enumerate(policy.schedule(), start=1):
        drawn = {policy.delay_ms(failures) for _ in range(200)}
        assert all(longest / 2 <= d <= longest for d in drawn), (failures, drawn)
        assert len(drawn) > 1  # jittered, not one fixed value
    assert policy.delay_ms(0) == 0


# --- the attempts as a step shows them ------------------------------------------------------


def test_a_step_shows_each_attempt() -> None:
    failed = {"attempt": 1, "started_at": 10, "ended_at": 20, "error": "model call failed: x"}
    second = {"attempt": 2, "started_at": 30, "ended_at": 90, "error": "model call failed: y"}
    lost = {**second, "error": "lost: no answer came", "lost": True}
    waiting = StepRecord(
        0, "s", StepState.RUNNING, 2, "wf-1:s:2", None, "model call failed: y", False,
        started_at=30, retry_at=500, attempts=(failed, second),
    )  # fmt: skip
    shown = waiting.wire()
    assert shown["attempt"] == 2 and shown["next_attempt_at"] == 500
    assert [a["attempt"] for a in shown["attempts"]] == [1, 2]  # the waiting one once
    assert waiting.failures == 2
    done = StepRecord(
        0, "s", StepState.COMPLETED, 3, "wf-1:s:3", "ok", None, False,
        started_at=100, finished_at=150, attempts=(failed, lost),
    )  # fmt: skip
    shown = done.wire()
    assert "next_attempt_at" not in shown and done.failures == 1  # a lost one is not counted
    assert shown["attempts"][-1] == {"attempt": 3, "started_at": 100, "ended_at": 150}
    assert shown["attempts"][1]["lost"] is True
    never = StepRecord(0, "s", StepState.PENDING, 0, None, None, None, False)
    assert "attempts" not in never.wire() and "attempt" not in never.wire()
