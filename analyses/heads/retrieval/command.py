"""`bertscope heads retrieval`: retrieval heads (Wu et al. 2024) in one teacher-forced forward
pass per needle-in-a-haystack input, the needle test's accuracy over lengths and depths, and the
check that zeroing the top retrieval heads fails the test while zeroing random heads does not.

    bertscope heads retrieval --model smollm2-135m-instruct-q4_1 --lengths 1024,2048
    bertscope heads retrieval --model gemma-3-270m-q4_k_m --lengths 16384,32768 --depths 10,50,90 --out DIR

The grid is needles x lengths x depths; each cell is one haystack (`haystack.py`) and one
forward pass (`stats.score_haystack`), saved as it finishes (retrieval_cells/, one JSON per
cell, written atomically). A rerun into the same directory (`--out DIR`, or `--resume DIR` with
the recorded settings) skips the cells done, so a run killed mid-grid resumes to the result of
an uninterrupted one; a second call with other lengths or depths into the same --out extends
the grid (every output is made from every cell there of the same model, prompt, corpus and
needles). Under torchrun the cells (and the ablation's haystacks) are dealt out to the ranks,
cell i to rank i mod world size, and gathered on rank 0, which writes the outputs.

The ablation (--ablate K,...): the top-k heads by retrieval score zeroed (head gates xi = 0),
beside --draws sets of k random other heads, on every haystack of --ablate-lengths (default:
the shortest length of the grid): the fraction copied and the answer log-probability as k grows.
"""
from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path

from bertscope.analyses.heads.retrieval.haystack import ANSWERS, PROMPTS
from bertscope.analyses.heads.retrieval.outputs import (
    ABLATION_COLUMNS,
    ABLATION_DIR,
    ABLATION_FIGURE,
    ABLATION_FILE,
    CELLS_COLUMNS,
    CELLS_DIR,
    CELLS_FILE,
    GREEDY_COLUMNS,
    HEADS_COLUMNS,
    HEADS_FIGURE,
    HEADS_FILE,
    NAME,
    NEEDLE_FIGURE,
    escape_text,
    ranked_score,
)
from bertscope.cli.args import add_common_arguments, non_negative_int, positive_int
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

# numpy, torch and the model loader are imported where the run uses them: building this command's
# parser imports this module, and a mistyped option is then refused without waiting for torch
logger = logging.getLogger(__name__)

COMMAND = "heads retrieval"
FIRST_LENGTH = 1024  # the default lengths double from here up to the model's limit
DEFAULT_DEPTHS = (0, 11, 22, 33, 44, 56, 67, 78, 89, 100)  # Wu et al.'s: linspace(0, 100, 10), rounded
HELP = ("retrieval heads of a decoder on needle-in-a-haystack inputs, one forward pass per haystack, and the "
        "needle test with the top retrieval heads zeroed (Wu et al. 2024)")
DESCRIPTION = (
    "Wu et al. (2024): a needle sentence hidden at a depth of real text (Wikipedia by default), the question, then "
    "the reference answer, run as one teacher-forced input. At each answer row a head scores when its most-attended "
    "key (the kernels' row argmax: no attention map) lies in the needle's answer span and holds the token the row "
    "must produce; its score on a haystack is the number of such rows over the span's length, and its retrieval "
    "score the mean over the haystacks the model answers (its argmax prediction is the reference at every answer "
    "row). The grid: --needles x --lengths x --depths, resumable per haystack and sharded under torchrun. Then the "
    "top-k heads zeroed against k random heads (--ablate). Needs a causal model, a decoder (an encoder, the "
    "default model included, is refused; `bertscope data install-decoders` installs two). Writes "
    "retrieval_cells.csv, retrieval_heads.csv, retrieval_ablation.csv, figures and "
    "run.json['analyses']['retrieval'].")


