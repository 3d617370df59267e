"""Retrieval stage: hashed TF-IDF against a direct computation of SPEC §2, the query rules, the title shortcut."""

from __future__ import annotations

import math
import re
import shutil
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from sklearn.utils import murmurhash3_32

from bertknn.index.retrieval import TfidfIndex, question_query
from bertknn.index.tfidf_files import compact, listing
from bertknn.ingest.ingester import Writer
from bertknn.store.datastore import DatastoreError
from bertknn.store.records import Part
from bertknn.store.writers import open_writer

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
        assert s == pytest.approx(expected[d], rel=1e-6)  # float32 log-tf against float64 (numpy, no BLAS)


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
    loaded = _load(tmp_path)
    assert loaded.n_docs == 5
    assert loaded.top("Florence Tuscany", 3) == index.top("Florence Tuscany", 3)
    with pytest.raises(FileNotFoundError, match="no IR index"):
        _load(tmp_path / "nothing")


@pytest.mark.parametrize("name", ["tfidf_logtf.npy", "tfidf_hashes.npy"])
def test_a_damaged_header_is_reported_as_damage(tmp_path, name):
    good = tmp_path / "good"
    good.mkdir()
    TfidfIndex.build(DOCS).save(good)
    data = (good / name).read_bytes()
    damaged = [data[:at] + bytes(len(data) - at) for at in range(0, 128, 4)]  # zeros from `at` on
    damaged.append(data.replace(b"'<", b"',", 1))  # a dtype numpy fails to parse with SyntaxError
    for i, wrong in enumerate(damaged):  # numpy raises ValueError, TokenError or SyntaxError, as the damage falls
        shutil.copytree(good, tmp_path / f"{i}")
        path = tmp_path / f"{i}" / name
        path.write_bytes(wrong)
        with pytest.raises(DatastoreError, match=rf"{re.escape(str(path))} is damaged \(.*`bertknn verify`"):
            _load(path.parent)


@pytest.mark.parametrize("split", [1, 3, 4])
def test_an_index_built_in_segments_scores_like_one_built_at_once(tmp_path, split):
    whole = TfidfIndex.build(DOCS)
    TfidfIndex.build(DOCS[:split]).save(tmp_path)
    TfidfIndex.build(DOCS[split:], first=split).save(tmp_path, first=split)
    parts = _load(tmp_path)
    assert parts.n_docs == 5 and len(parts.segments) == 2
    for query in ("Florence", "born in Florence", "Portugal Tagus", "Lisbon capital", "Spain"):
        (d1, s1), (d2, s2) = whole.scores(query), parts.scores(query)
        assert d1.tolist() == d2.tolist()
        np.testing.assert_allclose(s1, s2, rtol=1e-6)  # float32 log-tf summed in another order (numpy, no BLAS)
        assert whole.top(query, 5) == parts.top(query, 5)


def _load(directory: Path) -> TfidfIndex:
    """An index directory read as a datastore made before its parts were committed: by its listing."""
    return TfidfIndex.open(directory, listing(directory))


def test_hidden_documents_are_never_returned():
    index = TfidfIndex.build(DOCS)
    assert index.top("Florence", 3, hidden=np.array([0])) == [1]
    assert index.top("Florence", 3, hidden=np.array([0, 1])) == []


def test_a_half_written_segment_is_ignored(tmp_path):
    TfidfIndex.build(DOCS[:3]).save(tmp_path)
    (tmp_path / "tfidf_add_000000003.tmp").mkdir()  # a crash before the rename
    assert _load(tmp_path).n_docs == 3


