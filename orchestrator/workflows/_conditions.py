"""Conditions: the small expression language of a step's `condition` (and the truthiness a
branch entry without `pattern` uses), parsed here without eval; the grammar is in _spec.py's
docstring. Kept apart from the spec's parsing so that each stays a module of its own size."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from orchestrator.workflows._patterns import Search, check_pattern, pattern_found

# `{{<step>.result}}` / `{{<step>.status}}`: a reference to an earlier step, its name
# written exactly as declared (spaces and any script included: `{{My step.result}}`). A name
# is any run of non-control characters that does not cross a `{{` or `}}`; the shortest one
# followed by `.result}}` / `.status}}` is taken, so a name may itself contain dots. Spaces
# after `{{` belong to the name (`{{ a.result }}` names ` a`); spaces before `}}` are allowed.
_REF_NAME = r"(?:(?!\{\{|\}\})[^\x00-\x1f\x7f-\x9f])+?"
_REF_END = r"\.(result|status) *\}\}"
REF = re.compile(r"\{\{(" + _REF_NAME + r")" + _REF_END)

__all__ = ["MAX_CONDITION_DEPTH", "REF", "Condition", "Lookup", "evaluate_condition", "truthy"]


# --- conditions -----------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<ref>\{\{(?:(?!\{\{|\}\})[^\x00-\x1f\x7f-\x9f])+?\.(?:result|status)\ *\}\})
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<num>-?\d+(?:\.\d+)?)
      | (?P<op>==|!=|<=|>=|<|>|\(|\))
      | (?P<word>[A-Za-z_]+)
    )""",
    re.VERBOSE,
)
_WORD_OPS = {"contains", "matches"}
_KEYWORDS = {"and", "or", "not", "true", "false"} | _WORD_OPS
_COMPARE = {"==", "!=", "<", "<=", ">", ">=", "contains", "matches"}

Lookup = Callable[[str, str], str]
MAX_CONDITION_DEPTH = 32  # parentheses and `not`s: the parser and evaluator recurse on them


class Condition:
    """A parsed condition; `evaluate(lookup)` with `lookup(step, "result"|"status")`.
    `max_program` (admission) bounds the RE2 program of each `matches` pattern."""

    def __init__(
        self, text: str, step_names: list[str] | None = None, *, max_program: int | None = None
    ) -> None:
        if len(text) > 2000:
            raise ValueError("condition too long (2000 characters at most)")
        self.text = text
        self._tokens = self._lex(text)
        self._pos = 0
        self._depth = 0
        self._names = step_names
        self._max_program = max_program
        self.uses_patterns = False  # any `matches`: evaluated off the shard's event loop
        self._tree = self._or()
        if self._pos != len(self._tokens):
            raise ValueError(f"unexpected {self._tokens[self._pos][1]!r}")

    @staticmethod
    def _lex(text: str) -> list[tuple[str, str]]:
        tokens, pos = [], 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            found = _TOKEN.match(text, pos)
            if found is None or found.end() == pos:
                raise ValueError(f"cannot read the condition at {text[pos : pos + 20]!r}")
            kind = found.lastgroup or ""
            value = found.group(kind)
            if kind == "word" and value not in _KEYWORDS:
                raise ValueError(f"unknown word {value!r} (strings are quoted)")
            tokens.append((kind, value))
            pos = found.end()
        if not tokens:
            raise ValueError("empty condition")
        return tokens

    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise ValueError("the condition ends too early")
        self._pos += 1
        return token

    def _or(self) -> Any:
        node = self._and()
        while self._peek() == ("word", "or"):
            self._take()
            node = ("or", node, self._and())
        return node

    def _and(self) -> Any:
        node = self._unary()
        while self._peek() == ("word", "and"):
            self._take()
            node = ("and", node, self._unary())
        return node

    def _nested(self) -> None:
        self._depth += 1
        if self._depth > MAX_CONDITION_DEPTH:
            raise ValueError(f"condition nested too deeply ({MAX_CONDITION_DEPTH} levels at most)")

    def _unary(self) -> Any:
        if self._peek() == ("word", "not"):
            self._take()
            self._nested()
            node = self._unary()
            self._depth -= 1
            return ("not", node)
        left = self._operand()
        token = self._peek()
        if token is not None and token[1] in _COMPARE:
            self._take()
            right = self._operand()
            if token[1] == "matches":
                if right[0] != "lit":
                    raise ValueError("matches takes a quoted regular expression")
                check_pattern(str(right[1]), self._max_program)  # PatternError: a ValueError
                self.uses_patterns = True
            return ("cmp", token[1], left, right)
        return ("truthy", left)

    def _operand(self) -> Any:
        kind, value = self._take()
        if kind == "op" and value == "(":
            self._nested()
            node = self._or()
            if self._take() != ("op", ")"):
                raise ValueError("missing )")
            self._depth -= 1
            return ("expr", node)
        if kind == "str":
            return ("lit", _unquote(value))
        if kind == "num":
            return ("lit", value)
        if kind == "word" and value in ("true", "false"):
            return ("lit", value)
        if kind == "ref":
            found = REF.fullmatch(value)
            assert found is not None
            step, attr = found.group(1), found.group(2)
            if self._names is not None and step not in self._names:
                raise ValueError(f"{value} names no step of this workflow")
            return ("ref", step, attr)
        raise ValueError(f"expected a value, got {value!r}")

    def evaluate(self, lookup: Lookup, search: Search = pattern_found) -> bool:
        """`search(pattern, text)` runs `matches` (a metered one in the engine)."""
        return bool(self._eval(self._tree, lookup, search))

    def _value(self, node: Any, lookup: Lookup, search: Search) -> Any:
        if node[0] == "lit":
            return node[1]
        if node[0] == "ref":
            return lookup(node[1], node[2])
        return self._eval(node[1], lookup, search)

    def _eval(self, node: Any, lookup: Lookup, search: Search) -> bool:
        op = node[0]
        if op == "or":
            return self._eval(node[1], lookup, search) or self._eval(node[2], lookup, search)
        if op == "and":
            return self._eval(node[1], lookup, search) and self._eval(node[2], lookup, search)
        if op == "not":
            return not self._eval(node[1], lookup, search)
        if op == "truthy":
            return _truthy(self._value(node[1], lookup, search))
        _, cmp, left_node, right_node = node
        left = self._value(left_node, lookup, search)
        right = self._value(right_node, lookup, search)
        if cmp == "==":
            return _text(left) == _text(right)
        if cmp == "!=":
            return _text(left) != _text(right)
        if cmp == "contains":
            return _text(right) in _text(left)
        if cmp == "matches":
            return search(_text(right), _text(left))
        a, b = _number(left), _number(right)
        if a is None or b is None:
            return False
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[cmp]


def _unquote(token: str) -> str:
    # Only quotes and backslashes are escapes: `\d` stays for regular expressions.
    return re.sub(r"\\([\"'\\])", r"\1", token[1:-1])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    return bool(text) and text.lower() not in ("false", "0")


def _number(value: Any) -> float | None:
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def evaluate_condition(expression: str, lookup: Lookup) -> bool:
    return Condition(expression).evaluate(lookup)


truthy = _truthy  # a branch entry without `pattern` follows a truthy value
