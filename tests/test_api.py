"""The notebook API: the same numbers as the command line, and clear errors for bad input."""
import csv

import numpy as np
import pytest

import bertscope
from bertscope.cli.main import main
from bertscope.kernels.spec import StatsSpec

pytestmark = pytest.mark.usefixtures("single_thread")

TEXTS = ["The cat sat on the mat.", ("Mr. Smith went to Washington.", "He liked it there, he said."), "Yes."]


def test_stats_equal_the_cli_heads_csv(tiny_checkpoint, tmp_path, capsys):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(t if isinstance(t, str) else "\t".join(t) for t in TEXTS) + "\n", encoding="utf-8")
    assert main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--limit", "all", "--quiet",
                 "--no-figures", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    with open(tmp_path / "run" / "heads.csv", newline="") as f:
        cli = list(csv.DictReader(f))
    scope = bertscope.load(str(tiny_checkpoint))
    api = scope.stats(TEXTS)
    assert list(api.columns) == list(cli[0].keys()) and len(api) == len(cli) == 2 * 4
    for col in ("prev", "cls", "sep_sep", "entropy", "cls_entropy", "n_tokens"):
        np.testing.assert_allclose(api[col].to_numpy(), [float(r[col]) for r in cli], rtol=1e-5, err_msg=col)

    rows = scope.per_example(TEXTS)
    assert rows["segment"].tolist() == sorted(rows["segment"].tolist()) and set(rows["segment"]) == {0, 1, 2}
    assert rows.groupby("segment")["n_tokens"].first().tolist() == [s.n_tokens for s in scope.segments(TEXTS)]


def test_bad_input_is_a_clear_exception(tiny_checkpoint):
    scope = bertscope.load(str(tiny_checkpoint))
    with pytest.raises(TypeError, match="list of strings"):
        scope.stats("The cat sat.")
    with pytest.raises(ValueError, match="text 1 must be a non-empty string"):
        scope.stats(["fine", "  "])
    with pytest.raises(ValueError, match="the class scheme has 4 classes"):
        scope.stats(["fine"], spec=StatsSpec(n_key_classes=5, offsets=(-2, -1, 0, 1, 2), class_mass=True,
                                             entropy=True, argmax=True))
    with pytest.raises(ValueError, match="do not fit"):
        scope.word_maps(["word"] * 200, max_len=32)


def test_the_default_length_is_the_models_and_a_cut_is_said(minilm_path, caplog):
    """stats() used max_len=128 unless told, and cut a longer text without a word."""
    scope = bertscope.load(str(minilm_path))
    assert scope.loaded.max_len == 512
    long_text = " ".join(f"Sentence number {i} is here." for i in range(30))  # about 200 tokens
    (segment,) = scope.segments([long_text])
    assert 128 < segment.n_tokens <= 512
    caplog.set_level("WARNING", logger="bertscope")
    assert scope.stats([long_text])["n_tokens"].iloc[0] == segment.n_tokens
    assert not caplog.records
    (cut,) = scope.segments([long_text], max_len=64)
    assert cut.n_tokens <= 64
    assert [r.getMessage() for r in caplog.records] == [
        "1 of 1 texts were cut to max_len=64 tokens: the statistics cover their first 64 tokens only (the model "
        "takes 512)"]


def test_a_scope_prints_in_one_line(tiny_checkpoint):
    scope = bertscope.load(str(tiny_checkpoint), backend="chunked")
    assert repr(scope) == str(scope) == (f"Scope({tiny_checkpoint.name}: bert encoder, 2 layers x 4 heads, context "
                                         "128, backend chunked, cpu)")


def test_the_default_spec_is_bertscope_runs():
    """What the API and the viewer compute by default (`bertscope.engine.head_table.run_spec`, in the core)
    is what `bertscope run` computes with the same settings."""
    from bertscope.analyses.surface.command import RunSettings
    from bertscope.engine.head_table import run_spec

    assert RunSettings().spec() == run_spec()
    for max_offset, argmax in ((1, True), (2, True), (4, False)):
        assert RunSettings(max_offset=max_offset, argmax=argmax).spec() == run_spec(max_offset, argmax)
