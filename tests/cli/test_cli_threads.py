"""--threads' default: torch's own choice capped at the cores other work leaves idle.

On a shared 2-core machine at a load average of 8, a 64-segment `bertscope run` took 84 s with
torch's default 2 threads and 58 s with 1 (OpenMP workers spin at barriers while the cores they
wait for are busy); on an idle machine torch's choice is the faster one."""
import argparse

import pytest
import torch

from bertscope.cli import args as cli_args


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cores,load,idle", [(2, 0.1, 2), (2, 0.6, 1), (2, 8.4, 1), (16, 3.2, 13), (16, 40.0, 1),
                                             (1, 0.0, 1)])
def test_idle_cores(cores, load, idle):
    assert cli_args.idle_cores(cores, load) == idle


@pytest.fixture
def machine(monkeypatch):
    """A machine with `cores` cores at a load average of `load`, no OMP_NUM_THREADS."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def make(cores, load):
        monkeypatch.setattr(cli_args.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        monkeypatch.setattr(cli_args.os, "getloadavg", lambda: (load, load, load), raising=False)
    return make


def test_the_default_follows_the_load_up_to_torchs_choice(machine, threads_restored):
    torch.set_num_threads(2)  # torch's choice on a 2-core machine
    machine(2, 8.4)
    assert cli_args.default_threads() == 1
    machine(2, 0.2)
    assert cli_args.default_threads() == 2
    machine(64, 0.0)
    assert cli_args.default_threads() == 2  # never more than torch's own choice


def test_omp_num_threads_or_no_load_average_leaves_torch_to_decide(machine, monkeypatch):
    machine(2, 8.4)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cli_args.default_threads() is None
    monkeypatch.delenv("OMP_NUM_THREADS")

    def unsupported():
        raise OSError("no load average here")
    monkeypatch.setattr(cli_args.os, "getloadavg", unsupported)
    assert cli_args.default_threads() is None


def test_applied_only_where_threads_was_not_given(machine, threads_restored):
    torch.set_num_threads(2)
    machine(2, 8.4)
    args = argparse.Namespace(threads=None)
    cli_args.apply_default_threads(args)
    assert torch.get_num_threads() == 1 and args.threads is None  # run.json still records "not given"
    torch.set_num_threads(2)
    cli_args.apply_default_threads(argparse.Namespace(threads=2))  # the command sets a given one
    cli_args.apply_default_threads(argparse.Namespace(run_dir="x"))  # a command without --threads
    assert torch.get_num_threads() == 2
