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

Only the evidence of the neighbours whose words are among the kNN's best few is scored; the other neighbours count as
the least similar of those. The evidence texts' vectors are the datastore's (a build stores them with the entries:
store/evidence.py), so a question embeds only its own text, while the LM reads the question (`embed_ahead`), where
its documents are known before (`question_text` of their titles); a text the store lacks is embedded here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from itertools import islice
from typing import Protocol

import numpy as np

from bertknn.model.default_model import SENTENCE_MODEL, load_sentence_model
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.text import MASK, PLACEHOLDER, evidence_texts, without_names

CACHE = 50_000  # sentence vectors kept in memory (a service's questions meet the same documents again)
# The sentence weights' fixed parts: the method, not settings (`Settings.sentence_temperature` turns it on and off);
# each was chosen on the dev halves of bench/sentences.py's sets and LAMA dev (bench/README.md, "One document,
# several facts", has the measurements and the held-out halves).
FLOOR = 0.7  # scores below it count as it: only evidence that says what is asked moves the vote
SCORED_WORDS = 10  # the evidence scored is that of the neighbours holding the kNN's this many best words,
LM_WORDS = 5  # and of those holding the LM's this many best words among the vote's,
LM_SHARE = 0.005  # but not of a word the LM gives less than this share of its best such word's probability,
VOTE_WORDS = 1  # save the vote's this many best words: the LM's doubt alone does not demote them
DISTANCE_SHARE = 0.5  # a neighbour scored above the floor: its key distance counts this much in the vote
AHEAD_THREADS = 1  # ONNX Runtime's threads for `embed_ahead`'s pass, which runs beside the LM's (bench/README.md)
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


class StoredEvidence(Protocol):
    """Where the vectors of evidence texts were stored ahead (`Datastore.evidence` is one: its entries' evidence
    vectors, store/evidence.py)."""

    def vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]: ...


@lru_cache(maxsize=4)
def sentence_encoder(runtime: Runtime | str = "torch") -> Encoder:
    """The sentence encoder (SENTENCE_MODEL) on `runtime`, loaded once per runtime: what a build embeds the
    evidence texts with and a question its own text."""
    return Encoder(*load_sentence_model(), SENTENCE_MODEL, runtime=runtime)


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


def _words(question: str, title: str) -> set[str]:
    """The lowercased words of `question` without the title's names."""
    return set(re.findall(r"\w+", without_names(question, title).lower()))


class SentenceMatch:
    """How well each neighbour's evidence says what a question asks (`scores`), from a sentence encoder's vectors
    (cached); the encoder (default: all-MiniLM-L6-v2 on `runtime`) is loaded when first needed."""

    def __init__(
        self,
        runtime: Runtime | str = "torch",
        encoder: Encoder | None = None,
        cache: int = CACHE,
        stored: StoredEvidence | None = None,
    ) -> None:
        self.runtime, self._encoder, self.cache, self._vectors = runtime, encoder, cache, {}
        self.stored = stored  # vectors computed ahead, read before a text is embedded
        self._background: np.ndarray | None = None
        self._worker: ThreadPoolExecutor | None = None  # `embed_ahead`'s thread, started when first needed
        self._ahead: list[tuple[list[str], Future]] = []  # texts being embedded ahead, and their vectors to come

    @property
    def encoder(self) -> Encoder:
        """The sentence encoder."""
        if self._encoder is None:
            self._encoder = sentence_encoder(self.runtime)
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
        new = self.stored.vectors(todo) if self.stored is not None and todo else {}
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
