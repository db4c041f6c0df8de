"""What `bertscope atlas` and `bertscope atlas compare` write, the columns of the per-head table
with their units, and the one reader of it; the names the command, the card and the report
section share (no torch here: building the parser imports this module).

atlas_heads.csv / atlas_heads.parquet: one row per head of the model, layer-major, `layer, head`
from 1; `COLUMNS` below names every column with its unit and where it comes from (docs/atlas.md
prints the same table). A statistic the run did not measure is empty in the CSV and NaN in the
Parquet file (never a measured 0): an encoder's retrieval, LM importance and streaming error, the
norm-based twins with --no-norms (or on the triton backend without --norms), and any statistic the run's backend did
not compute (the card says "not measured in this run").
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from bertscope.errors import UserError

NAME = "atlas"  # run.json["analyses"][NAME]
COMPARE_NAME = "atlas_compare"  # run.json["analyses"][COMPARE_NAME] of `bertscope atlas compare`

HEADS_FILE = "atlas_heads.csv"
PARQUET_FILE = "atlas_heads.parquet"
LAYERS_FILE = "atlas_layers.csv"  # one row per layer: the means of the profile columns, and type counts
CARD_MD = "atlas_card.md"
CARD_HTML = "atlas_card.html"
GRID_FIGURE = "fig_atlas_grid.png"  # every head, coloured by its first type, letters for all of them
LAYERS_FIGURE = "fig_atlas_layers.png"  # per-layer profiles

# checkpoints (resume): the streamed pass's sums, the probes' sums, the retrieval cells (one JSON each)
STATE_FILE = "atlas_state.json"  # the stages done, the settings they were made with
STREAM_FILES = {"heads": "atlas_stream_heads{suffix}.npz", "sinks": "atlas_stream_sinks{suffix}.npz",
                "positions": "atlas_stream_positions{suffix}.npz"}
INDUCTION_FILE = "atlas_induction{suffix}.npz"
IMPORTANCE_STATE = "atlas_importance.npz"

COMPARE_FILE = "atlas_compare.csv"  # every head of every run: model, layer, head, types, features, PCs
COMPARE_FIGURE = "fig_atlas_compare.png"

# -- the per-head table: name -> (unit, what it is) ------------------------------------------------

PROB = "probability mass, 0-1"
NORM_SHARE = "share of the weighted value norms, 0-1"
COLUMNS: dict[str, tuple[str, str]] = {
    "model": ("text", "the model's name"),
    "layer": ("index from 1", "the layer"),
    "head": ("index from 1", "the query head"),
    "kv_head": ("index from 1", "the key/value head it reads (grouped-query attention; = head without GQA)"),
    "attention": ("text", "the layer's attention: 'global'; 'window N', a causal sliding window of N keys (the query "
                  "and the N - 1 before it); 'window ±N (2N+1 keys)', a bidirectional window of N keys on each side "
                  "of the query (ModernBERT's local layers)"),
    "entropy": ("nats", "mean entropy of the head's attention rows over the corpus"),
    "entropy_ratio": ("ratio, 0-1", "entropy over the layer's uniform baseline, mean ln(keys a row sees): 1 is "
                      "uniform"),
    "prev_mass": (PROB, "mean mass on the previous token (offset -1)"),
    "self_mass": (PROB, "mean mass on the query token itself"),
    "next_mass": (PROB, "mean mass on the next token (offset +1; 0 by construction in a decoder)"),
    "first_mass": (PROB, "mean mass on the segment's first token over every row (a decoder's BOS or first word, an "
                   "encoder's [CLS])"),
    "alpha_1": (PROB, "Gu et al.'s alpha_1: mass on the first token over the rows that can see it"),
    "initial_mass": (PROB, "mass on the first 4 tokens (StreamingLLM's initial tokens) over the rows that see them"),
    "sep_mass": (PROB, "mean mass on [SEP] (encoders; empty for a decoder)"),
    "sink_mass": (PROB, "what the sink type reads: alpha_1 (decoder), [CLS] + [SEP] mass (encoder)"),
    "alpha_1_norm": (NORM_SHARE, "alpha_1's norm-based twin (Kobayashi et al. 2020, docs/norms.md): the first token's "
                     "share of sum_j a_ij ||f(x_j)|| (attention weight times the length of the key's transformed "
                     "value vector), mean over the rows that can see it; empty where norms were not computed "
                     "(--no-norms; the triton backend without --norms)"),
    "first_mass_norm": (NORM_SHARE, "first_mass's norm-based twin: the first token's share of sum_j a_ij ||f(x_j)||, "
                        "mean over every row (empty as alpha_1_norm is)"),
    "sep_mass_norm": (NORM_SHARE, "sep_mass's norm-based twin: [SEP]'s share (encoders; empty for a decoder)"),
    "sink_mass_norm": (NORM_SHARE, "sink_mass's norm-based twin, what the no-op-sink type reads: alpha_1_norm "
                       "(decoder), alpha_1_norm + sep_mass_norm (encoder)"),
    "mean_distance": ("tokens", "mean query-key distance sum_j p_ij |i - j|"),
    "local_mass": (PROB, "mass at distance 0-7"),
    "reach_90": ("tokens", "largest distance of the log2 bucket by which 90% of the mass is gathered (empty: "
                 "32768+)"),
    "duplicate_mass": (PROB, "corpus: mass on earlier copies of the query's token, mean over rows that have one "
                       "(empty where none has, or where this bertscope does not compute it; how many rows: "
                       "atlas_layers.csv's duplicate_rows)"),
    "prefix_match_mass": (PROB, "corpus: mass on keys that follow an earlier copy of the query's token, mean over "
                          "rows that have one (empty as duplicate_mass is; how many: prefix_match_rows)"),
    "streaming_error": ("ratio", "||o - o_L|| / ||o||: the head's output against its output over the first S and "
                        "last W keys only, pooled over rows (decoders; empty where not computed)"),
    "streaming_error_kv": ("ratio", "the same pooled over the query heads of the head's KV group"),
    "induction_score": (PROB, "probe: repeated random tokens, mean mass of the repeated half's rows on i - T + 1 "
                        "(Olsson et al.)"),
    "duplicate_score": (PROB, "probe: the same rows' mass on i - T, the earlier copy of the token"),
    "previous_score": (PROB, "probe: the same rows' mass on i - 1"),
    "retrieval_score": ("ratio, 0-1", "probe (decoders): Wu et al.'s retrieval score, the share of needle tokens "
                        "the head's argmax copies at the answer rows, mean over the answered haystacks; empty (not "
                        "measured) when fewer than 3 were answered (head_types.MIN_ANSWERED)"),
    "importance": ("ratio, 0-1", "probe (decoders): Michel et al.'s I_h = E|dL/dxi_h| with the LM loss, "
                   "L2-normalised per layer"),
    "importance_raw": ("nats per unit gate", "I_h before the normalisation"),
    "types": ("text", "the head's types, '+'-joined ('' for none)"),
}
DISTANCE_PREFIX = "d_"  # then the 17 log2 distance buckets, "d_0" .. "d_32768+": the distance profile (PROB);
# a bucket no row of the layer could reach (beyond the longest segment, or the layer's window) is empty, not 0

# -- atlas_layers.csv: name -> (unit, what it is); n_<type> for every type of head_types.RULES -------------

LAYER_COLUMNS: dict[str, tuple[str, str]] = {
    "layer": ("index from 1", "the layer"),
    "attention": ("text", "the layer's attention, as in atlas_heads.csv"),
    "entropy_ratio": ("ratio, 0-1", "mean over the layer's heads of atlas_heads.csv's column of the same name"),
    "prev_mass": (PROB, "the same mean"),
    "first_mass": (PROB, "the same mean"),
    "sink_mass": (PROB, "the same mean"),
    "sink_mass_norm": (NORM_SHARE, "the same mean (empty where norms were not computed)"),
    "mean_distance": ("tokens", "the same mean"),
    "local_mass": (PROB, "the same mean"),
    "induction_score": (PROB, "the same mean"),
    "retrieval_score": ("ratio, 0-1", "the same mean (empty where not measured)"),
    "streaming_error": ("ratio", "the same mean (empty where not measured)"),
    "importance": ("ratio, 0-1", "the same mean (empty where not measured)"),
    "n_<type>": ("heads", "how many of the layer's heads carry the type (one column per type: n_retrieval, "
                 "n_induction, ...); a head of several types counts in each, so they can add up to more than the "
                 "layer's heads; 0 also where the type was not measured (the card says which)"),
    "duplicate_rows": ("rows", "the query rows of the corpus with an earlier copy of their token among the keys the "
                       "layer lets them see: what duplicate_mass averages over (the same for every head of a layer)"),
    "prefix_match_rows": ("rows", "the rows that see a key right after an earlier copy of their token: what "
                          "prefix_match_mass averages over"),
}


def read_heads(run_dir) -> list[dict]:
    """The rows of a run's atlas_heads.csv, numbers as floats (empty: NaN), text as text; a
    one-line error when the run has none."""
    path = Path(run_dir)
    path = path / HEADS_FILE if path.is_dir() else path
    if not path.is_file():
        raise UserError(f"{run_dir} has no {HEADS_FILE}: give run directories of `bertscope atlas`")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{path} is not an atlas_heads.csv ({e}): give run directories of `bertscope atlas`") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise UserError(f"{path} is not an atlas_heads.csv of this bertscope (no column {', '.join(missing)}): give "
                        "run directories of `bertscope atlas`")
    if not rows:
        raise UserError(f"{path} has no heads")
    for n, r in enumerate(rows, start=2):  # a row cut short (a truncated file) has None for its last columns
        if None in r.values() or None in r:
            raise UserError(f"{path}, line {n}: the row has {len([v for v in r.values() if v is not None])} of "
                            f"{len(header)} columns (a truncated or edited file?): run `bertscope atlas --resume` "
                            "again or rerun the atlas")
        for c in ("layer", "head"):
            if not r[c].isdigit():
                raise UserError(f"{path}, line {n}: {c} is {r[c]!r}, not a number")
    text = {"model", "attention", "types"}
    return [{k: (v if k in text else _float(v)) for k, v in r.items()} for r in rows]


# the columns `atlas compare` reads from each run (its features are read where present)
REQUIRED_COLUMNS = ("model", "layer", "head", "types", "mean_distance")


def _float(v: str) -> float:
    try:
        return float(v) if v != "" else math.nan
    except ValueError:
        return math.nan
