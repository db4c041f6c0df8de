"""Word-level pooling: from token maps to word maps, shared by every backend.

The probes of Clark et al. (2019) read attention between *words*. A word split into
several tokens receives the sum of their attention (so rows stay distributions) and
gives the mean of its tokens' rows (`from_word="mean"`, the paper's definition) or its
first token's row (`"first"`, what the released code did). `WordPooling` holds both as
matrices, so every backend pools with two small matmuls: word_map = from_word @ P @ to_word.
"""
from __future__ import annotations

import torch

from .spec import WordPooling

FROM_WORD = ("mean", "first")


def word_pooling(unit_index: torch.Tensor, candidate: torch.Tensor, from_word: str = "mean", dtype=torch.float32):
    """Pooling matrices from each token's unit.

    unit_index: (B, L) int64, the unit (word or special token) of each token; -1 for padding
    candidate:  (B, W) bool, units an argmax may pick (W = number of units)
    """
    if from_word not in FROM_WORD:
        raise ValueError(f"from_word must be one of {FROM_WORD}, not {from_word!r}")
    B, L = unit_index.shape
    W = candidate.shape[1]
    member = torch.nn.functional.one_hot(unit_index.clamp_min(0), W).to(dtype)  # (B, L, W)
    member = member * (unit_index >= 0)[..., None].to(dtype)
    if from_word == "first":
        # keep only the first token of every unit
        seen_before = member.cumsum(1) - member  # (B, L, W): tokens of the unit before this one
        member_from = member * (seen_before == 0).to(dtype)
    else:
        member_from = member
    counts = member_from.sum(1)  # (B, W)
    from_w = member_from.transpose(1, 2) / counts.clamp_min(1)[..., None]  # (B, W, L)
    return WordPooling(from_word=from_w, to_word=member, candidate=candidate & (counts > 0))


def pool_map(p: torch.Tensor, pooling: WordPooling, batch_index=None) -> torch.Tensor:
    """Word-level maps of token maps p (n, L, L) of sequences `batch_index` (n,), or of
    all heads p (B, H, L, L) when batch_index is None: (..., W, W)."""
    if batch_index is None:
        fw, tw = pooling.from_word[:, None], pooling.to_word[:, None]  # (B, 1, W, L), (B, 1, L, W)
    else:
        fw, tw = pooling.from_word[batch_index], pooling.to_word[batch_index]  # (n, W, L), (n, L, W)
    return torch.matmul(torch.matmul(fw.to(p.dtype), p), tw.to(p.dtype))


def word_argmax(word_map: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """(B, H, W, W) word maps -> (B, H, W): the most-attended other candidate unit of
    each unit, lowest index on ties, -1 when no candidate is left.

    The unit itself is excluded, as in the paper: "the most-attended-to *other* word".
    """
    B, H, W, _ = word_map.shape
    if W == 0:  # no unit at all (argmax over an empty row is undefined)
        return torch.full((B, H, 0), -1, dtype=torch.long, device=word_map.device)
    allowed = candidate[:, None, None, :] & ~torch.eye(W, dtype=torch.bool, device=word_map.device)  # (B, 1, W, W)
    scores = word_map.masked_fill(~allowed, -1.0)  # probabilities are >= 0, so -1 never wins
    best = scores.argmax(-1)  # (B, H, W), first maximum on ties
    return torch.where(allowed.any(-1), best, torch.full_like(best, -1))
