"""Every 400's `fields` has one shape, `{field, message}` (issue 33, SPEC part 7).

Two walks: the body builder turns every form a producer may pass into that shape, and a walk
of the source finds no producer still building another (an item whose text is under
`error`, or a singular `field` extra).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from orchestrator import errors as E
from orchestrator.workflows._invalid import _bad

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    *ROOT.joinpath("orchestrator").rglob("*.py"),
    *ROOT.joinpath("deployments").rglob("*.py"),
]


def _one_shape(body: dict[str, Any]) -> None:
    assert isinstance(body["fields"], list) and body["fields"], body
    for item in body["fields"]:
        assert set(item) == {"field", "message"}, body
        assert isinstance(item["field"], str) and isinstance(item["message"], str), body


@pytest.mark.parametrize(
    "extra",
    [
        {"fields": [{"field": "a", "message": "bad"}]},
        {"fields": [{"field": "a", "error": "bad"}]},
        {"fields": {"a": "bad"}},
        {"fields": ["a"]},
        {"fields": [{"field": "a"}]},
        {"field": "a"},
    ],
)
def test_the_body_has_one_fields_shape(extra: dict[str, Any]) -> None:
    body = E.ValidationFailed("a: bad", extra=extra).body("rid")
    _one_shape(body)
    assert body["fields"][0]["field"] == "a" and "field" not in body


def test_the_helper_and_the_workflow_producer() -> None:
    err = E.invalid_field("config.x", "required", limit="some_setting")
    assert err.status_code == 400 and err.message == "config.x: required"
    body = err.body(None)
    assert body["fields"] == [{"field": "config.x", "message": "required"}]
    assert body["limit"] == "some_setting"
    # The workflow spec's producer: its items used to say `error`.
    assert _bad("steps[0].name", "required").extra["fields"] == [
        {"field": "steps[0].name", "message": "required"}
    ]


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Dict):
            continue
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        if "field" in keys and "error" in keys:
            found.append(f"{path}:{node.lineno}: a fields item with `error`")
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and key.value == "fields"):
                continue
            if isinstance(value, ast.Dict):
                found.append(f"{path}:{node.lineno}: fields as a {{name: message}} object")
            if isinstance(value, ast.List) and any(
                isinstance(item, ast.Constant) for item in value.elts
            ):
                found.append(f"{path}:{node.lineno}: fields as bare names")
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.keyword)
            and node.arg == "extra"
            and isinstance(node.value, ast.Dict)
        ):
            keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            if "field" in keys:
                found.append(f"{path}:{node.lineno}: a singular `field` extra")
    return found


def test_no_producer_builds_another_shape() -> None:
    offences = [o for path in SOURCES for o in _offences(path)]
    assert not offences, "\n".join(offences)
