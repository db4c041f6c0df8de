"""Needle-in-a-haystack inputs for `bertscope heads retrieval` (Wu et al. 2024, after Kamradt's
needle test), built as token ids so that every position the score reads is exact.

One haystack of length L (tokens, the whole teacher-forced input) is

    [template prefix] haystack[:k] needle haystack[k:] question [template suffix] answer

- haystack: real text (Wikipedia by default), one sentence after another (" " + sentence,
  each tokenized alone), cut to what the other parts leave of L; the same text for every depth
  and needle of one length, as in Wu et al.'s code.
- needle: " " + the needle sentence, inserted at k, the sentence boundary of the haystack
  nearest to depth d% of its tokens (0: before the first sentence, 100: after the last token).
  Wu et al. walk back from int(n d / 100) to the previous period; the nearest boundary is
  within one sentence of theirs.
- question and answer, the "plain" prompt (Wu et al.'s for base models):
  "\\nBased on the content of the book, Question: {question}\\nAnswer:" then the answer.
  The "chat" prompt (theirs for instruct models): the user turn
  "<book>{haystack with needle}</book>\\nBased on the content of the book, Question:
  {question}\\nAnswer:" in the tokenizer's chat template, then the answer as the assistant's.

The needle span (`Haystack.needle`) is, as in Wu et al.'s code (`find_needle_idx` of their
`real_needle`), the tokens of the answer inside the needle sentence, not the whole sentence:
the answer must appear word for word in the needle. The needle is tokenized in three pieces
(before the answer, the answer with its leading space, after it), so the span is exact. With
the plain prompt the appended answer is those very tokens (" eat a sandwich ..."), so a head
that copies from the needle can score at every answer row; with the chat prompt the answer is
tokenized alone, as the assistant's turn starts it ("eat" without the space), which is what the
model would generate there.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from bertscope.errors import UserError

NEEDLES_FILE = Path(__file__).with_name("needles.jsonl")  # the default needles (package data)
PROMPTS = ("auto", "plain", "chat")
ANSWERS = ("reference", "greedy")  # --answer: what the teacher-forced pass appends to the prompt
QUESTION = "Based on the content of the book, Question: {question}\nAnswer:"  # Wu et al.'s wording
NEEDLE_KEYS = ("name", "needle", "question", "answer")


@dataclass(frozen=True)
class Needle:
    """A fact to hide, the question that asks for it and its reference answer (a part of the
    needle, word for word)."""

    name: str
    needle: str
    question: str
    answer: str

    def answer_offsets(self) -> tuple[int, int]:
        """[start, end) of the answer in " " + needle, its leading space included when there is one."""
        text = " " + self.needle
        start = text.find(self.answer)
        if not self.answer.strip() or start < 0:
            raise UserError(f"needle {self.name!r}: the answer {self.answer!r} must appear word for word in the "
                            "needle (the score compares the tokens the answer copies with the needle's)")
        end = start + len(self.answer)
        if start > 0 and text[start - 1] == " ":
            start -= 1
        return start, end


def load_needles(path: str | Path | None = None) -> list[Needle]:
    """The needles of a JSON Lines file (one {"name", "needle", "question", "answer"} per line) or
    a YAML file (a list of such mappings); None: the default set (Wu et al.'s San Francisco
    needle, then their Beijing and WMO needles). A file that does not parse, a missing key, a
    duplicate name or an answer not in its needle is refused in one line. `path` may also name
    needles of the default set, comma-separated ("san-francisco", "beijing,wmo"), when no file has
    that name."""
    if path is not None and not Path(path).exists():
        defaults = {n.name: n for n in load_needles()}
        names = [name.strip() for name in str(path).split(",")]
        if all(name in defaults for name in names):
            return [defaults[name] for name in dict.fromkeys(names)]
    path = Path(path) if path is not None else NEEDLES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        names = ", ".join(n.name for n in load_needles())
        raise UserError(f"--needles {path}: cannot read it ({e.strerror or e}); give a needles file or names of "
                        f"the default needles ({names})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # only for a YAML needles file

        try:
            records = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UserError(f"--needles {path}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(records, list):
            raise UserError(f"--needles {path}: a YAML needles file is a list of mappings with keys "
                            f"{', '.join(NEEDLE_KEYS)}")
        where = [f"item {i + 1}" for i in range(len(records))]
    else:
        records, where = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise UserError(f"--needles {path}: line {n} is not JSON ({e.msg}); a needles file has one "
                                f"{{{', '.join(repr(k) for k in NEEDLE_KEYS)}}} per line") from None
            where.append(f"line {n}")
    needles = []
    for record, at in zip(records, where):
        if not isinstance(record, dict) or any(not isinstance(record.get(k), str) for k in NEEDLE_KEYS):
            raise UserError(f"--needles {path}: {at} needs the text keys {', '.join(NEEDLE_KEYS)}")
        needle = Needle(*(record[k] for k in NEEDLE_KEYS))
        try:
            needle.answer_offsets()
        except UserError as e:
            raise UserError(f"--needles {path}: {at}: {e}") from None
        needles.append(needle)
    if not needles:
        raise UserError(f"--needles {path}: no needles in it")
    names = [n.name for n in needles]
    if len(set(names)) != len(names):
        raise UserError(f"--needles {path}: needle names must be distinct ({', '.join(names)})")
    return needles


@dataclass(frozen=True)
class Haystack:
    """One teacher-forced input and where its parts lie.

    input_ids: the prompt and the reference answer, len = length (`with_answer`: the prompt and
               another answer, e.g. the model's own greedy one; `length` stays the grid's)
    needle:    [start, end) of the answer's tokens inside the needle sentence (Wu et al.'s
               needle span: the keys a retrieval head must point at)
    answer:    [start, end) of the reference answer (the last tokens); the answer rows, whose
               next token is an answer token, are answer[0] - 1 .. answer[1] - 2
    sentence:  [start, end) of the whole needle sentence
    """

    input_ids: tuple[int, ...]
    needle: tuple[int, int]
    answer: tuple[int, int]
    length: int
    depth: int
    needle_name: str
    sentence: tuple[int, int] = (0, 0)

    @property
    def answer_rows(self) -> range:
        """The query positions whose next token is an answer token."""
        return range(self.answer[0] - 1, self.answer[1] - 1)

    @property
    def needle_len(self) -> int:
        return self.needle[1] - self.needle[0]

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """Everything before the answer: what a decoder generates its answer from."""
        return self.input_ids[:self.answer[0]]

    def with_answer(self, answer_ids) -> Haystack:
        """The same prompt (needle span, depth, `length` as built) followed by `answer_ids` instead
        of the reference answer: `bertscope heads retrieval --answer greedy` scores the model's own
        answer, whose length differs from the reference's."""
        ids = self.prompt_ids + tuple(int(t) for t in answer_ids)
        return replace(self, input_ids=ids, answer=(self.answer[0], len(ids)))

    @property
    def distance(self) -> int:
        """Tokens from the needle span's end to the first answer row: how far back the answer reads."""
        return self.answer[0] - 1 - (self.needle[1] - 1)


