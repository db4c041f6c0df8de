"""The engine end to end on tiny random encoders: outputs, statistics, invariances, gates.

Every statistic is checked against the model's own attention maps (`output_attentions=True`
under transformers' eager attention), computed here from their textbook definitions.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import AttentionInterface, GPTJConfig, GPTJModel

from bertscope.analyses.surface.stats import head_table
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.loop import (
    EngineOptions,
    plan_batches,
    run_batch,
    run_stats,
    stream_batches,
    windowed_batches,
)
from bertscope.errors import UserError
from bertscope.kernels.reference import stats_from_probs
from bertscope.kernels.spec import Gate, StatsSpec
from bertscope.models import attention
from bertscope.models.attention import HeadProbe
from bertscope.models.loading import SUPPORTED_MODEL_TYPES, load_model, wrap_model
from bertscope.text.corpus import Document
from bertscope.text.segments import SegmentOptions, collate, make_segments

# the shape of conftest's tiny models (checked where they are used)
TINY_LAYERS, TINY_HEADS = 2, 4
TINY_KINDS = ("bert", "roberta", "distilbert")

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, entropy=True, argmax=True, class_mass=True)
BACKENDS = ("eager", "chunked")

DOCUMENTS = [
    Document("pair-1", ["The cat sat on the mat.", "It was happy, very happy."]),
    Document("pair-2", ["Hello.", "World, again."]),
    Document("pair-3", ["A much longer first part, with commas, and periods. Then a second sentence follows it, "
                        "so that this segment is cut to fit, as it is far, far longer than forty tokens. And a third "
                        "sentence, too.", "Short."]),
    Document("single-1", ["Only one part here, no pair at all."]),
    Document("pair-4", ["Mr. Smith went to Washington.", "He liked it there, he said."]),
    Document("single-2", ["Yes."]),
    Document("pair-5", ["The quick brown fox jumps over the lazy dog.", "The dog, lazy as ever, did not move."]),
]
WORDS = ("the", "fox", "dog", "went", "to", "Washington", "quick", "heads", "attend", "token", "there", "over",
         "brown", "commas", "periods", ".", ",", ",", ".", "lazy", "liked", "it", "He", "Mr")


def hand_segments(tokenizer, max_len=40):
    segments, report = make_segments(DOCUMENTS, tokenizer, SegmentOptions(limit=None, max_len=max_len))
    assert len(segments) == len(DOCUMENTS) and report.truncated >= 1
    return segments


def random_segments(tokenizer, n=23, seed=1, max_len=48):
    """n segments of random lengths, pairs and singles mixed."""
    rng = random.Random(seed)
    documents = []
    for i in range(n):
        parts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 20))) for _ in range(rng.choice((1, 2)))]
        documents.append(Document(f"r{i}", parts))
    segments, _ = make_segments(documents, tokenizer, SegmentOptions(limit=None, max_len=max_len))
    assert len(segments) == n
    assert len({s.n_tokens for s in segments}) >= min(n, 8) // 2  # batches need padding
    return segments


def inputs_of(loaded, segments):
    inputs = collate(segments, loaded.tokenizer.pad_token_id)
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids")
    return inputs


def eager_twin(tiny_model, kind):
    """The same weights under transformers' own eager attention."""
    model, tokenizer = tiny_model(kind)
    twin, _ = tiny_model(kind, attn_implementation="eager")
    twin.load_state_dict(model.state_dict())
    assert model.config._attn_implementation == "bertscope" and twin.config._attn_implementation == "eager"
    loaded = wrap_model(model, tokenizer)
    assert (loaded.n_layers, loaded.n_heads) == (TINY_LAYERS, TINY_HEADS)
    return loaded, twin


