"""The engine: segments in, one `BatchContext` per forward pass out, folded into accumulators.

Segments stream in (a list, or a generator that reads the corpus lazily). Batches are formed
within windows of `window_batches * batch_size` consecutive segments sorted by length, so
padding (which costs time but never changes a result) stays small while memory holds one
window, whatever the corpus size. The plan of batches is a pure function of the segment
stream and the two sizes, which is what makes a run resumable (a checkpoint records how
many batches are done; a resumed run makes the same stream again and skips them) and
shardable (rank r of w runs batches r, r + w, ...: disjoint shares of one plan).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.engine import WINDOW_BATCHES  # re-exported: `from bertscope.engine.loop import WINDOW_BATCHES`
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.batch import Accumulator, BatchContext
from bertscope.errors import UserError
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import StatsSpec, WordPooling
from bertscope.models.attention import HeadProbe
from bertscope.models.loading import LoadedModel
from bertscope.text.segments import Segment, collate
from bertscope.text.token_classes import TokenClasses, check_ids, first_token_class

LONG_BATCH = 16384  # padded tokens of a batch from which the progress bar names each layer as it runs


@dataclass
class EngineOptions:
    batch_size: int = 16
    backend: str = "auto"
    progress: bool = True
    checkpoint_every: int = 20  # batches between checkpoints
    window_batches: int | None = WINDOW_BATCHES  # batches sorted by length together (None: all)
    total: int | None = None  # segments expected, for the progress bar of a streamed corpus


def windowed_batches(segments: Iterable[Segment], batch_size: int, window_batches: int | None = WINDOW_BATCHES
                     ) -> Iterator[tuple[list[int], list[Segment]]]:
    """(stream indices, segments) of each batch. Every window of `window_batches *
    batch_size` consecutive segments is sorted by length (ties by position) and cut into
    batches; `window_batches=None` sorts the whole stream as one window."""
    stream = enumerate(segments)
    size = None if window_batches is None else window_batches * batch_size
    while window := list(islice(stream, size)):
        window.sort(key=lambda item: (item[1].n_tokens, item[0]))
        for start in range(0, len(window), batch_size):
            indices, batch = zip(*window[start : start + batch_size])
            yield list(indices), list(batch)


def plan_batches(segments: Iterable[Segment], batch_size: int, window_batches: int | None = WINDOW_BATCHES
                 ) -> list[list[int]]:
    """Indices of the segments of each batch (`windowed_batches`)."""
    return [indices for indices, _ in windowed_batches(segments, batch_size, window_batches)]


def run_stats(
    loaded: LoadedModel,
    segments: Sequence[Segment],
    spec: StatsSpec,
    options: EngineOptions | None = None,
    stats: HeadStats | None = None,
    checkpoint: Callable[[HeadStats], None] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> HeadStats:
    """Accumulate head statistics of `spec` over `segments`: `fold` with one `HeadStats`.

    `stats` loaded from a checkpoint continues an interrupted run after its
    `stats.batches_done` batches; `checkpoint(stats)` is called every
    `options.checkpoint_every` batches and at the end.
    `shard=(rank, world_size)` keeps every world_size-th batch, starting at `rank`.
    """
    if stats is None:
        stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    fold(loaded, segments, spec, [stats], options, checkpoint=None if checkpoint is None else lambda: checkpoint(stats),
         shard=shard)
    return stats


def fold(
    loaded: LoadedModel,
    segments: Iterable[Segment],
    spec: StatsSpec,
    accumulators: Sequence[Accumulator],
    options: EngineOptions | None = None,
    classes: TokenClasses | None = None,
    checkpoint: Callable[[], None] | None = None,
    shard: tuple[int, int] = (0, 1),
    desc: str = "attention stats",
    from_word: str | None = None,
) -> Sequence[Accumulator]:
    """Fold every batch of `segments` into every accumulator: the engine's one loop.

    Accumulators restored from a checkpoint carry `batches_done`; the fold resumes after the
    fewest of them (they are saved together, so they agree unless a crash fell between two
    saves: then the ones ahead must have been rewound by the caller). `checkpoint()` runs
    every `options.checkpoint_every` batches and after the last one, once every accumulator
    has the batch, and on Ctrl-C (KeyboardInterrupt, raised again) when the accumulators hold
    whole batches only. `segments` may be a generator: it is read once, one window at a time.
    """
    options = options or EngineOptions()
    done = min((acc.batches_done for acc in accumulators), default=0)
    ahead = [type(acc).__name__ for acc in accumulators if acc.batches_done != done]
    if ahead:
        raise ValueError(f"accumulators disagree on the batches done ({', '.join(ahead)} ahead): rewind them first")
    last = saved = done
    trim_every = malloc_trim_every()
    consistent = True  # False while the accumulators take a batch or are being saved
    try:
        for batch in stream_batches(loaded, segments, spec, from_word, classes=classes, batch_size=options.batch_size,
                                    backend=options.backend, progress=options.progress, desc=desc,
                                    shard=shard, skip=done, window_batches=options.window_batches,
                                    total=options.total):
            consistent = False
            for acc in accumulators:
                acc.add(batch)
                acc.batches_done = last = batch.number
            if trim_every and last % trim_every == 0:
                malloc_trim()
            if checkpoint is not None and last % options.checkpoint_every == 0:
                checkpoint()
                saved = last
            consistent = True
    except KeyboardInterrupt:
        # Ctrl-C in a forward pass (nearly always: that is where the time goes): every accumulator
        # holds exactly the batches up to `last`, so save them, and a resume redoes none of them.
        # One that fell while a batch was being added or saved leaves the previous checkpoint.
        if checkpoint is not None and consistent and last > saved:
            checkpoint()
        raise
    if checkpoint is not None and last > saved:
        checkpoint()  # the last batches
    return accumulators


def collate_batch(loaded: LoadedModel, segments: Sequence[Segment], indices: Sequence[int], spec: StatsSpec,
                  classes: TokenClasses | None = None, from_word: str | None = None, device="cpu",
                  number: int = 0) -> BatchContext:
    """The padded batch of `segments[i] for i in indices` on `device`, with its classes and pooling.

    Classes come from the vocabulary table, or from each segment's `token_class` for a
    per-segment scheme (checked against the tokens first: a misaligned source is an error,
    never a silently shifted class).
    """
    return _collate(loaded, [segments[i] for i in indices], indices, spec, classes, from_word, device, number)


def _collate(loaded: LoadedModel, batch: list[Segment], indices: Sequence[int], spec: StatsSpec,
             classes: TokenClasses | None, from_word: str | None, device, number: int) -> BatchContext:
    classes = classes or loaded.classes
    if classes.n_classes != spec.n_key_classes:
        raise ValueError(f"the spec counts {spec.n_key_classes} key classes, the class scheme "
                         f"{classes.source!r} has {classes.n_classes}")
    collated = collate(batch, loaded.tokenizer.pad_token_id or 0)  # on the host
    padded = not bool(collated["attention_mask"].all())  # read here, before it is on the device
    inputs = {k: t.to(device) for k, t in collated.items()}
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids", None)
    key_valid = inputs["attention_mask"].bool()  # (B, L)
    if loaded.architecture.position_ids:  # a decoder: positions from each first real token (any padding side)
        inputs["position_ids"] = (key_valid.long().cumsum(-1) - 1).clamp_min(0)
    if classes.per_segment:
        key_class = torch.full(key_valid.shape, classes.n_classes - 1, dtype=torch.long)  # (B, L)
        for row, s in enumerate(batch):
            check_ids(s, s.token_class, classes)
            key_class[row, : s.n_tokens] = torch.tensor(s.token_class, dtype=torch.long)
        key_class = key_class.to(device)
    else:
        key_class = loaded.class_table.to(device)[inputs["input_ids"]]  # (B, L)
    if is_causal(loaded):  # a decoder's class 0 is the first token of each segment, not [CLS]
        key_class = first_token_class(key_class, key_valid, classes.n_classes)
    pooling = None
    if spec.word_maps:
        if from_word is None:
            raise ValueError("spec.word_maps needs from_word ('mean' or 'first')")
        pooling = _to(batch_pooling(batch, from_word), device)
    return BatchContext(list(indices), batch, inputs, key_valid, key_class, classes, spec, pooling, number=number,
                        padded=padded, token_ids=inputs["input_ids"])


def is_causal(loaded: LoadedModel) -> bool:
    """Whether the model is a decoder (its architecture's layout, `Architecture.layout`, is causal)."""
    try:
        return loaded.architecture.layout(loaded.model.config).causal
    except (AttributeError, UserError):  # a stand-in model of a test, a type the table lacks
        return False


def _to(pooling: WordPooling, device) -> WordPooling:
    return WordPooling(pooling.from_word.to(device), pooling.to_word.to(device), pooling.candidate.to(device))


def forward(loaded: LoadedModel, probe: HeadProbe, batch: BatchContext,
            on_layer: Callable[[int], None] | None = None) -> BatchContext:
    """One forward pass: fills `batch.layers` (every layer's `RowStats`) and `batch.outputs`;
    `on_layer(layers done)` after each layer (a progress bar)."""
    if on_layer is None:
        sink = lambda layer, stats, key_valid: batch.layers.append(stats)  # noqa: E731
    else:
        def sink(layer, stats, key_valid):
            batch.layers.append(stats)
            on_layer(len(batch.layers))
    if batch.inputs["input_ids"].shape[-1] >= LONG_INPUT:
        map_large_allocations()
    with probe.active(batch.key_class, sink, batch.pooling, padded=batch.padded, token_ids=batch.token_ids):
        batch.outputs = loaded.model(**batch.inputs, **loaded.forward_options)
    return batch


def run_batch(loaded: LoadedModel, probe: HeadProbe, segments: Sequence[Segment], stats: HeadStats, device="cpu"):
    """One batch into one accumulator (what `bertscope run` does per batch; the benchmark's unit)."""
    batch = collate_batch(loaded, segments, range(len(segments)), probe.spec, device=device)
    stats.add(forward(loaded, probe, batch))


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


def stream_batches(loaded: LoadedModel, segments: Iterable[Segment], spec: StatsSpec,
                   from_word: str | None = None, batch_size: int = 16, backend: str = "auto",
                   progress: bool = True, desc: str = "attention", classes: TokenClasses | None = None,
                   shard: tuple[int, int] = (0, 1), skip: int = 0, window_batches: int | None = WINDOW_BATCHES,
                   total: int | None = None) -> Iterator[BatchContext]:
    """Forward passes over `segments` in length-sorted batches (`windowed_batches`): one
    `BatchContext` per batch, its `layers` holding every layer's `RowStats` (padded to the batch).

    `from_word` ("mean" or "first") builds the word pooling that `spec.word_maps` needs;
    `classes` is the class scheme (default: the vocabulary's); `shard=(rank, world_size)`
    keeps every world_size-th batch of the plan from `rank`; `skip` passes over that many
    batches of the shard without running them (a resumed run). Each context's `number` is
    its 1-based position in the shard. The progress bar counts the stream's segments
    (`total`: how many are expected, when `segments` has no length).
    """
    if spec.word_maps and from_word is None:
        raise ValueError("spec.word_maps needs from_word ('mean' or 'first')")
    device = next(loaded.model.parameters()).device
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend=backend, device=device, model=loaded.model)
    rank, world_size = shard
    total = len(segments) if isinstance(segments, Sequence) else total
    number = 0
    bar = tqdm(total=total, unit="seg", disable=not progress, desc=desc)
    try:
        with torch.inference_mode():
            for k, (indices, batch_segments) in enumerate(windowed_batches(segments, batch_size, window_batches)):
                if k % world_size == rank:
                    number += 1
                    if number > skip:
                        context = _collate(loaded, batch_segments, indices, spec, classes, from_word, device, number)
                        yield forward(loaded, probe, context, layer_progress(bar, context, loaded.n_layers))
                bar.update(len(indices))
    finally:
        close_quietly(bar)


