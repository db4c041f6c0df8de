"""The run class (`bertscope.run.analysis_run`) and the one reader of run.json (issue 28, parts 3
and 6): Ctrl-C saves the finished batches and says "interrupted" in run.json however stderr is
connected; a broken or foreign run.json is one line, not a traceback; a run that fails before
its first result leaves no half-made folder that --out refuses."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_cli import resume_corpus  # noqa: F401 (a fixture)
from test_cli_conventions import child_env, run_args

import bertscope.run.rundir
from bertscope.cli.main import main
from bertscope.engine.accumulate import HeadStats
from bertscope.errors import UserError
from bertscope.files import read_run
from bertscope.run.analysis_run import AnalysisRun
from bertscope.run.rundir import check_run_dir

# --- Ctrl-C with stderr piped to a reader that dies with the signal (`2>&1 | tee log`) ----------

BROKEN_PIPE_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    # Ctrl-C as a terminal delivers it: a job started in the background (`cmd &`, as a CI runner
    # may start the suite) inherits SIGINT ignored, and Python then raises no KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # stderr is a pipe whose reader this process holds: at Ctrl-C it closes it, as `tee` dies
    reader, writer = os.pipe()
    os.dup2(writer, 2)
    os.close(writer)
    import bertscope.engine.loop as engine
    real, calls = engine.forward, []
    def forward(*a, **k):
        calls.append(1)
        if len(calls) == 3:  # two batches are done
            os.close(reader)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    engine.forward = forward
    from bertscope.cli.main import main
    sys.argv = ["bertscope", *sys.argv[1:]]
    main()
""")


