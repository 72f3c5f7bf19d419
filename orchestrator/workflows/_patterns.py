"""Regular expressions of workflows (branch `pattern`, condition `matches`), from any tenant,
run on a WorkflowShard's event loop that other tenants' workflows share. So they run on RE2:
matching time is linear in the input, whatever the pattern (`(a+)+$` included), where
Python's backtracking `re` can take exponential time. RE2 has no backreferences or
lookaround: such patterns are refused when the workflow is created (400). Inputs are cut to
MAX_INPUT characters and patterns to MAX_PATTERN; each pattern is compiled once."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

MAX_PATTERN = 1_000
MAX_INPUT = 65_536
_MAX_MEM = 8 << 20  # RE2's own bound on a compiled program (a huge pattern fails to compile)


class PatternError(ValueError):
    """A pattern RE2 does not accept (or too long)."""


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"regular expression too long ({MAX_PATTERN} characters at most)")
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise PatternError(
            f"invalid regular expression (RE2 syntax: no backreferences or lookaround): {detail}"
        ) from None


def check_pattern(pattern: str) -> None:
    """Raise PatternError unless `pattern` can be searched."""
    _compiled(pattern)


def pattern_found(pattern: str, text: str) -> bool:
    """Whether `pattern` occurs in (the first MAX_INPUT characters of) `text`."""
    return _compiled(pattern).search(text[:MAX_INPUT]) is not None