def layer_progress(bar, batch: BatchContext, n_layers: int) -> Callable[[int], None] | None:
    """For a batch of at least LONG_BATCH padded tokens (long segments: a forward pass takes a
    while), a callback that shows on `bar` the layers done; None for a short batch."""
    rows, length = batch.inputs["input_ids"].shape
    if bar.disable or rows * length < LONG_BATCH:
        return None
    return lambda done: bar.set_postfix_str(f"layer {done}/{n_layers} of {rows} x {length} tokens")


def close_quietly(bar):
    """Close a progress bar whose stream may be gone: after Ctrl-C with stderr piped (`2>&1 |
    tee log`), the reader has died with the signal too, and the bar's last write raises
    BrokenPipeError, which would replace the KeyboardInterrupt before `fold` can save."""
    try:
        bar.close()
    except (OSError, ValueError):  # a broken pipe, or a stream already closed
        pass


def iter_word_maps(loaded: LoadedModel, segments: Sequence[Segment], from_word: str = "mean",
                   batch_size: int = 16, backend: str = "auto", progress: bool = True,
                   desc: str = "word maps") -> Iterator[tuple[int, np.ndarray]]:
    """(segment index, word-level maps (layers, H, W, W) float32) for every segment, in batch order.

    Units are the segment's words (0..n_words-1, `Segment.words` order) followed by its
    special tokens; every row sums to 1. See `bertscope.kernels.WordPooling` for the pooling.
    """
    spec = word_map_spec(loaded)
    for batch in stream_batches(loaded, segments, spec, from_word, batch_size, backend, progress, desc):
        # (B, layers, H, W, W)
        maps = torch.stack([stats.word_map for stats in batch.layers], dim=1).float().cpu().numpy()
        for row, (i, segment) in enumerate(zip(batch.indices, batch.segments)):
            W = max(segment_units(segment)[0]) + 1
            yield i, maps[row, :, :, :W, :W]