def int_list(minimum: int, maximum: int | None = None, what: str = "number"):
    """An argparse type: comma-separated whole numbers in [minimum, maximum], kept as the text
    "a,b,c" (distinct, sorted), which run.json records and --resume reads back; `ints` gives the list."""
    def parse(text: str) -> str:
        try:
            values = [int(x) for x in text.replace(" ", "").split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one {what}, got {text!r}")
        bad = [v for v in values if v < minimum or (maximum is not None and v > maximum)]
        if bad:
            span = f"{minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"each {what} must be {span}, got {bad[0]}")
        return ",".join(map(str, sorted(set(values))))
    return parse


def ints(text: str | None) -> list[int] | None:
    """The list of an `int_list` option's text (None stays None)."""
    return None if text is None else [int(x) for x in text.split(",")]


def add_arguments(p):
    p.add_argument("--corpus", default="wiki",
                   help="the haystack text: 'wiki' (the bundled Wikipedia summaries, in order) or a corpus file "
                   "(text, JSON Lines, Parquet, datasets; default: wiki)")
    p.add_argument("--text-field", metavar="NAME", default=None,
                   help="the text column of a JSON Lines, Parquet or datasets corpus (default: 'text')")
    p.add_argument("--needles", metavar="FILE|NAME,...", default=None,
                   help="needles as JSON Lines (one {name, needle, question, answer} per line) or YAML (a list of "
                   "them); the answer must appear word for word in the needle. Or names of the default needles, "
                   "comma-separated: san-francisco, beijing, wmo (default: all three: Wu et al.'s San Francisco "
                   "needle, then their Beijing and WMO needles)")
    p.add_argument("--lengths", type=int_list(2, None, "length"), default=None, metavar="L,...",
                   help="haystack lengths in tokens, the whole input (prompt and answer) (default: 1024, 2048, ... "
                   "doubling up to the model's limit)")
    p.add_argument("--depths", type=int_list(0, 100, "depth"), default=",".join(map(str, DEFAULT_DEPTHS)),
                   metavar="D,...",
                   help="needle depths, percent of the haystack text (default: Wu et al.'s ten, "
                   + ",".join(map(str, DEFAULT_DEPTHS)) + ")")
    p.add_argument("--prompt", choices=PROMPTS, default="auto",
                   help="how the question and answer are put: 'plain' (the text, then \"Based on the content of the "
                   "book, Question: ...\\nAnswer:\" and the answer, as Wu et al. do for base models), 'chat' (that "
                   "user turn in the tokenizer's chat template, the answer as the assistant's, as they do for "
                   "instruct models), 'auto' (chat when the tokenizer has a template; default)")
    p.add_argument("--answer", choices=ANSWERS, default="reference",
                   help="the answer the teacher-forced pass appends to the prompt: 'reference' (the needle file's "
                   "answer; a haystack is answered when the model's argmax is the reference at every answer row; "
                   "default) or 'greedy' (the model's own greedy answer, up to 50 tokens, stopping after a newline "
                   "or end token; answered when its words recall more than half of the reference's: Wu et al.'s "
                   "criterion)")
    p.add_argument("--ablate", type=int_list(0, None, "k"), default="5,10,20", metavar="K,...",
                   help="zero the top-k retrieval heads together, for each k, beside --draws sets of k random other "
                   "heads (default: 5,10,20; 0 skips the ablation)")
    p.add_argument("--draws", type=positive_int, default=3, metavar="R",
                   help="sets of k random heads, drawn with --seed from the heads outside the top k (default: 3)")
    p.add_argument("--ablate-lengths", type=int_list(2, None, "length"), default=None, metavar="L,...",
                   help="the lengths whose haystacks (every needle and depth of the grid) the ablation runs "
                   "(default: the shortest length of the grid)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    add_common_arguments(p, from_word=False, overrides={
        "max_len": {"default": None, "help": "the longest input allowed (default: the longest of --lengths)"},
        "batch_size": {"default": 1, "type": non_negative_int,
                       "help": "kept for the common options: one haystack per forward pass"},
        "seed": {"help": "seed of the random heads of the ablation (default: 0)"},
    })


def default_lengths(limit: int) -> list[int]:
    """1024, 2048, ... up to `limit` (the limit itself when it is not a power of two; the limit
    alone for a model shorter than 1024)."""
    out, n = [], FIRST_LENGTH
    while n <= limit:
        out.append(n)
        n *= 2
    if not out or out[-1] != limit:
        out.append(limit)
    return out


def main(args) -> int:
    from bertscope.analyses.heads.retrieval.haystack import load_needles  # see the note above `logger`

    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, command=COMMAND)
    needles = load_needles(args.needles)  # a bad needles file is refused before the model loads
    refuse_encoder(args.model, getattr(args, "revision", None))
    length_from = None
    if args.lengths is not None:
        needed = max(ints(args.lengths))
        if args.max_len is None:
            args.max_len = needed
            length_from = f"--lengths {needed}"
        elif args.max_len < needed:
            raise UserError(f"--lengths {needed} is longer than --max-len {args.max_len}")
    elif args.max_len is None:
        args.max_len = 1  # the lengths default to the model's limit: known once it has loaded
    with ModelRun(NAME, args, task="causal-lm", command=COMMAND, distributed=True, resumable=True,
                  length_from=length_from) as run:
        retrieval(run, args, needles)
    return 0


