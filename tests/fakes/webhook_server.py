"""A real loopback HTTP server that receives generic-webhook callbacks (a channel's
`callback_url`) for tests.

    with CallbackFake() as hook:                   # or `async with`
        config = {"callback_url": hook.callback_url}
        ...
        hook.received[-1]       # the JSON bodies accepted, in order

`POST /callback` answers `200 {"ok": true}`; any other path `404`. `fail_next(n, status,
retry_after=)` makes the next n posts answer `status` (429 with `Retry-After`).
"""

from __future__ import annotations

from typing import Any

from tests.fakes._channel_fake import ChannelFake
from tests.fakes._loopback import RecordedRequest, Send

__all__ = ["CallbackFake"]


class CallbackFake(ChannelFake):
    label = "callback"

    def __init__(self) -> None:
        super().__init__()
        self.callback_url = f"{self.url}/callback"
        self.received: list[Any] = []

    def reset(self) -> None:
        super().reset()
        self.received.clear()

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if request.method != "POST" or request.path != "/callback":
            await self.send_json(send, 404, {"error": "not found"})
            return
        failure = await self.next_failure()
        if failure is not None:
            headers = (
                [] if failure.retry_after is None else [("retry-after", str(failure.retry_after))]
            )
            await self.send_json(
                send, failure.status, {"error": failure.error or "failed"}, headers
            )
            return
        try:
            self.received.append(request.json)
        except ValueError:
            await self.send_json(send, 400, {"error": "not JSON"})
            return
        await self.send_json(send, 200, {"ok": True})
