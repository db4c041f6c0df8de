"""Retrieval heads (Wu et al. 2024) from one teacher-forced forward pass per haystack.

Wu et al.'s code (nightdessert/Retrieval_Head, retrieval_head_detection.py) prefills the prompt
but its last token, then decodes greedily, one token per step, with the attention maps of that
step's row. At a step that produces token t, head h scores 1/|needle| when its most-attended key
j (top-1) lies in the needle span and the prompt's token at j is t. Decoding stops at a newline;
a haystack counts when the answer recalls at least half of the needle's words (ROUGE-1 recall >
50), and a head's retrieval score is the mean of its per-haystack scores over those haystacks.

Here the prompt and the reference answer run as one input (`haystack.Haystack`). The answer
rows p = answer[0] - 1 .. answer[1] - 2 are the rows Wu et al.'s decode steps would run if the
model generated the reference: the last prompt token, then each answer token but the last. Per
row and head the kernels give the argmax key j (`StatsSpec(argmax=True)`: absolute key
positions, the lowest on ties); head h hits at row p when

    needle[0] <= j < needle[1]  and  input_ids[j] == input_ids[p + 1]

and its score on the haystack is hits / |needle| (`HaystackScore.score`). The LM head runs on the
answer rows only: the model's argmax prediction per row, and the reference answer's
log-probability. Where every prediction equals the reference token ("copied"), greedy decoding
would produce exactly the reference, the decode-time rows are these rows, and the score equals
Wu et al.'s on that haystack (up to where their decoding stops: they score the newline step too,
and whatever the model generates after the answer). Where the model does not copy the answer,
the rows after its first wrong token are not the rows greedy decoding would run: those
haystacks are scored ("all haystacks") but do not enter the retrieval score ("answered").

Answered = copied, a stricter criterion than Wu et al.'s half-of-the-words recall; the token
accuracy (the fraction of answer rows predicted right, teacher forced) is reported beside it.

`--answer greedy` takes Wu et al.'s criterion instead: the model's own greedy answer
(`greedy_answer`: KV-cached greedy decoding, stopping after a newline or end token, that token
kept) is the teacher-forced answer, so the answer rows are exactly their decode steps, and the
haystack counts when its words recall more than half of the reference answer's (`word_recall`).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from bertscope.analyses.heads.retrieval.haystack import Haystack
from bertscope.files import write_text

FAR = 512  # tokens: Gemma-3's sliding window; a hit whose key lies further back is "far"
MAX_NEW_TOKENS = 50  # the longest greedy answer: Wu et al.'s decode_len
RECALL = 0.5  # a greedy answer counts when its word recall of the reference is above this (Wu et al.'s 50)


@dataclass
class HaystackScore:
    """What one teacher-forced pass over a haystack gives.

    hits:       (layers, H) int, the answer rows at which each head hits (module docstring)
    needle_len: |needle span| (tokens)
    predicted:  the model's argmax token at each answer row
    reference:  the reference answer's tokens (what each answer row should predict)
    copied:     every prediction equals the reference token (greedy decoding gives the answer)
    answer_logprob: sum over the answer tokens of log p(reference token | everything before)
    far_hits:   (layers, H) int, the hits whose key lies more than `FAR` tokens before the row
    keys:       (layers, H, R) int, each head's argmax key (absolute position) at each answer row
    """

    hits: np.ndarray
    needle_len: int
    predicted: tuple[int, ...]
    copied: bool
    answer_logprob: float
    reference: tuple[int, ...] = ()
    far_hits: np.ndarray | None = field(default=None, repr=False)
    keys: np.ndarray | None = field(default=None, repr=False)

    @property
    def score(self) -> np.ndarray:
        """(layers, H) float: hits / |needle|, Wu et al.'s per-haystack retrieval score."""
        return self.hits / max(1, self.needle_len)

    @property
    def far_score(self) -> np.ndarray:
        return (self.far_hits if self.far_hits is not None else np.zeros_like(self.hits)) / max(1, self.needle_len)

    @property
    def token_accuracy(self) -> float:
        """Fraction of answer rows whose prediction is the reference token (teacher forced)."""
        if not self.reference:
            return float("nan")
        return float(np.mean(np.asarray(self.predicted) == np.asarray(self.reference)))


def row_hits(argmax: np.ndarray, input_ids, rows, needle: tuple[int, int], far: int = FAR
             ) -> tuple[np.ndarray, np.ndarray]:
    """(hits, far hits), each (layers, H) int64, of the argmax keys `argmax` (layers, H, R) of the
    answer rows `rows` (R positions): a hit at row p is a key j in [needle[0], needle[1]) with
    input_ids[j] == input_ids[p + 1]; a far hit one with p - j > far."""
    ids = np.asarray(input_ids, dtype=np.int64)
    rows = np.asarray(list(rows), dtype=np.int64)  # (R,)
    j = np.asarray(argmax, dtype=np.int64)  # (layers, H, R)
    inside = (j >= needle[0]) & (j < needle[1])
    same = ids[np.clip(j, 0, len(ids) - 1)] == ids[rows + 1]  # (layers, H, R)
    hit = inside & same
    return hit.sum(-1), (hit & (rows - j > far)).sum(-1)


