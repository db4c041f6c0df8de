"""torchrun: two ranks split the batches and all-reduce the sums; the result equals one process."""
import csv

import numpy as np
import pandas as pd
from conftest import run_one_and_two_ranks

from bertscope.engine.accumulate import HeadStats


def read_heads(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_two_ranks_equal_one_process(tmp_path):
    # windows of 2 batches: the 6 batches of the plan come from 3 windows of 4 segments
    args = ["run", "--corpus", "wiki", "--limit", "12", "--batch-size", "2", "--window", "2", "--quiet", "--no-figures",
            "--per-example"]
    run_one_and_two_ranks(args, tmp_path, port=29533)
    # each rank checkpointed its own half of the 6 batches
    halves = [HeadStats.load(tmp_path / "two" / f"stats.rank{r}.npz") for r in (0, 1)]
    assert [h.n_segments for h in halves] == [6, 6]
    one, two = HeadStats.load(tmp_path / "one" / "stats.npz"), HeadStats.load(tmp_path / "two" / "stats.npz")
    assert two.n_segments == one.n_segments == 12
    np.testing.assert_allclose(two.entropy_sum, one.entropy_sum, rtol=1e-9)
    np.testing.assert_allclose(two.class_mass_sum, one.class_mass_sum, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(two.n_rows, one.n_rows)
    rows_one, rows_two = read_heads(tmp_path / "one" / "heads.csv"), read_heads(tmp_path / "two" / "heads.csv")
    assert len(rows_one) == len(rows_two) == 72
    for a, b in zip(rows_one, rows_two):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([float(b[k]) for k in b], [float(a[k]) for k in a], rtol=1e-5, atol=1e-9)
    # per-example rows: each rank wrote its parts, rank 0 streamed them into one file
    keys = ["segment", "layer", "head"]
    ex_one = pd.read_parquet(tmp_path / "one" / "examples.parquet").sort_values(keys).reset_index(drop=True)
    ex_two = pd.read_parquet(tmp_path / "two" / "examples.parquet").sort_values(keys).reset_index(drop=True)
    assert len(ex_one) == len(ex_two) == 12 * 72
    pd.testing.assert_frame_equal(ex_one, ex_two, rtol=1e-9)


# ----------------------------------------------------------------------------- devices under torchrun
# torchrun's environment for one rank of a 2 x 2 job (2 nodes, 2 processes each); no process
# group is started: the device each rank would take is read from the environment alone

import pytest  # noqa: E402
import torch  # noqa: E402

from bertscope.engine import distributed  # noqa: E402
from bertscope.engine.devices import check_device  # noqa: E402
from bertscope.errors import UserError  # noqa: E402


def torchrun_env(monkeypatch, rank, local_rank, world_size=4, local_world_size=2):
    for key, value in {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
                       "LOCAL_WORLD_SIZE": local_world_size, "GROUP_RANK": rank // local_world_size,
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}.items():
        monkeypatch.setenv(key, str(value))


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.parametrize("rank,local_rank", [(0, 0), (1, 1), (2, 0), (3, 1)])
def test_each_rank_takes_its_local_gpu(monkeypatch, two_gpus, rank, local_rank):
    torchrun_env(monkeypatch, rank, local_rank)
    world = distributed.env_world("cuda")
    assert (world.rank, world.size, world.local_rank) == (rank, 4, local_rank)
    assert world.device == f"cuda:{local_rank}"


def test_explicit_gpu_and_cpu_are_kept(monkeypatch, two_gpus):
    torchrun_env(monkeypatch, 2, 0)
    assert distributed.env_world("cuda:1").device == "cuda:1"
    assert distributed.env_world("cpu").device == "cpu"
    check_device("cuda:1", "auto")  # two GPUs: cuda:1 exists
    with pytest.raises(UserError, match="2 GPU"):
        check_device("cuda:2", "auto")


def test_more_ranks_than_gpus_is_a_user_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    torchrun_env(monkeypatch, 1, 1)
    with pytest.raises(UserError, match="sees 1 GPU"):
        distributed.env_world("cuda")


def test_one_process_keeps_the_device_as_given(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = distributed.env_world("cuda")
    assert (world.size, world.device) == (1, "cuda")


def test_process_group_follows_the_device(monkeypatch, two_gpus):
    """gloo on the CPU; on CUDA torch's backend for it (nccl), with gloo for the CPU sums."""
    assert distributed.process_group_backend("cpu") == "gloo"
    assert distributed.process_group_backend("cuda:1") == "cpu:gloo,cuda:nccl"
    torchrun_env(monkeypatch, 3, 1)
    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 3)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    world = distributed.init_world("cuda")
    assert world == distributed.World(3, 4, 1, "cuda:1")
    assert calls == [("set_device", "cuda:1"), ("init", "cpu:gloo,cuda:nccl")]