def test_ctrl_c_with_stderr_piped_to_a_reader_that_died_saves_and_exits_130(tmp_path, resume_corpus,  # noqa: F811
                                                                           tiny_checkpoint):
    """With progress bars on stderr and that pipe's reader gone, tqdm's last write raised
    BrokenPipeError, which replaced the KeyboardInterrupt before the engine could save: exit 1,
    no stats, run.json "running". Now the finished batches are saved and the exit code is 130."""
    cut = tmp_path / "cut"
    args = [a for a in run_args(tiny_checkpoint, resume_corpus) if a != "--quiet"]  # progress bars on
    done = subprocess.run([sys.executable, "-c", BROKEN_PIPE_SCRIPT, *args, "--out", str(cut)], env=child_env(),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 130, done.stdout
    assert HeadStats.load(cut / "stats.npz").batches_done in (2, 3)  # the signal lands in the third batch
    assert json.loads((cut / "run.json").read_text())["status"] == "interrupted"
    assert main(["run", "--resume", str(cut), "--quiet", "--no-figures"]) == 0
    assert json.loads((cut / "run.json").read_text())["status"] == "complete"


def test_an_interrupted_analysis_says_so_in_run_json(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Exception) as raised:
        with AnalysisRun("cues", argparse.Namespace(out=str(out), quiet=True), resumable=True, command="cues") as run:
            run.write_text("partial.txt", "x")
            raise KeyboardInterrupt
    assert type(raised.value).__name__ == "Interrupted"
    assert str(raised.value) == ("interrupted; the finished batches are saved: resume with "
                                 f"`bertscope cues --resume {out}`")
    assert read_run(out / "run.json")["analyses"]["cues"]["status"] == "interrupted"


# --- run.json: one checked reader, one line for what it refuses -----------------------------------


def one_line_error(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.mark.parametrize("content", ["{}", "[]", "null", '"text"', '{"analyses": 3}', '{"probes": {"x": 1}}',
                                     '{"settings": [1]}', '{"status": 2}'])
def test_report_and_resume_of_a_broken_run_json_are_one_line(tmp_path, capsys, content):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(content)
    one_line_error(capsys, ["run", "--resume", str(run), "--quiet"], str(run))
    if content == "{}":  # an empty record is no run, but a report of it is only empty
        assert main(["report", str(run), "--quiet"]) == 0
    else:
        one_line_error(capsys, ["report", str(run), "--quiet"], str(run / "run.json"))


def test_resume_of_a_folder_another_command_made_is_one_line(tmp_path, capsys):
    """`bertscope run --resume DIR` of a probe's folder was `KeyError: 'settings'`."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"analyses": {"syntax": {"status": "complete", "settings": {}}}}))
    one_line_error(capsys, ["run", "--resume", str(run)], "another command")
    one_line_error(capsys, ["features", "--resume", str(run)], "holds no 'features' run")


@pytest.mark.parametrize("setting, value", [("limit", "abc"), ("max_len", "128"), ("token_types", "both"),
                                            ("argmax", "yes"), ("batch_size", -1), ("corpus", 3)])
def test_resume_with_a_recorded_setting_of_the_wrong_type_is_one_line(tmp_path, capsys, setting, value,
                                                                       resume_corpus, tiny_checkpoint):  # noqa: F811
    run = tmp_path / "run"
    assert main([*run_args(tiny_checkpoint, resume_corpus), "--out", str(run)]) == 0
    record = json.loads((run / "run.json").read_text())
    record["settings"][setting] = value
    (run / "run.json").write_text(json.dumps(record))
    one_line_error(capsys, ["run", "--resume", str(run), "--quiet"], str(run / "run.json"), setting)


def test_runs_written_before_the_analyses_key_still_read(tmp_path, capsys):
    """run.json of 0.1 filed every analysis under "probes" (and a surface run listed its
    analyses under "analyses"): they read as "analyses", and a new analysis keeps them."""
    run = tmp_path / "run"
    run.mkdir()
    old = {"bertscope_version": "0.1.0", "status": "complete", "settings": {"limit": 12}, "model": None,
           "analyses": ["surface"],
           "probes": {"syntax": {"status": "complete", "settings": {"max_len": 128}, "results": {"ewt": {}}}}}
    (run / "run.json").write_text(json.dumps(old))
    record = read_run(run / "run.json")
    assert record["analyses"] == old["probes"] and "probes" not in record
    with AnalysisRun("cues", argparse.Namespace(out=str(run), quiet=True)) as added:
        added.finish({"n": 1}, report=False)
    written = json.loads((run / "run.json").read_text())
    assert set(written["analyses"]) == {"syntax", "cues"} and "probes" not in written
    assert written["analyses"]["syntax"] == old["probes"]["syntax"]
    assert main(["report", str(run), "--quiet"]) == 0
    assert "probe syntax" in (run / "index.html").read_text()


# --- a run that fails before its first result ----------------------------------------------------


def test_a_command_that_fails_after_loading_leaves_no_folder(tmp_path, capsys, resume_corpus,  # noqa: F811
                                                             tiny_checkpoint):
    """`heads attention-grad --objective mlm` on a model without an MLM head fails once the
    model has loaded (as `heads disable` on one without a classifier): its folder was left with
    run.json "running", which --out then refused."""
    out = tmp_path / "out"
    argv = ["heads", "attention-grad", "--model", str(tiny_checkpoint), "--objective", "mlm", "--corpus",
            str(resume_corpus), "--limit", "4", "--quiet", "--out", str(out)]
    one_line_error(capsys, argv, "masked-LM head")
    assert not out.exists()


def test_a_run_that_failed_after_an_output_is_marked_failed_and_out_takes_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with pytest.raises(UserError):
        with AnalysisRun("cues", argparse.Namespace(out=str(out), quiet=True)) as run:
            run.write_text("partial.txt", "written before the failure")
            raise UserError("no examples\nsecond line")
    entry = read_run(out / "run.json")["analyses"]["cues"]
    assert (entry["status"], entry["error"]) == ("failed", "no examples")
    assert (out / "partial.txt").is_file()  # an output is kept: the folder is marked, not removed
    with AnalysisRun("cues", argparse.Namespace(out=str(out), quiet=True)) as again:  # --out there works
        again.finish({}, report=False)
    assert read_run(out / "run.json")["analyses"]["cues"]["status"] == "complete"

    alone = tmp_path / "alone"  # a folder with only a failed run.json (e.g. an older bertscope's)
    alone.mkdir()
    (alone / "run.json").write_text(json.dumps({"analyses": {"disable": {"status": "failed"}}}))
    said = []
    monkeypatch.setattr(bertscope.run.rundir.logger, "info", said.append)
    check_run_dir(str(alone))
    assert said == [f"{alone} holds only a failed run: starting afresh there"] and not alone.exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "run.json").write_text(json.dumps({"analyses": {"disable": {"status": "running"}}}))
    with pytest.raises(UserError, match="already exists and is not empty"):
        check_run_dir(str(tmp_path / "busy"))


def test_a_folder_made_by_the_run_is_removed_when_it_fails(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(ValueError):
        with AnalysisRun("cues", argparse.Namespace(out=str(out), quiet=True)):
            raise ValueError("a bug")
    assert not out.exists()
    assert os.listdir(tmp_path) == []