def stats_over(loaded, batches, spec=SPEC, backend="chunked", gates=()):
    """HeadStats over explicit batches (lists of segments), with optional (layer, head, gate)s."""
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.class_names)
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend=backend)
    loaded.gates.reset()
    for layer, head, gate in gates:
        loaded.gates.set(layer, head, gate)
    try:
        with torch.inference_mode():
            for batch in batches:
                run_batch(loaded, probe, batch, stats)
    finally:
        loaded.gates.reset()
    return stats


def assert_stats_close(a: HeadStats, b: HeadStats, rtol=1e-5, atol=1e-7):
    """fp32 through a whole encoder: a padded batch changes GEMM blocking and reduction order
    in every layer, so sums agree to ~1e-6 relative, not bitwise."""
    assert a.meta() == b.meta()
    assert a.n_segments == b.n_segments
    for name in a.arrays:  # what the spec asks for (a statistic not asked has no array: None)
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=atol, err_msg=name)


# --- the model's outputs ----------------------------------------------------------------


@pytest.mark.parametrize("kind", TINY_KINDS + ("albert", "electra"))
def test_outputs_equal_transformers_eager(tiny_model, kind, monkeypatch):
    loaded, twin = eager_twin(tiny_model, kind)
    segments = random_segments(loaded.tokenizer, n=6)
    inputs = inputs_of(loaded, segments)
    real = inputs["attention_mask"].bool()[..., None]  # (B, L, 1)
    assert not bool(real.all())  # the batch is padded
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return attention.bertscope_attention(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "bertscope", counting)
    key_class = loaded.class_table[inputs["input_ids"]]
    with torch.no_grad():
        want = twin(**inputs).last_hidden_state * real
        plain = loaded.model(**inputs).last_hidden_state * real
        assert len(calls) == TINY_LAYERS  # the plain path did go through bertscope's function
        torch.testing.assert_close(plain, want, atol=1e-5, rtol=1e-5)
        for backend in BACKENDS:
            probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC, backend=backend)
            sunk = []
            with probe.active(key_class, lambda layer, stats, key_valid: sunk.append(layer)):  # noqa: B023  (the sink only lives inside this `with`)
                probed = loaded.model(**inputs).last_hidden_state * real
            assert sunk == list(range(TINY_LAYERS))
            torch.testing.assert_close(probed, want, atol=1e-5, rtol=1e-5, msg=backend)
    assert want.abs().mean() > 0.1  # not a degenerate all-zero output


def test_plain_path_after_a_failed_probe(tiny_model):
    """An exception inside `active` leaves the model on its plain path, nothing sunk."""
    loaded, _ = eager_twin(tiny_model, "bert")
    inputs = inputs_of(loaded, random_segments(loaded.tokenizer, n=3))
    probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC)
    sunk = []
    with pytest.raises(ZeroDivisionError):
        with probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: sunk.append(a)):
            1 / 0  # noqa: B018  (the exception inside `active`)
    with torch.no_grad():
        loaded.model(**inputs)
    assert sunk == []



@pytest.mark.parametrize("kind", TINY_KINDS)
def test_outputs_without_an_attention_mask(tiny_model, kind):
    """A call without attention_mask (one unpadded segment) works on both paths."""
    loaded, twin = eager_twin(tiny_model, kind)
    segment = random_segments(loaded.tokenizer, n=3)[0]
    inputs = {k: v for k, v in inputs_of(loaded, [segment]).items() if k != "attention_mask"}
    probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC)
    with torch.no_grad():
        want = twin(**inputs).last_hidden_state
        torch.testing.assert_close(loaded.model(**inputs).last_hidden_state, want, atol=1e-5, rtol=1e-5)
        with probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
            torch.testing.assert_close(loaded.model(**inputs).last_hidden_state, want, atol=1e-5, rtol=1e-5)


def test_probe_refuses_cross_attention():
    q = torch.randn(1, TINY_HEADS, 3, 8)
    kv = torch.randn(1, TINY_HEADS, 5, 8)
    probe = HeadProbe(1, TINY_HEADS, SPEC)
    with pytest.raises(ValueError, match="self-attention only"):
        with probe.active(torch.zeros(1, 5, dtype=torch.long), lambda *a: None):
            attention.bertscope_attention(None, q, kv, kv, None)

