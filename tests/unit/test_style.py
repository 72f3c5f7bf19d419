"""The house style, checked: ruff over the tree, mypy (strict) over the domain core."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)


def test_ruff_is_clean() -> None:
    result = _run(
        str(BIN / "ruff"), "check", "orchestrator", "actors", "deployments", "scripts", "tests"
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied() -> None:
    result = _run(
        str(BIN / "ruff"),
        "format",
        "--check",
        "orchestrator",
        "actors",
        "deployments",
        "scripts",
        "tests",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean_on_the_domain_core() -> None:
    result = _run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_domain_core_does_not_import_ray() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "orchestrator").rglob("*.py")
        if any(
            line.strip().startswith(("import ray", "from ray"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []
