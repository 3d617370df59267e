"""Sentence-level evidence: how well the sentence a neighbour comes from says what the question asks.

Keys are read at one position, so the places of one document ("born in Bergen", "died in Oslo") lie close together
whatever the question. The sentence around a key tells them apart. A sentence encoder (all-MiniLM-L6-v2, shipped with
the default model and used whatever the masked LM: `Encoder.sentence_vectors`, mean pooling) compares the question,
a placeholder in its mask, with each neighbour's evidence in three views. Names are taken out of all texts (a
document's names: its title's words, the subject mostly), so that they match on what is said of the subject, not on
who it is: the neighbour's own document's from its sentence, clause and word, and those of all the question's
documents from the question, so that a question reads one text whatever its documents, the same for every question
of one phrasing ("was born in something"), and its vector is cached across questions:

- the question against the neighbour's sentence;
- the question with the neighbour's word in its mask (a claim: "was born in Bergen") against the sentence, the
  claim's vector composed, not embedded: the normalised sum of the question's vector and the word's own (additive
  composition, Mitchell and Lapata, ACL 2008), so that a word's vector serves every question that meets it and a
  question embeds one text, not one per candidate (bench/README.md measures both);
- the question against the neighbour's clause: the words before the neighbour back to the previous name or number
  ("came into the world in something", not "... in Bergen in something" for the year of the same sentence), which
  tells two facts of one sentence apart.

Each evidence text is scored against the question less the average of generic questions (`BACKGROUND`): a sentence
like every question ("in something") gains nothing, as domain-conditional PMI scores an answer against its prior
(Holtzman et al., Surface Form Competition, EMNLP 2021); the claim view checks a statement against the evidence, as
question answering recast as inference does (Demszky et al., 2018). A lexical score would not do: questions are
phrased unlike their evidence ("born in" against "came into the world in"); bench/README.md has each view's share
of right choices.

Only the evidence of the neighbours whose words are among the kNN's best few is embedded (one model pass over short
texts per question, bounded); the other neighbours count as the least similar of those. Vectors computed ahead
(`sentence_vectors`, `bertknn sentences`) are read instead of embedding their texts again, and a question's own text
can be embedded while the LM reads the question (`embed_ahead`), where its documents are known before (`question_text`
of their titles).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from itertools import islice
from typing import Protocol

import numpy as np

from bertknn.model.default_model import SENTENCE_MODEL, load_sentence_model
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.model.sentence_vectors import StoredVectors, default_path
from bertknn.text import MASK

CACHE = 50_000  # sentence vectors kept in memory (a service's questions meet the same documents again)
STORE_CHUNK = 10_000  # entries whose texts `SentenceMatch.store_entries` embeds and commits at a time
AHEAD_THREADS = 1  # ONNX Runtime's threads for `embed_ahead`'s pass, which runs beside the LM's (bench/README.md)
PLACEHOLDER = "something"  # the unknown word in a question's and a clause's text
TEXTS = ("question", "word", "sentence", "clause")  # what `SentenceMatch.texts` gives for a neighbour, in order
# Generic statements of common relations, the subject left out: what any question says (hand-written, not LAMA's).
BACKGROUND = tuple(
    f"{relation} {PLACEHOLDER}"
    for relation in (
        "was born in", "died in", "worked in", "studied at", "is a citizen of", "speaks",
        "the native language is", "plays", "is a member of", "was founded in", "has its headquarters in",
        "is the capital of", "is located in", "is part of", "is a", "works as a", "is made by", "is owned by",
        "was written in", "is named after", "shares a border with", "the official language is",
        "plays in the position of", "was first shown on", "follows the religion of", "is produced by",
        "was created in", "developed", "is a twin city of", "holds the office of", "records for the label",
        "plays the instrument", "makes music in the genre", "lies on the continent of", "is a kind of",
        "works in the field of", "is married to", "has relations with", "comes from", "is the son of",
    )
)  # fmt: skip


class Evidence(Protocol):
    """Where a stored entry comes from, as far as its texts go (`store.datastore.Provenance` is one)."""

    sentence: str
    span: tuple[int, int]
    title: str


class Entries(Protocol):
    """A datastore as `SentenceMatch.store_entries` reads it (`store.datastore.Datastore` is one)."""

    size: int

    def provenance(self, entries: list[int]) -> Sequence[Evidence]: ...


@lru_cache(maxsize=4096)
def _names(title: str) -> re.Pattern[str] | None:
    """One pattern for the title whole (tried first) and each of its words, with a possessive 's; None if none."""
    names = sorted({n for n in (title, *title.split()) if n.strip()}, key=len, reverse=True)
    alternatives = "|".join(map(re.escape, names))
    return re.compile(rf"(?<!\w)(?:{alternatives})(?:'s)?(?!\w)", re.IGNORECASE) if names else None


