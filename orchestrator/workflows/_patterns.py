"""Regular expressions of workflows (branch `pattern`, condition `matches`), from any tenant,
searched by a WorkflowShard that other tenants' workflows share.

They run on RE2: no backtracking, so `(a+)+$` is linear in the input, and patterns with
backreferences or lookaround are refused when the workflow is created (400). Linear is not
cheap, though: a search costs up to (input length x RE2 program size), and counted
repetitions blow the program up (`a{0,1000}` is 2,000 instructions, eight of them 16,000:
~9 s against 64 KiB). So, from a tenant's pattern to the CPU:

- At creation (`check_pattern`): at most MAX_PATTERN characters and at most
  `workflow_pattern_max_program` RE2 instructions (400 naming the setting). At the default
  (500) one search of 64 KiB takes at most a few hundred ms of CPU (measured: ~0.1 s for
  `a[ab]{240}c` on random a/b). It cannot be "a few ms": on adversarial input RE2's DFA
  builds a state per byte, ~1 us a byte even for a 26-instruction program, so the two
  bounds below carry the rest.
- Inputs are cut to MAX_INPUT characters; each pattern is compiled once.
- When a workflow runs (`PatternRunner`): a condition or branch that searches a pattern is
  evaluated in a worker thread (RE2 releases the GIL), never on the shard's event loop; a
  tenant's searches run one at a time per shard, so one tenant holds at most one thread;
  and each workflow's searches are metered in CPU time: past `workflow_pattern_budget_ms`
  the next search fails the workflow (PatternBudgetSpent), not its neighbours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, TypeVar

import re2

MAX_PATTERN = 1_000
MAX_INPUT = 65_536
_MAX_MEM = 8 << 20  # RE2's own bound on a compiled program (a huge pattern fails to compile)
# Threads of one shard's pattern searches: one tenant uses at most one of them at a time.
PATTERN_THREADS = 2

Search = Callable[[str, str], bool]
T = TypeVar("T")


class PatternError(ValueError):
    """A pattern RE2 does not accept, too long, or too large a program."""


class PatternBudgetSpent(Exception):
    """A workflow's pattern searches took their CPU budget (workflow_pattern_budget_ms)."""


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


def program_size(pattern: str) -> int:
    """RE2 instructions of the compiled pattern: what one search costs per input character."""
    return int(_compiled(pattern).programsize)


def check_pattern(pattern: str, max_program: int | None = None) -> None:
    """Raise PatternError unless `pattern` can be searched (and, given `max_program`, its
    program is at most that many instructions: the admission bound)."""
    size = program_size(pattern)
    if max_program is not None and size > max_program:
        raise PatternError(
            f"regular expression too complex: {size} RE2 instructions, at most {max_program}"
            " (workflow_pattern_max_program); counted repetitions such as a{0,1000} multiply"
            " the program"
        )


def pattern_found(pattern: str, text: str) -> bool:
    """Whether `pattern` occurs in (the first MAX_INPUT characters of) `text`."""
    return _compiled(pattern).search(text[:MAX_INPUT]) is not None


class PatternMeter:
    """The CPU time one workflow's searches took. Its searches run one at a time (the
    workflow has one driver), in a worker thread: `time.thread_time` counts RE2's work in
    that thread and not the time it waited for a core."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_ms = budget_ms
        self.spent_s = 0.0

    def search(self, pattern: str, text: str) -> bool:
        if self.spent_s * 1000 >= self.budget_ms:
            raise PatternBudgetSpent(
                f"pattern budget spent: this workflow's regular expressions took"
                f" {self.spent_s * 1000:.0f} ms of CPU, at most {self.budget_ms}"
                " (workflow_pattern_budget_ms)"
            )
        started = time.thread_time()
        try:
            return pattern_found(pattern, text)
        finally:
            self.spent_s += time.thread_time() - started


class PatternRunner:
    """Evaluates pattern-searching conditions and branches of a shard's workflows off its
    event loop: in PATTERN_THREADS threads, one search at a time per tenant, each workflow
    metered by a PatternMeter (forgotten when its driver stops)."""

    def __init__(self, budget_ms: int, threads: int = PATTERN_THREADS) -> None:
        self._budget_ms = budget_ms
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="workflow-patterns")
        self._lanes: dict[str, asyncio.Lock] = {}
        self._queued: dict[str, int] = {}
        self._meters: dict[str, PatternMeter] = {}

    async def run(self, workflow_id: str, tenant: str, evaluate: Callable[[Search], T]) -> T:
        """`evaluate(search)` in a worker thread, `search` metered for `workflow_id`."""
        meter = self._meters.setdefault(workflow_id, PatternMeter(self._budget_ms))
        lane = self._lanes.setdefault(tenant, asyncio.Lock())
        self._queued[tenant] = self._queued.get(tenant, 0) + 1
        try:
            await lane.acquire()
        except BaseException:
            self._leave(tenant)
            raise

        def ended(future: asyncio.Future[T] | None = None) -> None:
            lane.release()
            self._leave(tenant)
            if future is not None and not future.cancelled():
                future.exception()  # retrieved: a driver cancelled meanwhile does not await it

        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, evaluate, meter.search)
        except BaseException:  # the pool is shut down (the engine closes)
            ended()
            raise
        # The lane is held until the search has really ended: a cancelled driver (a cancel
        # request) cannot start the tenant's next search while RE2 still runs this one.
        future.add_done_callback(ended)
        return await asyncio.shield(future)

    def _leave(self, tenant: str) -> None:
        left = self._queued[tenant] - 1
        if left:
            self._queued[tenant] = left
        else:
            del self._queued[tenant], self._lanes[tenant]

    def forget(self, workflow_id: str) -> None:
        self._meters.pop(workflow_id, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
