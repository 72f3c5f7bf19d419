"""The task supervisor: restarts with backoff, counts restarts, cancels and awaits."""

from __future__ import annotations

import asyncio
import logging

import pytest

from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait

FAST = Backoff(base=0.001, cap=0.01)


async def test_a_failing_loop_is_restarted_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    restarted: list[str] = []
    runs = 0
    third_run = asyncio.Event()

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            third_run.set()
            await asyncio.Event().wait()
        raise RuntimeError(f"boom {runs}")

    sup = Supervisor("test", on_restart=restarted.append, backoff=FAST)
    with caplog.at_level(logging.ERROR, logger="orchestrator.runtime.supervisor"):
        sup.spawn("pump", loop)
        await asyncio.wait_for(third_run.wait(), 5)
    assert restarted == ["pump", "pump"]
    assert sup.restarts() == {"pump": 2}
    failures = [r for r in caplog.records if "pump failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)  # with the traceback
    await sup.aclose()


async def test_a_loop_that_returns_is_restarted() -> None:
    runs = 0
    again = asyncio.Event()

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            again.set()
            await asyncio.Event().wait()

    sup = Supervisor("test", backoff=FAST)
    sup.spawn("tick", loop)
    await asyncio.wait_for(again.wait(), 5)
    assert sup.restarts() == {"tick": 1}
    await sup.aclose()


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    backoff = Backoff(base=0.5, cap=30.0, jitter=0.5)
    assert backoff.delay(0) == 0.0
    for failures, full in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (7, 30.0), (10_000, 30.0)]:
        delays = [backoff.delay(failures) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays), (failures, min(delays), max(delays))
        assert len(set(delays)) > 1  # jittered, not one fixed instant


def test_backoff_without_jitter_is_exact() -> None:
    backoff = Backoff(base=0.1, cap=1.0, jitter=0)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    with pytest.raises(ValueError):
        Backoff(jitter=2)


async def test_waits_between_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep
    done = asyncio.Event()

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == 4:
            done.set()
        await real_sleep(0)

    monkeypatch.setattr("orchestrator.runtime.supervisor.asyncio.sleep", fake_sleep)

    async def loop() -> None:
        raise OSError("database away")

    sup = Supervisor("test", backoff=Backoff(base=1.0, cap=4.0))
    sup.spawn("feed", loop)
    await asyncio.wait_for(done.wait(), 5)
    await sup.aclose()
    for delay, full in zip(slept[:4], [1.0, 2.0, 4.0, 4.0], strict=True):
        assert full / 2 <= delay <= full


async def test_aclose_cancels_and_awaits_every_task() -> None:
    cleaned: list[str] = []
    started = asyncio.Event()

    async def loop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # cleanup that itself awaits
            cleaned.append("loop")

    sup = Supervisor("test")
    task = sup.spawn("loop", loop)
    await asyncio.wait_for(started.wait(), 5)
    await sup.aclose()
    assert cleaned == ["loop"] and task.cancelled()
    assert sup.tasks() == {}
    with pytest.raises(RuntimeError):
        sup.spawn("late", loop)


async def test_cancelled_error_ends_the_task_without_a_restart() -> None:
    restarted: list[str] = []

    async def loop() -> None:
        raise asyncio.CancelledError

    sup = Supervisor("test", on_restart=restarted.append, backoff=FAST)
    task = sup.spawn("loop", loop)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert restarted == [] and sup.tasks() == {}


async def test_a_loop_swallowing_its_cancel_is_not_restarted() -> None:
    restarted: list[str] = []
    started = asyncio.Event()

    async def loop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return  # a badly behaved loop

    sup = Supervisor("test", on_restart=restarted.append, backoff=FAST)
    task = sup.spawn("loop", loop)
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert restarted == []


