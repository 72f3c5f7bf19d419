#!/usr/bin/env python3
"""Generate the blocking SDK client, orchestrator/sdk/_sync, from the asyncio one,
orchestrator/sdk/_async, with unasync (the [test] extra): `async def` becomes `def`, `await`,
`async with` and `async for` lose their `async`, and names are mapped by unasync's table and
REPLACEMENTS below. The output is then put through `ruff check --fix` and `ruff format` (the
lines it shortens, the imports it reorders), so it reads as the rest of the tree.

    python scripts/unasync_sdk.py          # rewrite orchestrator/sdk/_sync
    python scripts/unasync_sdk.py --check  # exit 1 when it is not what the script makes

tests/unit/test_sdk_generated.py regenerates in a temporary directory and compares byte for
byte, so an edit of _sync by hand, or of _async without running this, fails there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parents[1]
ASYNC = ROOT / "orchestrator" / "sdk" / "_async"
SYNC = ROOT / "orchestrator" / "sdk" / "_sync"

# Beyond unasync's own table (__aenter__, AsyncIterator, AsyncGenerator, StopAsyncIteration,
# ...) and its rule that `AsyncName` becomes `SyncName`.
REPLACEMENTS = {
    "_async": "_sync",
    "AsyncClient": "Client",
    "AsyncServeTransport": "ServeTransport",
    "asyncio": "time",  # the modules use asyncio for sleep only
    "aclose": "close",
    "aclosing": "closing",
    "aiter_lines": "iter_lines",
    "aread": "read",
}
HEADER = "# Generated from orchestrator/sdk/_async/{name} by scripts/unasync_sdk.py: do not edit.\n"


def _ruff(text: str, path: Path) -> str:
    """`ruff check --fix` then `ruff format`, with the project's settings for `path` (named
    explicitly: ruff finds none from a path whose folder does not exist yet)."""
    settings = ["--config", str(ROOT / "pyproject.toml")]
    for argv in (["check", "--fix", "--quiet", "--exit-zero"], ["format"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *argv, *settings, "--stdin-filename", str(path), "-"],
            input=text,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        )
        text = done.stdout
    return text


def generate() -> dict[str, str]:
    """The text of each module of _sync, by file name, made from _async as it is now."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "_async"
        shutil.copytree(ASYNC, source, ignore=shutil.ignore_patterns("__pycache__"))
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(p) for p in sorted(source.glob("*.py"))], [rule])
        made = {}
        for path in sorted((Path(tmp) / "_sync").glob("*.py")):
            text = HEADER.format(name=path.name) + path.read_text()
            made[path.name] = _ruff(text, SYNC / path.name)
    return made


def differences(made: dict[str, str]) -> list[str]:
    """The modules of _sync that are not what `generate` makes (missing, changed or extra)."""
    present = {p.name: p.read_text() for p in SYNC.glob("*.py")} if SYNC.exists() else {}
    return sorted(
        name for name in made.keys() | present.keys() if made.get(name) != present.get(name)
    )


def main(argv: list[str]) -> int:
    made = generate()
    if "--check" in argv:
        stale = differences(made)
        if stale:
            print(f"orchestrator/sdk/_sync differs ({', '.join(stale)}): run {__file__}")
            return 1
        return 0
    if SYNC.exists():
        shutil.rmtree(SYNC)
    SYNC.mkdir()
    for name, text in made.items():
        (SYNC / name).write_text(text)
    print(f"wrote {len(made)} modules to {SYNC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
