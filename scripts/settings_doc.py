#!/usr/bin/env python3
"""Print the README's configuration table from `Settings` (or, with --write, replace it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from orchestrator.config import Settings

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| Key | Default | Meaning |\n|---|---|---|\n"


def table() -> str:
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        if name == "data_dir":
            default = "./.orchestrator"
        shown = (
            "unset"
            if default is None or hasattr(default, "get_secret_value")
            else (json.dumps(default, default=str))
        )
        rows.append(f"| `{name}` | `{shown}` | {field.description} |\n")
    return "".join(rows)


def main() -> int:
    if "--write" not in sys.argv:
        print(table(), end="")
        return 0
    text = README.read_text()
    start = text.index(HEADER) + len(HEADER)
    end = text.index("\n## ", start)
    README.write_text(text[:start] + table() + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