async def test_without_restart_a_failure_is_logged_and_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def once() -> None:
        raise ValueError("bad start")

    sup = Supervisor("test")
    with caplog.at_level(logging.ERROR, logger="orchestrator.runtime.supervisor"):
        await sup.spawn("boot", once, restart=False)
    assert sup.restarts() == {} and sup.tasks() == {}
    assert any("boot failed" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_names_are_unique_while_running() -> None:
    sup = Supervisor("test")
    sup.spawn("a", asyncio.Event().wait)
    with pytest.raises(ValueError):
        sup.spawn("a", asyncio.Event().wait)
    assert set(sup.tasks()) == {"a"}
    await sup.aclose()


async def test_a_failing_restart_callback_does_not_end_the_loop() -> None:
    runs = 0
    second = asyncio.Event()

    def broken(_: str) -> None:
        raise KeyError("recorder gone")

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            second.set()
            await asyncio.Event().wait()
        raise RuntimeError("x")

    sup = Supervisor("test", on_restart=broken, backoff=FAST)
    sup.spawn("loop", loop)
    await asyncio.wait_for(second.wait(), 5)
    await sup.aclose()


async def test_aclose_cancels_again_a_loop_that_lost_its_cancel() -> None:
    # As Python 3.11's wait_for does when the cancel meets its inner call's completion
    # (redis-py writes through it): the first cancel is swallowed, the loop goes on.
    cancels = 0

    async def loop() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 1:
                    continue  # lost
                raise

    sup = Supervisor("test")
    task = sup.spawn("sync", loop)
    await asyncio.sleep(0)
    # Within the timeout (not at its end): a second cancel reached it.
    await asyncio.wait_for(sup.aclose(timeout=30), 5)
    assert task.cancelled() and cancels == 2


async def test_retry_runs_until_it_returns_undoing_each_failed_try() -> None:
    restarted: list[str] = []
    undone: list[int] = []
    tries = 0

    async def start() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise OSError("database away")
        return "engine"

    async def undo() -> None:
        undone.append(tries)

    sup = Supervisor("test", on_restart=restarted.append, backoff=FAST)
    assert await asyncio.wait_for(sup.retry("boot", start, undo=undo), 5) == "engine"
    assert undone == [1, 2] and restarted == ["boot", "boot"]
    assert sup.tasks() == {}  # done: no longer held


async def test_retry_is_cancelled_by_aclose() -> None:
    async def never() -> None:
        raise OSError("still away")

    sup = Supervisor("test", backoff=Backoff(base=60.0, cap=60.0))
    boot = sup.retry("boot", never)
    await asyncio.sleep(0.01)
    await asyncio.wait_for(sup.aclose(), 5)
    assert boot.cancelled()


async def test_a_retry_cancelled_midway_undoes_that_try_before_it_ends() -> None:
    """A drain cancels the boot while a try is halfway: what the try opened is closed (to
    its end, through the repeated cancels of cancel_and_wait) before the task ends."""
    opened = asyncio.Event()
    undone: list[str] = []

    async def start() -> str:
        opened.set()
        await asyncio.Event().wait()
        return "never"

    async def undo() -> None:
        await asyncio.sleep(0.6)  # longer than cancel_and_wait's re-cancel (0.25 s)
        undone.append("closed")

    sup = Supervisor("test", backoff=FAST)
    boot = sup.retry("boot", start, undo=undo)
    await asyncio.wait_for(opened.wait(), 5)
    await asyncio.wait_for(cancel_and_wait([boot]), 5)
    assert boot.cancelled() and undone == ["closed"]


async def test_an_expected_failure_is_one_warning_line_and_still_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    restarted: list[str] = []
    runs = 0
    second = asyncio.Event()

    async def session() -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            second.set()
            await asyncio.Event().wait()
        raise ConnectionError("lease lost")

    sup = Supervisor("test", on_restart=restarted.append, backoff=FAST)
    with caplog.at_level(logging.WARNING, logger="orchestrator.runtime.supervisor"):
        sup.spawn("scheduler", session, expected=(ConnectionError,))
        await asyncio.wait_for(second.wait(), 5)
    await sup.aclose()
    assert restarted == ["scheduler"]
    [line] = [r for r in caplog.records if "scheduler" in r.getMessage()]
    assert line.levelno == logging.WARNING and not line.exc_info


async def test_cancel_and_wait_outlasts_a_lost_cancel_and_takes_each_exception() -> None:
    from orchestrator.runtime.supervisor import cancel_and_wait

    lost = 0

    async def swallows_once() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                lost += 1
                if lost == 1:
                    continue
                raise

    async def fails() -> None:
        raise RuntimeError("taken, not reported as never retrieved")

    stubborn = asyncio.create_task(swallows_once())
    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    # No timeout: it returns once a second cancel reached the loop that lost the first.
    assert await asyncio.wait_for(cancel_and_wait([stubborn, failed]), 5) == set()
    assert stubborn.cancelled() and lost == 2
    assert isinstance(failed.exception(), RuntimeError)
