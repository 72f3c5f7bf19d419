"""Lowering a process's CPU priority: every thread of it, and the threads it starts after."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import json, os, threading
    from orchestrator.runtime.priority import lower_process_priority

    def nice(tid):
        return os.getpriority(os.PRIO_PROCESS, tid)

    started = threading.Event()
    stop = threading.Event()
    tids = []
    def before():
        tids.append(threading.get_native_id()); started.set(); stop.wait()
    t = threading.Thread(target=before); t.start(); started.wait()
    base = nice(0)
    after = lower_process_priority(3)
    later = []
    t2 = threading.Thread(target=lambda: later.append(nice(threading.get_native_id())))
    t2.start(); t2.join()
    older = nice(tids[0])
    stop.set(); t.join()
    print(json.dumps({"base": base, "after": after, "main": nice(0),
                      "older": older, "newer": later[0],
                      "again": lower_process_priority(0)}))
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_every_thread_is_lowered_and_new_ones_inherit_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout)
    want = min(19, got["base"] + 3)
    assert got["after"] == want
    assert (got["main"], got["older"], got["newer"]) == (want, want, want)
    assert got["again"] is None  # nothing to do
