"""A hostile new user's field test (issue 47, part 3): every mistake is one line before any stage
runs, nothing is silently ignored or cut, a resume keeps what the run was (its model, its
--no-figures) and loses no finished stage, and the messages name the options the user typed.
Each test here failed before its fix. Tiny models, a few segments."""
from __future__ import annotations

import csv
import json
import logging
import shutil

import pytest
from conftest import NEEDLE, corpus_and_needles, interrupt_on_call
from conftest import NEEDLE_LINES as LINES

from bertscope.cli.main import main
from bertscope.errors import UserError

pytestmark = pytest.mark.usefixtures("single_thread")



@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return corpus_and_needles(tmp_path_factory.mktemp("bad-inputs"), LINES, [NEEDLE])


def atlas_args(model, corpus, out, *more) -> list[str]:
    """`atlas` on a tiny decoder, no retrieval: a few seconds."""
    return ["atlas", "--model", str(model), "--corpus", str(corpus), "--limit", "2", "--max-len", "24",
            "--batch-size", "2", "--induction-sequences", "2", "--induction-len", "8", "--importance-segments", "1",
            "--importance-len", "16", "--no-retrieval", "--quiet", "--out", str(out), *more]


def one_line(capsys, argv, code: int = 2) -> str:
    """The one error line of a command refused (exit 2: a UserError, or argparse's usage error)."""
    try:
        result = main(argv)
    except SystemExit as e:
        result = e.code
    assert result == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def parse_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# --- tracebacks become one line, before any stage ----------------------------------------------------

def test_a_negative_seed_is_refused_while_parsing(capsys):
    assert "argument --seed: expected a number >= 0, got -1" in parse_error(capsys, ["atlas", "--seed", "-1"])
    assert "argument --seed" in parse_error(capsys, ["heads", "positions", "--seed", "-1"])


def test_a_device_this_torch_cannot_use_is_one_line(tiny_llama_lm_dir, files, tmp_path, capsys):
    import torch

    from bertscope.engine.devices import check_device

    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(UserError, match=r"--device mps cannot be used here"):
        check_device("mps", "auto")
    err = one_line(capsys, atlas_args(tiny_llama_lm_dir, files[0], tmp_path / "x", "--device", "mps"))
    assert "--device mps cannot be used here" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_threads_past_the_bound_are_refused_by_every_command(capsys):
    from bertscope.cli.args import MAX_THREADS

    for words in (["atlas"], ["heads", "positions"], ["run"], ["heads", "remove"]):
        err = parse_error(capsys, [*words, "--threads", "100000"])
        assert f"argument --threads: expected at most {MAX_THREADS} threads" in err, (words, err)
    from bertscope.cli.args import thread_count

    assert thread_count(str(MAX_THREADS)) == MAX_THREADS


def heads_csv(path, rows: int = 2, cut: bool = False):
    from bertscope.analyses.atlas import stats as A

    columns = A.column_order()
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "atlas_heads.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for i in range(rows):
            w.writerow([{"model": "m", "attention": "global", "types": "sink", "layer": 1, "head": i + 1}.get(c, 0.5)
                        for c in columns])
    if cut:
        text = (path / "atlas_heads.csv").read_text()
        (path / "atlas_heads.csv").write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])
    return path


def test_compare_refuses_a_text_file_a_cut_csv_and_one_run_twice(tmp_path, capsys):
    good, other = heads_csv(tmp_path / "a"), heads_csv(tmp_path / "b")
    text = tmp_path / "notes.txt"
    text.write_text("hello\nworld\n")
    err = one_line(capsys, ["atlas", "compare", str(good), str(text), "--out", str(tmp_path / "c1")])
    assert "notes.txt is not an atlas_heads.csv" in err and "mean_distance" in err
    cut = heads_csv(tmp_path / "cut", cut=True)
    err = one_line(capsys, ["atlas", "compare", str(good), str(cut), "--out", str(tmp_path / "c2")])
    assert "line 3" in err and "truncated" in err
    err = one_line(capsys, ["atlas", "compare", str(good), str(tmp_path / "a" / ".." / "a"), "--out",
                            str(tmp_path / "c3")])
    assert "given twice" in err
    assert main(["atlas", "compare", str(good), str(other), "--out", str(tmp_path / "c4"), "--quiet",
                 "--no-figures"]) == 0
    assert not any((tmp_path / f"c{i}").exists() for i in (1, 2, 3))


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory, tiny_llama_lm_dir):
    """A copy of the tiny Llama that a test may replace."""
    path = tmp_path_factory.mktemp("swap") / "model"
    shutil.copytree(tiny_llama_lm_dir, path)
    return path


