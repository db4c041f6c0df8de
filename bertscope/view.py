"""`bertscope view`: every head's attention map for one input, as one offline HTML page.

Unlike a corpus run, the viewer *does* materialise the full (layers, H, L, L) maps: it is
one short input, and seeing the maps is the point. One forward pass through the engine
with the eager reference kernel gives, per layer:
- the head statistics (the heads.csv columns, `bertscope.engine.head_table` of this one
  segment's `HeadStats`),
- the word-level maps (`StatsSpec.word_maps`: attention to a word is the sum over its
  tokens, from a word the mean of its tokens' rows, as the probes read them),
- the layer's queries and keys (`StatsSpec.keep_qk`), from which the token-level map is
  recomputed with the eager kernel's own definition, softmax of the masked scores.

A decoder's layers (any `AttentionLayout` but the plain one: causal, a sliding window,
grouped-query) are recomputed with their own mask, and the page gets, per layer, the band of
keys each row sees (`token_bands`, `word_bands`): cells outside it are drawn blank, not as
zeros, so a causal map is a triangle and a windowed one a band. Its statistics are the
decoder's heads.csv columns (`first`, `uniform_entropy`, `kl_uniform`, no `next`).

Maps are embedded as integers in thousandths, rounded by largest remainder so that every
row still sums to exactly 1000: the page stays small (a few hundred KB for a sentence) and
a row never looks like it leaks or gains mass.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import torch

from bertscope.cli.args import VIEW_MAX_LEN
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.head_table import head_table, run_spec
from bertscope.engine.loop import segment_units, stream_batches
from bertscope.errors import UserError
from bertscope.kernels.common import masked_scores
from bertscope.kernels.spec import StatsSpec, visible_mask
from bertscope.models.loading import model_name

TEMPLATE = Path(__file__).with_name("view_template.html")
SCALE = 1000  # maps are embedded in thousandths
DEFAULT_MAX_LEN = VIEW_MAX_LEN  # `bertscope view --max-len`'s default, named in bertscope.cli.args
STAT_COLUMNS = ("entropy", "prev", "self", "next", "cls", "sep", "punct", "other", "sep_sep", "rest_sep", "cls_entropy")
KEY_CLASSES = ("cls", "sep", "punct", "other")  # the "top key class" is the one with the most mass
PATTERN_NOTE = ("Kovaleva et al. (2019) pattern types (vertical, diagonal, vertical + diagonal, block, "
                "heterogeneous) are not computed yet for this view (`bertscope patterns` classifies each head over "
                "a data set): this is the place they will be shown.")


def quantize_rows(p: np.ndarray, scale: int = SCALE) -> np.ndarray:
    """(..., n) rows summing to 1 -> int rows summing to exactly `scale` (largest remainder:
    floor every entry, then give the missing units to the largest fractional parts)."""
    x = np.asarray(p, dtype=np.float64) * scale
    x = x * (scale / np.maximum(x.sum(-1, keepdims=True), 1e-12))  # renormalise float error away
    q = np.floor(x).astype(np.int64)
    missing = scale - q.sum(-1)  # (...,) in [0, n)
    rank = np.argsort(np.argsort(-(x - q), axis=-1, kind="stable"), axis=-1, kind="stable")  # 0 = largest remainder
    return q + (rank < missing[..., None])


def check_request(text: str, pair: str | None, out: str | Path | None = None):
    """The mistakes that need no model: empty text, an --out that cannot be written."""
    if not text.strip():
        raise UserError("TEXT is empty")
    if pair is not None and not pair.strip():
        raise UserError("--pair is empty")
    if out is not None:
        out = Path(out)
        if out.is_dir():
            raise UserError(f"--out {out} is a directory; give a file name such as {out / 'view.html'}")
        if not out.parent.is_dir():
            raise UserError(f"the folder of --out does not exist: {out.parent}")


def check_text(text: str, pair: str | None, tokenizer, max_len: int, model_max: int) -> int:
    """Number of tokens of the input, specials included; UserError if empty or too long."""
    check_request(text, pair)
    if max_len > model_max:
        raise UserError(f"--max-len {max_len} is more than the model takes ({model_max} tokens)")
    n = len(tokenizer(text, pair)["input_ids"])
    if n > max_len:
        more = f" (raise --max-len, up to {model_max})" if max_len < model_max else " (the model's limit)"
        raise UserError(f"the input has {n} tokens with its special tokens, more than --max-len {max_len}{more}")
    return n


def display_order(segment) -> tuple[list[int], list[int]]:
    """Units (words, then specials: the engine's word-map order) rearranged into text order.

    Returns (order, each token's unit position in text order): maps in the engine's unit
    order become text order with `m[..., order, :][..., :, order]`.
    """
    units, _ = segment_units(segment)
    first = {}
    for t, u in enumerate(units):
        first.setdefault(u, t)
    order = sorted(first, key=first.get)  # units by their first token
    position = {u: i for i, u in enumerate(order)}
    return order, [position[u] for u in units]


def attention_maps(scope, segment, from_word: str = "mean"):
    """One forward pass with the eager kernel: (HeadStats, token maps (layers, H, L, L),
    word maps (layers, H, W, W) in the engine's unit order), float64 numpy."""
    loaded = scope.loaded
    spec = run_spec().union(StatsSpec(offsets=(), n_key_classes=loaded.classes.n_classes,
                                                entropy=False, argmax=False, word_maps=True, keep_qk=True))
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    (batch,) = stream_batches(loaded, [segment], spec, from_word, batch_size=1, backend="eager", progress=False)
    stats.add(batch)
    token, word = [], []
    for layer in batch.layers:
        token.append(token_map(layer, batch.key_valid))  # (H, L, L)
        word.append(layer.word_map[0].double())  # (H, W, W)
    return stats, torch.stack(token).cpu().numpy(), torch.stack(word).cpu().numpy()


def token_map(layer, key_valid: torch.Tensor) -> torch.Tensor:
    """(H, L, L) float64 attention of one segment's layer, from its kept q and k: the eager kernel's
    definition, under the layer's own layout (causal, window; k heads shared by query heads)."""
    layout = layer.layout
    if layout.is_plain:
        scores = masked_scores(layer.queries, layer.keys, key_valid, layer.scale)  # (1, H, L, L)
        return torch.softmax(scores.double(), dim=-1)[0]
    keys = layer.keys.repeat_interleave(layout.group_size(layer.queries.shape[1]), dim=1)  # (1, H, L, D)
    scores = torch.matmul(layer.queries, keys.transpose(-1, -2)).double() * layer.scale  # (1, H, L, L)
    scores = scores.masked_fill(~visible_mask(key_valid, layout), float("-inf"))
    return torch.softmax(scores, dim=-1)[0]  # every row of one unpadded segment sees itself: no NaN


def bands(layouts, n_tokens: int, token_unit: list[int]) -> tuple[list, list]:
    """(token_bands, word_bands): for each layer, [first, last] key each row sees (inclusive), or
    None for a plain layer, at the token level and at the word level (units in text order).

    A word row sees the units that hold any token one of its tokens sees: the tokens' bands are
    contiguous and overlap, so that is a contiguous run of units too."""
    token_bands, word_bands = [], []
    n_units = max(token_unit) + 1
    for layout in layouts:
        if layout.is_plain:
            token_bands.append(None)
            word_bands.append(None)
            continue
        rows = [list(layout.key_band(i, n_tokens)) for i in range(n_tokens)]
        units = [[n_units, -1] for _ in range(n_units)]
        for t, (lo, hi) in enumerate(rows):
            u = units[token_unit[t]]
            u[0], u[1] = min(u[0], token_unit[lo]), max(u[1], token_unit[hi])
        token_bands.append(rows)
        word_bands.append(units)
    return token_bands, word_bands


def view_data(scope, text: str, pair: str | None = None, max_len: int = DEFAULT_MAX_LEN, from_word: str = "mean",
              patterns: np.ndarray | None = None) -> dict:
    """Everything the page shows, as JSON-ready lists.

    patterns: optional (layers, H) array of pattern-type names (Kovaleva et al.), the hook
    for pattern types per input; None shows "not computed yet".
    """
    loaded, tokenizer = scope.loaded, scope.tokenizer
    check_text(text, pair, tokenizer, max_len, loaded.max_len)
    (segment,) = scope.segments([text if pair is None else (text, pair)], max_len=max_len)
    stats, token_maps, word_maps = attention_maps(scope, segment, from_word)
    layouts = stats.layouts  # None for an encoder's plain attention
    assert not segment.truncated  # check_text refused what does not fit
    order, token_unit = display_order(segment)
    word_maps = word_maps[..., order, :][..., :, order]  # (layers, H, W, W) in text order
    tokens = tokenizer.convert_ids_to_tokens(segment.input_ids)
    units = [""] * len(order)  # a unit's label: its word, or the special token itself
    for t, u in enumerate(token_unit):
        units[u] = segment.words[segment.word_ids[t]] if segment.word_ids[t] >= 0 else tokens[t]
    table = head_table(stats)
    Ly, H = loaded.n_layers, loaded.n_heads
    if patterns is not None and np.shape(patterns) != (Ly, H):
        raise ValueError(f"patterns must have shape {(Ly, H)}, got {np.shape(patterns)}")
    columns, key_classes = STAT_COLUMNS, KEY_CLASSES
    if layouts is not None:  # a decoder's columns: those its table has (`head_table.layout_table`)
        columns = tuple(c for c in ("entropy", "uniform_entropy", "kl_uniform") + STAT_COLUMNS[1:] + ("first",)
                        if c in table)
        key_classes = tuple(c for c in ("first",) + KEY_CLASSES if c in table)
    data = {
        "model": model_name(loaded.path),
        "text": text,
        "pair": pair,
        "layers": Ly,
        "heads": H,
        "scale": SCALE,
        "from_word": from_word,
        "tokens": tokens,
        "token_word": token_unit,  # each token's word (unit) in text order
        "words": units,  # words and special tokens in text order
        "uniform_entropy": round(float(np.log(len(tokens))), 4),
        "columns": list(columns),
        "stats": [[[round(float(table[c][l, h]), 4) for c in columns] for h in range(H)] for l in range(Ly)],
        "top_class": [[key_classes[int(np.argmax([table[c][l, h] for c in key_classes]))] for h in range(H)]
                      for l in range(Ly)],
        "patterns": None if patterns is None else [[str(p) for p in row] for row in np.asarray(patterns)],
        "pattern_note": PATTERN_NOTE,
        # maps: [layer][head] -> one flat row-major list of ints, rows sum to `scale`
        "token_maps": quantize_rows(token_maps).reshape(Ly, H, -1).tolist(),
        # when every word is one token the word maps are the token maps: embedded once
        "word_maps": None if len(units) == len(tokens) else quantize_rows(word_maps).reshape(Ly, H, -1).tolist(),
    }
    if layouts is not None:  # a decoder's page only: an encoder's data stays as it was
        data["layouts"] = [layout.describe() for layout in layouts]
        data["token_bands"], data["word_bands"] = bands(layouts, len(tokens), token_unit)
        data["uniform_entropy"] = round(stats.uniform_entropy(), 4)  # mean over layers of mean ln n_visible
    return data


def render(data: dict) -> str:
    """The page: the template with the data embedded as one JSON literal."""
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    title = html.escape(f"bertscope view: {data['text'][:60]}")
    page = TEMPLATE.read_text(encoding="utf-8")
    return page.replace("__TITLE__", title).replace("/*__DATA__*/null", payload)


def write_view(scope, text: str, out: str | Path, pair: str | None = None, max_len: int = DEFAULT_MAX_LEN,
               from_word: str = "mean") -> Path:
    """Write the viewer page for one input to `out`; returns its path."""
    check_request(text, pair, out)
    out = Path(out)
    out.write_text(render(view_data(scope, text, pair, max_len, from_word)), encoding="utf-8")
    return out
