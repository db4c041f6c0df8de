"""Head importance and pruning with the language-modelling loss (`heads importance --task lm`,
`heads prune --task lm`): Michel et al. (2019)'s I_h = E_x |dL(x)/dxi_h| where x is a segment of
running text and L(x) its next-token loss, and perplexity on held-out segments for pruning.

Data. A decoder's segments of the corpus (`--corpus`, default the bundled Wikipedia), made as
`bertscope run` makes them for a decoder (`bertscope.text.segments`, `SegmentOptions.causal`:
articles of a seeded sample joined by blank lines up to `--max-len` tokens, in the tokenizer's
own template). The first `--limit` segments of the stream are the importance segments; `heads
prune` scores perplexity on the next `--eval-limit` (default `--limit`), which share no article
with them (each article goes into one segment).

The loss. `bertscope.tasks.lm_loss.token_losses`: the base model once, the LM head on chunks of
positions (never an L x vocabulary tensor), -log p(x_{t+1} | x_<=t) per target. A segment's loss
L(x) is the MEAN over its targets: Michel's I_h averages |dL(x)/dxi_h| over examples, each with its
own loss, and the model's training loss is the per-token mean; a sum over targets would weigh a
long segment's gradient more than a short one's (here they are nearly all --max-len long, so the
two differ by about a constant factor, which the per-layer normalisation removes).

Per-segment gradients, as `importance.stats.example_gradients` does for a classifier: xi is a
(segments-in-batch, layers, H) leaf, the backward runs on the SUM of the per-segment losses, so
slice e of the gradient is dL(x_e)/dxi. The gates are per query head, GQA or not (`bertscope.models.gates`).

Perplexity: exp of the mean token loss over every target of the evaluation segments (each target
weighs the same, as a language model's perplexity is reported), with the pruned heads' gates at 0.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.analyses.heads.importance.stats import CONVENTIONS, Importance, check_mask, layer_normalise
from bertscope.analyses.heads.options import (  # noqa: F401 (the --task lm options, kept importable from here)
    LM,
    LM_OPTIONS,
    PRUNE_LM_OPTIONS,
    add_lm_arguments,
    drop_lm_options,
    resumed_lm_args,
)
from bertscope.errors import UserError
from bertscope.files import write_npz
from bertscope.tasks.lm_loss import token_losses

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- data


@dataclass
class LMBatch:
    """Right-padded segments: input_ids and attention_mask (B, L); first: index of the first segment."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    first: int

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


def lm_segments(loaded, corpus: str, max_len: int, limit: int | None, seed: int):
    """(segments, SegmentReport): the first `limit` (None: all) decoder segments of `corpus`, each with
    at least one target (two tokens)."""
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentOptions, SegmentReport, iter_segments

    if not loaded.architecture.causal:
        raise UserError("--task lm needs a decoder (a causal language model)")
    source = open_corpus(corpus)
    len(source)  # a text or JSON Lines file is indexed (so checked) in full before anything runs
    if source.report.pairs or len(source.report.fields or ()) == 2:
        raise UserError(f"corpus {source.report.source!r} holds pairs of texts (a tab, or two text fields); a "
                        "language model reads one text per segment")
    report = SegmentReport()
    options = SegmentOptions(max_len=max_len, limit=limit, seed=seed, causal=True)
    segments = [s for s in iter_segments(source, loaded.tokenizer, options, report) if s.n_tokens >= 2]
    if not segments:
        raise UserError(f"no usable segments in corpus {source.report.source!r}: {report.as_dict()}")
    return segments, report


def lm_batches(segments, batch_size: int, pad_id: int, device="cpu") -> list[LMBatch]:
    """The segments in stream order, `batch_size` at a time, padded on the right."""
    out = []
    for start in range(0, len(segments), batch_size):
        chunk = segments[start:start + batch_size]
        L = max(s.n_tokens for s in chunk)
        ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for i, s in enumerate(chunk):
            ids[i, :s.n_tokens] = torch.as_tensor(s.input_ids)
            mask[i, :s.n_tokens] = 1
        out.append(LMBatch(ids.to(device), mask.to(device), start))
    return out


def pad_id(tokenizer) -> int:
    for t in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if t is not None:
            return int(t)
    return 0


# ----------------------------------------------------------------------------- importance


def segment_gradients(loaded, batch: LMBatch, keep: torch.Tensor):
    """(grads (b, layers, H), per-segment losses (b,), the batch's summed token losses, its targets):
    grads[e] = dL(x_e)/dxi at xi = keep, L(x_e) the mean loss over segment e's targets. The caller
    resets the gates."""
    b = batch.size
    xi = keep.expand(b, *keep.shape).clone().requires_grad_(True)  # (b, layers, H): one leaf per segment
    loaded.gates.xi = xi
    out = token_losses(loaded, batch.input_ids, batch.attention_mask)
    per = out.per_sequence()  # (b,)
    (grads,) = torch.autograd.grad(per.sum(), xi)  # (b, layers, H)
    return grads, per.detach(), float(out.loss.detach().double().sum()), out.n_targets


