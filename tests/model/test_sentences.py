"""Sentence-level evidence: the names taken out, the sentence weights, their place in the vote, and the sentence
vectors, against values computed by hand; and a two-place document answered right with the default model."""

import json
from functools import partial

import numpy as np
import pytest
import torch

from bertknn.model.encoder import Encoder
from bertknn.model.sentences import (
    AHEAD_THREADS,
    BACKGROUND,
    DISTANCE_SHARE,
    FLOOR,
    LM_SHARE,
    LM_WORDS,
    SCORED_WORDS,
    TEXTS,
    SentenceMatch,
    log_weights,
)
from bertknn.query import sentence_weights
from bertknn.query.knn import document_vote, knn_distribution, vote
from bertknn.query.pipeline import BertKNN
from bertknn.query.settings import PAPER, Settings
from bertknn.query.words import Words, scored
from bertknn.text import clause, without_names
from tests.conftest import CountingSentences, index_keys, write_corpus
from tests.tolerances import FLOAT64_RTOL, MODEL_RTOL, assert_ranking_close


@pytest.mark.parametrize(
    ("text", "title", "expected"),
    [
        ("Holtby was born in Bergen in 1979.", "Maren Holtby", "was born in Bergen in 1979."),
        ("Maren Holtby was born in [MASK] .", "Maren Holtby", "was born in ."),
        ("Holtby's birthplace was Bergen.", "Maren Holtby", "birthplace was Bergen."),
        ("HOLTBY died in Oslo.", "Maren Holtby", "died in Oslo."),
        ("Oslofjord lies near Oslo.", "Oslo", "Oslofjord lies near ."),
        ("The Mercury (planet) is small.", "Mercury (planet)", "The is small."),
        ("Nothing to remove here.", "", "Nothing to remove here."),
        ("Annabel met Ann and Annabelle.", "Ann Annabel", "met and Annabelle."),
        ("Ann Annabel's book", "Ann Annabel", "book"),
    ],
)
def test_the_names_of_the_document_title_are_taken_out(text, title, expected):
    assert without_names(text, title) == expected