def retrieval_spec(loaded):
    from bertscope.kernels.spec import StatsSpec

    return StatsSpec(argmax=True, n_key_classes=loaded.classes.n_classes)


def score_haystack(loaded, hay: Haystack, gates: torch.Tensor | None = None, backend: str = "auto",
                   progress: bool = False, far: int = FAR) -> HaystackScore:
    """One teacher-forced forward pass over `hay`: the argmax key of every head at the answer
    rows (the kernels' row pass, no attention map), the LM head on those rows only.

    loaded: a decoder loaded with task "causal-lm" (`bertscope.models.loading.load_model`).
    gates:  (layers, H) head gates xi for this pass (0 zeroes a head), or None: as trained.
    """
    from bertscope.engine.loop import stream_batches  # torch's model code: imported with the run
    from bertscope.text.segments import Segment

    L = len(hay.input_ids)
    segment = Segment(input_ids=list(hay.input_ids), token_type_ids=[0] * L, word_ids=[-1] * L, words=[],
                      doc_id=f"{hay.needle_name}-{hay.length}-{hay.depth}", document=0)
    base = replace(loaded, model=loaded.model.base_model)  # the engine runs the base model; the LM head is ours
    rows = list(hay.answer_rows)
    reference = hay.input_ids[hay.answer[0]:hay.answer[1]]
    if gates is not None:
        loaded.gates.xi = gates.float()  # (layers, H): set outside inference mode (the gates track versions)
    try:
        (batch,) = list(stream_batches(base, [segment], retrieval_spec(loaded), batch_size=1, backend=backend,
                                       progress=progress, desc=f"haystack {hay.length} tokens"))
        with torch.no_grad():
            index = torch.tensor(rows, device=batch.inputs["input_ids"].device)
            argmax = torch.stack([s.argmax[0][:, index] for s in batch.layers]).cpu().numpy()  # (layers, H, R)
            hidden = batch.outputs.last_hidden_state[0, index]  # (R, d)
            predicted, answer_logprob = answer_predictions(loaded, hidden, reference)
    finally:
        if gates is not None:
            loaded.gates.reset()
    hits, far_hits = row_hits(argmax, hay.input_ids, rows, hay.needle, far)
    return HaystackScore(hits=hits, needle_len=hay.needle[1] - hay.needle[0], predicted=predicted,
                         copied=predicted == tuple(reference), answer_logprob=answer_logprob,
                         reference=tuple(reference), far_hits=far_hits, keys=argmax)


def answer_predictions(loaded, hidden: torch.Tensor, reference) -> tuple[tuple[int, ...], float]:
    """(the argmax token of each answer row, the sum of the reference tokens' log-probabilities)
    from the final hidden states (R, d) of the answer rows: the LM head (and a config's logit
    soft-cap) on those R rows only, never on the whole input."""
    from bertscope.tasks.lm_loss import lm_head

    head, softcap = lm_head(loaded)
    logits = head(hidden).float()  # (R, V)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logp = torch.log_softmax(logits, -1)  # (R, V)
    target = torch.tensor(list(reference), device=logp.device)  # (R,)
    predicted = tuple(int(t) for t in logits.argmax(-1).cpu())
    return predicted, float(logp.gather(1, target[:, None]).sum().cpu())


# ----------------------------------------------------------------------------- the model's own answer


