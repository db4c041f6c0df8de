"""The smoke tests of `make test-latest` (tools/releases.py) are found where tools/releases.py looks for them:
every test marked smoke is in one of the files it names, and each file it names holds some."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def marked_smoke(path: Path) -> bool:
    return "pytest.mark.smoke" in path.read_text(encoding="utf-8")


def test_the_smoke_files_are_every_file_with_a_smoke_test():
    tree = ast.parse((ROOT / "tools" / "releases.py").read_text(encoding="utf-8"))
    smoke = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SMOKE")
    named = {f for f in smoke if f.endswith(".py")}
    assert smoke[-2:] == ["-m", "smoke"]
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if marked_smoke(p)}
    found.discard("tests/test_smoke_selection.py")
    assert named == found
