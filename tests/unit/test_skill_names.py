"""Skill names, tags and references as clients send them (issue 33, SPEC part 2's skill)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ValidationFailed
from orchestrator.marketplace._store import check_name, normalize_tags, parse_skill_ref


@pytest.mark.parametrize(
    "sent,stored",
    [
        ("PDF Reader", "PDF Reader"),
        ("  trimmed  ", "trimmed"),
        ("要約ツール", "要約ツール"),
        ("nai\u0308ve", "naïve"),  # NFD in, NFC stored
        ("a@b", "a@b"),
        ("x" * 64, "x" * 64),
    ],
)
def test_names_kept_as_sent(sent: str, stored: str) -> None:
    assert check_name(sent) == stored


@pytest.mark.parametrize(
    "name",
    ["", " ", "a/b", "x\x00y", "tab\tx", "\x7f", "\u200e", "v@12", "Search", "x" * 65, ".", ".."],
)
def test_names_refused(name: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_name(name)
    assert caught.value.extra["fields"][0]["field"] == "name"


def test_tags() -> None:
    assert normalize_tags(["Data Science", "data science", "日本語", "C#"]) == [
        "data science",
        "日本語",
        "c#",
    ]
    for bad in ["a,b", "a/b", "\x01", "", "t" * 33]:
        with pytest.raises(ValidationFailed):
            normalize_tags([bad])


@pytest.mark.parametrize(
    "ref,parsed",
    [
        ("PDF Reader", (None, "PDF Reader", None)),
        ("PDF Reader@3", (None, "PDF Reader", 3)),
        ("ann/要約ツール@2", ("ann", "要約ツール", 2)),
        ("ann/a@b", ("ann", "a@b", None)),
        ("pdf-reader", (None, "pdf-reader", None)),
    ],
)
def test_references(ref: str, parsed: tuple[str | None, str, int | None]) -> None:
    assert parse_skill_ref(ref) == parsed
