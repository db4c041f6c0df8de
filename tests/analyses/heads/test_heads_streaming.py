"""`bertscope heads streaming`: the ranking, the random groups, the head masks, the DuoAttention
pattern files and the no-loss fraction on hand-built inputs; the command end to end on a tiny Llama
(grouped-query: 2 layers x 2 key/value groups), a run killed mid-way and resumed equal to an
uninterrupted one, the user's mistakes refused in one line; and a small slice of real SmolLM2."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from test_retrieval import refused_in_one_line

from bertscope.analyses.heads.streaming.stats import (
    counts,
    head_mask,
    kv_full,
    no_loss_fraction,
    random_groups,
    rank_groups,
    read_pattern,
    write_pattern,
)
from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")

DOG = {"name": "dog", "needle": "The dog ran far away and then came back home.", "question": "Where was the dog?",
       "answer": "ran far away and then came back home"}
CORPUS_LINES = ["The cat sat on a mat. It was happy. Then the cat ran home. " * 3,
                "A dog ran far away, and then came back home quickly. The dog sat on the cat, and it was happy. " * 3,
                "It was happy. The cat sat on a mat. Then the dog ran home. " * 3] * 6


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- hand-built


def test_rank_groups_lowest_error_first_ties_by_position_nan_last():
    err = np.array([[0.3, 0.1], [np.nan, 0.1], [0.0, 0.9]])
    assert rank_groups(err) == [(2, 0), (0, 1), (1, 1), (0, 0), (2, 1), (1, 0)]


def test_counts_random_groups_and_masks():
    assert counts([0.25, 0.5, 0.26, 1.0], 8) == [2, 4, 8]
    sets = random_groups(3, 2, 4, 3, seed=0)
    assert len(sets) == 3 and all(len(s) == 4 == len(set(s)) for s in sets)
    assert sets == random_groups(3, 2, 4, 3, seed=0)  # seeded
    mask = head_mask([(0, 1), (2, 0)], 3, 6, 2)  # G = 3 query heads per group
    assert mask.tolist() == [[False] * 3 + [True] * 3, [False] * 6, [True] * 3 + [False] * 3]
    assert head_mask([(1, 2)], 2, 4, 4)[1].tolist() == [False, False, True, False]  # MHA: one head per group


def test_pattern_in_duo_attention_format(tmp_path):
    full = kv_full([(1, 0), (0, 1), (0, 0)], 2, 2, 2)
    assert full.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    folder = write_pattern(tmp_path / "p", full, 4, 64, {"model_name": "m"})
    lines = (folder / "full_attention_heads.tsv").read_text().splitlines()
    assert len(lines) == 2 and all(len(line.split("\t")) == 2 for line in lines)
    assert lines[0].split("\t")[0] == "1.000000000000000000e+00"  # numpy's savetxt, as their files
    got, sink, recent = read_pattern(folder)
    assert got.tolist() == full.tolist() and (sink, recent) == (4, 64)
    config = json.loads((folder / "config.json").read_text())
    assert config["sink_size"] == 4 and config["recent_size"] == 64 and config["model_name"] == "m"


def test_no_loss_fraction():
    def row(order, k, loss, token):
        return {"order": order, "k": k, "fraction": k / 4, "delta_loss": loss, "needle_token_accuracy": token}

    rows = [row("none", 0, 0.0, 0.9), row("error", 1, 0.01, 0.9), row("error", 2, 0.015, 0.95),
            row("error", 3, 0.5, 0.9), row("error", 4, 0.0, 0.9),
            row("random", 1, 0.01, 0.9), row("random", 1, 0.02, 0.95), row("random", 2, 0.0, 0.5)]
    assert no_loss_fraction(rows, 0.02) == 0.5  # stops at the first point that loses
    assert no_loss_fraction(rows, 0.02, "random") == 0.25  # draws by their mean; k = 2 loses answer tokens
    assert no_loss_fraction(rows, 0.001, "random") == 0.0


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from conftest import corpus_and_needles

    return corpus_and_needles(tmp_path_factory.mktemp("streaming-files"), CORPUS_LINES, [DOG])


def cli_args(model, files, out, *more):
    corpus, needles = files
    return ["heads", "streaming", "--model", str(model), "--corpus", str(corpus), "--needles", str(needles),
            "--max-len", "48", "--limit", "3", "--eval-limit", "2", "--sink", "2", "--recent", "6",
            "--fractions", "0.5,1", "--draws", "1", "--depths", "50", "--batch-size", "2", "--quiet",
            "--out", str(out), *more]


def test_command_end_to_end(tiny_llama_lm_dir, files, tmp_path):
    out = tmp_path / "run"
    assert main(cli_args(tiny_llama_lm_dir, files, out)) == 0
    heads = read_csv(out / "streaming_heads.csv")
    assert [(h["layer"], h["head"], h["kv_head"]) for h in heads] == [
        ("1", "1", "1"), ("1", "2", "1"), ("1", "3", "2"), ("1", "4", "2"),
        ("2", "1", "1"), ("2", "2", "1"), ("2", "3", "2"), ("2", "4", "2")]
    assert all(0 < float(h["error"]) < 1.5 for h in heads)
    assert sorted(int(h["kv_rank"]) for h in heads[::2]) == [1, 2, 3, 4]
    curve = read_csv(out / "streaming_curve.csv")
    assert [(c["order"], c["k"], c["draw"]) for c in curve] == [("none", "0", "0"), ("error", "2", "0"),
                                                               ("random", "2", "1"), ("error", "4", "0")]
    assert float(curve[0]["delta_loss"]) == 0
    full, sink, recent = read_pattern(out / "duo_attention")
    assert full.shape == (2, 2) and (sink, recent) == (2, 6)
    by_group = {(int(h["layer"]) - 1, int(h["kv_head"]) - 1): int(h["full"]) for h in heads}
    assert all(full[g] == f for g, f in by_group.items())
    result = json.loads((out / "run.json").read_text())["analyses"]["streaming"]
    assert result["status"] == "complete" and result["results"]["groups"] == 4
    assert (out / "fig_streaming_error.png").is_file() and (out / "fig_streaming_curve.png").is_file()
    page = (out / "index.html").read_text(encoding="utf-8")  # the report's section
    assert "Streaming and retrieval heads" in page and "key/value groups stream" in page

    # killed after the error pass and one variant: resumed, the same outputs
    variants = sorted((out / "streaming_variants").glob("*.json"))
    assert len(variants) == 4
    for path in variants[1:]:
        path.unlink()
    (out / "streaming_curve.csv").unlink()
    assert main(["heads", "streaming", "--resume", str(out), "--quiet"]) == 0
    again = read_csv(out / "streaming_curve.csv")
    for a, b in zip(curve, again):
        assert a["order"] == b["order"] and float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-6)


def test_user_mistakes_are_one_line(tiny_llama_lm_dir, tiny_checkpoint, files, tmp_path, capsys):
    def refused(argv, *parts):
        refused_in_one_line(capsys, argv, *parts)

    refused(cli_args(tiny_checkpoint, files, tmp_path / "a"), "causal language model", "install-decoders")
    refused(cli_args(tiny_llama_lm_dir, files, tmp_path / "b", "--fractions", "0.5,2"), "fractions")
    refused(cli_args(tiny_llama_lm_dir, files, tmp_path / "c", "--depths", "120"), "0 to 100")
    refused(cli_args(tiny_llama_lm_dir, files, tmp_path / "d", "--sink", "0", "--recent", "0"), "--recent", ">= 1")
    # a window that keeps every key of the segment: every head's error would be 0 (check_streaming_window)
    refused(cli_args(tiny_llama_lm_dir, files, tmp_path / "e", "--sink", "4", "--recent", "4096"), "--recent",
            "keep every key")
    assert not any((tmp_path / x).exists() for x in "abcde")


def test_real_smollm2_slice(smollm2_dir, tmp_path):
    """Real weights (SmolLM2-135M, dequantized from 4 bits): a short error pass, the per-group error
    read back from HeadStats equals the command's CSV, and a window of the recent span is free."""
    from bertscope.engine.accumulate import HeadStats

    out = tmp_path / "run"
    argv = ["heads", "streaming", "--model", str(smollm2_dir), "--max-len", "96", "--limit", "1", "--eval-limit",
            "1", "--sink", "4", "--recent", "16", "--fractions", "1", "--draws", "0", "--depths", "50",
            "--needle-length", "160", "--no-figures", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    heads = read_csv(out / "streaming_heads.csv")
    assert len(heads) == 30 * 9
    acc = HeadStats.load(out / "streaming_stats.npz")
    kv = acc.streaming_error(kv_heads=True)  # (30, 3)
    assert kv.shape == (30, 3) and np.all((kv >= 0) & (kv <= 1.5))
    np.testing.assert_allclose([float(h["kv_error"]) for h in heads[::3]], kv.ravel(), rtol=1e-5)  # the CSV rounds
    full, _, _ = read_pattern(out / "duo_attention")
    assert full.shape == (30, 3)
    torch.testing.assert_close(torch.tensor(acc.streaming_error()).isnan().any(), torch.tensor(False))
