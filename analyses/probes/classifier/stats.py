"""Attention-based probing classifiers for dependency heads (Clark et al. 2019, section 5, Table 3).

A probe reads a sentence's frozen word-level attention maps and predicts, for every word j
(the dependent), which candidate is its syntactic head: ROOT or another word i of the
sentence. It is a softmax over the candidates, trained with cross-entropy on gold trees.

    attention-only       p(i | j) ∝ exp( sum_k w_k a^k_ij + u_k a^k_ji )
    attention-and-words  p(i | j) ∝ exp( sum_k W_k·(v_i ⊕ v_j) a^k_ij + U_k·(v_i ⊕ v_j) a^k_ji )
    distances + GloVe    p(i | j) ∝ exp( MLP(v_i ⊕ v_j ⊕ distance features of (i, j)) )   (no attention)

a^k_ij is head k's attention from word i to word j (k runs over every head of every layer),
v are fixed GloVe vectors. "Both directions" matter because a head may encode a relation
from the dependent's side (the determiner attends to its noun) or from the head's side.

ROOT, as in Clark et al.'s released code: the ROOT candidate of word j gets, in each
attention channel, s * (attention between j and the input's first special token, [CLS])
+ e * (attention between j and its last special token, [SEP]), with two learned scalars s, e
shared by all heads, so a head's weight also says how much its [CLS]/[SEP] attention means
"no head here". In the attention-and-words probe ROOT has a zero word vector, so its
per-head weights are the linear maps' biases. Every probe also learns one ROOT bias, which
the released code does not have: one parameter that lets a probe favour or avoid ROOT as a
whole, whatever the heads' [CLS]/[SEP] attention. The released attention-and-words probe put
ROOT first among the attention candidates but last among the word vectors, so candidate i
was weighted with word i+1's vector; this module uses v_i, as the paper's formula says.

A word is never its own head: the candidate i = j is masked out (the released code left it
in, where it can only cost probability). Training uses every word; UAS is reported without
punctuation (deprel `punct`), the convention for Stanford Dependencies that the released
code follows, and with it.

The probes are tiny torch modules; `train_probe` fits one with Adam on mini-batches of
similar-length sentences and early stopping on held-out UAS. Nothing here touches a model:
inputs are arrays (word maps, gold heads, GloVe rows).
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

PUNCT = "punct"


@dataclass
class ProbeExample:
    """One sentence of n words, as the probes see it."""

    heads: np.ndarray  # (n,) int64: gold head of each word, 1-based, 0 = ROOT
    scored: np.ndarray  # (n,) bool: counted in UAS (not punctuation)
    vectors: np.ndarray  # (n, D) float32: GloVe vector of each word (zeros when not in GloVe)
    maps: np.ndarray | None = None  # (K, n + s, n + s) float16: every head's word-level map;
    # units 0..n-1 are the words, then the s >= 1 special tokens ([CLS] first, [SEP] last)

    @property
    def n_words(self) -> int:
        return len(self.heads)


def make_example(heads: Sequence[int], deprels: Sequence[str], vectors: np.ndarray,
                 maps: np.ndarray | None = None) -> ProbeExample:
    n = len(heads)
    if maps is not None:
        maps = np.asarray(maps, dtype=np.float16).reshape(-1, *maps.shape[-2:])  # (K, W, W)
        if maps.shape[-1] <= n:
            raise ValueError(f"maps of {maps.shape[-1]} units need the {n} words plus special tokens")
    return ProbeExample(heads=np.asarray(heads, dtype=np.int64), scored=np.array([d != PUNCT for d in deprels]),
                        vectors=np.asarray(vectors, dtype=np.float32).reshape(n, -1), maps=maps)


# --- batches ---------------------------------------------------------------------------------


@dataclass
class Batch:
    """Padded tensors of a batch of B sentences of at most N words; column 0 is ROOT."""

    heads: torch.Tensor  # (B, N) long, gold candidate column (= 1-based head); -100 on padding
    scored: torch.Tensor  # (B, N) bool
    row_valid: torch.Tensor  # (B, N) bool: a real word
    cand_valid: torch.Tensor  # (B, N, N + 1) bool: ROOT, and every other real word
    vectors: torch.Tensor  # (B, N, D)
    n_words: torch.Tensor  # (B,) long
    attn: torch.Tensor | None = None  # (B, N, N + 1, 2K) a^k_ij then a^k_ji, ROOT column zero
    root_attn: torch.Tensor | None = None  # (B, N, 2, 2K) j's attention with [CLS] / [SEP]


def make_batch(examples: Sequence[ProbeExample], with_attention: bool = True) -> Batch:
    B, N = len(examples), max(e.n_words for e in examples)
    D = examples[0].vectors.shape[1]
    heads = torch.full((B, N), -100, dtype=torch.long)  # (B, N)
    scored = torch.zeros(B, N, dtype=torch.bool)  # (B, N)
    vectors = torch.zeros(B, N, D)  # (B, N, D)
    n_words = torch.tensor([e.n_words for e in examples])  # (B,)
    for b, e in enumerate(examples):
        heads[b, : e.n_words] = torch.from_numpy(e.heads)
        scored[b, : e.n_words] = torch.from_numpy(e.scored)
        vectors[b, : e.n_words] = torch.from_numpy(e.vectors)
    positions = torch.arange(N)
    row_valid = positions[None, :] < n_words[:, None]  # (B, N)
    words_ok = row_valid[:, None, :] & ~torch.eye(N, dtype=torch.bool)[None]  # (B, N, N) candidate i != j
    cand_valid = torch.cat([torch.ones(B, N, 1, dtype=torch.bool), words_ok], dim=2)  # (B, N, N + 1)
    batch = Batch(heads, scored, row_valid, cand_valid, vectors, n_words)
    if with_attention:
        batch.attn, batch.root_attn = _attention_features(examples, N)
    return batch


def _attention_features(examples: Sequence[ProbeExample], N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (dependent j, candidate i): a^k_ij (candidate -> dependent) and a^k_ji (dependent ->
    candidate) for every head k; per dependent: its attention to and from [CLS] and [SEP]."""
    K = examples[0].maps.shape[0]
    attn = torch.zeros(len(examples), N, N + 1, 2 * K)  # (B, N, N + 1, 2K)
    root = torch.zeros(len(examples), N, 2, 2 * K)  # (B, N, 2, 2K)
    for b, e in enumerate(examples):
        n = e.n_words
        a = torch.from_numpy(e.maps).float()  # (K, W, W), a[k, q, key] = attention from q to key
        words = a[:, :n, :n]  # (K, n, n)
        attn[b, :n, 1 : n + 1, :K] = words.permute(2, 1, 0)  # [j, i, k] = a[k, i, j]
        attn[b, :n, 1 : n + 1, K:] = words.permute(1, 2, 0)  # [j, i, k] = a[k, j, i]
        first, last = n, a.shape[-1] - 1  # [CLS], [SEP]
        root[b, :n, 0, :K] = a[:, first, :n].T  # [CLS] -> j
        root[b, :n, 1, :K] = a[:, last, :n].T  # [SEP] -> j
        root[b, :n, 0, K:] = a[:, :n, first].T  # j -> [CLS]
        root[b, :n, 1, K:] = a[:, :n, last].T  # j -> [SEP]
    return attn, root


