"""One backoff policy for every retry in the service: a value, not a formula copied into
each loop. The supervisor's restarts, an actor's boot, a workflow's infrastructure retries,
a channel delivery's, a provider call's and the inference log's writes each hold a
`Backoff` and ask it for the wait after their n-th failure in a row."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential: `base` after the first failure, doubling, never above `cap`. With
    `jitter` j, the wait is drawn from [d * (1 - j), d]: processes that failed together (a
    database outage) do not all retry in the same instant. `jitter=0` is exact (a wait
    stored in a row, or one a test or a peer's Retry-After is compared with)."""

    base: float = 0.5
    cap: float = 30.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff {self!r}")

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row (0: none yet, no wait)."""
        if failures < 1:
            return 0.0
        # The exponent is bounded: 2**1000 would overflow a float before `min` caps it.
        full: float = min(self.cap, self.base * 2.0 ** min(failures - 1, 60))
        if not self.jitter:
            return full
        return full * (1 - self.jitter * random.random())
