"""Subject linking: a question's subject found in its own text among the datastore's names (titles, aliases and the
parts of titles that name one article alone: `store.names`), for questions asked without one.

Every span of the question's words (up to MAX_WORDS, not across its mask) is looked up in one query. The span kept:
one that holds a capitalised word of the question before one that does not (so that "official language" does not
outrank "France" where both title a document; a question written in lower case has none and takes the longest), then
the most words, then a title or alias before a part of a title, then the most characters, then the first. A span
that is a piece of a longer name written with capitals links nothing ("Arthur" of "Arthur Erickson"). A part of a
title links only where it names no other title, stands alone in the question (the words beside it stopwords:
"saddle" of "saddle blanket" does not) and is not a common word (in more than COMMON of the documents and
COMMON_DOCS: "born" of "Born in 68" is). Where a span names several titles (an alias two articles share), the one
whose documents TF-IDF scores best for the question is linked. No span: no subject, and the question searches by TF-
IDF as without linking.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

import numpy as np

from bertknn.index.retrieval import TfidfIndex, question_query
from bertknn.store import names
from bertknn.store.datastore import Datastore
from bertknn.text import MASK, normalize_title, stopwords

Q = TypeVar("Q")  # a question record (`pipeline.Query`)
MAX_WORDS = 8  # the longest span looked up, in words
COMMON = 0.01  # a word in more than this share of the documents is no part of a title that names it alone ("born")
COMMON_DOCS = 10  # ... and in more than this many: in a small store no part is common
SENTENCE_END = re.compile(r"[.!?\n]")  # punctuation after which a capital opens a sentence, names nothing
BETWEEN_SENTENCES = re.compile(r"[.!?](?:\s|$)|\n")  # a sentence's end
CONNECTORS = frozenset(  # words inside names
    ["of", "the", "de", "del", "della", "di", "da", "du", "van", "von", "der", "den", "la", "le", "and", "y", "for"]
)
CLOSING = re.compile(r"[.)!?]{1,2}")  # punctuation a title may end with
WORD = re.compile(r"\w+(?:[.-]\w+)*")  # a word, with the dots and hyphens inside it ("Dante's": Dante, s)


@dataclass(frozen=True)
class Link:
    """The subject linked for a question: the title of its documents, the question's text that names it (its span
    of characters) and how that text names it ("title", "alias" or "part of the title")."""

    subject: str
    text: str
    span: tuple[int, int]
    by: str

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"subject": self.subject, "text": self.text, "span": list(self.span), "by": self.by}


def spans(question: str) -> list[tuple[int, int, int, bool, bool, bool]]:
    """(start, end, words, capitalised, alone, bare) of each span of up to MAX_WORDS words of `question` that does not
    cross its mask and holds a word that is not a stopword. capitalised: it holds a word written with a capital that
    is not a stopword ("The" opening a question does not count); in a question that has such a word anywhere
    (written in proper case), only capitalised spans are given: "law" of "The law in Guyana" is no name there. bare:
    no word beside it is written with a capital, nor one beyond a stopword beside it, so that it is not a piece of a
    longer name ("Arthur" of "Arthur Erickson", "Shire" of "Shire of Strathbogie", "Giulio" of "Giulio De Petra");
    alone: bare, and the words beside it are stopwords or a possessive's "s" ("saddle" of "saddle blanket" is not)."""
    found = []
    stop = stopwords()
    parts = [
        (start, [(m.start() + start, m.end() + start, m.group()) for m in WORD.finditer(text)])
        for start, text in _parts(question)
    ]
    cased = any(w[:1].isupper() and w.lower() not in stop for _, words in parts for _, _, w in words)
    for start, words in parts:
        lowered = [w.lower() for _, _, w in words]
        plain = [w in stop or w == "s" for w in lowered]
        capitals = [w[:1].isupper() and not p for (_, _, w), p in zip(words, plain)]
        gaps = ["", *(question[a[1] : b[0]] for a, b in pairwise(words))]  # the text before each word
        apart = [k == 0 or bool(gap.strip()) for k, gap in enumerate(gaps)]  # punctuation (or the mask) before it
        opens = [(k == 0 and start == 0) or bool(SENTENCE_END.search(gap)) for k, gap in enumerate(gaps)]
        named = [w[:1].isupper() and not o for (_, _, w), o in zip(words, opens)]  # "De" of "Giulio De Petra" too
        context = (lowered, plain, named, apart)
        for i in range(len(words)):
            content = capital = False
            for j in range(i, min(i + MAX_WORDS, len(words))):
                content, capital = content or not plain[j], capital or capitals[j]
                if not content or (cased and not capital):
                    continue
                sides = [_beside(context, at, step) for at, step in ((i - 1, -1), (j + 1, 1))]
                bare, alone = all(side > 0 for side in sides), all(side > 1 for side in sides)
                end = words[j][1]
                found.append((words[i][0], end, j + 1 - i, capital, alone, bare))
                closing = CLOSING.match(question, end)  # "F.C." or "(XJ)" or "Time!" ends with its punctuation
                if closing:
                    found.append((words[i][0], closing.end(), j + 1 - i, capital, alone, bare))
    return found