# --- statistics against the model's own attention maps ----------------------------------


def reference_table(twin, loaded, segments) -> dict[str, np.ndarray]:
    """Surface columns from `output_attentions=True`, one unpadded segment at a time."""
    Ly, H = loaded.n_layers, loaded.n_heads
    cols = ("prev", "self", "next", "offset_-2", "offset_+2", "cls", "sep", "punct", "other", "entropy",
            "argmax_prev", "argmax_self", "argmax_next", "argmax_cls", "argmax_sep", "argmax_punct")
    sums = {c: np.zeros((Ly, H)) for c in cols + ("cls_entropy", "sep_sep")}
    n = {"all": 0, "cls": 0, "sep": 0}
    uniform = 0.0
    for segment in segments:
        with torch.no_grad():
            maps = twin(**inputs_of(loaded, [segment]), output_attentions=True).attentions
        assert len(maps) == Ly
        cls = loaded.class_table[torch.tensor(segment.input_ids)]  # (L,)
        L = len(cls)
        rows = {"all": torch.ones(L, dtype=torch.bool), "cls": cls == 0, "sep": cls == 1}
        for g in n:
            n[g] += int(rows[g].sum())
        uniform += L * np.log(L)
        for layer, a in enumerate(maps):
            p = a[0].double()  # (H, L, L)
            assert torch.allclose(p.sum(-1), torch.ones(H, L, dtype=torch.float64), atol=1e-5)
            ref = stats_from_probs(p[None], torch.ones(1, L, dtype=torch.bool), cls[None], SPEC)  # the oracle's rows
            entropy = ref.entropy[0]  # (H, L)
            for col, o in (("prev", -1), ("self", 0), ("next", 1), ("offset_-2", -2), ("offset_+2", 2)):
                sums[col][layer] += ref.offset_mass[0, ..., SPEC.offsets.index(o)].sum(-1).numpy()  # p[i, i+o]
            for c, col in enumerate(("cls", "sep", "punct", "other")):
                sums[col][layer] += ref.class_mass[0, ..., c].sum(-1).numpy()
            sums["entropy"][layer] += entropy.sum(-1).numpy()
            sums["cls_entropy"][layer] += entropy[:, rows["cls"]].sum(-1).numpy()
            sums["sep_sep"][layer] += ref.class_mass[0, :, rows["sep"], 1].sum(-1).numpy()
            top = ref.argmax[0]  # (H, L)
            rel = top - torch.arange(L)
            for col, o in (("argmax_prev", -1), ("argmax_self", 0), ("argmax_next", 1)):
                sums[col][layer] += (rel == o).sum(-1).numpy()
            for c, col in enumerate(("argmax_cls", "argmax_sep", "argmax_punct")):
                sums[col][layer] += (cls[top] == c).sum(-1).numpy()
    table = {c: s / n["cls" if c == "cls_entropy" else "sep" if c == "sep_sep" else "all"] for c, s in sums.items()}
    table["n_tokens"] = np.full((Ly, H), n["all"])
    table["uniform_entropy"] = uniform / n["all"]
    return table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_statistics_equal_those_of_the_attention_maps(tiny_model, kind, backend):
    loaded, twin = eager_twin(tiny_model, kind)
    segments = hand_segments(loaded.tokenizer)
    want = reference_table(twin, loaded, segments)
    stats = run_stats(loaded, segments, SPEC, EngineOptions(batch_size=3, backend=backend, progress=False))
    got = head_table(stats)

    assert stats.n_segments == len(segments)
    np.testing.assert_array_equal(got["n_tokens"], want["n_tokens"])
    assert want["n_tokens"][0, 0] == sum(s.n_tokens for s in segments)
    np.testing.assert_array_equal(got["layer"][:, 0], [1, 2])
    np.testing.assert_array_equal(got["head"][0], [1, 2, 3, 4])
    for col in ("prev", "self", "next", "offset_-2", "offset_+2", "cls", "sep", "punct", "other", "sep_sep"):
        np.testing.assert_allclose(got[col], want[col], atol=2e-6, rtol=0, err_msg=col)
    for col in ("entropy", "cls_entropy"):
        np.testing.assert_allclose(got[col], want[col], atol=2e-5, rtol=0, err_msg=col)
    # argmax shares: a near-tie could flip between implementations; allow one row per head
    n_rows = want["n_tokens"][0, 0]
    for col in ("argmax_prev", "argmax_self", "argmax_next", "argmax_cls", "argmax_sep", "argmax_punct"):
        np.testing.assert_allclose(got[col], want[col], atol=1.01 / n_rows, rtol=0, err_msg=col)
    assert stats.uniform_entropy() == pytest.approx(want["uniform_entropy"], rel=1e-12)

    # the statistics are not trivial: heads differ, attention is far from uniform
    assert np.ptp(want["entropy"]) > 0.1 and want["entropy"].min() < 0.9 * want["uniform_entropy"]
    assert want["punct"].max() > 0.05 and want["sep_sep"].max() > 0.05


