"""The README stays short and every relative link in it and in docs/ leads somewhere: a
moved or renamed page (or heading) fails here rather than on GitHub."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 220

# [text](target) or [text](target "title"); images too.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:...


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link inside one is code, not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens,
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text()):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links() -> list[tuple[Path, str]]:
    found = []
    for page in PAGES:
        for line in _prose(page.read_text()):
            for target in LINK.findall(line):
                if not EXTERNAL.match(target):
                    found.append((page, target))
    return found


def test_pages_have_links_to_check() -> None:
    assert len(PAGES) > 10 and len(_links()) > 20


def test_every_relative_link_points_to_a_file_in_the_repository() -> None:
    broken = []
    for page, target in _links():
        path = target.split("#", 1)[0]
        if not path:
            continue  # an anchor on the same page: checked below
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_anchor_names_a_heading_of_its_page() -> None:
    broken = []
    for page, target in _links():
        if "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        resolved = (page.parent / path).resolve() if path else page
        if resolved.suffix == ".md" and resolved.exists() and anchor not in _anchors(resolved):
            broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_readme_is_a_page_a_newcomer_reads_in_minutes() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"
