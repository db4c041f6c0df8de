"""`bertscope data`: where the annotated data sets are found, and a clear word when they are not."""

import pytest

from bertscope import data
from bertscope.cli import main
from bertscope.data import DATASETS


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
