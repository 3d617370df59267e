"""Removing what was added gives every TF-IDF score back as it was: removed documents count in no idf (an edit undone
leaves no trace in retrieval, `TfidfIndex.scores`)."""

import numpy as np


def test_scores_after_an_add_and_its_removal_equal_those_before(built):
    queries = ["Ilsa Varnhold plays", "born in Lisbon", "town in Norway", "capital of France", "cello Vienna"]
    before = [built.index.scores(q, built.store.documents.hidden()) for q in queries]
    added = [
        {"id": f"e{i}", "title": f"Person {i}", "text": f"Person {i} plays the cello in Vienna and Lisbon."}
        for i in range(4)
    ]
    built.add_documents(added)
    during = built.index.scores("cello Vienna", built.store.documents.hidden())
    assert {5, 6, 7, 8} <= set(during[0].tolist())  # after the five documents of the small corpus
    built.remove_documents([d["id"] for d in added])
    hidden = built.store.documents.hidden()
    assert hidden.tolist() == [5, 6, 7, 8]
    for query, (docs, scores) in zip(queries, before):
        again, again_scores = built.index.scores(query, hidden)
        live = ~np.isin(again, hidden)
        np.testing.assert_array_equal(again[live], docs)  # the same sums in the same order: bit for bit
        np.testing.assert_array_equal(again_scores[live], scores)
