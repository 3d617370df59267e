"""Words of several tokens, one home: what a question's answers are ranked over (`Words`: the vocabulary, then the
words of several tokens its neighbours hold, read from the datastore's lexicon), which of them the LM scores
(`Words.candidates`), their LM scores (`scored`: from the question's own pass) and the mixture's prior for them
(`Words.prior`). The datastore stores them (store/datastore.py: the `words` table); the builder finds them in text
(text.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from bertknn.text import holds_word

if TYPE_CHECKING:
    from bertknn.query.search import Neighbours
    from bertknn.store.datastore import Datastore


@dataclass(frozen=True)
class Words:
    """What one question's answers are ranked over: the model's vocabulary (indices 0..vocab-1), then the words of
    several tokens its neighbours hold (index vocab + i: lexicon number `values[i]`, sorted, with its tokens, text
    and the LM's score as the question's answer, `scored`: 0 until scored). Distributions over words
    are arrays of `size`."""

    vocab: int
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pieces: tuple[tuple[int, ...], ...] = ()
    texts: tuple[str, ...] = ()
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))

    def lm(self, p_vocab: np.ndarray) -> np.ndarray:
        """The LM's distribution over these words: over the vocabulary, extended by its scores of the words of
        several tokens and renormalised."""
        if not len(self.values):
            return p_vocab
        p = np.concatenate([np.asarray(p_vocab, np.float64), self.scores])
        return p / p.sum()

    @staticmethod
    def best(p_knn: np.ndarray | None, m: int) -> np.ndarray:
        """The indices of the `m` words that `p_knn` ranks highest among those it holds (ties by index; 0: every
        one it holds, unsorted)."""
        if p_knn is None:
            return np.zeros(0, np.int64)
        held = np.flatnonzero(p_knn)
        return held[np.lexsort((held, -p_knn[held]))][:m] if m else held

    def candidates(self, p_knn: np.ndarray | None, m: int) -> list[int]:
        """The words of several tokens (indices into `values`) among the `m` words that `p_knn` ranks highest (0:
        every one it holds): those the LM scores."""
        if not len(self.values):
            return []
        return sorted(int(i) - self.vocab for i in self.best(p_knn, m) if i >= self.vocab)

    def scored(self, indices: list[int], scores: np.ndarray) -> Words:
        """These words with the LM's `scores` of the words at `indices` (into `values`); the others keep 0."""
        out = np.zeros(len(self.values), np.float64)
        out[indices] = scores
        return replace(self, scores=out)

    def unscored_dropped(self, p: np.ndarray) -> np.ndarray:
        """`p` over these words with the words of several tokens that the LM did not score (`candidates`) set to 0:
        no answers of the log-linear mixture, which needs the LM's support."""
        if not len(self.values) or self.scores.all():
            return p
        out = p.copy()
        out[self.vocab :][self.scores == 0] = 0.0
        return out

    def prior(self, bonus: float, question: str = "") -> np.ndarray | None:
        """The log-linear mixture's factor per word: `bonus` for those of several tokens that `question` does not
        contain, else 1 (None when that changes nothing). A word the question contains (its subject's name, mostly)
        is one the LM has read, so its low score at the mask is informed: it gets no bonus."""
        if not len(self.values) or bonus == 1:
            return None
        asked = question.casefold()
        out = np.ones(self.size)
        for i, text in enumerate(self.texts):
            if not holds_word(asked, text.casefold()):
                out[self.vocab + i] = bonus
        return out

    @property
    def size(self) -> int:
        """The number of words answers are ranked over."""
        return self.vocab + len(self.values)

    def index(self, values: np.ndarray) -> np.ndarray:
        """The indices of stored values (vocabulary ids or lexicon numbers) among these words."""
        out = np.asarray(values, np.int64).copy()
        longer = out >= self.vocab
        out[longer] = self.vocab + np.searchsorted(self.values, out[longer])
        return out

    def describe(self, indices: list[int], tokenizer) -> list[tuple[str, int, tuple[int, ...]]]:
        """(text, id, tokens) of words by index: a vocabulary token as the tokenizer decodes it."""
        out = []
        for i in indices:
            if i < self.vocab:
                out.append((token_text(tokenizer, i), i, (i,)))
            else:
                j = i - self.vocab
                out.append((self.texts[j], int(self.values[j]), self.pieces[j]))
        return out


@lru_cache(maxsize=1 << 16)
def token_text(tokenizer, token: int) -> str:
    """A vocabulary token's text as the tokenizer decodes it (its raw form where that decodes to nothing); cached:
    the same tokens rank at the top of question after question."""
    return tokenizer.decode([token]).strip() or tokenizer.convert_ids_to_tokens(token)


def lexicon(store: Datastore, vocab: int, found: Neighbours) -> Words:
    """The words a question's answers are ranked over: the vocabulary (`vocab` tokens) and the words of several
    tokens that `found` holds (read from `store`'s lexicon), their LM scores not yet computed."""
    values = np.unique(found.values[found.values >= vocab]).astype(np.int64)
    if not len(values):
        return Words(vocab)
    rows = store.lexicon.words(values.tolist())
    pieces = tuple(tuple(int(t) for t in rows[v][0].split()) for v in values.tolist())
    texts = tuple(rows[v][1] for v in values.tolist())
    return Words(vocab, values, pieces, texts, np.zeros(len(values)))


def scored(words: Sequence[Words], chosen: Sequence[list[int]], p_lm: Sequence[np.ndarray]) -> list[Words]:
    """Each question's `words` scored by the LM at its words of several tokens `chosen` (indices into `values`) and
    at none else: a word's score is the probability `p_lm` (the LM's distribution at the question's mask, from its
    one pass) gives its first token.

    That a word starts with that token is what the question's one mask says of it; the rest of the word is the
    neighbours' evidence (they stored it whole). Reading the question again with n masks for a word of n tokens
    (independent decoding, as X-FACTR, Jiang et al., EMNLP 2020) costs a model pass per word length for most
    questions and answered no better (bench/README.md, "Words of several tokens from the question's own pass")."""
    return [w.scored(c, np.array([p[w.pieces[j][0]] for j in c], np.float64)) for w, c, p in zip(words, chosen, p_lm)]
