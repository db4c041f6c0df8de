"""Where the annotated data sets are found: --data-dir, then BERTSCOPE_DATA, then the user data
folder, then ../shared/data."""
from __future__ import annotations

from pathlib import Path

import pytest

from bertscope.data import paths as data
from bertscope.data.paths import DATASETS, data_root, dataset_dir
from bertscope.errors import UserError

SHARED = data.REPO_ROOT.parent / "shared" / "data"

# one file that satisfies each data set's check
MARKERS = {
    "ud-ewt": "en_ewt-ud-dev.conllu",
    "gum": "GUM_academic_art.conllu",
    "gap": "gap-development.tsv",
    "rte": "rte1_dev.xml",
    "sentence_polarity": "rt-polarity.pos",
    "arct": "original/train.tsv",
}


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("BERTSCOPE_DATA", raising=False)


@pytest.fixture(autouse=True)
def user_folder(tmp_path, monkeypatch) -> Path:
    """The user data folder, in the test's own tmp_path (not yet made): a download into the real
    one must not change what these tests see."""
    path = tmp_path / "user-data"
    monkeypatch.setattr(data, "user_data_dir", lambda: path)
    return path


def fake_checkout(monkeypatch, root: Path) -> Path:
    """bertscope run from a checkout at `root` (its setup.py marks it): ../shared/data beside it
    is a default."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "setup.py").write_text("")
    monkeypatch.setattr(data, "REPO_ROOT", root)
    return root


def fake_root(root: Path, names=tuple(DATASETS)) -> Path:
    for name in names:
        folder = root / DATASETS[name][0]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARKERS[name]).parent.mkdir(parents=True, exist_ok=True)
        (folder / MARKERS[name]).write_text("x")
    return root


def test_every_dataset_has_a_marker():
    assert set(MARKERS) == set(DATASETS)


# --- the root folder ------------------------------------------------------------------------


def test_data_dir_wins_over_the_environment(tmp_path, monkeypatch):
    (tmp_path / "arg").mkdir()
    (tmp_path / "env").mkdir()
    monkeypatch.setenv("BERTSCOPE_DATA", str(tmp_path / "env"))
    assert data_root(str(tmp_path / "arg")) == tmp_path / "arg"
    assert data_root() == tmp_path / "env"


def test_environment_wins_over_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTSCOPE_DATA", str(tmp_path))
    fake_checkout(monkeypatch, tmp_path / "repo")  # a default that would exist
    fake_root(tmp_path / "shared" / "data")
    assert data_root() == tmp_path


def test_empty_environment_variable_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTSCOPE_DATA", "")
    fake_checkout(monkeypatch, tmp_path / "repo")
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert data_root() == tmp_path / "shared" / "data"


def test_user_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "corpora").mkdir()
    assert data_root("~/corpora") == tmp_path / "corpora"
    monkeypatch.setenv("BERTSCOPE_DATA", "~/corpora")
    assert data_root() == tmp_path / "corpora"


def test_default_is_shared_data_beside_the_repository(no_env):
    if not SHARED.is_dir():
        pytest.skip(f"no shared data on this machine ({SHARED})")
    assert data_root() == SHARED
    assert data.REPO_ROOT == Path(data.__file__).resolve().parents[2]
    assert (data.REPO_ROOT / "bertscope" / "data" / "paths.py").is_file()


@pytest.mark.parametrize("how", ["--data-dir", "BERTSCOPE_DATA"])
@pytest.mark.parametrize("what", ["missing", "file"])
def test_a_given_folder_must_exist(tmp_path, monkeypatch, how, what):
    path = tmp_path / "data"
    if what == "file":
        path.write_text("not a folder")
    if how == "BERTSCOPE_DATA":
        monkeypatch.setenv("BERTSCOPE_DATA", str(path))
        call = data_root
    else:
        monkeypatch.delenv("BERTSCOPE_DATA", raising=False)
        call = lambda: data_root(str(path))  # noqa: E731
    with pytest.raises(UserError) as info:
        call()
    assert str(info.value) == f"{how} points to {path}, which is not a directory"


def test_a_given_folder_does_not_fall_back_to_the_default(tmp_path, monkeypatch):
    """A typo in --data-dir is an error, even when ../shared/data would have worked."""
    fake_root(tmp_path / "shared" / "data")
    fake_checkout(monkeypatch, tmp_path / "repo")
    monkeypatch.delenv("BERTSCOPE_DATA", raising=False)
    with pytest.raises(UserError, match="--data-dir points to"):
        data_root(str(tmp_path / "typo"))


def test_nothing_found_says_where_it_looked(tmp_path, monkeypatch, no_env, user_folder):
    fake_checkout(monkeypatch, tmp_path / "repo")
    with pytest.raises(UserError) as info:
        data_root()
    message = str(info.value)
    assert "--data-dir" in message and "BERTSCOPE_DATA" in message and "bertscope data download" in message
    assert str(tmp_path / "shared" / "data") in message and str(user_folder) in message


def test_the_user_folder_comes_before_shared_data(tmp_path, monkeypatch, no_env, user_folder):
    fake_checkout(monkeypatch, tmp_path / "repo")
    fake_root(tmp_path / "shared" / "data")
    assert data_root() == tmp_path / "shared" / "data"
    fake_root(user_folder, names=["gap"])
    assert data_root() == user_folder
    assert dataset_dir("gap") == user_folder / "gap"
    # a set the user folder lacks is still found beside the checkout
    assert dataset_dir("rte") == tmp_path / "shared" / "data" / "rte"


def test_the_environment_comes_before_the_user_folder(tmp_path, monkeypatch, user_folder):
    fake_root(user_folder)
    monkeypatch.setenv("BERTSCOPE_DATA", str(tmp_path / "env"))
    (tmp_path / "env").mkdir()
    assert data_root() == tmp_path / "env"
    with pytest.raises(UserError, match="get it with `bertscope data download gap`$"):
        dataset_dir("gap")  # a folder the user named is the only place looked in


# --- one data set ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_dataset_dir_finds_each_dataset(tmp_path, name):
    root = fake_root(tmp_path)
    assert dataset_dir(name, str(root)) == root / DATASETS[name][0]


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_missing_dataset_names_what_is_expected_where(tmp_path, name):
    root = fake_root(tmp_path, names=[n for n in DATASETS if n != name])
    folder, expected, what = DATASETS[name]
    with pytest.raises(UserError) as info:
        dataset_dir(name, str(root))
    assert str(info.value) == (f"{what} not found: expected {expected} in {root / folder}; "
                               f"get it with `bertscope data download {name} --data-dir {root}`")


def test_dataset_folder_without_its_files(tmp_path):
    (tmp_path / "ud-ewt").mkdir()
    (tmp_path / "ud-ewt" / "en_ewt-ud-train.conllu").write_text("x")  # not the dev file
    with pytest.raises(UserError, match=r"expected en_ewt-ud-dev\.conllu in"):
        dataset_dir("ud-ewt", str(tmp_path))


def test_gum_needs_its_docs_subfolder(tmp_path):
    (tmp_path / "gum").mkdir()
    (tmp_path / "gum" / "GUM_academic_art.conllu").write_text("x")  # one level too high
    with pytest.raises(UserError, match="the GUM corpus"):
        dataset_dir("gum", str(tmp_path))


def test_dataset_dir_uses_the_environment(tmp_path, monkeypatch):
    fake_root(tmp_path)
    monkeypatch.setenv("BERTSCOPE_DATA", str(tmp_path))
    assert dataset_dir("gap") == tmp_path / "gap"


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_shared_data_holds_every_dataset(name, no_env):
    if not SHARED.is_dir():
        pytest.skip(f"no shared data on this machine ({SHARED})")
    path = dataset_dir(name)
    assert path == SHARED / DATASETS[name][0]
    assert any(path.glob(DATASETS[name][1]))


def test_an_installed_bertscope_looks_in_no_shared_folder(tmp_path, monkeypatch, no_env, user_folder, capsys):
    """After a non-editable install REPO_ROOT is site-packages: `<venv>/lib/python3.11/shared/data`
    is neither listed nor read, even where such a folder happens to exist."""
    from bertscope.cli.main import main

    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "bertscope").mkdir(parents=True)
    monkeypatch.setattr(data, "REPO_ROOT", site)
    fake_root(site.parent / "shared" / "data")
    assert data.shared_data_dir() is None
    with pytest.raises(UserError) as info:
        data_root()
    assert "shared" not in str(info.value) and str(user_folder) in str(info.value)
    assert main(["data"]) == 1
    out = capsys.readouterr().out
    assert "shared" not in out and str(user_folder) in out and "MISSING" in out
    # the same layout as a checkout: ../shared/data is a default again
    fake_checkout(monkeypatch, site)
    assert data_root() == site.parent / "shared" / "data"
