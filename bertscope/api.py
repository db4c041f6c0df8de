"""A small API for notebooks: load a model once, then ask for tables.

    import bertscope
    scope = bertscope.load()                          # the embedded all-MiniLM-L6-v2
    heads = scope.stats(["The cat sat.", ("A first part.", "A second one.")])
    rows = scope.per_example(texts)                   # one row per (text, layer, head)
    words, maps = scope.word_maps("The cat sat on the mat.")

Texts are strings or, for an encoder, (a, b) pairs, kept in the order given and made into
segments exactly as `bertscope run` makes a text file's: through the tokenizer's own template,
so an encoder's text is `[CLS] text [SEP]` and a pair `[CLS] a [SEP] b [SEP]` (BERT; RoBERTa:
`<s> a </s></s> b </s>`), and a decoder's text has what its tokenizer puts around it (Gemma-3 a
`<bos>` first, SmolLM2 nothing). The longest segment is the model's context unless `max_len`
says otherwise; a text cut to fit is said (a warning), never silently.
Every method runs the same engine, kernels and accumulators as the command line; the tables
are the CLI's CSV/Parquet columns as pandas DataFrames.
"""
from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertscope.cli.args import NORMS_DEFAULT
from bertscope.engine.head_table import head_table, run_spec, table_rows
from bertscope.engine.loop import EngineOptions, fold, iter_word_maps, run_stats
from bertscope.kernels.backends import resolve_backend
from bertscope.kernels.spec import StatsSpec
from bertscope.models.loading import load_model, model_name
from bertscope.text.corpus import Document
from bertscope.text.segments import SegmentOptions, make_segments
from bertscope.text.token_classes import TokenClasses
from bertscope.text.word_segments import word_segment

logger = logging.getLogger(__name__)

# pandas and pyarrow (per_example's Parquet) are imported inside the methods that return tables:
# `bertscope view` and `scope.word_maps` never pay their start-up.
Text = str | tuple[str, str]


def load(model: str | Path | None = None, device: str = "cpu", backend: str = "auto", **kwargs) -> Scope:
    """A `Scope` over a local checkpoint folder or a Hugging Face Hub id (default: the embedded
    all-MiniLM-L6-v2). Extra keyword arguments go to `bertscope.models.loading.load_model`, e.g.
    `revision` (a Hub id's branch, tag or commit)."""
    return Scope(load_model(model, device=device, **kwargs), backend)