def refuse_encoder(model: str | None, revision: str | None = None, command: str = COMMAND):
    """An encoder (the default model, or a local folder or converted name that holds one) refused in
    one line saying what this command needs and how to get it, before the model loads. A Hub id is
    left to the loader (resolving it here would ask the Hub twice); whatever does not resolve or
    read here is left to the loader too, which says why in its own words."""
    from bertscope.data.decoders import DECODERS, INSTALL_COMMAND
    from bertscope.models.source import looks_like_path, resolve_model

    if model is not None and not (Path(model).exists() or looks_like_path(model) or model in DECODERS):
        return
    try:
        from transformers import AutoConfig

        from bertscope.models.loading import check_supported

        path = resolve_model(model, revision).path
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        causal = check_supported(config).is_causal(config)
    except (UserError, ValueError, OSError):
        return
    if not causal:
        which = "the default model (no --model given)" if model is None else path.name
        raise UserError(f"bertscope {command} needs a causal language model (a decoder) for the needle test, and "
                        f"{which} is a {config.model_type} encoder: `{INSTALL_COMMAND}` installs "
                        f"{' and '.join(DECODERS)}; then pass --model {next(iter(DECODERS))}")


def layer_kinds(loaded) -> list[str]:
    """Each layer's attention: "global", or "window N" for a sliding window of N keys."""
    try:
        layouts = loaded.architecture.layouts(loaded.model.config)
    except (AttributeError, UserError):
        return ["global"] * loaded.n_layers
    return ["global" if lay.window is None else f"window {lay.window[0] + 1}" for lay in layouts]


def retrieval(run: ModelRun, args, needles):
    """The command once the model has loaded."""
    import numpy as np  # see the note above `logger`

    from bertscope.analyses.heads.retrieval.haystack import HaystackBuilder, corpus_texts, resolve_prompt
    from bertscope.analyses.heads.retrieval.stats import Cell, GridScores, rank_heads
    from bertscope.models.loading import model_name

    loaded = run.loaded
    if args.lengths is None:
        args.lengths = ",".join(map(str, default_lengths(loaded.max_len)))
        args.max_len = max(ints(args.lengths))
        run.record["settings"].update(lengths=args.lengths, max_len=args.max_len)
        run.save_record()
    lengths, depths, ablate = ints(args.lengths), ints(args.depths), ints(args.ablate)
    prompt = resolve_prompt(args.prompt, loaded.tokenizer)
    builder = HaystackBuilder(loaded.tokenizer, corpus_texts(args.corpus, args.text_field), prompt)
    for needle in needles:  # a length too short for a needle, or a corpus too short, before any pass
        builder.build(needle, min(lengths), 0)
        builder.build(needle, max(lengths), 0)
    setup = {"model": loaded.record(), "prompt": prompt, "corpus": args.corpus, "text_field": args.text_field,
             "needles": {n.name: [n.needle, n.question, n.answer] for n in needles}}
    if args.answer != "reference":  # a reference run's records stay as they were
        setup["answer"] = args.answer
    cells = [Cell(n.name, length, depth) for n in needles for length in lengths for depth in depths]
    by_name = {n.name: n for n in needles}
    L, H = loaded.n_layers, loaded.n_heads
    ks = [k for k in ablate if k > 0]
    if ks and ks[-1] > L * H // 2:  # said before the grid, not after hours of it
        raise UserError(f"--ablate {ks[-1]}: k random heads are drawn outside the top k, so k can be at most "
                        f"half of the model's {L * H} heads ({L * H // 2})")
    ab_lengths = ints(args.ablate_lengths) or [min(lengths)]
    ab_cells = [Cell(n.name, length, depth) for n in needles for length in ab_lengths for depth in depths] \
        if ks else []
    kinds = layer_kinds(loaded)
    forecast = plan_call(run, args, cells, ab_cells, ks, len(needles), lengths, depths, kinds)
    records = run_cells(run, args, builder, by_name, cells, setup, forecast)  # every rank's, on every rank
    records = {**earlier_records(run, setup), **records}  # cells of earlier calls into this --out too
    ordered = sorted(records.values(), key=lambda r: (r["needle"], r["length"], r["depth"]))
    grid = GridScores.of(ordered, L, H)
    ranking = grid.answered if grid.n_answered else grid.all  # no answered haystack: the all-haystack score ranks
    ranked = rank_heads(ranking)

    ablation_rows = []
    if ks:
        ablation_rows = run_ablation(run, args, builder, by_name, ab_cells, records, ranked, ks, setup, forecast)
    elif (run.dir / ABLATION_FILE).is_file():  # --ablate 0 into a run that has one: the earlier call's stays
        ablation_rows = read_ablation(run.dir / ABLATION_FILE)
        run.log(f"the ablation of an earlier call into {run.dir} is kept ({ABLATION_FILE}; its ranking was that "
                "call's grid)")
    run.shutdown()
    if not run.is_main:
        return
    tok = loaded.tokenizer
    cell_rows = [{"needle": r["needle"], "length": r["length"], "depth": r["depth"],
                  "needle_start": r["needle_span"][0], "needle_len": r["needle_len"],
                  "answer_start": r["answer_span"][0], "distance": r["distance"], "copied": int(r["copied"]),
                  "token_accuracy": r["token_accuracy"], "answer_logprob": r["answer_logprob"],
                  "predicted": escape_text(tok.decode(r["predicted"])),  # one line per row
                  "max_head_score": float(np.max(np.asarray(r["hits"])) / max(1, r["needle_len"])),
                  **({"answered": int(r["answered"]), "answer_text": escape_text(r["answer_text"]),
                      "recall": r["recall"]}
                     if args.answer == "greedy" else {})}
                 for r in ordered]
    run.write_csv(CELLS_FILE, cell_rows, CELLS_COLUMNS + (GREEDY_COLUMNS if args.answer == "greedy" else ()))
    run.write_csv(HEADS_FILE, head_rows(grid, kinds, ranked), HEADS_COLUMNS)
    if ablation_rows:
        run.write_csv(ABLATION_FILE, ablation_rows, ABLATION_COLUMNS)
    results = summarise(grid, kinds, ranked, cell_rows, ablation_rows, prompt, args, needles)
    log_summary(run, results)
    if not args.no_figures:
        from bertscope.analyses.heads.retrieval import plots

        label = f"{model_name(loaded.path)}, {prompt} prompt"
        run.save_figure(plots.plot_needle(cell_rows, label), NEEDLE_FIGURE)
        run.save_figure(plots.plot_heads(grid, label), HEADS_FIGURE)
        if ablation_rows:
            run.save_figure(plots.plot_ablation(ablation_rows, label), ABLATION_FIGURE)
    run.finish(results)


