"""Workflow state tables, spec checking, templates, conditions and branch selection."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from orchestrator.agents import ToolFailed, evaluate_arithmetic
from orchestrator.errors import Conflict, ValidationFailed
from orchestrator.workflows import (
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    Condition,
    SpecLimits,
    StepState,
    WorkflowSpec,
    WorkflowState,
    check_transition,
    choose_branch,
    evaluate_condition,
    fill_refs,
    fill_template,
    template_variables,
    tree_size,
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
        ([{"name": "", "prompt": "x"}], "steps[0].name"),
        ([{"name": "a\nb", "prompt": "x"}], "steps[0].name"),
        ([{"name": "x" * 129, "prompt": "x"}], "steps[0].name"),
        ([{"name": 7, "prompt": "x"}], "steps[0].name"),
    ],
)
def test_spec_errors_name_the_field(steps: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        spec(steps)
    assert caught.value.message.startswith(f"{field}:")


def test_step_names_are_any_text_and_references_name_them_exactly() -> None:
    """Issue 33: a step name is any non-empty string of at most 128 characters without
    control characters; `{{<name>.result}}` refers to it as written."""
    names = ["My step", "-a", "données/étape 2", "a.b", "x" * 128]
    steps = [{"name": names[0], "prompt": "go"}]
    steps += [{"name": n, "prompt": f"after {{{{{names[0]}.result}}}}"} for n in names[1:3]]
    steps += [
        {"name": names[3], "prompt": "{{données/étape 2.result}} / {{-a.status}}"},
        {
            "name": names[4],
            "prompt": "{{a.b.result}}",
            "condition": '{{My step.result}} contains "ok" and {{a.b.status}} == "completed"',
        },
        {
            "name": "pick",
            "type": "branch",
            "conditions": {"yes": {"match": "{{My step.result}}", "then": names[1]}},
        },
    ]
    parsed = spec(steps)
    assert [s.name for s in parsed.steps] == [*names, "pick"]
    results = {"My step": "ok", "a.b": "AB", "données/étape 2": "D", "-a": "A"}

    def look(step: str, attr: str) -> str:
        return results.get(step, "") if attr == "result" else "completed"

    assert fill_refs(parsed.steps[3].prompt or "", look) == "D / completed"
    assert fill_refs(parsed.steps[4].prompt or "", look) == "AB"
    assert fill_refs("{{x}} {{My step.result}}", look) == "{{x}} ok"  # a variable is not crossed
    assert Condition(parsed.steps[4].condition or "", names).evaluate(look)
    assert parsed.steps[5].conditions[0].match == "My step"
    with pytest.raises(ValidationFailed, match="names no step"):
        spec([{"name": "My step", "prompt": "x"}, {"name": "b", "prompt": "{{my step.result}}"}])


def test_spaces_inside_the_braces_are_part_of_the_name() -> None:
    """Issue 33: `{{ a.result }}` refers to a step named ` a` (spaces before `}}` are
    allowed); with no such step it is a 400 naming the field, not literal prompt text."""
    for text in ("{{ a.result }}", "{{ a.result}}"):
        with pytest.raises(ValidationFailed, match=r"steps\[1\]\.prompt: .*names no step"):
            spec([{"name": "a", "prompt": "x"}, {"name": "b", "prompt": f"use {text}"}])
    with pytest.raises(ValidationFailed, match=r"steps\[1\]\.condition"):
        spec(
            [
                {"name": "a", "prompt": "x"},
                {"name": "b", "prompt": "y", "condition": "{{ a.status }} == 'ok'"},
            ]
        )
    parsed = spec(
        [
            {"name": " a", "prompt": "x"},
            {
                "name": "b",
                "prompt": "use {{ a.result }} / {{ a.result}}",
                "condition": "{{ a.status }} == 'completed'",
            },
        ]
    )

    def look(step: str, attr: str) -> str:
        assert step == " a"
        return "A" if attr == "result" else "completed"

    assert fill_refs(parsed.steps[1].prompt or "", look) == "use A / A"
    assert Condition(parsed.steps[1].condition or "", [" a", "b"]).evaluate(look)


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


# --- admission limits (issue 29): nested templates, depth, size ------------------------------


class Bombs:
    """Templates of the issue: bomb1 spawns 50 one-step leaves, bomb2 50 bomb1, bomb3 50
    bomb2. Counts the lookups."""

    def __init__(self) -> None:
        self.lookups = 0
        leaf = {"name": "leaf", "steps": [{"name": "x", "prompt": "hi"}]}
        self.templates: dict[str, list[dict[str, Any]]] = {
            "bomb1": [{"name": "s", "type": "spawn", "workflows": [leaf] * 50}],
            "bomb2": [{"name": "s", "type": "spawn", "workflows": [{"template": "bomb1"}] * 50}],
            "bomb3": [{"name": "s", "type": "spawn", "workflows": [{"template": "bomb2"}] * 50}],
        }

    async def get_template(self, name: str, user_uuid: str) -> dict[str, Any] | None:
        self.lookups += 1
        steps = self.templates.get(name)
        return {"steps": steps} if steps is not None else None


LIMITS = SpecLimits.from_settings()


async def test_a_template_is_resolved_within_the_limits() -> None:
    spec = await resolve_request(Bombs(), {"template": "bomb1"}, "u", limits=LIMITS)
    assert tree_size(spec) == 51


@pytest.mark.parametrize("bomb", ["bomb2", "bomb3"])
async def test_a_template_bomb_stops_at_the_descendant_limit(bomb: str) -> None:
    source = Bombs()
    started = time.perf_counter()
    with pytest.raises(ValidationFailed) as caught:
        await resolve_request(source, {"template": bomb}, "u", limits=LIMITS)
    assert caught.value.extra["limit"] == "workflow_max_descendants"
    assert "workflow_max_descendants" in caught.value.message
    # Stopped at the limit, not after materialising 2,551 (127,551) specs: each template
    # read once.
    assert source.lookups <= 3
    assert time.perf_counter() - started < 0.5


async def test_template_expansions_and_depth_are_limited() -> None:
    source = Bombs()
    source.templates["one"] = [{"name": "x", "prompt": "hi"}]
    fan = {"name": "fan", "steps": [{"name": "s", "type": "spawn", "workflows": []}]}
    fan["steps"][0]["workflows"] = [{"template": "one"}] * 30
    assert tree_size(await resolve_request(source, fan, "u", limits=LIMITS)) == 31
    few = replace(LIMITS, max_templates=20)
    with pytest.raises(ValidationFailed) as caught:
        await resolve_request(source, fan, "u", limits=few)
    assert caught.value.extra["limit"] == "workflow_max_template_expansions"

    def nested(levels: int) -> dict[str, Any]:
        body: dict[str, Any] = {"name": "leaf", "steps": [{"name": "x", "prompt": "hi"}]}
        for _ in range(levels - 1):
            body = {"name": "n", "steps": [{"name": "s", "type": "spawn", "workflows": [body]}]}
        return body

    spec = await resolve_request(source, nested(LIMITS.max_depth), "u", limits=LIMITS)
    assert tree_size(spec) == LIMITS.max_depth
    with pytest.raises(ValidationFailed) as caught:
        await resolve_request(source, nested(LIMITS.max_depth + 1), "u", limits=LIMITS)
    assert caught.value.extra["limit"] == "workflow_max_depth"


async def test_a_variable_cannot_multiply_past_the_character_limit() -> None:
    source = Bombs()
    source.templates["echo"] = [{"name": "s", "prompt": "{{v}} " * 1000}]
    body = {"template": "echo", "variables": {"v": "x" * 10_000}}  # 10 million characters
    started = time.perf_counter()
    with pytest.raises(ValidationFailed) as caught:
        await resolve_request(source, body, "u", limits=LIMITS)
    assert caught.value.extra["limit"] == "workflow_max_spec_chars"
    assert time.perf_counter() - started < 0.5
    body["variables"] = {"v": "x" * 50}
    assert (await resolve_request(source, body, "u", limits=LIMITS)).steps[0].prompt


@pytest.mark.parametrize(
    ("steps", "limit"),
    [
        ([{"name": f"s{i}", "prompt": "p"} for i in range(101)], "workflow_max_declared_steps"),
        (
            [{"name": "s", "type": "spawn", "workflows": [{"template": "t"}] * 51}],
            "workflow_max_children",
        ),
    ],
)
def test_declared_sizes_are_limited_at_admission_only(
    steps: list[dict[str, Any]], limit: str
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        WorkflowSpec.parse("w", steps, limits=LIMITS)
    assert caught.value.extra["limit"] == limit and limit in caught.value.message
    # A spec read back from the database (admitted under other settings) still loads.
    stored = WorkflowSpec.parse("w", steps)
    assert WorkflowSpec.from_json(stored.to_json()) == stored


# --- asking people (issue 32): approval steps, notify, approval_timeout_s -------------------

APPROVAL = {"name": "ok", "type": "approval", "prompt": "Ship {{a.result}}?"}


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({**APPROVAL, "prompt": " "}, "steps[1].prompt"),
        ({"name": "ok", "type": "approval"}, "steps[1].prompt"),
        ({**APPROVAL, "tools": ["calculate"]}, "steps[1].tools"),
        ({**APPROVAL, "model": "m"}, "steps[1].model"),
        ({**APPROVAL, "retry": {"max_attempts": 2}}, "steps[1].retry"),
        ({**APPROVAL, "approvers": []}, "steps[1].approvers"),
        ({**APPROVAL, "approvers": ["ann", 3]}, "steps[1].approvers"),
        ({**APPROVAL, "approval_timeout_s": 0}, "steps[1].approval_timeout_s"),
        ({**APPROVAL, "approval_timeout_s": 2_592_001}, "steps[1].approval_timeout_s"),
        ({**APPROVAL, "approval_timeout_s": 1.5}, "steps[1].approval_timeout_s"),
        ({**APPROVAL, "notify": "ch-1"}, "steps[1].notify"),
        ({**APPROVAL, "notify": {}}, "steps[1].notify.channel_id"),
        ({**APPROVAL, "notify": {"channel_id": "c", "x": 1}}, "steps[1].notify.x"),
        ({"name": "t", "prompt": "x", "approvers": ["ann"]}, "steps[1].approvers"),
        (
            {"name": "b", "type": "branch", "conditions": {"x": {"then": "a"}}, "notify": {}},
            "steps[1].notify.channel_id",
        ),
        (
            {
                "name": "b",
                "type": "branch",
                "conditions": {"x": {"then": "a"}},
                "notify": {"channel_id": "c"},
            },
            "steps[1].notify",
        ),
    ],
)
def test_approval_and_notify_errors_name_the_field(step: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        spec([{"name": "a", "prompt": "x"}, step])
    assert caught.value.message.startswith(f"{field}:"), caught.value.message


def test_approval_steps_and_notify_round_trip_through_json() -> None:
    steps = [
        {"name": "a", "prompt": "x", "approval_timeout_s": 60, "notify": {"channel_id": "c1"}},
        {**APPROVAL, "approvers": ["ann", "bob", "ann"], "approval_timeout_s": 3},
    ]
    parsed = WorkflowSpec.parse("w", steps, notify={"channel_id": "c0"})
    assert parsed.notify == "c0"
    task, approval = parsed.steps
    assert (task.notify, task.approval_timeout_s) == ("c1", 60)
    assert approval.type == "approval" and approval.approvers == ("ann", "bob")
    assert WorkflowSpec.from_json(parsed.to_json()) == parsed
    with pytest.raises(ValidationFailed) as caught:
        WorkflowSpec.parse("w", steps, notify={"channel": "c0"})
    assert caught.value.message.startswith("notify.channel:")


def test_notify_fields_walk_the_tree() -> None:
    from orchestrator.workflows._approval import notify_fields

    parsed = WorkflowSpec.parse(
        "w",
        [
            {"name": "a", "prompt": "x"},
            {**APPROVAL, "notify": {"channel_id": "c2"}},
            {
                "name": "kids",
                "type": "spawn",
                "workflows": [
                    {
                        "name": "k",
                        "steps": [{"name": "s", "prompt": "p"}],
                        "notify": {"channel_id": "c3"},
                    }
                ],
            },
        ],
        notify={"channel_id": "c1"},
    )
    assert notify_fields(parsed) == [
        ("notify.channel_id", "c1"),
        ("steps[1].notify.channel_id", "c2"),
        ("steps[2].workflows[0].notify.channel_id", "c3"),
    ]


def test_an_approval_step_is_not_chained_after_a_task_step() -> None:
    """A task step's result and the next step's start share a commit only when the next is
    a plain task step: an approval step asks in its own (orchestrator/workflows/_tasks.py)."""
    from orchestrator.config import Settings
    from orchestrator.workflows import StepRecord, StepState, WorkflowRecord, WorkflowState
    from orchestrator.workflows._tasks import chainable

    parsed = spec([{"name": "a", "prompt": "x"}, APPROVAL, {"name": "c", "prompt": "y"}])
    steps = tuple(
        StepRecord(i, s.name, StepState.PENDING, 0, None, None, None, False)
        for i, s in enumerate(parsed.steps)
    )
    record = WorkflowRecord(
        "wf-1",
        "ann",
        "w",
        WorkflowState.RUNNING,
        parsed,
        None,
        None,
        1,
        1,
        None,
        None,
        0,
        0,
        steps,
    )
    settings = Settings.model_construct()
    assert chainable(record, [], settings, draining=False) is None
    assert chainable(replace(record, cursor=2), [], settings, draining=False) is not None
