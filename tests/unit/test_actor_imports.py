"""A dispatcher looking up an AgentWorker (`ray.get_actor` loads the actor's class, so it
imports actors/agent_worker.py in the dispatcher's process) must not import the agent
loop and the providers there: that import held the scheduler's event loop for 0.2-0.4 s at
its first dispatch to each new worker (issue 17, the scheduler's lateness tail)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "orchestrator.providers",
    "orchestrator.memory",
    "orchestrator.workspace",
    "orchestrator.toolset",
    "orchestrator.inference",
)


def test_looking_up_a_worker_imports_no_agent_runtime_into_a_dispatcher() -> None:
    code = (
        "import json, sys\n"
        "import actors.dispatch, actors.scheduler, actors.workflow_shard\n"
        "before = set(sys.modules)\n"
        "import actors.agent_worker\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert added == ["actors.agent_worker"], added
    heavy_before = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\nimport actors.dispatch, actors.scheduler, actors.workflow_shard\n"
            f"print(json.dumps([m for m in sys.modules if m.startswith({HEAVY!r})]))\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    # The dispatchers themselves do not load them either.
    assert json.loads(heavy_before.stdout.strip().splitlines()[-1]) == []
