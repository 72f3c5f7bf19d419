"""Pinning a workflow's marketplace skills when it is created (issue 30).

A task step's `skills` are references to marketplace skills; each is replaced by the version
it names at creation (`{name, author, version, body}`, stored with the spec), so a skill
republished, or its author's next version, never changes what a running or later step of
this workflow is told. Spawn steps' children are resolved inline at creation (_resolve.py),
so their steps are pinned here too, with their root: a child started later runs the
versions current when its root was created.

The references' form is checked here too, when a step is parsed (_spec.py calls
`parse_skills`); this module imports _spec.py's types for type checking only, so that
_spec.py can import it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.errors import ValidationFailed
from orchestrator.workflows._invalid import _bad

if TYPE_CHECKING:
    from orchestrator.workflows._spec import SpecLimits, StepSpec, WorkflowSpec

SKILL_REF_MAX = 300
PINNED_SKILL = {"name": str, "author": str, "version": int, "body": str}


def parse_skills(raw: Any, where: str, limits: SpecLimits | None) -> tuple[Any, ...]:
    """Skill references (strings; the marketplace judges them when they are pinned) or,
    in a spec read back (no `limits`), pinned skills. At admission a pinned one is refused:
    pinned skills come from the marketplace, not from a request."""
    if not isinstance(raw, list):
        raise _bad(where, "an array of skill references")
    if limits is not None and len(raw) > limits.max_skills:
        raise _bad(
            where,
            f"{len(raw)} skills, at most {limits.max_skills} (step_max_skills)",
            "step_max_skills",
        )
    for k, item in enumerate(raw):
        if isinstance(item, str) and item.strip() and len(item) <= SKILL_REF_MAX:
            continue
        if limits is None and _pinned(item):
            continue
        raise _bad(
            f"{where}[{k}]",
            f"a skill reference: name, name@<version>, <author>/name or <author>/name@<version>"
            f" (a non-empty string of at most {SKILL_REF_MAX} characters)",
        )
    return tuple(dict(item) if isinstance(item, dict) else item for item in raw)


def _pinned(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and set(item) == set(PINNED_SKILL)
        and all(
            isinstance(item[key], kind) and not isinstance(item[key], bool)
            for key, kind in PINNED_SKILL.items()
        )
    )


class SkillSource(Protocol):
    """Where skill references are looked up (the service's Marketplace): `pin` returns an
    object with `name`, `author`, `version` and `body`, or raises ValidationFailed naming
    the reference."""

    async def pin(self, ref: str) -> Any: ...


async def pin_skills(spec: WorkflowSpec, source: SkillSource) -> WorkflowSpec:
    """`spec` with every skill reference of its task steps, and of its spawn steps'
    children (recursively), replaced by its pinned version. A reference the source refuses
    is a 400 naming the field (`steps[1].workflows[0].steps[0].skills[1]`) and the
    reference. Each distinct reference is looked up once."""
    pinned: dict[str, dict[str, Any]] = {}

    async def pin(ref: str, where: str) -> dict[str, Any]:
        if ref not in pinned:
            try:
                skill = await source.pin(ref)
            except ValidationFailed as exc:
                error = _bad(where, exc.message)
                # Keep what the source says beyond the message (the authors of an
                # ambiguous name).
                error.extra.update({k: v for k, v in exc.extra.items() if k != "fields"})
                raise error from exc
            pinned[ref] = {
                "name": skill.name,
                "author": skill.author,
                "version": int(skill.version),
                "body": skill.body,
            }
        return dict(pinned[ref])

    async def pin_all(skills: Any, where: str) -> list[Any]:
        return [
            await pin(ref, f"{where}[{k}]") if isinstance(ref, str) else ref
            for k, ref in enumerate(skills)
        ]

    async def raw_steps(steps: Any, where: str) -> Any:
        """Steps as stored in a spawn step's `workflows` (dicts), pinned."""
        if not isinstance(steps, list):
            return steps
        out: list[Any] = []
        for i, step in enumerate(steps):
            if isinstance(step, dict):
                step = dict(step)
                at = f"{where}steps[{i}]"
                if isinstance(step.get("skills"), list):
                    step["skills"] = await pin_all(step["skills"], f"{at}.skills")
                if isinstance(step.get("workflows"), list):
                    step["workflows"] = await children(step["workflows"], at)
            out.append(step)
        return out

    async def children(workflows: Any, at: str) -> list[Any]:
        out: list[Any] = []
        for j, child in enumerate(workflows):
            if isinstance(child, dict) and "steps" in child:
                child = {**child, "steps": await raw_steps(child["steps"], f"{at}.workflows[{j}].")}
            out.append(child)
        return out

    steps: list[StepSpec] = []
    for i, step in enumerate(spec.steps):
        at = f"steps[{i}]"
        changes: dict[str, Any] = {}
        if step.skills:
            changes["skills"] = tuple(await pin_all(step.skills, f"{at}.skills"))
        if step.workflows:
            changes["workflows"] = tuple(await children(list(step.workflows), at))
        steps.append(replace(step, **changes) if changes else step)
    return replace(spec, steps=tuple(steps))
