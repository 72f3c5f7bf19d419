"""orchestrator.wire is pydantic and the standard library only: the SDK installs without
FastAPI, and a router cannot smuggle a server type into a wire model. Checked by importing
the package in a fresh interpreter and reading what got loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# pydantic and what it loads itself.
ALLOWED = {"pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection"}
SERVER_SIDE = {"fastapi", "starlette", "asyncpg", "ray", "httpx", "redis", "uvicorn", "anyio"}

PROBE = """
import json, sys
before = set(sys.modules)
import orchestrator.wire
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _loaded_by_importing_wire() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_wire_imports_only_pydantic_and_the_standard_library() -> None:
    loaded = _loaded_by_importing_wire()
    tops = {name.split(".")[0] for name in loaded}
    assert not tops & SERVER_SIDE
    ours = [name for name in loaded if name.split(".")[0] == "orchestrator"]
    assert all(name == "orchestrator" or name.startswith("orchestrator.wire") for name in ours)
    foreign = {
        top
        for top in tops - ALLOWED - {"orchestrator"}
        if top not in sys.stdlib_module_names and not top.startswith("_sysconfigdata")
    }
    assert foreign == set()


def test_every_wire_model_is_exported_and_named_once() -> None:
    """One definition each: no two wire modules define a class of the same name (FastAPI
    would document both under long module-qualified names), and the package exports every
    model (the handle's envelope stays in orchestrator.wire.handle)."""
    import orchestrator.wire as wire
    from orchestrator.wire import ApiModel

    defined: dict[str, str] = {}
    for module_path in sorted((ROOT / "orchestrator" / "wire").glob("[!_]*.py")):
        module = __import__(f"orchestrator.wire.{module_path.stem}", fromlist=["__all__"])
        for name in module.__all__:
            assert name not in defined, f"{name} in {module_path.stem} and {defined[name]}"
            defined[name] = module_path.stem
    envelope = {name for name, module in defined.items() if module == "handle"}
    assert envelope == {"HandleRequest", "HandleResponse"}
    assert set(defined) - envelope | {"ApiModel"} == set(wire.__all__)
    for name in wire.__all__:
        value = getattr(wire, name)
        if isinstance(value, type):
            assert issubclass(value, ApiModel), name