def test_class_table_of_the_tokenizers(minilm_tokenizer, roberta_tokenizer, tiny_model):
    bert = wrap_model(*tiny_model("bert"))
    ids = minilm_tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]", ".", ",", "the", "[PAD]", "!"])
    assert bert.class_table[ids].tolist() == [0, 1, 2, 2, 3, 3, 3]
    assert bert.class_names == ("cls", "sep", "punct", "other")
    roberta = wrap_model(*tiny_model("roberta"))
    ids = roberta_tokenizer.convert_tokens_to_ids(["<s>", "</s>", ".", ",", "<pad>", "Ġthe"])
    assert roberta.class_table[ids].tolist() == [0, 1, 2, 2, 3, 3]


# --- invariance to batching and padding -------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_invariant_to_batch_size(tiny_model, backend):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer)
    runs = [run_stats(loaded, segments, SPEC, EngineOptions(batch_size=b, backend=backend, progress=False))
            for b in (1, 3, 16)]
    assert [len(plan_batches(segments, b)) for b in (1, 3, 16)] == [23, 8, 2]
    for other in runs[1:]:
        assert_stats_close(runs[0], other)
    assert runs[0].n_segments == 23 and runs[0].n_rows[0, 0] == sum(s.n_tokens for s in segments)
    assert runs[0].n_rows[0, 1] == 23  # one [CLS] row per segment


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_invariant_to_padding_and_batch_composition(tiny_model, kind):
    loaded, _ = eager_twin(tiny_model, kind)
    segments = random_segments(loaded.tokenizer, n=12)
    alone = stats_over(loaded, [[s] for s in segments])
    together = stats_over(loaded, [segments])  # one batch padded to the longest segment
    shuffled = segments[:]
    random.Random(3).shuffle(shuffled)
    mixed = stats_over(loaded, [shuffled[:5], shuffled[5:7], shuffled[7:]])
    assert_stats_close(alone, together)
    assert_stats_close(alone, mixed)


def test_padding_changes_nothing_but_would_be_seen(tiny_model):
    """Guard against a vacuous invariance test: the statistics do see which tokens are real."""
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=4)
    s = segments[0]
    longer = type(s)(s.input_ids + [loaded.tokenizer.pad_token_id] * 5, s.token_type_ids + [0] * 5,
                     s.word_ids + [-1] * 5, s.words, s.doc_id)  # padding tokens treated as real
    a, b = stats_over(loaded, [[s]]), stats_over(loaded, [[longer]])
    assert b.n_rows[0, 0] == a.n_rows[0, 0] + 5
    assert not np.allclose(a.entropy_sum, b.entropy_sum)