def test_sentence_log_weights_are_scores_over_the_temperature_and_the_lowest_elsewhere():
    sim = np.array([0.5, 0.2, 0.9, 0.0])
    embedded = np.array([True, True, False, False])
    np.testing.assert_allclose(log_weights(sim, embedded, 0.1), [5.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(log_weights(sim, np.zeros(4, bool), 0.1), [0.0] * 4)
    floored = log_weights(np.array([1.5, 0.2, np.nan, 0.9, -3.0]), np.array([True, True, True, True, False]), 0.1, 1.0)
    np.testing.assert_allclose(floored, [15.0, 10.0, 10.0, 10.0, 10.0])  # raised to 1; NaN and not embedded: lowest


def test_a_neighbour_scored_above_the_floor_has_its_key_distance_count_less():
    sim = np.array([0.9, 0.5, 0.8, np.nan, 0.3])
    embedded = np.array([True, True, True, True, False])
    d = np.array([4.0, 2.0, 10.0, 1.0, 0.0])
    got = log_weights(sim, embedded, 0.1, 0.6, (d, 2.0, 0.5))
    np.testing.assert_allclose(got, [9.0 + 1.0, 6.0, 8.0 + 2.5, 6.0, 6.0])  # + (1 - 0.5) (d - 0) / 2 where above 0.6
    in_full = log_weights(sim, embedded, 0.1, 0.6, (d, 2.0, 1.0))
    np.testing.assert_allclose(in_full, log_weights(sim, embedded, 0.1, 0.6))
    vote = knn_distribution(np.arange(5), d, 2.0, 5, got)  # the vote then weighs those by exp(-0.5 d / 2 + s / T_s)
    expected = np.exp([-0.5 * 4 / 2 + 9, -2 / 2 + 6, -0.5 * 10 / 2 + 8, -1 / 2 + 6, -0 / 2 + 6])
    np.testing.assert_allclose(vote, expected / expected.sum(), rtol=FLOAT64_RTOL)


def test_the_sentence_weights_multiply_each_neighbour_within_its_document():
    values = np.array([3, 4, 3, 5, 4])
    dist = np.array([1.0, 2.0, 4.0, 0.5, 3.0])
    groups = np.array([0, 0, 0, 1, 1])
    prior = np.array([0.7, 0.3])
    extra = np.array([0.0, 1.0, -1.0, 2.0, 0.0])
    got = document_vote(values, dist, groups, prior, 2.0, 6, extra)
    w = np.exp(-dist / 2.0 + extra)
    expected = np.zeros(6)
    for d, p_d in enumerate(prior):
        mine = groups == d
        for v, wi in zip(values[mine], w[mine] / w[mine].sum()):
            expected[v] += p_d * wi
    np.testing.assert_allclose(got, expected, rtol=FLOAT64_RTOL)
    flat = knn_distribution(values, dist, 2.0, 6, extra)
    np.testing.assert_allclose(flat, np.bincount(values, w / w.sum(), minlength=6), rtol=FLOAT64_RTOL)
    np.testing.assert_allclose(
        knn_distribution(values, dist, 2.0, 6, np.zeros(5)), knn_distribution(values, dist, 2.0, 6)
    )


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_sentence_vectors_are_the_mean_of_the_last_states(tiny_model_dir, backend):
    encoder = Encoder.load(str(tiny_model_dir), runtime=backend)
    texts = ["Holtby was born in Bergen.", "She died in Oslo many years later, in the winter of 1990.", "Oslo."]
    got = encoder.sentence_vectors(texts)
    np.testing.assert_allclose(encoder.sentence_vectors(texts, token_budget=8), got, atol=1e-5)  # a text a batch
    np.testing.assert_allclose(encoder.sentence_vectors(texts, threads=1), got, atol=1e-6)
    if backend == "onnx":  # a session of its own on one thread, beside the runtime's
        sessions = {
            name: r.session().get_session_options().intra_op_num_threads for name, r in encoder.graphs().items()
        }
        assert sessions["mean_states-t1"] == 1 and "mean_states" in sessions
    for text, vector in zip(texts, got):
        ids = torch.tensor([encoder.tokenizer(text)["input_ids"]])
        with torch.no_grad():
            mean = encoder.base(input_ids=ids).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(vector, (mean / mean.norm()).numpy(), atol=1e-4)


def _span(sentence: str, word: str) -> tuple[int, int]:
    start = sentence.rindex(word)
    return start, start + len(word)


@pytest.mark.parametrize(
    ("sentence", "word", "title", "expected"),
    [
        ("Holtby came into the world in Bergen in 1979.", "1979", "Maren Holtby", " in something"),
        ("Holtby came into the world in Bergen in 1979.", "Bergen", "Maren Holtby",
         "Holtby came into the world in something"),
        ("She studied in Zurich and later worked in Madrid.", "Madrid", "Ada Quen", " and later worked in something"),
        ("She studied in Zurich and later worked in Madrid.", "Zurich", "Ada Quen", "She studied in something"),
        ("As a student, Holtby spent years at the academy of Zurich.", "Zurich", "Maren Holtby",
         "As a student, Holtby spent years at the academy of something"),
        ("Bergen was where she grew up in 1990.", "1990", "Ada Quen", "Bergen was where she grew up in something"),
        ("In 1902 the firm moved to Oslo.", "Oslo", "Brakvel Works", " the firm moved to something"),
        ("Oslo.", "Oslo", "", "something"),
    ],
)  # fmt: skip
def test_a_clause_runs_from_the_previous_name_or_number_to_the_target(sentence, word, title, expected):
    assert clause(sentence, _span(sentence, word), title) == expected


def test_a_full_cache_is_emptied_after_its_vectors_are_read(encoder):
    counting = CountingSentences(encoder)
    match = SentenceMatch(encoder=counting, cache=3)
    texts = ["died in Oslo.", "was born in Bergen.", "studied in Zurich.", "worked in Madrid."]
    expected = dict(zip(texts, encoder.sentence_vectors(texts)))
    match.vectors(texts[:2])
    got = match.vectors(texts[:1] + texts[2:])  # one cached, two new: over 3, so the cache is emptied
    assert list(got) == texts[:1] + texts[2:]
    for text, vector in got.items():
        np.testing.assert_allclose(vector, expected[text], atol=1e-6)
    assert counting.calls[1] == texts[2:]  # the cached one was not embedded again
    assert sorted(match._vectors) == sorted(texts[2:])  # only the new ones kept
    assert list(match.vectors(texts)) == texts


def test_a_neighbour_is_read_as_four_texts_without_its_documents_names():
    born = "Holtby came into the world in Bergen in 1979."
    (got,) = SentenceMatch.texts([("Maren Holtby was born in [MASK] .", born, _span(born, "1979"), "Maren Holtby")])
    assert dict(zip(TEXTS, got, strict=True)) == {
        "question": "was born in something .",
        "word": "1979",
        "sentence": "came into the world in Bergen in 1979.",
        "clause": "in something",
    }


def test_a_question_reads_one_text_whatever_its_documents():
    """The names of all the question's documents leave the question, each document's own its evidence: the question
    is one text for all its neighbours, and the same for another subject asked alike."""
    holtby, quen = "Holtby died in Oslo.", "Ada Quen died in Vienna."
    mine = [
        ("Maren Holtby died in [MASK] .", holtby, _span(holtby, "Oslo"), "Maren Holtby"),
        ("Maren Holtby died in [MASK] .", quen, _span(quen, "Vienna"), "Ada Quen"),
    ]
    assert SentenceMatch.texts(mine) == [
        ("died in something .", "Oslo", "died in Oslo.", "died in something"),
        ("died in something .", "Vienna", "died in Vienna.", "died in something"),
    ]
    other = [("Ada Quen died in [MASK] .", quen, _span(quen, "Vienna"), "Ada Quen")]
    assert SentenceMatch.texts(other)[0][0] == "died in something ."


def test_a_questions_text_is_embedded_ahead_on_its_own_thread_once(encoder):
    counting = CountingSentences(encoder)
    match = SentenceMatch(encoder=counting)
    text = SentenceMatch.question_text("Maren Holtby's sister was born in [MASK] .", ["Maren Holtby", "Bergen"])
    assert text == "sister was born in something ."
    match.embed_ahead([text, text])
    other = "died in something ."
    got = match.vectors([other, text])  # the other text embedded here, the question's waited for
    assert list(got) == [other, text] and not match._ahead
    embedded = sorted(zip(counting.calls, counting.options), key=str)
    assert embedded == sorted([([text], {"threads": AHEAD_THREADS}), ([other], {})], key=str)
    np.testing.assert_allclose(got[text], encoder.sentence_vectors([text])[0], atol=1e-6)
    match.embed_ahead([text])  # cached: nothing to embed
    assert not match._ahead and len(counting.calls) == 2


def test_scores_sum_three_views_less_the_background_and_reuse_cached_vectors(encoder):
    counting = CountingSentences(encoder)
    match = SentenceMatch(encoder=counting, cache=10)
    born = "Holtby came into the world in Bergen in 1979."
    asked = [
        [
            ("Maren Holtby was born in [MASK] .", born, _span(born, "Bergen"), "Maren Holtby"),
            ("Maren Holtby was born in [MASK] .", born, _span(born, "1979"), "Maren Holtby"),
        ],
        [("Ada Quen died in [MASK] .", "Quen died in Vienna.", (13, 19), "Ada Quen")],
    ]
    got = match.scores(asked)
    texts = [
        "was born in something .", "Bergen", "came into the world in Bergen in 1979.",
        "came into the world in something", "1979", "in something",
        "died in something .", "Vienna", "died in Vienna.", "died in something",
    ]  # fmt: skip
    v = dict(zip(texts, encoder.sentence_vectors(texts)))
    b = encoder.sentence_vectors(BACKGROUND).mean(0)
    sentence = v["came into the world in Bergen in 1979."]

    def claim(question, word):  # the claim's vector: the unit vector along the question's and the word's
        return (v[question] + v[word]) / np.linalg.norm(v[question] + v[word])

    def score(question, word, sentence, part):
        return (v[question] + claim(question, word) - 2 * b) @ sentence + (v[question] - b) @ v[part]

    expected = [
        score("was born in something .", "Bergen", sentence, "came into the world in something"),
        score("was born in something .", "1979", sentence, "in something"),
    ]
    np.testing.assert_allclose(got[0], expected, rtol=MODEL_RTOL)  # vectors embedded in other batches
    expected = score("died in something .", "Vienna", v["died in Vienna."], "died in something")
    np.testing.assert_allclose(got[1], [expected], rtol=MODEL_RTOL)
    assert sorted(counting.calls[0]) == sorted(texts)
    assert counting.calls[1] == list(BACKGROUND)  # once, then kept
    assert len(match._vectors) == 10
    match.scores(asked[1:])
    assert len(counting.calls) == 2  # all cached
    (died,) = match.views(asked[1:])[0]  # the three views apart, each less the background
    question = v["died in something ."]
    expected = [(q - b) @ v["died in Vienna."] for q in (question, claim("died in something .", "Vienna"))]
    np.testing.assert_allclose(died, [*expected, (question - b) @ v["died in something"]], rtol=MODEL_RTOL)


def test_the_sentence_encoder_tells_which_place_a_question_asks_for():
    """all-MiniLM-L6-v2 through `scores`: of one document's places, each question's own scores highest, though
    the evidence is phrased unlike the question and the year of the same sentence is a candidate too."""
    match = SentenceMatch("torch")
    title = "Maren Holtby"
    born, died = "Holtby came into the world in Bergen in 1979.", "She spent her last days in Oslo."
    studied = "As a student, Holtby spent four years at the academy of Zurich."
    places = [(born, _span(born, "Bergen")), (born, _span(born, "1979")), (died, _span(died, "Oslo"))]
    places.append((studied, _span(studied, "Zurich")))
    for question, right in [
        ("Maren Holtby was born in [MASK] .", 0),
        ("Maren Holtby died in [MASK] .", 2),
        ("Maren Holtby studied in [MASK] .", 3),
    ]:
        (scores,) = match.scores([[(question, s, span, title) for s, span in places]])
        assert int(np.argmax(scores)) == right, (question, scores)


def test_the_vote_weighs_the_sentences_of_the_best_words_only(tmp_path, encoder):
    docs = [
        {
            "id": "a",
            "title": "Maren Holtby",
            "text": "Holtby was born in Bergen. Holtby died in Oslo. She sang songs of Lyon, Porto, Riga, Ghent, "
            "Vienna and Madrid with friends.",  # more words than the weights score (SCORED_WORDS)
        },
        {"id": "b", "title": "Ada Quen", "text": "Quen lived in Vienna. Quen wrote books about Lyon."},
    ]
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", docs), tmp_path / "s", encoder)
    s = Settings(sentence_temperature=0.05)
    question = "Maren Holtby was born in [MASK] ."
    (query,) = knn.preprocess([question], ["Maren Holtby"])
    (p_lm,), (state,) = encoder.query_ids([(query.ids, query.mask)])
    found = knn.search("ir").search(question, "Maren Holtby", state, s)
    words = knn.words(found)
    plain = vote(knn.store, found, s, words)
    weigh = partial(sentence_weights.weights, knn.store, knn.sentence_match)  # the sentence weights of this store
    rows = knn.store.documents.provenance(found.entries.tolist())
    sims = np.array([knn.sentence_match.scores([[(question, r.sentence, r.span, r.title)]])[0][0] for r in rows])
    assert np.isnan(sims[[r.sentence[slice(*r.span)].lower() == "born" for r in rows]]).all()  # a word it asks with

    def expected(chosen):
        scored = chosen & np.isfinite(sims)
        lifted = np.maximum(sims, FLOOR)
        nearer = (1 - DISTANCE_SHARE) * (found.distances - found.distances.min()) / s.temperature
        return np.where(scored, lifted, lifted[scored].min()) / 0.05 + np.where(scored & (sims > FLOOR), nearer, 0.0)

    assert len(np.unique(found.values)) > SCORED_WORDS  # some words' evidence is not scored
    assert (sims < FLOOR).any() and (sims > FLOOR).any()  # the floor raises some scores and leaves others
    by_vote = np.isin(words.index(found.values), words.best(plain, SCORED_WORDS))
    (weights,) = weigh([question], [found], [words], [plain], s)
    np.testing.assert_allclose(weights, expected(by_vote), rtol=MODEL_RTOL)  # float32 sentence vectors
    by_lm = np.isin(words.index(found.values), words.best(np.where(plain > 0, words.lm(p_lm), 0), LM_WORDS))
    assert (by_lm & ~by_vote).any()
    (with_lm,) = weigh([question], [found], [words], [plain], s, [p_lm])
    at = words.index(found.values)
    one_token = at < words.vocab  # the LM has not scored a word of several tokens ("holtby") yet: left out
    assert (by_vote & ~one_token).any()
    np.testing.assert_allclose(with_lm, expected((by_vote | by_lm) & one_token), rtol=MODEL_RTOL)
    # an LM sure of one word: the neighbours of the words it gives under LM_SHARE of its probability drop out, but
    # for the vote's best word (VOTE_WORDS): the LM's doubt alone does not demote the vote's own choice
    (first,) = words.best(plain, 1)
    below = at[by_vote & (at < words.vocab) & (at != first)][0]  # one of the vote's best words, not its first
    top, above = [w for w in np.unique(at[at < words.vocab]) if w not in (below, first)][:2]
    sure = np.full(words.vocab, 1e-9)
    sure[[top, above, below]] = 1.0, 1.1 * LM_SHARE, 0.9 * LM_SHARE
    assert first >= words.vocab  # "holtby" here (several tokens, unscored by the LM): kept, scored NaN (the question's)
    (by_sure,) = sentence_weights.weights(
        knn.store, knn.sentence_match, [question], [found], [words], [plain], s, [sure / sure.sum()]
    )
    np.testing.assert_allclose(by_sure, expected(np.isin(at, [top, above, first])), rtol=MODEL_RTOL)
    assert (by_vote & (at == below)).any()  # one of the vote's words, left out
    # predict scores the vote's words of several tokens first (the LM's choice needs their scores)
    several = words.candidates(plain, 2)
    rated = scored([words], [several], [p_lm])[0]
    assert several and rated.scores[several].all()
    (weights,) = weigh([question], [found], [rated], [plain], s, [p_lm])
    weighted = vote(knn.store, found, s, rated, weights)
    assert not np.allclose(weighted, plain)
    p = knn.predict(question, "Maren Holtby", settings=s, top_k=3)
    np.testing.assert_allclose(p.p_knn, weighted, rtol=MODEL_RTOL)  # through predict: vectors maybe batched otherwise
    p_knn, _ = knn.distributions(p.p_bert[: words.vocab], found, s, rated, question=question)
    np.testing.assert_allclose(p_knn, weighted, rtol=MODEL_RTOL)
    np.testing.assert_allclose(
        knn.predict(question, "Maren Holtby", settings=s.replace(sentence_temperature=0)).p_knn, plain
    )


def test_predict_embeds_the_questions_text_beside_the_lms_pass_where_its_documents_are_known(
    tmp_path, encoder, monkeypatch
):
    """The document search knows a question's documents before the LM's pass: its text (their names out) is
    embedded meanwhile, on its own thread, and not again with the evidence; the answers are those made without it.
    FAISS finds the documents from the state: the text comes with the evidence."""

    docs = [
        {"id": "a", "title": "Maren Holtby", "text": "Holtby was born in Bergen. Holtby died in Oslo."},
        {"id": "b", "title": "Ada Quen", "text": "Quen lived in Vienna. Quen was born in Lyon."},
        {"id": "c", "title": "Lyon", "text": "Lyon is a city in France. It lies on the Rhone."},
    ]
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", docs), tmp_path / "s", encoder)
    index_keys(knn.store, "Flat")
    knn.refresh()
    counting = CountingSentences(knn.sentence_match.encoder)
    knn.sentence_match._encoder = counting
    question, text, s = (
        "Maren Holtby was born in [MASK] .",
        "was born in something .",
        Settings(sentence_temperature=0.05, entity_filter=False),  # TF-IDF's documents, though none names Holtby
    )
    ahead = knn.predict(question, settings=s, top_k=3)
    calls = list(zip(counting.calls, counting.options))  # the worker's and this thread's, in either order
    assert [texts for texts, options in calls if options == {"threads": AHEAD_THREADS}] == [[text]]
    assert not any(text in texts for texts, options in calls if options != {"threads": AHEAD_THREADS})
    knn.sentence_match.clear()
    with monkeypatch.context() as patch:
        patch.setattr(knn, "_question_texts_ahead", lambda *args: None)
        after = knn.predict(question, settings=s, top_k=3)
    # the question's text embedded on a session of one thread, or with the evidence: the model's tolerance
    assert_ranking_close(*[[(w.token, w.probability) for w in p.bert_knn] for p in (after, ahead)])
    np.testing.assert_allclose(after.p_knn, ahead.p_knn, rtol=MODEL_RTOL, atol=1e-9)
    knn.sentence_match.clear()
    counting.calls.clear()
    counting.options.clear()
    knn.predict(question, settings=s.replace(retrieval="faiss"), top_k=3)
    assert text in counting.calls[0] and counting.options[0] == {}


def test_the_lm_chooses_the_words_whose_evidence_is_scored_a_word_of_several_tokens_with_its_bonus():
    from types import SimpleNamespace

    from bertknn.query.sentence_weights import _by_lm

    # a vocabulary of 5 tokens and two words of several tokens (lexicon numbers 7 and 9): "port elsmere", "holtby"
    words = Words(5, np.array([7, 9]), ((1, 2), (3, 4)), ("port elsmere", "holtby"), np.array([0.001, 0.001]))
    p_vocab = np.array([0.5, 0.3, 0.0035, 0.002, 0.1945])  # the LM's best word: 0 (token 3 under 0.005 of it)
    found = SimpleNamespace(values=np.array([0, 1, 2, 3, 7, 9, 1]))  # the neighbours' words
    vote = np.array([0.3, 0.2, 0.1, 0.1, 0.0, 0.2, 0.1])  # token 4 held by no neighbour
    chosen = np.array([True, True, True, True, True, True, False])
    prior = words.prior(10.0, "Maren Holtby was born in [MASK] .")  # no bonus for the name the question holds
    lm = words.lm(p_vocab)
    assert lm[6] / lm[0] < LM_SHARE < 10 * lm[6] / lm[0] and lm[3] / lm[0] < LM_SHARE < lm[2] / lm[0]
    assert _by_lm(chosen, found, words, vote, p_vocab, prior).tolist() == [True, True, True, False, True, False, True]
    assert _by_lm(chosen, found, words, vote, p_vocab, None).tolist() == [True, True, True, False, False, False, True]
    doubted = np.array([0.1, 0.1, 0.1, 0.4, 0.0, 0.2, 0.1])  # the vote's best word: token 3, under 0.005 of the LM's
    assert _by_lm(chosen, found, words, doubted, p_vocab, None).tolist() == [True, True, True, True, False, False, True]


def test_the_paper_and_bad_values_of_the_sentence_temperature():
    assert PAPER.sentence_temperature == 0
    with pytest.raises(ValueError, match="sentence_temperature must be a number >= 0"):
        Settings(sentence_temperature=-1)
    with pytest.raises(ValueError, match="sentence_temperature must be a number >= 0"):
        Settings(sentence_temperature=float("nan"))
    assert Settings(sentence_temperature=0.5).file_tag().endswith("-st0.5-ct1.25-f0.4-named-linked")
    assert Settings().file_tag().endswith("-st0.015-ct1.25-f0.4-named-linked")  # on by default
    assert "-st" not in Settings(sentence_temperature=0).file_tag()
    with pytest.raises(TypeError, match="unknown hyperparameter"):  # the floor is part of the method, not a setting
        Settings().replace(sentence_floor=0.5)


def test_a_document_with_two_places_answers_both_questions(tmp_path):
    """The default model: born in one city, died in another, each question gets its own city, with the subject
    and without it, with the sentence weights and without them (then the other city comes a close second)."""
    from bertknn.demo import DEMO_CORPUS

    docs = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()[:6]]
    docs.append(
        {
            "id": "holtby",
            "title": "Maren Holtby",
            "text": "Maren Holtby is an invented architect. Holtby was born in Bergen. She studied in Zurich and later "
            "worked in Madrid. Holtby died in Oslo.",
        }
    )
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", docs), tmp_path / "s")
    for subject in ("Maren Holtby", None):
        for weights in (0.0, 0.015):  # bertknn's default, and the sentence weights
            born = knn.predict("Maren Holtby was born in [MASK] .", subject, top_k=3, sentence_temperature=weights)
            died = knn.predict("Maren Holtby died in [MASK] .", subject, top_k=3, sentence_temperature=weights)
            assert (born.bert_knn[0].token, died.bert_knn[0].token) == ("bergen", "oslo")
            p_born = {t.token: t.probability for t in born.bert_knn}
            if weights:  # the sentence that says "born" outweighs the one that says "died"
                assert "oslo" not in p_born
            else:  # the keys alone: the death place a close second
                assert p_born["oslo"] > p_born["bergen"] / 2


def test_the_issues_document_answers_each_of_its_places_with_the_sentence_weights(tmp_path):
    """The default model on a document with four places, a year in the birth sentence and two facts in one sentence:
    without the sentence weights (`--no-sentence-weights`) "born in" is answered with the place of death (the year
    second); bertknn's defaults, the weights read from the evidence vectors the build stored, answer every question
    with its own place."""
    from bertknn.demo import DEMO_CORPUS

    docs = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()[:6]]
    text = (
        "Maren Holtby is an invented architect. Holtby was born in Bergen in 1979. She studied in Zurich and later "
        "worked in Madrid. Holtby died in Oslo."
    )
    knn = BertKNN.build(
        write_corpus(tmp_path / "c.jsonl", [*docs, {"id": "y1", "title": "Maren Holtby", "text": text}]), tmp_path / "s"
    )
    asked = {"was born in": "bergen", "studied in": "zurich", "worked in": "madrid", "died in": "oslo"}
    questions = [f"Maren Holtby {relation} [MASK] ." for relation in asked]
    plain = knn.predict_batch(questions, ["Maren Holtby"] * 4, top_k=2, evidence=0, sentence_temperature=0)
    assert [w.token for w in plain[0].bert_knn] == ["oslo", "1979"]
    assert knn.store.evidence.model  # a store built now holds its evidence vectors
    for subject in ("Maren Holtby", None):
        weighed = knn.predict_batch(questions, [subject] * 4, top_k=1, evidence=0)
        assert [p.bert_knn[0].token for p in weighed] == list(asked.values())


def test_the_sentence_encoder_gives_all_minilm_l6_v2s_sentence_embeddings():
    """The shipped model without the default masked LM's adapters, mean pooled: sentence-transformers' recipe."""
    from transformers import AutoModel, AutoTokenizer

    from bertknn.model.default_model import base_model_dir

    texts = ["was born in .", "Holtby came into the world in Bergen in 1979.", "died in Oslo."]
    tokenizer, model = AutoTokenizer.from_pretrained(base_model_dir()), AutoModel.from_pretrained(base_model_dir())
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((states * weights).sum(1) / weights.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(SentenceMatch("torch").encoder.sentence_vectors(texts), expected, atol=1e-5)
