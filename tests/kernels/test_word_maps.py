"""Word-level maps from the engine against the model's own attention maps, pooled by hand."""
import numpy as np
import pytest
import torch
from test_engine import eager_twin, hand_segments, inputs_of

from bertscope.engine.loop import iter_word_maps, segment_units, stream_batches
from bertscope.kernels.spec import StatsSpec

pytestmark = pytest.mark.usefixtures("single_thread")


def pooled_by_hand(p, segment, from_word):
    """p (H, L, L) -> (H, W, W): to a unit = sum over its tokens; from = mean or first token."""
    units, _ = segment_units(segment)
    W = max(units) + 1
    out = np.zeros((p.shape[0], W, W))
    for w in range(W):
        rows = [i for i, u in enumerate(units) if u == w]
        rows = rows[:1] if from_word == "first" else rows
        for u in range(W):
            cols = [j for j, x in enumerate(units) if x == u]
            out[:, w, u] = p[:, rows][:, :, cols].sum(-1).mean(-1)
    return out


@pytest.mark.parametrize("backend", ["eager", "chunked"])
@pytest.mark.parametrize("from_word", ["mean", "first"])
@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_word_maps_equal_pooled_attention_maps(tiny_model, kind, from_word, backend):
    loaded, twin = eager_twin(tiny_model, kind)
    segments = hand_segments(loaded.tokenizer)
    assert any(len(set(s.word_ids)) < len(s.word_ids) - 2 for s in segments)  # some words are split
    got = dict(iter_word_maps(loaded, segments, from_word, batch_size=3, backend=backend, progress=False))
    assert sorted(got) == list(range(len(segments)))
    for i, segment in enumerate(segments):
        with torch.no_grad():
            maps = twin(**inputs_of(loaded, [segment]), output_attentions=True).attentions
        want = np.stack([pooled_by_hand(a[0].double().numpy(), segment, from_word) for a in maps])  # (layers, H, W, W)
        assert got[i].shape == want.shape
        np.testing.assert_allclose(got[i], want, atol=2e-6, rtol=0)
        np.testing.assert_allclose(got[i].sum(-1), 1.0, atol=1e-5)  # rows stay distributions


def test_stream_batches_yields_every_layer_and_keeps_qk(tiny_model):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = hand_segments(loaded.tokenizer)
    spec = StatsSpec(offsets=(), n_key_classes=4, entropy=False, argmax=False, keep_qk=True, class_mass=True)
    seen = []
    for ctx in stream_batches(loaded, segments, spec, batch_size=4, progress=False):
        batch, layers = ctx.indices, ctx.layers
        assert len(layers) == loaded.n_layers
        L = max(segments[i].n_tokens for i in batch)
        assert layers[0].queries.shape == (len(batch), loaded.n_heads, L, 32 // loaded.n_heads)
        assert layers[0].scale == pytest.approx((32 // loaded.n_heads) ** -0.5)
        seen += batch
    assert sorted(seen) == list(range(len(segments)))
    with pytest.raises(ValueError, match="from_word"):
        next(stream_batches(loaded, segments, StatsSpec(n_key_classes=4, word_maps=True), progress=False))
