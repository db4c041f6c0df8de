"""Wu et al.'s decode-time retrieval score as an eager loop: the oracle of `bertscope heads
retrieval`'s teacher-forced score (tests/analyses/heads/test_retrieval_decode.py).

Wu et al. 2024 ("Retrieval Head Mechanistically Explains Long-Context Factuality"; their
retrieval_head_detection.py, read, not copied) score a needle-in-a-haystack input this way:

- prefill every prompt token but the last (`prompt[:-1]`, with a KV cache);
- decode greedily: each step feeds one token (first the last prompt token, then the token the
  step before produced) with `output_attentions`, and produces `argmax(logits)`;
- at each step, for every layer and query head, take the argmax key of that step's attention row
  (their `topk(1)`); the head scores 1 / |needle| when that key lies in the needle span
  [start, end) and the prompt token there equals the token this step produced;
- the step is scored first, then decoding stops if the produced token is a newline (their
  Llama `<0x0A>`, or id 144), else after 50 steps;
- the haystack counts (its scores join the heads' means) when ROUGE-1 recall of the needle's
  answer words in the decoded response is above 50%.

The needle span there is the answer phrase inside the needle (their `real_needle`, e.g. "eat a
sandwich and sit in Dolores Park on a sunny day"), found by `find_needle_idx`: the first window
of its token length whose token *set* covers more than 90% of the phrase's token set
(`wu_needle_span` below).

The teacher-forced score reads the same rows in one forward of prompt + reference answer: rows
answer[0] - 1 .. answer[1] - 2 (the last prompt token through the second-to-last answer token),
row p scored against input_ids[p + 1]. When the model's own argmax at every such row is the
reference token, greedy decoding feeds exactly those tokens, so each decode step's attention row
is the teacher-forced row of the same position and the two scores are the same counts. Steps and
rows cover the same positions only if the reference answer ends with the token where decoding
stops (the newline, scored by Wu's loop before it breaks). `teacher_forced_eager` is that score
from the model's own eager maps (`output_attentions` on the whole input), kept here to show, row
by row, why the two differ when the model does not answer.

Argmax ties go to the lowest key index (torch.argmax), in both.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

MAX_NEW_TOKENS = 50  # Wu et al.'s decode_len


@dataclass(frozen=True)
class DecodeScore:
    """Wu et al.'s per-haystack score, from greedy decoding."""
    generated: tuple[int, ...]  # the tokens produced, the stop token included where decoding stopped on one
    hits: np.ndarray  # (layers, heads) int: steps whose argmax key is in the needle and holds the produced token
    keys: np.ndarray  # (steps, layers, heads) int: each step's argmax key, an absolute position
    step_hits: np.ndarray  # (steps, layers, heads) bool: the hits step by step (hits = their sum)
    needle_len: int
    stopped: bool  # True: the last generated token was a stop token; False: MAX_NEW_TOKENS ran out

    @property
    def score(self) -> np.ndarray:
        """(layers, heads): Wu et al.'s retrieval score of this haystack, hits / |needle|."""
        return self.hits / self.needle_len


@dataclass(frozen=True)
class TeacherForcedScore:
    """The teacher-forced score from the model's eager maps of the whole input (the definition)."""
    hits: np.ndarray  # (layers, heads) int
    keys: np.ndarray  # (rows, layers, heads) int: argmax key of each answer row
    predicted: tuple[int, ...]  # the model's argmax token at each answer row
    reference: tuple[int, ...]  # the answer tokens, input_ids[answer[0]:answer[1]]
    needle_len: int

    @property
    def copied(self) -> bool:
        """The model predicts the reference at every answer row: greedy decoding would produce it."""
        return self.predicted == self.reference


