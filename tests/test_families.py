"""Every family of the architecture table through every command, generated from the table.

For each family bertscope analyses (`SUPPORTED_MODEL_TYPES`) a tiny random model
(tests/tiny_decoders.py: 2 layers, 4 query heads, a word-level tokenizer with the family's template)
goes through:

    the notebook API   `bertscope.load(...).stats(...)` and `word_maps`, against the statistics of
                       the model's own eager attention (`output_attentions`) of each segment alone
    run                heads.csv equals the API's table; run.json records the model (no head removal
                       needed: GPT-2 and ModernBERT ended in a traceback here)
    sinks              with the massive-activation hook on every family whose layers are one module
                       each (the table's `layer_list`; it was silently off for GPT-2 and ModernBERT)
    heads positions    every family: each head's distance profile sums to 1
    atlas              every family: one row per head, its entropy the API's; a decoder's probes run (its
                       one haystack too few for a retrieval type), an encoder's retrieval and importance
                       are empty
    probe cluster, view, compare (the run against a copy of itself: every difference 0)
    heads induction, heads importance --task lm, heads prune --task lm, heads retrieval, heads streaming:
                       decoders (the table's `causal`); an encoder is refused in one line, exit 2
    heads remove       families with head removal (the table's `removal`): the pruned checkpoint loads
                       back pruned; the others are refused in one line naming why, exit 2

Which command accepts which family comes from the table, never from a list kept here.
"""
from __future__ import annotations

import csv
import functools
import json
import shutil

import numpy as np
import pytest
import torch
from tiny_decoders import TEXTS, save_family

from bertscope.models.architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES

pytestmark = pytest.mark.usefixtures("single_thread")

MAX_LEN = 24
LAYERS, HEADS = 2, 4


@pytest.fixture(autouse=True)
def parse_help_once(monkeypatch):
    """The command line reads every command's HELP from its source each time it builds its parser
    (0.3 s a call, ~150 calls here): read each once for this module."""
    import bertscope.cli.main as cli

    if hasattr(cli, "command_help"):
        monkeypatch.setattr(cli, "command_help", _cached_help(cli.command_help))


@functools.cache
def _cached_help(original):
    return functools.cache(original)


def cli(capsys, *argv) -> tuple[int, str]:
    """(exit code, stderr) of `bertscope *argv --quiet`."""
    from bertscope.cli.main import main

    capsys.readouterr()
    code = main([*map(str, argv), "--quiet"])
    return code, capsys.readouterr().err


