"""GUM coreference: mentions and entities from the CorefUD brackets in the MISC column.

In GUM's MISC column, `Entity=(12-person-new-...` opens a mention of entity 12 at this
word, `12)` closes the most recently opened mention of entity 12 that is still open, and
`(12-person-...)` is a one-word mention. One word can carry several brackets
(`Entity=(6-time-...-sgl)5)`: open and close 6, then close 5); they are applied left to
right. Attribute fields after the id follow `# global.Entity = GRP-etype-infstat-...`, so
the second field is the entity type (person, place, abstract, ...).

A `CorefDocument` is one document as a flat word list (document word indices everywhere),
with its sentence spans, syntactic heads and mentions. Mention spans are half-open:
`words[m.start:m.end]`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from bertscope.data.readers.treebank import Document, read_gum
from bertscope.errors import UserError

KINDS = ("pronoun", "proper", "nominal")
MENTION_HEADS = ("ud", "last-flat")
_NAME_RELATIONS = ("flat", "compound")  # with subtypes (flat:name)

# one bracket: "(ID-attrs" or "(ID-attrs)" (an opening, closed at once with ")"), or "ID)"
_BRACKET = re.compile(r"\((?P<open>[^()\-]+)(?P<attrs>[^()]*)(?P<single>\))?|(?P<close>[^()]+)\)")


@dataclass
class Mention:
    """One mention: words `start` .. `end - 1` of its document (end exclusive).

    head: the document index of the span's head word, the word whose syntactic head lies
    outside the span (several: the first; none, e.g. a span that is not a subtree: the
    last word); with `mention_head="last-flat"`, the last word of a flat/compound name
    instead (see `head_word`); `kind` is read from the UD head in both cases. kind: from the
    head word's UPOS, PRON/DET -> "pronoun", PROPN -> "proper", anything else -> "nominal".
    sentence: index of the sentence the mention starts in.
    """

    start: int
    end: int
    entity: str
    head: int
    kind: str
    etype: str = ""
    sentence: int = 0

    def __len__(self) -> int:
        return self.end - self.start


@dataclass
class CorefDocument:
    """A document as one word list, with sentences, syntax and mentions.

    sentence_spans: (start, end) word range of each sentence, end exclusive, covering `words`.
    paragraph_starts: indices of the sentences that open a paragraph (`# newpar`).
    heads: per word, the document index of its syntactic head, -1 for a sentence root.
    mentions: sorted by (start, -end): document order, an enclosing mention before the
    mentions inside it.
    """

    id: str
    genre: str
    words: list[str]
    upos: list[str]
    heads: list[int]
    sentence_spans: list[tuple[int, int]]
    mentions: list[Mention]
    paragraph_starts: list[int] = field(default_factory=list)

    def entities(self) -> dict[str, list[int]]:
        """Entity id -> indices (into `mentions`) of its mentions, in document order."""
        chains: dict[str, list[int]] = {}
        for i, m in enumerate(self.mentions):
            chains.setdefault(m.entity, []).append(i)
        return chains

    def antecedents(self, i: int) -> list[int]:
        """Indices of the mentions of mention i's entity that come before it (document order)."""
        entity = self.mentions[i].entity
        return [j for j in range(i) if self.mentions[j].entity == entity]

    def candidates(self, i: int) -> list[int]:
        """Indices of every mention before mention i: the choices of antecedent selection."""
        return list(range(i))

    def anaphoric(self) -> list[int]:
        """Indices of the mentions that have at least one antecedent."""
        seen: set[str] = set()
        found = []
        for i, m in enumerate(self.mentions):
            if m.entity in seen:
                found.append(i)
            seen.add(m.entity)
        return found

    def window(self, start: int, end: int) -> CorefDocument:
        """Words start .. end-1 as a document of their own (indices shifted to 0).

        Keeps the mentions lying wholly inside; heads pointing outside the window become -1;
        sentences are clipped to the window. Antecedents of the result are those inside it.
        """
        if not 0 <= start <= end <= len(self.words):
            raise ValueError(f"window {start}..{end} outside a document of {len(self.words)} words")
        spans = [(max(s, start) - start, min(e, end) - start) for s, e in self.sentence_spans if s < end and e > start]
        first_sentence = next((k for k, (s, e) in enumerate(self.sentence_spans) if e > start), 0)
        heads = [h - start if start <= h < end else -1 for h in self.heads[start:end]]
        mentions = [
            Mention(m.start - start, m.end - start, m.entity, m.head - start, m.kind, m.etype,
                    m.sentence - first_sentence)
            for m in self.mentions if start <= m.start and m.end <= end
        ]
        paragraphs = [p - first_sentence for p in self.paragraph_starts if 0 <= p - first_sentence < len(spans)]
        return CorefDocument(self.id, self.genre, self.words[start:end], self.upos[start:end], heads, spans,
                             mentions, paragraphs)


