"""Pattern types (Kovaleva et al. 2019, section 4.1): the rules on hand-built maps whose type is
known, read through the eager reference kernel; the accumulator against materialised maps;
the CNN on generated maps."""

import numpy as np
import pytest
import torch

from bertscope.analyses.patterns import cnn as pattern_cnn
from bertscope.analyses.patterns.stats import TYPES, Thresholds, classify, map_features

# [CLS] a a a a a [SEP] b b b b b [SEP]
PAIR = torch.tensor([0, 2, 2, 2, 2, 2, 1, 3, 3, 3, 3, 3, 1])
SINGLE = torch.tensor([0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1])
L = len(PAIR)


def rows_normalised(p):
    return p / p.sum(-1, keepdim=True)


def diagonal_map():
    p = torch.zeros(L, L)
    p[torch.arange(1, L), torch.arange(L - 1)] = 1.0  # every row on its previous token
    p[0, 1] = 1.0
    return p


def sep_map(classes=PAIR):
    return rows_normalised((classes == 1).float().expand(L, L).clone())


def block_map(classes=PAIR):
    part = torch.where(torch.arange(L) <= 6, 0, 1)  # [CLS] + A + middle [SEP] | B + last [SEP]
    words = (classes >= 2)
    return rows_normalised(((part[:, None] == part[None, :]) & words[None, :]).float())


def uniform_map():
    return torch.full((L, L), 1.0 / L)


def mix_map():
    return 0.5 * diagonal_map() + 0.5 * sep_map()


def local_sharp_map():
    """Every word attends two tokens ahead, staying in its own part: in-part but not a block."""
    p = torch.zeros(L, L)
    for i in range(L):
        j = i + 2 if (i <= 4 or 7 <= i <= 10) else i - 2
        p[i, j] = 1.0
    return p


def type_of(p, classes=PAIR, t=Thresholds()):  # noqa: B008  (a frozen dataclass)
    feat = map_features(p[None, None].double(), classes[None])
    return TYPES[int(classify(feat, t)[0, 0])], {k: float(v[0, 0]) for k, v in feat.items()}


@pytest.mark.parametrize("make, expected", [
    (diagonal_map, "Diagonal"), (sep_map, "Vertical"), (block_map, "Block"), (uniform_map, "Heterogeneous"),
    (mix_map, "Vertical+Diagonal"), (local_sharp_map, "Heterogeneous")])
def test_hand_built_maps_get_their_type(make, expected):
    kind, feat = type_of(make())
    assert kind == expected, feat


def test_features_have_their_definitions():
    _, f = type_of(sep_map())
    assert f["special"] == pytest.approx(1.0) and f["entropy"] == pytest.approx(np.log(2))
    _, f = type_of(diagonal_map())
    assert f["diagonal"] == pytest.approx(1.0) and f["entropy"] == pytest.approx(0.0, abs=1e-9)
    _, f = type_of(block_map())
    assert f["own"] == pytest.approx(1.0) and f["spread"] == pytest.approx(1.0) and f["special"] == pytest.approx(0.0)
    _, f = type_of(uniform_map())  # 5 of the 10 words a word row sees are its own part's
    assert f["own"] == pytest.approx(0.5) and f["special"] == pytest.approx(3 / L)
    assert f["diagonal"] == pytest.approx((2 * L - 2) / L / L)


def test_a_wide_band_is_no_block():
    """Rows uniform over i-3..i+3 of two 40-token parts: in-part (own ~0.9) but a band (spread ~0.53)."""
    classes = torch.tensor([0] + [2] * 40 + [1] + [3] * 40 + [1])
    n = len(classes)
    i = torch.arange(n)
    p = rows_normalised(((i[:, None] - i[None, :]).abs() <= 3).float())
    feat = map_features(p[None, None].double(), classes[None])
    assert float(feat["own"][0, 0]) > 0.85 and 0.45 < float(feat["spread"][0, 0]) < 0.6
    assert TYPES[int(classify(feat)[0, 0])] == "Heterogeneous"
    assert TYPES[int(classify(feat, Thresholds(spread=0.5))[0, 0])] == "Block"


def test_block_needs_two_parts():
    """The same in-part spread map on a single sentence is no Block (there is one part)."""
    p = rows_normalised((SINGLE >= 2).float().expand(L, L).clone())
    kind, feat = type_of(p, SINGLE)
    assert kind == "Heterogeneous" and feat["own"] == pytest.approx(1.0) and not feat["two_parts"]


def test_thresholds_move_the_boundaries():
    """An 80/20 diagonal/[SEP] mix (diagonal share 0.72 of the structure, as the specials
    next to words add to both) is V+D by default, Diagonal once the mix share is 0.3."""
    p = 0.8 * diagonal_map() + 0.2 * sep_map()
    assert type_of(p)[0] == "Vertical+Diagonal"
    assert type_of(p, t=Thresholds(mix=0.3))[0] == "Diagonal"


# ----------------------------------------------------------------------------- the CNN


def test_resize_map_keeps_the_picture():
    p = diagonal_map().numpy()
    r = pattern_cnn.resize_map(p, 32)
    assert r.shape == (32, 32) and r.max() == pytest.approx(1.0)
    i, j = np.indices(r.shape)
    assert r[np.abs(i - j) <= 5].sum() > 0.95 * r.sum()  # the line stays near the diagonal (a token: 2.5 cells)
    big = np.eye(100)
    assert pattern_cnn.resize_map(big, 32).argmax(1).tolist() == list(range(32))


def test_cnn_learns_generated_types(single_thread):
    """The CNN of section 4.1 learns the five shapes from generated maps with known labels."""
    maps, labels = pattern_cnn.synthetic_set(600, seed=0)
    model = pattern_cnn.train_cnn(maps, labels, epochs=6, seed=0)
    test_maps, test_labels = pattern_cnn.synthetic_set(200, seed=1)
    s = pattern_cnn.scores(test_labels, pattern_cnn.predict(model, test_maps))
    assert s["accuracy"] >= 0.9, s
    assert min(s["f1_per_type"].values()) >= 0.75, s


def test_labels_file_round_trip_and_errors(tmp_path):
    maps, labels = pattern_cnn.synthetic_set(10, seed=0)
    pattern_cnn.save_labels(tmp_path / "l.npz", maps, labels, meta={"from": "test"})
    back, back_labels, meta = pattern_cnn.load_labels(tmp_path / "l.npz")
    assert np.allclose(back, maps, atol=1e-3) and (back_labels == labels).all() and meta == {"from": "test"}
    np.savez(tmp_path / "bad.npz", maps=maps)
    with pytest.raises(ValueError, match="not a labels file"):
        pattern_cnn.load_labels(tmp_path / "bad.npz")
