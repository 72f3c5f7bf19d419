"""A task step's retry policy (issue 32): `retry: {max_attempts, backoff_ms, max_backoff_ms}`.

A failed attempt of the step (its task failed: the model call, a timeout, a loop detected,
the turn or tool-call limit) runs again as a new attempt after a jittered, doubling backoff
(the service's one policy, orchestrator/runtime/backoff.py), until `max_attempts` attempts
have failed; only the last failure fails the step. The engine's side is in _driving.py and
_transitions.py (`fail_attempt`).

Checked on the way in (400 naming the field): `max_attempts` 1-10, backoffs in ms from 0 to
a day, `max_backoff_ms` at least `backoff_ms`. A field left out takes the settings' default
(`step_retry_*`, carried by `SpecLimits`), and a step without `retry` takes all three; the
policy is then kept with the workflow (its stored spec), so a settings change never alters
a running workflow's retries. A stored spec holds `retry` only when it retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.runtime.backoff import Backoff
from orchestrator.workflows._invalid import _bad

__all__ = ["MAX_ATTEMPTS", "MAX_BACKOFF_MS", "NO_RETRY", "RetryPolicy", "parse_retry"]

MAX_ATTEMPTS = 10
MAX_BACKOFF_MS = 86_400_000  # a day
_FIELDS = ("max_attempts", "backoff_ms", "max_backoff_ms")
# Half the wait may be drawn away: steps that failed together (a provider outage) do not
# all try again in the same instant.
JITTER = 0.5


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a task step is attempted, and the waits between its attempts."""

    max_attempts: int = 1
    backoff_ms: int = 1000
    max_backoff_ms: int = 60_000

    @property
    def retries(self) -> bool:
        return self.max_attempts > 1

    def backoff(self, jitter: float = JITTER) -> Backoff:
        return Backoff(base=self.backoff_ms / 1000, cap=self.max_backoff_ms / 1000, jitter=jitter)

    def delay_ms(self, failures: int) -> int:
        """The wait after the step's `failures`-th failed attempt, jittered: drawn from
        [d / 2, d], where d doubles from `backoff_ms` up to `max_backoff_ms`."""
        return round(self.backoff().delay(failures) * 1000)

    def schedule(self) -> list[int]:
        """The longest wait before each retry (after failure 1, 2, ...), without jitter."""
        exact = self.backoff(jitter=0)
        return [round(exact.delay(n) * 1000) for n in range(1, self.max_attempts)]

    def to_json(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _FIELDS}


NO_RETRY = RetryPolicy()


def _millis(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BACKOFF_MS:
        raise _bad(where, f"milliseconds, an integer from 0 to {MAX_BACKOFF_MS}")
    return value


def parse_retry(raw: Any, where: str, kind: str, default: RetryPolicy) -> RetryPolicy:
    """The policy of a step (`where` names it, `kind` its type); fields left out come from
    `default`: a missing `max_backoff_ms` is at least the given `backoff_ms`, a missing
    `backoff_ms` at most the given `max_backoff_ms`."""
    if raw is None:
        return default
    at = f"{where}.retry"
    if kind != "task":
        raise _bad(at, "only task steps have retry")
    if not isinstance(raw, dict):
        raise _bad(at, "an object {max_attempts, backoff_ms, max_backoff_ms}")
    for key in raw:
        if key not in _FIELDS:
            raise _bad(f"{at}.{key}", "unknown field (max_attempts, backoff_ms, max_backoff_ms)")
    attempts = raw.get("max_attempts", default.max_attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise _bad(f"{at}.max_attempts", f"an integer from 1 to {MAX_ATTEMPTS}")
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise _bad(f"{at}.max_attempts", f"from 1 to {MAX_ATTEMPTS}, not {attempts}")
    base = raw.get("backoff_ms")
    cap = raw.get("max_backoff_ms")
    if base is not None:
        base = _millis(base, f"{at}.backoff_ms")
    if cap is not None:
        cap = _millis(cap, f"{at}.max_backoff_ms")
    if base is not None and cap is not None and cap < base:
        raise _bad(f"{at}.max_backoff_ms", f"at least backoff_ms ({base}), not {cap}")
    if base is None:
        base = default.backoff_ms if cap is None else min(default.backoff_ms, cap)
    if cap is None:
        cap = max(default.max_backoff_ms, base)
    return RetryPolicy(attempts, base, cap)
