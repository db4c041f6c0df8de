"""How much fine-tuning changed each head's attention (Kovaleva et al. 2019, section 4.3, Figure 5).

For every input x and head h: cos_h(x) = <A_h(x), B_h(x)> / (|A_h(x)| |B_h(x)|), the cosine
between the flattened attention maps of the two models (A: pre-trained, B: fine-tuned) over
x's valid L x L block (padding rows and columns left out), then averaged over the inputs. 1 =
the head attends exactly as before; the paper's darker cells (lower values) changed most.

No statistics kernel can give this (it pairs the maps of two models), so the maps come from
the eager path: both models run in lockstep on the same batch through `HeadProbe` with
`keep_qk`, the layer's maps are rebuilt from its q and k as softmax(masked_scores), the
first model's maps of the batch are held until the second model's forward has scored them,
and only (layers, H) sums stay: nothing of the data set's maps is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bertscope.kernels.common import masked_scores
from bertscope.kernels.spec import StatsSpec
from bertscope.models.attention import HeadProbe

QK_SPEC = StatsSpec(offsets=(), n_key_classes=1, entropy=False, argmax=False, keep_qk=True)


@dataclass
class CosineSums:
    """Additive: the sum over inputs of every head's cosine and the number of inputs."""
    sums: np.ndarray  # (layers, H) float64
    n: int = 0

    def merge(self, other: CosineSums) -> CosineSums:
        return CosineSums(self.sums + other.sums, self.n + other.n)

    @property
    def mean(self) -> np.ndarray:
        return self.sums / max(self.n, 1)  # (layers, H)


def batch_maps(loaded, inputs: dict, on_layer):
    """One forward of `loaded.model` on `inputs`; `on_layer(layer, maps (B, H, L, L), valid (B, L))`
    gets each layer's attention maps (padding keys 0, padding query rows 0), one layer at a time."""
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, QK_SPEC, backend="eager")
    ids = inputs["input_ids"]
    key_class = torch.zeros_like(ids)  # (B, L): one class, unused

    def sink(layer, stats, key_valid):
        scores = masked_scores(stats.queries.float(), stats.keys.float(), key_valid, stats.scale)  # (B, H, L, L)
        maps = torch.softmax(scores, dim=-1) * key_valid[:, None, :, None]  # zero the padding query rows
        on_layer(layer, maps, key_valid)

    with torch.no_grad(), probe.active(key_class, sink):
        loaded.model(**inputs)


def cosine_batch(a, b, inputs: dict) -> np.ndarray:
    """(B, layers, H) cosine between the maps of models a and b on one batch."""
    held: list[torch.Tensor] = [None] * a.n_layers
    out = torch.zeros(inputs["input_ids"].shape[0], a.n_layers, a.n_heads, dtype=torch.float64)

    def keep(layer, maps, valid):
        held[layer] = maps  # (B, H, L, L), the first model's, until the second has run

    def score(layer, maps, valid):
        first = held[layer]
        dot = (first * maps).sum((-1, -2))  # (B, H)
        norm = first.square().sum((-1, -2)).sqrt() * maps.square().sum((-1, -2)).sqrt()  # (B, H)
        out[:, layer] = (dot / norm.clamp_min(1e-30)).double()
        held[layer] = None

    batch_maps(a, inputs, keep)
    batch_maps(b, inputs, score)
    return out.numpy()


def attention_cosine(a, b, batches, progress=None) -> CosineSums:
    """Mean over all inputs of `batches` (dicts of input_ids, attention_mask, ...) of every
    head's cosine between models a and b (two LoadedModel of the same shape)."""
    if (a.n_layers, a.n_heads) != (b.n_layers, b.n_heads):
        raise ValueError(f"models differ in shape: {a.n_layers}x{a.n_heads} vs {b.n_layers}x{b.n_heads}")
    total = CosineSums(np.zeros((a.n_layers, a.n_heads)))
    for inputs in (progress(batches) if progress else batches):
        cos = cosine_batch(a, b, inputs)  # (B, layers, H)
        total = total.merge(CosineSums(cos.sum(0), cos.shape[0]))
    return total
