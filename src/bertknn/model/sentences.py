"""Sentence-level evidence: how well the sentence a neighbour comes from says what the question asks.

Keys are read at one position, so the places of one document ("born in Bergen", "died in Oslo") lie close together
whatever the question. The sentence around a key tells them apart: the question and each neighbour's sentence are
embedded by a sentence encoder (all-MiniLM-L6-v2, shipped with the default model and used whatever the masked LM:
`Encoder.sentence_vectors`, mean pooling), the names of the neighbour's document (its title's words: the subject,
mostly) taken out of both, so that they match on what is said of the subject, not on who it is. The vote
(`knn.document_vote`) then weighs each neighbour by exp(cos / T_s) within its document, so the document prior stays
in charge of which documents answer. A lexical score would not do: questions are phrased unlike their evidence
("born in" against "came into the world in"; bench/README.md).

Only the sentences of the neighbours whose words are among the kNN's best few are embedded (one model pass over
short sentences per question, bounded); the other neighbours count as the least similar of those.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import islice

import numpy as np

from bertknn.model.default_model import SENTENCE_MODEL, load_sentence_model
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.text import MASK

CACHE = 50_000  # sentence vectors kept in memory (a service's questions meet the same documents again)


def without_names(text: str, title: str) -> str:
    """`text` without the words of a document's `title` (and their possessive 's), the mask and extra spaces: what
    a sentence or a question says of the subject rather than who the subject is."""
    text = text.replace(MASK, " ")
    for name in dict.fromkeys([title, *title.split()]):
        if name.strip():
            text = re.sub(rf"(?<!\w){re.escape(name)}(?:'s)?(?!\w)", " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


def log_weights(similarity: np.ndarray, embedded: np.ndarray, temperature: float) -> np.ndarray:
    """Each neighbour's sentence log weight, cos / `temperature`: `similarity` where `embedded`, the lowest of those
    elsewhere (a neighbour whose sentence was not embedded counts as the least similar); zeros if none was."""
    sim = np.asarray(similarity, np.float64)
    floor = sim[embedded].min() if embedded.any() else 0.0
    return np.where(embedded, sim, floor) / temperature


class SentenceMatch:
    """Cosine similarities of questions and evidence sentences, from a sentence encoder's vectors (cached); the
    encoder (default: all-MiniLM-L6-v2 on `runtime`) is loaded when first needed."""

    def __init__(self, runtime: Runtime | str = "torch", encoder: Encoder | None = None, cache: int = CACHE) -> None:
        self.runtime, self._encoder, self.cache, self._vectors = runtime, encoder, cache, {}

    @property
    def encoder(self) -> Encoder:
        """The sentence encoder."""
        if self._encoder is None:
            self._encoder = Encoder(*load_sentence_model(), SENTENCE_MODEL, runtime=self.runtime)
        return self._encoder

    def clear(self) -> None:
        """Forget the cached vectors."""
        self._vectors.clear()

    def vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The vector of each distinct text, those not cached computed in one batch; the cache keeps at most
        `cache` vectors (emptied when the new ones would not fit)."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        new = dict(zip(todo, self.encoder.sentence_vectors(todo))) if todo else {}
        if len(self._vectors) + len(new) > self.cache:
            self._vectors.clear()
        self._vectors.update(islice(new.items(), self.cache))
        return {t: new[t] if t in new else self._vectors[t] for t in texts}

    def similarities(self, pairs: Sequence[Sequence[tuple[str, str, str]]]) -> list[np.ndarray]:
        """For each question's (question, sentence, title) triples, cos(question, sentence) with the title's names
        taken out of both; all questions' texts embedded together."""
        stripped = [[(without_names(q, t), without_names(s, t)) for q, s, t in mine] for mine in pairs]
        found = self.vectors([text for mine in stripped for pair in mine for text in pair])
        return [np.array([float(found[q] @ found[s]) for q, s in mine]) for mine in stripped]
