"""The sentence weights in the vote: which neighbours' evidence is scored (`chosen`: those holding the kNN's best
words, chosen again by the LM's distribution) and their log weights (`weights`). How well an evidence text says what
a question asks, and the method's fixed parts, are model/sentences.py's; the evidence vectors are the datastore's
(store/evidence.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bertknn.model.sentences import (
    DISTANCE_SHARE,
    FLOOR,
    LM_SHARE,
    LM_WORDS,
    SCORED_WORDS,
    VOTE_WORDS,
    SentenceMatch,
    log_weights,
)
from bertknn.query.settings import Settings
from bertknn.query.words import Words

if TYPE_CHECKING:
    from bertknn.query.search import Neighbours
    from bertknn.store.datastore import Datastore


def _by_lm(
    chosen: np.ndarray, found: Neighbours, words: Words, vote: np.ndarray, p_lm: np.ndarray, prior: np.ndarray | None
) -> np.ndarray:
    """`chosen` (the neighbours whose evidence the sentence weights score) with those holding the LM's
    `sentences.LM_WORDS` best of the vote's words added, and those holding a word the LM gives less than
    `sentences.LM_SHARE` of the best one's probability taken out: the LM knows what kind of word is asked (a year does
    not answer "born in [MASK]"), as QA systems check a candidate's answer type. A word of several tokens counts by
    the LM's score `words` holds (`words.scored`; unscored, 0: taken out) times its `prior` (`Words.prior`: the
    mixture's word bonus, for the same reason: the LM is a weak judge of words it cannot spell in one token). The
    vote's `sentences.VOTE_WORDS` best words stay whatever the LM gives them: a word not scored counts as the least
    similar, so taking out the vote's own choice would demote it on the LM's doubt alone; its sentence decides."""
    lm, at = np.where(vote > 0, words.lm(p_lm), 0.0), words.index(found.values)
    chosen = chosen | np.isin(at, Words.best(lm, LM_WORDS))
    judged = lm[at] if prior is None else lm[at] * prior[at]
    return chosen & ((judged >= LM_SHARE * lm.max()) | np.isin(at, Words.best(vote, VOTE_WORDS)))


def weights(
    store: Datastore,
    match: SentenceMatch,
    questions: Sequence[str],
    found: Sequence[Neighbours],
    words: Sequence[Words],
    votes: Sequence[np.ndarray | None],
    s: Settings,
    lm: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray | None]:
    """Each question's neighbours' sentence log weights (`sentences.log_weights`): the evidence of the neighbours
    holding the vote's `sentences.SCORED_WORDS` best words, chosen again by the LM's distribution `lm` over the
    vocabulary when given (`_by_lm`: the LM knows what kind of word the question asks for, a language, not a city),
    scored against the question (`SentenceMatch.scores`), all questions' texts embedded together (None for a
    question without neighbours)."""
    chosen = [np.isin(w.index(f.values), Words.best(v, SCORED_WORDS)) for f, w, v in zip(found, words, votes)]
    if lm is not None:
        parts = zip(chosen, found, words, votes, lm, questions)
        chosen = [c if v is None else _by_lm(c, f, w, v, p, w.prior(s.word_bonus, q)) for c, f, w, v, p, q in parts]
    rows = store.documents.provenance(np.concatenate([f.entries[c] for f, c in zip(found, chosen)]).tolist())
    at = np.cumsum([0, *(int(c.sum()) for c in chosen)])
    asked = [[(q, e.sentence, e.span, e.title) for e in rows[a:b]] for q, a, b in zip(questions, at[:-1], at[1:])]
    out = []
    for c, f, sim in zip(chosen, found, match.scores(asked)):
        full = np.zeros(len(c))
        full[c] = sim
        distance = (f.distances, s.temperature, DISTANCE_SHARE)
        out.append(log_weights(full, c, s.sentence_temperature, FLOOR, distance) if c.any() else None)
    return out
