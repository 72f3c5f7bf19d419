"""The circuit breaker's state machine, on a fake clock."""

from __future__ import annotations

from orchestrator.providers import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(threshold: int = 3, cooldown: float = 10.0) -> tuple[CircuitBreaker, Clock, list[int]]:
    clock = Clock()
    changes: list[int] = []
    breaker = CircuitBreaker(
        threshold, cooldown, clock=clock, on_change=lambda s: changes.append(s)
    )
    return breaker, clock, changes


def test_opens_after_threshold_consecutive_failures() -> None:
    breaker, _, changes = make(threshold=3)
    for _ in range(2):
        assert breaker.allow()
        breaker.failure("boom")
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()
    breaker.failure("boom 3")
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    assert breaker.last_error == "boom 3"
    assert changes == [BreakerState.OPEN]


def test_success_resets_the_failure_count() -> None:
    breaker, _, _ = make(threshold=2)
    breaker.failure()
    breaker.success()
    breaker.failure()
    assert breaker.state is BreakerState.CLOSED


def test_half_open_after_cooldown_lets_one_trial_through() -> None:
    breaker, clock, changes = make(threshold=1, cooldown=10.0)
    breaker.failure()
    assert not breaker.allow()
    assert breaker.retry_in_s == 10.0
    clock.now += 9.9
    assert breaker.state is BreakerState.OPEN
    clock.now += 0.1
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the trial
    assert not breaker.allow()  # only one at a time
    breaker.success()
    assert breaker.state is BreakerState.CLOSED
    assert changes == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_failed_trial_reopens_for_a_full_cooldown() -> None:
    breaker, clock, _ = make(threshold=5, cooldown=10.0)
    for _ in range(5):
        breaker.failure()
    clock.now += 10
    assert breaker.allow()
    breaker.failure("still down")
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_in_s == 10.0


def test_released_trial_frees_the_slot() -> None:
    breaker, clock, _ = make(threshold=1, cooldown=1.0)
    breaker.failure()
    clock.now += 1
    assert breaker.allow()
    breaker.release()
    assert breaker.allow()
