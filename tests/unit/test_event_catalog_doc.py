"""docs/api/events.md lists every type of the catalog, what emits it and its data fields:
the tables there are what scripts/event_catalog_doc.py writes from CATALOG (issue 33)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from orchestrator.events import CATALOG
from orchestrator.events._reference import BEGIN, EMITTED_BY, END, catalog_tables

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "event_catalog_doc.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("event_catalog_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_type_says_what_emits_it() -> None:
    assert set(EMITTED_BY) == set(CATALOG)
    assert all(text.strip() for text in EMITTED_BY.values())


def test_the_page_holds_the_generated_tables() -> None:
    script = _script()
    page = script.PAGE.read_text()
    assert page.count(BEGIN) == 1 and page.count(END) == 1
    assert script.replaced(page) == page, "run: python scripts/event_catalog_doc.py --write"


def test_each_type_has_a_row_with_its_aggregate_key_and_fields() -> None:
    tables = catalog_tables()
    for kind in CATALOG.values():
        row = next(r for r in tables.splitlines() if r.startswith(f"| `{kind.name}` |"))
        assert f"| `{kind.aggregate_key}` |" in row
        for name, info in kind.model.model_fields.items():
            assert f"`{info.alias or name}`" in row
