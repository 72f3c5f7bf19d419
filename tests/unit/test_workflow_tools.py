"""The steps that name tools in a workflow tree, with the model each runs on
(orchestrator.workflows.tool_steps): what POST /workflows asks the gateway about, so a
step that names tools for a model that takes none is a 400 at creation, a spawn step's
inline children included (the field names the child's step)."""

from __future__ import annotations

from orchestrator.workflows import WorkflowSpec, tool_steps


def test_spawned_childrens_steps_are_walked_with_their_own_models() -> None:
    grandchild = {
        "name": "g",
        "steps": [{"name": "t", "prompt": "p", "tools": ["current_time"], "model": "smol"}],
    }
    child = {
        "name": "c",
        "model": "child-model",
        "steps": [
            {"name": "t", "prompt": "p", "tools": ["calculator"]},
            {"name": "plain", "prompt": "p"},
            {"name": "deeper", "type": "spawn", "workflows": [grandchild]},
        ],
    }
    bare = {"name": "b", "steps": [{"name": "t", "prompt": "p", "tools": ["calculator"]}]}
    spec = WorkflowSpec.parse(
        "root",
        [
            {"name": "top", "prompt": "p", "tools": ["calculator"]},
            {"name": "kids", "type": "spawn", "workflows": [child, bare]},
        ],
        model="root-model",
    )
    assert [(at, model) for at, model, _ in tool_steps(spec, "default-model")] == [
        ("steps[0].tools", "root-model"),
        ("steps[1].workflows[0].steps[0].tools", "child-model"),
        ("steps[1].workflows[0].steps[2].workflows[0].steps[0].tools", "smol"),
        # A child runs as its own workflow: the root's model is not its fallback.
        ("steps[1].workflows[1].steps[0].tools", "default-model"),
    ]
    # No model anywhere: the names are still checked; the model is judged when it runs.
    assert tool_steps(WorkflowSpec.parse("b", bare["steps"]), None) == [
        ("steps[0].tools", None, ("calculator",))
    ]
