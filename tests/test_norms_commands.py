"""The norm-based columns (docs/norms.md) end to end: `bertscope run --norms` and `bertscope sinks --norms`
on a tiny model of every family of the table, and `run` on a few real segments of Wikipedia with the
embedded MiniLM. (The values of the twins against each family's own maps and output projection:
tests/kernels/test_norms.py.)"""
from __future__ import annotations

import csv

import numpy as np
import pytest
from tiny_decoders import TEXTS, save_family

from bertscope.models.architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES

pytestmark = pytest.mark.usefixtures("single_thread")
MAX_LEN = 24
ENCODER_NORMS = ("cls_norm", "sep_norm", "punct_norm", "other_norm", "prev_norm", "self_norm", "next_norm",
                 "weighted_norm")


def cli(capsys, *argv) -> tuple[int, str]:
    from bertscope.cli.main import main

    capsys.readouterr()
    code = main([*map(str, argv), "--quiet"])
    return code, capsys.readouterr().err


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def column(rows, name) -> np.ndarray:
    return np.array([float(r[name]) for r in rows])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_run_and_sinks_with_norms_on_every_family(model_type, corpus, tmp_path, capsys):
    decoder = ARCHITECTURES[model_type].causal
    model = save_family(tmp_path / model_type, model_type)
    common = ["--model", model, "--corpus", corpus, "--max-len", MAX_LEN, "--no-figures"]
    assert cli(capsys, "run", *common, "--no-norms", "--out", tmp_path / "off")[0] == 0
    code, err = cli(capsys, "run", *common, "--norms", "--out", tmp_path / "on")
    assert code == 0, err
    off, on = read_csv(tmp_path / "off" / "heads.csv"), read_csv(tmp_path / "on" / "heads.csv")
    assert not any(c.endswith("_norm") for c in off[0])  # off: the table as it was
    assert list(on[0])[:len(off[0])] == list(off[0])  # on: the same columns first, the same values
    for name in off[0]:
        assert [r[name] for r in on] == [r[name] for r in off], name
    want = {"first_norm" if decoder and c == "cls_norm" else c for c in ENCODER_NORMS}
    if decoder:
        want -= {"next_norm"}  # a row sees no later key
    weights = {c.removesuffix("_norm").replace("first", "cls" if not decoder else "first") for c in want} - {"weighted"}
    want = {c for c in want if c.removesuffix("_norm") in weights | {"weighted"}
            and (c == "weighted_norm" or c.removesuffix("_norm") in off[0])}
    assert want <= set(on[0]) and {c for c in on[0] if c.endswith("_norm")} == want, (sorted(want), list(on[0]))
    for name in want - {"weighted_norm"}:
        share = column(on, name)
        assert np.isfinite(share).all() and (share >= -1e-6).all() and (share <= 1 + 1e-6).all(), name
    assert (column(on, "weighted_norm") > 0).all()
    classes = [c for c in ("cls_norm", "first_norm", "sep_norm", "punct_norm", "other_norm") if c in on[0]]
    if len(classes) == 4:  # every class shown: the shares of a row add up to 1, so do their means
        np.testing.assert_allclose(sum(column(on, c) for c in classes), 1.0, atol=1e-4)

    code, err = cli(capsys, "sinks", *common, "--norms", "--out", tmp_path / "sinks")
    assert code == 0, err
    sinks = read_csv(tmp_path / "sinks" / "sinks.csv")
    for name in ("alpha_1_norm", "first_mass_norm", "sep_mass_norm", "punct_mass_norm"):
        share = column(sinks, name)
        assert np.isfinite(share).all() and (share >= -1e-6).all() and (share <= 1 + 1e-6).all(), name
    # the first token's norm share over every row, and over the rows that see it: the same sum over fewer
    # rows (a windowed row that cannot see the first token gives it 0), so never below
    assert (column(sinks, "first_mass_norm") <= column(sinks, "alpha_1_norm") + 1e-6).all()
    code, err = cli(capsys, "sinks", *common, "--no-norms", "--out", tmp_path / "sinks_off")
    assert code == 0, err
    assert not any(c.endswith("_norm") for c in read_csv(tmp_path / "sinks_off" / "sinks.csv")[0])


@pytest.mark.parametrize("model_type", ["bert", "llama"])
def test_run_with_norms_on_triton_gives_the_chunked_backends_columns(model_type, corpus, tmp_path, capsys):
    """The fused kernel's twins (its interpreter here) end to end: `run --norms --backend triton` writes the
    same norm columns as the chunked backend, to the precision of an fp32 run, for an encoder and a decoder
    with grouped-query attention; by default the triton backend leaves them off (docs/norms.md)."""
    model = save_family(tmp_path / model_type, model_type)
    common = ["run", "--model", model, "--corpus", corpus, "--max-len", MAX_LEN, "--limit", 3, "--no-figures"]
    tables = {}
    for backend in ("triton", "chunked"):
        code, err = cli(capsys, *common, "--norms", "--backend", backend, "--out", tmp_path / backend)
        assert code == 0, err
        tables[backend] = read_csv(tmp_path / backend / "heads.csv")
    names = [c for c in tables["chunked"][0] if c.endswith("_norm")]
    assert "weighted_norm" in names and "self_norm" in names and len(names) >= 6
    assert list(tables["triton"][0]) == list(tables["chunked"][0])
    for name in names:
        np.testing.assert_allclose(column(tables["triton"], name), column(tables["chunked"], name), rtol=1e-4,
                                   atol=1e-5, err_msg=name)
    code, err = cli(capsys, *common, "--backend", "triton", "--out", tmp_path / "default")
    assert code == 0, err
    assert not any(c.endswith("_norm") for c in read_csv(tmp_path / "default" / "heads.csv")[0])


def test_minilm_on_real_segments(wiki, minilm_path, tmp_path, capsys):
    """A few real Wikipedia segments through the embedded MiniLM: the norm columns beside the weights,
    and Kobayashi et al.'s finding on the special tokens: their norm share is below their weight share
    (their value vectors are short), in every layer's mean over heads. MiniLM parks its attention on
    [CLS] (about 0.4 of it in layers 2-5 on 200 segments, docs/norms.md), by norm about 0.05; its [SEP]
    has little weight either way, and by norm as much or more in some layers, so the check is on [CLS]
    and on the two special tokens together."""
    code, err = cli(capsys, "run", "--limit", "6", "--no-figures", "--out", tmp_path / "run")  # norms: the default
    assert code == 0, err
    rows = read_csv(tmp_path / "run" / "heads.csv")
    assert len(rows) == 6 * 12
    layer = column(rows, "layer")
    for kinds in (("cls",), ("cls", "sep")):
        weight = sum(column(rows, k) for k in kinds)
        norm = sum(column(rows, f"{k}_norm") for k in kinds)
        by_layer = [(weight[layer == ly].mean(), norm[layer == ly].mean()) for ly in range(1, 7)]
        assert all(n < w for w, n in by_layer), (kinds, by_layer)
    assert np.mean(column(rows, "cls")[layer == 3]) > 3 * np.mean(column(rows, "cls_norm")[layer == 3])
    total = sum(column(rows, c) for c in ("cls_norm", "sep_norm", "punct_norm", "other_norm"))
    np.testing.assert_allclose(total, 1.0, atol=1e-4)