@lru_cache(maxsize=CACHE)
def without_names(text: str, title: str) -> str:
    """`text` without the words of a document's `title` (and their possessive 's), the mask and extra spaces: what
    a sentence or a question says of the subject rather than who the subject is. Cached: a question's texts recur
    for each of its neighbours, a sentence for each of its words."""
    text, names = text.replace(MASK, " "), _names(title)
    return " ".join((names.sub(" ", text) if names else text).split())


def _words(question: str, title: str) -> set[str]:
    """The lowercased words of `question` without the title's names."""
    return set(re.findall(r"\w+", without_names(question, title).lower()))


def clause(sentence: str, span: tuple[int, int], title: str) -> str:
    """The words of `sentence` before the target at character `span`, back to the previous name or number (a word
    that starts with a capital letter or a digit, not the sentence's first word nor a word of `title`), then the
    placeholder: the part of the sentence that says what the target is."""
    names = {w.lower() for w in re.findall(r"\w+", title)}
    cut = 0
    for i, word in enumerate(re.finditer(r"\w+", sentence[: span[0]])):
        text = word.group()
        if i and (text[0].isupper() or text[0].isdigit()) and text.lower() not in names:
            cut = word.end()
    return f"{sentence[cut : span[0]]}{PLACEHOLDER}"


def evidence_texts(sentence: str, span: tuple[int, int], title: str) -> tuple[str, str, str]:
    """A neighbour's texts after the question's (`TEXTS`): the target's word, the sentence and the target's clause
    (`clause`), the names of the neighbour's document (`title`) taken out."""
    return tuple(without_names(x, title) for x in (sentence[slice(*span)], sentence, clause(sentence, span, title)))


def log_weights(
    similarity: np.ndarray,
    embedded: np.ndarray,
    temperature: float,
    floor: float = 0.0,
    distance: tuple[np.ndarray, float, float] | None = None,
) -> np.ndarray:
    """Each neighbour's sentence log weight, score / `temperature`: `similarity` (`SentenceMatch.scores`), raised to
    `floor`, where `embedded`, the lowest of those elsewhere (a neighbour whose evidence was not embedded counts as
    the least similar, as does one scored NaN); zeros if none was. With `distance` (the neighbours' squared key
    distances d, the vote's temperature T and a share s), a neighbour scored above `floor` also gets (1 - s) (d -
    min d) / T back, so that in the vote's exp(-d / T) its key distance counts s times as much: its sentence says
    what is asked, and the keys alone do not tell one document's facts apart."""
    sim = np.asarray(similarity, np.float64)
    embedded = embedded & np.isfinite(sim)
    above = embedded & (sim > floor)
    sim = np.where(embedded, np.maximum(sim, floor), sim)
    lowest = sim[embedded].min() if embedded.any() else 0.0
    out = np.where(embedded, sim, lowest) / temperature
    if distance is not None:
        d, knn_temperature, share = distance
        d = np.asarray(d, np.float64)
        out += np.where(above, (1.0 - share) * (d - d.min()) / knn_temperature, 0.0)
    return out


