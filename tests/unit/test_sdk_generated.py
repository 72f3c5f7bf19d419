"""The blocking client (orchestrator/sdk/_sync) is what scripts/unasync_sdk.py generates from
the asyncio one (orchestrator/sdk/_async), byte for byte: regenerated here in a temporary
directory and compared with the committed files."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_sdk", ROOT / "scripts/unasync_sdk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:  # pragma: no cover - an environment without [test]
        raise AssertionError(f"{exc.name} comes with the [test] extra") from exc
    return module


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    script = _script()
    made = script.generate()
    assert set(made) == {p.name for p in (ROOT / "orchestrator/sdk/_async").glob("*.py")}
    assert script.differences(made) == [], "run scripts/unasync_sdk.py"


def test_the_generated_modules_say_so() -> None:
    for path in (ROOT / "orchestrator/sdk/_sync").glob("*.py"):
        assert path.read_text().startswith("# Generated from orchestrator/sdk/_async/"), path
