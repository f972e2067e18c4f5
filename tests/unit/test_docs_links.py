"""The README and docs/ link to each other: every relative link and #anchor must land somewhere.

The reference moved out of README.md into docs/ one page per topic; a renamed heading or a moved
section would otherwise leave a link that opens the right page at the wrong place, or no page at all.
Anchors are computed as GitHub renders them.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(path):
    """The lines of a Markdown file outside fenced code blocks (a `# comment` in a block is no heading)."""
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped (not `-` or `_`), spaces to `-`."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path):
    for line in prose_lines(path):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: leave the repository
                yield target


def test_the_pages_are_found():
    names = {page.name for page in PAGES}
    assert {"README.md", "openai.md", "anthropic.md", "responses.md", "ollama.md", "operations.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            broken.append(f"{target}: no file {destination.relative_to(ROOT)}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_first_screen_starts_and_tests():
    """A newcomer sees how to serve and how to run the suite without scrolling."""
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "./launch.sh start" in first_screen
    assert "./launch.sh test" in first_screen


def test_slug_matches_github():
    assert slug("Tool calls cut by max_tokens") == "tool-calls-cut-by-max_tokens"
    assert slug("Ollama API, Open WebUI and VS Code Copilot") == "ollama-api-open-webui-and-vs-code-copilot"
    assert slug("The mlx.launch CPU-spin workaround") == "the-mlxlaunch-cpu-spin-workaround"