def decode_score(model, prompt_ids: Sequence[int], needle: tuple[int, int], stop: Callable[[int], bool],
                 max_new_tokens: int = MAX_NEW_TOKENS) -> DecodeScore:
    """Wu et al.'s loop on one haystack. `model`: a causal LM with eager attention (so that
    `output_attentions` returns the maps); `prompt_ids`: context, needle and question, without the
    answer; `needle`: [start, end) positions in `prompt_ids`; `stop(token)`: where decoding ends."""
    start, end = needle
    ids = [int(t) for t in prompt_ids]  # grows with each produced token: the keys the cache holds
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids[:-1]]), use_cache=True)  # the prefill
        cache, feed = out.cache, ids[-1]
        generated, step_keys, step_hits = [], [], []
        stopped = False
        for _ in range(max_new_tokens):
            out = model(input_ids=torch.tensor([[feed]]), cache=cache, use_cache=True, output_attentions=True)
            cache = out.cache
            token = int(out.logits[0, -1].argmax())
            total = len(ids)  # keys of this step: positions 0 .. total - 1 (the fed token is at total - 1)
            keys = []
            for attention in out.attentions:  # one (1, heads, 1, K) row per layer
                row = attention[0, :, -1]  # (heads, K)
                # a sliding-window layer's cache keeps only its last keys: the row then covers
                # positions total - K .. total - 1, not 0 .. K - 1
                keys.append(row.argmax(dim=-1) + (total - row.shape[-1]))
            keys = torch.stack(keys).numpy()  # (layers, heads)
            in_needle = (keys >= start) & (keys < end)
            step_hits.append(in_needle & (np.asarray(ids)[keys] == token))
            step_keys.append(keys)
            generated.append(token)
            ids.append(token)
            feed = token
            if stop(token):  # scored first, then stopped: as Wu et al.'s loop
                stopped = True
                break
    step_hits = np.stack(step_hits)
    return DecodeScore(generated=tuple(generated), hits=step_hits.sum(axis=0), keys=np.stack(step_keys),
                       step_hits=step_hits, needle_len=end - start, stopped=stopped)


def teacher_forced_eager(model, input_ids: Sequence[int], needle: tuple[int, int],
                         answer: tuple[int, int]) -> TeacherForcedScore:
    """The teacher-forced score from one eager forward with `output_attentions` (L x L maps):
    rows answer[0] - 1 .. answer[1] - 2, row p against input_ids[p + 1]."""
    start, end = needle
    ids = np.asarray(input_ids, dtype=np.int64)
    rows = np.arange(answer[0] - 1, answer[1] - 1)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    keys = torch.stack([a[0][:, rows].argmax(dim=-1) for a in out.attentions]).numpy()  # (layers, heads, rows)
    keys = keys.transpose(2, 0, 1)  # (rows, layers, heads)
    target = ids[rows + 1][:, None, None]
    hits = (((keys >= start) & (keys < end) & (ids[keys] == target)).sum(axis=0)).astype(np.int64)
    predicted = tuple(int(t) for t in out.logits[0, rows].argmax(dim=-1))
    return TeacherForcedScore(hits=hits, keys=keys, predicted=predicted,
                              reference=tuple(int(t) for t in ids[answer[0]:answer[1]]), needle_len=end - start)


def newline_stop(tokenizer) -> Callable[[int], bool]:
    """Stop on any token whose text holds a newline (a byte-level BPE has "\\n", "\\n\\n", ".\\n" ...:
    Wu et al.'s tokenizers had one newline token), or on the end-of-sequence token."""
    eos = tokenizer.eos_token_id
    memo: dict[int, bool] = {}

    def stop(token: int) -> bool:
        if token not in memo:
            memo[token] = token == eos or "\n" in tokenizer.decode([token])
        return memo[token]
    return stop


def rouge1_recall(reference: str, response: str) -> float:
    """ROUGE-1 recall in percent: the reference's words (lower-cased runs of letters and digits)
    found in the response, each counted at most as often as it occurs there. Wu et al. use
    rouge_score with the Porter stemmer; no stemming here (their needles' answers are matched
    word for word by a model that copies them)."""
    def words(text):
        return re.findall(r"[a-z0-9]+", text.lower())
    ref, got = words(reference), words(response)
    if not ref:
        return 0.0
    left: dict[str, int] = {}
    for w in got:
        left[w] = left.get(w, 0) + 1
    found = 0
    for w in ref:
        if left.get(w, 0):
            left[w] -= 1
            found += 1
    return 100.0 * found / len(ref)


def wu_answered(reference: str, response: str) -> bool:
    """Wu et al.'s criterion: the haystack counts when ROUGE-1 recall is above 50 (strictly)."""
    return rouge1_recall(reference, response) > 50


def wu_needle_span(prompt_ids: Sequence[int], phrase_ids: Sequence[int]) -> tuple[int, int]:
    """Wu et al.'s `find_needle_idx`: the first window of len(phrase_ids) tokens whose token set
    holds more than 90% of the phrase's token set; (-1, -1) if none. With more than ten distinct
    tokens in the phrase, a window one token early already passes: their span can start before
    the phrase."""
    want = set(int(t) for t in phrase_ids)
    n = len(phrase_ids)
    for i in range(len(prompt_ids)):
        if len(want & set(int(t) for t in prompt_ids[i:i + n])) / len(want) > 0.9:
            return i, i + n
    return -1, -1
