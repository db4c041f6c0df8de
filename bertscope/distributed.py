"""Many processes, one result: under torchrun each rank takes every world-size-th batch,
and the additive sums are all-reduced at the end.

Because every statistic is a sum (see `accumulate.py`), the merged result equals a
single-process run up to float64 rounding, whatever the number of ranks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bertscope.accumulate import ARRAYS, HeadStats


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def suffix(self) -> str:
        """File-name suffix for per-rank checkpoints ('' in a single process)."""
        return "" if self.size == 1 else f".rank{self.rank}"


def init_world() -> World:
    """The process group torchrun describes through its environment, or a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # CPU sums; the tensors involved are tiny
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def broadcast(world: World, value):
    """Rank 0's `value` on every rank (e.g. the run directory it created)."""
    if world.size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_stats(world: World, stats: HeadStats) -> HeadStats:
    """Sum every rank's accumulator into each rank's copy."""
    if world.size == 1:
        return stats
    for name in ARRAYS:
        t = torch.from_numpy(getattr(stats, name))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place on the shared numpy buffer
    n = torch.tensor([stats.n_segments], dtype=torch.float64)
    dist.all_reduce(n)
    stats.n_segments = int(n.item())
    return stats


def shutdown(world: World):
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