def refused_in_one_line(code: int, err: str, *parts: str):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("bertscope: error: "), (code, err)
    for part in parts:
        assert part in lines[0], lines[0]


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def eager_reference(path, segments, takes_token_types: bool) -> dict:
    """Pooled over every row of every segment, each alone: entropy, self, and for a decoder first and
    prev, per (layer, head), from the model's own eager maps."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    rows = {k: [] for k in ("entropy", "self", "first", "prev")}
    for s in segments:
        inputs = {"input_ids": torch.tensor([s.input_ids])}
        if takes_token_types:
            inputs["token_type_ids"] = torch.tensor([s.token_type_ids])
        with torch.no_grad():
            out = model(**inputs, output_attentions=True)
        p = torch.stack(out.attentions)[:, 0].double()  # (layers, H, L, L)
        i = torch.arange(p.shape[-1])
        rows["entropy"].append(-torch.special.xlogy(p, p).sum(-1))
        rows["self"].append(p[..., i, i])
        rows["first"].append(p[..., :, 0])
        rows["prev"].append(torch.cat([torch.zeros_like(p[..., :1, 0]), p[..., i[1:], i[1:] - 1]], -1))
    return {k: torch.cat(v, -1).mean(-1).numpy().ravel() for k, v in rows.items()}  # (layers * H,)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_every_family_of_the_table_has_a_tiny_model():
    from tiny_decoders import family_config

    for model_type in SUPPORTED_MODEL_TYPES:
        assert family_config(model_type).model_type == model_type


@pytest.mark.smoke
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_command_on_every_family(model_type, corpus, tmp_path, capsys):
    import bertscope
    from bertscope.models.loading import load_model

    arch = ARCHITECTURES[model_type]
    decoder = arch.causal
    model = save_family(tmp_path / model_type, model_type)
    common = ["--model", model, "--corpus", corpus, "--max-len", MAX_LEN, "--no-figures"]

    # the notebook API, against eager
    scope = bertscope.load(model)
    table = scope.stats(TEXTS, max_len=MAX_LEN)
    segments = scope.segments(TEXTS, max_len=MAX_LEN)
    want = eager_reference(model, segments, scope.loaded.takes_token_types)
    for col in ("entropy", "self", *(("first", "prev") if decoder else ())):
        np.testing.assert_allclose(table[col].to_numpy(dtype=float), want[col], atol=2e-5, err_msg=col)
    words, word_maps = scope.word_maps(TEXTS[0], max_len=MAX_LEN)
    assert word_maps.shape[:2] == (LAYERS, HEADS) and np.allclose(word_maps.sum(-1), 1, atol=1e-5)

    # run: heads.csv is the API's table; run.json records the model
    code, err = cli(capsys, "run", *common, "--limit", "all", "--out", tmp_path / "run")
    assert code == 0, err
    heads = read_csv(tmp_path / "run" / "heads.csv")
    assert len(heads) == LAYERS * HEADS
    np.testing.assert_allclose([float(r["entropy"]) for r in heads], want["entropy"], atol=2e-5)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "complete"
    assert {k: record["model"][k] for k in ("type", "layers", "heads")} == {
        "type": model_type, "layers": LAYERS, "heads": HEADS}
    assert "pruned_heads" not in record["model"]

    # sinks, with the massive-activation hook wherever the layers are one module each
    code, err = cli(capsys, "sinks", *common, "--limit", "all", "--out", tmp_path / "sinks")
    assert code == 0, err
    variants = json.loads((tmp_path / "sinks" / "run.json").read_text())["analyses"]["sinks"]["results"]["variants"]
    hooked = arch.shared_layer is None
    assert variants and all(("massive" in v) == hooked for v in variants.values()), variants

    # heads positions: every family, decoders and encoders; the distance profile of every head sums to 1
    code, err = cli(capsys, "heads", "positions", *common, "--limit", "all", "--out", tmp_path / "positions")
    assert code == 0, err
    distance = read_csv(tmp_path / "positions" / "positions_distance.csv")
    assert len(distance) == LAYERS * HEADS
    np.testing.assert_allclose([sum(float(v) for k, v in r.items() if k.startswith("d_")) for r in distance], 1,
                               atol=1e-5)

    # atlas: every family; a decoder's probes (retrieval, LM importance) too, an encoder's rows empty there
    atlas_needles = tmp_path / "atlas_needles.jsonl"  # a needle in the word tokenizer's vocabulary
    atlas_needles.write_text('{"name": "dog", "needle": "The dog ran far away and then came back home.", "question": '
                             '"Where was the dog?", "answer": "ran far away and then came back home"}\n')
    code, err = cli(capsys, "atlas", *common, "--limit", "all", "--batch-size", 2, "--induction-sequences", 2,
                    "--induction-len", 4, "--needles", atlas_needles, "--retrieval-lengths", 40, "--depths", 50,
                    "--importance-segments", 2, "--importance-len", MAX_LEN, "--out", tmp_path / "atlas")
    assert code == 0, err
    atlas = read_csv(tmp_path / "atlas" / "atlas_heads.csv")
    assert len(atlas) == LAYERS * HEADS
    np.testing.assert_allclose([float(r["entropy"]) for r in atlas], want["entropy"], atol=2e-5)
    assert all((r["importance"] != "") == decoder for r in atlas)
    # one haystack: fewer than the 3 answered a retrieval type needs, so not measured (an encoder: not applicable)
    assert all(r["retrieval_score"] == "" for r in atlas)
    why = json.loads((tmp_path / "atlas" / "run.json").read_text())["analyses"]["atlas"]["results"]["not_measured"]
    assert why["retrieval"].startswith("not measured: " if decoder else "not applicable")

    # probe cluster, view, compare
    code, err = cli(capsys, "probe", "cluster", *common, "--limit", 4, "--out", tmp_path / "cluster")
    assert code == 0, err
    assert len(read_csv(tmp_path / "cluster" / "cluster_mds.csv")) == LAYERS * HEADS
    code, err = cli(capsys, "view", TEXTS[1], "--model", model, "--max-len", MAX_LEN, "--out", tmp_path / "view.html")
    assert code == 0, err
    assert (tmp_path / "view.html").stat().st_size > 1000
    shutil.copytree(tmp_path / "run", tmp_path / "run-copy")
    code, err = cli(capsys, "compare", tmp_path / "run", tmp_path / "run-copy", "--no-figures",
                    "--out", tmp_path / "compare")
    assert code == 0, err
    diffs = [float(r["diff"]) for r in read_csv(tmp_path / "compare" / "compare_heads.csv") if r["diff"] != ""]
    assert diffs and max(map(abs, diffs)) == 0.0

    # the language-model commands: decoders run them, encoders are refused in one line
    needles = tmp_path / "needles.jsonl"  # a needle in the word tokenizer's vocabulary
    needles.write_text('{"name": "dog", "needle": "The dog ran far away and then came back home.", "question": '
                       '"Where was the dog?", "answer": "ran far away and then came back home"}\n')
    lm = ["--model", model, "--task", "lm", "--corpus", corpus, "--max-len", MAX_LEN, "--batch-size", 2,
          "--no-figures"]
    commands = {
        "induction": ["heads", "induction", "--model", model, "--seq-len", 4, "--limit", 2, "--top-k", 1,
                      "--random-draws", 1, "--per-head", 0, "--no-figures", "--out", tmp_path / "induction"],
        "importance": ["heads", "importance", *lm, "--limit", 3, "--out", tmp_path / "importance"],
        "prune": ["heads", "prune", *lm, "--limit", 3, "--eval-limit", 2, "--step", 0.25, "--max-fraction", 0.25,
                  "--random-seeds", 1, "--out", tmp_path / "prune"],
        "retrieval": ["heads", "retrieval", "--model", model, "--corpus", corpus, "--needles", needles, "--lengths", 40,
                      "--depths", 50, "--ablate", 1, "--draws", 1, "--no-figures", "--out", tmp_path / "retrieval"],
        "streaming": ["heads", "streaming", "--model", model, "--corpus", corpus, "--needles", needles, "--max-len",
                      MAX_LEN, "--limit", 2, "--eval-limit", 1, "--needle-length", 40, "--depths", 50, "--sink", 1,
                      "--recent", 4, "--fractions", 1, "--draws", 1, "--no-figures", "--out", tmp_path / "streaming"],
    }
    outputs = {"induction": "induction.csv", "importance": "importance.csv", "prune": "prune.csv",
               "retrieval": "retrieval_heads.csv", "streaming": "streaming_heads.csv"}
    for name, argv in commands.items():
        code, err = cli(capsys, *argv)
        if decoder:
            assert code == 0, (name, err)
            assert len(read_csv(tmp_path / name / outputs[name])) > 0, name
        else:
            refused_in_one_line(code, err)

    # heads remove: done where the table says how, refused in one line naming why elsewhere
    # heads 1 and 2 of every layer: one whole key/value group, the same heads in layers that share weights
    code, err = cli(capsys, "heads", "remove", "--model", model, "--heads", "1-1,1-2,2-1,2-2", "--out",
                    tmp_path / "pruned")
    if arch.removal is None:
        refused_in_one_line(code, err, arch.removal_refused())
        assert not (tmp_path / "pruned").exists()
    else:
        assert code == 0, err
        pruned = load_model(tmp_path / "pruned")
        assert pruned.pruned_heads == {0: [0, 1], 1: [0, 1]}
        assert pruned.record()["pruned_heads"] == ["1-1", "1-2", "2-1", "2-2"]


def test_the_docs_list_every_decoder_family_and_its_head_removal():
    """docs/decoders.md's "Families" table: a row for every causal family of the table, whose head
    removal column says "no" exactly where the table's `removal` is None."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "decoders.md").read_text()
    section = text.split("\n## Families\n", 1)[1].split("\n## ", 1)[0]
    said = {}
    for row in re.findall(r"^\| (`.+?) \|.*\| (yes|no)\b[^|]*\|$", section, flags=re.M):
        for name in re.findall(r"`([a-z0-9_]+)`", row[0]):
            said[name] = row[1] == "yes"
    decoders = {t for t in SUPPORTED_MODEL_TYPES if ARCHITECTURES[t].causal}
    assert set(said) == decoders
    assert {t for t, yes in said.items() if not yes} == {t for t in decoders if ARCHITECTURES[t].removal is None}
