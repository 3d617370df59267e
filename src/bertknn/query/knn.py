"""The kNN vote (SPEC §3): p_kNN(w) = sum of exp(-d_i / T) over the neighbours whose value is w, normalised over the
neighbours (computed after subtracting the smallest distance, so it never underflows); the retrieval-aware variant
that weighs documents; the neighbours are found by `index.exact` or FAISS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from bertknn.query.settings import NEWER, Settings
from bertknn.store.datastore import DatastoreError

if TYPE_CHECKING:
    from bertknn.query.search import Neighbours
    from bertknn.query.words import Words
    from bertknn.store.datastore import Datastore


def neighbour_weights(sq_dist: np.ndarray, temperature: float, log_weights: np.ndarray | None = None) -> np.ndarray:
    """exp(-d / T) (times exp(`log_weights`), a neighbour's sentence weight) normalised over the neighbours, computed
    stably from the largest weight."""
    score = -(np.asarray(sq_dist, np.float64) - np.min(sq_dist)) / temperature
    if log_weights is not None:
        score = score + log_weights
        score -= score.max()
    w = np.exp(score)
    return w / w.sum()


def knn_distribution(
    values: np.ndarray, sq_dist: np.ndarray, temperature: float, vocab_size: int, log_weights: np.ndarray | None = None
) -> np.ndarray:
    """p_kNN over the vocabulary: each word gets the SUM of its neighbours' normalised weights."""
    return np.bincount(values, weights=neighbour_weights(sq_dist, temperature, log_weights), minlength=vocab_size)


def document_prior(scores: np.ndarray, doc_temperature: float) -> np.ndarray:
    """p(d|q) over retrieved documents: softmax of their retrieval scores relative to the best one (so the scale of
    TF-IDF scores, which varies from query to query, does not matter) over `doc_temperature`."""
    scores = np.asarray(scores, np.float64)
    best = scores.max() if len(scores) and scores.max() > 0 else 1.0
    w = np.exp((scores / best - 1.0) / doc_temperature)
    return w / w.sum()


def document_vote(
    values: np.ndarray,
    sq_dist: np.ndarray,
    groups: np.ndarray,
    prior: np.ndarray,
    temperature: float,
    vocab_size: int,
    log_weights: np.ndarray | None = None,
) -> np.ndarray:
    """Retrieval-aware p_kNN, a marginalisation over documents: p(w) = sum_d p(d|q) p_kNN(w|d), where p_kNN(w|d) is
    the vote of document d's neighbours alone (exp(-dist/T), times exp(`log_weights`) when given, normalised within d)
    and `groups[i]` the index into `prior` (p(d|q)) of neighbour i's document. Documents holding no neighbour drop out
    and the prior is renormalised over the others, so a near key from a poorly retrieved document cannot outvote the
    best document alone."""
    sq = np.asarray(sq_dist, np.float64)
    nearest_of = np.full(len(prior), np.inf)
    np.minimum.at(nearest_of, groups, sq)
    score = -(sq - nearest_of[groups]) / temperature  # from each document's nearest: never all underflow
    if log_weights is not None:
        score = score + log_weights
        best_of = np.full(len(prior), -np.inf)
        np.maximum.at(best_of, groups, score)
        score -= best_of[groups]
    w = np.exp(score)
    per_doc = np.bincount(groups, weights=w, minlength=len(prior))
    held = np.where(per_doc > 0, prior, 0.0)
    return np.bincount(values, weights=w / per_doc[groups] * (held / held.sum())[groups], minlength=vocab_size)


def outranked(owners: np.ndarray, sq_dist: np.ndarray, documents: list[int], temperature: float) -> dict[int, int]:
    """For each of the subject's documents `documents` (newest first; `owners[i]` neighbour i's document, `sq_dist[i]`
    its distance), the newer documents that speak to the question as nearly: whose nearest neighbour lies within one
    `temperature` of its own nearest (their evidence weighs at least 1/e of its own)."""
    nearest = {doc: np.inf for doc in documents}
    for doc, d in zip(owners.tolist(), np.asarray(sq_dist, np.float64).tolist()):
        if doc in nearest:  # neighbours of other documents than these count for none of them
            nearest[doc] = min(nearest[doc], d)
    near = {doc: nearest[doc] + temperature for doc in documents}
    return {doc: sum(nearest[n] <= near[doc] for n in documents[:i]) for i, doc in enumerate(documents)}


def version_weights(
    owners: np.ndarray, sq_dist: np.ndarray, versions: list[list[int]], newer: float, temperature: float
) -> np.ndarray:
    """Log weights of neighbours (`owners[i]` neighbour i's document) from the versions of each article (`versions`:
    groups of documents, newest first; `outranked` within each): `newer` taken off per newer version that speaks to
    the question as nearly. So a fact stated anew outvotes the old statement, while a newer document that says
    nothing near the question (a fact it does not restate) leaves the older one's evidence its full weight."""
    later = {}
    for group in versions:
        later |= outranked(owners, sq_dist, group, temperature) if len(group) > 1 else {group[0]: 0}
    return -newer * np.array([later.get(int(d), 0) for d in owners], np.float64)


def vote(
    store: Datastore, found: Neighbours, s: Settings, words: Words, log_weights: np.ndarray | None = None
) -> np.ndarray | None:
    """p_kNN of one question over `words` (None without neighbours), as the settings say: the paper's vote or the
    retrieval-aware one (`doc_temperature`), each neighbour also weighted by exp(`log_weights`) when given (its
    sentence's, `sentences.weights`), by its document's version (`conflicts`) and, in a pruned store, by the
    contexts it stands for. Damaged neighbours raise DatastoreError."""
    if not len(found.entries):
        return None
    _check(store, found, words.vocab)
    values = words.index(found.values)
    counts = store.counts_of(found.entries)
    if counts is not None:  # an entry standing for n merged contexts votes as n of them at its distance
        log_weights = np.log(counts) if log_weights is None else log_weights + np.log(counts)
    versions = found.versions or [[d] for d in found.documents]
    if s.conflicts == "newest" and any(len(group) > 1 for group in versions):  # an article and its updates
        owners = store.documents.of(found.entries)
        newer = version_weights(owners, found.distances, versions, NEWER, s.temperature)
        log_weights = newer if log_weights is None else log_weights + newer
    if s.doc_temperature and found.scores is not None:
        # the versions of one article vote as one document, with its best retrieval score
        position = {doc: i for i, group in enumerate(versions) for doc in group}
        extra = len(versions)  # a neighbour from a document IR did not retrieve (ir+faiss): score 0
        groups = np.array([position.get(int(d), extra) for d in store.documents.of(found.entries)])
        score = dict(zip(found.documents, found.scores))
        best = [max(score[d] for d in group) for group in versions]
        prior = document_prior(np.append(best, 0.0), s.doc_temperature)
        return document_vote(values, found.distances, groups, prior, s.temperature, words.size, log_weights)
    return knn_distribution(values, found.distances, s.temperature, words.size, log_weights)


def _check(store: Datastore, found: Neighbours, vocab: int) -> None:
    """A damaged key (NaN) or value (outside the vocabulary, in a store of words of one token) must never reach an
    answer (a value outside the lexicon is found when its word is read)."""
    values = found.values
    bad = ~np.isfinite(found.distances) | (values < 0) | ((values >= vocab) & (not store.lexicon.whole_words))
    if bad.any():
        raise DatastoreError(
            f"{store.path} is damaged: entries {found.entries[bad][:5].tolist()} hold a non-finite key or a value "
            f"outside the model's vocabulary; `bertknn verify {store.path}` locates the damage"
        )