def _beside(context: tuple[list[str], list[bool], list[bool], list[bool]], at: int, step: int) -> int:
    """What the word at `at` (beside a span, on the side `step` points to) makes of the span: 0 a piece of a longer
    name (a capitalised word there that opens no sentence, or one beyond a connector there: "Shire of Strathbogie"),
    1 a piece of a longer phrase (a word in lower case that is no stopword), 2 alone (no word, punctuation between, or
    a stopword). `context`: the words in lower case, whether each is a stopword, is capitalised without opening a
    sentence, and follows punctuation."""
    lowered, plain, named, apart = context
    if not 0 <= at < len(lowered) or apart[max(at, at - step)]:
        return 2
    if named[at]:
        return 0
    if not plain[at]:
        return 1
    beyond = at + step
    joined = 0 <= beyond < len(lowered) and not apart[max(at, beyond)]
    return 0 if lowered[at] in CONNECTORS and joined and named[beyond] and not plain[beyond] else 2


def _near(question: str, a: int, b: int) -> bool:
    """Whether the span a..b lies in the mask's sentence (no sentence's end between them): a subject named there
    before one named in a sentence before ("Simon Chan (..., Singapore). Beirut is a twin city of [MASK]")."""
    m = question.find(MASK)
    between = question[b:m] if b <= m else question[m + len(MASK) : a]
    return not BETWEEN_SENTENCES.search(between)


def _parts(question: str) -> list[tuple[int, str]]:
    """The question's text before and after each mask, with where each begins."""
    out, start = [], 0
    for m in re.finditer(re.escape(MASK), question):
        out.append((start, question[start : m.start()]))
        start = m.end()
    return [*out, (start, question[start:])]


def link(store: Datastore, index: TfidfIndex, question: str) -> Link | None:
    """The subject `question` names (module docstring), or None: none of its spans names a title with a live
    document, or the store has no names index yet."""
    found = spans(question)
    texts = [normalize_title(question[a:b]) for a, b, *_ in found]
    rows = store.documents.named(sorted(set(texts))) if texts else None
    if not rows:
        return None
    by_name: dict[str, list[tuple[str, int]]] = {}
    shown = {}
    for name, title, kind, written in rows:
        by_name.setdefault(name, []).append((title, kind))
        shown[title] = written
    best = None
    for (a, b, n_words, capital, alone, bare), text in zip(found, texts):
        titles = _titles(by_name.get(text, []))
        if titles and bare and (titles[1] < names.PART or (alone and not _common(store, index, text))):
            rank = (_near(question, a, b), capital, n_words, titles[1] < names.PART, b - a, -a)
            if best is None or rank > best[0]:
                best = (rank, a, b, titles)
    if best is None:
        return None
    _, a, b, (candidates, kind) = best
    title = candidates[0] if len(candidates) == 1 else _best_scored(store, index, question, candidates)
    return Link(shown[title], question[a:b], (a, b), names.KINDS[kind])


def linked(store: Datastore, index: TfidfIndex, queries: Sequence[Q]) -> list[Q]:
    """The queries (records with `text`, `subject` and `link`: `pipeline.Query`), those asked without a subject given
    the one their text names (`link`), with the link."""
    found = [link(store, index, q.text) if q.subject is None else None for q in queries]
    return [dataclasses.replace(q, subject=f.subject, link=f) if f else q for q, f in zip(queries, found)]


def _common(store: Datastore, index: TfidfIndex, name: str) -> bool:
    """Whether `name` (one word, a part of a title) is a common word of the live documents (COMMON): "born" of "Born
    in 68" says nothing of that title. Documents hidden (removed, or being added) count nowhere, as in TF-IDF's idf,
    so that removing what was added leaves every link as it was."""
    if " " in name:
        return False
    hidden = store.documents.hidden()
    held = np.setdiff1d(index.containing(name), hidden, assume_unique=False)
    return len(held) > max(COMMON * (index.n_docs - len(hidden[hidden < index.n_docs])), COMMON_DOCS)


def _titles(rows: list[tuple[str, int]]) -> tuple[list[str], int] | None:
    """The titles a name stands for and how (its strongest kind), or None: a title or alias names its titles; a part
    of a title names one only where it names no other (no MORE row, one title)."""
    if not rows:
        return None
    kind = min(k for _, k in rows)
    titles = sorted({t for t, k in rows if k == kind})
    if kind == names.PART and (names.MORE in titles or len(titles) > 1):
        return None
    return titles, kind


def _best_scored(store: Datastore, index: TfidfIndex, question: str, titles: list[str]) -> str:
    """Of several titles a span names, the one whose documents TF-IDF scores best for the question (ties: the first
    in order)."""
    docs, scores = index.scores(question_query(question), store.documents.hidden())
    score = dict(zip(docs.tolist(), scores.tolist()))
    best = [max((score.get(d, 0.0) for d, _ in store.documents.find_titles(t)), default=0.0) for t in titles]
    return titles[int(np.argmax(best))]