# ----------------------------------------------------------------------------- the plan and its time


def pass_work(loaded, kinds: list[str], length: int) -> float:
    """Multiply-adds of one forward pass over `length` tokens, roughly: every weight of the base
    model but the embeddings once per token, and per layer and head the causal attention's scores
    and weighted values, head_dim each per (query, key) pair, a windowed layer's keys bounded by
    its window."""
    config = loaded.model.config
    base = loaded.model.base_model
    weights = sum(p.numel() for p in base.parameters()) - loaded.model.get_input_embeddings().weight.numel()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    pairs = 0.0
    for kind in kinds:
        w = min(window_keys(kind) or length, length)
        pairs += w * length - w * (w - 1) / 2  # query i sees min(i + 1, w) keys
    return float(weights) * length + 2.0 * loaded.n_heads * head_dim * pairs


def window_keys(kind: str) -> int | None:
    """The keys a row of a layer of this kind sees at most: "window 512" -> 512, the atlas's
    "window ±2 (5 keys)" -> 5; None for "global"."""
    if not kind.startswith("window"):
        return None
    keys = re.search(r"\((\d+) keys\)", kind)
    return int(keys.group(1)) if keys else int(kind.split()[1])


def duration(seconds: float) -> str:
    """'40 s', '12 min', '3 h 05 min'."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class Forecast:
    """The time this call's passes will take: logged once, after the first pass run (`timed`), as
    that pass's time scaled to every pass left by its multiply-adds (`pass_work`); per rank
    under torchrun (the passes are dealt out evenly)."""

    def __init__(self, run, loaded, kinds: list[str], greedy: bool, passes: list[int], size: int = 1):
        self.run, self.loaded, self.kinds, self.greedy, self.size = run, loaded, kinds, greedy, size
        self.total = sum(passes)  # the work of every pass of this call (`cell_work` or `work` each)
        self.said = False
        self._memo: dict[int, float] = {}

    def work(self, length: int) -> float:
        """One forward pass over `length` tokens (an ablation pass: no decoding)."""
        if length not in self._memo:
            self._memo[length] = pass_work(self.loaded, self.kinds, length)
        return self._memo[length]

    def cell_work(self, length: int) -> float:
        """A haystack of the grid: its forward pass; with --answer greedy also the decode, counted
        as a second pass (the prefill over the prompt; the 50 steps at most are small beside it)."""
        return self.work(length) * (2 if self.greedy else 1)

    def timed(self, seconds: float, work: float, what: str):
        if self.said:
            return
        self.said = True
        eta = seconds * max(0.0, self.total / self.size - work) / work  # this rank's share of the work, less this pass
        from tqdm.auto import tqdm

        with tqdm.external_write_mode():  # the line above the progress bar, not through it
            self.run.log(f"the first {what} took {duration(seconds)}: the rest of this call, about {duration(eta)} "
                         "(an estimate: that time scaled to each pass left by its multiply-adds, the weights' per "
                         "token and the attention's per query-key pair; a first pass may also pay warm-up)")


def plan_call(run, args, cells: list, ab_cells: list, ks: list[int], n_needles: int, lengths: list[int],
              depths: list[int], kinds: list[str]) -> Forecast:
    """Log what this call will run (the grid's haystacks, the ablation's passes) and how to cut it,
    before any pass; the Forecast that logs the time once the first pass is timed."""
    greedy = args.answer == "greedy"
    size = 1 if run.world is None else run.world.size
    forecast = Forecast(run, run.loaded, kinds, greedy, [], size)
    done = {c.key for c in cells if (run.dir / CELLS_DIR / f"{c.key}.json").is_file()}
    grid_todo = [c for c in cells if c.key not in done]
    n_variants = len(ks) * (1 + args.draws)  # top k and the random draws; `none` is read off the grid
    ab_todo = [c for c in ab_cells for _ in range(n_variants)] + [c for c in ab_cells if c.key not in
                                                                  {x.key for x in cells}]
    forecast.total = sum(forecast.cell_work(c.length) for c in grid_todo) + \
        sum(forecast.work(c.length) for c in ab_todo)
    tokens = sum(c.length for c in cells)
    plural = lambda n, word: f"{n:,} {word}{'' if n == 1 else 'es' if word.endswith('s') else 's'}"  # noqa: E731
    grid = (f"{plural(len(cells), 'haystack')} ({plural(n_needles, 'needle')} x {plural(len(lengths), 'length')} "
            f"x {plural(len(depths), 'depth')}; lengths {', '.join(f'{n:,}' for n in lengths)} tokens, {tokens:,} "
            "in all), one forward pass each" + (" after a greedy decode of the answer" if greedy else ""))
    if done:
        grid += f", {len(done)} of them done before"
    ab_lengths = ", ".join(f"{n:,}" for n in sorted({c.length for c in ab_cells}))
    ablation = (f"; then the ablation, {plural(len(ab_todo), 'pass')} (the top k and "
                f"{plural(args.draws, 'random draw')} of k heads zeroed, k = {', '.join(map(str, ks))}, over "
                f"{plural(len(ab_cells), 'haystack')} of {ab_lengths} tokens; passes saved by an earlier call "
                "are not run again)" if ks else "; no ablation")
    run.log(f"planned: {grid}{ablation}. To cut it: fewer --lengths, --depths or --needles (e.g. --lengths "
            "1024,2048 --depths 10,50,90 --needles san-francisco), --ablate 0 (no ablation) or fewer k "
            "(--ablate 5), fewer --draws")
    if not grid_todo and not ab_todo:
        forecast.said = True  # nothing to time
    return forecast


# ----------------------------------------------------------------------------- the grid


def saved_records(run: ModelRun, setup: dict, folder: str) -> dict[str, dict]:
    """The records saved in run.dir/folder of this setup, by file name; one of another setup is
    refused (the directory holds another model's, prompt's, corpus's or needles' haystacks)."""
    from bertscope.analyses.heads.retrieval.stats import load_cell

    out = {}
    for path in sorted((run.dir / folder).glob("*.json")):
        record = load_cell(path)
        if record is None:
            continue
        if not same_setup(record.get("setup"), setup):
            raise UserError(f"{path} belongs to another run ({setup_difference(record.get('setup'), setup)}): "
                            "give another --out")
        out[path.stem] = record
    return out


def earlier_records(run: ModelRun, setup: dict) -> dict[str, dict]:
    """`saved_records` of the grid's folder, read on rank 0 and sent to every rank (so that every
    rank ranks the heads, and draws the ablation's units, alike)."""
    records, error = None, None
    if run.is_main:
        try:
            records = saved_records(run, setup, CELLS_DIR)
        except UserError as e:
            error = str(e)
    if run.world is not None and run.world.size > 1:
        from bertscope.engine.distributed import broadcast

        records, error = broadcast(run.world, (records, error))
    if error is not None:
        raise UserError(error)
    return records


