"""Token classes per position: the schemes' ids on hand-built segments, misaligned sources
refused, and class masses of any scheme (16 classes included) against the attention maps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine import eager_twin, inputs_of

from bertscope.engine.accumulate import HeadStats
from bertscope.engine.loop import EngineOptions, collate_batch, fold
from bertscope.kernels.spec import StatsSpec
from bertscope.text.token_classes import (
    PARTS,
    TokenClasses,
    check_ids,
    part_ids,
    tag_ids,
    tag_scheme,
    word_list_ids,
    word_list_scheme,
)
from bertscope.text.word_segments import word_segment

pytestmark = pytest.mark.usefixtures("single_thread")

A = ["The", "cat", "did", "not", "sleep", "."]
B = ["Nobody", "saw", "it", "."]
UPOS_A = ["DET", "NOUN", "AUX", "PART", "VERB", "PUNCT"]
UPOS_B = ["PRON", "VERB", "PRON", "PUNCT"]


def pair(tokenizer):
    return word_segment(A, tokenizer, 64, doc_id="d", second=B)


def test_part_ids_on_bert_and_roberta_templates(minilm_tokenizer, roberta_tokenizer):
    s = pair(minilm_tokenizer)  # [CLS] A [SEP] B [SEP], one token per word here
    assert part_ids(s, minilm_tokenizer) == [0] + [2] * 6 + [1] + [3] * 4 + [1]
    r = pair(roberta_tokenizer)  # <s> A </s></s> B </s>
    ids = part_ids(r, roberta_tokenizer)
    n_a = sum(1 for i, w in enumerate(r.word_ids) if 0 <= w < len(A))
    assert ids[0] == 0 and ids[1 : 1 + n_a] == [2] * n_a and ids[1 + n_a : 3 + n_a] == [1, 1]
    assert set(ids[3 + n_a : -1]) == {3} and ids[-1] == 1


def test_tag_and_word_list_ids(minilm_tokenizer):
    s = pair(minilm_tokenizer)
    scheme = tag_scheme(("NOUN", "VERB", "PRON"), "upos")
    assert scheme.names == ("cls", "sep", "NOUN", "VERB", "PRON", "other")
    assert scheme.row_groups == ("NOUN", "VERB", "PRON")
    ids = tag_ids(s, UPOS_A + UPOS_B, scheme, minilm_tokenizer)
    #         [CLS] The cat did not sleep . [SEP] Nobody saw it . [SEP]
    assert ids == [0, 5, 2, 5, 5, 3, 5, 1, 4, 3, 4, 5, 1]
    neg = word_list_ids(s, {"not", "nobody", "never"}, minilm_tokenizer)
    assert neg == [0, 3, 3, 3, 2, 3, 3, 1, 2, 3, 3, 3, 1]
    assert word_list_scheme("negation").names == ("cls", "sep", "negation", "other")
    with pytest.raises(ValueError, match="4 tags for the 10 words"):
        tag_ids(s, UPOS_B, scheme, minilm_tokenizer)


def test_a_split_word_gives_its_class_to_every_token(minilm_tokenizer):
    s = word_segment(["unbelievably", "good"], minilm_tokenizer, 32)
    assert s.n_tokens > 4  # "unbelievably" is split into several word pieces
    ids = tag_ids(s, ["ADV", "ADJ"], tag_scheme(("ADV", "ADJ"), "upos"), minilm_tokenizer)
    assert ids == [0] + [2] * (s.n_tokens - 3) + [3, 1]


@pytest.mark.parametrize("ids, message", [
    (None, "has no token classes"),
    ([0, 1], "2 token classes for 13 tokens"),
    ([0] * 12 + [4], "class id 4 outside 0..3"),
])
def test_misaligned_classes_are_refused(tiny_model, ids, message):
    loaded, _ = eager_twin(tiny_model, "bert")
    s = pair(loaded.tokenizer)
    with pytest.raises(ValueError, match=message):
        check_ids(s, ids, PARTS)
    s.token_class = ids
    spec = StatsSpec(offsets=(), n_key_classes=4, class_mass=True, entropy=True, argmax=True)
    with pytest.raises(ValueError, match=message):
        collate_batch(loaded, [s], [0], spec, PARTS)
    with pytest.raises(ValueError, match="counts 5 key classes"):
        collate_batch(loaded, [s], [0], StatsSpec(offsets=(), n_key_classes=5, class_mass=True, entropy=True,
                                                  argmax=True), PARTS)


def scheme_of_16() -> TokenClasses:
    return TokenClasses(tuple(f"c{i}" for i in range(16)), ("c3", "c7", "c15"), "test:16")


@pytest.mark.parametrize("backend", ("eager", "chunked"))
@pytest.mark.parametrize("scheme", ("parts", "16"))
def test_class_mass_per_row_group_equals_the_maps(tiny_model, backend, scheme):
    """Mass on every class, summed over the rows of every group, against the model's own
    attention maps; e.g. the parts scheme's part_a rows on part_a keys is the "block" mass."""
    loaded, twin = eager_twin(tiny_model, "bert")
    rng = np.random.default_rng(0)
    segments = [pair(loaded.tokenizer), word_segment(B + A, loaded.tokenizer, 64, doc_id="e", second=A[:3]),
                word_segment(A[:2], loaded.tokenizer, 64, doc_id="f", second=B[:1])]
    classes = PARTS if scheme == "parts" else scheme_of_16()
    for s in segments:
        s.token_class = (part_ids(s, loaded.tokenizer) if scheme == "parts"
                         else rng.integers(0, 16, s.n_tokens).tolist())
    spec = StatsSpec(offsets=(), n_key_classes=classes.n_classes, entropy=True, argmax=False, class_mass=True)
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, classes)
    fold(loaded, segments, spec, [stats], EngineOptions(batch_size=2, backend=backend, progress=False), classes=classes)

    G, C = len(classes.group_names), classes.n_classes
    want = np.zeros((loaded.n_layers, loaded.n_heads, G, C))
    rows = np.zeros(G)
    for s in segments:
        with torch.no_grad():
            maps = twin(**inputs_of(loaded, [s]), output_attentions=True).attentions
        cls = torch.tensor(s.token_class)
        groups = [torch.ones_like(cls, dtype=torch.bool)] + [cls == classes.names.index(g) for g in classes.row_groups]
        rows += [int(g.sum()) for g in groups]
        for layer, a in enumerate(maps):
            p = a[0].double()  # (H, L, L)
            for gi, g in enumerate(groups):
                for c in range(C):
                    want[layer, :, gi, c] += p[:, g][:, :, cls == c].sum((1, 2)).numpy()
    np.testing.assert_array_equal(stats.n_rows[0], rows)
    np.testing.assert_allclose(stats.class_mass_sum, want, atol=1e-5, rtol=0)
    assert stats.class_mass_sum[..., 0, :].sum(-1) == pytest.approx(rows[0])  # every row sums to 1
    if scheme == "parts":  # the tiny random model attends within its own part more than chance
        assert stats.mean("class_mass_sum", "part_a")[..., 2].mean() > 0.2


def test_scheme_round_trips_through_a_checkpoint(tmp_path):
    classes = scheme_of_16()
    spec = StatsSpec(offsets=(0,), n_key_classes=16, class_mass=True, entropy=True, argmax=True)
    HeadStats(2, 3, spec, classes).save(tmp_path / "s.npz")
    back = HeadStats.load(tmp_path / "s.npz")
    assert back.classes == classes and back.group_names == ("all", "c3", "c7", "c15")
    with pytest.raises(ValueError, match="not classes"):
        TokenClasses(("a", "b"), ("c",))
