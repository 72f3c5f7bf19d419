"""What a workflow is made of, checked on the way in (400 naming the field).

Steps (SPEC part 2): `name` (unique), `prompt` (task steps), `mode`, `tools`, `timeout`
(seconds), `condition`, `type` (`branch`, `spawn`; omitted for a task step), `conditions`
(branch steps), `workflows` (spawn steps), `compensate` (a prompt run as an agent task when
the step is compensated, or `{notify: text}` recorded as an event), `skills` (task steps:
marketplace skill references, `name[@<version>]` or `<author>/name[@<version>]`, replaced by
the version they name, `{name, author, version, body}`, when the workflow is created: see
_skills.py), `retry` (task steps: `{max_attempts, backoff_ms, max_backoff_ms}`, _retry.py).
Asking people (issue 32, _approval.py): `type: approval` steps (`prompt`, `approvers`),
`approval_timeout_s` and `notify: {channel_id}` (on steps and on the workflow). Agent teams
(issue 33, orchestrator/teams): a task step with `mode: coordinate` may carry `team:
{max_members}` (1-8, default 4); on any other step `team` is a 400.

Placeholders. `{{var}}` (no dot) is a template variable, filled when the workflow is created
from `variables`; a variable without a value is a 400. `{{<step>.result}}` and
`{{<step>.status}}` refer to earlier steps and are filled when a step runs (prompts) or
evaluated (conditions, branch `match`); they must name a step of the workflow.

Conditions: a small expression language, parsed here (no eval):

    expr    := or
    or      := and ("or" and)*
    and     := unary ("and" unary)*
    unary   := "not" unary | compare
    compare := operand [op operand]    op: == != contains matches < <= > >=
    operand := "string" | 'string' | number | true | false | {{step.result}} | {{step.status}}
               | "(" expr ")"

`contains` is a substring test, `matches` a regular expression search, `<`... compare numbers
(a side that is not a number makes the comparison false). A lone operand is true when it is
a non-empty string other than "false" and "0". A step that has not run has result "" and
its status (pending, skipped).

Branch steps: `conditions` entries are tried in declared order; an entry with `match` (a
`{{<step>.result}}` reference) and `pattern` (a regular expression, searched) is chosen when
the pattern is found in the value (without `pattern`: when the value is non-empty); the
entry without `match` is the fallback, chosen when no other matched. `then` names the step
to run next; the run jumps there (forward: the steps jumped over are skipped; backward: those
steps run again, within `workflow_max_steps`). No match and no fallback: the workflow fails.

Spawn steps: `workflows` lists child workflows, each `{name, steps}` or `{template,
variables}`; they start in parallel with this workflow as their parent, and the step's
result is JSON `{"children": [{"id", "name", "status", "result"}]}` (a child's result is its
last completed step's result). A child that fails or is cancelled fails the step.

Limits (`SpecLimits`, from the settings): what a tenant's request may make the service hold
and run is checked when it is admitted (POST /workflows, POST /workflows/templates), each a
400 naming its setting: steps per workflow, children per spawn step, RE2 program size of
each pattern, and (in _resolve) the tree's depth, descendants, template expansions and
characters. Specs read back from the database are not held to them (the settings may have
changed since they were admitted).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.workflows._approval import (
    check_approval_step,
    parse_approval_timeout,
    parse_approvers,
    parse_notify,
)
from orchestrator.workflows._conditions import MAX_CONDITION_DEPTH as MAX_CONDITION_DEPTH
from orchestrator.workflows._conditions import REF as REF
from orchestrator.workflows._conditions import Condition as Condition
from orchestrator.workflows._conditions import Lookup as Lookup
from orchestrator.workflows._conditions import evaluate_condition as evaluate_condition
from orchestrator.workflows._conditions import truthy
from orchestrator.workflows._invalid import _bad as _bad  # _resolve.py imports it from here
from orchestrator.workflows._patterns import PatternError, Search, check_pattern, pattern_found
from orchestrator.workflows._retry import NO_RETRY, RetryPolicy, parse_retry

# A step's skill references are parsed in _skills.py (its two limits, defined here
# before, are re-exported).
from orchestrator.workflows._skills import PINNED_SKILL as PINNED_SKILL
from orchestrator.workflows._skills import SKILL_REF_MAX as SKILL_REF_MAX
from orchestrator.workflows._skills import parse_skills

if TYPE_CHECKING:
    from orchestrator.config import Settings

MODES = ("build", "plan", "explore", "review", "general", "coordinate")
STEP_TYPES = ("task", "branch", "spawn", "approval")
# A step name: any non-empty string of at most 128 characters without control characters
# (SPEC part 1); references name it exactly (`{{My step.result}}`, _conditions.REF).
STEP_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,128}")
STEP_NAME_MAX = 128
VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*\}\}")
MAX_TEXT = 100_000
DEFAULT_TEAM_MEMBERS, MAX_TEAM_MEMBERS = 4, 8  # a coordinate step's `team.max_members`


@dataclass(frozen=True, slots=True)
class SpecLimits:
    """What one request may make the service hold and run, checked at admission; each
    field is the setting named in its 400 (see Settings for the meaning and default)."""

    max_steps: int  # workflow_max_declared_steps
    max_children: int  # workflow_max_children
    max_depth: int  # workflow_max_depth
    max_descendants: int  # workflow_max_descendants
    max_templates: int  # workflow_max_template_expansions
    max_chars: int  # workflow_max_spec_chars
    max_pattern_program: int  # workflow_pattern_max_program
    max_skills: int = 8  # step_max_skills
    retry: RetryPolicy = NO_RETRY  # step_retry_*: a task step's default policy

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> SpecLimits:
        """The configured limits; without settings, their defaults."""
        if settings is None:
            from orchestrator.config import Settings

            settings = Settings.model_construct()  # the defaults, no environment read
        return cls(
            max_steps=settings.workflow_max_declared_steps,
            max_children=settings.workflow_max_children,
            max_depth=settings.workflow_max_depth,
            max_descendants=settings.workflow_max_descendants,
            max_templates=settings.workflow_max_template_expansions,
            max_chars=settings.workflow_max_spec_chars,
            max_pattern_program=settings.workflow_pattern_max_program,
            max_skills=settings.step_max_skills,
            retry=RetryPolicy(
                settings.step_retry_max_attempts,
                settings.step_retry_backoff_ms,
                settings.step_retry_max_backoff_ms,
            ),
        )


@dataclass(frozen=True, slots=True)
class BranchRule:
    name: str
    then: str
    match: str | None = None  # the referenced step's name
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class StepSpec:
    name: str
    type: str = "task"
    prompt: str | None = None
    mode: str = "general"
    tools: tuple[str, ...] | None = None
    timeout: float | None = None
    condition: str | None = None
    conditions: tuple[BranchRule, ...] = ()
    workflows: tuple[dict[str, Any], ...] = ()  # spawn children, as given
    compensate: str | dict[str, Any] | None = None
    model: str | None = None
    # Skill references as given (str); once the workflow is created, pinned versions
    # {name, author, version, body} (dicts, as stored).
    skills: tuple[Any, ...] = ()
    retry: RetryPolicy = NO_RETRY  # as admitted (_retry.py)
    # Asking people (issue 32, _approval.py).
    approvers: tuple[str, ...] | None = None  # approval steps: who decides (None: owner)
    approval_timeout_s: int | None = None  # None: settings.intervention_timeout_s
    notify: str | None = None  # a channel id; None: the workflow's
    team: int | None = None  # a coordinate step's team: its max_members (issue 33)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "mode": self.mode}
        if self.retry.retries:
            out["retry"] = self.retry.to_json()
        if self.approvers is not None:
            out["approvers"] = list(self.approvers)
        if self.approval_timeout_s is not None:
            out["approval_timeout_s"] = self.approval_timeout_s
        if self.notify is not None:
            out["notify"] = {"channel_id": self.notify}
        if self.team is not None:
            out["team"] = {"max_members": self.team}
        for key in ("prompt", "timeout", "condition", "compensate", "model"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tools is not None:
            out["tools"] = list(self.tools)
        if self.conditions:
            out["conditions"] = {
                r.name: {
                    k: v
                    for k, v in (
                        ("match", f"{{{{{r.match}.result}}}}" if r.match else None),
                        ("pattern", r.pattern),
                        ("then", r.then),
                    )
                    if v is not None
                }
                for r in self.conditions
            }
        if self.workflows:
            out["workflows"] = list(self.workflows)
        if self.skills:
            out["skills"] = [dict(s) if isinstance(s, dict) else s for s in self.skills]
        return out


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    name: str
    steps: tuple[StepSpec, ...]
    model: str | None = None
    step_index: dict[str, int] = field(default_factory=dict, compare=False)
    notify: str | None = None  # the channel questions go to, unless a step names its own

    @classmethod
    def parse(
        cls,
        name: Any,
        steps: Any,
        *,
        model: Any = None,
        where: str = "",
        limits: SpecLimits | None = None,
        notify: Any = None,
    ) -> WorkflowSpec:
        """Check a workflow given inline (after template filling); with `limits` (admission),
        also its size limits."""
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise _bad(f"{where}name", "a non-empty string of at most 200 characters")
        if model is not None and (not isinstance(model, str) or not model):
            raise _bad(f"{where}model", "a model name")
        if not isinstance(steps, list) or not steps:
            raise _bad(f"{where}steps", "a non-empty array of steps")
        if limits is not None and len(steps) > limits.max_steps:
            raise _bad(
                f"{where}steps",
                f"{len(steps)} steps, at most {limits.max_steps} (workflow_max_declared_steps)",
                "workflow_max_declared_steps",
            )
        names: list[str] = []
        for i, raw in enumerate(steps):
            step_name = raw.get("name") if isinstance(raw, dict) else None
            if not isinstance(step_name, str) or not STEP_NAME.fullmatch(step_name):
                raise _bad(
                    f"{where}steps[{i}].name",
                    f"required: a non-empty string of at most {STEP_NAME_MAX} characters,"
                    " without control characters",
                )
            if step_name in names:
                raise _bad(f"{where}steps[{i}].name", f"duplicate step name {step_name!r}")
            names.append(step_name)
        parsed = tuple(
            _parse_step(raw, f"{where}steps[{i}]", names, i, limits) for i, raw in enumerate(steps)
        )
        channel = parse_notify(notify, where)
        return cls(name.strip(), parsed, model, {s.name: i for i, s in enumerate(parsed)}, channel)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "steps": [s.to_json() for s in self.steps]}
        if self.model:
            out["model"] = self.model
        if self.notify:
            out["notify"] = {"channel_id": self.notify}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkflowSpec:
        return cls.parse(
            data["name"], data["steps"], model=data.get("model"), notify=data.get("notify")
        )


def _parse_step(
    raw: Any, where: str, names: list[str], index: int, limits: SpecLimits | None
) -> StepSpec:
    assert isinstance(raw, dict)
    known = {
        "name",
        "prompt",
        "mode",
        "tools",
        "timeout",
        "condition",
        "type",
        "conditions",
        "workflows",
        "compensate",
        "model",
        "skills",
        "retry",
        "approvers",
        "approval_timeout_s",
        "notify",
        "team",
    }
    for key in raw:
        if key not in known:
            raise _bad(f"{where}.{key}", "unknown step field")
    kind = raw.get("type") or "task"
    if kind not in STEP_TYPES:
        raise _bad(f"{where}.type", "one of branch, spawn, approval (or omitted for a task step)")
    if kind == "approval":
        check_approval_step(raw, where)
    approvers = parse_approvers(raw.get("approvers"), where, kind)
    approval_timeout = parse_approval_timeout(raw.get("approval_timeout_s"), where, kind)
    notify = parse_notify(raw.get("notify"), where)
    if notify is not None and kind not in ("task", "approval"):
        raise _bad(f"{where}.notify", "only task and approval steps ask people")
    prompt = raw.get("prompt")
    if kind == "task":
        if not isinstance(prompt, str) or not prompt.strip():
            raise _bad(f"{where}.prompt", "required for a task step (a non-empty string)")
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > MAX_TEXT):
        raise _bad(f"{where}.prompt", f"a string of at most {MAX_TEXT} characters")
    if isinstance(prompt, str):
        _check_refs(prompt, f"{where}.prompt", names)
    mode = raw.get("mode") or "general"
    if mode not in MODES:
        raise _bad(f"{where}.mode", "one of " + ", ".join(MODES))
    tools = raw.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)
    ):
        raise _bad(f"{where}.tools", "an array of tool names")
    timeout = raw.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= 86_400
    ):
        raise _bad(f"{where}.timeout", "seconds, more than 0 and at most 86400")
    max_program = limits.max_pattern_program if limits is not None else None
    condition = raw.get("condition")
    if condition is not None:
        if not isinstance(condition, str) or not condition.strip():
            raise _bad(f"{where}.condition", "an expression (a non-empty string)")
        try:
            Condition(condition, names, max_program=max_program)
        except ValueError as exc:
            raise _bad(f"{where}.condition", str(exc), _limit_named(str(exc))) from exc
    rules: tuple[BranchRule, ...] = ()
    if kind == "branch":
        rules = _parse_rules(
            raw.get("conditions"), f"{where}.conditions", names, index, max_program
        )
    elif raw.get("conditions") is not None:
        raise _bad(f"{where}.conditions", "only branch steps (type: branch) have conditions")
    children: tuple[dict[str, Any], ...] = ()
    if kind == "spawn":
        given = raw.get("workflows")
        if not isinstance(given, list) or not given:
            raise _bad(f"{where}.workflows", "a non-empty array of child workflows")
        if limits is not None and len(given) > limits.max_children:
            raise _bad(
                f"{where}.workflows",
                f"{len(given)} child workflows, at most {limits.max_children}"
                " (workflow_max_children)",
                "workflow_max_children",
            )
        for j, child in enumerate(given):
            if not isinstance(child, dict) or not (
                ("steps" in child and "name" in child) or "template" in child
            ):
                raise _bad(f"{where}.workflows[{j}]", "{name, steps} or {template, variables}")
        children = tuple(given)
    elif raw.get("workflows") is not None:
        raise _bad(f"{where}.workflows", "only spawn steps (type: spawn) have workflows")
    compensate = raw.get("compensate")
    if compensate is not None:
        notify_ok = (
            isinstance(compensate, dict)
            and set(compensate) == {"notify"}
            and isinstance(compensate["notify"], str)
        )
        if not (isinstance(compensate, str) and compensate.strip()) and not notify_ok:
            raise _bad(f"{where}.compensate", "a prompt, or {notify: text}")
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise _bad(f"{where}.model", "a model name")
    skills: tuple[Any, ...] = ()
    if raw.get("skills") is not None:
        if kind != "task":
            raise _bad(f"{where}.skills", "only task steps have skills")
        skills = parse_skills(raw["skills"], f"{where}.skills", limits)
    team = _parse_team(raw.get("team"), where, kind, mode)
    default = limits.retry if limits is not None and kind == "task" else NO_RETRY
    retry = parse_retry(raw.get("retry"), where, kind, default)
    return StepSpec(
        name=raw["name"],
        type=kind,
        prompt=prompt,
        mode=mode,
        tools=tuple(tools) if tools is not None else None,
        timeout=float(timeout) if timeout is not None else None,
        condition=condition,
        conditions=rules,
        workflows=children,
        compensate=compensate,
        model=model,
        skills=skills,
        retry=retry,
        approvers=approvers,
        approval_timeout_s=approval_timeout,
        notify=notify,
        team=team,
    )


def _parse_team(raw: Any, where: str, kind: str, mode: str) -> int | None:
    """`team: {max_members}` of a coordinate task step: its max_members (None: no team)."""
    if raw is None:
        return None
    if kind != "task" or mode != "coordinate":
        raise _bad(f"{where}.team", "only a task step with mode coordinate has a team")
    if not isinstance(raw, dict):
        raise _bad(f"{where}.team", "an object {max_members}")
    for key in raw:
        if key != "max_members":
            raise _bad(f"{where}.team.{key}", "unknown team field")
    size = raw.get("max_members", DEFAULT_TEAM_MEMBERS)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_TEAM_MEMBERS:
        raise _bad(f"{where}.team.max_members", f"an integer from 1 to {MAX_TEAM_MEMBERS}")
    return size


def _parse_rules(
    raw: Any, where: str, names: list[str], index: int, max_program: int | None
) -> tuple[BranchRule, ...]:
    if not isinstance(raw, dict) or not raw:
        raise _bad(where, "a branch step needs a non-empty conditions object")
    rules = []
    fallbacks = 0
    for key, entry in raw.items():
        at = f"{where}.{key}"
        if not isinstance(entry, dict):
            raise _bad(at, "an object {match?, pattern?, then}")
        then = entry.get("then")
        if not isinstance(then, str) or then not in names:
            raise _bad(f"{at}.then", "the name of a step of this workflow")
        if then == names[index]:
            raise _bad(f"{at}.then", "a branch cannot jump to itself")
        match, pattern = entry.get("match"), entry.get("pattern")
        ref: str | None = None
        if match is not None:
            found = REF.fullmatch(match.strip()) if isinstance(match, str) else None
            if found is None or found.group(2) != "result":
                raise _bad(f"{at}.match", "a reference {{<step>.result}}")
            ref = found.group(1)
            if ref not in names:
                raise _bad(f"{at}.match", f"no step named {ref!r}")
        else:
            fallbacks += 1
        if pattern is not None:
            if not isinstance(pattern, str):
                raise _bad(f"{at}.pattern", "a regular expression")
            try:
                check_pattern(pattern, max_program)
            except PatternError as exc:
                raise _bad(f"{at}.pattern", str(exc), _limit_named(str(exc))) from exc
        for extra in set(entry) - {"match", "pattern", "then"}:
            raise _bad(f"{at}.{extra}", "unknown field")
        rules.append(BranchRule(str(key), then, ref, pattern))
    if fallbacks > 1:
        raise _bad(where, "at most one entry without match (the fallback)")
    return tuple(rules)


def _limit_named(message: str) -> str | None:
    return "workflow_pattern_max_program" if "(workflow_pattern_max_program)" in message else None


def _check_refs(text: str, where: str, names: list[str]) -> None:
    for found in REF.finditer(text):
        if found.group(1) not in names:
            raise _bad(where, f"{found.group(0)} names no step of this workflow")


# --- templates ------------------------------------------------------------------------------


def template_variables(value: Any) -> list[str]:
    """The `{{var}}` names used anywhere in a template's steps, sorted."""
    found: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, str):
            found.update(VAR.findall(v))
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)

    walk(value)
    return sorted(found)


