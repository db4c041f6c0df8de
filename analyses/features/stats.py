"""Attention to linguistic features (Kovaleva et al. 2019, section 4.4, Figures 6-7).

The paper's score of a feature for one head and one input: the attention all tokens give to
one token of the feature (that token's column of the map, summed over the query rows),
divided by the sequence length; with several tokens of the feature in the input, the
maximum; inputs without the feature are skipped. Averaged over inputs it says whether the
head draws a vertical stripe on that kind of token. The kernels stream exactly that column
sum (`RowStats.column_mass`, (B, H, L)), so the score needs no map.

Features and their tokens:
    noun, verb, pron, punct   gold UPOS NOUN, VERB, PRON, PUNCT on treebanks; on raw text
                              (tasks) only punct, for words made of punctuation characters
                              (punct is not in the paper's list: its Figure 7 discussion
                              names punctuation as what [CLS] attends to in some tasks)
    nsubj, obj                gold UD relations nsubj (with subtypes: nsubj:pass, ...) and obj;
                              the word is the argument's head word, as UD marks it
    neg                       the paper's negation list (`NEGATION`), literally: doesn't,
                              aren't, cannot ... are not in it
    cls, sep                  the special tokens

A word of several tokens: every token of the word is a token of the feature, and the score
takes the maximum over them like over several words. The paper scores tokens (it ran on
WordPiece inputs), a stripe is drawn by one column, and summing a word's columns would
let long words score higher for being split; the max keeps a feature of rare, split words
comparable with [CLS] and [SEP], which are one token each.

Features overlap (a noun is often a subject too) but a token has one class, so a token's
class is the combination of the features it has (`feature_scheme`); a feature is the set of
classes that include it.
"""
from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from bertscope.engine.batch import BatchContext
from bertscope.files import write_npz
from bertscope.kernels.spec import StatsSpec
from bertscope.text.token_classes import TokenClasses, tag_ids, tag_scheme

# the paper's footnote 6, verbatim
NEGATION = ("neither", "nor", "not", "never", "none", "don't", "won't", "didn't", "hadn't", "haven't", "can't",
            "isn't", "wasn't", "shouldn't", "couldn't", "nothing", "nowhere")
APOSTROPHES = ("\u2019", "\u2018", "`")  # spelled "'" before matching

POS = ("noun", "verb", "pron", "punct")  # UPOS features (a word has at most one)
RELATIONS = ("nsubj", "obj")  # dependency features (at most one)
WORD_FEATURES = POS + RELATIONS + ("neg",)
SPECIAL = ("cls", "sep")
FEATURES = SPECIAL + WORD_FEATURES
TASK_FEATURES = SPECIAL + ("punct", "neg")  # what raw text (no gold tags) can have
NONE = "-"


def _combo(pos: str, rel: str, neg: bool) -> str:
    return f"{pos}|{rel}|{'neg' if neg else NONE}"


def feature_scheme() -> TokenClasses:
    """[CLS], [SEP], one class per combination of (POS or none, relation or none, negation or
    not) but the empty one, and "other" (words with no feature). Row group: [CLS] rows
    (Figure 7 reads what the [CLS] query attends to)."""
    combos = [_combo(p, r, n) for p, r, n in itertools.product(POS + (NONE,), RELATIONS + (NONE,), (False, True))]
    combos.remove(_combo(NONE, NONE, False))
    return tag_scheme(combos, "features", row_groups=("cls",))


SCHEME = feature_scheme()
# the statistics the kernels compute for this family: each key's column mass (the score) and the
# class masses of the [CLS] rows (cls_mass)
NEEDS = StatsSpec(n_key_classes=SCHEME.n_classes, column_mass=True, class_mass=True)


def feature_classes(scheme: TokenClasses = SCHEME) -> dict[str, list[int]]:
    """Feature -> the class ids of its tokens."""
    out = {"cls": [scheme.names.index("cls")], "sep": [scheme.names.index("sep")]}
    for f in WORD_FEATURES:
        out[f] = [c for c, name in enumerate(scheme.names) if "|" in name and f in name.split("|")]
    return out


def negation_words(words: Sequence[str]) -> list[bool]:
    """Per word, whether it is (part of) a negation word of `NEGATION`, matched lower-cased.

    A contraction may come as one word ("don't"), as a treebank's two syntactic words
    ("do" + "n't", "ca" + "n't") or as a pre-tokenizer's three ("don" + "'" + "t"): 2 or 3
    consecutive words whose concatenation holds an apostrophe and spells a listed form are
    all marked. Curly apostrophes count as "'".
    """
    norm = [w.lower() for w in words]
    for a in APOSTROPHES:
        norm = [w.replace(a, "'") for w in norm]
    listed = set(NEGATION)
    flags = [w in listed for w in norm]
    for k in (2, 3):
        for i in range(len(norm) - k + 1):
            joined = "".join(norm[i : i + k])
            if "'" in joined and joined in listed:
                flags[i : i + k] = [True] * k
    return flags