def answer_words(text: str) -> list[str]:
    """Lower-cased runs of letters and digits: punctuation and spacing dropped (rouge_score's
    tokenizer, without its stemmer)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def word_recall(reference: str, answer: str) -> float:
    """ROUGE-1 recall as a fraction: the reference's words found in the answer, each counted at
    most as often as the answer has it (Wu et al. use rouge_score's ROUGE-1 recall > 50; no
    stemming here, and no dependency). 0 for a reference without words."""
    ref = answer_words(reference)
    if not ref:
        return 0.0
    left: dict[str, int] = {}
    for w in answer_words(answer):
        left[w] = left.get(w, 0) + 1
    found = 0
    for w in ref:
        if left.get(w, 0):
            left[w] -= 1
            found += 1
    return found / len(ref)


def stop_tokens(loaded) -> tuple[set[int], Callable[[int], bool]]:
    """(the end tokens, stop(token)): decoding stops after a token whose text holds a newline (Wu et
    al. stop on their tokenizer's newline token; a byte-level BPE has "\n", ".\n" ...) or after
    an end token: the tokenizer's EOS and the generation config's (a chat template's end of turn)."""
    tok = loaded.tokenizer
    ends = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    config = getattr(loaded.model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None)
    ends |= set(extra if isinstance(extra, (list, tuple)) else [] if extra is None else [extra])
    memo: dict[int, bool] = {}

    def stop(token: int) -> bool:
        if token not in memo:
            memo[token] = token in ends or "\n" in tok.decode([token])
        return memo[token]
    return ends, stop


def cache_of(out) -> dict:
    """The KV cache of a forward pass's output, as the next step's keyword: `cache` in transformers 5's later
    releases, `past_key_values` in 5.0 (make test-oldest found it: 'CausalLMOutputWithPast' object has no
    attribute 'cache')."""
    cache = getattr(out, "cache", None)
    return {"cache": cache} if cache is not None else {"past_key_values": out.past_key_values}


def greedy_answer(loaded, prompt_ids, max_new_tokens: int = MAX_NEW_TOKENS) -> tuple[int, ...]:
    """The model's greedy answer to `prompt_ids`, its stop token included (Wu et al. score the
    step that produces it): the prompt prefilled into a KV cache, then one token per step. The
    bertscope attention computes whole inputs, not cached steps, so the model decodes with
    transformers' SDPA attention and gets bertscope's back after. Every call keeps the logits of
    the last row only (`logits_to_keep=1`): the prefill never builds logits for every prompt row
    (a prompt-length x vocabulary tensor)."""
    from bertscope.models.attention import ATTN_IMPLEMENTATION

    model = loaded.model
    _, stop = stop_tokens(loaded)
    device = next(model.parameters()).device
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([list(prompt_ids)], device=device), use_cache=True,
                        logits_to_keep=1)
            generated = []
            for _ in range(max_new_tokens):
                token = int(out.logits[0, -1].argmax())
                generated.append(token)
                if stop(token):
                    break
                out = model(input_ids=torch.tensor([[token]], device=device), use_cache=True, logits_to_keep=1,
                            **cache_of(out))
    finally:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return tuple(generated)


# ----------------------------------------------------------------------------- cells of the grid


@dataclass(frozen=True)
class Cell:
    """One haystack of the grid: a needle, a length (tokens) and a depth (percent)."""

    needle: str
    length: int
    depth: int

    @property
    def key(self) -> str:
        return f"{self.needle}_L{self.length}_d{self.depth}"


def cell_record(cell: Cell, hay: Haystack, score: HaystackScore, greedy: dict | None = None) -> dict:
    """What a finished cell keeps (JSON): enough to rebuild every output without the model.
    greedy: with --answer greedy, {"answer_text", "recall", "answered"} (the record's "reference"
    is then the model's own answer, the tokens scored)."""
    return {**(greedy or {}), "needle": cell.needle, "length": cell.length, "depth": cell.depth,
            "needle_span": list(hay.needle), "answer_span": list(hay.answer), "distance": hay.distance,
            "needle_len": score.needle_len, "copied": score.copied, "answer_logprob": score.answer_logprob,
            "token_accuracy": score.token_accuracy, "predicted": list(score.predicted),
            "reference": list(score.reference), "hits": score.hits.tolist(),
            "far_hits": (score.far_hits if score.far_hits is not None else np.zeros_like(score.hits)).tolist()}


def save_cell(path: Path, record: dict):
    """Write a cell's record atomically (a crash mid-write leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record))


def load_cell(path: Path) -> dict | None:
    """A saved cell's record, or None when there is none (or it does not parse)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class GridScores:
    """Per-head retrieval scores over the cells of a grid (records of `cell_record`).

    answered: mean over the answered cells of hits / |needle| (Wu et al.'s score); NaN-free, 0
      with no answered cell (n_answered says how many). Answered: the record's "answered" (--answer
      greedy: word recall above RECALL), else "copied" (the reference answer, exactly)
    all:      the same mean over every cell
    far:      the answered mean of the far hits (keys more than FAR tokens back)
    far_all:  the mean of the far hits over every cell
    """

    answered: np.ndarray
    all: np.ndarray
    far: np.ndarray
    n_answered: int
    n_cells: int
    far_all: np.ndarray | None = None

    @classmethod
    def of(cls, records: list[dict], n_layers: int, n_heads: int) -> GridScores:
        zero = np.zeros((n_layers, n_heads))
        if not records:
            return cls(zero, zero.copy(), zero.copy(), 0, 0, zero.copy())
        per = np.stack([np.asarray(r["hits"], float) / max(1, r["needle_len"]) for r in records])  # (N, layers, H)
        far = np.stack([np.asarray(r["far_hits"], float) / max(1, r["needle_len"]) for r in records])
        ok = np.array([bool(r.get("answered", r["copied"])) for r in records])
        answered = per[ok].mean(0) if ok.any() else zero.copy()
        far_answered = far[ok].mean(0) if ok.any() else zero.copy()
        return cls(answered, per.mean(0), far_answered, int(ok.sum()), len(records), far.mean(0))


def rank_heads(scores: np.ndarray) -> list[tuple[int, int]]:
    """(layer, head), 0-based, from the highest score down (ties: layer-major order)."""
    order = np.argsort(-scores.ravel(), kind="stable")
    return [divmod(int(i), scores.shape[1]) for i in order]