class SentenceMatch:
    """How well each neighbour's evidence says what a question asks (`scores`), from a sentence encoder's vectors
    (cached); the encoder (default: all-MiniLM-L6-v2 on `runtime`) is loaded when first needed."""

    def __init__(
        self,
        runtime: Runtime | str = "torch",
        encoder: Encoder | None = None,
        cache: int = CACHE,
        stored: StoredVectors | None = None,
    ) -> None:
        self.runtime, self._encoder, self.cache, self._vectors = runtime, encoder, cache, {}
        self.stored = stored  # vectors computed ahead, read before a text is embedded
        self._background: np.ndarray | None = None
        self._worker: ThreadPoolExecutor | None = None  # `embed_ahead`'s thread, started when first needed
        self._ahead: list[tuple[list[str], Future]] = []  # texts being embedded ahead, and their vectors to come

    @classmethod
    def with_stored(cls, runtime: Runtime | str = "torch") -> SentenceMatch:
        """The default sentence encoder, reading the vectors `bertknn sentences` stored in bertknn's cache directory
        (none there: every text is embedded)."""
        return cls(runtime, stored=StoredVectors(default_path(SENTENCE_MODEL), SENTENCE_MODEL))

    @property
    def encoder(self) -> Encoder:
        """The sentence encoder."""
        if self._encoder is None:
            self._encoder = Encoder(*load_sentence_model(), SENTENCE_MODEL, runtime=self.runtime)
        return self._encoder

    def clear(self) -> None:
        """Forget the cached vectors (and those being embedded ahead)."""
        self._vectors.clear()
        self._ahead.clear()

    def vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The vector of each distinct text: cached, else being embedded ahead (`embed_ahead`: waited for last),
        else stored (`stored`), else computed, all those in one batch; the cache keeps at most `cache` vectors
        (emptied when the new ones would not fit)."""
        coming = {text for texts_ahead, _ in self._ahead for text in texts_ahead}
        todo = list(dict.fromkeys(t for t in texts if t not in self._vectors and t not in coming))
        new = self.stored.get(todo) if self.stored is not None and todo else {}
        rest = [t for t in todo if t not in new]
        new.update(zip(rest, self.encoder.sentence_vectors(rest)) if rest else ())
        for texts_ahead, future in self._ahead:
            new.update(zip(texts_ahead, future.result()))
        self._ahead.clear()
        found = {t: new[t] if t in new else self._vectors[t] for t in texts}  # read before the cache is emptied
        if len(self._vectors) + len(new) > self.cache:
            self._vectors.clear()
        self._vectors.update(islice(new.items(), self.cache))
        return found

    def embed_ahead(self, texts: Sequence[str]) -> None:
        """Start embedding those of `texts` not cached, in a thread of their own, so that the caller's work goes on
        beside it (the model's pass leaves Python's lock); the next `vectors` waits for them, after its other work,
        and caches them. For a question's own text (`question_text`) while the LM reads the question: a phrasing
        not asked before costs one more pass of the sentence encoder, which would otherwise come after the LM's."""
        todo = [text for text in dict.fromkeys(texts) if text not in self._vectors]
        if todo:
            encoder = self.encoder  # loaded here, not in the thread
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="bertknn-sentences")
            self._ahead.append((todo, self._worker.submit(encoder.sentence_vectors, todo, threads=AHEAD_THREADS)))

    def store_entries(self, store: Entries, progress: Callable[[int, int], None] = lambda done, total: None) -> int:
        """Embed into `stored` the evidence texts (`evidence_texts`: word, sentence, clause) of every entry of a
        datastore not stored yet, `STORE_CHUNK` entries a transaction (a run killed keeps what it committed; a rerun
        skips it); `progress(done, total)` after each; how many texts were new."""
        if self.stored is None:
            raise ValueError("this SentenceMatch has no stored vectors to write (`SentenceMatch.with_stored`)")
        made, size = 0, store.size
        progress(0, size)
        for first in range(0, size, STORE_CHUNK):
            rows = store.provenance(list(range(first, min(first + STORE_CHUNK, size))))
            texts = [text for row in rows for text in evidence_texts(row.sentence, row.span, row.title)]
            made += self.stored.add(texts, self.encoder.sentence_vectors)
            progress(min(first + STORE_CHUNK, size), size)
        return made

    def background(self) -> np.ndarray:
        """The mean vector of the generic questions (`BACKGROUND`), computed once."""
        if self._background is None:
            self._background = self.encoder.sentence_vectors(BACKGROUND).mean(0)
        return self._background

    @staticmethod
    def question_text(question: str, titles: Iterable[str]) -> str:
        """What the views read of a question: its text with the placeholder in its mask, the names of the documents
        titled `titles` taken out."""
        return without_names(question.replace(MASK, PLACEHOLDER), " ".join(dict.fromkeys(titles)))

    @classmethod
    def texts(cls, mine: Sequence[tuple[str, str, tuple[int, int], str]]) -> list[tuple[str, ...]]:
        """What the views of one question's neighbours, (question, sentence, target span, title) tuples, read
        (`TEXTS`): the question's text (`question_text`) without the names of all the neighbours' documents; the
        target's word, the sentence and the target's clause, the names of the neighbour's own document taken out."""
        titles = [title for *_, title in mine]
        asked = {question: cls.question_text(question, titles) for question in {question for question, *_ in mine}}
        return [(asked[question], *evidence_texts(sentence, span, title)) for question, sentence, span, title in mine]

    def views(self, asked: Sequence[Sequence[tuple[str, str, tuple[int, int], str]]]) -> list[np.ndarray]:
        """For each question's (question, sentence, target span, title) tuples, the three views' cosines, each less
        the evidence's mean cosine with `BACKGROUND` ([n, 3]): (q - b) . sentence, (claim - b) . sentence and (q - b)
        . clause, where q is the question's text (`texts`), claim the unit vector along q + the word's vector, b the
        background's mean vector; all questions' texts embedded together."""
        texts = [row for mine in asked for row in self.texts(mine)]
        v, b = self.vectors([text for row in texts for text in row]), self.background()
        q, w, s, c = (np.array([v[row[i]] for row in texts], np.float64).reshape(-1, len(b)) for i in range(4))
        claim = q + w
        claim /= np.linalg.norm(claim, axis=1, keepdims=True)
        rows = np.stack([((q - b) * s).sum(1), ((claim - b) * s).sum(1), ((q - b) * c).sum(1)], axis=1)
        return np.split(rows, np.cumsum([len(mine) for mine in asked])[:-1])

    def scores(self, asked: Sequence[Sequence[tuple[str, str, tuple[int, int], str]]]) -> list[np.ndarray]:
        """For each question's (question, sentence, target span, title) tuples, the sum of its `views`. A target
        whose word the question holds ("language" for "The second language of X is [MASK] .") scores NaN: a cloze
        does not repeat its own words."""
        out = []
        for mine, views in zip(asked, self.views(asked)):
            repeated = [s[a:b].lower() in _words(q, t) for q, s, (a, b), t in mine]
            out.append(np.where(repeated, np.nan, views.sum(1)))
        return out
