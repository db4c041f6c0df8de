"""Coreference by attention heads (Clark et al. 2019, section 4.3 and Table 2).

Antecedent selection (GUM): each head is a zero-parameter coreference system. For a
mention with an antecedent in the same segment, the head "selects" the word its head word
attends to most (the most-attended *other* word, special tokens never candidates, as in
the syntax probe); the selection is right when that word is the head word of one of the
mention's antecedents. The paper's baselines (nearest mention, head-word match, a small
rule-based sieve after Lee et al. 2011) choose among the same candidate mentions and are
scored on exactly the same mentions, by the same rule: is the head word of the chosen
candidate the head word of an antecedent. A baseline that chooses nothing (head-word
match when no candidate shares the head word) is wrong on that mention.

Definitions used throughout (document order = `CorefDocument.mentions` order, which puts
an enclosing mention before the mentions inside it):
- candidates of mention i: the mentions j < i whose head word lies before i's head word.
  This keeps out a mention that encloses i ("his" is no candidate of "his mother", and
  "his mother" none of "his") and any mention sharing i's head word, which a head could
  never select since a word's own row is excluded from the argmax.
- antecedents of i: the candidates of the same entity; i is scored when it has one.
- "most recent" candidate: the one whose head word is closest before i's head word.

GAP: a pronoun and two names A and B; a head picks the name its pronoun word attends to
more (attention to a name = the sum over its words by default, like attention to a split
word is the sum over its tokens; `name="first"` reads only the first word). Only rows
where exactly one name is correct are scored.

Everything here takes arrays and documents and returns counts and tables; no model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from bertscope.files import write_npz
from bertscope.kernels.pooling import word_argmax as kernel_word_argmax

TYPES = ("All", "pronoun", "proper", "nominal")
GUM_BASELINES = ("nearest", "head_match", "sieve")
GAP_BASELINES = ("nearest", "first_name")

# Pronoun features when the treebank gives none (UD FEATS of GUM normally do).
_PRONOUN_LEXICON = {
    # word: (person, number, gender)
    "i": ("1", "Sing", None), "me": ("1", "Sing", None), "my": ("1", "Sing", None),
    "mine": ("1", "Sing", None), "myself": ("1", "Sing", None),
    "we": ("1", "Plur", None), "us": ("1", "Plur", None), "our": ("1", "Plur", None),
    "ours": ("1", "Plur", None), "ourselves": ("1", "Plur", None),
    "you": ("2", None, None), "your": ("2", None, None), "yours": ("2", None, None),
    "yourself": ("2", "Sing", None), "yourselves": ("2", "Plur", None),
    "he": ("3", "Sing", "Masc"), "him": ("3", "Sing", "Masc"), "his": ("3", "Sing", "Masc"),
    "himself": ("3", "Sing", "Masc"),
    "she": ("3", "Sing", "Fem"), "her": ("3", "Sing", "Fem"), "hers": ("3", "Sing", "Fem"),
    "herself": ("3", "Sing", "Fem"),
    "it": ("3", "Sing", "Neut"), "its": ("3", "Sing", "Neut"), "itself": ("3", "Sing", "Neut"),
    "they": ("3", "Plur", None), "them": ("3", "Plur", None), "their": ("3", "Plur", None),
    "theirs": ("3", "Plur", None), "themselves": ("3", "Plur", None),
}
_PLURAL_XPOS = {"NNS", "NNPS"}
_SINGULAR_XPOS = {"NN", "NNP"}
# GUM entity types that are never people (for "it" vs "he"/"she" agreement)
_INANIMATE_ETYPES = {"place", "object", "organization", "abstract", "event", "time", "substance", "plant",
                     "quantity"}


# --- GUM: which mentions are scored, and their gold antecedent head words ------------------


@dataclass
class Anaphor:
    """One scored mention of a segment: its index in `doc.mentions`, head word, type,
    the head words of its antecedents (never its own head word) and its candidates
    (mention indices, most recent last)."""

    index: int
    head: int
    kind: str
    gold: frozenset[int]
    candidates: list[int] = field(default_factory=list)


def anaphors(doc) -> list[Anaphor]:
    """The mentions of `doc` (a `CorefDocument`, usually one segment's window) that have an
    antecedent among their candidates, in document order."""
    found = []
    mentions = doc.mentions
    for i, m in enumerate(mentions):
        candidates = [j for j in range(i) if mentions[j].head < m.head]
        candidates.sort(key=lambda j: (mentions[j].head, j))
        gold = frozenset(mentions[j].head for j in candidates if mentions[j].entity == m.entity)
        if gold:
            found.append(Anaphor(i, m.head, m.kind, gold, candidates))
    return found


def gold_matrix(items: list[Anaphor], n_words: int) -> np.ndarray:
    """(M, n_words) bool: True at the head words of each scored mention's antecedents."""
    gold = np.zeros((len(items), n_words), dtype=bool)
    for row, a in enumerate(items):
        gold[row, list(a.gold)] = True
    return gold


def head_hits(argmax: np.ndarray, heads: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Whether each head selects an antecedent, for every scored mention at once.

    argmax: (layers, H, W) int, each word's most-attended other word (-1: none)
    heads:  (M,) the head word of each scored mention
    gold:   (M, n_words) bool antecedent head words
    returns (layers, H, M) bool
    """
    chosen = argmax[:, :, heads]  # (layers, H, M)
    rows = np.arange(len(heads))[None, None, :]  # (1, 1, M)
    safe = np.clip(chosen, 0, gold.shape[1] - 1)
    return (chosen >= 0) & gold[rows, safe]


def word_argmax(maps: np.ndarray, n_words: int) -> np.ndarray:
    """(layers, H, W, W) word maps -> (layers, H, W): most-attended other word among the
    first `n_words` units (the words; later units are special tokens), lowest on ties, -1
    when there is none: the kernel's `word_argmax` with the words as candidates."""
    candidate = (torch.arange(maps.shape[-1]) < n_words)[None]  # (1, W)
    return kernel_word_argmax(torch.as_tensor(maps), candidate).numpy()


# --- GUM baselines --------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """What a mention's head word says about its referent; None = unknown (agrees with all)."""

    person: str | None = None
    number: str | None = None
    gender: str | None = None  # Masc / Fem / Neut
    animate: bool | None = None

    def agrees(self, other: Agreement) -> bool:
        pairs = ((self.person, other.person), (self.number, other.number), (self.gender, other.gender),
                 (self.animate, other.animate))
        return all(a is None or b is None or a == b for a, b in pairs)


def _feats(raw: str) -> dict[str, str]:
    if not raw or raw == "_":
        return {}
    return dict(item.split("=", 1) for item in raw.split("|") if "=" in item)


def agreement(doc, m, xpos: list[str], feats: list[str]) -> Agreement:
    """Person, number, gender and animacy of mention `m`.

    Pronouns: the UD FEATS of the head word (Person, Number, Gender), else a lexicon
    (he/she/it/they...); a gendered pronoun is animate, "it" inanimate, "I"/"you" animate.
    Other mentions are third person of unknown gender; number from FEATS, else the PTB tag
    (NN/NNP singular, NNS/NNPS plural); animacy from the GUM entity type (person ->
    animate, place/object/organization/... -> inanimate), standing in for the named-entity
    tags and animacy lists of Lee et al. (2011). Those types are gold annotation: without
    animacy the sieve scores 4 points lower on GUM (README).
    """
    word = doc.words[m.head].lower()
    f = _feats(feats[m.head])
    if m.kind == "pronoun":
        person, number, gender = _PRONOUN_LEXICON.get(word, (None, None, None))
        person = f.get("Person", person)
        number = f.get("Number", number)
        gender = f.get("Gender", gender)
        animate = None if gender is None else gender != "Neut"
        if person in ("1", "2"):
            animate = True
        return Agreement(person, number, gender, animate)
    number = f.get("Number")
    if number is None:
        tag = xpos[m.head]
        number = "Plur" if tag in _PLURAL_XPOS else "Sing" if tag in _SINGULAR_XPOS else None
    animate = True if m.etype == "person" else False if m.etype in _INANIMATE_ETYPES else None
    return Agreement("3", number, None, animate)


def baseline_choices(doc, items: list[Anaphor], xpos: list[str], feats: list[str]) -> dict[str, np.ndarray]:
    """The head word each baseline selects for each scored mention: name -> (M,) int, -1
    where a baseline selects nothing (scored wrong).

    nearest      the most recent candidate.
    head_match   the most recent candidate whose head word is the same string (lowercased);
                 nothing when there is none. The paper's baseline has no fallback.
    sieve        after Lee et al. (2011), as the paper describes it: on every mention,
                 pronouns included, the first rule that finds a candidate decides:
                 (1) exact string match of the whole mention (lowercased), (2) head-word
                 match, (3) agreement in person, number, gender and animacy (`agreement`),
                 (4) the nearest candidate. Each rule takes its most recent match.
    """
    mentions = doc.mentions
    words = [w.lower() for w in doc.words]
    text = [" ".join(words[m.start:m.end]) for m in mentions]
    agree: dict[int, Agreement] = {}

    def attrs(j: int) -> Agreement:
        if j not in agree:
            agree[j] = agreement(doc, mentions[j], xpos, feats)
        return agree[j]

    def most_recent(candidates, test):
        return next((j for j in reversed(candidates) if test(j)), None)

    out = {name: np.empty(len(items), dtype=np.int64) for name in GUM_BASELINES}
    for row, a in enumerate(items):
        i, cands = a.index, a.candidates
        head = words[a.head]
        nearest = cands[-1]
        same_text = most_recent(cands, lambda j: text[j] == text[i])  # noqa: B023  (most_recent calls it at once)
        same_head = most_recent(cands, lambda j: words[mentions[j].head] == head)  # noqa: B023  (most_recent calls it at once)
        out["nearest"][row] = mentions[nearest].head
        out["head_match"][row] = -1 if same_head is None else mentions[same_head].head
        chosen = same_text  # the sieve: the first rule that finds a candidate decides
        if chosen is None:
            chosen = same_head
        if chosen is None:
            chosen = most_recent(cands, lambda j: attrs(i).agrees(attrs(j)))  # noqa: B023  (most_recent calls it at once)
        if chosen is None:
            chosen = nearest
        out["sieve"][row] = mentions[chosen].head
    return out


def choice_hits(choices: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """(M,) chosen words (-1: none), (M, n_words) gold -> (M,) bool."""
    choices = np.asarray(choices)
    return (choices >= 0) & gold[np.arange(len(choices)), np.clip(choices, 0, None)]


# --- accumulating scores by mention type ------------------------------------------------------


class Scores:
    """Per-type sums of right selections: every head's, and every baseline's, over the
    same scored mentions.

    Additive: an engine accumulator (`bertscope.engine.batch.Accumulator`) once a probe gives it an
    `add(batch)` that scores a batch's segments (`bertscope.analyses.probes.coref.command`); `add_mentions`
    adds one segment's scored mentions; `merge`, `save` and `load` serve resume and ranks.
    """

    def __init__(self, n_layers: int, n_heads: int, types=TYPES, baselines=GUM_BASELINES):
        self.types, self.baselines = tuple(types), tuple(baselines)
        self.heads = {t: np.zeros((n_layers, n_heads), dtype=np.int64) for t in self.types}
        self.base = {t: dict.fromkeys(self.baselines, 0) for t in self.types}
        self.n = dict.fromkeys(self.types, 0)
        self.batches_done = 0

    def add_mentions(self, kinds, hits: np.ndarray, baseline_hits: dict[str, np.ndarray]):
        """kinds (M,) mention types; hits (layers, H, M) bool; baseline_hits name -> (M,) bool."""
        kinds = np.asarray(kinds)
        for t in self.types:
            keep = np.ones(len(kinds), dtype=bool) if t == "All" else kinds == t
            if not keep.any():
                continue
            self.heads[t] += hits[:, :, keep].sum(-1)
            for name in self.baselines:
                self.base[t][name] += int(baseline_hits[name][keep].sum())
            self.n[t] += int(keep.sum())

    def merge(self, other: Scores) -> Scores:
        if (other.types, other.baselines) != (self.types, self.baselines) or \
                other.heads[self.types[0]].shape != self.heads[self.types[0]].shape:
            raise ValueError("cannot merge coreference scores of different types, baselines or models")
        for t in self.types:
            self.heads[t] += other.heads[t]
            self.n[t] += other.n[t]
            for name in self.baselines:
                self.base[t][name] += other.base[t][name]
        return self

    def save(self, path):
        write_npz(path, types=np.array(self.types), baselines=np.array(self.baselines), batches_done=self.batches_done,
                  heads=np.stack([self.heads[t] for t in self.types]), n=np.array([self.n[t] for t in self.types]),
                  base=np.array([[self.base[t][b] for b in self.baselines] for t in self.types]))

    @classmethod
    def load(cls, path) -> Scores:
        with np.load(path) as f:
            types, baselines = [str(t) for t in f["types"]], [str(b) for b in f["baselines"]]
            scores = cls(*f["heads"].shape[1:], types=types, baselines=baselines)
            for k, t in enumerate(types):
                scores.heads[t][...] = f["heads"][k]
                scores.n[t] = int(f["n"][k])
                scores.base[t] = {b: int(f["base"][k, j]) for j, b in enumerate(baselines)}
            scores.batches_done = int(f["batches_done"])
        return scores

    def accuracy(self, t: str) -> np.ndarray:
        """(layers, H) accuracy on type t (NaN when no mention of that type was scored)."""
        return self.heads[t] / self.n[t] if self.n[t] else np.full(self.heads[t].shape, np.nan)

    def head_rows(self, dataset: str) -> list[dict]:
        rows = []
        for t in self.types:
            acc = self.accuracy(t)
            for layer, head in np.ndindex(acc.shape):
                rows.append({"dataset": dataset, "mention_type": t, "layer": layer + 1, "head": head + 1,
                             "accuracy": float(acc[layer, head]), "n": self.n[t]})
        return rows

    def table_rows(self, dataset: str, overall: str = "All") -> list[dict]:
        """One Table-2 row per type: the best head on that type, how the best head on
        `overall` does on it (the paper reports one head, 5-4, across the types), and the
        baselines. Heads are `<layer>-<head>` from 1; ties go to the earliest head."""
        if not self.n.get(overall):
            overall = next((t for t in self.types if self.n[t]), overall)
        best_all = best_head(self.accuracy(overall)) if self.n.get(overall) else None
        rows = []
        for t in self.types:
            row = {**dict.fromkeys(TABLE_COLUMNS, ""), "dataset": dataset, "type": t, "n": self.n[t]}
            if self.n[t]:
                acc = self.accuracy(t)
                layer, head = best_head(acc)
                row.update(best_head=f"{layer + 1}-{head + 1}", accuracy=float(acc[layer, head]),
                           overall_head=f"{best_all[0] + 1}-{best_all[1] + 1}",
                           overall_head_accuracy=float(acc[best_all]))
                for name in self.baselines:
                    row[name] = self.base[t][name] / self.n[t]
            rows.append(row)
        return rows


def best_head(acc: np.ndarray) -> tuple[int, int]:
    """(layer, head) of the highest accuracy, 0-based; ties: the earliest head."""
    flat = np.where(np.isnan(acc), -np.inf, acc)
    return tuple(int(x) for x in np.unravel_index(int(flat.argmax()), flat.shape))


# --- GAP -----------------------------------------------------------------------------------


def name_attention(rows: np.ndarray, words: tuple[int, int], name: str = "sum") -> np.ndarray:
    """Attention of the pronoun to one name: rows (layers, H, W) are the pronoun's word rows;
    words is the name's (first, end) word range. "sum" adds the name's words, "first"
    reads its first word only. Returns (layers, H)."""
    first, end = words
    if name == "first":
        return rows[:, :, first]
    if name == "sum":
        return rows[:, :, first:end].sum(-1)
    raise ValueError(f"name must be 'sum' or 'first', not {name!r}")


def gap_head_hits(maps: np.ndarray, pronoun: int, a_words: tuple[int, int], b_words: tuple[int, int],
                  label: str, name: str = "sum") -> np.ndarray:
    """(layers, H) bool: whether each head's pronoun row puts more attention on the correct
    name than on the other (a tie counts as wrong). maps: (layers, H, W, W)."""
    if label not in ("A", "B"):
        raise ValueError(f"GAP label must be A or B, not {label!r}")
    rows = maps[:, :, pronoun, :]  # (layers, H, W)
    to_a, to_b = name_attention(rows, a_words, name), name_attention(rows, b_words, name)
    return to_a > to_b if label == "A" else to_b > to_a


def gap_baselines(pronoun: int, a_words: tuple[int, int], b_words: tuple[int, int]) -> dict[str, str]:
    """The name ("A" or "B") each GAP baseline picks.

    nearest: the name that ends closest before the pronoun; when neither comes before it
    (cataphora), the one starting closest after it. first_name: the name that comes first
    in the text (gender-blind, like every baseline here).
    """
    before = {k: pronoun - w[1] for k, w in (("A", a_words), ("B", b_words)) if w[1] <= pronoun}
    if before:
        nearest = min(before, key=lambda k: (before[k], k))
    else:
        after = {"A": a_words[0] - pronoun, "B": b_words[0] - pronoun}
        nearest = min(after, key=lambda k: (after[k], k))
    first = "A" if a_words[0] <= b_words[0] else "B"
    return {"nearest": nearest, "first_name": first}


# --- the printed table ----------------------------------------------------------------------


TABLE_COLUMNS = ("dataset", "type", "best_head", "accuracy", "overall_head", "overall_head_accuracy",
                 "nearest", "head_match", "sieve", "first_name", "n")


def format_table(rows: list[dict]) -> str:
    """Table 2 as text: accuracies in percent, '-' where a column does not apply."""
    headers = ("dataset", "type", "best head", "acc", "All-best head", "acc", "nearest", "head match",
               "sieve", "first name", "n")
    keys = TABLE_COLUMNS
    lines = []
    for row in rows:
        cells = []
        for k in keys:
            v = row.get(k, "")
            if isinstance(v, float):
                cells.append(f"{100 * v:.1f}")
            else:
                cells.append("-" if v in ("", None) else str(v))
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    for cells in lines:
        out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    return "\n".join(out) + "\n"


# --- figures --------------------------------------------------------------------------------

# Okabe-Ito colours (colourblind-safe)
COLOURS = {"best head": "#0072B2", "All-best head": "#56B4E9", "nearest": "#E69F00", "head_match": "#009E73",
            "sieve": "#D55E00", "first_name": "#CC79A7"}
