"""docs/architecture.md's tree against the package: every module file of bertscope, its kernels and
its analyses appears in the tree, and every file the tree names exists (issue 35: the tree had lost
models/architectures.py, data/decoders.py, tasks/lm.py and analyses/heads/lm.py).

The tree is read as it is written: two spaces of indentation per folder level; on a line, the
leading words ending in "/" are folders (`{a,b}/` is two), the words ending in ".py" files of the line's
one folder (or, on a line of files alone, of the folder above), anything else prose. `<family>/`
names the role files every analysis folder may hold; an analysis folder's other files are listed
on its own line. `__init__.py` files are not listed (neither kernels/ nor analyses/ has one:
docs/architecture.md, "The top-level folders").
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bertscope", "kernels", "analyses")  # the folders imported as bertscope, .kernels, .analyses


def tree_lines() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```\n(bertscope/ .*?)```", text, re.S)
    assert block, "docs/architecture.md has no tree starting with bertscope/"
    return block.group(1).splitlines()


def expand(word: str) -> list[str]:
    """`probes/{a,b}/` -> ["probes/a", "probes/b"]; `engine/` -> ["engine"]."""
    m = re.fullmatch(r"(.*?)\{([^}]*)\}(.*)/", word)
    if m:
        return [f"{m.group(1)}{name}{m.group(3)}".strip("/") for name in m.group(2).split(",")]
    return [word.rstrip("/")]


def read_tree() -> tuple[dict[str, set[str]], set[str]]:
    """(folder -> the files the tree names in it, the role files of `<family>/`); folders relative
    to the repository root."""
    files: dict[str, set[str]] = {}
    roles: set[str] = set()
    parents: list[str] = []  # the folder at each indentation level
    for line in tree_lines():
        if not line.strip():
            continue
        level = (len(line) - len(line.lstrip(" "))) // 2
        words = line.split()
        folders = []  # the line's leading folder words; later ones are prose ("mirrors the layout: kernels/ ...")
        for w in words:
            if not w.endswith("/"):
                break
            folders.append(w)
        names = [w for w in words if re.fullmatch(r"[\w.]+\.py", w)]
        base = "/".join(parents[:level])
        if words[0] == "<family>/":
            roles.update(names)
            continue
        if folders and words[0] in folders:
            paths = [f"{base}/{f}".strip("/") for w in folders for f in expand(w)]
            if len(paths) == 1:  # the folder of the lines indented below it
                parents[level:] = [paths[0][len(base):].strip("/")]
            for path in paths:
                files.setdefault(path, set())
            if names:
                assert len(paths) == 1, f"files on a line of several folders: {line!r}"
                files[paths[0]] |= set(names)
        elif names and level > 0:
            files.setdefault(base, set()).update(names)
    return files, roles


def test_the_tree_reads_as_the_docstring_says():
    files, roles = read_tree()
    assert roles == {"command.py", "stats.py", "plots.py", "section.py", "paper.py", "outputs.py"}
    assert "lm_loss.py" in files["bertscope/tasks"] and "lm_prune.py" in files["analyses/heads/prune"]
    assert files["bertscope/data/readers"] and "probes/syntax" in " ".join(files)


def test_every_file_the_tree_names_exists():
    files, _ = read_tree()
    for folder, names in files.items():
        if folder.split("/")[0] not in PACKAGES:
            continue
        assert (ROOT / folder).is_dir(), f"the tree names a folder {folder}/ that does not exist"
        for name in names:
            assert (ROOT / folder / name).is_file(), f"the tree names {folder}/{name}, which does not exist"


def test_every_module_file_of_the_package_is_in_the_tree():
    files, roles = read_tree()
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            folder, name = str(rel.parent), rel.name
            if name == "__init__.py":
                continue
            family = package == "analyses" and folder != "analyses"
            if name in files.get(folder, set()) or family and name in roles and folder in files:
                continue
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md's tree does not list {', '.join(missing)}"