def test_a_resume_after_the_model_was_swapped_is_refused(model_copy, files, tmp_path, capsys):
    from tiny_decoders import CONFIG, llama_config, save_tiny
    from transformers import LlamaConfig

    out = tmp_path / "run"
    assert main(atlas_args(model_copy, files[0], out, "--no-importance", "--no-figures")) == 0
    record = json.loads((out / "run.json").read_text())["analyses"]["atlas"]["model"]
    assert len(record["fingerprint"]) == 16
    original = tmp_path / "original"
    shutil.copytree(model_copy, original)
    try:
        save_tiny(model_copy, llama_config(), causal_lm=True, seed=1)  # the same shape, other weights
        err = one_line(capsys, ["atlas", "--resume", str(out), "--quiet"])
        assert "are not those the run started with" in err and "2 layers x 4 heads, the run's: 2 layers" in err
        shutil.rmtree(model_copy)
        save_tiny(model_copy, LlamaConfig(**{**CONFIG, "num_hidden_layers": 3}), causal_lm=True)  # another shape
        err = one_line(capsys, ["atlas", "--resume", str(out), "--quiet"])
        assert "are not those the run started with" in err and "3 layers x 4 heads, the run's: 2 layers" in err
    finally:
        shutil.rmtree(model_copy)
        shutil.copytree(original, model_copy)
    assert main(["atlas", "--resume", str(out), "--quiet"]) == 0  # its own model back: resumed


# --- silent changes refused or said ------------------------------------------------------------------

def test_an_importance_length_past_the_model_or_too_short_is_refused_before_any_stage(tiny_llama_lm_dir, files,
                                                                                      tmp_path, capsys):
    base = atlas_args(tiny_llama_lm_dir, files[0], tmp_path / "x")
    err = one_line(capsys, [*base, "--importance-len", "100000"])
    assert err == "bertscope: error: --importance-len 100000 is longer than the model allows (64)"
    err = one_line(capsys, [*base, "--importance-len", "1"])
    assert err == "bertscope: error: --importance-len must be at least 8 tokens, not 1"
    assert not (tmp_path / "x").exists()


def test_streaming_tolerance_and_window_have_one_rule(tiny_llama_lm_dir, files, tmp_path, capsys):
    from bertscope.cli.args import check_streaming_window

    assert "argument --tolerance: expected a finite number >= 0, got -1" in parse_error(
        capsys, ["heads", "streaming", "--tolerance", "-1"])
    assert "argument --recent: expected a number >= 1, got 0" in parse_error(capsys, ["heads", "streaming",
                                                                                       "--recent", "0"])
    assert "argument --streaming-recent: expected a number >= 1, got 0" in parse_error(
        capsys, ["atlas", "--streaming-recent", "0"])
    check_streaming_window(0, 4, 24)  # a plain sliding window: both commands take --sink 0
    with pytest.raises(UserError, match=r"--sink 4 \+ --recent 252 keep every key of a segment of up to 256"):
        check_streaming_window(4, 252, 256)
    corpus, needles = files
    err = one_line(capsys, ["heads", "streaming", "--model", str(tiny_llama_lm_dir), "--corpus", str(corpus),
                            "--needles", str(needles), "--max-len", "48", "--recent", "48",
                            "--out", str(tmp_path / "s")])
    assert "--sink 4 + --recent 48 keep every key" in err and "--max-len 48" in err
    err = one_line(capsys, atlas_args(tiny_llama_lm_dir, corpus, tmp_path / "a", "--streaming-recent", "20"))
    assert "--streaming-sink 4 + --streaming-recent 20 keep every key of a segment of up to 24" in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "a").exists()


def test_lm_importance_refuses_the_task_data_options(capsys):
    for option in (["--split", "train"], ["--arct-version", "adversarial"]):
        err = one_line(capsys, ["heads", "importance", "--task", "lm", *option])
        assert f"{option[0]} is for the task data" in err and "--task lm reads running text" in err
    err = one_line(capsys, ["heads", "prune", "--task", "lm", "--split", "dev"])
    assert "--split is for the task data" in err


@pytest.fixture(scope="module")
def no_figures_run(tiny_llama_lm_dir, files, tmp_path_factory, request):
    out = tmp_path_factory.mktemp("nofig") / "run"
    assert main(atlas_args(tiny_llama_lm_dir, files[0], out, "--no-figures", "--no-importance")) == 0
    return out


def test_a_resume_keeps_no_figures(no_figures_run):
    from bertscope.analyses.heads.streaming.command import add_arguments
    from bertscope.run.analysis_run import ModelRun

    assert main(["atlas", "--resume", str(no_figures_run), "--quiet"]) == 0
    assert not list(no_figures_run.glob("fig_*.png"))
    settings = json.loads((no_figures_run / "run.json").read_text())["analyses"]["atlas"]["settings"]
    assert settings["no_figures"] is True
    # heads streaming's resume goes through the same run class
    run_json = no_figures_run.parent / "streaming" / "run.json"
    run_json.parent.mkdir()
    run_json.write_text(json.dumps({"analyses": {"streaming": {"settings": {"no_figures": True, "max_len": 48}}}}))
    from argparse import ArgumentParser

    p = ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--resume", str(run_json.parent)])
    assert ModelRun.resumed_args("streaming", args, add_arguments).no_figures is True