def setup_difference(a: dict | None, b: dict) -> str:
    """What the one-line refusal of another run's record says differs."""
    answer = lambda s: (s or {}).get("answer", "reference")  # noqa: E731
    if answer(a) != answer(b):
        return f"its haystacks were scored with --answer {answer(a)}, this call's with --answer {answer(b)}"
    return "model, prompt, corpus or needles differ"


def same_setup(a: dict | None, b: dict) -> bool:
    """Setups agree on what makes a haystack and its score (the model by name and type, the
    --answer mode: a setup without one is a reference run's)."""
    if a is None:
        return False
    if a.get("answer", "reference") != b.get("answer", "reference"):
        return False
    keys = ("prompt", "corpus", "text_field")
    model = lambda s: {k: s["model"].get(k) for k in ("type", "layers", "heads", "path", "id", "commit")}  # noqa: E731
    return all(a.get(k) == b.get(k) for k in keys) and model(a) == model(b) and \
        all(a["needles"].get(n) == v for n, v in b["needles"].items() if n in a["needles"])


def gather(run: ModelRun, mine: dict) -> dict:
    """Every rank's records merged (torchrun), or `mine` in a single process."""
    if run.world is None or run.world.size == 1:
        return mine
    import torch.distributed as dist

    everyone = [None] * run.world.size
    dist.all_gather_object(everyone, mine)
    return {k: v for part in everyone for k, v in part.items()}


