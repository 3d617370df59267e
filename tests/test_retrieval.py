"""Retrieval stage: hashed TF-IDF against a direct computation of SPEC §2, the query rules, the title shortcut."""

from __future__ import annotations

import math
import re
import shutil
from collections import Counter

import numpy as np
import pytest
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from sklearn.utils import murmurhash3_32

from bertknn.pipeline import ensure_index
from bertknn.retrieval import TfidfIndex, question_query

DOCS = [
    "Dante Alighieri was born in Florence. Florence is in Tuscany.",
    "The poet Petrarch was born in Arezzo, near Florence.",
    "Lisbon is the capital of Portugal; Lisbon lies on the Tagus.",
    "Porto is a city in Portugal.",
    "The Tagus flows through Spain and Portugal.",
]


def direct_scores(docs: list[str], query: str) -> dict[int, float]:
    """SPEC §2 written out plainly: features, log1p tf, clipped BM25-style idf, dot product."""

    def features(text: str) -> Counter:
        toks = re.findall(r"\w+|[^\w\s]", text.lower())
        ok = [t not in ENGLISH_STOP_WORDS and bool(re.search(r"\w", t)) for t in toks]
        grams = [t for t, o in zip(toks, ok) if o] + [
            f"{a} {b}" for a, b, oa, ob in zip(toks, toks[1:], ok, ok[1:]) if oa and ob
        ]
        return Counter(murmurhash3_32(g, positive=True) % 2**24 for g in grams)

    doc_feats = [features(d) for d in docs]
    n = len(docs)

    def idf(h: int) -> float:
        nt = sum(h in f for f in doc_feats)
        return max(0.0, math.log((n - nt + 0.5) / (nt + 0.5)))

    q = {h: math.log1p(c) * idf(h) for h, c in features(query).items()}
    return {
        i: sum(w * math.log1p(f[h]) * idf(h) for h, w in q.items() if h in f)
        for i, f in enumerate(doc_feats)
        if any(h in f for h in q)
    }


@pytest.mark.parametrize("query", ["Florence", "born in Florence", "Portugal Tagus", "Lisbon capital", "Spain"])
def test_scores_equal_the_direct_formula(query):
    index = TfidfIndex.build(DOCS)
    docs, scores = index.scores(query)
    expected = direct_scores(DOCS, query)
    assert sorted(docs.tolist()) == sorted(expected)
    for d, s in zip(docs.tolist(), scores):
        assert s == pytest.approx(expected[d], rel=1e-6)


def test_top_ranks_and_drops_zero_scores():
    index = TfidfIndex.build(DOCS)
    assert index.top("Florence", 3) == [0, 1]  # two mentions beat one; the others score nothing
    assert index.top("Lisbon Tagus", 1) == [2]
    assert index.top("Portugal", 3) == []  # in 3 of 5 documents: idf log(2.5/3.5) < 0 is clipped to 0


def test_empty_and_stopword_queries_return_no_documents():
    index = TfidfIndex.build(DOCS)
    assert index.top("", 3) == []
    assert index.top("the of and", 3) == []


def test_question_query_drops_mask_and_punctuation():
    assert question_query("Dante was born in [MASK] .").split() == ["Dante", "was", "born", "in"]


def test_save_and_load_round_trip(tmp_path):
    index = TfidfIndex.build(DOCS)
    index.save(tmp_path)
    loaded = TfidfIndex.load(tmp_path)
    assert loaded.n_docs == 5
    assert loaded.top("Florence Tuscany", 3) == index.top("Florence Tuscany", 3)
    with pytest.raises(FileNotFoundError, match="no IR index"):
        TfidfIndex.load(tmp_path / "nothing")


@pytest.mark.parametrize("split", [1, 3, 4])
def test_an_index_built_in_segments_scores_like_one_built_at_once(tmp_path, split):
    whole = TfidfIndex.build(DOCS)
    TfidfIndex.build(DOCS[:split]).save(tmp_path)
    TfidfIndex.build(DOCS[split:], first=split).save(tmp_path, first=split)
    parts = TfidfIndex.load(tmp_path)
    assert parts.n_docs == 5 and len(parts.segments) == 2
    for query in ("Florence", "born in Florence", "Portugal Tagus", "Lisbon capital", "Spain"):
        (d1, s1), (d2, s2) = whole.scores(query), parts.scores(query)
        assert d1.tolist() == d2.tolist()
        np.testing.assert_allclose(s1, s2, rtol=1e-6)
        assert whole.top(query, 5) == parts.top(query, 5)


def test_hidden_documents_are_never_returned():
    index = TfidfIndex.build(DOCS)
    assert index.top("Florence", 3, hidden=np.array([0])) == [1]
    assert index.top("Florence", 3, hidden=np.array([0, 1])) == []


def test_a_half_written_segment_is_ignored(tmp_path):
    TfidfIndex.build(DOCS[:3]).save(tmp_path)
    (tmp_path / "tfidf_add_000000003.tmp").mkdir()  # a crash before the rename
    assert TfidfIndex.load(tmp_path).n_docs == 3


def test_a_datastore_index_built_in_small_segments_equals_one_built_at_once(tmp_path, built):
    for name in built.store.path.glob("tfidf_*"):
        shutil.rmtree(name) if name.is_dir() else name.unlink()
    segmented = ensure_index(built.store, segment_docs=2)
    assert len(segmented.segments) == 3 and segmented.n_docs == 5
    whole = TfidfIndex.build(built.store.iter_document_texts())
    for query in ("Florence", "born in Lisbon", "capital France", "town Norway fjord"):
        (d1, s1), (d2, s2) = whole.scores(query), segmented.scores(query)
        assert d1.tolist() == d2.tolist() and len(d1)
        np.testing.assert_allclose(s1, s2, rtol=1e-6)