# --- merging and storing ----------------------------------------------------------------


def test_merge_of_halves_equals_the_whole(tiny_model):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer)
    options = EngineOptions(batch_size=4, progress=False)
    whole = run_stats(loaded, segments, SPEC, options)
    first = run_stats(loaded, segments[:9], SPEC, options)
    second = run_stats(loaded, segments[9:], SPEC, options)
    assert first.merge(second) is first
    assert_stats_close(first, whole)
    assert not np.allclose(second.entropy_sum, whole.entropy_sum)  # the halves really were halves


def test_save_load_round_trip(tiny_model, tmp_path):
    loaded, _ = eager_twin(tiny_model, "bert")
    stats = run_stats(loaded, random_segments(loaded.tokenizer, n=5), SPEC, EngineOptions(progress=False))
    stats.save(tmp_path / "stats.npz")
    back = HeadStats.load(tmp_path / "stats.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.npz"]  # no temporary file left
    assert back.spec == stats.spec and back.class_names == stats.class_names and back.meta() == stats.meta()
    assert back.n_segments == 5
    assert back.arrays == stats.arrays
    for name in stats.arrays:
        np.testing.assert_array_equal(getattr(back, name), getattr(stats, name), err_msg=name)
    for col, values in head_table(stats).items():
        np.testing.assert_array_equal(head_table(back)[col], values, err_msg=col)
    stats.save(tmp_path / "stats.npz")  # overwriting an existing file works
    assert HeadStats.load(tmp_path / "stats.npz").n_segments == 5


@pytest.mark.parametrize("other", [
    dict(n_layers=3),
    dict(n_heads=2),
    dict(spec=StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, class_mass=True, entropy=True, argmax=True)),
    dict(spec=StatsSpec(offsets=SPEC.offsets, n_key_classes=4, argmax=False, class_mass=True, entropy=True)),
    dict(classes=("a", "b", "c", "d")),
])
def test_merge_of_mismatched_statistics_raises(other):
    args = dict(n_layers=2, n_heads=4, spec=SPEC, classes=("cls", "sep", "punct", "other"))
    base = HeadStats(**args)
    with pytest.raises(ValueError, match="cannot merge"):
        base.merge(HeadStats(**{**args, **other}))


# --- head gates -------------------------------------------------------------------------


def capture_attention_io(model):
    """Hooks on every BERT layer: value projection output and the context fed to the output dense."""
    seen = {"value": {}, "context": {}}
    handles = []
    for layer, block in enumerate(model.encoder.layer):
        handles.append(block.attention.self.value.register_forward_hook(
            lambda mod, args, out, layer=layer: seen["value"].__setitem__(layer, out.detach().clone())))
        handles.append(block.attention.output.dense.register_forward_pre_hook(
            lambda mod, args, layer=layer: seen["context"].__setitem__(layer, args[0].detach().clone())))
    return seen, handles


def gated_forward(loaded, segments, gates=()):
    seen, handles = capture_attention_io(loaded.model)
    try:
        stats = stats_over(loaded, [segments], gates=gates)
        probe = HeadProbe(loaded.n_layers, loaded.n_heads, SPEC)
        for layer, head, gate in gates:
            loaded.gates.set(layer, head, gate)
        inputs = inputs_of(loaded, segments)
        with torch.no_grad(), probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
            out = loaded.model(**inputs).last_hidden_state
    finally:
        loaded.gates.reset()
        for h in handles:
            h.remove()
    return out, stats, seen


