"""plot_surface writes five readable PNGs for any model shape."""
from __future__ import annotations

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np

from bertscope.analyses.surface.plots import plot_surface

FIGURES = {
    "fig_tokens_by_layer.png", "fig_entropy_by_layer.png", "fig_offsets_heatmap.png",
    "fig_special_heatmap.png", "fig_entropy_heatmap.png",
}
MASS = ("prev", "self", "next", "cls", "sep", "punct", "other", "sep_sep", "rest_sep",
        "argmax_prev", "argmax_self", "argmax_next", "argmax_cls", "argmax_sep", "argmax_punct")


def synthetic_table(n_layers: int, n_heads: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random masses with a few planted heads: 2-2 looks back, 1-1 attends to [CLS]."""
    rng = np.random.default_rng(seed)
    shape = (n_layers, n_heads)
    table = {c: rng.uniform(0, 0.2, shape) for c in MASS}
    table["layer"] = np.repeat(np.arange(1, n_layers + 1)[:, None], n_heads, axis=1)
    table["head"] = np.repeat(np.arange(1, n_heads + 1)[None, :], n_layers, axis=0)
    table["entropy"] = rng.uniform(0.5, 4.0, shape)
    table["cls_entropy"] = rng.uniform(1.0, 4.5, shape)
    table["n_tokens"] = np.full(shape, 1000, dtype=np.int64)
    table["cls"][0, 0] = 0.9
    if n_layers > 1 and n_heads > 1:
        table["prev"][1, 1] = 0.85
        table["sep"][-1, :] = 0.6
    return table


def check_figures(paths, out_dir):
    assert {p.name for p in paths} == FIGURES
    for p in paths:
        assert p.parent == out_dir and p.is_file()
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width = mpimg.imread(p).shape[:2]
        assert width > 300 and height > 300, (p.name, width, height)


def test_plots_3x4(tmp_path):
    plt.close("all")  # figures another test left open are not plot_surface's
    paths = plot_surface(synthetic_table(3, 4), tmp_path, "test-3x4",
                         uniform_entropy=np.log(64), cls_uniform_entropy=np.log(64))
    check_figures(paths, tmp_path)
    assert plt.get_fignums() == []  # every figure closed


def test_plots_1x1_without_baselines(tmp_path):
    out = tmp_path / "nested" / "dir"  # created on demand
    check_figures(plot_surface(synthetic_table(1, 1), out, "test-1x1"), out)


def test_plots_bert_base_shape(tmp_path):
    table = synthetic_table(12, 12)
    table["cls_entropy"][:, 3] = np.nan  # a head whose [CLS] row was never seen
    paths = plot_surface(table, tmp_path, "test-12x12", uniform_entropy=4.8)
    check_figures(paths, tmp_path)