def run_cells(run: ModelRun, args, builder, needles: dict, cells: list, setup: dict,
              forecast: Forecast | None = None) -> dict[str, dict]:
    """Score this rank's share of the cells, each saved as it finishes; cells saved before are
    read back, not run. Returns every rank's records, by cell key. `forecast`: told the time of
    the first haystack run (it then logs the estimate of the rest)."""
    from tqdm.auto import tqdm

    from bertscope.analyses.heads.retrieval.stats import cell_record, load_cell, save_cell, score_haystack

    world = run.world
    rank, size = (0, 1) if world is None else (world.rank, world.size)
    mine = [c for i, c in enumerate(cells) if i % size == rank]
    folder = run.dir / CELLS_DIR
    records = {}
    for c in mine:
        record = load_cell(folder / f"{c.key}.json")
        if record is not None:
            if not same_setup(record.get("setup"), setup):
                raise UserError(f"{folder / (c.key + '.json')} belongs to another run "
                                f"({setup_difference(record.get('setup'), setup)}): give another --out")
            records[c.key] = record
    todo = [c for c in mine if c.key not in records]
    if records:
        run.log(f"{len(records)} of {len(cells)} haystacks done before: resuming")
    with tqdm(total=len(mine), initial=len(mine) - len(todo), unit="haystack", disable=not run.progress,
              desc="haystacks") as bar:
        for c in todo:
            bar.set_postfix_str(f"{c.needle}, {c.length} tokens, depth {c.depth}%")
            t0 = time.perf_counter()
            hay = builder.build(needles[c.needle], c.length, c.depth)
            greedy = None
            if args.answer == "greedy":
                hay, greedy = own_answer(run.loaded, hay, needles[c.needle])
            score = score_haystack(run.loaded, hay, backend=args.backend)
            record = {**cell_record(c, hay, score, greedy), "setup": setup}
            save_cell(folder / f"{c.key}.json", record)
            records[c.key] = record
            if forecast is not None:
                forecast.timed(time.perf_counter() - t0, forecast.cell_work(c.length), f"haystack ({c.length} tokens)")
            bar.update()
    return gather(run, records)


def own_answer(loaded, hay, needle) -> tuple:
    """(the haystack with the model's own greedy answer, its record {"answer_text", "recall",
    "answered"}): Wu et al.'s criterion, the answer's words recall more than half of the reference's. The
    answer stops where the model's positions end (`loaded.max_len`)."""
    from bertscope.analyses.heads.retrieval.stats import MAX_NEW_TOKENS, RECALL, greedy_answer, word_recall

    # the answer is decoded, then teacher forced after the prompt: the two together within the model's
    # positions (GPT-2's learned position table has no row past them: an IndexError, found on a tiny GPT-2)
    room = min(MAX_NEW_TOKENS, loaded.max_len - len(hay.prompt_ids))
    ids = greedy_answer(loaded, hay.prompt_ids, room) if room > 0 else ()
    text = loaded.tokenizer.decode(list(ids), skip_special_tokens=True)
    recall = word_recall(needle.answer, text)
    return hay.with_answer(ids), {"answer_text": text, "recall": recall, "answered": recall > RECALL}


# ----------------------------------------------------------------------------- the ablation


