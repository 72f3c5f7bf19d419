"""From a request body (inline or template) to a checked `WorkflowSpec`, children included:
templates are looked up (the user's own, else a shared one) and filled; every spawn step's
children are resolved too, so a bad child is a 400 at creation, not a failure later."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from orchestrator.errors import NotFound, ValidationFailed
from orchestrator.workflows._spec import WorkflowSpec, fill_template

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
    for i, step in enumerate(spec.steps):
        for j, child in enumerate(step.workflows):
            if depth + 1 >= MAX_DEPTH:
                raise ValidationFailed(
                    f"{where}steps[{i}].workflows: trees are at most {MAX_DEPTH} levels deep"
                )
            await resolve_request(
                templates,
                child,
                user_uuid,
                where=f"{where}steps[{i}].workflows[{j}].",
                depth=depth + 1,
            )
    return spec


async def resolve_child(
    templates: TemplateSource, child: Mapping[str, Any], user_uuid: str, label: str
) -> WorkflowSpec:
    return await resolve_request(templates, child, user_uuid, where=f"{label}.")
