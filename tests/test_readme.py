"""The documentation's Python examples run as written, and its relative links resolve.

Every ```python block of README.md runs, in order, in one namespace; so does every block of
docs/api.md (the full Python API page), in a namespace of its own. Every relative link and image
in README.md and docs/*.md points to a file that exists, and a `#anchor` into a Markdown file
names one of its headings.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
API = ROOT / "docs" / "api.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.M | re.S)


def run_blocks(path: Path) -> None:
    namespace = {}
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), namespace)  # the documentation's own code


def test_readme_python_blocks_run(minilm_path, single_thread, capsys):
    assert len(python_blocks(README)) >= 1
    run_blocks(README)
    assert "layer" in capsys.readouterr().out


def test_api_page_python_blocks_run(minilm_path, single_thread, capsys):
    assert len(python_blocks(API)) >= 3
    run_blocks(API)
    out = capsys.readouterr().out
    assert "layer" in out and "part_a_part_a" in out
    assert "is the layer of the most important head for this loss" in out


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def links(path: Path) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose(path.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.*)$", text, flags=re.M)}


def test_links_check_finds_broken_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](missing.md) ![img](nope.png) `[code](x.md)`\n")
    assert links(page) == ["page.md#title", "missing.md", "nope.png"]
    assert slug("## `bertscope probe syntax`: heads as parsers (Table 1)".lstrip("# ")) == (
        "bertscope-probe-syntax-heads-as-parsers-table-1")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor within the page
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve()
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def latest_cpu_run() -> dict[str, str]:
    """docs/performance.md's "Latest run" table, its one row: column name -> cell."""
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    section = text.split("## Latest run", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
    header, row = ([c.strip() for c in line.strip("|").split("|")] for line in rows[:2])
    return dict(zip(header, row))


def test_the_readme_quotes_the_latest_cpu_run():
    """The README's CPU figures are the newest table's: its date, load, run count, medians and ranges (issue 47:
    the README gave 0.92x / 0.98x while the newest run said 0.76-0.89x)."""
    run = latest_cpu_run()
    readme = " ".join(README.read_text(encoding="utf-8").split())
    (m128, r128), (m512, r512) = (re.fullmatch(r"(\S+) \((\S+)\)", run[f"L = {n}"]).groups() for n in (128, 512))
    load = re.search(r"load ([\d.]+-[\d.]+)", run["machine and load"]).group(1)
    quoted = (f"{m128} of an SDPA forward without statistics at L = 128 and {m512} at L = 512: the median of "
              f"{run['runs']} runs on {run['date']}, ranges {r128} and {r512}")
    assert quoted in readme, quoted
    assert f"at a load of {load}" in readme
