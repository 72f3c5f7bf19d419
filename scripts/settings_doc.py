#!/usr/bin/env python3
"""Print the settings table of docs/configuration.md from `Settings` (or, with --write,
replace it there). tests/unit/test_readme.py fails when the page and this script differ."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from orchestrator.config import Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADER = "| Key | Default | Meaning |\n|---|---|---|\n"


def table() -> str:
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        if name == "data_dir":
            default = "./.orchestrator"
        if name == "embedder":  # depends on the install: the page says how
            default = "local, or none without the [embed] extra"
        shown = (
            "unset"
            if default is None or hasattr(default, "get_secret_value")
            else (json.dumps(default, default=str))
        )
        rows.append(f"| `{name}` | `{shown}` | {field.description} |\n")
    return "".join(rows)


def table_span(text: str) -> tuple[int, int]:
    """Where the table's rows are in the page: after its header, up to the first line that
    is not a row (the page may end there)."""
    start = text.index(HEADER) + len(HEADER)
    end = start
    while text.startswith("| `", end):
        end = text.index("\n", end) + 1
    return start, end


def main() -> int:
    if "--write" not in sys.argv:
        print(table(), end="")
        return 0
    text = PAGE.read_text()
    start, end = table_span(text)
    PAGE.write_text(text[:start] + table() + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