def resolve_prompt(prompt: str, tokenizer) -> str:
    """"plain" or "chat": "auto" takes the chat template when the tokenizer has one (an instruct
    model, as Wu et al.'s code does for theirs), else the plain prompt (a base model)."""
    if prompt == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    if prompt == "chat" and not getattr(tokenizer, "chat_template", None):
        raise UserError("--prompt chat: the model's tokenizer has no chat template (use --prompt plain)")
    return prompt


class HaystackBuilder:
    """Builds `Haystack`s of one tokenizer, corpus and prompt; the corpus's sentences are tokenized
    once, as far as the longest haystack asked for needs.

    documents: an iterable of texts (read lazily, in order)
    prompt: "plain" or "chat" (`resolve_prompt`)
    """

    def __init__(self, tokenizer, documents, prompt: str = "plain"):
        from bertscope.text.segments import template_ids  # the tokenizer stack: with the run

        self.tokenizer, self.prompt = tokenizer, prompt
        self._documents = iter(documents)
        self._sentences: list[list[int]] = []  # each " " + sentence, tokenized alone
        self._n_tokens = 0
        if prompt == "plain":
            self.prefix = template_ids(tokenizer)[0]  # a BOS where the tokenizer puts one
            self.open, self.close, self.after = [], "\n", []
        elif prompt == "chat":
            mark = "\x00HAYSTACK\x00"
            text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                                 add_generation_prompt=True)
            before, after = text.split(mark)
            self.prefix = self.encode(before)
            self.open, self.close, self.after = self.encode("<book>"), "</book>\n", self.encode(after)
        else:
            raise ValueError(f"prompt must be 'plain' or 'chat', not {prompt!r}")

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _extend(self, n_tokens: int):
        """Tokenize sentences until at least n_tokens of haystack are there."""
        from bertscope.text.sentences import split_sentences

        while self._n_tokens < n_tokens:
            text = next(self._documents, None)
            if text is None:
                raise UserError(f"the corpus has {self._n_tokens} tokens of text; a haystack needs {n_tokens} "
                                "(give a longer --corpus or shorter --lengths)")
            sentences = [" " + s for s in split_sentences(text)]
            if not sentences:
                continue
            for ids in self.tokenizer(sentences, add_special_tokens=False)["input_ids"]:
                if ids:
                    self._sentences.append(list(ids))
                    self._n_tokens += len(ids)

    def needle_pieces(self, needle: Needle) -> tuple[list[int], list[int], list[int]]:
        """(before the answer, the answer, after it): " " + needle tokenized in three pieces."""
        text = " " + needle.needle
        a0, a1 = needle.answer_offsets()
        return self.encode(text[:a0]), self.encode(text[a0:a1]), self.encode(text[a1:])

    def answer_ids(self, needle: Needle) -> list[int]:
        """The reference answer's tokens: the needle's own (plain), or the answer alone (chat)."""
        if self.prompt == "plain":
            return self.needle_pieces(needle)[1]
        return self.encode(needle.answer.strip())

    def build(self, needle: Needle, length: int, depth: int) -> Haystack:
        """The haystack of `length` tokens with `needle` at `depth` percent."""
        if not 0 <= depth <= 100:
            raise UserError(f"depth {depth}: depths are percentages, 0 to 100")
        before, span, after = self.needle_pieces(needle)
        answer = self.answer_ids(needle)
        close = self.encode(self.close + QUESTION.format(question=needle.question))  # the question, tokenized whole
        fixed = len(self.prefix) + len(self.open) + len(before) + len(span) + len(after) + len(close) \
            + len(self.after) + len(answer)
        budget = length - fixed
        if budget < 1:
            raise UserError(f"length {length}: needle {needle.name!r}, its question and answer take {fixed} tokens "
                            "with the prompt; a haystack needs more")
        self._extend(budget)
        text, bounds = [], [0]
        for ids in self._sentences:
            take = ids[: budget - len(text)]
            text += take
            bounds.append(len(text))
            if len(text) == budget:
                break
        target = budget * depth / 100
        k = min(bounds, key=lambda b: (abs(b - target), b))  # the nearest boundary, the earlier on a tie
        head = self.prefix + self.open + text[:k]
        needle_start = len(head) + len(before)
        ids = head + before + span + after + text[k:] + close + self.after
        answer_start = len(ids)
        ids = ids + answer
        assert len(ids) == length, (len(ids), length)
        return Haystack(input_ids=tuple(int(t) for t in ids), needle=(needle_start, needle_start + len(span)),
                        answer=(answer_start, length), length=length, depth=depth, needle_name=needle.name,
                        sentence=(len(head), len(head) + len(before) + len(span) + len(after)))


def corpus_texts(corpus: str, text_field: str | None = None):
    """The texts of a corpus in order (`bertscope.text.corpus.open_corpus`: "wiki" or a file)."""
    from bertscope.text.corpus import open_corpus

    for doc in open_corpus(corpus, text_field):
        yield " ".join(doc.parts)


def build_haystack(tokenizer, needle: Needle, length: int, depth: int, corpus: str = "wiki",
                   prompt: str = "auto") -> Haystack:
    """One haystack (a builder for one call: a grid keeps one `HaystackBuilder`)."""
    return HaystackBuilder(tokenizer, corpus_texts(corpus), resolve_prompt(prompt, tokenizer)).build(
        needle, length, depth)