def is_punctuation(word: str) -> bool:
    """A word of punctuation characters only (Unicode category P*)."""
    return bool(word) and all(unicodedata.category(ch).startswith("P") for ch in word)


def word_tags(words: Sequence[str], upos: Sequence[str] | None = None, deprels: Sequence[str] | None = None
              ) -> list[str]:
    """Each word's class name under `SCHEME`: gold UPOS and relation when given (treebanks),
    else punctuation from the characters (raw text); negation from the words themselves."""
    neg = negation_words(words)
    tags = []
    for i, word in enumerate(words):
        if upos is not None:
            pos = upos[i].lower() if upos[i].lower() in POS else NONE
        else:
            pos = "punct" if is_punctuation(word) else NONE
        rel = NONE
        if deprels is not None:
            base = deprels[i].split(":")[0]
            rel = base if base in RELATIONS else NONE
        tags.append(_combo(pos, rel, neg[i]))
    return tags


def set_classes(segment, tags: Sequence[str], tokenizer, scheme: TokenClasses = SCHEME):
    """Give every token of `segment` its class (`Segment.token_class`); returns the segment."""
    segment.token_class = tag_ids(segment, tags, scheme, tokenizer)
    return segment


# ----------------------------------------------------------------------------- the accumulator

class FeatureScores:
    """Per (feature, layer, head) sums over inputs that have the feature; an `Accumulator`.

    score_sum  (F, Ly, H)  sum over inputs of max over the feature's tokens j of
                           column_mass_j / n_tokens (Kovaleva et al.'s score)
    cls_sum    (F, Ly, H)  sum over inputs of the [CLS] row's attention mass on all of the
                           feature's tokens (Figure 7; a row sums to 1, so no length division)
    top_count  (F, Ly, H)  inputs whose most-attended token (largest column) is of the feature
    n_inputs   (F,)        inputs with at least one token of the feature
    n_total                inputs seen
    uniform_sum            sum over inputs of 1 / n_tokens: the score of any token under
                           uniform attention, the level a feature nobody stripes sits at
    All are sums, so shards and checkpoints merge by addition.
    """

    ARRAYS = ("score_sum", "cls_sum", "top_count", "n_inputs")

    def __init__(self, n_layers: int, n_heads: int, scheme: TokenClasses = SCHEME,
                 features: Sequence[str] = FEATURES):
        self.scheme, self.features = scheme, tuple(features)
        classes = feature_classes(scheme)
        unknown = [f for f in self.features if f not in classes]
        if unknown:
            raise ValueError(f"unknown features {unknown}; choose from {', '.join(classes)}")
        # (F, C) bool: which classes make up each feature
        self.members = torch.zeros(len(self.features), scheme.n_classes, dtype=torch.bool)
        for f, name in enumerate(self.features):
            self.members[f, classes[name]] = True
        F = len(self.features)
        self.score_sum = np.zeros((F, n_layers, n_heads))
        self.cls_sum = np.zeros((F, n_layers, n_heads))
        self.top_count = np.zeros((F, n_layers, n_heads))
        self.n_inputs = np.zeros(F)
        self.n_total = 0
        self.uniform_sum = 0.0
        self.batches_done = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.score_sum.shape[1:]

    def add(self, batch: BatchContext):
        if batch.classes.names != self.scheme.names:
            raise ValueError(f"batch classes {batch.classes.source!r} are not the feature scheme")
        valid = batch.key_valid  # (B, L)
        of = self.members.to(batch.key_class.device)[:, batch.key_class] & valid  # (F, B, L) token is of feature f
        has = of.any(-1)  # (F, B)
        n = batch.n_tokens.double()  # (B,)
        cls_group = batch.classes.group_names.index("cls")
        for layer, stats in enumerate(batch.layers):
            share = stats.column_mass.double() / n[:, None, None]  # (B, H, L)
            best = torch.where(of[:, :, None, :], share[None], float("-inf")).amax(-1)  # (F, B, H)
            best = torch.where(has[..., None], best, 0.0)  # inputs without the feature add nothing
            self.score_sum[:, layer] += best.sum(1).cpu().numpy()
            # the [CLS] row's mass per class, summed into features: (B, H, C) @ (C, F)
            cls_mass = batch.segment_sums(layer)["class_mass"][:, :, cls_group]  # (B, H, C)
            on = torch.einsum("bhc,fc->fbh", cls_mass, self.members.double().to(cls_mass.device))  # (F, B, H)
            self.cls_sum[:, layer] += (on * has[..., None]).sum(1).cpu().numpy()
            top = share.masked_fill(~valid[:, None, :], -1.0).argmax(-1)  # (B, H) most-attended position
            rows = torch.arange(len(top), device=top.device)[:, None]  # (B, 1)
            top_of = of[:, rows, top]  # (F, B, H): whether that token is of feature f
            self.top_count[:, layer] += top_of.sum(1).double().cpu().numpy()
        self.n_inputs += has.sum(1).double().cpu().numpy()
        self.n_total += batch.size
        self.uniform_sum += float((1 / n).sum())

    # -- results

    def scores(self) -> np.ndarray:
        """(F, Ly, H) mean score over the inputs with the feature (NaN where none had it)."""
        return self._mean(self.score_sum)

    def cls_scores(self) -> np.ndarray:
        """(F, Ly, H) mean [CLS]-row mass on the feature over the inputs with it."""
        return self._mean(self.cls_sum)

    def top_shares(self) -> np.ndarray:
        """(F, Ly, H) share of all inputs whose most-attended token is of the feature."""
        return self.top_count / max(self.n_total, 1)

    def _mean(self, sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n_inputs[:, None, None] > 0, sums / self.n_inputs[:, None, None], np.nan)

    # -- the accumulator protocol

    def merge(self, other: FeatureScores) -> FeatureScores:
        if other.features != self.features or other.shape != self.shape or other.scheme != self.scheme:
            raise ValueError("cannot merge feature scores of different features, schemes or model shapes")
        for name in self.ARRAYS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.n_total += other.n_total
        self.uniform_sum += other.uniform_sum
        self.batches_done += other.batches_done
        return self

    def save(self, path: Path):
        """Write the state atomically (tmp name, then rename)."""
        write_npz(path, **{name: getattr(self, name) for name in self.ARRAYS}, n_total=self.n_total,
                  uniform_sum=self.uniform_sum, batches_done=self.batches_done, features=np.array(self.features),
                  scheme=np.array(list(self.scheme.names)), scheme_source=np.array(self.scheme.source))

    @classmethod
    def load(cls, path: Path) -> FeatureScores:
        try:
            with np.load(Path(path)) as z:
                scheme = TokenClasses(tuple(str(s) for s in z["scheme"]), ("cls",), str(z["scheme_source"]))
                acc = cls(z["score_sum"].shape[1], z["score_sum"].shape[2], scheme, [str(f) for f in z["features"]])
                for name in cls.ARRAYS:
                    setattr(acc, name, z[name].astype(np.float64))
                acc.n_total, acc.batches_done = int(z["n_total"]), int(z["batches_done"])
                acc.uniform_sum = float(z["uniform_sum"])
        except (KeyError, OSError, ValueError) as e:
            raise ValueError(f"{path} is not a feature-score checkpoint ({e})") from None
        return acc

    def all_reduce(self):
        """Sum every torchrun rank's state into each rank's copy."""
        for name in self.ARRAYS:
            t = torch.from_numpy(getattr(self, name))
            dist.all_reduce(t)  # in place on the numpy buffer
        n = torch.tensor([float(self.n_total), self.uniform_sum], dtype=torch.float64)
        dist.all_reduce(n)
        self.n_total, self.uniform_sum = int(n[0].item()), float(n[1].item())
        return self

    # -- tables

    def rows(self, data: str) -> list[dict]:
        """Tidy rows: data, feature, layer, head, score, cls_mass, top_share, n_inputs (layers
        and heads from 1; features no input had are left out)."""
        score, cls_mass, top = self.scores(), self.cls_scores(), self.top_shares()
        out = []
        for f, name in enumerate(self.features):
            if not self.n_inputs[f]:
                continue
            for layer, head in np.ndindex(*self.shape):
                out.append(dict(data=data, feature=name, layer=layer + 1, head=head + 1,
                                score=float(score[f, layer, head]), cls_mass=float(cls_mass[f, layer, head]),
                                top_share=float(top[f, layer, head]), n_inputs=int(self.n_inputs[f])))
        return out


