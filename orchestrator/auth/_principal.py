from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller. `subject` identifies the credential (for rate limits)."""

    user_uuid: str
    is_admin: bool = False
    subject: str = ""
