"""Documents about one subject (an article and its updates): the title shortcut reads every one, newest first, and
where they disagree the newest one's fact wins while both are in the evidence (SPEC §2, `knn.version_weights`)."""

import math

import numpy as np
import pytest

from bertknn.query.settings import NEWER, Settings
from bertknn.text import CorpusError, iso_date, parse_document

QUESTION = "Ilsa Varnhold was born in [MASK] ."
# the kNN alone, uncalibrated: the vote is the answer, so its ratios can be read off `p`
# the kNN's vote by the keys alone (the sentence weights: test_sentences), as combined
KNN_ONLY = Settings(lam=1.0, confidence_temperature=1.0, lm_floor=0.0, sentence_temperature=0.0)


def _p(reader, prediction, word: str) -> float:
    """The answer's probability of a word of one token: `p` is indexed by vocabulary id there."""
    return float(prediction.p[reader.encoder.tokenizer.convert_tokens_to_ids(word)])


def test_dates_are_iso_8601_and_compare_as_strings():
    assert iso_date("2024-05-01") == "2024-05-01"
    assert iso_date("2024-05-01T09:30:00+02:00") == "2024-05-01T07:30:00"  # in UTC
    assert iso_date(" 2024-05-01T09:30Z ") == "2024-05-01T09:30:00"
    doc = parse_document({"id": "a", "title": "A", "text": "Some text.", "date": "2020-02-29"}, "here")
    assert doc.date == "2020-02-29"
    assert parse_document({"id": "a", "title": "A", "text": "Some text."}, "here").date is None
    with pytest.raises(CorpusError, match=r"here: 'date' '1 May 2024' is not an ISO 8601 date"):
        parse_document({"id": "a", "title": "A", "text": "x", "date": "1 May 2024"}, "here")
    with pytest.raises(CorpusError, match=r"here: 'date' must be an ISO 8601 date string .* not int"):
        parse_document({"id": "a", "title": "A", "text": "x", "date": 2024}, "here")


def test_the_title_shortcut_reads_every_document_of_the_subject_newest_first(built):
    assert built.store.documents.find_titles("ilsa varnhold") == [(0, None)]  # a corpus without dates
    built.add_documents([{"id": "u1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Porto."}])
    built.add_documents([{"id": "u0", "title": "Ilsa  varnhold", "text": "She sang.", "date": "1990-01-01"}])
    built.add_documents([{"id": "u2", "title": "Ilsa Varnhold", "text": "She sings."}])
    built.add_documents([{"id": "u3", "title": "Ilsa Varnhold", "text": "She sang in Oslo.", "date": "1980-05-01"}])
    titled = built.store.documents.find_titles("ilsa varnhold")
    # dated first, by date; an undated one as new as the newest date before it (u2: 1990, after u0); then the others
    # by the order they were added
    assert titled == [(7, "1990-01-01"), (6, "1990-01-01"), (8, "1980-05-01"), (5, None), (0, None)]
    found = built.search("ir").search(QUESTION, "Ilsa Varnhold", built.encoder.query([QUESTION])[1][0], KNN_ONLY)
    assert found.versions == [[7, 6, 8, 5, 0]] and found.documents == [7, 6, 8, 5, 0]
    assert set(built.store.documents.of(found.entries).tolist()) == {0, 5, 6, 7, 8}
    built.remove_documents(["u1", "u2"])
    assert [d for d, _ in built.store.documents.find_titles("ilsa varnhold")] == [6, 8, 0]
    assert built.store.documents.find_titles("nobody") == []


def test_a_newer_documents_fact_wins_and_both_are_in_the_evidence(built):
    built.add_documents([{"id": "u1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Porto."}])
    newest = built.predict(QUESTION, subject="Ilsa Varnhold", settings=KNN_ONLY)
    alike = built.predict(QUESTION, subject="Ilsa Varnhold", settings=KNN_ONLY.replace(conflicts="vote"))
    assert newest.bert_knn[0].token == "porto"
    # both sentences are the question's own context with another word, so both keys lie at the question's state up to
    # the float16 keys' rounding (a distance of at most ~1e-3 against the temperature 6: a ratio off by < 1e-3)
    ratio = _p(built, newest, "porto") / _p(built, newest, "lisbon")
    assert ratio == pytest.approx(math.exp(NEWER), rel=1e-3)
    assert _p(built, alike, "porto") / _p(built, alike, "lisbon") == pytest.approx(1.0, rel=1e-3)
    (now,) = [n for n in newest.evidence["porto"] if n.doc_id == "u1"]
    (before,) = newest.superseded  # what the older document said, shown beside the answer: the fact changed
    assert (before.token, before.doc_id, before.sentence) == ("lisbon", "d1", "Ilsa Varnhold was born in Lisbon.")
    assert now.date is before.date is None  # neither was given a date: the later added is the newer
    assert alike.superseded == [] and newest.to_dict()["superseded"][0]["doc_id"] == "d1"


def test_an_older_dated_document_loses_and_a_subject_of_one_document_votes_as_before(built):
    built.add_documents(
        [{"id": "u0", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Porto.", "date": "2000-01-01"}]
    )
    built.add_documents(  # added later, dated earlier: older
        [{"id": "u1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Madrid.", "date": "1990-01-01"}]
    )
    p = built.predict(QUESTION, subject="Ilsa Varnhold", settings=KNN_ONLY)
    assert p.neighbours.versions == [[5, 6, 0]]  # the undated corpus: older than any date given after it
    assert _p(built, p, "porto") / _p(built, p, "madrid") == pytest.approx(math.exp(NEWER), rel=1e-3)  # as above
    assert [(n.token, n.date) for n in p.superseded] == [("madrid", "1990-01-01"), ("lisbon", None)]
    # a subject with one document: the vote is the one it was (the paper's), version weights never enter
    single = built.predict("Dante was born in [MASK] .", subject="Dante Alighieri", settings=KNN_ONLY)
    alike = built.predict(
        "Dante was born in [MASK] .", subject="Dante Alighieri", settings=KNN_ONLY.replace(conflicts="vote")
    )
    np.testing.assert_array_equal(single.p, alike.p)  # the same computation: bit-identical


def test_without_a_subject_the_versions_tf_idf_finds_vote_as_one_article(built):
    built.add_documents([{"id": "u1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Porto."}])
    newest = built.predict(QUESTION, settings=KNN_ONLY)  # no subject: TF-IDF finds both documents by their names
    found = newest.neighbours
    assert sorted(found.documents) == [0, 5] and found.versions == [[5, 0]]
    assert newest.bert_knn[0].token == "porto" and [n.token for n in newest.superseded] == ["lisbon"]
    alike = built.predict(QUESTION, settings=KNN_ONLY.replace(conflicts="vote"))
    assert alike.superseded == []
    # as with the subject: both keys at the question's state up to float16 rounding (see above)
    assert _p(built, newest, "porto") / _p(built, newest, "lisbon") == pytest.approx(math.exp(NEWER), rel=1e-3)
    assert _p(built, alike, "porto") / _p(built, alike, "lisbon") == pytest.approx(1.0, rel=1e-3)
