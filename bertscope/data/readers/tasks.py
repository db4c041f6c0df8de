"""Task data: RTE 1-3, sentence polarity and ARCT (original and Niven & Kao's adversarial set).

Every reader returns plain dataclasses of text and gold labels, split as the papers used them:

- RTE (`rte/`): test = RTE3 test (800 pairs, what Kovaleva et al. report on); train = every other
  file (RTE1 dev/test, RTE2 dev/test, RTE3 dev); dev = a seeded, stratified 10% of that training
  pool, held out for model selection (the RTE test set is never looked at for it).
- Sentence polarity (`sentence_polarity/`, the source of SST-2): a seeded, stratified
  80/10/10 train/dev/test split of the 5,331 + 5,331 sentences (label 1 = positive).
- ARCT (`arct/`): the original train/dev/test (1,210/316/444) and Niven & Kao's adversarial
  set: train = `train-swapped` (2,420), dev/test = `dev-adv-negated`/`test-adv-negated`
  (632/888), as their erratum says.

Labels are ints: RTE 1 = entailment, polarity 1 = positive, ARCT = index (0/1) of the correct
warrant.
"""
from __future__ import annotations

import csv
import random
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from bertscope.data.paths import dataset_dir
from bertscope.errors import UserError

TASKS = ("rte", "polarity", "arct")
SPLITS = ("train", "dev", "test")
ARCT_VERSIONS = ("original", "adversarial")
# what an ARCT input's first segment holds (bertscope.tasks.inputs builds them; named here, where
# `bertscope finetune --arct-inputs` reads it without torch)
ARCT_INPUTS = ("full", "W", "RW", "CW", "RCW")
DEV_FRACTION = 0.1

RTE_TRAIN_FILES = ("rte1_dev.xml", "rte1_test.xml", "rte2_dev.xml", "rte2_test.xml", "rte3_dev.xml")
RTE_TEST_FILES = ("rte3_test.xml",)
ARCT_FILES = {
    "original": {"train": "original/train.tsv", "dev": "original/dev.tsv", "test": "original/test.tsv"},
    "adversarial": {"train": "adversarial/train-swapped.csv", "dev": "adversarial/dev-adv-negated.csv",
                    "test": "adversarial/test-adv-negated.csv"},
}


@dataclass(frozen=True)
class TaskExample:
    """One labelled input: a sentence (`text_b` None) or a sentence pair."""
    id: str
    text_a: str
    text_b: str | None
    label: int


@dataclass(frozen=True)
class ArctExample:
    """One ARCT argument: claim, reason and two candidate warrants; `label` is the correct one."""
    id: str
    claim: str
    reason: str
    warrant0: str
    warrant1: str
    label: int
    debate_title: str = ""
    debate_info: str = ""

    @property
    def warrants(self) -> tuple[str, str]:
        return (self.warrant0, self.warrant1)


# ----------------------------------------------------------------------------- splits

def stratified_split(labels: list[int], fractions: tuple[float, ...], seed: int) -> list[list[int]]:
    """Indices split per label in the given fractions (the last part takes the rest), seeded.

    Each label's indices are shuffled with `random.Random(seed)` and cut in order, so every part
    keeps the label balance and the split depends only on the seed and the data's order.
    """
    rng = random.Random(seed)
    parts: list[list[int]] = [[] for _ in fractions]
    for label in sorted(set(labels)):
        idx = [i for i, y in enumerate(labels) if y == label]
        rng.shuffle(idx)
        start = 0
        for p, fraction in enumerate(fractions):
            stop = len(idx) if p == len(fractions) - 1 else start + round(fraction * len(idx))
            parts[p].extend(idx[start:stop])
            start = stop
    return [sorted(part) for part in parts]


def _check_split(split: str, allowed=SPLITS + ("all",)):
    if split not in allowed:
        raise UserError(f"unknown split {split!r}: choose one of {', '.join(allowed)}")


# ----------------------------------------------------------------------------- RTE

