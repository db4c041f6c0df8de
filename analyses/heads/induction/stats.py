"""Induction, duplicate-token and previous-token heads on repeated random tokens (Olsson et al.
2022, with TransformerLens's definitions), and the loss of the model with heads zeroed.

The input. A sequence is a BOS, then T tokens drawn uniformly from the vocabulary without its
special and added tokens, then the same T tokens again:

    position  0     1 .. T          T+1 .. 2T
    token     BOS   x_1 .. x_T      x_1 .. x_T

(without a BOS every position is one less). The rows of the repeated half are the T queries
T+1 .. 2T. Query i = T + t holds x_t; the same token stood at i - T (a duplicate-token head
looks there), the token that followed it at i - T + 1 (an induction head looks there: "[A][B]
... [A] -> [B]"), and i - 1 is the previous token.

The scores. Each is a relative-offset mass of the engine's kernels (`StatsSpec.offsets`:
p_{i, i+o}, 0 when i + o is a key the row cannot see, e.g. beyond a sliding window), averaged
over the rows of the repeated half and over the sequences:

    induction(l, h)  = mean over repeated rows i of p_{i, i-T+1}
    duplicate(l, h)  = mean over repeated rows i of p_{i, i-T}
    previous(l, h)   = mean over repeated rows i of p_{i, i-1}

TransformerLens's demo ("induction_score_hook", Nanda's "Exploratory analysis demo") takes the
mean of the whole stripe `pattern.diagonal(1 - T)` of the (2T+1) x (2T+1) map, which also holds
the rows T-1 and T of the first half (their "targets" are BOS and x_1); here exactly the T
repeated rows count. Its `head_detector` ("mul") divides the mass on the detection pattern by
every row of the map, first half included (so a perfect induction head scores about 1/2 there
and 1 here). No attention map is kept: each row's three masses come out of the kernels, and
`InductionScores` sums the repeated rows per head.

The loss. The next-token loss at target position t is -log p(x_t | x_<t) (the LM head of
`bertscope.tasks.lm_loss`). As in the TransformerLens demo, the first half is the targets 1 .. T (x_1
.. x_T after BOS; the first target of a sequence without BOS is its position 1) and the repeated
half the targets T+1 .. 2T; Olsson et al.'s in-context learning score is a late token's loss
minus an early one's, here the mean loss on the repeated half minus the mean loss on the first
half (negative: the model learns from the context).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertscope.errors import UserError
from bertscope.files import write_npz
from bertscope.kernels.spec import StatsSpec

SCORES = ("induction", "duplicate", "previous")
MIN_SEQ_LEN = 3  # T = 2 puts the induction and previous-token keys at the same offset


def score_offsets(seq_len: int) -> dict[str, int]:
    """The key offset j - i of each score for repeated length T."""
    if seq_len < MIN_SEQ_LEN:
        raise UserError(f"--seq-len must be at least {MIN_SEQ_LEN} (at T = 2 the induction key is the previous "
                        f"token), not {seq_len}")
    return {"induction": 1 - seq_len, "duplicate": -seq_len, "previous": -1}


def induction_spec(seq_len: int, n_key_classes: int) -> StatsSpec:
    """The kernels' statistics: the three offset masses, nothing else."""
    return StatsSpec(offsets=tuple(sorted(score_offsets(seq_len).values())), n_key_classes=n_key_classes)


# ----------------------------------------------------------------------------- the input


def token_pool(tokenizer, vocab_size: int) -> np.ndarray:
    """The ids random tokens are drawn from: 0 .. vocab_size - 1 without the tokenizer's special
    and added tokens (BOS, EOS, padding, chat markers, unused slots, ...), sorted."""
    excluded = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    pool = np.array([i for i in range(vocab_size) if i not in excluded], dtype=np.int64)
    if len(pool) < 2:
        raise UserError(f"the vocabulary has {len(pool)} ordinary tokens: random sequences need at least 2")
    return pool


def random_sequences(n: int, seq_len: int, pool: np.ndarray, bos: int | None, seed: int) -> np.ndarray:
    """(n, 2T + 1) int64 (2T without a BOS): each row BOS, T tokens of `pool` drawn uniformly with
    replacement, the same T tokens again. Row r depends on (seed, r) only, so a longer run starts
    with the same sequences."""
    rows = []
    for r in range(n):
        rng = np.random.default_rng([seed, r])
        x = pool[rng.integers(0, len(pool), size=seq_len)]
        rows.append(np.concatenate([[bos] if bos is not None else [], x, x]).astype(np.int64))
    return np.stack(rows) if rows else np.zeros((0, 2 * seq_len + (bos is not None)), dtype=np.int64)


