"""What a workflow says about asking people (issue 32), checked on the way in (400 naming the
field): approval steps, `notify`, `approval_timeout_s`, `approvers`.

- An approval step, `{name, type: "approval", prompt, approvers?, approval_timeout_s?,
  notify?}` (and `condition`, `compensate` as any step), asks `prompt` (its `{{step.result}}`
  references filled when it runs) and waits, holding nothing, for a decision: approved, the
  workflow goes on (the step's result says who approved it, with their note); rejected or
  expired, the step fails and compensation runs (never retried: a person said no).
- `approvers`: user ids who decide besides admins (default: the workflow's owner only).
- `approval_timeout_s` (approval steps, and task steps for the tool calls they ask about):
  seconds until an undecided question expires (default: the `intervention_timeout_s`
  setting).
- `notify: {channel_id}` on the workflow or on a step (the step's wins): the channel the
  question is posted to. The channel must be one the creator can see: the API checks it at
  creation (`notify_fields`), since the spec parser knows no channels.
"""

from __future__ import annotations

from typing import Any

from orchestrator.workflows._invalid import _bad

__all__ = [
    "APPROVAL_FIELDS",
    "MAX_APPROVAL_TIMEOUT_S",
    "MAX_APPROVERS",
    "notify_fields",
    "parse_approval_timeout",
    "parse_approvers",
    "parse_notify",
]

# The fields an approval step may have (a task's `tools`, `model`, ... mean nothing there;
# `mode` only because a stored spec names every step's).
APPROVAL_FIELDS = frozenset(
    {
        "name",
        "type",
        "mode",
        "prompt",
        "approvers",
        "approval_timeout_s",
        "notify",
        "condition",
        "compensate",
    }
)
MAX_APPROVERS = 50
MAX_APPROVAL_TIMEOUT_S = 2_592_000  # 30 days, as intervention_timeout_s


def parse_notify(raw: Any, where: str) -> str | None:
    """`{channel_id}`: the channel's id (None when not given)."""
    if raw is None:
        return None
    at = f"{where}notify" if not where or where.endswith(".") else f"{where}.notify"
    if not isinstance(raw, dict):
        raise _bad(at, "an object {channel_id}")
    for key in raw:
        if key != "channel_id":
            raise _bad(f"{at}.{key}", "unknown field (channel_id)")
    channel = raw.get("channel_id")
    if not isinstance(channel, str) or not channel or len(channel) > 200:
        raise _bad(f"{at}.channel_id", "required: a channel's id (GET /channels)")
    return channel


def parse_approvers(raw: Any, where: str, kind: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    at = f"{where}.approvers"
    if kind != "approval":
        raise _bad(at, "only approval steps (type: approval) have approvers")
    if (
        not isinstance(raw, list)
        or not raw
        or len(raw) > MAX_APPROVERS
        or not all(isinstance(u, str) and u and len(u) <= 200 for u in raw)
    ):
        raise _bad(at, f"an array of 1 to {MAX_APPROVERS} user ids")
    return tuple(dict.fromkeys(raw))


def parse_approval_timeout(raw: Any, where: str, kind: str) -> int | None:
    if raw is None:
        return None
    at = f"{where}.approval_timeout_s"
    if kind not in ("task", "approval"):
        raise _bad(at, "only task and approval steps wait for a person")
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _bad(at, f"whole seconds, from 1 to {MAX_APPROVAL_TIMEOUT_S}")
    if not 1 <= raw <= MAX_APPROVAL_TIMEOUT_S:
        raise _bad(at, f"from 1 to {MAX_APPROVAL_TIMEOUT_S} seconds, not {raw}")
    return raw


def check_approval_step(raw: dict[str, Any], where: str) -> None:
    """An approval step has only its fields, and a prompt (the question)."""
    for key in raw:
        if key not in APPROVAL_FIELDS:
            raise _bad(f"{where}.{key}", "not a field of an approval step")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _bad(f"{where}.prompt", "required for an approval step: the question to ask")


def notify_fields(spec: Any, where: str = "") -> list[tuple[str, str]]:
    """`(field, channel id)` of every `notify` in a workflow tree (a `WorkflowSpec`; its
    spawn steps' children resolved inline, as dicts), for the API to check the channels."""
    found: list[tuple[str, str]] = []
    data = spec if isinstance(spec, dict) else spec.to_json()
    channel = (data.get("notify") or {}).get("channel_id")
    if isinstance(channel, str):
        found.append((f"{where}notify.channel_id", channel))
    for i, step in enumerate(data.get("steps") or ()):
        if not isinstance(step, dict):
            continue
        at = f"{where}steps[{i}]"
        channel = (step.get("notify") or {}).get("channel_id")
        if isinstance(channel, str):
            found.append((f"{at}.notify.channel_id", channel))
        for j, child in enumerate(step.get("workflows") or ()):
            if isinstance(child, dict):
                found.extend(notify_fields(child, f"{at}.workflows[{j}]."))
    return found
