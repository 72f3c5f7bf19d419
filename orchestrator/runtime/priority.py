"""CPU priority of a process of ours, for work that should yield to the rest under
contention (the AgentWorkers: see `lower_process_priority`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MAX_NICENESS = 19


def lower_process_priority(increment: int) -> int | None:
    """Add `increment` to the niceness of every thread of this process (Linux keeps one per
    thread, and a thread starts with its creator's: the threads running now are lowered
    and those they start later inherit it). Lowering needs no privilege; raising back
    would. Returns the main thread's niceness after, or None when it could not be set."""
    if increment <= 0:
        return None
    try:
        if sys.platform != "linux":
            return os.nice(increment)  # process-wide elsewhere
        for task in Path("/proc/self/task").iterdir():
            tid = int(task.name)
            current = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICENESS, current + increment))
        return os.getpriority(os.PRIO_PROCESS, os.getpid())
    except (OSError, ValueError) as exc:  # a thread gone meanwhile, or not allowed
        log.warning("could not lower this process's CPU priority: %r", exc)
        return None
