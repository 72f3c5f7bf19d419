"""The README's Quick start has the two set-up commands; docs/configuration.md's settings
table is exactly what scripts/settings_doc.py generates from `Settings`."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _settings_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts/settings_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_table_is_the_generated_one() -> None:
    doc = _settings_doc()
    page = (ROOT / "docs" / "configuration.md").read_text()
    start, end = doc.table_span(page)
    assert page[start:end] == doc.table(), "run scripts/settings_doc.py --write"


def test_quick_start_has_the_two_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "scripts/serve" in quick and "scripts/test" in quick and "curl" in quick