# --- the probes --------------------------------------------------------------------------------


class _AttentionChannels(nn.Module):
    """The 2K attention channels of every (dependent, candidate) pair, ROOT column filled in."""

    def __init__(self):
        super().__init__()
        self.root_scale = nn.Parameter(torch.ones(2))  # s ([CLS]), e ([SEP])

    def forward(self, batch: Batch) -> torch.Tensor:
        root = torch.einsum("bnsc,s->bnc", batch.root_attn, self.root_scale)  # (B, N, 2K)
        return torch.cat([root[:, :, None, :], batch.attn[:, :, 1:, :]], dim=2)  # (B, N, N + 1, 2K)


class AttentionOnlyProbe(nn.Module):
    """p(i | j) ∝ exp(sum_k w_k a^k_ij + u_k a^k_ji): one weight per head and direction."""

    name = "Attn"
    uses_attention = True
    default_lr = 0.05  # few weights on [0, 1] features, which need large values to be confident

    def __init__(self, n_maps: int):
        super().__init__()
        self.channels = _AttentionChannels()
        self.w = nn.Parameter(torch.zeros(n_maps))  # weights of a^k_ij (candidate -> dependent)
        self.u = nn.Parameter(torch.zeros(n_maps))  # weights of a^k_ji (dependent -> candidate)
        self.root_bias = nn.Parameter(torch.zeros(()))

    def forward(self, batch: Batch) -> torch.Tensor:
        x = self.channels(batch)  # (B, N, N + 1, 2K)
        scores = x @ torch.cat([self.w, self.u])  # (B, N, N + 1)
        return _finish(scores, batch, self.root_bias)


