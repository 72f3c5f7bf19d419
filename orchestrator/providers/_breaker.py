"""Per-provider circuit breaker: closed -> open after N consecutive failures; open -> half-open
after a cooldown, when one trial call is let through; the trial's outcome closes or re-opens."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(IntEnum):
    """Values as exported by `svc_circuit_breaker_state` (SPEC part 3)."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Not thread-safe: one event loop owns it. Failures that count are the provider's
    fault (5xx, 429, timeouts, unreachable); a 400 for a bad request is the caller's and
    callers must not report it as a failure."""

    def __init__(
        self,
        failure_threshold: int,
        cooldown_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
        trial_lease_s: float | None = None,
    ) -> None:
        self._threshold = failure_threshold
        self._cooldown = cooldown_s
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self._trial_at = 0.0
        # A trial that never reports (its caller vanished without a release) is presumed
        # lost after this long, so the breaker cannot stay half-open and shut forever.
        self._trial_lease = trial_lease_s
        self.last_error: str | None = None

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker whose cooldown has passed reads as half-open)."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self._cooldown:
            self._set(BreakerState.HALF_OPEN)
        return self._state

    @property
    def recorded_state(self) -> BreakerState:
        """The state as last recorded (reading it changes nothing)."""
        return self._state

    @property
    def retry_in_s(self) -> float:
        if self._state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._cooldown - (self._clock() - self._opened_at))

    def allow(self) -> bool:
        """May a call go out now? In half-open, only one trial at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and (
            not self._trial_in_flight
            or (
                self._trial_lease is not None
                and self._clock() - self._trial_at >= self._trial_lease
            )
        ):
            self._trial_in_flight = True
            self._trial_at = self._clock()
            return True
        return False

    def success(self) -> None:
        self._failures = 0
        self._trial_in_flight = False
        if self._state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED)

    def failure(self, error: str | None = None) -> None:
        self.last_error = error
        self._trial_in_flight = False
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)

    def release(self) -> None:
        """A call that was allowed ended without telling success or failure (the caller
        went away): let the next trial through."""
        self._trial_in_flight = False

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self._state = state
            if self._on_change is not None:
                self._on_change(state)
