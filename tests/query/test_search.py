"""The one search path: searchers against brute force, and predict / eval lama / tune finding the same neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn.evaluation.facts import Fact
from bertknn.evaluation.metrics import rank_of
from bertknn.evaluation.run import evaluate_facts
from bertknn.evaluation.tune import cache_facts
from bertknn.query import search
from bertknn.query.settings import PAPER
from tests.conftest import index_keys

from ..tolerances import assert_neighbours_close

QUESTION = "The café in the town where she was born serves [MASK] ."  # no subject: TF-IDF picks 3 documents


def _brute_force(store, entries: np.ndarray, state: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest of `entries` by squared L2 in float64, ties by entry."""
    keys = np.asarray(store.keys[entries], np.float64)
    dist = ((keys - state.astype(np.float64)) ** 2).sum(1)
    order = np.lexsort((entries, dist))[:k]
    return entries[order], dist[order]


def _state(knn, question: str) -> np.ndarray:
    return knn.encoder.query([question])[1][0]


def test_document_search_is_exact_knn_over_the_chosen_documents(built):
    state = _state(built, QUESTION)
    documents = built.search("ir")
    found = documents.search(QUESTION, None, state, PAPER.replace(k=7))
    assert found.documents == documents.documents(QUESTION, None, PAPER.n_docs) and len(found.documents) == 3
    ranges = built.store.documents.ranges(found.documents)
    searched = np.concatenate([np.arange(a, b) for a, b in ranges])
    assert found.searched.tolist() == searched.tolist()
    entries, dist = _brute_force(built.store, searched, state, 7)
    assert_neighbours_close(found.entries, found.distances, entries, dist)  # float32 distances against float64 ones
    assert found.values.tolist() == np.asarray(built.store.values[found.entries]).tolist()
    top = found.top(3)
    assert top.entries.tolist() == found.entries[:3].tolist() and top.documents == found.documents


def test_documents_chosen_ahead_are_searched_without_choosing_them_again(built, monkeypatch):
    documents, settings = built.search("ir"), PAPER.replace(k=7)
    state = _state(built, QUESTION)
    expected = documents.search(QUESTION, None, state, settings)
    assert documents.ahead([QUESTION], [None], settings) == [expected.documents]
    with monkeypatch.context() as patch:
        patch.setattr(documents, "scored", lambda *args: pytest.fail("chosen again"))
        (found,) = documents.batch_search([QUESTION], [None], state[None], settings)
    assert found.documents == expected.documents and found.entries.tolist() == expected.entries.tolist()
    assert not documents._ahead  # kept for one search: the next chooses again
    (again,) = documents.batch_search([QUESTION], [None], state[None], settings)
    assert again.entries.tolist() == expected.entries.tolist()


def test_faiss_and_merged_search_over_a_flat_index_equal_brute_force_over_everything(built):
    index_keys(built.store, "Flat")
    built.refresh()
    state = _state(built, QUESTION)
    settings = PAPER.replace(k=9)
    everything, dist = _brute_force(built.store, np.arange(built.store.size), state, 9)
    faiss = built.search("faiss").search(QUESTION, None, state, settings)
    merged = built.search("ir+faiss")
    assert isinstance(merged, search.MergedSearch)
    both = merged.search(QUESTION, None, state, settings)
    ir = built.search("ir").search(QUESTION, None, state, settings)
    for found in (faiss, both):
        assert_neighbours_close(found.entries, found.distances, everything, dist)  # float32 against float64
    owners = built.store.documents.of(faiss.entries).tolist()
    assert faiss.documents == list(dict.fromkeys(owners)) and len(faiss.searched) == 0
    assert both.documents == ir.documents and both.searched.tolist() == ir.searched.tolist()
    (batched,) = merged.batch_search([QUESTION], [None], state[None], settings)
    assert batched.entries.tolist() == both.entries.tolist()
    assert built.search("faiss").ahead([QUESTION], [None], settings) is None  # the documents come from the state
    assert merged.ahead([QUESTION], [None], settings) is None


def test_predict_eval_lama_and_tune_find_the_same_neighbours(built, tmp_path, monkeypatch):
    """Every caller searches through `DocumentSearch.among`; what each got for the same fact is identical."""
    seen: list[search.Neighbours] = []
    among = search.DocumentSearch.among

    def recording(self, docs, state, k):
        found = among(self, docs, state, k)
        seen.append(found)
        return found

    monkeypatch.setattr(search.DocumentSearch, "among", recording)
    built.settings = PAPER  # the vote the tuning grid scores
    answer = "brazil"
    fact = Fact("T-REx", "P495", "", answer, QUESTION, built.encoder.tokenizer.convert_tokens_to_ids(answer))

    predicted = built.predict(QUESTION)
    (from_predict,) = seen
    assert predicted.neighbours is from_predict
    (row,) = evaluate_facts(built, [fact], tmp_path / "results.jsonl")
    from_eval = seen[1]
    (cached,) = cache_facts(built, [fact])
    from_tune = seen[2:]  # n_docs = 1..5, the k of the grid's largest
    assert len(from_tune) == 5

    for found in (from_eval, from_tune[PAPER.n_docs - 1].top(PAPER.k)):
        assert found.documents == from_predict.documents
        assert found.entries.tolist() == from_predict.entries.tolist()
        assert found.distances.tolist() == from_predict.distances.tolist()
        assert found.values.tolist() == from_predict.values.tolist()
    values, dist = cached.neighbours[PAPER.n_docs]
    assert values[: PAPER.k].tolist() == from_predict.values.tolist()
    assert dist[: PAPER.k].tolist() == from_predict.distances.astype(np.float64).tolist()
    # what each caller computed from those neighbours agrees too
    vocab = built.encoder.vocab_size  # LAMA ranks the vocabulary: words of several wordpieces are not ranked
    assert row["ranks"]["knn"] == rank_of(predicted.p_knn, fact.answer_id, size=vocab)
    assert row["ranks"]["bert_knn"] == rank_of(predicted.p, fact.answer_id, size=vocab)
    lam = np.asarray([PAPER.lam])
    ranked = cached.ranks(PAPER.n_docs, PAPER.k, PAPER.temperature, lam)[0]
    assert ranked == rank_of(predicted.p, fact.answer_id, size=vocab)


def test_a_retrieval_without_faiss_index_names_the_command(built):
    with pytest.raises(ValueError, match="bertknn index"):
        built.search("faiss")
