"""Call the orchestration service from a program on its Ray cluster, without HTTP.

The SDK's requests go over the application's Serve deployment handle and act as the token's
user, with the same authentication, rate limit and ownership as over HTTP. Run it where Ray
can join the cluster the service runs on, as a driver:

    RAY_ADDRESS=<head-ip>:6379 ORCH_API_KEY=<token> python examples/in_cluster.py "Say hi"

or as a Ray job (`ray job submit --working-dir . -- python examples/in_cluster.py "Say hi"`,
with ORCH_API_KEY in the job's runtime_env). ORCH_APP_NAME names the Serve application
(default `orchestrator`). It runs a one-step workflow with the prompt, waits for it and
prints the workflow as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ray

from orchestrator.sdk import Client


def main(prompt: str) -> None:
    # "auto": RAY_ADDRESS, else the cluster this machine's `ray start` joined.
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    app_name = os.environ.get("ORCH_APP_NAME", "orchestrator")
    with Client.in_cluster(app_name=app_name) as api:  # the token: $ORCH_API_KEY
        me = api.whoami()
        made = api.create_workflow("in-cluster", [{"name": "answer", "prompt": prompt}])
        wait = 0.2
        while not (workflow := api.workflow(made.id)).finished:
            time.sleep(wait)
            wait = min(wait * 1.5, 2.0)  # gently: polls count against the rate limit
        print(json.dumps({"user": me.user_uuid, "workflow": workflow.model_dump(mode="json")}))


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Say hi")
