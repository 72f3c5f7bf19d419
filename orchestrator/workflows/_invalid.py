"""The 400 of a workflow's input, naming the field (DESIGN's error body).

Its own module so that every part of the spec's checking (_spec.py, _skills.py,
_resolve.py) can raise it without importing _spec.py: _spec.py imports _skills.py.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import ValidationFailed, field_error


def _bad(field_name: str, message: str, limit: str | None = None) -> ValidationFailed:
    """A 400 naming the field; `limit` names the setting of a limit the input went past."""
    extra: dict[str, Any] = {"fields": [field_error(field_name, message)]}
    if limit is not None:
        extra["limit"] = limit
    return ValidationFailed(f"{field_name}: {message}", extra=extra)
