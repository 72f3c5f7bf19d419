"""Tool policies: which tools an agent may call, and which only with a person's approval
(`ask`). Admins set the global rules, a user sets their own; a user's rules can narrow what
the global rules allow but never loosen them (a global deny or ask stands). `Policy.decide`
runs on every tool call, so it is a walk over two short tuples with the compiled globs
cached."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.errors import ValidationFailed
from orchestrator.tools._model import STRICTNESS, Decision, Rule

__all__ = ["MAX_RULES", "Policy", "parse_rules"]

MAX_RULES = 256
_TOOL_GLOB = re.compile(r"[A-Za-z0-9_*?.\-\[\]]{1,200}")
_ACTIONS = ("allow", "deny", "ask")
_KEYS = ("tool", "action")


def _bad(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"{field}: {message}", extra={"fields": [{"field": field, "message": message}]}
    )


def parse_rules(raw: Any, field: str = "rules") -> tuple[Rule, ...]:
    """`raw` (a request's `rules`) as rules, in order; ValidationFailed names the first bad
    field (`rules[3].tool`)."""
    if not isinstance(raw, list):
        raise _bad(field, "must be a list of {tool, action} objects")
    if len(raw) > MAX_RULES:
        raise _bad(field, f"at most {MAX_RULES} rules")
    rules: list[Rule] = []
    for i, item in enumerate(raw):
        at = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(at, "must be an object {tool, action}")
        for key in item:
            if key not in _KEYS:
                raise _bad(f"{at}.{key}", "unknown field (a rule has tool and action)")
        tool = item.get("tool")
        if tool is None:
            raise _bad(f"{at}.tool", "required")
        if not isinstance(tool, str) or not _TOOL_GLOB.fullmatch(tool):
            raise _bad(
                f"{at}.tool",
                "a tool name or glob: 1-200 characters of A-Z a-z 0-9 _ - . * ? [ ]",
            )
        action = item.get("action")
        if action is None:
            raise _bad(f"{at}.action", "required")
        if action not in _ACTIONS:
            raise _bad(f"{at}.action", "must be allow, deny or ask")
        rules.append(Rule(tool=tool, action=action))
    return tuple(rules)


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str) -> Callable[[str], re.Match[str] | None]:
    # fnmatch.fnmatchcase's own semantics (case-sensitive, `*` matches across `_`), compiled once.
    return re.compile(fnmatch.translate(pattern)).match


def _first_match(rules: tuple[Rule, ...], tool: str) -> Rule | None:
    for rule in rules:
        if _glob(rule.tool)(tool) is not None:
            return rule
    return None


def _verdict(rule: Rule, scope: Literal["global", "user"]) -> Decision:
    return Decision(rule.action != "deny", scope, rule, needs_approval=rule.action == "ask")


@dataclass(frozen=True, slots=True)
class Policy:
    """The global rules and one user's rules.

    Within a scope, the FIRST rule whose glob matches the tool name (`fnmatch.fnmatchcase`:
    case-sensitive, `*`, `?`, `[...]`) gives that scope's verdict: `allow`, `ask` or `deny`;
    later rules of the scope are not consulted. A scope with no matching rule says allow.
    The call gets the STRICTER of the two verdicts (deny > ask > allow):

    1. a global deny: denied (`Decision(False, "global", rule)`), whatever the user's say;
    2. else the user's verdict, if one of their rules matches and is at least as strict as
       the global one: deny -> `Decision(False, "user", rule)`, ask -> `Decision(True,
       "user", rule, needs_approval=True)`, allow -> `Decision(True, "user", rule)`;
    3. else the global verdict, if a global rule matches (allow or ask);
    4. else no rule matches: allowed, `Decision(True)`.

    So a user's rule can deny or ask for what the global rules allow, and deny what they
    ask for, but cannot allow what they deny or ask for. On a tie the user's rule is
    reported.
    """

    global_rules: tuple[Rule, ...] = ()
    user_rules: tuple[Rule, ...] = ()

    def decide(self, tool: str) -> Decision:
        global_rule = _first_match(self.global_rules, tool)
        if global_rule is not None and global_rule.action == "deny":
            return Decision(False, "global", global_rule)
        user_rule = _first_match(self.user_rules, tool)
        floor = STRICTNESS[global_rule.action] if global_rule is not None else 0
        if user_rule is not None and STRICTNESS[user_rule.action] >= floor:
            return _verdict(user_rule, "user")
        if global_rule is not None:
            return _verdict(global_rule, "global")
        return Decision(True)