def test_gates_zero_and_uniform(tiny_model):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=5)
    real = inputs_of(loaded, segments)["attention_mask"].bool()  # (B, L)
    D = 32 // TINY_HEADS
    out0, stats0, seen0 = gated_forward(loaded, segments)
    out1, stats1, seen1 = gated_forward(loaded, segments, gates=[(0, 1, Gate.ZERO), (0, 3, Gate.UNIFORM)])

    # the gated layer: head 1 passes on zeros, head 3 the mean of its values over real keys,
    # heads 0 and 2 exactly what they passed on before
    ctx0, ctx1 = seen0["context"][0], seen1["context"][0]  # (B, L, H*D)
    assert ctx0[..., D : 2 * D][real].abs().max() > 0.1
    assert torch.equal(ctx1[..., D : 2 * D], torch.zeros_like(ctx1[..., D : 2 * D]))
    v = seen1["value"][0][..., 3 * D : 4 * D]  # (B, L, D)
    mean_v = (v * real[..., None]).sum(1) / real.sum(1, keepdim=True)  # (B, D)
    torch.testing.assert_close(ctx1[..., 3 * D :][real], mean_v[:, None].expand_as(v)[real], atol=1e-6, rtol=1e-5)
    for h in (0, 2):
        torch.testing.assert_close(ctx1[..., h * D : (h + 1) * D][real], ctx0[..., h * D : (h + 1) * D][real])

    # the output changes; statistics of the gated layer are of un-gated attention, the next layer's change
    assert (out1 - out0)[real].abs().max() > 1e-3
    for name in stats0.arrays:  # the ones the spec asked for (the others are None in both)
        np.testing.assert_array_equal(getattr(stats1, name)[0], getattr(stats0, name)[0], err_msg=name)
    assert not np.allclose(stats1.entropy_sum[1], stats0.entropy_sum[1], rtol=1e-4)
    assert not np.allclose(stats1.class_mass_sum[1], stats0.class_mass_sum[1], rtol=1e-4)


def test_zero_gates_on_the_last_layer_leave_all_statistics(tiny_model):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=5)
    gates = [(TINY_LAYERS - 1, h, Gate.ZERO) for h in range(TINY_HEADS)]
    out0, stats0, _ = gated_forward(loaded, segments)
    out1, stats1, seen1 = gated_forward(loaded, segments, gates=gates)
    assert torch.equal(seen1["context"][TINY_LAYERS - 1], torch.zeros_like(seen1["context"][TINY_LAYERS - 1]))
    assert_stats_close(stats0, stats1, rtol=0, atol=0)
    assert not torch.allclose(out0, out1, atol=1e-3)


# --- HeadProbe bookkeeping --------------------------------------------------------------


def test_probe_raises_when_a_forward_calls_attention_fewer_times(tiny_model):
    loaded, _ = eager_twin(tiny_model, "bert")
    inputs = inputs_of(loaded, random_segments(loaded.tokenizer, n=2))
    probe = HeadProbe(TINY_LAYERS + 1, TINY_HEADS, SPEC)
    with pytest.raises(RuntimeError, match=f"expected {TINY_LAYERS + 1} attention calls .* saw {TINY_LAYERS}"):
        with torch.no_grad(), probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
            loaded.model(**inputs)


def test_probe_raises_when_no_forward_ran():
    probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC)
    with pytest.raises(RuntimeError, match="saw 0"):
        with probe.active(torch.zeros(1, 3, dtype=torch.long), lambda *a: None):
            pass


def test_probe_raises_clearly_when_a_forward_calls_attention_more_times(tiny_model):
    loaded, _ = eager_twin(tiny_model, "bert")
    inputs = inputs_of(loaded, random_segments(loaded.tokenizer, n=2))
    probe = HeadProbe(TINY_LAYERS - 1, TINY_HEADS, SPEC)
    with pytest.raises(RuntimeError, match=f"expected {TINY_LAYERS - 1} attention calls"):
        with torch.no_grad(), probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
            loaded.model(**inputs)


# --- loading and supported model types --------------------------------------------------


