"""The generation's version covers exactly the settings the actors read.

`actors/version.py` lists them (ACTOR_SETTINGS); the scan here finds every setting read in
the code an actor process runs: the actors' modules, the Runtime replica that creates them,
and every module of ours they import (followed through imports anywhere in a module,
deferred ones included, and through re-exports). A setting read there and not listed fails
the first test (a redeploy that changes it would leave the running actors on the old
value); one listed and no longer read fails the second (a change to it would restart the
actors for nothing)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import warnings
from pathlib import Path

from actors import app_version
from actors.version import ACTOR_SETTINGS, UNVERSIONED_SETTINGS
from orchestrator.config import Settings

with warnings.catch_warnings():  # Serve's own models still use pydantic v1 idioms
    warnings.simplefilter("ignore", DeprecationWarning)
    import deployments.runtime  # noqa: F401 - imported (scanned) below, warnings aside

OURS = ("orchestrator", "actors", "deployments")
# Where a generation's code starts: the Runtime replica, which creates the actors (and reads
# what it passes them, e.g. the drain budget), through actors/generation.py, which imports
# every member's class. Inference instances are no members: the replica that starts one
# passes its own settings (and replicas restart on every deploy).
ROOTS = ("deployments.runtime", "actors.generation")
# What a settings object is called where it is read (`settings.x`, `s.x`, `self._settings.x`,
# `ctx.settings.x`); parameters annotated `Settings` count under any name.
SETTINGS_NAMES = {"settings", "s"}
SETTINGS_ATTRIBUTES = {"settings", "_settings"}


def _ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def _path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _runtime_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for sub in node.body for n in ast.walk(sub))
    return [n for n in ast.walk(tree) if id(n) not in skipped]


def _imports(module: str) -> set[str]:
    path = _path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _ours(a.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            if not _ours(base):
                continue
            for alias in node.names:
                if _is_module(f"{base}.{alias.name}"):
                    found.add(f"{base}.{alias.name}")
                    continue
                # A class or function re-exported by a package (lazily or not): the module
                # that defines it, not every module the package imports. A scalar reads no
                # setting (settings are passed, never global); any other value (a table of
                # tools) may hold code: the module it is taken from.
                value = getattr(importlib.import_module(base), alias.name, None)
                defined = getattr(value, "__module__", None)
                if isinstance(value, str | bytes | int | float):
                    continue
                found.add(defined if isinstance(defined, str) and _ours(defined) else base)
    return found


def actor_modules() -> set[str]:
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imports(module))
    return seen


def _reads(module: str, fields: set[str]) -> set[str]:
    tree = ast.parse(_path(module).read_text())
    names = set(SETTINGS_NAMES)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            if "Settings" in ast.unparse(node.annotation):
                names.add(node.arg)
    settings_classes = [
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Settings"
    ]
    in_settings = {id(n) for c in settings_classes for n in ast.walk(c)}
    read: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in fields:
            continue
        value = node.value
        if (
            (isinstance(value, ast.Name) and value.id in names)
            or (isinstance(value, ast.Attribute) and value.attr in SETTINGS_ATTRIBUTES)
            or (isinstance(value, ast.Name) and value.id == "self" and id(node) in in_settings)
        ):
            read.add(node.attr)
    return read


def settings_the_actors_read() -> dict[str, set[str]]:
    fields = set(Settings.model_fields)
    where: dict[str, set[str]] = {}
    for module in sorted(actor_modules()):
        for name in _reads(module, fields):
            where.setdefault(name, set()).add(module)
    return where


def test_every_setting_an_actor_reads_is_in_the_version() -> None:
    read = settings_the_actors_read()
    missing = {k: sorted(v) for k, v in read.items() if k not in ACTOR_SETTINGS}
    missing = {k: v for k, v in missing.items() if k not in UNVERSIONED_SETTINGS}
    assert not missing, f"add these to actors/version.py ACTOR_SETTINGS: {missing}"


def test_the_version_covers_no_setting_the_actors_do_not_read() -> None:
    read = settings_the_actors_read()
    assert not set(ACTOR_SETTINGS) & set(UNVERSIONED_SETTINGS)
    assert set(ACTOR_SETTINGS) <= set(Settings.model_fields)
    stale = sorted(set(ACTOR_SETTINGS) - set(read))
    assert not stale, f"no actor reads these any more: {stale}"


def test_the_scan_sees_the_actors_and_what_they_build() -> None:
    modules = actor_modules()
    # Deferred imports (the agent loop in AgentWorker's start) and lazy re-exports count.
    assert {"actors.agent_worker", "orchestrator.agents._runner", "deployments.runtime"} <= modules
    assert "orchestrator.workflows._engine" in modules
    read = settings_the_actors_read()
    assert "orchestrator.agents._runner" in read["agent_max_turns"]
    assert "deployments.runtime" in read["generation_drain_s"]


def test_replica_only_settings_leave_the_version_alone() -> None:
    base = Settings()
    for change in (
        {"log_level": "DEBUG"},
        {"rate_limit_per_minute": 7},
        {"api_replicas": 3},
        {"jwt_secret": "x" * 32},
        {"sse_ping_interval_s": 3.0},
    ):
        assert app_version(base.model_copy(update=change)) == app_version(base), change


def test_actor_settings_change_the_version() -> None:
    base = Settings()
    for change in (
        {"provider_retries": 5},
        {"agent_worker_cpus": 0.5},
        {"workflow_shards": 3},
        {"generation_drain_s": 1.0},
    ):
        assert app_version(base.model_copy(update=change)) != app_version(base), change
