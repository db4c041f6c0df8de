"""`bertscope view`: every head's attention map for one input, as one offline HTML page.

Unlike a corpus run, the viewer *does* materialise the full (layers, H, L, L) maps: it is
one short input, and seeing the maps is the point. One forward pass through the engine
with the eager reference kernel gives, per layer:
- the head statistics (the heads.csv columns, `analyses.surface.head_table` of this one
  segment's `HeadStats`),
- the word-level maps (`StatsSpec.word_maps`: attention to a word is the sum over its
  tokens, from a word the mean of its tokens' rows, as the probes read them),
- the layer's queries and keys (`StatsSpec.keep_qk`), from which the token-level map is
  recomputed with the eager kernel's own definition, softmax of the masked scores.

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

from bertscope.errors import UserError

TEMPLATE = Path(__file__).with_name("view_template.html")
SCALE = 1000  # maps are embedded in thousandths
DEFAULT_MAX_LEN = 128
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
    from bertscope.engine.loop import segment_units

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
    from bertscope.analyses.surface.command import RunSettings
    from bertscope.engine.accumulate import HeadStats
    from bertscope.engine.loop import stream_batches
    from bertscope.kernels import StatsSpec
    from bertscope.kernels.common import masked_scores

    loaded = scope.loaded
    spec = RunSettings().spec().union(StatsSpec(offsets=(), n_key_classes=loaded.classes.n_classes,
                                                entropy=False, argmax=False, word_maps=True, keep_qk=True))
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    (batch,) = stream_batches(loaded, [segment], spec, from_word, batch_size=1, backend="eager", progress=False)
    stats.add(batch)
    token, word = [], []
    for layer in batch.layers:
        scores = masked_scores(layer.queries, layer.keys, batch.key_valid, layer.scale)  # (1, H, L, L)
        token.append(torch.softmax(scores.double(), dim=-1)[0])  # (H, L, L)
        word.append(layer.word_map[0].double())  # (H, W, W)
    return stats, torch.stack(token).cpu().numpy(), torch.stack(word).cpu().numpy()


def view_data(scope, text: str, pair: str | None = None, max_len: int = DEFAULT_MAX_LEN, from_word: str = "mean",
              patterns: np.ndarray | None = None) -> dict:
    """Everything the page shows, as JSON-ready lists.

    patterns: optional (layers, H) array of pattern-type names (Kovaleva et al.), the hook
    for pattern types per input; None shows "not computed yet".
    """
    from bertscope.analyses.surface import stats as surface
    from bertscope.models.loading import model_name

    loaded, tokenizer = scope.loaded, scope.tokenizer
    check_text(text, pair, tokenizer, max_len, loaded.max_len)
    (segment,) = scope.segments([text if pair is None else (text, pair)], max_len=max_len)
    stats, token_maps, word_maps = attention_maps(scope, segment, from_word)
    assert not segment.truncated  # check_text refused what does not fit
    order, token_unit = display_order(segment)
    word_maps = word_maps[..., order, :][..., :, order]  # (layers, H, W, W) in text order
    tokens = tokenizer.convert_ids_to_tokens(segment.input_ids)
    units = [""] * len(order)  # a unit's label: its word, or the special token itself
    for t, u in enumerate(token_unit):
        units[u] = segment.words[segment.word_ids[t]] if segment.word_ids[t] >= 0 else tokens[t]
    table = surface.head_table(stats)
    Ly, H = loaded.n_layers, loaded.n_heads
    if patterns is not None and np.shape(patterns) != (Ly, H):
        raise ValueError(f"patterns must have shape {(Ly, H)}, got {np.shape(patterns)}")
    return {
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
        "columns": list(STAT_COLUMNS),
        "stats": [[[round(float(table[c][l, h]), 4) for c in STAT_COLUMNS] for h in range(H)] for l in range(Ly)],
        "top_class": [[KEY_CLASSES[int(np.argmax([table[c][l, h] for c in KEY_CLASSES]))] for h in range(H)]
                      for l in range(Ly)],
        "patterns": None if patterns is None else [[str(p) for p in row] for row in np.asarray(patterns)],
        "pattern_note": PATTERN_NOTE,
        # maps: [layer][head] -> one flat row-major list of ints, rows sum to `scale`
        "token_maps": quantize_rows(token_maps).reshape(Ly, H, -1).tolist(),
        # when every word is one token the word maps are the token maps: embedded once
        "word_maps": None if len(units) == len(tokens) else quantize_rows(word_maps).reshape(Ly, H, -1).tolist(),
    }


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