def test_load_model_from_a_checkpoint(tiny_checkpoint, tiny_model):
    loaded = load_model(tiny_checkpoint)
    assert (loaded.model_type, loaded.n_layers, loaded.n_heads) == ("bert", TINY_LAYERS, TINY_HEADS)
    assert loaded.model.config._attn_implementation == "bertscope" and not loaded.model.training
    assert loaded.path == tiny_checkpoint and loaded.takes_token_types
    assert loaded.class_table.shape[0] >= len(loaded.tokenizer)
    twin, _ = tiny_model("bert", attn_implementation="eager")
    inputs = inputs_of(loaded, random_segments(loaded.tokenizer, n=3))
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(**inputs).last_hidden_state[real],
                                   twin(**inputs).last_hidden_state[real], atol=1e-5, rtol=1e-5)


def test_distilbert_takes_no_token_types(tiny_model):
    loaded = wrap_model(*tiny_model("distilbert"))
    assert loaded.model_type == "distilbert" and not loaded.takes_token_types
    assert (loaded.n_layers, loaded.n_heads) == (TINY_LAYERS, TINY_HEADS)


def test_wrap_model_switches_an_eager_model_to_bertscope(tiny_model):
    model, tokenizer = tiny_model("bert", attn_implementation="eager")
    loaded = wrap_model(model, tokenizer)
    assert loaded.model.config._attn_implementation == "bertscope"
    stats = run_stats(loaded, random_segments(tokenizer, n=2), SPEC, EngineOptions(progress=False))
    assert stats.n_rows[-1, 0] > 0


def tiny_unsupported():
    """A tiny GPT-J: a model type bertscope does not know."""
    torch.manual_seed(0)
    return GPTJModel(GPTJConfig(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, rotary_dim=4,
                                bos_token_id=0, eos_token_id=0))


def check_unsupported_message(message: str):
    assert "'gptj' is not supported" in message
    for model_type in SUPPORTED_MODEL_TYPES:
        assert model_type in message


def test_wrap_model_rejects_unsupported_types(minilm_tokenizer):
    with pytest.raises(UserError) as info:
        wrap_model(tiny_unsupported(), minilm_tokenizer)
    check_unsupported_message(str(info.value))


def test_load_model_rejects_unsupported_types(unsupported_checkpoint):
    with pytest.raises(UserError) as info:
        load_model(unsupported_checkpoint)
    check_unsupported_message(str(info.value))


def test_load_model_user_errors(tmp_path):
    with pytest.raises(UserError, match="model directory not found"):
        load_model(tmp_path / "missing")
    with pytest.raises(UserError, match="no config.json"):
        load_model(tmp_path)



# --- the batch plan: windows of length-sorted segments ----------------------------------


class Fake:
    """Just a length: all the plan looks at."""

    def __init__(self, n_tokens):
        self.n_tokens = n_tokens


@pytest.mark.parametrize("n, batch_size, window", [(0, 4, 2), (1, 4, 2), (37, 4, 2), (64, 4, 16), (50, 3, 1),
                                                   (50, 3, None)])
def test_windowed_plan_covers_each_segment_once_sorted_within_windows(n, batch_size, window):
    rng = random.Random(n)
    lengths = [rng.randint(5, 60) for _ in range(n)]
    segments = [Fake(x) for x in lengths]
    plan = plan_batches(segments, batch_size, window)
    assert sorted(i for batch in plan for i in batch) == list(range(n))
    size = n if window is None else window * batch_size
    for w, start in enumerate(range(0, n, size or 1)):  # each window: its own segments, by (length, index)
        members = list(range(start, min(n, start + size)))
        expected = sorted(members, key=lambda i: (lengths[i], i))
        per_window = (size + batch_size - 1) // batch_size
        got = [i for batch in plan[w * per_window:(w + 1) * per_window] for i in batch]
        assert got == expected
    assert all(len(batch) == batch_size for batch in plan[:-1])
    # a generator gives the same plan as a list: the plan is a function of the stream
    assert plan_batches(iter(segments), batch_size, window) == plan
    assert [list(b) for b, _ in windowed_batches(iter(segments), batch_size, window)] == plan


