"""The README documents every setting and the two set-up commands."""

from pathlib import Path

from orchestrator.config import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [name for name in Settings.model_fields if f"| `{name}` |" not in README]
    assert missing == []


def test_quick_start_has_the_two_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "scripts/serve" in quick and "scripts/test" in quick and "curl" in quick