def word_map_spec(loaded: LoadedModel) -> StatsSpec:
    """Word-level maps and their argmax only: what the word-level probes read."""
    return StatsSpec(offsets=(), n_key_classes=loaded.classes.n_classes, entropy=False, argmax=False, word_maps=True)


MALLOC_TRIM_EVERY = 8  # batches between two malloc_trim(0) calls, unless BERTSCOPE_MALLOC_TRIM says otherwise


def malloc_trim_every() -> int:
    """`BERTSCOPE_MALLOC_TRIM=N`: give glibc's freed heap back to the OS every N batches (default
    8; 0: never). The forward pass's temporaries change size with every batch's length, and
    glibc's heap keeps the freed pages, so the peak RSS creeps up over the first hundred batches;
    trimming keeps it flat. Measured (bench/results_flatmem_trim.md, three interleaved pairs of
    1,000 wiki segments at 128 tokens): peak 845-882 MB against 852-1,062 MB without, for +0.1%
    CPU time."""
    text = os.environ.get("BERTSCOPE_MALLOC_TRIM", str(MALLOC_TRIM_EVERY))
    try:
        return max(0, int(text))
    except ValueError:
        raise ValueError(f"BERTSCOPE_MALLOC_TRIM must be a whole number of batches, not {text!r}") from None


