"""Where the annotated data sets live (treebanks, coreference, RTE, sentence polarity, ARCT).

Looked up in this order: `--data-dir`, the BERTSCOPE_DATA environment variable, then
`../shared/data` beside the repository (the layout of development machines and CI). The
data is never copied into the repository.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

from bertscope.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent

# data set -> (folder, what must be inside, where it comes from)
DATASETS = {
    "ud-ewt": ("ud-ewt", "en_ewt-ud-dev.conllu", "Universal Dependencies English-EWT"),
    "gum": ("gum/docs", "GUM_*.conllu", "the GUM corpus (CoNLL-U with coreference)"),
    "gap": ("gap", "gap-development.tsv", "GAP coreference (google-research-datasets)"),
    "rte": ("rte", "*.xml", "PASCAL RTE 1-3 (NLTK data)"),
    "sentence_polarity": ("sentence_polarity", "rt-polarity.*", "Pang & Lee sentence polarity v1.0"),
    "arct": ("arct", "original/*.tsv", "ARCT (original and Niven & Kao's adversarial set)"),
}


def data_root(data_dir: str | None = None) -> Path:
    """The folder holding the data sets, or a UserError saying where it was looked for."""
    for candidate, how in ((data_dir, "--data-dir"), (os.environ.get("BERTSCOPE_DATA"), "BERTSCOPE_DATA")):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.is_dir():
                raise UserError(f"{how} points to {path}, which is not a directory")
            return path
    default = REPO_ROOT.parent / "shared" / "data"
    if default.is_dir():
        return default
    raise UserError(f"annotated data not found: pass --data-dir DIR or set BERTSCOPE_DATA (looked in {default})")


def dataset_dir(name: str, data_dir: str | None = None) -> Path:
    """The folder of one data set, checked to hold what it should."""
    folder, expected, what = DATASETS[name]
    path = data_root(data_dir) / folder
    if not path.is_dir() or not any(path.glob(expected)):
        raise UserError(f"{what} not found: expected {expected} in {path}")
    return path


def seeded_sample(items: list, limit: int | None, seed: int) -> list:
    """All items, or a seeded sample of `limit` of them kept in their original order (a
    prefix would be biased: GUM's files, for one, are sorted by genre)."""
    if limit is None or limit >= len(items):
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]
