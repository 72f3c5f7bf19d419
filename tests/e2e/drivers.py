"""What a Ray driver run by an e2e test printed as its result."""

from __future__ import annotations

import json
from typing import Any


def last_json_line(stdout: str) -> Any:
    """The last line of `stdout` that is a JSON document. Ray prints some warnings to every
    driver's stdout whatever `log_to_driver` says (the raylet's 'N PYTHON worker processes
    have been started'), so the result line is not always the last one."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no JSON line in the driver's output: {stdout[-2000:]!r}")
