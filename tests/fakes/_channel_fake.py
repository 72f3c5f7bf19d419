"""What the Slack, Teams and Telegram fakes share on top of `LoopbackServer`: scripted
failures of the next requests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tests.fakes._loopback import LoopbackServer

__all__ = ["ChannelFake", "Failure"]


@dataclass(frozen=True)
class Failure:
    """One scripted failure: answer `status` (each fake renders its platform's error body),
    with the platform's retry delay when `retry_after` is set, after `delay_s`."""

    status: int = 500
    retry_after: int | None = None
    error: str | None = None  # the platform's error code or description
    delay_s: float = 0.0


class ChannelFake(LoopbackServer):
    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        *,
        retry_after: int | None = None,
        error: str | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Make the next `n` message requests fail this way."""
        self.script(*[Failure(status, retry_after, error, delay_s)] * n)

    async def next_failure(self) -> Failure | None:
        failure = self.next_reply()
        if isinstance(failure, Failure) and failure.delay_s:
            await asyncio.sleep(failure.delay_s)
        return failure if isinstance(failure, Failure) else None

    def clear_failures(self) -> None:
        """Drop the failures still scripted (the outage is over); keep the record."""
        with self._lock:
            self._script.clear()

    def reset(self) -> None:
        self.clear_failures()
        self.requests.clear()