def test_a_limit_past_the_corpus_plans_the_segments_that_exist(tiny_llama_lm_dir, files, tmp_path, capsys):
    from bertscope.text.corpus import open_corpus, planned_segments

    corpus = open_corpus(str(files[0]))
    assert planned_segments(99999999, corpus) == 12 and planned_segments(5, corpus) == 5
    assert planned_segments(None, corpus) == 12
    argv = atlas_args(tiny_llama_lm_dir, files[0], tmp_path / "r", "--no-importance", "--no-figures")
    argv[argv.index("--limit") + 1] = "99999999"
    argv.remove("--quiet")
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("bertscope.analyses.atlas").addHandler(handler)  # the CLI's own handler does not propagate
    try:
        assert main(argv) == 0
    finally:
        logging.getLogger("bertscope.analyses.atlas").removeHandler(handler)
    log = "\n".join(lines)
    assert "plan: streamed pass: 12 segment(s)" in log
    assert "has 12 documents, so the streamed pass reads them all" in log
    # the estimate says its basis and a range, not one number
    assert "likely between" in log and "basis: the median of 3" in log and "cores now" in log


@pytest.mark.parametrize("command", ["run", "sinks"])
def test_run_and_sinks_show_the_segments_that_exist(command, tiny_llama_lm_dir, files, tmp_path, monkeypatch):
    """`run` and `sinks` with --limit 99999999: the progress bar's total is the corpus's 12 documents (times
    sinks' BOS variants), not 99,999,999."""
    import bertscope.engine.loop as loop

    totals, fold = [], loop.fold

    def recording(*args, **kwargs):
        totals.append(args[4].total)
        return fold(*args, **kwargs)

    monkeypatch.setattr(loop, "fold", recording)
    argv = [command, "--model", str(tiny_llama_lm_dir), "--corpus", str(files[0]), "--limit", "99999999",
            "--max-len", "64", "--out", str(tmp_path / command), "--quiet", "--no-figures"]
    assert main(argv) == 0
    assert totals and totals[0] in (12, 24), totals  # sinks may read each segment with and without its BOS


# --- finished work is never lost -----------------------------------------------------------------------

def test_a_resume_may_change_an_unfinished_stages_option(tiny_llama_lm_dir, files, tmp_path, monkeypatch, capsys):
    from bertscope.analyses.heads.induction.stats import InductionScores

    out = tmp_path / "part"
    original = interrupt_on_call(monkeypatch, InductionScores, 1)  # dies in the probe after the streamed pass
    assert main(atlas_args(tiny_llama_lm_dir, files[0], out, "--no-figures")) == 130
    monkeypatch.setattr(InductionScores, "add", original)
    capsys.readouterr()
    err = one_line(capsys, ["atlas", "--resume", str(out), "--limit", "3", "--quiet"])  # the finished pass's
    assert "does not take --limit 3 (the run's: 2)" in err
    assert main(["atlas", "--resume", str(out), "--importance-len", "24", "--induction-len", "4", "--quiet"]) == 0
    settings = json.loads((out / "run.json").read_text())["analyses"]["atlas"]
    assert settings["status"] == "complete"
    assert settings["settings"]["importance_len"] == 24 and settings["settings"]["induction_len"] == 4


# --- messages that name what the user did ----------------------------------------------------------------

def test_messages_name_the_users_own_options(tiny_llama_lm_dir, tmp_path, capsys):
    corpus, needles = corpus_and_needles(tmp_path, ["The cat sat on a mat."], [NEEDLE])
    base = atlas_args(tiny_llama_lm_dir, corpus, tmp_path / "a")
    base.remove("--no-retrieval")
    err = one_line(capsys, [*base, "--needles", str(needles), "--retrieval-lengths", "60", "--max-len", "32"])
    assert "--retrieval-lengths" in err and "--lengths" not in err.replace("--retrieval-lengths", "")
    err = one_line(capsys, ["heads", "attention-grad", "--model", str(tiny_llama_lm_dir)])
    assert "runs on encoders only" in err and "causal decoder" in err and "MiniLM" not in err
    err = one_line(capsys, ["patterns", "--corpus", str(corpus)])
    assert "--data (or --corpus) takes names of data sets" in err and "reads no corpus file" in err
    weights = tiny_llama_lm_dir / "model.safetensors"
    err = one_line(capsys, ["heads", "positions", "--model", str(weights), "--out", str(tmp_path / "p")])
    assert f"--model {weights} is a file" in err and "not found" not in err
