"""Evidence about another entity never answers: TF-IDF's documents are kept only where they name the question's
entity (`retrieval.names`, `TfidfIndex.about`), so a question about an entity the datastore knows nothing of is the
LM's alone, whatever other documents share its relation's words (CounterFact's locality)."""

import numpy as np

from bertknn.index.retrieval import names, select_documents


def test_the_names_of_a_question_are_its_capitalised_words_or_its_subjects():
    assert names("Michel Rocard is a native speaker of [MASK] .") == ["michel", "rocard"]
    assert names("The twin city of Seoul is [MASK] .") == ["seoul"]  # "The": a stopword
    assert names("Carl Friedrich Gauss's expertise is [MASK] .") == ["carl", "friedrich", "gauss"]
    assert names("the capital of france is [MASK] .") == []
    assert names("anything [MASK] .", subject="Danielle Darrieux") == ["danielle", "darrieux"]


def test_documents_that_do_not_name_the_entity_are_not_searched(built):
    store, index = built.store, built.index
    plays = index.ranked("plays", 3, store.documents.hidden())[0]
    assert plays == [0]  # TF-IDF alone: Ilsa Varnhold's document shares "plays" with any question
    known = select_documents(store, index, "Ilsa Varnhold plays the [MASK] .", None, 3)
    assert known.documents == [0] and known.versions == [[0]]
    unknown = select_documents(store, index, "Maren Holtby plays the [MASK] .", None, 3)
    assert unknown.documents == [] and unknown.scores == []  # no document names Holtby: nothing is about her
    # every name must be there: "Dante Varnhold" is neither Ilsa Varnhold nor Dante Alighieri
    assert select_documents(store, index, "Dante Varnhold plays the [MASK] .", None, 3).documents == []
    assert select_documents(store, index, "Dante plays the [MASK] .", None, 3).documents == [2]
    assert select_documents(store, index, "Plays [MASK] .", None, 3).documents == [0]  # a capitalised word counts


def test_a_question_about_an_unknown_entity_is_the_lms_alone(built):
    prediction = built.predict("Maren Holtby plays the [MASK] .")
    assert prediction.documents == [] and prediction.p_knn is None and len(prediction.neighbours.entries) == 0
    assert [t.token for t in prediction.bert_knn] == [t.token for t in prediction.bert]
    np.testing.assert_array_equal(prediction.p, prediction.p_bert)  # the LM's distribution, as computed: bit for bit


def test_a_mention_of_the_name_is_found_whole_and_in_any_case():
    from bertknn.query.search import in_mentions
    from bertknn.store.records import Provenance

    sentence = "The original language of The Icelandic Dream was Tamil; the icelandic dream aired as Dreamer."
    spans = [(0, 3), (29, 38), (39, 44), (49, 54), (60, 69), (70, 75), (85, 92)]
    got = in_mentions([Provenance(0, "d", "t", sentence, span) for span in spans], "The  Icelandic Dream")
    assert [sentence[a:b] for a, b in spans] == ["The", "Icelandic", "Dream", "Tamil", "icelandic", "dream", "Dreamer"]
    assert got.tolist() == [False, True, True, False, True, True, False]  # "the icelandic dream": any case


def test_the_subjects_own_name_is_not_evidence_of_its_facts(built):
    from bertknn.query.settings import DEFAULT, PAPER

    def words(settings) -> list[str]:
        (found,) = built.predict_batch(["Ilsa Varnhold was born in [MASK] ."], ["Ilsa Varnhold"], settings=settings)
        return sorted(
            p.sentence[slice(*p.span)] for p in built.store.documents.provenance(found.neighbours.entries.tolist())
        )

    # bertknn's default: the contexts of "Ilsa" and "Varnhold" in "Ilsa Varnhold was born in Lisbon." ask for the
    # name, not for a fact about her; the paper's method keeps every context of the document
    assert words(DEFAULT) == ["Lisbon", "Vienna", "born", "cello", "plays"]
    assert words(PAPER) == ["Ilsa", "Lisbon", "Varnhold", "Vienna", "born", "cello", "plays"]
