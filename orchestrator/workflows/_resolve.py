"""From a request body (inline or template) to a checked `WorkflowSpec`, children included:
templates are looked up (the user's own, else a shared one) and filled; every spawn step's
children are resolved too, so a bad child is a 400 at creation, not a failure later.

Templates can spawn templates (`bomb2` spawns 50 `bomb1`, each spawning 50 leaves: 2,551
workflows from a 113-byte request, 127,551 a level further). So, at admission (`limits`
given), the tree is counted while it is resolved, depth first, and resolution stops at the
first limit passed, with a 400 naming its setting: nesting depth (`workflow_max_depth`),
descendants of the root (`workflow_max_descendants`), templates filled
(`workflow_max_template_expansions`) and characters of text (`workflow_max_spec_chars`,
variables filled: a variable used many times multiplies its value). Nothing past the limit
is looked up or built. Each template is read once per request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from orchestrator.errors import NotFound
from orchestrator.workflows._spec import SpecLimits, StepSpec, WorkflowSpec, _bad, fill_template


class TemplateSource(Protocol):
    async def get_template(self, name: str, user_uuid: str) -> dict[str, Any] | None: ...


@dataclass
class _Tally:
    """What one request has resolved so far, against its limits (None: a spec admitted
    before, resolved again by its spawn step: not counted)."""

    limits: SpecLimits | None
    descendants: int = 0
    templates: int = 0
    chars: int = 0
    found: dict[str, dict[str, Any] | None] = field(default_factory=dict)


async def resolve_request(
    templates: TemplateSource,
    body: Mapping[str, Any],
    user_uuid: str,
    *,
    limits: SpecLimits | None = None,
    where: str = "",
) -> WorkflowSpec:
    """The checked spec of `body`, children resolved inline. `limits`: the admission
    limits (a 400 naming the setting past one); None for a spec that was admitted already."""
    return await _resolve(templates, body, user_uuid, _Tally(limits), where, 0)


async def _resolve(
    templates: TemplateSource,
    body: Mapping[str, Any],
    user_uuid: str,
    tally: _Tally,
    where: str,
    depth: int,
) -> WorkflowSpec:
    limits = tally.limits
    template = body.get("template")
    variables = body.get("variables")
    if variables is not None and not isinstance(variables, dict):
        raise _bad(f"{where}variables", "an object")
    room = limits.max_chars - tally.chars if limits is not None else None
    if template is not None:
        if body.get("steps") is not None:
            raise _bad(f"{where}steps", "give either steps or template, not both")
        if not isinstance(template, str) or not template:
            raise _bad(f"{where}template", "a template name")
        tally.templates += 1
        if limits is not None and tally.templates > limits.max_templates:
            raise _bad(
                f"{where}template",
                f"more than {limits.max_templates} templates filled for one request"
                " (workflow_max_template_expansions)",
                "workflow_max_template_expansions",
            )
        if template not in tally.found:
            tally.found[template] = await templates.get_template(template, user_uuid)
        found = tally.found[template]
        if found is None:
            raise NotFound(f"{where}template: no template named {template!r}")
        steps = fill_template(
            found["steps"], variables or {}, f"template {template}", max_chars=room
        )
        name = body.get("name") or template
    else:
        steps = body.get("steps")
        if variables:
            steps = fill_template(steps, variables, max_chars=room)
        name = body.get("name")
    spec = WorkflowSpec.parse(
        name,
        steps,
        model=body.get("model"),
        where=where,
        limits=limits,
        notify=body.get("notify"),
    )
    if limits is not None:
        tally.chars += len(spec.name) + _own_chars(steps)
        if tally.chars > limits.max_chars:
            raise _bad(
                f"{where}steps",
                f"the workflow tree holds more than {limits.max_chars} characters"
                " (workflow_max_spec_chars)",
                "workflow_max_spec_chars",
            )
    steps_out: list[StepSpec] = []
    for i, step in enumerate(spec.steps):
        resolved: list[dict[str, Any]] = []
        for j, child in enumerate(step.workflows):
            at = f"{where}steps[{i}].workflows[{j}]"
            if limits is not None:
                if depth + 1 >= limits.max_depth:
                    raise _bad(
                        f"{where}steps[{i}].workflows",
                        f"trees are at most {limits.max_depth} levels deep (workflow_max_depth)",
                        "workflow_max_depth",
                    )
                tally.descendants += 1
                if tally.descendants > limits.max_descendants:
                    raise _bad(
                        at,
                        f"more than {limits.max_descendants} workflows under one workflow"
                        " (workflow_max_descendants)",
                        "workflow_max_descendants",
                    )
            done = await _resolve(templates, child, user_uuid, tally, f"{at}.", depth + 1)
            resolved.append(done.to_json())
        # Children are kept resolved (inline): a template edited or deleted after this
        # workflow was created does not change what its spawn steps start.
        steps_out.append(replace(step, workflows=tuple(resolved)) if resolved else step)
    return replace(spec, steps=tuple(steps_out))


def _own_chars(steps: Any) -> int:
    """Characters of text in a workflow's steps, its children's definitions left out (they
    are counted as they are resolved)."""
    if not isinstance(steps, list):
        return 0
    return sum(
        _chars(value)
        for step in steps
        if isinstance(step, dict)
        for key, value in step.items()
        if key != "workflows"
    )


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 8


def tree_size(spec: WorkflowSpec) -> int:
    """Workflows that `spec` starts in all: itself and every descendant."""

    def below(steps: Any) -> int:
        return sum(
            1 + below(child.get("steps"))
            for step in steps or ()
            if isinstance(step, dict)
            for child in step.get("workflows") or ()
            if isinstance(child, dict)
        )

    return 1 + sum(1 + below(child.get("steps")) for s in spec.steps for child in s.workflows)


async def resolve_child(
    templates: TemplateSource, child: Mapping[str, Any], user_uuid: str, label: str
) -> WorkflowSpec:
    """A spawn step's child, admitted with its root: not held to the limits again."""
    return await resolve_request(templates, child, user_uuid, where=f"{label}.")


def tool_steps(
    spec: WorkflowSpec, default_model: str | None
) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """`(field, model, names)` of every task step in the tree (children resolved inline, as
    `resolve_request` leaves them) that names tools: the tools it names and the model it
    would run on (None: none yet). A child's steps fall back to the child's own model, then
    `default_model` (not to the parent's: a child runs as its own workflow). The tree was
    admitted within the spec limits, so the walk is bounded by them."""
    found: list[tuple[str, str | None, tuple[str, ...]]] = []

    def walk(steps: Any, model: str | None, where: str) -> None:
        for i, step in enumerate(steps if isinstance(steps, list | tuple) else ()):
            raw = step.to_json() if isinstance(step, StepSpec) else step
            if not isinstance(raw, dict):
                continue
            at = f"{where}steps[{i}]"
            names = tuple(n for n in raw.get("tools") or () if isinstance(n, str))
            if raw.get("type", "task") == "task" and names:
                found.append((f"{at}.tools", raw.get("model") or model or default_model, names))
            for j, child in enumerate(raw.get("workflows") or ()):
                if isinstance(child, dict):
                    walk(child.get("steps"), child.get("model"), f"{at}.workflows[{j}].")

    walk(spec.steps, spec.model, "")
    return found
