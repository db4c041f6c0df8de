"""The engine: segments in, per-head statistics out, one forward pass per batch.

Batches are formed from segments sorted by length, so padding (which costs time but never
changes a result) stays small. The plan of batches is a pure function of the segments,
which is what makes a run resumable: a checkpoint records how many batches are done.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.accumulate import HeadStats
from bertscope.attention import HeadProbe
from bertscope.kernels import RowStats, StatsSpec, WordPooling, word_pooling
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
    forward(loaded, probe, batch, pad_id, device, stats.add, before=stats.start_batch)


def forward(loaded: LoadedModel, probe: HeadProbe, batch: Sequence[Segment], pad_id, device, sink,
            before=None, pooling: WordPooling | None = None):
    """One forward pass over `batch`; `sink(layer, RowStats, key_valid)` gets every layer's statistics.
    `before(key_valid, key_class)` runs first (the accumulator sets its row groups there)."""
    inputs = {k: t.to(device) for k, t in collate(batch, pad_id).items()}
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids", None)
    key_valid = inputs["attention_mask"].bool()  # (B, L)
    key_class = loaded.class_table.to(device)[inputs["input_ids"]]  # (B, L)
    if before is not None:
        before(key_valid, key_class)
    with probe.active(key_class, sink, pooling):
        loaded.model(**inputs)
    return key_valid


# --- per-segment results, for the probes ------------------------------------------------


def segment_units(segment: Segment) -> tuple[list[int], int]:
    """Each token's unit: its word (0..n_words-1), or a unit of its own for a special token
    (n_words, n_words+1, ...). Returns (units, n_words)."""
    n_words = max(segment.word_ids, default=-1) + 1
    units, extra = [], n_words
    for w in segment.word_ids:
        if w >= 0:
            units.append(w)
        else:
            units.append(extra)
            extra += 1
    return units, n_words


def batch_pooling(batch: Sequence[Segment], from_word: str = "mean") -> WordPooling:
    """The word pooling of a padded batch: words are argmax candidates, special tokens are not."""
    L = max(s.n_tokens for s in batch)
    per_segment = [segment_units(s) for s in batch]
    W = max(max(units, default=-1) + 1 for units, _ in per_segment)
    unit_index = torch.full((len(batch), L), -1, dtype=torch.long)  # (B, L)
    candidate = torch.zeros(len(batch), W, dtype=torch.bool)  # (B, W)
    for b, (units, n_words) in enumerate(per_segment):
        unit_index[b, : len(units)] = torch.tensor(units, dtype=torch.long)
        candidate[b, :n_words] = True
    return word_pooling(unit_index, candidate, from_word)


def stream_batches(loaded: LoadedModel, segments: Sequence[Segment], spec: StatsSpec,
                   from_word: str | None = None, batch_size: int = 16, backend: str = "auto",
                   progress: bool = True, desc: str = "attention") -> Iterator[tuple[list[int], list[RowStats]]]:
    """Forward passes over `segments` in length-sorted batches, yielding for each batch the
    indices of its segments and every layer's `RowStats` (padded to the batch).

    `from_word` ("mean" or "first") builds the word pooling that `spec.word_maps` needs.
    """
    if spec.word_maps and from_word is None:
        raise ValueError("spec.word_maps needs from_word ('mean' or 'first')")
    device = next(loaded.model.parameters()).device
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend=backend, device=device)
    pad_id = loaded.tokenizer.pad_token_id or 0
    with torch.inference_mode(), tqdm(total=len(segments), unit="seg", disable=not progress, desc=desc) as bar:
        for batch in plan_batches(segments, batch_size):
            layers: list[RowStats] = []
            pooling = batch_pooling([segments[i] for i in batch], from_word) if spec.word_maps else None
            forward(loaded, probe, [segments[i] for i in batch], pad_id, device,
                    lambda layer, stats, key_valid: layers.append(stats), pooling=pooling)
            yield batch, layers
            bar.update(len(batch))


def iter_word_maps(loaded: LoadedModel, segments: Sequence[Segment], from_word: str = "mean",
                   batch_size: int = 16, backend: str = "auto", progress: bool = True,
                   desc: str = "word maps") -> Iterator[tuple[int, np.ndarray]]:
    """(segment index, word-level maps (layers, H, W, W) float32) for every segment, in batch order.

    Units are the segment's words (0..n_words-1, `Segment.words` order) followed by its
    special tokens; every row sums to 1. See `bertscope.kernels.WordPooling` for the pooling.
    """
    spec = StatsSpec(offsets=(), n_key_classes=len(loaded.class_names), entropy=False, argmax=False, word_maps=True)
    for batch, layers in stream_batches(loaded, segments, spec, from_word, batch_size, backend, progress, desc):
        maps = torch.stack([stats.word_map for stats in layers], dim=1).float().cpu().numpy()  # (B, layers, H, W, W)
        for row, i in enumerate(batch):
            W = max(segment_units(segments[i])[0]) + 1
            yield i, maps[row, :, :, :W, :W]
