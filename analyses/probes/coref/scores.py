"""`bertscope probe coref`'s engine accumulators: GUM's mentions and GAP's pronouns scored from
each batch's word argmax or word maps (`bertscope.analyses.probes.coref.stats` has the scoring).
Apart from command.py because they subclass `stats.Scores` (numpy): the command imports them when
it runs, so that its parser is built without numpy or torch."""
from __future__ import annotations

import numpy as np
import torch

from bertscope.analyses.probes.coref import stats as coref


class GumScores(coref.Scores):
    """GUM scores as an engine accumulator: each segment's mentions scored from the kernel's
    word argmax (`RowStats.word_argmax`), against `scored[i]` of segment i."""

    def __init__(self, n_layers: int, n_heads: int, scored: list):
        super().__init__(n_layers, n_heads)
        self.scored = scored

    def add(self, batch):
        argmax = torch.stack([s.word_argmax for s in batch.layers], dim=1).cpu().numpy()  # (B, layers, H, W)
        for row, i in enumerate(batch.indices):
            seg = self.scored[i]
            self.add_mentions(seg.kinds, coref.head_hits(argmax[row], seg.heads, seg.gold), seg.baseline_hits)


def pronoun_gender(pronoun: str) -> str:
    word = pronoun.lower()
    if word in ("he", "him", "his", "himself"):
        return "masculine"
    if word in ("she", "her", "hers", "herself"):
        return "feminine"
    return "other"


class GapScores(coref.Scores):
    """GAP scores as an engine accumulator: each example's pronoun scored from its word maps,
    against `examples[i]` of segment i."""

    def __init__(self, n_layers: int, n_heads: int, examples: list, gap_name: str):
        super().__init__(n_layers, n_heads, types=("All", "masculine", "feminine"), baselines=coref.GAP_BASELINES)
        self.examples, self.gap_name = examples, gap_name

    def add(self, batch):
        maps = torch.stack([s.word_map for s in batch.layers], dim=1).float().cpu().numpy()  # (B, layers, H, W, W)
        for row, i in enumerate(batch.indices):
            ex = self.examples[i]
            hits = coref.gap_head_hits(maps[row], ex.pronoun_word, ex.a_words, ex.b_words, ex.label, self.gap_name)
            picks = coref.gap_baselines(ex.pronoun_word, ex.a_words, ex.b_words)
            base = {name: np.array([pick == ex.label]) for name, pick in picks.items()}
            self.add_mentions([pronoun_gender(ex.pronoun)], hits[:, :, None], base)
