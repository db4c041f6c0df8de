"""No folder of the checkout shadows an installed package (issue 47).

Python started in the checkout's root puts the root first on `sys.path`: `python -c`, standard input
(as a notebook kept in the root does), `python -m pytest`, `torchrun -m bertscope.cli`. A folder
there with an `__init__.py` then wins over any installed package of its name. transformers 5.25
imports Hugging Face's `kernels` while it loads `modeling_utils`, and our `kernels/` folder had
an `__init__.py`: every model load from the root failed. docs/architecture.md ("The top-level
folders") says how the tree avoids it; these tests start Python each of those ways from the root
and check that the installed package is the one imported, with Hugging Face's `kernels` where it is
installed, and a stand-in package for each top-level folder's name that no installed package has.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.smoke
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
for top in ("kernels", "analyses"):
    module = importlib.import_module(top)
    print(top, getattr(module, "__file__", None) or list(module.__path__))
print("modules", len(names))
"""


# a test file run by pytest started in the root: transformers' model code, bertscope, and each name's origin
PYTEST_PROBE = """
import importlib
import transformers.modeling_utils
import bertscope.analyses.registry
import bertscope.kernels.backends


def test_probe():
    expected = EXPECTED
    assert {name: importlib.import_module(name).__file__ for name in expected} == expected
"""


def installed_file(name: str) -> Path | None:
    """The installed package `name`'s __init__.py, found as Python started outside the checkout finds it."""
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def stand_ins(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """A folder to put on PYTHONPATH (after the root on sys.path, as site-packages is) holding a stand-in
    package for each top-level folder's name that no installed package has, and the file each name must
    be imported from: Hugging Face's `kernels` where it is installed (transformers 5.25 needs the real
    one), a stand-in otherwise."""
    site, expected = tmp_path / "site", {}
    for name in ("kernels", "analyses"):
        expected[name] = installed_file(name)
        if expected[name] is None:
            (site / name).mkdir(parents=True)
            (site / name / "__init__.py").write_text(f"STAND_IN = {name!r}\n")
            expected[name] = site / name / "__init__.py"
    return site, expected


def environment(site: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
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


def test_hugging_face_kernels_is_installed_with_the_lock():
    """transformers 5.25 and later depend on Hugging Face's `kernels`: with the lock's transformers, the
    tests below check the real package against our folder, not only a stand-in."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    if Version(version("transformers")) < Version("5.25"):
        pytest.skip(f"transformers {version('transformers')} does not depend on kernels")
    try:
        version("kernels")
    except PackageNotFoundError:
        pytest.fail("transformers >= 5.25 is installed without Hugging Face's kernels")
    found = installed_file("kernels")
    assert found is not None and found.parent != ROOT / "kernels" and "site-packages" in found.parts, found


@pytest.mark.parametrize("how", ["python -c", "standard input"])
def test_the_installed_package_wins_from_the_root(tmp_path, how):
    site, expected = stand_ins(tmp_path)
    command = [sys.executable, "-c", PROBE] if how == "python -c" else [sys.executable, "-"]
    done = subprocess.run(command, input=None if how == "python -c" else PROBE, cwd=ROOT, env=environment(site),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = origins(done.stdout)
    assert {name: Path(found[name]) for name in expected} == expected
    assert int(found["modules"]) >= 100  # every module of bertscope, its kernels and analyses was imported


def test_pytest_started_in_the_root_imports_the_installed_package(tmp_path):
    site, expected = stand_ins(tmp_path)
    probe = tmp_path / "test_probe.py"
    files = {name: str(path) for name, path in expected.items()}
    probe.write_text(PYTEST_PROBE.replace("EXPECTED", repr(files)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(probe)], cwd=ROOT, env=environment(site), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout


def test_torchrun_from_the_root_runs_a_command(tmp_path, tiny_checkpoint):
    """`torchrun -m bertscope.cli` from the root: a model loads (transformers' model code imports
    `kernels`) and the run writes its table, with a stand-in `kernels` after the root on sys.path."""
    site, _ = stand_ins(tmp_path)
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
