"""Task examples as model rows, and model outputs back as per-example predictions.

Two kinds of task (Kovaleva et al. 2019; Niven & Kao 2019):

    classify  RTE (text, hypothesis) and sentence polarity (one sentence): one row per
              example, prediction = argmax of the classifier's logits, label = the class.
    choice    ARCT: one row per candidate warrant, the claim and reason as the first segment
              and the warrant as the second, as Niven & Kao scored them; prediction = the
              warrant with the higher score, label = the index of the correct warrant. A
              one-logit head's score is that logit (their softmax over the two warrants is
              monotone in it); a two-logit head's is logit[1] - logit[0], the log-odds that
              this warrant is the right one.

ARCT's first segment can be chosen (`ARCT_INPUTS`): claim and reason (`full`, as Niven & Kao's
text says), reason and claim (`RCW`, the order of their Figure 3's caption), none (`W`, the
warrant alone), the reason (`RW`) or the claim (`CW`), which probe for cues in the warrants.
Inputs are the tokenizer's own `[CLS] a [SEP] b [SEP]` template
(RoBERTa's `<s> a </s></s> b </s>`), cut to `max_len` tokens by the tokenizer's longest-first
truncation. This is the one task encoder: `bertscope finetune` trains on it and the `heads`
commands evaluate on it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bertscope.data.readers.tasks import ARCT_INPUTS  # named there, for parsers built without torch
from bertscope.errors import UserError
from bertscope.text.segments import pad_rows

TASK_LABELS = {"rte": 2, "polarity": 2}  # classes of a classify task's head
CHOICE_TASKS = {"arct": 2}  # candidates per example of a choice task


@dataclass
class EncodedTask:
    """A task split as model rows.

    rows:     token ids of every model input (one per example, or one per candidate)
    types:    token type ids of every row (None when the tokenizer gives none)
    labels:   (N,) int64 gold label of every example
    per_example: rows per example (1 for classify, the candidates for choice)
    kind:     "classify" or "choice"
    """

    task: str
    rows: list[list[int]]
    types: list[list[int]] | None
    labels: np.ndarray
    per_example: int
    kind: str
    truncated: int = 0  # rows the tokenizer cut to max_len

    @property
    def n_examples(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        """(N,) the longest row of each example: what its batch is padded to."""
        n = np.array([len(r) for r in self.rows], dtype=np.int64).reshape(self.n_examples, self.per_example)
        return n.max(1) if self.n_examples else np.zeros(0, dtype=np.int64)

    @property
    def pairwise(self) -> bool:
        """A choice task: one score per candidate row, a softmax over an example's candidates."""
        return self.kind == "choice"

    def batch(self, examples, pad_id: int, device="cpu", with_types: bool | None = None) -> dict[str, torch.Tensor]:
        """Padded model inputs of `examples` (indices), their rows in order: (b * per_example, L).
        with_types: give token_type_ids (zeros where the tokenizer made none); default: when the
        tokenizer made them."""
        idx = [e * self.per_example + k for e in examples for k in range(self.per_example)]
        types = None if self.types is None else [self.types[i] for i in idx]
        inputs = pad_rows([self.rows[i] for i in idx], types, pad_id,
                          with_types=self.types is not None if with_types is None else with_types)
        return {k: t.to(device) for k, t in inputs.items()}

    def example_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(R, C) logits of R = b * per_example rows -> (b, classes) logits of the examples: a choice
        task's candidate scores side by side, what its softmax (and `task_model.point_loss`) takes."""
        if self.kind == "classify":
            return logits
        score = logits[:, 0] if logits.shape[-1] == 1 else logits[:, 1] - logits[:, 0]  # (R,)
        return score.view(-1, self.per_example)  # (b, per_example)

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """(R, C) logits of R = b * per_example rows -> (b,) predicted labels."""
        return self.example_logits(logits).argmax(-1)


def arct_segments(example, variant: str) -> list[tuple[str, str | None]]:
    """The two (first segment, warrant) inputs of an ARCT data point for one input variant."""
    if variant not in ARCT_INPUTS:
        raise UserError(f"unknown ARCT input {variant!r}: choose one of {', '.join(ARCT_INPUTS)}")
    first = {"full": f"{example.claim} {example.reason}", "RCW": f"{example.reason} {example.claim}", "W": None,
             "RW": example.reason, "CW": example.claim}[variant]
    return [(w, None) if first is None else (first, w) for w in example.warrants]


def pair_texts(task: str, example, arct_input: str = "full") -> list[tuple[str, str | None]]:
    """The (first, second) segments of an example's rows."""
    if task in CHOICE_TASKS:
        return arct_segments(example, arct_input)
    return [(example.text_a, example.text_b)]


def encode_task(task: str, examples, tokenizer, max_len: int = 128, arct_input: str = "full") -> EncodedTask:
    """Tokenise a split of `task` (see the module docstring)."""
    if task not in TASK_LABELS and task not in CHOICE_TASKS:
        raise UserError(f"unknown task {task!r}: choose one of {', '.join([*TASK_LABELS, *CHOICE_TASKS])}")
    pairs = [p for ex in examples for p in pair_texts(task, ex, arct_input)]
    firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    single = all(b is None for b in seconds)
    enc = tokenizer(firsts, None if single else seconds, truncation=True, max_length=max_len)
    full = tokenizer(firsts, None if single else seconds, truncation=False)["input_ids"]
    truncated = sum(len(f) > max_len for f in full)
    kind = "choice" if task in CHOICE_TASKS else "classify"
    return EncodedTask(task=task, rows=enc["input_ids"], types=enc.get("token_type_ids"),
                       labels=np.array([ex.label for ex in examples], dtype=np.int64),
                       per_example=CHOICE_TASKS.get(task, 1), kind=kind, truncated=truncated)


def check_head(task: str, loaded) -> None:
    """A UserError unless the model has a trained classification head that fits `task`."""
    if loaded.head_initialised:
        raise UserError(f"{loaded.path} has no sequence-classification head (fine-tune it first: "
                        f"bertscope finetune --task {task})")
    n = loaded.model.config.num_labels
    want = (1, 2) if task in CHOICE_TASKS else (TASK_LABELS[task],)
    if n not in want:
        raise UserError(f"the classification head in {loaded.path} has {n} labels; task {task} needs "
                        f"{' or '.join(map(str, want))}")
