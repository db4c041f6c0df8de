"""How the report quotes a paper: a number with its source, and the papers quoted.

Each analysis keeps the numbers and statements its section prints beside a run's own in its
`paper.py` (`bertscope.analyses.<family>.paper`), built from these types; the registry
(`bertscope.analyses.PAPER_SOURCES`) lists their sources for the report's footer. Every number
is copied from the paper (../shared/papers: clark2019-what-does-bert-look-at.txt,
kovaleva2019-revealing-dark-secrets.txt, michel2019-niven2019-definitions.txt), never derived.
Accuracies are in percent, as printed in the paper. A `Source` says which paper, which table or
figure, on which model and data, so a reader can tell how comparable the two columns are.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    paper: str
    where: str  # table / figure / section
    model: str
    data: str

    def __str__(self) -> str:
        return f"{self.paper} {self.where}: {self.model} on {self.data}"

    @property
    def short(self) -> str:
        return f"{self.paper} {self.where}, {self.model}"


@dataclass(frozen=True)
class Number:
    value: float
    source: Source


# the papers quoted, as a Source names them
CLARK = "Clark et al. (2019)"  # What Does BERT Look At? An Analysis of BERT's Attention
NIVEN = "Niven & Kao (2019)"  # Probing Neural Network Comprehension of Natural Language Arguments
KOVALEVA = "Kovaleva et al. (2019)"  # Revealing the Dark Secrets of BERT
MICHEL = "Michel et al. (2019)"  # Are Sixteen Heads Really Better than One?
BERT_BASE = "bert-base-uncased"  # the model of most of the papers' numbers
