"""The console's vendored Preact+htm is the file `scripts/build-ui` built from the lock: its
sha256 is the recorded one, and the lock pins the version recorded with it (integrity hash
included), so the committed asset can be rebuilt and checked."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "deployments" / "ui" / "static"
VENDOR = STATIC / "vendor"
SINKS = (
    r"\.(inner|outer)HTML\b|dangerouslySetInnerHTML\s*=|insertAdjacentHTML"
    r"|document\.write|\beval\(|new Function\("
)


def _sums() -> tuple[dict[str, str], str]:
    sums: dict[str, str] = {}
    version = ""
    for line in (VENDOR / "SHA256SUMS").read_text().splitlines():
        if line.startswith("# htm "):
            version = line.split()[-1]
        elif line.strip():
            digest, name = line.split()
            sums[name.lstrip("*")] = digest
    return sums, version


def test_vendor_file_matches_recorded_sha256() -> None:
    sums, _ = _sums()
    assert set(sums) == {"preact-htm.module.js"}
    data = (VENDOR / "preact-htm.module.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sums["preact-htm.module.js"]
    # The exports the console imports.
    exports = re.search(rb"export\{([^}]*)\}", data)
    assert exports is not None
    names = {part.split(b" as ")[-1].strip().decode() for part in exports.group(1).split(b",")}
    assert {"html", "render", "useState", "useEffect", "useRef", "useCallback"} <= names


def test_lock_pins_the_vendored_version() -> None:
    _, version = _sums()
    package = json.loads((ROOT / "ui" / "package.json").read_text())
    lock = json.loads((ROOT / "ui" / "package-lock.json").read_text())
    assert package["dependencies"]["htm"] == version  # exact, not a range
    entry = lock["packages"]["node_modules/htm"]
    assert entry["version"] == version
    assert entry["integrity"].startswith("sha512-")
    assert lock["packages"][""]["dependencies"]["htm"] == version


def test_console_modules_import_only_relative_files() -> None:
    """No bare specifiers (there is no import map: CSP forbids the inline script it needs) and
    nothing from another origin; every imported file exists."""
    for path in STATIC.rglob("*.js"):
        if path.parent == VENDOR:
            continue
        text = path.read_text()
        for spec in re.findall(r"""(?:from|import)\s*\(?\s*["'`]([^"'`]+)["'`]""", text):
            assert spec.startswith("./") or spec.startswith("../"), (path, spec)
            if "${" not in spec:
                assert (path.parent / spec).resolve().is_file(), (path, spec)
        # Markup from strings (what an injected payload would need) is never made.
        assert not re.search(SINKS, text), (path, re.search(SINKS, text))
