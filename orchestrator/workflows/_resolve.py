"""From a request body (inline or template) to a checked `WorkflowSpec`, children included:
templates are looked up (the user's own, else a shared one) and filled; every spawn step's
children are resolved too, so a bad child is a 400 at creation, not a failure later."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from orchestrator.errors import NotFound, ValidationFailed
from orchestrator.workflows._spec import StepSpec, WorkflowSpec, fill_template

MAX_DEPTH = 5


class TemplateSource(Protocol):
    async def get_template(self, name: str, user_uuid: str) -> dict[str, Any] | None: ...


async def resolve_request(
    templates: TemplateSource,
    body: Mapping[str, Any],
    user_uuid: str,
    *,
    where: str = "",
    depth: int = 0,
) -> WorkflowSpec:
    template = body.get("template")
    variables = body.get("variables")
    if variables is not None and not isinstance(variables, dict):
        raise ValidationFailed(f"{where}variables: an object", extra={"field": f"{where}variables"})
    if template is not None:
        if body.get("steps") is not None:
            raise ValidationFailed(
                f"{where}steps: give either steps or template, not both",
                extra={"field": f"{where}steps"},
            )
        if not isinstance(template, str) or not template:
            raise ValidationFailed(f"{where}template: a template name")
        found = await templates.get_template(template, user_uuid)
        if found is None:
            raise NotFound(f"{where}template: no template named {template!r}")
        steps = fill_template(found["steps"], variables or {}, f"template {template}")
        name = body.get("name") or template
    else:
        steps = body.get("steps")
        if variables:
            steps = fill_template(steps, variables)
        name = body.get("name")
    spec = WorkflowSpec.parse(name, steps, model=body.get("model"), where=where)
    steps_out: list[StepSpec] = []
    for i, step in enumerate(spec.steps):
        resolved: list[dict[str, Any]] = []
        for j, child in enumerate(step.workflows):
            if depth + 1 >= MAX_DEPTH:
                raise ValidationFailed(
                    f"{where}steps[{i}].workflows: trees are at most {MAX_DEPTH} levels deep"
                )
            done = await resolve_request(
                templates,
                child,
                user_uuid,
                where=f"{where}steps[{i}].workflows[{j}].",
                depth=depth + 1,
            )
            resolved.append(done.to_json())
        # Children are kept resolved (inline): a template edited or deleted after this
        # workflow was created does not change what its spawn steps start.
        steps_out.append(replace(step, workflows=tuple(resolved)) if resolved else step)
    return replace(spec, steps=tuple(steps_out))


async def resolve_child(
    templates: TemplateSource, child: Mapping[str, Any], user_uuid: str, label: str
) -> WorkflowSpec:
    return await resolve_request(templates, child, user_uuid, where=f"{label}.")
