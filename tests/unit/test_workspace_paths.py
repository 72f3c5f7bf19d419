"""Workspace path rules on text alone (no files): what a caller may name, glob segments,
match counting for edits, timestamps, user directory names."""

from __future__ import annotations

import datetime as dt
import pickle
import re

import pytest

from orchestrator.errors import BadRequest
from orchestrator.workspace import MAX_PATH_BYTES, MAX_SEGMENT_BYTES, UnsafePath
from orchestrator.workspace._paths import (
    TMP_PREFIX,
    count_matches,
    file_parts,
    glob_parts,
    iso_utc,
    split_path,
    user_dir_name,
)


@pytest.mark.parametrize(
    "path,parts",
    [
        ("", ()),
        (".", ()),
        ("./", ()),
        ("a", ("a",)),
        ("a/b/c.txt", ("a", "b", "c.txt")),
        ("a//b", ("a", "b")),
        ("./a/./b/", ("a", "b")),
        ("...", ("...",)),  # a name, not a parent
        ("..a/b..", ("..a", "b..")),
        ("~/x", ("~", "x")),  # no home expansion: a directory called ~
        ("100%.txt", ("100%.txt",)),  # not an escape
        ("a%20b", ("a%20b",)),  # decodes to something harmless: kept literally
        ("a%2Fb", ("a%2Fb",)),  # an encoded '/' that does not climb: a literal name
        ("C:/x", ("C:", "x")),  # just a directory named C:
        ("é/日本.md", ("é", "日本.md")),
        ("a" * MAX_SEGMENT_BYTES, ("a" * MAX_SEGMENT_BYTES,)),
    ],
)
def test_accepted_paths_normalise(path: str, parts: tuple[str, ...]) -> None:
    assert split_path(path) == parts


@pytest.mark.parametrize(
    "path,reason",
    [
        ("..", "'..'"),
        ("../x", "'..'"),
        ("a/..", "'..'"),
        ("a/../b", "'..'"),
        ("a/../../b", "'..'"),
        ("./../x", "'..'"),
        ("a/./../../x", "'..'"),
        ("/", "relative"),
        ("/etc/passwd", "relative"),
        ("//etc", "relative"),
        ("a\\b", "backslash"),
        ("..\\..\\etc", "backslash"),
        ("\\etc\\passwd", "backslash"),
        ("C:\\Windows", "backslash"),
        ("a\x00b", "NUL"),
        ("x.txt\x00.png", "NUL"),
        ("a\nb", "control"),
        ("a\x7fb", "control"),
        ("\tx", "control"),
        ("%2e%2e/x", "percent-decoded"),
        ("%2E%2E/x", "percent-decoded"),
        (".%2e/x", "percent-decoded"),
        ("%2e%2e%2fetc%2fpasswd", "percent-decoded"),
        ("..%2fetc", "percent-decoded"),
        ("%252e%252e/x", "percent-decoded"),  # encoded twice
        ("%25252e%25252e/x", "percent-decoded"),  # three times
        ("%2fetc%2fpasswd", "percent-decoded"),
        ("a%5cb", "percent-decoded"),
        ("a%00b", "percent-decoded"),
        ("x" * (MAX_SEGMENT_BYTES + 1), "segment"),
        ("é" * 128, "segment"),  # 256 bytes in 128 characters
        ("a/" * (MAX_PATH_BYTES // 2 + 1), "longer"),
        ("x" * 100_000, "longer"),
        (TMP_PREFIX + "abc", "reserved"),
        ("dir/" + TMP_PREFIX + "1/x", "reserved"),
    ],
)
def test_rejected_paths(path: str, reason: str) -> None:
    with pytest.raises(UnsafePath) as caught:
        split_path(path)
    assert reason in caught.value.message
    assert caught.value.status_code == 400 and caught.value.code == "unsafe_path"


def test_non_string_is_rejected() -> None:
    with pytest.raises(UnsafePath):
        split_path(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["", ".", "a/", "a/b/", "./"])
def test_file_operations_need_a_file_name(path: str) -> None:
    with pytest.raises(BadRequest, match="must name a file"):
        file_parts(path)
    assert file_parts("a/b.txt") == ("a", "b.txt")


def test_unsafe_path_pickles_as_itself() -> None:
    err = pickle.loads(pickle.dumps(UnsafePath("nope")))
    assert type(err) is UnsafePath and err.code == "unsafe_path" and err.status_code == 400


@pytest.mark.parametrize(
    "query,parts",
    [
        ("*.py", ("*.py",)),
        ("**/*.py", ("**", "*.py")),
        ("src/**/test_?.py", ("src", "**", "test_?.py")),
        ("**", ("**",)),
        ("[ab]*/x", ("[ab]*", "x")),
    ],
)
def test_glob_segments(query: str, parts: tuple[str, ...]) -> None:
    assert glob_parts(query) == parts


@pytest.mark.parametrize(
    "query,error",
    [
        ("../*", UnsafePath),
        ("**/../*", UnsafePath),
        ("/etc/*", UnsafePath),
        ("%2e%2e/*", UnsafePath),
        ("a\\*", UnsafePath),
        ("a**b", BadRequest),
        ("**x/y", BadRequest),
        ("", BadRequest),
        (".", BadRequest),
    ],
)
def test_bad_globs(query: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        glob_parts(query)


@pytest.mark.parametrize(
    "text,old,n",
    [
        ("hello world", "world", 1),
        ("hello world", "planet", 0),
        ("a-a-a", "a", 3),
        ("aaa", "aa", 2),  # overlapping: ambiguous although str.count says 1
        ("abab", "ab", 2),
        ("aaaa", "aa", 2),  # two without overlap: that is already ambiguous
        ("x\ny\n", "y\n", 1),
    ],
)
def test_count_matches(text: str, old: str, n: int) -> None:
    assert count_matches(text, old) == n


def test_iso_utc_is_z_terminated_with_milliseconds() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1714564800.1239) == "2024-05-01T12:00:00.123Z"
    now = dt.datetime.now(dt.UTC).timestamp()
    text = iso_utc(now)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    back = dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    assert abs(back - now) < 0.001


def test_user_directory_names() -> None:
    assert user_dir_name("ann") == "ann"
    assert user_dir_name("ann@example.com") == "ann@example.com"
    hashed = {user_dir_name(u) for u in ("../x", "auth0|123", "a/b", "..", ".", "~x", "")}
    assert len(hashed) == 7  # all distinct
    for name in hashed:
        assert name.startswith("~") and re.fullmatch(r"~[0-9a-f]{40}", name)
    assert user_dir_name("../x") == user_dir_name("../x")  # stable
