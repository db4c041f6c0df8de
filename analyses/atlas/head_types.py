"""The head types of the atlas, and the thresholds that assign them: every constant here, each with
why it has its value. A head carries every type whose rule it meets (several, or none); a rule on
a column the run did not measure (NaN: an encoder's retrieval score and streaming error, a
statistic its backend did not compute, the norm-based twins with --no-norms or on the triton
backend without --norms) types no head, and the card says "not measured in this run". A rule may refine another
(`Rule.within`: a no-op sink is a sink first).

No numpy beyond comparisons: `assign` takes the per-head table as columns of arrays and returns
one boolean array per type, so the rules are tested on hand-built tables (tests/analyses/atlas).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SINK = 0.3
"""Sink: alpha_1 (a decoder's mean mass on its first token over the rows that see it) or an
encoder's [CLS] + [SEP] mass at least 0.3. Gu et al. (2024)'s epsilon for Sink^eps_1 (their Table 1;
`bertscope sinks --epsilon` has the same default): a head that parks at least 30% of its attention
on one token out of tens to thousands is a sink."""

PREVIOUS = 0.5
"""Previous-token: at least half of the head's mass on the previous token, over the corpus. Clark et
al. (2019, section 3) name the BERT heads that put "over 50%" of their attention on the previous
(or next) token; the same bar on a decoder's rows."""

DUPLICATE = 0.3
"""Duplicate-token: at least 0.3 of the mass of the repeated half's rows on the earlier copy of their
own token (i - T, repeated random tokens). Random tokens carry no meaning to attend to, and a row of
the repeated half sees T + 1 to 2T + 1 keys (about 1/100 each at T = 64): 0.3 is a head that
looks for the copy, 30 times chance, not a head that happens to touch it."""

INDUCTION = 0.3
"""Induction: at least 0.3 of the repeated half's rows' mass on i - T + 1, the token after the
earlier copy ([A][B] ... [A] -> [B], Olsson et al. 2022): the same bar as the duplicate type, for
the same reason (TransformerLens's detector reads the same stripe)."""

RETRIEVAL = 0.1
"""Retrieval: Wu et al. (2024)'s retrieval score above 0.1, their own bar ("heads with retrieval
score > 0.1", fewer than 5% of the heads in the models they test). Decoders only."""

MIN_ANSWERED = 3
"""Retrieval needs at least 3 answered haystacks: Wu et al.'s retrieval score is a mean over the
retrievals that succeed (the haystacks the model answers), so a haystack the model does not
answer says nothing about which heads retrieve, and a mean over one or two answered haystacks
rests on one or two needle positions. Below 3, the retrieval_score column is empty ("not
measured") and the card says how many haystacks were answered; the atlas's default probe (five
depths, greedy answers) gives both real decoders five chances."""

STREAMING_SAFE = 0.1
"""Streaming-safe: ||o - o_L|| / ||o|| at most 0.1, the head's output over the first S and last W
keys (StreamingLLM's sink and window) within 10% of its output over every key. DuoAttention
(Xiao et al. 2024) calls such heads streaming heads and finds them by optimisation, with no fixed
bar; 10% is a relative error small enough that the head's cache could be cut to S + W keys."""

BROAD = 0.75
"""Broad: entropy at least 0.75 of the layer's uniform baseline (ln of the keys a row sees): Clark
et al.'s "broad attention" heads (bag-of-vectors), spread over most of what the row sees. At 0.75
the head's effective number of keys, exp(entropy), is still n^0.75 of n (e.g. 32 of 100)."""

NOOP_SINK = 0.1
"""No-op sink: a sink (the SINK rule, on the weights) whose sink token(s) give at most 0.1 of the
head's weighted value norms, sink_mass_norm: the share of sum_j a_ij ||f_h(x_j)|| that the first
token (a decoder's rows that see it) or [CLS] + [SEP] (an encoder's) contribute (docs/norms.md).
Kobayashi et al. (2020) found that BERT's heads with a large weight on [CLS] and [SEP] put little
norm there: the special tokens' transformed vectors f_h(x_j) are short, so that attention is close
to a no-op, a place to park weight that adds little to the head's output. An absolute bar says
that directly: at most a tenth of what the head's keys add is the sink's, whatever its weight (the
same 10% as STREAMING_SAFE's output error). With SINK's weight of at least 0.3 it is also a
relative bar: the norm share is at most a third of the weight share, so a sink whose vectors are
about as long as the others' (a share near its weight) is never typed. On MiniLM the [CLS] norm
share of layers 2-5 is 0.04-0.06 against weights of 0.36-0.41 (means over heads, docs/norms.md),
well under the bar; a bar relative to the weight alone (e.g. half of it) would type a head with a
weight of 0.9 and a norm share of 0.45, whose sink is nearly half of what it adds: no no-op."""

LOCAL = 0.7
"""Local: at least 0.7 of the mass at distance 0-7 (the log2 buckets 0, 1, 2-3, 4-7) and not a sink
(a sink's mass is at the first token, far from most rows). A window of 8 tokens is a phrase; 70%
leaves room for the first token and a little spread. Previous-token heads are local too."""


@dataclass(frozen=True)
class Rule:
    """One type: its name, the column its rule reads, the comparison and the threshold; `within`: the
    type it refines (a head must carry that one too)."""

    name: str
    column: str
    threshold: float
    below: bool = False  # True: the type holds at or below the threshold (an error); else at or above
    letter: str = ""  # the grid's one-letter label, unique without regard to case (no S beside s)
    colour: str = "#999999"
    what: str = ""  # the card's one line
    within: str = ""  # the type this one refines, "" for none

    def text(self) -> str:
        """The rule in words, as the card and the report print it: "sink_mass_norm <= 0.1, and sink"."""
        return f"{self.column} {'<=' if self.below else '>='} {self.threshold:g}" + (
            f", and {self.within}" if self.within else "")

    def holds(self, table: dict[str, np.ndarray]) -> np.ndarray:
        """(n_heads,) bool: the rule on `table[column]`; False where the column is NaN or absent."""
        x = np.asarray(table.get(self.column, np.array([])), dtype=float)
        if x.size == 0:
            return np.zeros(_n(table), bool)
        with np.errstate(invalid="ignore"):
            ok = x <= self.threshold if self.below else x >= self.threshold
        return ok & np.isfinite(x)


# in the order the grid colours a head of several types (its first type in this order): a type that
# refines another comes before it, so that the grid shows the finer one
RULES: tuple[Rule, ...] = (
    Rule("retrieval", "retrieval_score", RETRIEVAL, letter="R", colour="#d62728",
         what="copies the needle's answer tokens from the context (Wu et al.)"),
    Rule("induction", "induction_score", INDUCTION, letter="I", colour="#9467bd",
         what="attends to the token after an earlier copy of the query's token (Olsson et al.)"),
    Rule("duplicate", "duplicate_score", DUPLICATE, letter="D", colour="#e377c2",
         what="attends to an earlier copy of the query's own token"),
    Rule("previous-token", "prev_mass", PREVIOUS, letter="P", colour="#ff7f0e",
         what="attends to the previous token (Clark et al.)"),
    Rule("no-op-sink", "sink_mass_norm", NOOP_SINK, below=True, letter="N", colour="#aec7e8",
         what="a sink by weight whose sink token(s) give at most 10% of its weighted value norms: parked attention "
         "that adds little to its output (Kobayashi et al.)", within="sink"),
    Rule("sink", "sink_mass", SINK, letter="S", colour="#1f77b4",
         what="parks its attention on the first token ([CLS]/[SEP] in an encoder)"),
    Rule("local", "local_mass", LOCAL, letter="L", colour="#2ca02c",
         what="reads within 7 tokens"),
    Rule("broad", "entropy_ratio", BROAD, letter="B", colour="#bcbd22",
         what="spreads its attention over most of what it sees"),
    Rule("streaming-safe", "streaming_error", STREAMING_SAFE, below=True, letter="W", colour="#17becf",
         what="its output changes by at most 10% over the sink and recent keys alone (DuoAttention's streaming heads)"),
)
TYPES = tuple(r.name for r in RULES)
RULE = {r.name: r for r in RULES}
NONE_COLOUR = "#f0f0f0"


def _n(table: dict) -> int:
    return max((len(np.atleast_1d(v)) for v in table.values()), default=0)


def assign(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """type name -> (n_heads,) bool, every rule on the per-head table `table` (column -> array).
    A rule `within` another holds only on that one's heads (a no-op sink is a sink); local excludes
    sinks (see `LOCAL`)."""
    out = {r.name: r.holds(table) for r in RULES}
    for r in RULES:
        if r.within:
            out[r.name] &= out[r.within]
    out["local"] &= ~out["sink"]
    return out


def measured(table: dict[str, np.ndarray]) -> dict[str, bool]:
    """type name -> whether its column holds any number in this run (else "not measured")."""
    return {r.name: bool(np.isfinite(np.asarray(table.get(r.column, []), dtype=float)).any()) for r in RULES}


def type_strings(types: dict[str, np.ndarray]) -> list[str]:
    """Each head's types, '+'-joined in `RULES` order ('' for none)."""
    n = len(next(iter(types.values()))) if types else 0
    return ["+".join(name for name in TYPES if types[name][i]) for i in range(n)]


def first_type(types: dict[str, np.ndarray]) -> list[str | None]:
    """Each head's first type in `RULES` order (the grid's colour), None for none."""
    n = len(next(iter(types.values()))) if types else 0
    return [next((name for name in TYPES if types[name][i]), None) for i in range(n)]


def overlap(types: dict[str, np.ndarray]) -> list[tuple[str, str, int]]:
    """Every pair of types that share at least one head, (type a, type b, heads of both), a and b in
    `RULES` order, the largest count first (ties in `RULES` order): a head may carry several types,
    and this says which ones go together (e.g. most decoder sinks are streaming-safe too). A type and the
    type it refines (`Rule.within`) are left out: every no-op sink is a sink."""
    pairs = []
    for i, a in enumerate(TYPES):
        for b in TYPES[i + 1:]:
            if b == RULE[a].within or a == RULE[b].within:
                continue
            n = int(np.sum(np.asarray(types[a], bool) & np.asarray(types[b], bool)))
            if n:
                pairs.append((a, b, n))
    return sorted(pairs, key=lambda p: -p[2])