@dataclass(frozen=True)
class RepeatedSequence:
    """A BOS (or none) and T random tokens repeated once: where the two halves lie. (Not an
    attention layout: the kernels' `AttentionLayout` is which keys each query sees.)"""

    seq_len: int
    bos: bool

    @property
    def first(self) -> int:
        """Position of x_1 (1 with a BOS, 0 without)."""
        return int(self.bos)

    @property
    def length(self) -> int:
        return 2 * self.seq_len + self.first

    @property
    def repeated_rows(self) -> slice:
        """The query positions of the repeated half."""
        return slice(self.first + self.seq_len, self.length)

    def target_halves(self) -> tuple[slice, slice]:
        """(first half, repeated half) as slices of `TokenLosses.loss`'s columns (column c is the
        target at position c + 1). With a BOS the first half is the targets x_1 .. x_T (columns
        0 .. T-1); without one x_2 .. x_T (x_1 has nothing before it: columns 0 .. T-2). The
        repeated half is the T targets x_1 .. x_T of the second copy."""
        start_rep = self.first + self.seq_len - 1  # column of target first + T (x_1 repeated)
        return slice(0, start_rep), slice(start_rep, self.length - 1)


# ----------------------------------------------------------------------------- the scores


class InductionScores:
    """The engine `Accumulator` of the three scores: per head, the sums over the repeated rows
    of every sequence of p_{i, i+o} for each score's offset o.

    sums (layers, H, 3) float64 in `SCORES` order; rows: the repeated rows summed (per head).
    Additive over batches, resumed runs and ranks.
    """

    def __init__(self, n_layers: int, n_heads: int, layout: RepeatedSequence):
        self.n_layers, self.n_heads, self.layout = n_layers, n_heads, layout
        self.sums = np.zeros((n_layers, n_heads, len(SCORES)), dtype=np.float64)
        self.rows = 0
        self.batches_done = 0

    def add(self, batch):
        offsets = batch.spec.offsets
        want = score_offsets(self.layout.seq_len)
        columns = [offsets.index(want[s]) for s in SCORES]
        rows = self.layout.repeated_rows
        if batch.key_valid.shape[1] != self.layout.length or not bool(batch.key_valid.all()):
            raise ValueError(f"every sequence must have {self.layout.length} real tokens")
        for layer, stats in enumerate(batch.layers):
            mass = stats.offset_mass[:, :, rows][..., columns]  # (B, H, T, 3)
            self.sums[layer] += mass.double().sum((0, 2)).cpu().numpy()
        self.rows += batch.size * self.layout.seq_len

    def merge(self, other: InductionScores) -> InductionScores:
        if (other.n_layers, other.n_heads, other.layout) != (self.n_layers, self.n_heads, self.layout):
            raise ValueError("cannot merge induction scores of different models or sequence layouts")
        self.sums += other.sums
        self.rows += other.rows
        return self

    def scores(self) -> dict[str, np.ndarray]:
        """name -> (layers, H) mean mass over the repeated rows."""
        mean = self.sums / max(1, self.rows)
        return {s: mean[..., k] for k, s in enumerate(SCORES)}

    def save(self, path: Path):
        meta = dict(n_layers=self.n_layers, n_heads=self.n_heads, seq_len=self.layout.seq_len, bos=self.layout.bos)
        write_npz(path, meta=json.dumps(meta), sums=self.sums, rows=self.rows, batches_done=self.batches_done)

    @classmethod
    def load(cls, path: Path) -> InductionScores:
        with np.load(path) as f:
            meta = json.loads(str(f["meta"]))
            acc = cls(meta["n_layers"], meta["n_heads"], RepeatedSequence(meta["seq_len"], meta["bos"]))
            acc.sums[...] = f["sums"]
            acc.rows, acc.batches_done = int(f["rows"]), int(f["batches_done"])
        return acc


class SequenceLosses:
    """The engine `Accumulator` of the unablated model's next-token losses, read off the same
    forward pass as the scores: the base model's last hidden states (`BatchContext.outputs`)
    through the LM head in chunks (`bertscope.tasks.lm_loss.head_losses`).

    losses (N, L - 1) float32, row = the sequence's index, NaN until its batch is done.
    """

    def __init__(self, lm, n_sequences: int, layout: RepeatedSequence):
        self.lm, self.layout = lm, layout
        self.losses = np.full((n_sequences, layout.length - 1), np.nan, dtype=np.float32)
        self.batches_done = 0

    def add(self, batch):
        from bertscope.tasks.lm_loss import head_losses  # torch's model code: imported when a loss is taken

        hidden = batch.outputs.last_hidden_state  # (B, L, d) after the final norm
        ids = batch.inputs["input_ids"]  # (B, L)
        B, L, d = hidden.shape
        losses = head_losses(self.lm, hidden[:, :-1].reshape(-1, d), ids[:, 1:].reshape(-1))  # (B (L - 1),)
        self.losses[batch.indices] = losses.view(B, L - 1).float().cpu().numpy()

    def merge(self, other: SequenceLosses) -> SequenceLosses:
        done = ~np.isnan(other.losses[:, 0])
        self.losses[done] = other.losses[done]
        return self

    def save(self, path: Path):
        write_npz(path, losses=self.losses, batches_done=self.batches_done)

    def load_into(self, path: Path) -> SequenceLosses:
        """Restore the state `save` wrote (the LM head is this run's)."""
        with np.load(path) as f:
            if f["losses"].shape != self.losses.shape:
                raise UserError(f"{path} holds the losses of other sequences: {f['losses'].shape}")
            self.losses[...] = f["losses"]
            self.batches_done = int(f["batches_done"])
        return self