def read_rte_file(path: str | Path) -> list[TaskExample]:
    """One RTE XML file; `value=TRUE/FALSE` (RTE1) or `entailment=YES/NO` (RTE2-3)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as error:
        raise UserError(f"cannot read RTE file {path}: {error}") from None
    challenge = root.get("challenge", path.stem)
    examples = []
    for pair in root.iter("pair"):
        raw = pair.get("value", pair.get("entailment"))
        if raw not in ("TRUE", "FALSE", "YES", "NO"):
            raise UserError(f"{path}: pair {pair.get('id')} has no TRUE/FALSE or YES/NO label")
        text, hypothesis = pair.findtext("t"), pair.findtext("h")
        if text is None or hypothesis is None:
            raise UserError(f"{path}: pair {pair.get('id')} lacks <t> or <h>")
        examples.append(TaskExample(id=f"rte{challenge}-{path.stem.split('_')[-1]}-{pair.get('id')}",
                                    text_a=" ".join(text.split()), text_b=" ".join(hypothesis.split()),
                                    label=int(raw in ("TRUE", "YES"))))
    return examples


def read_rte(split: str = "all", data_dir: str | None = None, seed: int = 0) -> list[TaskExample]:
    """RTE pairs (text, hypothesis); label 1 = entailment. See the module docstring for splits."""
    _check_split(split)
    folder = dataset_dir("rte", data_dir)
    if split == "test":
        return [ex for name in RTE_TEST_FILES for ex in read_rte_file(folder / name)]
    pool = [ex for name in RTE_TRAIN_FILES for ex in read_rte_file(folder / name)]
    if split == "all":
        return pool + read_rte("test", data_dir)
    train, dev = stratified_split([ex.label for ex in pool], (1 - DEV_FRACTION, DEV_FRACTION), seed)
    return [pool[i] for i in (train if split == "train" else dev)]


# ----------------------------------------------------------------------------- polarity

def read_polarity(split: str = "all", data_dir: str | None = None, seed: int = 0) -> list[TaskExample]:
    """Pang & Lee sentence polarity; label 1 = positive; seeded stratified 80/10/10 split."""
    _check_split(split)
    folder = dataset_dir("sentence_polarity", data_dir)
    examples = []
    for label, name in ((0, "rt-polarity.neg"), (1, "rt-polarity.pos")):
        try:
            lines = (folder / name).read_text(encoding="latin-1").splitlines()
        except OSError as error:
            raise UserError(f"cannot read {folder / name}: {error.strerror}") from None
        examples += [TaskExample(id=f"{name.split('.')[-1]}-{i}", text_a=line.strip(), text_b=None, label=label)
                     for i, line in enumerate(lines) if line.strip()]
    if split == "all":
        return examples
    parts = stratified_split([ex.label for ex in examples], (0.8, 0.1, 0.1), seed)
    return [examples[i] for i in parts[SPLITS.index(split)]]


# ----------------------------------------------------------------------------- ARCT

def read_arct_file(path: str | Path) -> list[ArctExample]:
    """One ARCT file: tab-separated with a `#id` header (column order differs between files)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except OSError as error:
        raise UserError(f"cannot read ARCT file {path}: {error.strerror}") from None
    need = ("#id", "warrant0", "warrant1", "correctLabelW0orW1", "reason", "claim")
    if rows and any(key not in rows[0] for key in need):
        raise UserError(f"{path}: expected the columns {', '.join(need)}")
    return [ArctExample(id=row["#id"], claim=row["claim"], reason=row["reason"], warrant0=row["warrant0"],
                        warrant1=row["warrant1"], label=int(row["correctLabelW0orW1"]),
                        debate_title=row.get("debateTitle") or "", debate_info=row.get("debateInfo") or "")
            for row in rows]


def read_arct(split: str = "train", version: str = "original", data_dir: str | None = None) -> list[ArctExample]:
    """ARCT arguments of one split of the original or the adversarial (Niven & Kao) data."""
    _check_split(split)
    if version not in ARCT_VERSIONS:
        raise UserError(f"unknown ARCT version {version!r}: choose original or adversarial")
    folder = dataset_dir("arct", data_dir)
    if split == "all":
        return [ex for s in SPLITS for ex in read_arct(s, version, data_dir)]
    return read_arct_file(folder / ARCT_FILES[version][split])


# ----------------------------------------------------------------------------- one entry point

def read_task(task: str, split: str, data_dir: str | None = None, seed: int = 0,
              version: str = "original") -> list[TaskExample] | list[ArctExample]:
    """Any task's split by name: `rte`, `polarity` (TaskExample) or `arct` (ArctExample)."""
    if task == "rte":
        return read_rte(split, data_dir, seed)
    if task == "polarity":
        return read_polarity(split, data_dir, seed)
    if task == "arct":
        return read_arct(split, version, data_dir)
    raise UserError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
