"""Workflow regular expressions (RE2: linear time) and the calculator's bounds: a tenant's
expression cannot hold the event loop other tenants' workflows and tasks share."""

from __future__ import annotations

import time

import pytest

from orchestrator.agents import ToolFailed, evaluate_arithmetic
from orchestrator.errors import ValidationFailed
from orchestrator.workflows import Condition, WorkflowSpec, choose_branch
from orchestrator.workflows._patterns import MAX_INPUT, PatternError, check_pattern, pattern_found

EVIL = "(a+)+$"
VICTIM = "a" * 40 + "!"


def test_a_catastrophic_pattern_is_linear() -> None:
    started = time.perf_counter()
    assert pattern_found(EVIL, VICTIM) is False
    assert pattern_found(EVIL, "a" * 200_000) is True
    assert time.perf_counter() - started < 0.5  # Python's re: about 2**40 steps


@pytest.mark.parametrize(
    ("pattern", "text", "found"),
    [
        (r"\d{3}-\d{4}", "call 555-1234 now", True),
        (r"^done", "done: x", True),
        (r"(?i)yes", "YES", True),
        (r"^no$", "not", False),
        ("x", "a" * MAX_INPUT + "x", False),  # past the input cap
    ],
)
def test_patterns(pattern: str, text: str, found: bool) -> None:
    assert pattern_found(pattern, text) is found


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=x)y", r"(?<!x)y", "(", "a" * 1001])
def test_patterns_re2_refuses(pattern: str) -> None:
    with pytest.raises(PatternError):
        check_pattern(pattern)


def test_refused_patterns_are_400s_at_creation() -> None:
    branch = {
        "name": "b",
        "type": "branch",
        "conditions": {"x": {"match": "{{a.result}}", "pattern": r"(a)\1", "then": "a"}},
    }
    with pytest.raises(ValidationFailed, match="pattern"):
        WorkflowSpec.parse("w", [{"name": "a", "prompt": "p"}, branch])
    with pytest.raises(ValidationFailed, match="condition"):
        WorkflowSpec.parse(
            "w",
            [
                {"name": "a", "prompt": "p"},
                {"name": "c", "prompt": "p", "condition": "{{a.result}} matches '(?=x)'"},
            ],
        )


def test_evil_pattern_in_a_condition_and_a_branch_evaluates_fast() -> None:
    started = time.perf_counter()
    assert Condition(f"{{{{a.result}}}} matches '{EVIL}'").evaluate(lambda s, a: VICTIM) is False
    spec = WorkflowSpec.parse(
        "w",
        [
            {"name": "a", "prompt": "p"},
            {
                "name": "b",
                "type": "branch",
                "conditions": {
                    "evil": {"match": "{{a.result}}", "pattern": EVIL, "then": "a"},
                    "other": {"then": "c"},
                },
            },
            {"name": "c", "prompt": "p"},
        ],
    )
    rule = choose_branch(spec.steps[1], lambda s, a: VICTIM)
    assert rule is not None and rule.then == "c"
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("text", ["(" * 250 + "true" + ")" * 250, "not " * 300 + "true"])
def test_deeply_nested_conditions_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        Condition(text)


@pytest.mark.parametrize(
    "expression",
    [
        "(((9**99)**99)**99)**99",
        "9**99**99",
        "2**20000",
        "(2**6000)*(2**6000)",
        "10**5000",
        "round(1.5, 10**9)",
        "2.0**5000",
    ],
)
def test_calculator_bounds_every_intermediate_result(expression: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ToolFailed):
        evaluate_arithmetic(expression)
    assert time.perf_counter() - started < 0.1


@pytest.mark.parametrize(
    ("expression", "value"),
    [("6*7", 42), ("2**100", 2**100), ("(2+3)*4", 20), ("2**-2", 0.25), ("-(3**3)", -27)],
)
def test_calculator_still_calculates(expression: str, value: float) -> None:
    assert evaluate_arithmetic(expression) == value