def test_a_datastore_index_built_in_small_segments_equals_one_built_at_once(tmp_path, built):
    for name in built.store.path.glob("tfidf_*"):
        shutil.rmtree(name) if name.is_dir() else name.unlink()
    segmented = Writer(built.store).index_documents(segment_docs=2)
    assert len(segmented.segments) == 3 and segmented.n_docs == 5
    whole = TfidfIndex.build(built.store.documents.texts())
    for query in ("Florence", "born in Lisbon", "capital France", "town Norway fjord"):
        (d1, s1), (d2, s2) = whole.scores(query), segmented.scores(query)
        assert d1.tolist() == d2.tolist() and len(d1)
        np.testing.assert_allclose(s1, s2, rtol=1e-6)  # float32 log-tf summed in another order (numpy, no BLAS)


# --- segments merged as they pile up ---

WORDS = sorted({w for doc in DOCS for w in re.findall(r"\w+", doc.lower())})  # stopwords too


def random_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(np.array(WORDS), rng.integers(0, 12))) for _ in range(n)]


def reference_segment(texts: list[str]) -> tuple[list[int], dict[int, list[tuple[int, float]]]]:
    """Column-wise log1p counts written out with Counters: the hashes that occur and each one's (doc, log1p tf)."""
    from bertknn.index.retrieval import ngram_hashes

    columns: dict[int, list[tuple[int, float]]] = {}
    for doc, text in enumerate(texts):
        for h, c in sorted(Counter(ngram_hashes(text)).items()):
            columns.setdefault(h, []).append((doc, float(np.log1p(np.float32(c)))))
    return sorted(columns), columns


def as_columns(index: TfidfIndex) -> dict[int, list[tuple[int, float]]]:
    out: dict[int, list[tuple[int, float]]] = {}
    for seg in index.segments:
        for c, h in enumerate(seg.hashes.tolist()):
            lo, hi = seg.indptr[c], seg.indptr[c + 1]
            out.setdefault(h, []).extend(zip(seg.docs[lo:hi].tolist(), seg.logtf[lo:hi].tolist()))
    return out


def test_a_segment_holds_exactly_the_counted_features():
    texts = [*random_docs(40), "", "the of and"]  # documents without any feature too
    index = TfidfIndex.build(texts)
    hashes, columns = reference_segment(texts)
    (seg,) = index.segments
    assert seg.hashes.tolist() == hashes and index.n_docs == 42
    assert as_columns(index) == columns


@pytest.mark.parametrize(
    ("sizes", "plan"),
    [
        ([5] * 9, None),
        ([5] * 10, (0, 10)),
        ([5000, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], (1, 11)),
        ([50, 10, 10, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], (3, 13)),
        ([1, 1, 1, 12] + [10] * 9, (3, 13)),
        ([], None),
    ],
)
def test_merge_plan_picks_the_first_run_of_one_level(sizes, plan):
    from bertknn.index.merging import merge_plan

    assert merge_plan(sizes, 10) == plan


@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
def test_compact_merges_segments_into_one_that_scores_the_same(tmp_path, chunk):
    texts = random_docs(30, seed=1)
    cuts = [0, 3, 4, 9, 10, 16, 17, 22, 23, 29, 30]  # ten segments of levels 0 (<10 documents)
    for a, b in pairwise(cuts):
        TfidfIndex.build(texts[a:b], a).save(tmp_path, a)
    before = _load(tmp_path)
    forgotten = []
    listed = compact(tmp_path, listing(tmp_path), forgotten.extend, factor=10, chunk_entries=chunk)
    assert listed == [Part("tfidf_add_000000000_000000030", 0, 30)]
    after = TfidfIndex.open(tmp_path, listed)
    assert len(before.segments) == 10 and len(after.segments) == 1 and after.n_docs == 30
    assert forgotten == [f"tfidf_add_000000000_000000030/{name}" for name in TfidfIndex.files(0)]  # written anew
    assert len(list(tmp_path.glob("tfidf_add_*"))) == 10  # what it replaced stays until a commit retires it
    whole = TfidfIndex.build(texts)
    assert as_columns(after) == as_columns(whole)
    for query in ("florence", "born in lisbon", "tagus river", "spain"):
        (d1, s1), (d2, s2) = whole.scores(query), after.scores(query)
        assert d1.tolist() == d2.tolist() and len(d1)
        np.testing.assert_allclose(s1, s2, rtol=1e-6)  # float32 log-tf summed in another order (numpy, no BLAS)
        assert whole.top(query, 5) == after.top(query, 5) == before.top(query, 5)