COLUMNS = ("data", "feature", "layer", "head", "score", "cls_mass", "top_share", "n_inputs")


def summary(acc: FeatureScores) -> dict:
    """Headline numbers of one data set: per feature the inputs, the best head and its score,
    the mean score over heads; per head which feature scores highest; and the share of
    (input, head) pairs whose most-attended token is [CLS] or [SEP]."""
    score = acc.scores()
    Ly, H = acc.shape
    out = {"inputs": int(acc.n_total), "uniform_score": acc.uniform_sum / max(acc.n_total, 1), "features": {}}
    for f, name in enumerate(acc.features):
        if not acc.n_inputs[f]:
            continue
        layer, head = np.unravel_index(np.nanargmax(score[f]), score[f].shape)
        out["features"][name] = dict(n_inputs=int(acc.n_inputs[f]), mean=float(np.nanmean(score[f])),
                                     best_head=f"{layer + 1}-{head + 1}", best=float(score[f, layer, head]),
                                     top_share=float(acc.top_shares()[f].mean()))
    present = [f for f in range(len(acc.features)) if acc.n_inputs[f]]
    winner = np.asarray(present)[np.nanargmax(score[present], axis=0)]  # (Ly, H) feature index
    out["heads_won"] = {acc.features[f]: int((winner == f).sum()) for f in present}
    special = [acc.features.index(s) for s in SPECIAL if s in acc.features]
    out["heads_won_by_special"] = int(np.isin(winner, special).sum())
    out["heads"] = Ly * H
    # the special tokens are one class each and never overlap: their top shares add up
    out["top_special_share"] = float(sum(acc.top_shares()[f].mean() for f in special))
    return out