def test_whole_stream_window_is_the_global_length_sort():
    lengths = [9, 3, 7, 3, 12, 1, 7]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    assert plan_batches([Fake(x) for x in lengths], 2, None) == [order[0:2], order[2:4], order[4:6], order[6:]]
    assert plan_batches([Fake(x) for x in lengths], 2, 1) == [[1, 0], [3, 2], [5, 4], [6]]


@pytest.mark.parametrize("window", [1, 2, None])
def test_shards_and_skips_split_one_plan(tiny_model, window):
    """Ranks take batches r, r + w, ... of one plan: disjoint, together every segment;
    skipping k batches of a shard leaves exactly its later batches."""
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=19)
    plan = plan_batches(segments, 3, window)

    def seen(shard, skip=0):
        return [(b.number, b.indices) for b in stream_batches(loaded, iter(segments), SPEC, batch_size=3,
                                                              progress=False, shard=shard, skip=skip,
                                                              window_batches=window)]
    ranks = [seen((r, 3)) for r in range(3)]
    for r, batches in enumerate(ranks):
        assert batches == [(k + 1, plan[i]) for k, i in enumerate(range(r, len(plan), 3))]
    assert seen((1, 3), skip=1) == ranks[1][1:]
    assert seen((0, 1), skip=len(plan)) == []


def test_malloc_trim_between_batches_changes_nothing_but_memory(tiny_model, monkeypatch):
    from bertscope.engine import loop as engine

    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=9)
    monkeypatch.setenv("BERTSCOPE_MALLOC_TRIM", "0")
    assert engine.malloc_trim_every() == 0
    plain = run_stats(loaded, segments, SPEC, EngineOptions(batch_size=2, progress=False))
    real_trim, trims = engine.malloc_trim, []
    monkeypatch.delenv("BERTSCOPE_MALLOC_TRIM")
    assert engine.malloc_trim_every() == engine.MALLOC_TRIM_EVERY == 8  # on by default
    monkeypatch.setenv("BERTSCOPE_MALLOC_TRIM", "2")
    monkeypatch.setattr(engine, "malloc_trim", lambda: (trims.append(1), real_trim()))
    trimmed = run_stats(loaded, segments, SPEC, EngineOptions(batch_size=2, progress=False))
    assert len(trims) == 2  # after batches 2 and 4 of 5
    for name in plain.arrays:
        np.testing.assert_array_equal(getattr(trimmed, name), getattr(plain, name), err_msg=name)
    monkeypatch.setenv("BERTSCOPE_MALLOC_TRIM", "often")
    with pytest.raises(ValueError, match="BERTSCOPE_MALLOC_TRIM"):
        engine.malloc_trim_every()


def test_long_batches_show_each_layer_on_the_progress_bar(tiny_model, monkeypatch):
    """A batch of LONG_BATCH padded tokens or more names each layer on the bar as it is done;
    a shorter one leaves the bar as it was."""
    from bertscope.engine import loop as engine

    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=5)
    shown = []

    class Bar(engine.tqdm):
        def set_postfix_str(self, s="", refresh=True):
            shown.append(s)

    monkeypatch.setattr(engine, "tqdm", Bar)
    length = max(s.n_tokens for s in segments)
    monkeypatch.setattr(engine, "LONG_BATCH", 5 * length + 1)
    list(stream_batches(loaded, segments, SPEC, batch_size=5, progress=True))
    assert shown == []
    monkeypatch.setattr(engine, "LONG_BATCH", 5 * length)
    (batch,) = stream_batches(loaded, segments, SPEC, batch_size=5, progress=True)
    assert len(batch.layers) == TINY_LAYERS
    assert shown == [f"layer {k}/{TINY_LAYERS} of 5 x {length} tokens" for k in range(1, TINY_LAYERS + 1)]
    shown.clear()
    list(stream_batches(loaded, segments, SPEC, batch_size=5, progress=False))
    assert shown == []
