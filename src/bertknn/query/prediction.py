"""What a user gets for one question (`Prediction`): the rankings of BERT, kNN and BERT-kNN (`ranked`), the evidence
behind the kNN's answers (`evidence`) and what older documents about the subject said instead (`superseded`); and
the records of the stages before it: a question checked and encoded (`Query`), its model pass, search and vote
(`Forwarded`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import torch

from bertknn.query.knn import neighbour_weights, outranked
from bertknn.query.linking import Link
from bertknn.query.search import Neighbours
from bertknn.query.words import Words

if TYPE_CHECKING:
    from bertknn.store.datastore import Datastore
    from bertknn.store.records import Provenance


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
    linked: Link | None = None  # the subject found in the question's text, where none was given (`subject` is it)

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
            "linked": self.linked.to_dict() if self.linked else None,
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


def _source(e: Provenance) -> tuple:
    """A neighbour's source fields (`Neighbour`) from its entry's provenance."""
    return e.doc_id, e.title, e.sentence, e.span, e.count, e.date


def evidence_shown(
    store: Datastore, answers: list[TokenScore], found: Neighbours, n_evidence: int, temperature: float
) -> dict[str, list[Neighbour]]:
    """For each kNN answer, its nearest `n_evidence` neighbours with their sentences."""
    if not answers:
        return {}
    dist, counts = found.distances, store.counts_of(found.entries)
    weights = neighbour_weights(dist, temperature, None if counts is None else np.log(counts))
    picks = [np.flatnonzero(found.values == w.id)[:n_evidence] for w in answers]
    rows = iter(store.documents.provenance(found.entries[np.concatenate(picks)].tolist()))  # one query for all words
    return {
        word.token: [
            Neighbour(word.token, float(dist[i]), float(weights[i]), *_source(e))
            for i, e in zip(mine, islice(rows, len(mine)))
        ]
        for word, mine in zip(answers, picks)
    }


def superseded(store: Datastore, tokenizer, found: Neighbours, words: Words, temperature: float) -> list[Neighbour]:
    """The nearest neighbour of each of the subject's documents that a newer one outvoted (`knn.outranked`), where
    it holds another word than the newest document's nearest: what the older documents said instead."""
    groups = [group for group in found.versions or [] if len(group) > 1]
    if not groups:
        return []
    owners = store.documents.of(found.entries)
    nearest = {doc: int(np.flatnonzero(owners == doc)[0]) for doc in found.documents if (owners == doc).any()}
    picks = []
    for group in groups:
        said = found.values[nearest[group[0]]] if group[0] in nearest else None  # the newest version's word
        older = [doc for doc, n in outranked(owners, found.distances, group, temperature).items() if n]
        picks += [nearest[doc] for doc in older if doc in nearest and found.values[nearest[doc]] != said]
    if not picks:
        return []
    weights = neighbour_weights(found.distances, temperature)
    rows = store.documents.provenance(found.entries[picks].tolist())
    described = words.describe(words.index(found.values[picks]).tolist(), tokenizer)
    return [
        Neighbour(text, float(found.distances[i]), float(weights[i]), *_source(e))
        for (text, _, _), i, e in zip(described, picks, rows)
    ]


@dataclass(frozen=True)
class Query:
    """A cloze question checked and encoded for the model (`BertKNN.preprocess`): its token ids and mask position."""

    text: str
    subject: str | None
    ids: list[int]
    mask: int
    link: Link | None = None  # the subject found in the text, where none was given (`linking.link`)


@dataclass(frozen=True)
class Forwarded:
    """What `BertKNN._forward` makes of one question: the LM's distribution over the vocabulary, the neighbours
    found, the words answers are ranked over (scored by the LM where the mixture needs it) and the kNN's vote over
    them (None without neighbours)."""

    query: Query
    p_bert: np.ndarray
    found: Neighbours
    words: Words
    vote: np.ndarray | None
