"""Many processes, one result: under torchrun each rank takes every world-size-th batch,
and the additive sums are all-reduced at the end.

Because every statistic is a sum (see `accumulate.py`), the merged result equals a
single-process run up to float64 rounding, whatever the number of ranks.

Devices: with `--device cuda` (no index) each rank takes `cuda:LOCAL_RANK`, the GPU torchrun
gives it on its node; an explicit index (`cuda:1`) is kept as given. The process group is
the one torch maps to the device (`Backend.default_device_backend_map`: gloo for the CPU,
nccl for CUDA); on CUDA gloo is added for the CPU tensors, as the sums are numpy buffers
(`cpu:gloo,cuda:nccl`), so every all-reduce site works unchanged on either device.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bertscope.engine.accumulate import HeadStats
from bertscope.errors import UserError


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: str = "cpu"  # this rank's torch device (`rank_device`)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def suffix(self) -> str:
        """File-name suffix for per-rank checkpoints ('' in a single process)."""
        return "" if self.size == 1 else f".rank{self.rank}"


def env_world(device: str = "cpu") -> World:
    """The world torchrun's environment describes (RANK, WORLD_SIZE, LOCAL_RANK), with this
    rank's device; no process group is started."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(device=device)
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    return World(rank, size, local, rank_device(device, local))


def rank_device(device: str, local_rank: int) -> str:
    """The device of the rank with this LOCAL_RANK: `cuda` becomes `cuda:LOCAL_RANK`; an
    explicit index, the CPU and other devices are kept. A `UserError` when the node has
    fewer GPUs than torchrun started processes on it."""
    dev = torch.device(device)
    if dev.type != "cuda" or dev.index is not None:
        return device
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UserError(f"--device cuda under torchrun: local rank {local_rank} needs cuda:{local_rank}, but torch "
                        f"sees {count} GPU(s) on this node; start at most {count} processes per node "
                        "(--nproc-per-node) or name the device (--device cuda:N)")
    return f"cuda:{local_rank}"


def process_group_backend(device: str) -> str:
    """The backend torch maps to `device`'s type, plus gloo for CPU tensors on an accelerator."""
    kind = torch.device(device).type
    backend = dist.Backend.default_device_backend_map.get(kind, "gloo")
    return backend if kind == "cpu" else f"cpu:gloo,{kind}:{backend}"


def init_world(device: str = "cpu") -> World:
    """The process group torchrun describes through its environment, or a world of one;
    `World.device` is the device this rank runs its model on."""
    world = env_world(device)
    if world.size == 1:
        return world
    if not dist.is_initialized():
        if torch.device(world.device).type == "cuda":
            torch.cuda.set_device(torch.device(world.device))  # nccl's collectives use the current device
        dist.init_process_group(process_group_backend(world.device))
    return World(dist.get_rank(), dist.get_world_size(), world.local_rank, world.device)


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
    for name in stats.arrays:  # a decoder's visible sums too (every rank must have seen a batch)
        t = torch.from_numpy(getattr(stats, name))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place on the shared numpy buffer
    n = torch.tensor([stats.n_segments], dtype=torch.float64)
    dist.all_reduce(n)
    stats.n_segments = int(n.item())
    return stats


def shutdown(world: World):
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
