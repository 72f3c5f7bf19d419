"""A workflow step's marketplace skills: checked with the spec (400 naming the field), kept
through the stored JSON, filled from template variables, pinned across a tree (spawn
children inline) and handed to the step's agent task as (label, body)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.errors import ValidationFailed
from orchestrator.workflows import SpecLimits, WorkflowSpec, fill_template, pin_skills
from orchestrator.workflows._tasks import pinned_skills

LIMITS = SpecLimits.from_settings()
PINNED = {"name": "pdf", "author": "ann", "version": 2, "body": "Read PDFs carefully."}


def task(**kw: Any) -> dict[str, Any]:
    return {"name": "s", "prompt": "p", **kw}


def field_of(exc: pytest.ExceptionInfo[ValidationFailed]) -> str:
    return str(exc.value.extra["fields"][0]["field"])


def parse(steps: list[dict[str, Any]], limits: SpecLimits | None = LIMITS) -> WorkflowSpec:
    return WorkflowSpec.parse("w", steps, limits=limits)


def test_skill_references_are_kept_and_shown() -> None:
    spec = parse([task(skills=["pdf", "pdf@2", "ann-1/pdf@3"])])
    assert spec.steps[0].skills == ("pdf", "pdf@2", "ann-1/pdf@3")
    assert spec.steps[0].to_json()["skills"] == ["pdf", "pdf@2", "ann-1/pdf@3"]
    assert "skills" not in parse([task()]).steps[0].to_json()


def test_too_many_skills_name_the_field_and_the_setting() -> None:
    refs = [f"s{i}" for i in range(LIMITS.max_skills + 1)]
    with pytest.raises(ValidationFailed) as exc:
        parse([{"name": "a", "prompt": "p"}, task(skills=refs)])
    assert field_of(exc) == "steps[1].skills"
    assert exc.value.extra["limit"] == "step_max_skills"
    assert f"at most {LIMITS.max_skills}" in exc.value.message
    # Read back (no limits), a stored spec is not held to them.
    assert len(parse([task(skills=refs)], limits=None).steps[0].skills) == len(refs)


@pytest.mark.parametrize(
    ("skills", "field"),
    [
        ("pdf", "steps[0].skills"),
        ({"name": "pdf"}, "steps[0].skills"),
        ([3], "steps[0].skills[0]"),
        (["pdf", ""], "steps[0].skills[1]"),
        (["pdf", "   "], "steps[0].skills[1]"),
        (["x" * 301], "steps[0].skills[0]"),
        ([None], "steps[0].skills[0]"),
        ([["pdf"]], "steps[0].skills[0]"),
    ],
)
def test_wrong_types_name_the_field(skills: Any, field: str) -> None:
    with pytest.raises(ValidationFailed) as exc:
        parse([task(skills=skills)])
    assert field_of(exc) == field


def test_only_task_steps_have_skills() -> None:
    branch = {
        "name": "b",
        "type": "branch",
        "conditions": {"else": {"then": "a"}},
        "skills": ["pdf"],
    }
    with pytest.raises(ValidationFailed) as exc:
        parse([{"name": "a", "prompt": "p"}, branch])
    assert field_of(exc) == "steps[1].skills"
    assert "only task steps" in exc.value.message
    spawn = {
        "name": "sp",
        "type": "spawn",
        "workflows": [{"name": "c", "steps": [task()]}],
        "skills": ["pdf"],
    }
    with pytest.raises(ValidationFailed) as exc:
        parse([spawn])
    assert field_of(exc) == "steps[0].skills"


def test_pinned_skills_are_read_back_but_not_taken_from_a_request() -> None:
    stored = parse([task(skills=[PINNED, "late"])], limits=None)
    assert stored.steps[0].skills == (PINNED, "late")
    again = WorkflowSpec.from_json(stored.to_json())
    assert again.steps[0].skills == (PINNED, "late")
    # At admission a request cannot bring its own "pinned" body.
    with pytest.raises(ValidationFailed) as exc:
        parse([task(skills=[PINNED])])
    assert field_of(exc) == "steps[0].skills[0]"
    # A stored one of the wrong shape is refused even read back.
    for bad in (
        {**PINNED, "extra": 1},
        {k: v for k, v in PINNED.items() if k != "body"},
        {**PINNED, "version": "2"},
        {**PINNED, "version": True},
    ):
        with pytest.raises(ValidationFailed):
            parse([task(skills=[bad])], limits=None)


def test_template_variables_fill_skill_references() -> None:
    steps = [task(skills=["{{skill}}@{{version}}", "fixed"])]
    filled = fill_template(steps, {"skill": "pdf", "version": 3})
    assert parse(filled).steps[0].skills == ("pdf@3", "fixed")
    with pytest.raises(ValidationFailed) as exc:
        fill_template(steps, {"skill": "pdf"})
    assert field_of(exc) == "variables.version"


@dataclass(frozen=True)
class Found:
    name: str
    author: str
    version: int
    body: str


class Catalogue:
    """A SkillSource over a dict, counting its lookups."""

    def __init__(self, known: dict[str, Found]) -> None:
        self.known = known
        self.asked: list[str] = []

    async def pin(self, ref: str) -> Found:
        self.asked.append(ref)
        if ref not in self.known:
            raise ValidationFailed(f"skill {ref!r}: unknown", extra={"skill": ref})
        return self.known[ref]


async def test_pin_skills_walks_the_tree_and_names_the_field() -> None:
    pdf = Found("pdf", "ann", 2, "PDF body")
    csv = Found("csv", "bob", 1, "CSV body")
    source = Catalogue({"pdf": pdf, "bob/csv@1": csv})
    grandchild = {"name": "g", "steps": [task(skills=["bob/csv@1"])]}
    child: dict[str, Any] = {
        "name": "c",
        "steps": [
            task(skills=["pdf"]),
            {"name": "sp2", "type": "spawn", "workflows": [grandchild]},
        ],
    }
    spec = parse(
        [
            task(name="a", skills=["pdf", "bob/csv@1"]),
            {"name": "sp", "type": "spawn", "workflows": [child]},
        ]
    )
    done = await pin_skills(spec, source)
    as_dict = {"name": "pdf", "author": "ann", "version": 2, "body": "PDF body"}
    csv_dict = {"name": "csv", "author": "bob", "version": 1, "body": "CSV body"}
    assert done.steps[0].skills == (as_dict, csv_dict)
    kid = done.steps[1].workflows[0]
    assert kid["steps"][0]["skills"] == [as_dict]
    assert kid["steps"][1]["workflows"][0]["steps"][0]["skills"] == [csv_dict]
    assert sorted(source.asked) == ["bob/csv@1", "pdf"]  # each reference once
    # The original spec is untouched, and the pinned one survives its stored JSON.
    assert spec.steps[0].skills == ("pdf", "bob/csv@1")
    assert child["steps"][0]["skills"] == ["pdf"]
    assert WorkflowSpec.from_json(done.to_json()).steps[0].skills == (as_dict, csv_dict)
    assert pinned_skills(done.steps[0]) == (
        ("pdf v2 by ann", "PDF body"),
        ("csv v1 by bob", "CSV body"),
    )


async def test_an_unknown_skill_names_its_field_and_reference() -> None:
    source = Catalogue({"pdf": Found("pdf", "ann", 1, "b")})
    top = parse([task(name="a", skills=["pdf", "nope"])])
    with pytest.raises(ValidationFailed) as exc:
        await pin_skills(top, source)
    assert field_of(exc) == "steps[0].skills[1]"
    assert "'nope'" in exc.value.message
    assert exc.value.extra["skill"] == "nope"
    deep = parse(
        [
            task(name="a"),
            {
                "name": "sp",
                "type": "spawn",
                "workflows": [{"name": "c", "steps": [task(skills=["pdf", "gone@4"])]}],
            },
        ]
    )
    with pytest.raises(ValidationFailed) as exc:
        await pin_skills(deep, source)
    assert field_of(exc) == "steps[1].workflows[0].steps[0].skills[1]"
    assert "'gone@4'" in exc.value.message