def rank_heads(scores: np.ndarray) -> list[tuple[int, int]]:
    """(layer, head), 0-based, from the highest score down (ties: layer-major order)."""
    order = np.argsort(-scores.ravel(), kind="stable")
    return [divmod(int(i), scores.shape[1]) for i in order]


def random_head_sets(n_layers: int, n_heads: int, k: int, exclude: list[tuple[int, int]], draws: int,
                     seed: int) -> list[list[tuple[int, int]]]:
    """`draws` sets of k heads drawn without replacement from the heads not in `exclude`, seeded."""
    others = [(lay, h) for lay in range(n_layers) for h in range(n_heads) if (lay, h) not in set(exclude)]
    if k > len(others):
        raise UserError(f"{k} random heads outside the top {len(exclude)}: the model has only {len(others)}")
    rng = np.random.default_rng([seed, 1])
    return [sorted(others[i] for i in rng.choice(len(others), size=k, replace=False)) for _ in range(draws)]


# ----------------------------------------------------------------------------- the losses


def zero_gates(n_layers: int, n_heads: int, heads: list[tuple[int, int]]) -> torch.Tensor:
    """(layers, H) xi: 0 on `heads`, 1 elsewhere."""
    xi = torch.ones(n_layers, n_heads)
    for lay, h in heads:
        xi[lay, h] = 0.0
    return xi


def variant_losses(loaded, ids: torch.Tensor, gates: list[torch.Tensor], max_rows: int, out: np.ndarray | None = None,
                   on_forward=None) -> np.ndarray:
    """(V, N, L - 1) float32 next-token losses of the sequences `ids` (N, L) under each gating
    `gates[v]` (layers, H) xi: several variants and sequences per forward (per-sequence gates,
    variant-major rows, at most `max_rows` rows, at least one sequence), the LM head in chunks
    (`bertscope.tasks.lm_loss`). Written into `out` when given; `on_forward(variants done)` after the
    last forward of each group of variants. The model's gates are reset afterwards."""
    from bertscope.tasks.lm_loss import token_losses  # torch's model code: imported when a loss is taken

    device = next(loaded.model.parameters()).device
    N, L = ids.shape
    if out is None:
        out = np.zeros((len(gates), N, L - 1), dtype=np.float32)
    per_seq = max(1, min(N, max_rows))
    per_var = max(1, max_rows // per_seq)
    try:
        with torch.no_grad():  # not inference_mode: the gates track their tensors by version
            for v0 in range(0, len(gates), per_var):
                chunk = gates[v0:v0 + per_var]
                for s0 in range(0, N, per_seq):
                    x = ids[s0:s0 + per_seq].to(device)
                    n = x.shape[0]
                    loaded.gates.xi = torch.stack(chunk).repeat_interleave(n, 0)  # (V' n, layers, H)
                    losses = token_losses(loaded, x.repeat(len(chunk), 1)).loss  # (V' n, L - 1)
                    out[v0:v0 + len(chunk), s0:s0 + n] = losses.view(len(chunk), n, L - 1).float().cpu().numpy()
                if on_forward is not None:
                    on_forward(v0 + len(chunk))
    finally:
        loaded.gates.reset()
    return out


def half_losses(losses: torch.Tensor | np.ndarray, layout: RepeatedSequence) -> tuple[np.ndarray, np.ndarray]:
    """(mean loss on the first half, on the repeated half) over the last axis of `losses`
    (..., L - 1), per leading index."""
    losses = np.asarray(losses, dtype=np.float64)
    first, repeated = layout.target_halves()
    return losses[..., first].mean(-1), losses[..., repeated].mean(-1)


def spearman(x: np.ndarray, y: np.ndarray) -> dict:
    """Spearman's rho of two (n,) arrays with its p-value; None where a side is constant."""
    from scipy.stats import spearmanr  # scipy's start-up only when it is needed

    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3 or np.ptp(x[keep]) == 0 or np.ptp(y[keep]) == 0:
        return {"spearman": None, "p": None, "heads": int(keep.sum())}
    rho, p = spearmanr(x[keep], y[keep])
    return {"spearman": float(rho), "p": float(p), "heads": int(keep.sum())}
