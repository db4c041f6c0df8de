"""A non-editable install holds every module and data file of the source tree.

`make test` installs bertscope in editable mode, which maps the source folders and so never
notices a package missing from setup.py's `packages` (a subpackage of the core, say): a user's
`pip install .` would then fail on its first import. `setup.py build_py` lays out exactly what a
wheel would hold, and every source module and package data file must be there.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"bertscope": ROOT / "bertscope", "bertscope/kernels": ROOT / "kernels",
           "bertscope/analyses": ROOT / "analyses"}
DATA_FILES = ["bertscope/view_template.html", "bertscope/data/manifest.json",
              "bertscope/data/requirements-defaults.txt", "bertscope/kernels/cpu_rows.c",
              "bertscope/analyses/heads/retrieval/needles.jsonl"]


def test_the_built_package_holds_every_module_and_data_file(tmp_path):
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = {f"{target}/{path.relative_to(folder).as_posix()}" for target, folder in SOURCES.items()
                for path in folder.rglob("*.py") if "__pycache__" not in path.parts}
    built = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file()}
    assert len(expected) > 100
    assert expected - built == set()
    assert set(DATA_FILES) - built == set()