LONG_INPUT = 2048  # padded length from which a forward's large tensors are mapped one by one (`map_large_allocations`)
MMAP_THRESHOLD = 1 << 20  # bytes: glibc serves an allocation this large or larger with its own mmap
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_large_allocations_mapped = False


def map_large_allocations() -> bool:
    """Have glibc serve every allocation of MMAP_THRESHOLD bytes or more with its own mmap, which
    goes back to the OS when it is freed, for the rest of the process. Returns whether it is so.

    By default glibc raises that threshold, up to 32 MB, each time such a block is freed, so the
    tensors of a long input (8,192 tokens: 19 MB per hidden state, 4.7 MB per score block) come
    from its heap. There, freed blocks are kept between live ones. One 8,192-token SmolLM2 forward
    then peaked 793 MB above its start, for 320 MB of tensors alive at any time. With the
    threshold fixed at 1 MiB it peaked 371 MB above it (1.31x the 1,024-token peak instead of
    1.65x, one thread, bench/bench_longmem.py). Called from the first forward of a batch of
    LONG_INPUT tokens or more: a long forward takes minutes, so a fresh mapping per large tensor
    costs little, while a short batch's forward would pay it for every small tensor. Not done
    where MALLOC_MMAP_THRESHOLD_ is set (the user's own choice) or the C library is not glibc."""
    global _large_allocations_mapped
    if _large_allocations_mapped or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return _large_allocations_mapped
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    _large_allocations_mapped = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return _large_allocations_mapped


def malloc_trim():
    """glibc's malloc_trim(0); a no-op where the C library has none."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
