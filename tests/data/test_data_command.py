"""`bertscope data`: where the annotated data sets are found, and a clear word when they are not."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bertscope.cli.main import main
from bertscope.data import paths as data
from bertscope.data.paths import DATASETS


def test_data_command_lists_every_dataset(tmp_path, capsys):
    (tmp_path / "ud-ewt").mkdir()
    (tmp_path / "ud-ewt" / "en_ewt-ud-dev.conllu").write_text("# sent_id = 1\n")
    assert main(["data", "--data-dir", str(tmp_path)]) == 1  # only one of the data sets is there
    out = capsys.readouterr().out
    assert f"data folder: {tmp_path}" in out
    assert f"ud-ewt             {tmp_path / 'ud-ewt'}" in out
    assert out.count("MISSING") == len(DATASETS) - 1 and "gap-development.tsv" in out
    assert f"get it with `bertscope data download gap --data-dir {tmp_path}`" in out


def test_data_command_rejects_a_missing_folder(capsys):
    assert main(["data", "--data-dir", "/no/such/folder"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: --data-dir points to /no/such/folder") and err.count("\n") == 1


def test_shared_data_is_found_by_default(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("BERTSCOPE_DATA", raising=False)
    monkeypatch.setattr(data, "user_data_dir", lambda: tmp_path / "no-user-data")
    shared = data.shared_data_dir()
    if not shared.is_dir():
        pytest.skip(f"no shared data beside this checkout ({shared})")
    assert main(["data"]) == 0, "the repository expects ../shared/data beside it (development and CI)"
    assert f"data folder: {shared}" in capsys.readouterr().out


def test_tests_that_read_the_data_skip_without_it(tmp_path):
    """A fresh clone without the data: the tests that read it skip (they once failed here),
    CI's rule (a missing set fails) switched off as on a user's machine."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(BERTSCOPE_DATA=str(tmp_path / "nonexistent"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           "tests/tasks/test_task_data.py", "tests/analyses/cues/test_cues.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    skipped = re.findall(r"^SKIPPED \[(\d+)\] .*BERTSCOPE_DATA points to .*, which is not a directory$", done.stdout,
                         flags=re.MULTILINE)
    assert sum(map(int, skipped)) == 5, done.stdout[-3000:]  # test_task_data 3, test_cues 2
