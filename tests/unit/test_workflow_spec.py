"""Workflow state tables, spec checking, templates, conditions and branch selection."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.agents import ToolFailed, evaluate_arithmetic
from orchestrator.errors import Conflict, ValidationFailed
from orchestrator.workflows import (
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    Condition,
    StepState,
    WorkflowSpec,
    WorkflowState,
    check_transition,
    choose_branch,
    evaluate_condition,
    fill_refs,
    fill_template,
    template_variables,
)
from orchestrator.workflows._resolve import resolve_request

RESULTS = {"research": "Found: YES, 42 items", "empty": ""}
STATUS = {"research": "completed", "empty": "completed", "later": "pending"}


def lookup(step: str, attr: str) -> str:
    return RESULTS.get(step, "") if attr == "result" else STATUS.get(step, "pending")


# --- state tables ---------------------------------------------------------------------------


def test_workflow_table_matches_spec() -> None:
    W = WorkflowState
    assert WORKFLOW_TRANSITIONS[W.PENDING] == {W.RUNNING, W.CANCELLED}
    assert WORKFLOW_TRANSITIONS[W.RUNNING] == {W.COMPLETED, W.FAILED, W.CANCELLED}
    for final in (W.COMPLETED, W.FAILED, W.CANCELLED):
        assert WORKFLOW_TRANSITIONS[final] == frozenset()
    check_transition("workflow", "running", "completed")
    with pytest.raises(Conflict, match="cannot go from completed to running"):
        check_transition("workflow", "completed", "running")
    with pytest.raises(Conflict):
        check_transition("workflow", "pending", "completed")


def test_step_table() -> None:
    S = StepState
    assert STEP_TRANSITIONS[S.PENDING] == {S.RUNNING, S.SKIPPED}
    assert {S.COMPLETED, S.FAILED} <= STEP_TRANSITIONS[S.RUNNING]
    assert STEP_TRANSITIONS[S.FAILED] == frozenset()
    with pytest.raises(Conflict):
        check_transition("step", "pending", "completed")
    with pytest.raises(Conflict):
        check_transition("step", "failed", "running")
    check_transition("step", "completed", "pending")  # a branch jumped back


# --- conditions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('{{research.result}} contains "YES"', True),
        ('{{research.result}} contains "NO"', False),
        ('not {{research.result}} contains "NO"', True),
        ('{{research.result}} matches "\\d+ items"', True),
        ('{{research.status}} == "completed"', True),
        ("{{later.status}} != 'completed'", True),
        ('{{research.result}} contains "YES" and {{empty.result}}', False),
        ('{{research.result}} contains "YES" or {{empty.result}}', True),
        ("({{empty.result}} or true) and not false", True),
        ("{{research.result}}", True),
        ("{{empty.result}}", False),
        ("{{later.result}}", False),
        ('"3" < "10"', True),
        ('{{research.result}} > "1"', False),  # not a number: false
    ],
)
def test_conditions(expr: str, expected: bool) -> None:
    assert evaluate_condition(expr, lookup) is expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty"),
        ("{{research.result}} contains", "ends too early"),
        ("__import__('os')", "unknown word"),
        ("{{research.result}} == yes", "unknown word"),
        ('{{research.result}} matches "("', "invalid regular expression"),
        ("(true", "ends too early"),
        ("true true", "unexpected"),
        ("{{ghost.result}} == 'x'", "names no step"),
    ],
)
def test_bad_conditions(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Condition(expr, ["research", "empty", "later"])


# --- templates and references ---------------------------------------------------------------


def test_fill_template_and_variables() -> None:
    steps = [
        {"name": "a", "prompt": "Research {{topic}} for {{ audience }}", "tools": ["{{tool}}"]},
        {"name": "b", "prompt": "Use {{a.result}} about {{topic}}"},
    ]
    assert template_variables(steps) == ["audience", "tool", "topic"]
    filled = fill_template(steps, {"topic": "ray", "audience": "ops", "tool": "calculate"})
    assert filled[0]["prompt"] == "Research ray for ops"
    assert filled[0]["tools"] == ["calculate"]
    assert filled[1]["prompt"] == "Use {{a.result}} about ray"  # references stay for run time
    with pytest.raises(ValidationFailed, match=r"variables\.audience"):
        fill_template(steps, {"topic": "ray", "tool": "x"})
    assert fill_refs("x={{research.result}} s={{later.status}}", lookup) == (
        "x=Found: YES, 42 items s=pending"
    )


# --- specs and branches ---------------------------------------------------------------------


def spec(steps: list[dict[str, Any]]) -> WorkflowSpec:
    return WorkflowSpec.parse("w", steps)


BRANCH = {
    "name": "route",
    "type": "branch",
    "conditions": {
        "yes": {"match": "{{research.result}}", "pattern": "YES", "then": "act"},
        "count": {"match": "{{research.result}}", "pattern": "\\d+", "then": "count"},
        "else": {"then": "report"},
    },
}
BASE = [
    {"name": "research", "prompt": "r"},
    BRANCH,
    {"name": "act", "prompt": "a"},
    {"name": "count", "prompt": "c"},
    {"name": "report", "prompt": "p"},
]


def test_branch_selection_first_match_in_order() -> None:
    step = spec(BASE).steps[1]
    rule = choose_branch(step, lookup)
    assert rule is not None and (rule.name, rule.then) == ("yes", "act")


def test_branch_selection_later_match_and_fallback() -> None:
    step = spec(BASE).steps[1]
    rule = choose_branch(step, lambda s, a: "only 7" if a == "result" else "completed")
    assert rule is not None and rule.name == "count"
    rule = choose_branch(step, lambda s, a: "nothing" if a == "result" else "completed")
    assert rule is not None and (rule.name, rule.then) == ("else", "report")


def test_branch_without_match_and_without_fallback() -> None:
    branch = dict(BRANCH, conditions={"yes": BRANCH["conditions"]["yes"]})  # type: ignore[index]
    step = spec([BASE[0], branch, *BASE[2:]]).steps[1]
    assert choose_branch(step, lambda s, a: "no") is None


def test_branch_match_without_pattern_tests_non_empty() -> None:
    branch = dict(BRANCH, conditions={"any": {"match": "{{research.result}}", "then": "act"}})
    step = spec([BASE[0], branch, *BASE[2:]]).steps[1]
    assert choose_branch(step, lookup) is not None
    assert choose_branch(step, lambda s, a: "") is None


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([{"name": "a", "prompt": "x", "bogus": 1}], "steps[0].bogus"),
        ([{"name": "a", "type": "loop", "prompt": "x"}], "steps[0].type"),
        ([{"name": "a", "prompt": "x", "tools": "calculate"}], "steps[0].tools"),
        ([{"name": "a", "prompt": "x", "compensate": 3}], "steps[0].compensate"),
        ([{"name": "a", "prompt": "use {{ghost.result}}"}], "steps[0].prompt"),
        ([{"name": "a", "type": "branch", "conditions": {}}], "steps[0].conditions"),
        (
            [{"name": "a", "type": "branch", "conditions": {"x": {"then": "a"}}}],
            "steps[0].conditions.x.then",
        ),
        (
            [
                {
                    "name": "a",
                    "type": "branch",
                    "conditions": {"x": {"then": "b"}, "y": {"then": "b"}},
                },
                {"name": "b", "prompt": "x"},
            ],
            "steps[0].conditions",
        ),
        ([{"name": "a", "type": "spawn", "workflows": []}], "steps[0].workflows"),
        ([{"name": "a", "type": "spawn", "workflows": [{"x": 1}]}], "steps[0].workflows[0]"),
        ([{"name": "-a", "prompt": "x"}], "steps[0].name"),
    ],
)
def test_spec_errors_name_the_field(steps: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        spec(steps)
    assert caught.value.message.startswith(f"{field}:")


def test_spec_round_trips_through_json() -> None:
    parsed = spec(
        [
            *BASE,
            {"name": "undo", "prompt": "x", "compensate": {"notify": "n"}, "timeout": 5},
            {"name": "kids", "type": "spawn", "workflows": [{"template": "t"}]},
        ]
    )
    again = WorkflowSpec.from_json(parsed.to_json())
    assert again == parsed and again.step_index["kids"] == 6


def test_calculator_is_arithmetic_only() -> None:
    assert evaluate_arithmetic("(2+3)*4") == 20
    assert evaluate_arithmetic("sqrt(16) + 2**3") == 12.0
    for bad in ("__import__('os')", "a+1", "2**20000", "[1]", "1/0"):
        with pytest.raises(ToolFailed):
            evaluate_arithmetic(bad)


async def test_spawn_children_are_kept_resolved() -> None:
    """A child given by template is stored inline at creation: editing the template later
    does not change what the spawn step starts."""

    class Templates:
        def __init__(self) -> None:
            self.steps = [{"name": "t", "prompt": "hello {{who}}"}]

        async def get_template(self, name: str, user_uuid: str) -> dict[str, Any] | None:
            return {"steps": self.steps} if name == "greet" else None

    source = Templates()
    body = {
        "name": "parent",
        "steps": [
            {
                "name": "fan",
                "type": "spawn",
                "workflows": [{"template": "greet", "variables": {"who": "ann"}}],
            }
        ],
    }
    spec = await resolve_request(source, body, "u")
    source.steps = [{"name": "t", "prompt": "changed"}]
    child = spec.steps[0].workflows[0]
    assert "template" not in child
    assert child["name"] == "greet"
    assert child["steps"][0]["prompt"] == "hello ann"
    again = await resolve_request(source, child, "u")  # resolves offline
    assert again.steps[0].prompt == "hello ann"
    stored = WorkflowSpec.from_json(spec.to_json())
    assert stored.steps[0].workflows[0]["steps"][0]["prompt"] == "hello ann"