class AttentionAndWordsProbe(nn.Module):
    """p(i | j) ∝ exp(sum_k W_k·(v_i ⊕ v_j) a^k_ij + U_k·(v_i ⊕ v_j) a^k_ji): each head's weight
    is a linear function of the two words' GloVe vectors (plus a bias), so the probe can trust
    a determiner head when the words are "the" and "cat" and ignore it otherwise."""

    name = "Attn + GloVe"
    uses_attention = True
    default_lr = 0.01

    def __init__(self, n_maps: int, dim: int):
        super().__init__()
        self.channels = _AttentionChannels()
        # [W; U] split by which word the vector is: the candidate head i, the dependent j
        self.from_head = nn.Linear(dim, 2 * n_maps, bias=False)
        self.from_dependent = nn.Linear(dim, 2 * n_maps, bias=True)
        for layer in (self.from_head, self.from_dependent):
            nn.init.zeros_(layer.weight)
        nn.init.zeros_(self.from_dependent.bias)
        self.root_bias = nn.Parameter(torch.zeros(()))

    def forward(self, batch: Batch) -> torch.Tensor:
        x = self.channels(batch)  # (B, N, N + 1, 2K)
        dep = self.from_dependent(batch.vectors)  # (B, N, 2K), includes the bias
        head = self.from_head(batch.vectors)  # (B, N, 2K)
        head = torch.cat([torch.zeros_like(head[:, :1]), head], dim=1)  # (B, N + 1, 2K): ROOT's vector is zero
        weights = dep[:, :, None, :] + head[:, None, :, :]  # (B, N, N + 1, 2K)
        scores = (weights * x).sum(-1)  # (B, N, N + 1)
        return _finish(scores, batch, self.root_bias)


N_DISTANCE = 10


def distance_features(N: int) -> torch.Tensor:
    """(N, N + 1, N_DISTANCE) features of (dependent j, candidate i), ROOT in column 0: how far
    the candidate lies to the right and to the left (in words / 10), one-hot offsets
    -3..-1 and +1..+3, whether it is more than 3 words away, and ROOT."""
    j = torch.arange(N)[:, None]
    i = torch.arange(N)[None, :]
    offset = (i - j).float()  # (N, N)
    feats = [offset.clamp(min=0) / 10, (-offset).clamp(min=0) / 10]
    feats += [(offset == d).float() for d in (-3, -2, -1, 1, 2, 3)]
    feats.append((offset.abs() > 3).float())
    words = torch.stack(feats + [torch.zeros(N, N)], dim=-1)  # (N, N, F)
    root = torch.zeros(N, 1, N_DISTANCE)
    root[..., -1] = 1
    return torch.cat([root, words], dim=1)  # (N, N + 1, F)


