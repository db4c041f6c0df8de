"""--threads' default: torch's own choice capped at the cores other work leaves idle, read from the
run queue at the start (`others_running`), not from the 1-minute load average.

On a shared 2-core machine at a load average of 8, a 64-segment `bertscope run` took 84 s with
torch's default 2 threads and 58 s with 1 (the chunked kernel's parallel regions wait at their
barriers for workers whose cores run other jobs); on an idle machine torch's choice is the faster
one, and the load average, which still counts the user's own run of the last minute, gave it 1."""
import argparse
import itertools

import pytest
import torch

from bertscope.cli import args as cli_args


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cores,busy,idle", [(2, 0.0, 2), (2, 0.4, 2), (2, 0.5, 1), (2, 1.0, 1), (2, 2.0, 1),
                                             (2, 8.4, 1), (16, 3.2, 13), (16, 40.0, 1), (1, 0.0, 1)])
def test_idle_cores(cores, busy, idle):
    assert cli_args.idle_cores(cores, busy) == idle


@pytest.mark.parametrize("line,running", [("0.48 0.31 0.12 1/98 4536\n", 1), ("5.32 2.51 1.01 7/112 8480\n", 7)])
def test_running_now_reads_the_run_queue_not_the_averages(tmp_path, line, running):
    path = tmp_path / "loadavg"
    path.write_text(line)
    assert cli_args.running_now(str(path)) == running


def test_running_now_on_an_unreadable_file(tmp_path):
    path = tmp_path / "loadavg"
    path.write_text("0.48 0.31 0.12\n")  # no run-queue field
    with pytest.raises(IndexError):
        cli_args.running_now(str(path))
    with pytest.raises(OSError):
        cli_args.running_now(str(tmp_path / "missing"))


def test_others_running_leaves_out_the_caller_and_averages_the_samples():
    sleeps = []
    reads = iter([1, 3, 3, 2, 0])  # the caller is one of the running tasks; 0 is a torn read, taken as none
    busy = cli_args.others_running(samples=5, interval=0.02, read=lambda: next(reads), sleep=sleeps.append)
    assert busy == pytest.approx((0 + 2 + 2 + 1 + 0) / 5)
    assert sleeps == [0.02] * 4  # between the samples, not before the first or after the last


@pytest.fixture
def machine(monkeypatch):
    """A machine with `cores` cores whose run queue reads `running` (the caller included) at every
    look, or each of a list of counts in turn; no OMP_NUM_THREADS, no real sleeping."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cli_args.time, "sleep", lambda s: None)

    def make(cores, running):
        counts = itertools.cycle(running if isinstance(running, list) else [running])
        monkeypatch.setattr(cli_args.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        monkeypatch.setattr(cli_args, "running_now", lambda: next(counts))
    return make


def test_the_default_follows_the_run_queue_up_to_torchs_choice(machine, monkeypatch, threads_restored):
    torch.set_num_threads(2)  # torch's choice on a 2-core machine
    monkeypatch.setattr(cli_args.os, "getloadavg", lambda: (8.4, 8.4, 8.4), raising=False)
    machine(2, 1)  # only this process runs: every core, whatever the load average still says
    assert cli_args.default_threads() == 2
    machine(2, 3)  # two busy loops beside it
    assert cli_args.default_threads() == 1
    machine(2, [1, 1, 1, 1, 1, 1, 1, 1, 1, 2])  # a short job seen once in ten looks does not decide
    assert cli_args.default_threads() == 2
    machine(2, [2, 1])  # another task running half the time takes a core
    assert cli_args.default_threads() == 1
    machine(64, 1)
    assert cli_args.default_threads() == 2  # never more than torch's own choice


def test_omp_num_threads_or_no_run_queue_leaves_torch_to_decide(machine, monkeypatch):
    machine(2, 3)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cli_args.default_threads() is None
    monkeypatch.delenv("OMP_NUM_THREADS")

    def unsupported():
        raise OSError("no /proc/loadavg here")
    monkeypatch.setattr(cli_args, "running_now", unsupported)
    assert cli_args.default_threads() is None


def test_applied_only_where_threads_was_not_given(machine, threads_restored):
    torch.set_num_threads(2)
    machine(2, 3)
    args = argparse.Namespace(threads=None)
    cli_args.apply_default_threads(args)
    assert torch.get_num_threads() == 1 and args.threads is None  # run.json still records "not given"
    torch.set_num_threads(2)
    cli_args.apply_default_threads(argparse.Namespace(threads=2))  # the command sets a given one
    cli_args.apply_default_threads(argparse.Namespace(run_dir="x"))  # a command without --threads
    assert torch.get_num_threads() == 2