def test_a_merge_interrupted_before_deleting_what_it_replaced_loads_the_merged_segment(tmp_path):
    from bertknn.index.tfidf_files import write_merged

    texts = random_docs(12, seed=2)
    TfidfIndex.build(texts[:5]).save(tmp_path)
    TfidfIndex.build(texts[5:], 5).save(tmp_path, 5)
    parts = _load(tmp_path)
    write_merged(parts.segments, tmp_path / "tfidf_add_000000000_000000012", 12, 1 << 22)  # renamed, not deleted
    (tmp_path / "tfidf_add_000000000_000000012.tmp").mkdir()  # and a merge that died before its rename
    loaded = _load(tmp_path)
    assert len(loaded.segments) == 1 and loaded.n_docs == 12 and loaded.sizes == [12]
    assert as_columns(loaded) == as_columns(parts)


def test_a_reader_opening_the_index_while_a_merge_commits_reads_one_consistent_list(built, monkeypatch):
    from bertknn.index import tfidf_files

    store = built.store
    with built.writer.commit() as written:
        written.writer.commit_parts(tfidf=[])
        tfidf_files.retire(written)
    built.writer.index_documents(segment_docs=2)  # committed one segment at a time: 2, 2 and 1 documents
    assert [(p.first, p.stop) for p in store.parts("tfidf")] == [(0, 2), (2, 4), (4, 5)]
    real, opened = tfidf_files.load_segment, []

    def racing(path):  # another process merges the three segments, commits and retires them as this one opens
        if not opened:
            monkeypatch.setattr(tfidf_files, "load_segment", real)  # the merging writer reads them as they are
            with open_writer(store.path) as writer:
                other = writer.store
                merged = compact(other.path, other.parts("tfidf"), lambda n: writer.rewriting(*n), factor=3)
                writer.commit_parts(tfidf=merged)
                assert tfidf_files.retire(other) == [".", "tfidf_add_000000002", "tfidf_add_000000004"]
            monkeypatch.setattr(tfidf_files, "load_segment", racing)
        opened.append(path.name)
        return real(path)

    monkeypatch.setattr(tfidf_files, "load_segment", racing)
    tfidf_files._opened.cache_clear()  # the segments opened by the writer above: this reader opens them from disk
    loaded = TfidfIndex.load(store)
    assert opened == [store.path.name, "tfidf_add_000000000_000000005"]  # the old list's first, then the new list
    assert loaded.sizes == [5] and loaded.n_docs == 5
    assert as_columns(loaded) == as_columns(TfidfIndex.build(store.documents.texts()))


def test_a_datastore_given_documents_one_add_at_a_time_keeps_few_segments_and_verifies(built):
    from bertknn.store.verify import verify

    store = built.store
    for name in store.path.glob("tfidf_*"):
        shutil.rmtree(name) if name.is_dir() else name.unlink()
    built.add_documents([{"id": f"x{i}", "title": f"X {i}", "text": f"Town {i} lies in Norway."} for i in range(7)])
    for i in range(7, 18):  # one add per document: a segment each, merged ten at a time
        built.add_documents([{"id": f"x{i}", "title": f"X {i}", "text": f"Town {i} lies in Norway."}])
    index = Writer(store).index_documents(segment_docs=1)
    assert index.n_docs == 23 and len(index.segments) < 10
    whole = TfidfIndex.build(store.documents.texts())
    assert as_columns(index) == as_columns(whole)
    report = verify(store.path)
    assert not report.problems, report.problems
