"""The viewer on a decoder's layers: the band of keys each row sees (token and word level), the
maps recomputed under the layer's own layout (causal, window, grouped-query) against the eager
oracle's statistics, and the page in a real browser: a causal map is a triangle, a windowed one
a band, whose cells outside are left transparent (not drawn as zeros). The whole model path
(`view_data` on a tiny Llama) is in tests/test_decoder_run.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_view_browser import browser, open_page  # noqa: F401  (the browser fixture)

from bertscope.kernels.backends import attention_stats
from bertscope.kernels.reference import stats_from_probs
from bertscope.kernels.spec import AttentionLayout, StatsSpec
from bertscope.view import SCALE, bands, quantize_rows, render, token_map

CAUSAL = AttentionLayout(causal=True)
WINDOW = AttentionLayout(causal=True, window=(1, 0), n_key_value_heads=1)


def test_bands_by_hand():
    # 5 tokens: <s> un believ ably . -> units <s>, "unbelievably", "." in text order
    token_unit = [0, 1, 1, 1, 2]
    token, word = bands([AttentionLayout(), CAUSAL, WINDOW], 5, token_unit)
    assert token[0] is None and word[0] is None  # a plain layer: every key
    assert token[1] == [[0, 0], [0, 1], [0, 2], [0, 3], [0, 4]]
    assert word[1] == [[0, 0], [0, 1], [0, 2]]  # a word row sees what any of its tokens sees
    assert token[2] == [[0, 0], [0, 1], [1, 2], [2, 3], [3, 4]]
    assert word[2] == [[0, 0], [0, 1], [1, 2]]  # "un" sees <s>; "." sees "ably" only, of the word


@pytest.mark.parametrize("layout", [CAUSAL, WINDOW, AttentionLayout(window=(1, 2))])
def test_token_map_against_the_oracle(layout):
    g = torch.Generator().manual_seed(0)
    H, L, D = 2, 7, 8
    kv = layout.n_key_value_heads or H
    q, k, v = (torch.randn(1, n, L, D, generator=g) for n in (H, kv, kv))
    valid = torch.ones(1, L, dtype=torch.bool)
    key_class = torch.zeros(1, L, dtype=torch.long)
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=1, entropy=True, keep_qk=True)
    _, stats = attention_stats(q, k, v, valid, key_class, spec, backend="eager", layout=layout)
    p = token_map(stats, valid)  # (H, L, L)
    assert torch.allclose(p.sum(-1), torch.ones(H, L, dtype=torch.float64))
    ref = stats_from_probs(p[None], valid, key_class, spec, layout)  # the oracle's statistics of the page's map
    assert torch.allclose(ref.entropy.float(), stats.entropy, atol=1e-5)
    assert torch.allclose(ref.offset_mass.float(), stats.offset_mass, atol=1e-6)
    token, _ = bands([layout], L, list(range(L)))
    for i, (lo, hi) in enumerate(token[0]):  # nothing outside the band
        assert float(p[:, i, :lo].abs().sum() + p[:, i, hi + 1:].abs().sum()) == 0.0


def decoder_page_data(n=6):
    """A 2-layer x 1-head page: layer 1 causal, layer 2 a causal window of 2; rows uniform over
    what they see; every word one token (the page reuses the token maps at word level)."""
    layouts = [CAUSAL, WINDOW]
    token_bands, word_bands = bands(layouts, n, list(range(n)))
    maps = []
    for rows in token_bands:
        m = np.zeros((n, n))
        for i, (lo, hi) in enumerate(rows):
            m[i, lo:hi + 1] = 1 / (hi - lo + 1)
        maps.append([quantize_rows(m).ravel().tolist()])
    columns = ["entropy", "uniform_entropy", "kl_uniform", "prev", "self", "first", "punct", "other"]
    stats = [[[1.0, 1.0, 0.0, 0.3, 0.3, 0.3, 0.0, 0.4]], [[0.6, 0.6, 0.0, 0.4, 0.5, 0.1, 0.0, 0.4]]]
    tokens = ["<s>", "The", "cat", "sat", "down", "."]
    return {"model": "tiny-llama", "text": "The cat sat down.", "pair": None, "layers": 2, "heads": 1,
            "scale": SCALE, "from_word": "mean", "tokens": tokens, "token_word": list(range(n)), "words": tokens,
            "uniform_entropy": round(float(np.mean([math.log(i + 1) for i in range(n)])), 4), "columns": columns,
            "stats": stats, "top_class": [["other"], ["self"]], "patterns": None, "pattern_note": "",
            "token_maps": maps, "word_maps": None, "layouts": [x.describe() for x in layouts],
            "token_bands": token_bands, "word_bands": word_bands}


def alpha(page, selector: str) -> np.ndarray:
    """The alpha channel of a canvas, (height, width)."""
    w, h, a = page.eval_on_selector(selector, """c => {
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        const a = []; for (let k = 3; k < d.length; k += 4) a.push(d[k]); return [c.width, c.height, a]; }""")
    return np.asarray(a).reshape(h, w)


def test_causal_maps_are_triangles_and_windows_bands(browser, tmp_path):  # noqa: F811
    data = decoder_page_data()
    path = tmp_path / "view.html"
    path.write_text(render(data), encoding="utf-8")
    errors = []
    page = open_page(browser, path, errors)
    n = len(data["tokens"])
    seen = {1: np.tril(np.ones((n, n))), 2: np.tril(np.ones((n, n))) - np.tril(np.ones((n, n)), -2)}
    for layer, want in seen.items():
        np.testing.assert_array_equal(alpha(page, f"#head-{layer}-1 canvas") > 0, want > 0)
    assert page.is_visible("#unseen-legend") and "causal" in page.inner_text("#layouts")
    page.click("#head-2-1")
    big = alpha(page, "#big")
    c = big.shape[0] // n
    cells = big[c // 2::c, c // 2::c] > 0  # one pixel per cell
    np.testing.assert_array_equal(cells, seen[2] > 0)
    table = page.inner_text("#d-stats")
    assert "first token" in table and "below uniform" in table and "next token" not in table
    assert "uniform entropy ln L" not in table and "window 1 left" in table
    title = page.get_attribute("#head-1-1", "title")
    assert "first token .30" in title and "next" not in title and "uniform 1.00" in title
    page.screenshot(path=str(tmp_path / "decoder.png"))
    assert errors == []
    page.close()
