"""Combine stage: interpolate the LM's and the kNN's distributions, and the result a user gets (SPEC §3).

p = lambda * p_kNN + (1 - lambda) * p_BERT over the full vocabulary (the paper), or the log-linear mixture
p ~ p_kNN^lambda * p_BERT^(1 - lambda) (bertknn's default); with no neighbours, p = p_BERT. Answers are words
(`Words`): the vocabulary's, then the words of several tokens the neighbours hold, whose LM score is
`encoder.Encoder.word_scores`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from bertknn.query.search import Neighbours


@dataclass(frozen=True)
class TokenScore:
    """An answer word, its probability, its id (a vocabulary id for a word of one token, else its number in the
    datastore's lexicon) and its tokens."""

    token: str
    probability: float
    id: int
    pieces: tuple[int, ...] = ()  # () for a word of one token: (id,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", tuple(int(p) for p in self.pieces) or (int(self.id),))


@dataclass(frozen=True)
class Words:
    """What one question's answers are ranked over: the model's vocabulary (indices 0..vocab-1), then the words of
    several tokens its neighbours hold (index vocab + i: lexicon number `values[i]`, sorted, with its tokens, text
    and the LM's score as the question's answer, `Encoder.word_scores`: 0 until scored). Distributions over words
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
            if not re.search(rf"(?<!\w){re.escape(text.casefold())}(?!\w)", asked):
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
                text = tokenizer.decode([i]).strip() or tokenizer.convert_ids_to_tokens(i)
                out.append((text, i, (i,)))
            else:
                j = i - self.vocab
                out.append((self.texts[j], int(self.values[j]), self.pieces[j]))
        return out


@dataclass(frozen=True)
class Neighbour:
    """One stored context near the question: its word, squared distance, normalised weight, source and the contexts
    it stands for (more than 1 in a pruned store, where near-duplicates of one document were merged into it)."""

    token: str
    distance: float
    weight: float
    doc_id: str
    title: str
    sentence: str
    span: tuple[int, int]
    count: int = 1
    date: str | None = None  # its document's date, where its corpus gave one


@dataclass
class Prediction:
    """Ranked answers of BERT, kNN and BERT-kNN for one question, with the evidence behind the kNN answers and, where
    newer documents about the subject outvoted older ones (`knn.version_weights`), the older ones' nearest statement
    (`superseded`), so a user sees that a fact changed.

    Also kept, not shown: the three distributions, the neighbours the kNN answer came from (`search.Neighbours`)
    and the question's token ids with its mask position (for `fill_mask`).
    """

    question: str
    subject: str | None
    documents: list[str]
    bert: list[TokenScore]
    knn: list[TokenScore]
    bert_knn: list[TokenScore]
    evidence: dict[str, list[Neighbour]]
    p_bert: np.ndarray = field(repr=False)
    p_knn: np.ndarray | None = field(repr=False)
    p: np.ndarray = field(repr=False)
    retrieval: str = "ir"  # where the neighbours came from: "ir", "faiss" or "ir+faiss"
    neighbours: Neighbours | None = field(default=None, repr=False)
    input_ids: list[int] = field(default_factory=list, repr=False)
    mask_index: int = 0
    superseded: list[Neighbour] = field(default_factory=list)  # what older documents about the subject said instead

    def to_dict(self, tokenizer=None) -> dict:
        """JSON-ready form (without the distributions and neighbours); with a `tokenizer`, also each ranking in the
        fill-mask format under "fill_mask"."""
        out = {
            "question": self.question,
            "subject": self.subject,
            "documents": list(self.documents),
            **{name: [{**asdict(t), "pieces": list(t.pieces)} for t in getattr(self, name)] for name in METHODS},
            "evidence": {word: [asdict(n) for n in found] for word, found in self.evidence.items()},
            "superseded": [asdict(n) for n in self.superseded],
            "retrieval": self.retrieval,
        }
        if tokenizer is not None:
            out["fill_mask"] = {name: self.fill_mask(tokenizer, name) for name in METHODS}
        return out

    def fill_mask(self, tokenizer, method: str = "bert_knn") -> list[dict]:
        """A ranking ("bert", "knn" or "bert_knn") as transformers' `pipeline("fill-mask")` gives one: {score,
        token (the vocabulary id; for a word of several tokens, the list of their ids), token_str, sequence (the
        question with its mask filled by the word's tokens, special tokens dropped)} each."""
        out = []
        for t in getattr(self, method):
            ids = [*self.input_ids[: self.mask_index], *t.pieces, *self.input_ids[self.mask_index + 1 :]]
            sequence = tokenizer.decode(ids, skip_special_tokens=True)
            token = t.id if len(t.pieces) == 1 else list(t.pieces)
            out.append(
                {"score": t.probability, "token": token, "token_str": tokenizer.decode(t.pieces), "sequence": sequence}
            )
        return out


METHODS = ("bert", "knn", "bert_knn")


def confident_lam(p_knn: np.ndarray, lam: float, neighbours: int) -> float:
    """The adaptive lambda ("entropy"): `lam` scaled by the kNN's confidence, 1 - H(p_kNN) / log(neighbours), so
    neighbours that agree on one word weigh up to `lam` and neighbours spread over many words weigh little (no extra
    forward pass). One neighbour: `lam`."""
    if neighbours < 2:
        return lam
    p = p_knn[p_knn > 0]
    return float(lam * max(0.0, 1.0 + float(np.sum(p * np.log(p))) / np.log(neighbours)))


def log_linear_scores(p_knn: np.ndarray, p_bert: np.ndarray, lam: float | np.ndarray) -> np.ndarray:
    """lambda * log p_kNN + (1 - lambda) * log p_BERT of words some neighbour holds (p_knn > 0): the log-linear
    mixture before normalising; `lam` a number (one score per word), or an array of them (a row of scores each). An
    LM probability that underflowed to 0 is floored, so the word still ranks, below the others."""
    lam = np.asarray(lam, np.float64)[..., None]
    return lam * np.log(p_knn) + (1.0 - lam) * np.log(np.maximum(p_bert, np.finfo(np.float64).tiny))


def interpolate(
    p_bert: np.ndarray, p_knn: np.ndarray | None, lam: float, mixture: str = "linear", prior: np.ndarray | None = None
) -> np.ndarray:
    """The two distributions combined: "linear" (the paper), lambda * p_kNN + (1 - lambda) * p_BERT; "log-linear",
    p_kNN^lambda * p_BERT^(1 - lambda) renormalised, so an answer needs both supports: the neighbours' words ranked
    by how well each fits the question as the LM reads it (words no neighbour holds get 0), each times its `prior`
    if one is given (`Words.prior`). p_BERT alone when there is no kNN distribution."""
    if p_knn is None:
        return p_bert
    if mixture == "linear":
        return lam * p_knn + (1.0 - lam) * p_bert
    held = np.flatnonzero(p_knn > 0)
    score = log_linear_scores(p_knn[held], p_bert[held], lam)
    if prior is not None:
        score = score + np.log(prior[held])
    weights = np.exp(score - score.max())
    out = np.zeros(len(p_bert), dtype=np.float64)
    out[held] = weights / weights.sum()
    return out


def calibrate(p: np.ndarray, p_lm: np.ndarray, temperature: float = 1.0, floor: float = 0.0) -> np.ndarray:
    """Probabilities that mean what they say (Guo et al., On calibration of modern neural networks, ICML 2017:
    temperature scaling): p^(1/temperature) renormalised, then mixed with the LM's distribution by `floor`, (1 -
    floor) p + floor p_LM, so that a word no neighbour holds keeps some probability. The temperature keeps the words'
    order; the floor adds floor p_LM to each, which reorders only words closer than that. Both values are fitted on a
    dev split (bench/calibration.py)."""
    if temperature == 1 and floor == 0:
        return p
    held = p > 0
    scaled = np.zeros(len(p))
    scaled[held] = np.exp((np.log(p[held]) - np.log(p[held]).max()) / temperature)
    return (1.0 - floor) * scaled / scaled.sum() + floor * np.asarray(p_lm, np.float64)


def ranked(p: np.ndarray | None, tokenizer, k: int, words: Words | None = None) -> list[TokenScore]:
    """The k most probable words (`words`; default: the vocabulary of `p`) with non-zero probability, best first
    (ties by index)."""
    if p is None or k < 1 or not len(p):
        return []
    words = words or Words(len(p))
    kth = torch.topk(torch.from_numpy(p), min(k, len(p))).values[-1].item()  # torch.topk: faster than np.argpartition
    top = np.flatnonzero(p >= kth) if kth > 0 else np.flatnonzero(p > 0)  # every word tied with the k-th too
    top = top[np.lexsort((top, -p[top]))][:k]
    found = words.describe(top.tolist(), tokenizer)
    return [TokenScore(text, float(p[i]), word_id, pieces) for i, (text, word_id, pieces) in zip(top, found)]
