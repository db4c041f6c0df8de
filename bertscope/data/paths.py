"""Where the annotated data sets live (treebanks, coreference, RTE, sentence polarity, ARCT).

Looked up in this order: `--data-dir`, the BERTSCOPE_DATA environment variable, the user data
folder (platformdirs' user data dir for "bertscope", where `bertscope data download` writes),
then `../shared/data` beside the repository where bertscope runs from a checkout (the layout
of development machines and CI; an installed bertscope has no such folder to look in). A
folder the user names (the first two) is the only place looked in: a typo is an error, not a
silent fall back. Of the two defaults, each data set is taken from the first that holds it, so
a user who downloaded one set still finds the others beside a checkout. The data is never
copied into the repository.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import platformdirs

from bertscope.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]  # a checkout's root, or site-packages once installed

# data set -> (folder, what must be inside, where it comes from)
DATASETS = {
    "ud-ewt": ("ud-ewt", "en_ewt-ud-dev.conllu", "Universal Dependencies English-EWT"),
    "gum": ("gum/docs", "GUM_*.conllu", "the GUM corpus (CoNLL-U with coreference)"),
    "gap": ("gap", "gap-development.tsv", "GAP coreference (google-research-datasets)"),
    "rte": ("rte", "*.xml", "PASCAL RTE 1-3 (NLTK data)"),
    "sentence_polarity": ("sentence_polarity", "rt-polarity.*", "Pang & Lee sentence polarity v1.0"),
    "arct": ("arct", "original/*.tsv", "ARCT (original and Niven & Kao's adversarial set)"),
}


def user_data_dir() -> Path:
    """The user's own data folder (~/.local/share/bertscope on Linux): `download`'s default."""
    return Path(platformdirs.user_data_dir("bertscope", appauthor=False))


def shared_data_dir() -> Path | None:
    """../shared/data beside a checkout; None where bertscope is installed, not run from a
    checkout (`REPO_ROOT` is then site-packages, and `<venv>/lib/python3.11/shared/data` would
    mean nothing to a user)."""
    if not (REPO_ROOT / "setup.py").is_file():
        return None
    return REPO_ROOT.parent / "shared" / "data"


def default_data_dirs() -> list[Path]:
    """The folders looked in when the user names none: the user data folder, then
    ../shared/data where there is a checkout."""
    shared = shared_data_dir()
    return [user_data_dir()] + ([shared] if shared is not None else [])


def given_data_dir(data_dir: str | None = None) -> tuple[Path, str] | None:
    """The folder the user named (--data-dir, else BERTSCOPE_DATA) and how, or None."""
    for candidate, how in ((data_dir, "--data-dir"), (os.environ.get("BERTSCOPE_DATA"), "BERTSCOPE_DATA")):
        if candidate:
            return Path(candidate).expanduser(), how
    return None


def data_roots(data_dir: str | None = None) -> list[Path]:
    """The folders to look in, in order: the one the user named (which must exist), else those
    of the defaults that exist (maybe none)."""
    given = given_data_dir(data_dir)
    if given:
        path, how = given
        if not path.is_dir():
            raise UserError(f"{how} points to {path}, which is not a directory")
        return [path]
    return [path for path in default_data_dirs() if path.is_dir()]


def not_found_message() -> str:
    return (f"annotated data not found: run `bertscope data download`, pass --data-dir DIR or set "
            f"BERTSCOPE_DATA (looked in {' and '.join(str(p) for p in default_data_dirs())})")


def data_root(data_dir: str | None = None) -> Path:
    """The first folder holding data sets, or a UserError saying where it was looked for."""
    roots = data_roots(data_dir)
    if not roots:
        raise UserError(not_found_message())
    return roots[0]


def dataset_dir(name: str, data_dir: str | None = None) -> Path:
    """The folder of one data set, checked to hold what it should (the first root that does)."""
    folder, expected, what = DATASETS[name]
    roots = data_roots(data_dir)
    if not roots:
        raise UserError(not_found_message())
    for root in roots:
        path = root / folder
        if path.is_dir() and any(path.glob(expected)):
            return path
    raise UserError(f"{what} not found: expected {expected} in {roots[0] / folder}; "
                    f"get it with `{download_command(name, data_dir)}`")


def download_command(name: str, data_dir: str | None = None) -> str:
    """The command that gets a missing data set into the folder it is looked for in."""
    return f"bertscope data download {name}" + (f" --data-dir {data_dir}" if data_dir else "")


def seeded_sample(items: list, limit: int | None, seed: int) -> list:
    """All items, or a seeded sample of `limit` of them kept in their original order (a
    prefix would be biased: GUM's files, for one, are sorted by genre)."""
    if limit is None or limit >= len(items):
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]