def fill_template(
    value: Any,
    variables: Mapping[str, Any],
    where: str = "steps",
    *,
    max_chars: int | None = None,
) -> Any:
    """Fill `{{var}}` everywhere in `value` (strings inside dicts and lists); a variable with
    no value is a 400 naming it. Step references ({{step.result}}) are left for run time.
    With `max_chars`, the filled strings may hold that many characters in all: a variable
    used many times multiplies its value, so the size is counted before a string is built
    (400 naming workflow_max_spec_chars past it)."""
    rendered: dict[str, str] = {}
    total = 0

    def value_of(name: str, at: str) -> str:
        if name not in rendered:
            if name not in variables:
                raise _bad(f"variables.{name}", f"missing value for {{{{{name}}}}} in {at}")
            given = variables[name]
            rendered[name] = given if isinstance(given, str) else json.dumps(given)
        return rendered[name]

    def fill(text: str, at: str) -> str:
        nonlocal total
        found = list(VAR.finditer(text))
        total += len(text) + sum(len(value_of(m.group(1), at)) - len(m.group(0)) for m in found)
        if max_chars is not None and total > max_chars:
            raise _bad(
                "variables" if found else at,
                f"the filled template holds more than {max_chars} characters"
                " (workflow_max_spec_chars)",
                "workflow_max_spec_chars",
            )
        return VAR.sub(lambda m: rendered[m.group(1)], text) if found else text

    def walk(v: Any, at: str) -> Any:
        if isinstance(v, str):
            return fill(v, at)
        if isinstance(v, dict):
            return {k: walk(item, f"{at}.{k}") for k, item in v.items()}
        if isinstance(v, list):
            return [walk(item, f"{at}[{i}]") for i, item in enumerate(v)]
        return v

    return walk(value, where)


def fill_refs(text: str, lookup: Callable[[str, str], str]) -> str:
    """Replace `{{step.result}}` / `{{step.status}}` with what `lookup(step, attr)` gives."""
    return REF.sub(lambda m: lookup(m.group(1), m.group(2)), text)


def branch_uses_patterns(step: StepSpec) -> bool:
    return any(rule.pattern is not None for rule in step.conditions)


def choose_branch(
    step: StepSpec, lookup: Lookup, search: Search = pattern_found
) -> BranchRule | None:
    """The branch entry to follow: the first matching entry with `match`, else the
    fallback, else None. `search(pattern, text)` runs the patterns."""
    fallback = None
    for rule in step.conditions:
        if rule.match is None:
            fallback = fallback or rule
            continue
        value = lookup(rule.match, "result")
        if rule.pattern is None:
            if truthy(value):
                return rule
        elif search(rule.pattern, value):
            return rule
    return fallback