def run_ablation(run: ModelRun, args, builder, needles: dict, cells: list, records: dict, ranked: list, ks: list,
                 setup: dict, forecast: Forecast | None = None) -> list[dict]:
    """The needle test with the top-k heads zeroed and with k random heads zeroed: one row per
    gating (`none` first, read off the grid's cells where they were run), each (gating, cell)
    saved as it finishes."""
    from tqdm.auto import tqdm

    from bertscope.analyses.heads.induction.stats import random_head_sets, zero_gates
    from bertscope.analyses.heads.retrieval.stats import load_cell, save_cell, score_haystack

    loaded = run.loaded
    L, H = loaded.n_layers, loaded.n_heads
    variants = [("none", 0, 0, [])]
    for k in ks:
        variants.append(("top", k, 0, sorted(ranked[:k])))
        variants += [("random", k, r + 1, hs)
                     for r, hs in enumerate(random_head_sets(L, H, k, ranked[:k], args.draws, args.seed + k))]
    units = [(v, c) for v in variants for c in cells]
    world = run.world
    rank, size = (0, 1) if world is None else (world.rank, world.size)
    folder = run.dir / ABLATION_DIR
    results = {}

    def name(v, c):
        return f"{v[0]}{v[1]}-{v[2]}_{c.key}"

    mine = [(v, c) for i, (v, c) in enumerate(units) if i % size == rank]
    todo = []
    for v, c in mine:
        if v[0] == "none" and c.key in records:
            r = records[c.key]
            results[name(v, c)] = {"copied": r["copied"], "answer_logprob": r["answer_logprob"],
                                   "token_accuracy": r["token_accuracy"], "heads": []}
            continue
        saved = load_cell(folder / f"{name(v, c)}.json")
        if saved is not None and saved.get("heads") == [list(h) for h in v[3]] and same_setup(saved.get("setup"),
                                                                                              setup):
            results[name(v, c)] = saved
        else:
            todo.append((v, c))
    with tqdm(total=len(mine), initial=len(mine) - len(todo), unit="haystack", disable=not run.progress,
              desc="ablation") as bar:
        for v, c in todo:
            bar.set_postfix_str(f"{v[0]} {v[1]}, {c.length} tokens, depth {c.depth}%")
            t0 = time.perf_counter()
            hay = builder.build(needles[c.needle], c.length, c.depth)
            if args.answer == "greedy":  # the cell's own answer, teacher forced under the gates
                hay = hay.with_answer(records[c.key]["reference"]) if c.key in records else \
                    own_answer(loaded, hay, needles[c.needle])[0]
            gates = zero_gates(L, H, v[3]) if v[3] else None
            s = score_haystack(loaded, hay, gates=gates, backend=args.backend)
            record = {"copied": s.copied, "answer_logprob": s.answer_logprob, "token_accuracy": s.token_accuracy,
                      "heads": [list(h) for h in v[3]], "setup": setup}
            save_cell(folder / f"{name(v, c)}.json", record)
            results[name(v, c)] = record
            if forecast is not None:
                forecast.timed(time.perf_counter() - t0, forecast.work(c.length), f"ablation pass ({c.length} tokens)")
            bar.update()
    results = gather(run, results)
    if not run.is_main:
        return []
    rows = []
    base = None
    for v in variants:
        got = [results[name(v, c)] for c in cells]
        logprob = float(sum(r["answer_logprob"] for r in got) / len(got))
        if v[0] == "none":
            base = logprob
        rows.append({"ablation": v[0], "k": v[1], "draw": v[2], "heads": head_str(v[3]), "cells": len(got),
                     "accuracy": float(sum(bool(r["copied"]) for r in got) / len(got)),
                     "token_accuracy": float(sum(r["token_accuracy"] for r in got) / len(got)),
                     "answer_logprob": logprob, "delta_logprob": logprob - base})
    return rows


def read_ablation(path) -> list[dict]:
    """The rows of a retrieval_ablation.csv, typed as `run_ablation` returns them."""
    import csv

    ints, floats = ("k", "draw", "cells"), ("accuracy", "token_accuracy", "answer_logprob", "delta_logprob")
    with open(path, newline="", encoding="utf-8") as f:
        return [{c: int(v) if c in ints else float(v) if c in floats else v for c, v in row.items()}
                for row in csv.DictReader(f)]


# ----------------------------------------------------------------------------- outputs


def head_str(heads) -> str:
    """'3-1 5-2': (layer, head) pairs from 1."""
    return " ".join(f"{lay + 1}-{h + 1}" for lay, h in heads)


def head_rows(grid, kinds: list[str], ranked: list) -> list[dict]:
    L, H = grid.answered.shape
    rank = {hd: i + 1 for i, hd in enumerate(ranked)}
    return [{"layer": lay + 1, "head": h + 1, "layer_kind": kinds[lay], "score": float(grid.answered[lay, h]),
             "n_answered": grid.n_answered, "score_all": float(grid.all[lay, h]), "n_cells": grid.n_cells,
             "far_score": float(grid.far[lay, h]), "far_score_all": float(grid.far_all[lay, h]),
             "rank": rank[(lay, h)]} for lay in range(L) for h in range(H)]


