"""Nothing in the repository names a folder of the machine it was written on.

A command in the docs that reads a checkpoint folder of the machine where it was made runs only
there; a result file that records a worktree's venv path tells a reader nothing. Checked over the tracked files of
a git checkout (skipped in an unpacked archive without git).
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# an absolute path under a root that exists only on some machines (not /tmp, /usr, /dev, /proc)
MACHINE_PATH = re.compile(r"(^|[^A-Za-z0-9_.~])/(work|farm|home|Users|root|mnt|scratch)/[A-Za-z0-9_.-]")


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_absolute_path_of_a_machine_in_the_repository():
    found = []
    for name in tracked_files():
        hits = []
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:120]}")
        found += hits
    assert not found, "\n".join(found)


def test_the_pattern_finds_what_it_must():
    root = "/" + "work"  # spelt in two pieces, or this file would be a hit itself
    assert MACHINE_PATH.search(f"bertscope run --model {root}/ckpt/rte")
    assert MACHINE_PATH.search("(`/" + "home/me/models/x`)")
    assert not MACHINE_PATH.search("runs/ft-rte/checkpoints/rte-pretrained-seed0 and /tmp/x and ../shared/data")
    assert not MACHINE_PATH.search("https://example.org/work/x")


def test_install_check_takes_packages_from_pips_configured_index():
    """install_check.sh names no index address: pip's configuration (pip.conf,
    PIP_INDEX_URL) decides, and TORCH_INDEX, when set, is the only --index-url it passes."""
    found = [p for p in (ROOT / "tools" / "install_check.sh", ROOT / "bench" / "install_check.sh") if p.is_file()]
    assert found, "install_check.sh is in neither tools/ nor bench/"
    script = found[0].read_text(encoding="utf-8")
    assert "://" not in script
    commands = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert commands.count("--index-url") == 1 and '--index-url "$TORCH_INDEX"' in commands
