"""No import circle in the SDK: the modules of orchestrator/sdk, orchestrator/wire and
deployments/in_cluster.py, read as a graph of every import they make (at the top, under
TYPE_CHECKING or inside a function), form no cycle; and each imports first in a fresh
interpreter. Before issue 31 the clients and the in-cluster module imported each other."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator/sdk", "orchestrator/wire")
EXTRA = ("deployments/in_cluster.py",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    paths += [ROOT / p for p in EXTRA]
    return {_module_name(p): p for p in sorted(paths)}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports, anywhere in it (a package counts as the
    module it names, `from package import module` as the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from package import module` needs the module (the package only runs first).
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph (empty: there is none)."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_sdk_wire_and_in_cluster_modules_import_no_circle() -> None:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(path, name, known) for name, path in modules.items()}
    assert "orchestrator.sdk._sync.client" in graph  # the generated client is read too
    assert _cycle(graph) == []


# One interpreter with the third-party libraries and the wire models loaded (a leaf: it
# imports none of ours, tests/unit/test_wire.py) and no SDK module; a fork of it per module
# imports that module first: a fresh interpreter per module, without building pydantic's
# models again for each.
FORKS = """
import importlib, json, os, sys, traceback
import httpx, pydantic, starlette.types
import orchestrator.wire
failed = {}
for name in json.loads(sys.argv[1]):
    assert not any(m.startswith(("orchestrator.sdk", "deployments")) for m in sys.modules)
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed[name] = "failed"
print(json.dumps(failed))
"""


def test_each_module_imports_first_in_a_fresh_interpreter() -> None:
    names = sorted(n for n in _modules() if not n.startswith("orchestrator.wire"))
    done = subprocess.run(
        [sys.executable, "-c", FORKS, json.dumps(names)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == {}, done.stderr