def summarise(grid, kinds, ranked, cell_rows, ablation_rows, prompt, args, needles) -> dict:
    import numpy as np  # see the note above `logger`

    from bertscope.analyses.heads.retrieval.stats import FAR, RECALL, rank_heads

    L, H = grid.answered.shape
    score = grid.answered if grid.n_answered else grid.all
    # the heads that score (> 0) only: past them the ranking is ties at 0 in layer-major order
    top = [{"head": f"{lay + 1}-{h + 1}", "layer_kind": kinds[lay], "score": float(grid.answered[lay, h]),
            "score_all": float(grid.all[lay, h]), "ranked_score": float(score[lay, h])}
           for lay, h in ranked[:10] if score[lay, h] > 0]
    greedy = args.answer == "greedy"
    accuracy = {}
    for r in cell_rows:
        a = accuracy.setdefault(str(r["length"]), {"cells": 0, "copied": 0, "answer_logprob": 0.0,
                                                   **({"recall": 0.0} if greedy else {})})
        a["cells"] += 1
        a["copied"] += r.get("answered", r["copied"])  # greedy: answered (word recall), not copied
        a["answer_logprob"] += r["answer_logprob"]
        if greedy:
            a["recall"] += r["recall"]
    for a in accuracy.values():
        a["accuracy"] = a["copied"] / a["cells"]
        a["answer_logprob"] /= a["cells"]
        if greedy:
            a["recall"] /= a["cells"]
    far = grid.far if grid.n_answered else grid.far_all  # no answered haystack: the far hits of all of them
    far_heads = [(lay, h) for lay in range(L) for h in range(H) if far[lay, h] > 0]
    far_layers = sorted({lay for lay, _ in far_heads})
    results = {
        **({"answer": args.answer, "answered_by": f"word recall of the greedy answer > {RECALL}"}
           if args.answer == "greedy" else {}),
        "prompt": prompt, "corpus": args.corpus, "needles": [n.name for n in needles],
        "lengths": sorted({r["length"] for r in cell_rows}), "depths": sorted({r["depth"] for r in cell_rows}),
        "cells": grid.n_cells, "answered": grid.n_answered,
        "ranked_by": "answered" if grid.n_answered else "all haystacks (none answered)",
        "accuracy_by_length": accuracy,
        "heads": L * H,
        "heads_above_0.1": int((grid.answered > 0.1).sum()),
        "fraction_above_0.1": float((grid.answered > 0.1).mean()),
        "heads_above_0.1_all": int((grid.all > 0.1).sum()),
        "max_score": float(score.max()),
        "top_heads": top,
        "far": {"tokens": FAR, "over": "answered" if grid.n_answered else "all haystacks",
                "heads": [f"{lay + 1}-{h + 1}" for lay, h in far_heads],
                "top": [{"head": f"{lay + 1}-{h + 1}", "layer_kind": kinds[lay], "far_score": float(far[lay, h])}
                        for lay, h in rank_heads(far)[:5] if far[lay, h] > 0],
                "layers": {str(lay + 1): kinds[lay] for lay in far_layers},
                "all_global": all(kinds[lay] == "global" for lay in far_layers),
                "windowed_layers": sum(k != "global" for k in kinds)},
    }
    if ablation_rows:
        ab = {}
        for k in sorted({r["k"] for r in ablation_rows if r["k"]}):
            t = next(r for r in ablation_rows if r["ablation"] == "top" and r["k"] == k)
            rnd = [r for r in ablation_rows if r["ablation"] == "random" and r["k"] == k]
            # the top k past the heads that score at all are ties at 0, taken in layer-major order
            ab[str(k)] = {"top": {c: t[c] for c in ("heads", "accuracy", "answer_logprob", "delta_logprob")},
                          "top_scoring": int(sum(score[lay, h] > 0 for lay, h in ranked[:k])),
                          "random": {c: float(np.mean([r[c] for r in rnd])) for c in
                                     ("accuracy", "answer_logprob", "delta_logprob")},
                          "random_accuracy": [r["accuracy"] for r in rnd], "random_heads": [r["heads"] for r in rnd]}
        none = ablation_rows[0]
        results["ablation"] = {"cells": none["cells"], "none": {c: none[c] for c in ("accuracy", "answer_logprob")},
                               "by_k": ab}
    return results


def layer_list(layers: dict, windowed: int) -> str:
    """"6 (global), 12 (global)" where the model has windowed layers; "18, 19" where every layer
    is global (the kind would say nothing)."""
    return ", ".join(f"{k} ({v})" if windowed else k for k, v in layers.items())


def top_list(r: dict, n: int = 5) -> str:
    """The top heads that score, "19-8 0.68, 21-7 0.54", or "none scores above 0"."""
    return ", ".join(f"{t['head']} {ranked_score(t, r):.2f}" for t in r["top_heads"][:n]) or "none scores above 0"


def log_summary(run, r: dict):
    how = r.get("answered_by", "exact copy")
    run.log(f"{r['cells']} haystacks ({r['prompt']} prompt), {r['answered']} answered ({how}): "
            + ", ".join(f"{length} tokens {a['copied']}/{a['cells']}" for length, a in r["accuracy_by_length"].items()))
    run.log(f"retrieval score > 0.1: {r['heads_above_0.1']} of {r['heads']} heads ({r['fraction_above_0.1']:.1%}); "
            f"top: {top_list(r)}"
            + ("" if r["answered"] else " (no haystack answered: ranked by the score over all haystacks)"))
    far = r["far"]
    if far["heads"]:
        run.log(f"heads that retrieve from more than {far['tokens']} tokens back ({far['over']}): "
                f"{' '.join(far['heads'])}, in layers {layer_list(far['layers'], far['windowed_layers'])}")
    for k, a in (r.get("ablation") or {}).get("by_k", {}).items():
        run.log(f"top {k} zeroed: accuracy {a['top']['accuracy']:.2f}, log-prob {a['top']['answer_logprob']:.2f}; "
                f"{k} random: accuracy {a['random']['accuracy']:.2f}, log-prob {a['random']['answer_logprob']:.2f}")


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the argmax."""
    from bertscope.analyses.heads.retrieval.stats import retrieval_spec

    return {"retrieval": retrieval_spec(model)}
