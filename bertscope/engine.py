"""The engine: segments in, per-head statistics out, one forward pass per batch.

Batches are formed from segments sorted by length, so padding (which costs time but never
changes a result) stays small. The plan of batches is a pure function of the segments,
which is what makes a run resumable: a checkpoint records how many batches are done.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from tqdm.auto import tqdm

from bertscope.accumulate import HeadStats
from bertscope.attention import HeadProbe
from bertscope.kernels import StatsSpec
from bertscope.models import LoadedModel
from bertscope.segments import Segment, collate


@dataclass
class EngineOptions:
    batch_size: int = 16
    backend: str = "auto"
    progress: bool = True
    checkpoint_every: int = 20  # batches between checkpoints


def plan_batches(segments: Sequence[Segment], batch_size: int) -> list[list[int]]:
    """Indices of the segments of each batch: sorted by length (ties by position)."""
    order = sorted(range(len(segments)), key=lambda i: (segments[i].n_tokens, i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def run_stats(
    loaded: LoadedModel,
    segments: Sequence[Segment],
    spec: StatsSpec,
    options: EngineOptions | None = None,
    stats: HeadStats | None = None,
    checkpoint: Callable[[HeadStats], None] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> HeadStats:
    """Accumulate head statistics of `spec` over `segments`.

    `stats` loaded from a checkpoint continues an interrupted run after its
    `stats.batches_done` batches; `checkpoint(stats)` is called every
    `options.checkpoint_every` batches and at the end.
    `shard=(rank, world_size)` keeps every world_size-th batch, starting at `rank`.
    """
    options = options or EngineOptions()
    if stats is None:
        stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.class_names)
    device = next(loaded.model.parameters()).device
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend=options.backend, device=device)
    rank, world_size = shard
    batches = plan_batches(segments, options.batch_size)[rank::world_size]
    batches_done = stats.batches_done
    pad_id = loaded.tokenizer.pad_token_id or 0
    bar = tqdm(total=sum(len(b) for b in batches), unit="seg", disable=not options.progress, desc="attention stats",
               initial=sum(len(b) for b in batches[:batches_done]))
    with torch.inference_mode():
        for n, batch in enumerate(batches[batches_done:], start=batches_done + 1):
            run_batch(loaded, probe, [segments[i] for i in batch], stats, pad_id, device)
            bar.update(len(batch))
            stats.batches_done = n
            if checkpoint is not None and (n % options.checkpoint_every == 0 or n == len(batches)):
                checkpoint(stats)
    bar.close()
    return stats


def run_batch(loaded: LoadedModel, probe: HeadProbe, batch: Sequence[Segment], stats: HeadStats, pad_id, device):
    inputs = {k: t.to(device) for k, t in collate(batch, pad_id).items()}
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids", None)
    key_valid = inputs["attention_mask"].bool()  # (B, L)
    key_class = loaded.class_table.to(device)[inputs["input_ids"]]  # (B, L)
    stats.start_batch(key_valid, key_class)
    with probe.active(key_class, stats.add):
        loaded.model(**inputs)
