"""Call the orchestration service from a program on its Ray cluster, without HTTP.

The SDK's requests go over the application's Serve deployment handle and act as the token's
user, with the same authentication, rate limit and ownership as over HTTP. Run it where Ray
can join the cluster the service runs on, as a driver:

    RAY_ADDRESS=<head-ip>:6379 ORCH_API_KEY=<token> python examples/in_cluster.py "Say hi"

or as a Ray job (`ray job submit --working-dir . -- python examples/in_cluster.py "Say hi"`,
with ORCH_API_KEY in the job's runtime_env). ORCH_APP_NAME names the Serve application
(default `orchestrator`). It runs a one-step workflow with the prompt, follows the
workflow's events over the handle until it ends and prints the workflow as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import closing

import ray

from orchestrator.sdk import Client

# On the live stream workflow events carry their stream names (colon style, SPEC part 6).
ENDS = {"workflow:completed", "workflow:failed", "workflow:cancelled"}


def main(prompt: str) -> None:
    # "auto": RAY_ADDRESS, else the cluster this machine's `ray start` joined.
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    app_name = os.environ.get("ORCH_APP_NAME", "orchestrator")
    with Client.in_cluster(app_name=app_name) as api:  # the token: $ORCH_API_KEY
        me = api.whoami()
        made = api.create_workflow("in-cluster", [{"name": "answer", "prompt": prompt}])
        # The workflow's events from its first: those already committed are replayed, then
        # the stream follows, so none is missed and nothing is polled. Closing the stream
        # (`closing`) ends it on the replica too.
        with closing(api.sync_events(made.id, from_seq=1)) as events:
            for event in events:
                if event.type in ENDS:
                    break
        workflow = api.workflow(made.id)
        print(json.dumps({"user": me.user_uuid, "workflow": workflow.model_dump(mode="json")}))


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Say hi")
