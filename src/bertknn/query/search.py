"""Search stage: a question's nearest stored contexts, through one signature whatever the source (SPEC §2-§3).

As Pyserini's searchers do, every searcher answers `search(question, subject, state, settings)` and
`batch_search(...)` with `Neighbours` records:
- `DocumentSearch` (the paper): the document titled by the subject, else TF-IDF's top n_docs, then exact kNN over
  their entries (a lazy datastore embeds them first);
- `FaissSearch`: the whole datastore through its FAISS index, re-ranked by exact distance;
- `MergedSearch(a, b)`: both, merged by distance.
Prediction, evaluation and tuning all search through these: nothing else retrieves documents or neighbours. A searcher
that knows a question's documents before its state (`ahead`: the document search) says so, so that work on them can
run beside the model's pass.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bertknn.index.exact import candidates, nearest
from bertknn.index.faiss_index import FaissIndex
from bertknn.index.retrieval import Selected, TfidfIndex, select_documents
from bertknn.query.settings import Settings
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.records import Provenance


@dataclass(frozen=True)
class Neighbours:
    """What a search found for one question.

    documents: indices of the documents searched (FAISS: those the neighbours come from, nearest first);
    entries, distances, values: the k nearest stored contexts, nearest first (ties by entry), their squared L2
    distances and their words; searched: every entry compared exactly (the documents' entries; none for FAISS);
    scores: the retrieval scores of `documents` (TF-IDF; 1 for the title shortcut's), None for FAISS's;
    versions: `documents` grouped by title, each group newest first (`retrieval.Selected`); None for FAISS's.
    """

    documents: list[int]
    entries: np.ndarray
    distances: np.ndarray
    values: np.ndarray
    searched: np.ndarray
    scores: list[float] | None = None
    versions: list[list[int]] | None = None

    def top(self, k: int) -> Neighbours:
        """The k nearest of these (the same documents and searched entries)."""
        return dataclasses.replace(self, entries=self.entries[:k], distances=self.distances[:k], values=self.values[:k])


class Search(Protocol):
    """A source of neighbours: one question at a time, or a batch (whose work may be shared)."""

    def search(self, question: str, subject: str | None, state: np.ndarray, settings: Settings) -> Neighbours: ...

    def batch_search(
        self, questions: Sequence[str], subjects: Sequence[str | None], states: np.ndarray, settings: Settings
    ) -> list[Neighbours]: ...

    def ahead(
        self, questions: Sequence[str], subjects: Sequence[str | None], settings: Settings
    ) -> list[list[int]] | None: ...


class ShardUnavailable(RuntimeError):
    """A shard searched elsewhere did not answer: its replica died with its node, or gave no answer in time. The
    question can be asked again once the replica is back (Ray Serve restarts it where there is room)."""


class RemoteShards(Protocol):
    """A sharded datastore's shards searched where they are held (`ray_serve.ServedShards`, through
    `BertKNN.serve_shards_on`): exact kNN over documents (global numbers), asking only the shards that own them, and
    the FAISS index (None when a shard has none)."""

    def nearest(self, docs: list[int], state: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def faiss(self, store: Datastore) -> object | None: ...


def _values(store: Datastore, entries: np.ndarray) -> np.ndarray:
    return np.asarray(store.values[entries]) if len(entries) else np.zeros(0, np.int32)


def in_mentions(provenance: Sequence[Provenance], name: str) -> np.ndarray:
    """Whether each entry's word lies inside a mention of `name` in its sentence (case-insensitive, whole words):
    masking a word of "The Icelandic Dream" in "... of The Icelandic Dream was Tamil" asks for the name, not for a
    fact about it, so such contexts do not vote on questions about it. Pruned entries are judged by the context they
    keep."""
    pattern = re.compile(rf"(?<!\w){re.escape(' '.join(name.split()))}(?!\w)", re.IGNORECASE)
    spans: dict[str, list[tuple[int, int]]] = {}
    out = np.zeros(len(provenance), bool)
    for i, p in enumerate(provenance):
        if p.sentence not in spans:
            spans[p.sentence] = [m.span() for m in pattern.finditer(p.sentence)]
        out[i] = any(start <= p.span[0] and p.span[1] <= end for start, end in spans[p.sentence])
    return out


class DocumentSearch:
    """The paper's search: choose documents (title shortcut, else TF-IDF), then exact kNN over their entries.

    `embed(docs)`, given for a lazy datastore, embeds the documents that lack keys before they are searched;
    `shards`, given for a sharded datastore served elsewhere, searches the documents' keys where they are held.
    """

    def __init__(
        self,
        store: Datastore,
        index: TfidfIndex,
        embed: Callable[[list[int]], object] | None = None,
        shards: RemoteShards | None = None,
    ):
        self.store, self.index, self.embed, self.shards = store, index, embed, shards
        self._ahead: dict[tuple[str, str | None, int, bool, bool], Selected] = {}  # chosen by `ahead`

    def scored(
        self, question: str, subject: str | None, n_docs: int, named: bool = True, about: bool = True
    ) -> Selected:
        """The documents searched for a question (those titled `subject` and, with `about`, the dated ones that name
        it, if any; else TF-IDF's top n_docs; with `named`, those naming the question's entity) and their retrieval
        scores (`retrieval.select_documents`)."""
        return select_documents(self.store, self.index, question, subject, int(n_docs), named, about)

    def documents(self, question: str, subject: str | None, n_docs: int, named: bool = True) -> list[int]:
        """The documents of `scored`."""
        return self.scored(question, subject, n_docs, named).documents

    def among(self, docs: list[int] | Selected, state: np.ndarray, k: int) -> Neighbours:
        """The k entries of `docs` (as `scored` chose them, or a list) nearest to `state` (exact squared L2)."""
        chosen = docs if isinstance(docs, Selected) else Selected(list(docs), None, [[d] for d in docs])
        docs = chosen.documents
        if self.embed is not None:
            self.embed(docs)  # first: the key memmap grows
        searched = candidates(self.store.documents.ranges(docs))
        wanted = 2 * int(k) if chosen.entity else int(k)  # room for the entity's own name, dropped below
        if self.shards is not None:
            entries, dist = self.shards.nearest(docs, state, wanted)
        else:
            entries, dist = nearest(self.store.keys, searched, state, wanted)
        if chosen.entity:
            kept = ~in_mentions(self.store.documents.provenance(entries.tolist()), chosen.entity)
            entries, dist = entries[kept][: int(k)], dist[kept][: int(k)]
        values = _values(self.store, entries)
        return Neighbours(docs, entries, dist, values, searched, chosen.scores, chosen.versions)

    def search(self, question: str, subject: str | None, state: np.ndarray, settings: Settings) -> Neighbours:
        """The neighbours of one question."""
        return self.among(self.scored(question, subject, *_choice(settings)), state, settings.k)

    def ahead(self, questions: Sequence[str], subjects: Sequence[str | None], settings: Settings) -> list[list[int]]:
        """The documents each question will search (`scored`), chosen before its state is known and kept for its
        `batch_search`, which then does not choose them again."""
        choice = _choice(settings)
        for question, subject in zip(questions, subjects):
            self._ahead[(question, subject, *choice)] = self.scored(question, subject, *choice)
        return [self._ahead[(q, s, *choice)].documents for q, s in zip(questions, subjects)]

    def batch_search(
        self, questions: Sequence[str], subjects: Sequence[str | None], states: np.ndarray, settings: Settings
    ) -> list[Neighbours]:
        """The neighbours of many questions; a lazy datastore embeds all their documents in one run."""
        choice = _choice(settings)
        chosen = [
            self._ahead.pop((q, s, *choice), None) or self.scored(q, s, *choice) for q, s in zip(questions, subjects)
        ]
        if self.embed is not None:
            self.embed(sorted({d for c in chosen for d in c.documents}))
        return [self.among(c, state, settings.k) for c, state in zip(chosen, states)]


def _choice(settings: Settings) -> tuple[int, bool, bool]:
    """What of the settings chooses a question's documents: n_docs, the entity filter, and whether dated documents
    that name the subject are its documents (conflicts "newest")."""
    return int(settings.n_docs), settings.entity_filter, settings.conflicts == "newest"


def _nearest_first(entries: np.ndarray, dist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct entries, the k nearest, nearest first with ties by entry (the order exact kNN gives)."""
    entries, first = np.unique(entries, return_index=True)
    dist = dist[first]
    order = np.lexsort((entries, dist))[:k]
    return entries[order], dist[order]


class FaissSearch:
    """Search the whole datastore through its FAISS index (hidden documents dropped, re-ranked exactly)."""

    def __init__(self, store: Datastore, faiss: FaissIndex) -> None:
        self.store, self.faiss = store, faiss

    def search(self, question: str, subject: str | None, state: np.ndarray, settings: Settings) -> Neighbours:
        """The neighbours of one question; documents are those they come from, nearest first."""
        k = int(settings.k)
        entries, dist = _nearest_first(*self.faiss.search(state, k, self.store.documents.hidden()), k)
        documents = list(dict.fromkeys(self.store.documents.of(entries).tolist()))
        return Neighbours(documents, entries, dist, _values(self.store, entries), np.zeros(0, np.int64))

    def batch_search(
        self, questions: Sequence[str], subjects: Sequence[str | None], states: np.ndarray, settings: Settings
    ) -> list[Neighbours]:
        """`search` for each question."""
        return [self.search(q, s, state, settings) for q, s, state in zip(questions, subjects, states)]

    def ahead(self, questions: Sequence[str], subjects: Sequence[str | None], settings: Settings) -> None:
        """None: the documents come from the neighbours, found from the states."""
        return None


class MergedSearch:
    """Two searches merged by distance (as Pyserini's hybrid searcher merges two): the k nearest of both, with the
    first's documents and searched entries."""

    def __init__(self, first: Search, second: Search, store: Datastore) -> None:
        self.first, self.second, self.store = first, second, store

    def _merged(self, a: Neighbours, b: Neighbours, k: int) -> Neighbours:
        both = np.concatenate([a.entries, b.entries]), np.concatenate([a.distances, b.distances])
        entries, dist = _nearest_first(*both, k)
        values = _values(self.store, entries)
        return Neighbours(a.documents, entries, dist, values, a.searched, a.scores, a.versions)

    def search(self, question: str, subject: str | None, state: np.ndarray, settings: Settings) -> Neighbours:
        """The k nearest of both searches' neighbours."""
        a = self.first.search(question, subject, state, settings)
        return self._merged(a, self.second.search(question, subject, state, settings), int(settings.k))

    def batch_search(
        self, questions: Sequence[str], subjects: Sequence[str | None], states: np.ndarray, settings: Settings
    ) -> list[Neighbours]:
        """`search` for each question, each search batched."""
        a = self.first.batch_search(questions, subjects, states, settings)
        b = self.second.batch_search(questions, subjects, states, settings)
        return [self._merged(x, y, int(settings.k)) for x, y in zip(a, b)]

    def ahead(self, questions: Sequence[str], subjects: Sequence[str | None], settings: Settings) -> None:
        """None: the second search's documents come from its neighbours."""
        return None


def searcher(
    documents: DocumentSearch, retrieval: str, faiss: FaissIndex | None, faiss_error: Exception | None = None
) -> Search:
    """The searcher of a retrieval setting: "ir" the document search, "faiss" the FAISS index's, "ir+faiss" both
    merged; DatastoreError (or `faiss_error`, why it could not be loaded) where FAISS is asked for and there is none."""
    if retrieval == "ir":
        return documents
    store = documents.store
    if faiss is None:
        raise faiss_error or DatastoreError(
            f"{store.path} has no FAISS index: create one with `bertknn index {store.path}`"
        )
    found = FaissSearch(store, faiss)
    return found if retrieval == "faiss" else MergedSearch(documents, found, store)