class DistancesGloveProbe(nn.Module):
    """The no-attention baseline: a one-hidden-layer network (tanh) scoring each candidate
    from the two words' GloVe vectors and their distance."""

    name = "Distances + GloVe"
    uses_attention = False
    default_lr = 0.003  # a 256-unit hidden layer over-fits GUM within a few epochs at 0.01

    def __init__(self, dim: int, hidden: int = 256):
        super().__init__()
        self.from_head = nn.Linear(dim, hidden, bias=False)
        self.from_dependent = nn.Linear(dim, hidden, bias=True)
        self.from_distance = nn.Linear(N_DISTANCE, hidden, bias=False)
        self.out = nn.Linear(hidden, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        N = batch.vectors.shape[1]
        dep = self.from_dependent(batch.vectors)  # (B, N, h)
        head = self.from_head(batch.vectors)  # (B, N, h)
        head = torch.cat([torch.zeros_like(head[:, :1]), head], dim=1)  # (B, N + 1, h)
        dist = self.from_distance(distance_features(N))  # (N, N + 1, h)
        hidden = torch.tanh(dep[:, :, None, :] + head[:, None, :, :] + dist[None])  # (B, N, N + 1, h)
        return _finish(self.out(hidden).squeeze(-1), batch)


def _finish(scores: torch.Tensor, batch: Batch, root_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Add the ROOT bias and mask impossible candidates: scores (B, N, N + 1) -> logits."""
    if root_bias is not None:
        scores = torch.cat([scores[:, :, :1] + root_bias, scores[:, :, 1:]], dim=2)
    return scores.masked_fill(~batch.cand_valid, float("-inf"))  # (B, N, N + 1)


# --- training and evaluation ------------------------------------------------------------------


def batches_by_length(examples: Sequence[ProbeExample], max_cells: int = 16000,
                      rng: random.Random | None = None) -> list[list[int]]:
    """Indices of mini-batches of similar-length sentences, each with at most `max_cells`
    dependent-candidate pairs (padded) or a single sentence. Shuffled by `rng` when given:
    sentences of equal length in random order, and the batches in random order."""
    order = list(range(len(examples)))
    if rng is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: examples[i].n_words)  # stable: ties keep the shuffled order
    batches, current = [], []
    for i in order:
        n = examples[i].n_words
        if current and (len(current) + 1) * n * (n + 1) > max_cells:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def predict(model: nn.Module, examples: Sequence[ProbeExample], max_cells: int = 16000) -> list[np.ndarray]:
    """Each sentence's predicted heads (1-based, 0 = ROOT)."""
    out: list[np.ndarray | None] = [None] * len(examples)
    model.eval()
    with torch.no_grad():
        for idx in batches_by_length(examples, max_cells):
            batch = make_batch([examples[i] for i in idx], model.uses_attention)
            best = model(batch).argmax(-1)  # (B, N)
            for row, i in enumerate(idx):
                out[i] = best[row, : examples[i].n_words].numpy()
    return out


@dataclass
class Attachment:
    """Unlabelled attachment score: correct heads over words, without and with punctuation."""

    correct: int
    total: int
    correct_all: int
    total_all: int

    @property
    def uas(self) -> float:
        return self.correct / self.total if self.total else float("nan")

    @property
    def uas_all(self) -> float:
        return self.correct_all / self.total_all if self.total_all else float("nan")


def attachment(predicted: Sequence[np.ndarray], examples: Sequence[ProbeExample]) -> Attachment:
    correct = total = correct_all = total_all = 0
    for pred, e in zip(predicted, examples):
        hit = np.asarray(pred) == e.heads
        correct += int(hit[e.scored].sum())
        total += int(e.scored.sum())
        correct_all += int(hit.sum())
        total_all += e.n_words
    return Attachment(correct, total, correct_all, total_all)


def right_branching(n_words: int) -> np.ndarray:
    """The right-branching baseline: every word's head is the next word; the last word,
    which has no word to its right, is the root (the tree of a purely right-branching parse)."""
    return np.append(np.arange(2, n_words + 1), 0).astype(np.int64)


@dataclass
class TrainResult:
    best_epoch: int  # 1-based; 0 when no epoch was run
    best_heldout_uas: float
    history: list[dict] = field(default_factory=list)  # per epoch: epoch, train_loss, heldout_uas


def train_probe(model: nn.Module, train: Sequence[ProbeExample], heldout: Sequence[ProbeExample],
                epochs: int = 10, patience: int = 2, lr: float | None = None, max_cells: int = 16000, seed: int = 0,
                log: Callable[[str], None] | None = None, progress: Callable | None = None) -> TrainResult:
    """Fit `model` with Adam (mean cross-entropy over the words of a mini-batch), evaluate
    held-out UAS after every epoch, stop after `patience` epochs without a new best, and
    leave the model with the best epoch's weights. Deterministic for a given `seed`.
    `lr` defaults to the probe's `default_lr` (tuned on GUM held-out sentences).

    `progress(iterable, total)` may wrap the batches of an epoch (a progress bar)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr or getattr(model, "default_lr", 0.01))
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
    best_state, best_uas, best_epoch, history = copy.deepcopy(model.state_dict()), -1.0, 0, []
    for epoch in range(1, epochs + 1):
        model.train()
        total_loss, total_words = 0.0, 0
        batches = batches_by_length(train, max_cells, rng)
        for idx in (progress(batches, len(batches)) if progress else batches):
            batch = make_batch([train[i] for i in idx], model.uses_attention)
            logits = model(batch)  # (B, N, N + 1)
            loss = loss_fn(logits.flatten(0, 1), batch.heads.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            words = int(batch.row_valid.sum())
            total_loss += float(loss.detach()) * words
            total_words += words
        heldout_uas = attachment(predict(model, heldout, max_cells), heldout).uas
        history.append({"epoch": epoch, "train_loss": total_loss / max(total_words, 1), "heldout_uas": heldout_uas})
        if log:
            log(f"  {getattr(model, 'name', 'probe')}: epoch {epoch}, train loss {history[-1]['train_loss']:.4f}, "
                f"held-out UAS {100 * heldout_uas:.1f}")
        if heldout_uas > best_uas:
            best_state, best_uas, best_epoch = copy.deepcopy(model.state_dict()), heldout_uas, epoch
        elif epoch - best_epoch >= patience:
            break
    model.load_state_dict(best_state)
    return TrainResult(best_epoch, best_uas, history)


def split_heldout(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a seeded `fraction` of 0..n-1 held out (at least one
    when n >= 2), both in increasing order."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(max(1, round(fraction * n)), n - 1) if n >= 2 else 0
    return sorted(order[k:]), sorted(order[:k])


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- figures -----------------------------------------------------------------------------------
