"""No folder of the checkout shadows an installed package (issue 47).

Python started in the checkout's root puts the root first on `sys.path`: `python -c`, standard input
(as a notebook kept in the root does), `python -m pytest`, `torchrun -m bertscope.cli`. A folder
there with an `__init__.py` then wins over any installed package of its name. transformers 5.25
imports Hugging Face's `kernels` while it loads `modeling_utils`, and our `kernels/` folder had
an `__init__.py`: every model load from the root failed. docs/architecture.md ("The top-level
folders") says how the tree avoids it; these tests start Python each of those ways from the root
and check that the installed package is the one imported, with Hugging Face's `kernels` where it is
installed and always with a stand-in package of each top-level folder's name.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the checkout's top-level folders of Python source, which must never be regular packages
SOURCE_FOLDERS = sorted(p.name for p in ROOT.iterdir()
                        if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.py")))

# imports transformers' model code (which imports `kernels` from transformers 5.25 on) and every
# bertscope module, then prints where each top-level name came from
PROBE = r"""
import importlib, pkgutil, sys
import transformers.modeling_utils
import bertscope, bertscope.kernels, bertscope.analyses
names = set()
for package in (bertscope, bertscope.kernels, bertscope.analyses):
    names |= {m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")}
for name in sorted(n for n in names if not n.endswith("__main__")):
    importlib.import_module(name)
for top in sys.argv[1:] or ["kernels", "analyses"]:
    module = importlib.import_module(top)
    print(top, getattr(module, "__file__", None) or list(module.__path__))
print("modules", len(names))
"""


def stand_ins(tmp_path: Path) -> Path:
    """A folder of installed-looking packages named `kernels` and `analyses`, put on PYTHONPATH: it
    comes after the root on `sys.path`, as site-packages does, so each must win over the root's folder."""
    site = tmp_path / "site"
    for name in ("kernels", "analyses"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"STAND_IN = {name!r}\n")
    return site


def environment(site: Path | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def origins(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.strip().splitlines() if " " in line)


def test_no_top_level_source_folder_is_a_package():
    """Only bertscope/ is a regular package at the root; kernels/ and analyses/ are reached through the
    links in bertscope/, and both are found by the walk of the root (the check has something to check)."""
    assert {"bertscope", "kernels", "analyses"} <= set(SOURCE_FOLDERS)
    packages = [name for name in SOURCE_FOLDERS if (ROOT / name / "__init__.py").exists()]
    assert packages == ["bertscope"], packages
    for name in ("kernels", "analyses"):
        link = ROOT / "bertscope" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link


@pytest.mark.parametrize("how", ["python -c", "standard input"])
def test_the_installed_package_wins_from_the_root(tmp_path, how):
    site = stand_ins(tmp_path)
    command = [sys.executable, "-c", PROBE] if how == "python -c" else [sys.executable, "-"]
    done = subprocess.run(command, input=None if how == "python -c" else PROBE, cwd=ROOT, env=environment(site),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = origins(done.stdout)
    assert found["kernels"] == str(site / "kernels" / "__init__.py")
    assert found["analyses"] == str(site / "analyses" / "__init__.py")
    assert int(found["modules"]) >= 100  # every module of bertscope, its kernels and analyses was imported


@pytest.mark.skipif(importlib.util.find_spec("kernels") is None,
                    reason="Hugging Face's kernels is not installed (transformers before 5.25 does not need it)")
def test_hugging_face_kernels_is_the_one_imported_from_the_root():
    """The failure the issue found: transformers 5.25's own `kernels` against our folder."""
    from importlib.metadata import distribution

    done = subprocess.run([sys.executable, "-c", PROBE, "kernels"], cwd=ROOT, env=environment(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = Path(distribution("kernels").locate_file("kernels/__init__.py"))
    assert Path(origins(done.stdout)["kernels"]) == installed


def test_pytest_started_in_the_root_imports_the_installed_package(tmp_path):
    site = stand_ins(tmp_path)
    probe = tmp_path / "test_probe.py"
    probe.write_text("import kernels\nimport transformers.modeling_utils\nimport bertscope.kernels.backends\n"
                     "import bertscope.analyses.registry\n\n"
                     "def test_probe():\n    assert kernels.STAND_IN == 'kernels'\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(probe)], cwd=ROOT, env=environment(site), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout


def test_torchrun_from_the_root_runs_a_command(tmp_path, tiny_checkpoint):
    """`torchrun -m bertscope.cli` from the root: a model loads (transformers' model code imports
    `kernels`) and the run writes its table, with a stand-in `kernels` after the root on sys.path."""
    site = stand_ins(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. It was warm.\nA dog barked at the moon, twice.\n")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port",
                           "29431", "-m", "bertscope.cli", "run", "--model", str(tiny_checkpoint), "--corpus",
                           str(corpus), "--limit", "all", "--max-len", "32", "--out", str(out), "--quiet",
                           "--no-figures"], cwd=ROOT, env=environment(site), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len((out / "heads.csv").read_text().splitlines()) > 1