@dataclass(repr=False)
class Scope:
    """A loaded model and the analyses that can be asked of it.

    loaded:  `bertscope.models.loading.LoadedModel` (model, tokenizer, layers, heads, class table)
    backend: statistics kernel ("auto": triton on CUDA, chunked on the CPU)
    """

    loaded: object
    backend: str = "auto"

    def __repr__(self) -> str:
        """One line (the default would print the whole model): what is loaded, and how it runs."""
        loaded = self.loaded
        kind = "decoder" if loaded.architecture.causal else "encoder"
        device = next(loaded.model.parameters()).device
        return (f"Scope({model_name(loaded.path)}: {loaded.model_type} {kind}, {loaded.n_layers} layers x "
                f"{loaded.n_heads} heads, context {loaded.max_len}, backend {self.backend}, {device})")

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def gates(self):
        """The model's `bertscope.models.gates.HeadGates`: `.xi` (layers, H) float scales each head's
        output, `.uniform` (layers, H) bool gives a head uniform attention (both also (B, layers, H):
        one choice per sequence); they act on every
        forward (`.requires_grad_()` for d loss / d xi, `.reset()` to undo)."""
        return self.loaded.gates

    def segments(self, texts: Sequence[Text], max_len: int | None = None, token_types: str = "pair") -> list:
        """`Segment`s of `texts`, in the order given. `max_len`: the longest segment in tokens,
        special tokens included (default: the model's context); a text too long for it is cut at
        a sentence boundary, as the CLI does, and a warning says how many were."""
        max_len = self.loaded.max_len if max_len is None else max_len
        if isinstance(texts, (str, tuple)):
            raise TypeError("texts must be a list of strings or (a, b) pairs, not a single text")
        docs = []
        for i, t in enumerate(texts):
            parts = [t] if isinstance(t, str) else list(t)
            if len(parts) not in (1, 2) or not all(isinstance(p, str) and p.strip() for p in parts):
                raise ValueError(f"text {i} must be a non-empty string or a pair of them, got {t!r}")
            docs.append(Document(str(i), parts))
        segments, report = make_segments(docs, self.tokenizer, SegmentOptions(
            max_len=max_len, limit=None, token_types=token_types, causal=self.loaded.architecture.causal))
        if len(segments) != len(docs):
            raise ValueError(f"{len(docs) - len(segments)} texts gave no tokens: {report.as_dict()}")
        if report.truncated:
            logger.warning(f"{report.truncated} of {len(docs)} texts were cut to max_len={max_len} tokens: the "
                           f"statistics cover their first {max_len} tokens only "
                           f"(the model takes {self.loaded.max_len})")
        return sorted(segments, key=lambda s: int(s.doc_id))

    def _spec(self, spec: StatsSpec | None, classes: TokenClasses | None) -> StatsSpec:
        if spec is None:  # `bertscope run`'s: with the norm-based twins (docs/norms.md) where the backend has them
            device = next(self.loaded.model.parameters()).device
            spec = run_spec(norms=NORMS_DEFAULT and resolve_backend(self.backend, device) != "triton")
        n = (classes or self.loaded.classes).n_classes
        if spec.n_key_classes != n:
            raise ValueError(f"spec.n_key_classes is {spec.n_key_classes}, the class scheme has {n} classes")
        return spec

    def stats(self, texts: Sequence[Text], spec: StatsSpec | None = None, batch_size: int = 16,
              progress: bool = False, **segment_options):
        """Per-head surface table (the columns of heads.csv) over `texts`, a pandas DataFrame."""
        import pandas as pd  # see the note above Text

        spec = self._spec(spec, None)
        stats = run_stats(self.loaded, self.segments(texts, **segment_options), spec,
                          EngineOptions(batch_size=batch_size, backend=self.backend, progress=progress))
        return pd.DataFrame(table_rows(head_table(stats)))

    def per_example(self, texts: Sequence[Text], spec: StatsSpec | None = None, classes: TokenClasses | None = None,
                    batch_size: int = 16, progress: bool = False, segments: list | None = None, **segment_options):
        """One row per (text, layer, head): the columns of examples.parquet, sorted by
        `segment` (the text's index), layer and head. `classes` is a per-segment scheme
        (`bertscope.text.token_classes`) whose ids are set on `segments` (made from `texts` when
        not given)."""
        import pandas as pd  # see the note above Text

        from bertscope.engine.per_example import PerExampleWriter

        spec = self._spec(spec, classes)
        segments = segments if segments is not None else self.segments(texts, **segment_options)
        with tempfile.TemporaryDirectory() as tmp:
            writer = PerExampleWriter(Path(tmp) / "parts", spec, classes or self.loaded.classes)
            fold(self.loaded, segments, spec, [writer], EngineOptions(batch_size=batch_size, backend=self.backend,
                                                                        progress=progress), classes=classes)
            writer.save()
            writer.finish(Path(tmp) / "examples.parquet")
            table = pd.read_parquet(Path(tmp) / "examples.parquet")
        return table.sort_values(["segment", "layer", "head"]).reset_index(drop=True)

    def word_maps(self, text: Text | Sequence[str], from_word: str = "mean", max_len: int | None = None):
        """(words, maps): the words of one text and its word-level attention maps
        (layers, H, W, W) float32; W counts the words and then the special tokens, rows sum to 1.
        A list of words is taken as given (gold words, e.g. a treebank sentence). `max_len`: as
        in `segments` (default: the model's context)."""
        max_len = self.loaded.max_len if max_len is None else max_len
        if isinstance(text, list):
            segment = word_segment(text, self.tokenizer, max_len)
            if segment is None:
                raise ValueError(f"{len(text)} words do not fit max_len={max_len}")
        else:
            segment = self.segments([text], max_len=max_len)[0]
        ((_, maps),) = iter_word_maps(self.loaded, [segment], from_word=from_word, backend=self.backend, progress=False)
        return list(segment.words), np.asarray(maps)
