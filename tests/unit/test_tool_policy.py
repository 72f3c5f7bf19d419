"""Tool policies (orchestrator/tools/_policy.py): the rules a request may hold, and which
rule decides a call: a global deny beats everything, then the user's first matching rule,
then a global allow, else allowed."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import ValidationFailed
from orchestrator.tools._model import Decision, Rule
from orchestrator.tools._policy import MAX_RULES, Policy, parse_rules


def _field(raw: Any, field: str = "rules") -> str:
    with pytest.raises(ValidationFailed) as caught:
        parse_rules(raw, field)
    fields = caught.value.extra["fields"]
    assert len(fields) == 1 and fields[0]["message"]
    assert caught.value.status_code == 400
    return str(fields[0]["field"])


def test_rules_are_parsed_in_order() -> None:
    rules = parse_rules(
        [
            {"tool": "mcp__github__*", "action": "deny"},
            {"tool": "http__weather", "action": "allow"},
            {"tool": "web_[a-z]?.x-y", "action": "allow"},
        ]
    )
    assert rules == (
        Rule("mcp__github__*", "deny"),
        Rule("http__weather", "allow"),
        Rule("web_[a-z]?.x-y", "allow"),
    )
    assert parse_rules([]) == ()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"tool": "x", "action": "allow"}, "rules"),  # not a list
        ("deny all", "rules"),
        ([{"tool": "x", "action": "allow"}] * (MAX_RULES + 1), "rules"),
        ([{"tool": "x", "action": "allow"}, "x"], "rules[1]"),
        ([{"action": "allow"}], "rules[0].tool"),
        ([{"tool": "x"}], "rules[0].action"),
        ([{"tool": "x", "action": "allow", "why": "because"}], "rules[0].why"),
        ([{"tool": "", "action": "allow"}], "rules[0].tool"),
        ([{"tool": "x" * 201, "action": "allow"}], "rules[0].tool"),
        ([{"tool": "a b", "action": "allow"}], "rules[0].tool"),
        ([{"tool": "a/b", "action": "allow"}], "rules[0].tool"),
        ([{"tool": 7, "action": "allow"}], "rules[0].tool"),
        ([{"tool": None, "action": "allow"}], "rules[0].tool"),
        ([{"tool": "x", "action": "Allow"}], "rules[0].action"),
        ([{"tool": "x", "action": "block"}], "rules[0].action"),
        (
            [{"tool": "a", "action": "allow"}] * 3 + [{"tool": "ok", "action": "maybe"}],
            "rules[3].action",
        ),
    ],
)
def test_bad_rules_name_their_field(raw: Any, field: str) -> None:
    assert _field(raw) == field


def test_the_field_prefix_is_the_callers() -> None:
    assert _field([{"tool": "x", "action": "no"}], "global_rules") == "global_rules[0].action"


def test_the_longest_tool_glob_is_accepted() -> None:
    assert parse_rules([{"tool": "x" * 200, "action": "deny"}])[0].tool == "x" * 200
    assert len(parse_rules([{"tool": "x", "action": "deny"}] * MAX_RULES)) == MAX_RULES


def test_no_rules_allow_everything() -> None:
    decision = Policy().decide("http__anything")
    assert decision == Decision(True)
    assert decision.reason == "allowed (no rule matches)"


def test_a_global_deny_beats_a_users_allow() -> None:
    deny = Rule("mcp__github__*", "deny")
    policy = Policy(global_rules=(deny,), user_rules=(Rule("mcp__github__create_issue", "allow"),))
    decision = policy.decide("mcp__github__create_issue")
    assert decision == Decision(False, "global", deny)
    assert "denied by the global policy rule 'mcp__github__*'" == decision.reason


def test_a_user_deny_narrows_a_global_allow() -> None:
    allow = Rule("mcp__*", "allow")
    deny = Rule("mcp__github__*", "deny")
    policy = Policy(global_rules=(allow,), user_rules=(deny,))
    assert policy.decide("mcp__github__list") == Decision(False, "user", deny)
    # Where the user's rules say nothing, the global allow decides.
    assert policy.decide("mcp__slack__post") == Decision(True, "global", allow)


def test_a_user_allow_is_reported_as_the_users() -> None:
    allow = Rule("http__*", "allow")
    assert Policy(user_rules=(allow,)).decide("http__weather") == Decision(True, "user", allow)


def test_the_first_matching_rule_of_a_scope_decides() -> None:
    early_allow = Rule("mcp__github__list_issues", "allow")
    broad_deny = Rule("mcp__github__*", "deny")
    user_first = Policy(user_rules=(early_allow, broad_deny))
    assert user_first.decide("mcp__github__list_issues") == Decision(True, "user", early_allow)
    assert user_first.decide("mcp__github__delete_repo") == Decision(False, "user", broad_deny)
    # Reversed, the broad deny comes first and wins for both.
    user_reversed = Policy(user_rules=(broad_deny, early_allow))
    assert user_reversed.decide("mcp__github__list_issues") == Decision(False, "user", broad_deny)
    # Globally too: a global allow listed before a matching global deny decides.
    global_first = Policy(global_rules=(early_allow, broad_deny))
    assert global_first.decide("mcp__github__list_issues") == Decision(True, "global", early_allow)
    assert global_first.decide("mcp__github__x") == Decision(False, "global", broad_deny)


def test_a_global_allow_that_matches_first_still_lets_a_user_deny() -> None:
    allow = Rule("*", "allow")
    deny = Rule("http__*", "deny")
    policy = Policy(global_rules=(allow, Rule("http__*", "deny")), user_rules=(deny,))
    # The global scope's verdict for http__x is its first match: allow; the user's deny decides.
    assert policy.decide("http__x") == Decision(False, "user", deny)


def test_globs_match_like_fnmatchcase() -> None:
    github = Policy(global_rules=(Rule("mcp__github__*", "deny"),))
    assert not github.decide("mcp__github__create_issue").allowed
    assert github.decide("mcp__gitlab__create_issue").allowed
    assert github.decide("MCP__GITHUB__create_issue").allowed  # case-sensitive
    assert github.decide("x_mcp__github__y").allowed  # anchored at both ends
    single = Policy(user_rules=(Rule("http__v?", "deny"),))
    assert not single.decide("http__v1").allowed
    assert single.decide("http__v12").allowed
    ranged = Policy(user_rules=(Rule("tool_[ab]", "deny"),))
    assert not ranged.decide("tool_a").allowed
    assert ranged.decide("tool_c").allowed
    dotted = Policy(user_rules=(Rule("a.b", "deny"),))
    assert dotted.decide("axb").allowed  # `.` is literal, not a regex wildcard
    assert not dotted.decide("a.b").allowed


def test_a_policy_is_a_frozen_value() -> None:
    policy = Policy(user_rules=(Rule("x", "deny"),))
    with pytest.raises(AttributeError):
        policy.user_rules = ()  # type: ignore[misc]
    assert policy == Policy(user_rules=(Rule("x", "deny"),))


# --- ask: a call that waits for a person's approval (issue 32) ------------------------------

ALLOW, ASK, DENY = "allow", "ask", "deny"


def test_ask_is_parsed_and_its_decision_needs_approval() -> None:
    assert parse_rules([{"tool": "http__pay", "action": "ask"}]) == (Rule("http__pay", "ask"),)
    ask = Rule("http__pay*", "ask")
    decision = Policy(user_rules=(ask,)).decide("http__payment")
    assert decision == Decision(True, "user", ask, needs_approval=True)
    assert decision.allowed and decision.needs_approval and decision.action == "ask"
    assert decision.reason == "needs approval by the user policy rule 'http__pay*'"
    assert Decision(True).action == "allow" and Decision(False).action == "deny"
    assert not Decision(True).needs_approval


def test_a_bad_action_names_all_three() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_rules([{"tool": "x", "action": "maybe"}])
    assert caught.value.extra["fields"][0]["message"] == "must be allow, deny or ask"


# (global action or None, user action or None) -> (action, scope reported). The stricter
# verdict wins (deny > ask > allow; no matching rule counts as allow); the user's on a tie.
PRECEDENCE = [
    ((None, None), ("allow", None)),
    ((None, ALLOW), ("allow", "user")),
    ((None, ASK), ("ask", "user")),
    ((None, DENY), ("deny", "user")),
    ((ALLOW, None), ("allow", "global")),
    ((ALLOW, ALLOW), ("allow", "user")),
    ((ALLOW, ASK), ("ask", "user")),  # a user's ask narrows a global allow
    ((ALLOW, DENY), ("deny", "user")),
    ((ASK, None), ("ask", "global")),
    ((ASK, ALLOW), ("ask", "global")),  # a user's allow cannot undo a global ask
    ((ASK, ASK), ("ask", "user")),
    ((ASK, DENY), ("deny", "user")),  # a user's deny beats a global ask
    ((DENY, None), ("deny", "global")),
    ((DENY, ALLOW), ("deny", "global")),
    ((DENY, ASK), ("deny", "global")),
    ((DENY, DENY), ("deny", "global")),
]


@pytest.mark.parametrize(("given", "expected"), PRECEDENCE)
def test_every_pair_of_verdicts(
    given: tuple[str | None, str | None], expected: tuple[str, str | None]
) -> None:
    global_action, user_action = given
    policy = Policy(
        global_rules=(Rule("http__*", global_action),) if global_action else (),  # type: ignore[arg-type]
        user_rules=(Rule("http__pay", user_action),) if user_action else (),  # type: ignore[arg-type]
    )
    decision = policy.decide("http__pay")
    action, scope = expected
    assert (decision.action, decision.scope) == (action, scope)
    assert decision.allowed == (action != "deny")
    assert decision.needs_approval == (action == "ask")
    if scope is not None:
        rules = policy.user_rules if scope == "user" else policy.global_rules
        assert decision.rule == rules[0]


def test_the_first_matching_rule_of_a_scope_decides_for_ask_too() -> None:
    ask = Rule("http__pay", "ask")
    allow_all = Rule("http__*", "allow")
    assert Policy(user_rules=(ask, allow_all)).decide("http__pay").needs_approval
    assert not Policy(user_rules=(allow_all, ask)).decide("http__pay").needs_approval
    # Globally: an earlier global allow hides a later global ask, so a user's allow stands.
    late_ask = Policy(global_rules=(allow_all, ask), user_rules=(Rule("http__pay", "allow"),))
    assert late_ask.decide("http__pay").action == "allow"
