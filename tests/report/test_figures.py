"""Figures drawn in helper processes (bertscope.report.figure_pool): every figure arrives, a failure is
reported and costs only the figures, Ctrl-C leaves no helper behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import PNG, check_error, check_heads, check_interrupted, resume_corpus  # noqa: F401 (a fixture)
from test_surface_plots import synthetic_table

import bertscope.engine.loop
import bertscope.report.figure_pool
from bertscope.analyses.surface.command import SURFACE_PLOTS, surface_pool
from bertscope.analyses.surface.plots import FIGURES
from bertscope.cli.main import main
from bertscope.report.figure_pool import FigureError, FigurePool, split

pytestmark = pytest.mark.usefixtures("single_thread")
PLOT = f"{SURFACE_PLOTS}:plot_surface"


def test_split_gives_every_name_once_in_shares_of_about_equal_cost():
    shares = split(FIGURES, 2)
    assert sorted(n for share in shares for n in share) == sorted(FIGURES)
    cost = [sum(FIGURES[n] for n in share) for share in shares]
    assert max(cost) - min(cost) <= min(FIGURES.values())  # no move of one figure would even them more
    assert split({"a": 1.0}, 4) == [["a"]]  # never an empty share
    assert split({"a": 3, "b": 2, "c": 2}, 2) == [["a"], ["b", "c"]]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_pool_draws_every_figure(tmp_path, n):
    """In helpers (1 or 2) or, with none, in this process: the same five PNGs."""
    pool = FigurePool.start(f"{SURFACE_PLOTS}:warm_up", n=n)
    helpers = list(pool.helpers)
    assert len(helpers) == n
    common = dict(table=synthetic_table(3, 4), out_dir=tmp_path, title="t")
    pool.draw(PLOT, [dict(common, names=names) for names in split(FIGURES, max(1, n))])
    paths = pool.wait()
    assert sorted(p.name for p in paths) == sorted(FIGURES)
    assert all(p.read_bytes()[:8] == PNG for p in paths)
    assert [h.returncode for h in helpers] == [0] * n and pool.helpers == []  # answered, exited, closed


def test_a_failing_figure_is_reported_with_its_reason(tmp_path):
    pool = FigurePool.start(n=2)
    table = synthetic_table(3, 4)
    del table["entropy"]  # the entropy figures cannot be drawn
    pool.draw(PLOT, [dict(table=table, out_dir=tmp_path, title="t", names=["fig_offsets_heatmap.png"]),
                     dict(table=table, out_dir=tmp_path, title="t", names=["fig_entropy_heatmap.png"])])
    with pytest.raises(FigureError, match="KeyError: 'entropy'"):
        pool.wait()
    assert (tmp_path / "fig_offsets_heatmap.png").is_file()  # the other helper's figure is there


def test_a_helper_that_dies_is_reported(tmp_path):
    log = open(tmp_path / "log", "w+b")
    dead = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stderr.write('boom\\n'); os._exit(3)"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    dead.log = log
    dead.wait()
    pool = FigurePool([dead])
    pool.draw(PLOT, [dict(table=synthetic_table(2, 2), out_dir=tmp_path, title="t")])
    with pytest.raises(FigureError, match="exited with code 3: boom"):
        pool.wait()


def ignores_sigint(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_helpers_ignore_ctrl_c_and_exit_at_eof_without_a_job(tmp_path):
    """Ctrl-C reaches the whole process group: the helpers leave the decision to the run."""
    pool = FigurePool.start(n=2)
    helpers = list(pool.helpers)
    deadline = time.monotonic() + 120
    while not ignores_sigint(helpers[0].pid):  # the helper has started up
        assert time.monotonic() < deadline and helpers[0].poll() is None
        time.sleep(0.05)
    helpers[0].send_signal(signal.SIGINT)
    pool.draw(PLOT, [dict(table=synthetic_table(2, 3), out_dir=tmp_path, title="t")])  # one job: helper 0
    assert len(pool.wait()) == len(FIGURES)
    assert [h.returncode for h in helpers] == [0, 0]
    idle = FigurePool.start(n=1)
    helper = idle.helpers[0]
    idle.close()  # stdin closed with no job: the helper exits by itself, not by a kill
    assert helper.returncode == 0


@pytest.fixture
def started(monkeypatch):
    """Every FigurePool the run starts, to look at its helpers afterwards."""
    pools = []
    real_start = FigurePool.start.__func__

    def start(cls, *a, **k):
        pools.append(real_start(cls, *a, **k))
        return pools[-1]
    monkeypatch.setattr(FigurePool, "start", classmethod(start))
    return pools


def run_args(tiny_checkpoint, corpus, out):
    return ["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--limit", "12", "--batch-size", "4",
            "--quiet", "--out", str(out)]


def test_run_with_figure_helpers_writes_every_output(tmp_path, resume_corpus, tiny_checkpoint, started):  # noqa: F811
    out = tmp_path / "run"
    assert main(run_args(tiny_checkpoint, resume_corpus, out)) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "complete" and "figures_error" not in record
    assert set(record["outputs"]) == {"heads.csv", "stats.npz", "index.html"} | set(FIGURES)
    assert [n for n in record["outputs"] if n in FIGURES] == list(FIGURES)  # the usual order, whoever drew them
    html = (out / "index.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(FIGURES)  # the report embeds every figure
    assert len(started) == 1 and len(started[0].helpers) == 0  # the run closed its pool


def test_a_figure_failure_leaves_a_complete_run_and_a_warning(tmp_path, resume_corpus, tiny_checkpoint,  # noqa: F811
                                                               capsys):
    out = tmp_path / "run"
    assert main(run_args(tiny_checkpoint, resume_corpus, out)) == 0
    heads = (out / "heads.csv").read_text()
    (out / "fig_special_heatmap.png").unlink()
    (out / "fig_special_heatmap.png").mkdir()  # savefig cannot write there
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("bertscope: warning: the figures could not be drawn: IsADirectoryError") and \
        err.count("\n") == 1 and f"--resume {out}" in err, err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "complete" and "IsADirectoryError" in record["figures_error"]
    assert "fig_special_heatmap.png" not in record["outputs"] and "index.html" in record["outputs"]
    assert 'src="fig_special_heatmap.png"' not in (out / "index.html").read_text()
    assert (out / "heads.csv").read_text() == heads


def test_ctrl_c_during_the_pass_stops_the_helpers(tmp_path, resume_corpus, tiny_checkpoint, capsys,  # noqa: F811
                                                   monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(bertscope.engine.loop, "forward", interrupted)
    helpers = []
    real_close = FigurePool.close

    def close(self):
        helpers.extend(self.helpers)
        real_close(self)
    monkeypatch.setattr(FigurePool, "close", close)
    out = tmp_path / "run"
    check_interrupted(capsys, main(run_args(tiny_checkpoint, resume_corpus, out)), f"bertscope run --resume {out}")
    assert len(helpers) == bertscope.report.figure_pool.default_helpers() and all(h.poll() is not None for h in helpers)


def test_ctrl_c_while_the_figures_are_drawn(tmp_path, resume_corpus, tiny_checkpoint, capsys,  # noqa: F811
                                            monkeypatch):
    """The batches are all saved: the message says how to get the outputs, and resuming writes them."""
    killed = []

    def interrupted(self):
        killed.extend(self.busy)
        raise KeyboardInterrupt
    monkeypatch.setattr(FigurePool, "wait", interrupted)
    out = tmp_path / "run"
    check_interrupted(capsys, main(run_args(tiny_checkpoint, resume_corpus, out)),
                      "interrupted while writing the outputs")
    assert killed and all(h.poll() is not None for h in killed)  # drawing helpers are killed, not awaited
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "complete" and set(FIGURES) <= set(record["outputs"])
    check_heads(out / "heads.csv", 2, 4)


def test_surface_pool_starts_no_helper_on_other_torchrun_ranks(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    pool = surface_pool()
    assert pool.helpers == []
    monkeypatch.setenv("RANK", "0")
    with surface_pool() as pool:
        assert len(pool.helpers) == bertscope.report.figure_pool.default_helpers() >= 1


def test_the_command_exits_at_once_with_its_output_flushed(tmp_path, resume_corpus, tiny_checkpoint):  # noqa: F811
    """`python -m bertscope.cli` (argv from the command line) ends with os._exit after the exit
    handlers: stdout, piped, is complete, and the exit code is the command's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    args = [a for a in run_args(tiny_checkpoint, resume_corpus, out) if a != "--quiet"]  # what it says is the test
    done = subprocess.run([sys.executable, "-m", "bertscope.cli", *args],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"wrote the report {out / 'index.html'}") and "wrote heads.csv" in done.stdout
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    again = subprocess.run([sys.executable, "-m", "bertscope.cli", *run_args(tiny_checkpoint, resume_corpus, out)],
                           env=env, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 2 and again.stderr.startswith("bertscope: error: "), again.stderr
