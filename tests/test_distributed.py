"""torchrun: two ranks split the batches and all-reduce the sums; the result equals one process."""
import csv

import numpy as np
import pandas as pd

from bertscope.accumulate import HeadStats
from conftest import run_one_and_two_ranks


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