def head_word(start: int, end: int, heads: list[int], deprels: list[str] | None = None,
              upos: list[str] | None = None) -> int:
    """The head of span start..end-1: the first word whose head (-1 = root) lies outside
    the span; the last word when every word's head is inside (a span with a cycle-free
    tree always has one, but spans of broken or crossing annotation may not).

    With `deprels` and `upos` ("last-flat" heads): when that word is a proper noun with
    `flat` or `compound` dependents after it inside the span, the last of them. UD makes
    the first word the head of a flat name ("Barack" of "Barack Obama"); the Collins-style
    heads of Clark et al.'s CoNLL-2012 data make it the last ("Obama").
    """
    head = next((w for w in range(start, end) if not start <= heads[w] < end), end - 1)
    if deprels is None or upos is None or upos[head] != "PROPN":
        return head
    parts = [w for w in range(head + 1, end) if heads[w] == head and deprels[w].split(":")[0] in _NAME_RELATIONS]
    return parts[-1] if parts else head


def mention_kind(upos: str) -> str:
    if upos in ("PRON", "DET"):
        return "pronoun"
    if upos == "PROPN":
        return "proper"
    return "nominal"


def coref_document(doc: Document, mention_head: str = "ud") -> CorefDocument:
    """The CorefDocument of a GUM document read by `bertscope.data.readers.treebank`.

    mention_head: "ud" (the word whose head lies outside the span) or "last-flat" (the
    same, except the last word of a flat/compound proper name; see `head_word`)."""
    if mention_head not in MENTION_HEADS:
        raise ValueError(f"mention_head must be one of {', '.join(MENTION_HEADS)}, not {mention_head!r}")
    words: list[str] = []
    upos: list[str] = []
    heads: list[int] = []
    deprels: list[str] = []
    spans: list[tuple[int, int]] = []
    paragraphs: list[int] = []
    raw: list[tuple[int, int, str, str, int]] = []  # start, end, entity, etype, sentence
    open_mentions: dict[str, list[tuple[int, str, int]]] = {}  # entity -> stack of (start, etype, sentence)

    for k, sentence in enumerate(doc.sentences):
        base = len(words)
        spans.append((base, base + len(sentence)))
        if sentence.newpar:
            paragraphs.append(k)
        words += sentence.words
        upos += sentence.upos
        heads += [base + h - 1 if h > 0 else -1 for h in sentence.heads]
        deprels += sentence.deprels
        for i, misc in enumerate(sentence.misc):
            value = misc.get("Entity")
            if not value:
                continue
            w = base + i
            where = f"{sentence.path or doc.id}, sentence {sentence.sent_id}, word {i + 1}"
            position = 0
            for match in _BRACKET.finditer(value):
                if match.start() != position:
                    raise UserError(f"{where}: cannot read Entity={value}")
                position = match.end()
                if match["open"] is not None:
                    entity = match["open"]
                    attrs = match["attrs"].lstrip("-").split("-")
                    etype = attrs[0] if attrs and attrs[0] else ""
                    if match["single"]:
                        raw.append((w, w + 1, entity, etype, k))
                    else:
                        open_mentions.setdefault(entity, []).append((w, etype, k))
                else:
                    entity = match["close"]
                    stack = open_mentions.get(entity)
                    if not stack:
                        raise UserError(f"{where}: Entity={value} closes entity {entity}, which is not open")
                    start, etype, sentence_index = stack.pop()
                    raw.append((start, w + 1, entity, etype, sentence_index))
            if position != len(value):
                raise UserError(f"{where}: cannot read Entity={value}")
    unclosed = sorted(e for e, stack in open_mentions.items() if stack)
    if unclosed:
        raise UserError(f"{doc.path or doc.id}: mentions of entities {', '.join(unclosed)} are never closed")

    mentions = []
    for start, end, entity, etype, sentence_index in sorted(raw, key=lambda r: (r[0], -r[1])):
        head = ud_head = head_word(start, end, heads)
        if mention_head == "last-flat":
            head = head_word(start, end, heads, deprels, upos)
        # the type is read from the UD head either way, so both heads score the same mentions per type
        mentions.append(Mention(start, end, entity, head, mention_kind(upos[ud_head]), etype, sentence_index))
    return CorefDocument(doc.id, doc.genre, words, upos, heads, spans, mentions, paragraphs)


def read_gum_coref(data_dir: str | None = None, documents: list[Document] | None = None,
                   mention_head: str = "ud") -> list[CorefDocument]:
    """The GUM documents with their coreference (pass `documents` to reuse a `read_gum` result)."""
    return [coref_document(doc, mention_head) for doc in (documents if documents is not None else read_gum(data_dir))]