@dataclass
class LMSums:
    """The running sums of `lm_importance`, saved and resumed batch by batch."""

    total: np.ndarray  # (layers, H) float64: sum over segments of |dL/dxi| (michel) or per batch |sum| (batch)
    loss_sum: float = 0.0  # sum of per-segment mean losses
    token_loss_sum: float = 0.0  # sum of every target's loss
    targets: int = 0
    segments: int = 0
    batches_done: int = 0

    def save(self, path: Path):
        write_npz(path, total=self.total, scalars=np.array([self.loss_sum, self.token_loss_sum]),
                  counts=np.array([self.targets, self.segments, self.batches_done]))

    @classmethod
    def load(cls, path: Path) -> LMSums:
        with np.load(path) as z:
            (loss_sum, token_loss_sum), (targets, segments, done) = z["scalars"], z["counts"]
            return cls(z["total"].copy(), float(loss_sum), float(token_loss_sum), int(targets), int(segments),
                       int(done))


@dataclass
class LMImportance:
    """`Importance` (loss: the mean per-segment loss) with the token-level loss beside it."""

    importance: Importance
    token_loss: float  # mean over every target: log perplexity
    targets: int

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.token_loss))


def lm_importance(loaded, batches: list[LMBatch], convention: str = "michel", normalise: bool = True, mask=None,
                  progress: bool = True, sums: LMSums | None = None, checkpoint=None) -> LMImportance:
    """I_h of every query head of a decoder (loaded with task "causal-lm") on `batches`.

    mask: (layers, H) 0/1, 0 = pruned (gated to 0, importance NaN). sums: a resumed run's sums
    (its first `batches_done` batches are skipped); checkpoint(sums) is called after each batch.
    Eval mode; the gates and the mode are restored afterwards, on an error or Ctrl-C too.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}: choose one of {', '.join(CONVENTIONS)}")
    if not batches:
        raise ValueError("head importance needs at least one segment")
    model, gates = loaded.model, loaded.gates
    L, H = loaded.n_layers, loaded.n_heads
    live = np.ones((L, H), bool) if mask is None else check_mask(mask, L, H)
    keep = torch.as_tensor(live, dtype=next(model.parameters()).dtype,
                           device=next(model.parameters()).device)  # (L, H): xi, 0 on pruned heads
    sums = sums or LMSums(np.zeros((L, H)))
    was_training = model.training
    model.eval()
    try:
        for batch in tqdm(batches[sums.batches_done:], unit="batch", disable=not progress, desc="importance",
                          initial=sums.batches_done, total=len(batches)):
            grads, per, token_sum, targets = segment_gradients(loaded, batch, keep)
            grads = grads.double().cpu()
            sums.total += (grads.abs().sum(0) if convention == "michel" else grads.sum(0).abs()).numpy()
            sums.loss_sum += float(per.double().sum())
            sums.token_loss_sum += token_sum
            sums.targets += targets
            sums.segments += batch.size
            sums.batches_done += 1
            if checkpoint is not None:
                checkpoint(sums)
    finally:
        gates.reset()
        model.train(was_training)
    raw = sums.total / sums.segments
    raw[~live] = np.nan
    scores = layer_normalise(raw) if normalise else raw.copy()
    imp = Importance(raw=raw, scores=scores, loss=sums.loss_sum / sums.segments, n_examples=sums.segments,
                     convention=convention, normalised=normalise, mask=None if mask is None else live.astype(np.int8))
    return LMImportance(imp, sums.token_loss_sum / max(sums.targets, 1), sums.targets)


# ----------------------------------------------------------------------------- perplexity


@torch.no_grad()
def mean_token_loss(loaded, batches: list[LMBatch], pruned=None) -> tuple[float, int]:
    """(mean loss over every target, targets) with `pruned` heads ((layer, head) 0-based) gated to 0."""
    gates, model = loaded.gates, loaded.model
    xi = torch.ones(loaded.n_layers, loaded.n_heads, dtype=next(model.parameters()).dtype,
                    device=next(model.parameters()).device)
    for lay, h in pruned or ():
        xi[lay, h] = 0.0
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    try:
        gates.xi = xi
        for batch in batches:
            out = token_losses(loaded, batch.input_ids, batch.attention_mask)
            total += float(out.loss.double().sum())
            n += out.n_targets
    finally:
        gates.reset()
        model.train(was_training)
    return total / max(n, 1), n


def peak_rss_mb() -> float | None:
    """This process's peak resident memory in MB (None where the platform does not say)."""
    try:
        import resource
    except ImportError:  # not Unix
        return None
    import sys

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)  # bytes on macOS, KB on Linux
