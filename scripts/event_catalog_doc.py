#!/usr/bin/env python3
"""Print the event catalog's tables of docs/api/events.md from `CATALOG` (or, with --write,
replace them there, between their two markers). tests/unit/test_event_catalog_doc.py fails
when the page and this script differ."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.events._reference import BEGIN, END, catalog_tables

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api" / "events.md"


def replaced(text: str) -> str:
    """`text` with the part from BEGIN to END (inclusive) replaced by the tables."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + catalog_tables() + text[end:]


def main() -> int:
    if "--write" not in sys.argv:
        print(catalog_tables())
        return 0
    PAGE.write_text(replaced(PAGE.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
