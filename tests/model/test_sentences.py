"""Sentence-level evidence: the names taken out, the sentence weights, their place in the vote, and the sentence
vectors, against values computed by hand; and a two-place document answered right with the default model."""

import json

import numpy as np
import pytest
import torch

from bertknn.model.encoder import Encoder
from bertknn.model.sentences import SentenceMatch, log_weights, without_names
from bertknn.query.knn import document_vote, knn_distribution
from bertknn.query.pipeline import BertKNN
from bertknn.query.settings import PAPER, SENTENCE_WORDS, Settings
from tests.conftest import write_corpus


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
    ],
)
def test_the_names_of_the_document_title_are_taken_out(text, title, expected):
    assert without_names(text, title) == expected


def test_sentence_log_weights_are_cosines_over_the_temperature_and_the_floor_elsewhere():
    sim = np.array([0.5, 0.2, 0.9, 0.0])
    embedded = np.array([True, True, False, False])
    np.testing.assert_allclose(log_weights(sim, embedded, 0.1), [5.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(log_weights(sim, np.zeros(4, bool), 0.1), [0.0] * 4)


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
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    flat = knn_distribution(values, dist, 2.0, 6, extra)
    np.testing.assert_allclose(flat, np.bincount(values, w / w.sum(), minlength=6), rtol=1e-12)
    np.testing.assert_allclose(
        knn_distribution(values, dist, 2.0, 6, np.zeros(5)), knn_distribution(values, dist, 2.0, 6)
    )


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_sentence_vectors_are_the_mean_of_the_last_states(tiny_model_dir, backend):
    encoder = Encoder.load(str(tiny_model_dir), runtime=backend)
    texts = ["Holtby was born in Bergen.", "She died in Oslo many years later, in the winter of 1990.", "Oslo."]
    got = encoder.sentence_vectors(texts)
    for text, vector in zip(texts, got):
        ids = torch.tensor([encoder.tokenizer(text)["input_ids"]])
        with torch.no_grad():
            mean = encoder.base(input_ids=ids).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(vector, (mean / mean.norm()).numpy(), atol=1e-4)


class _Counting:
    def __init__(self, encoder):
        self.encoder, self.calls = encoder, []

    def sentence_vectors(self, texts):
        self.calls.append(list(texts))
        return self.encoder.sentence_vectors(texts)


def test_similarities_compare_the_texts_without_names_and_reuse_cached_vectors(encoder):
    counting = _Counting(encoder)
    match = SentenceMatch(encoder=counting, cache=4)
    pairs = [
        [("Maren Holtby was born in [MASK] .", "Holtby was born in Bergen.", "Maren Holtby")],
        [
            ("Ada Quen died in [MASK] .", "Quen died in Vienna.", "Ada Quen"),
            ("Ada Quen died in [MASK] .", "x", "Other"),
        ],
    ]
    got = match.similarities(pairs)
    texts = ["was born in .", "was born in Bergen.", "died in .", "died in Vienna.", "Ada Quen died in .", "x"]
    vec = dict(zip(texts, encoder.sentence_vectors(texts)))
    np.testing.assert_allclose(got[0], [vec["was born in ."] @ vec["was born in Bergen."]], rtol=1e-5)
    np.testing.assert_allclose(
        got[1], [vec["died in ."] @ vec["died in Vienna."], vec["Ada Quen died in ."] @ vec["x"]], rtol=1e-5
    )
    assert sorted(counting.calls[0]) == sorted(texts)
    assert len(match._vectors) == 4  # at most `cache`: emptied, then the first 4 new ones kept
    match.similarities(pairs[:1])
    assert len(counting.calls) == 1  # both cached
    np.testing.assert_allclose(match.similarities([pairs[1][1:]])[0], got[1][1:], rtol=1e-6)
    assert counting.calls[1:] == [["Ada Quen died in .", "x"]]


def test_the_vote_weighs_the_sentences_of_the_best_words_only(tmp_path, encoder):
    docs = [
        {"id": "a", "title": "Maren Holtby", "text": "Holtby was born in Bergen. Holtby died in Oslo. She sang."},
        {"id": "b", "title": "Ada Quen", "text": "Quen lived in Vienna. Quen wrote books about Lyon."},
    ]
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", docs), tmp_path / "s", encoder)
    s = Settings(sentence_temperature=0.05)
    question = "Maren Holtby was born in [MASK] ."
    (query,) = knn.preprocess([question], ["Maren Holtby"])
    _, (state,) = encoder.query_ids([(query.ids, query.mask)])
    found = knn.search("ir").search(question, "Maren Holtby", state, s)
    words = knn.words(found)
    plain = knn.vote(found, s, words)
    (weights,) = knn.sentence_weights([question], [found], [words], [plain], s)
    chosen = np.isin(words.index(found.values), words.best(plain, SENTENCE_WORDS))
    rows = knn.store.provenance(found.entries.tolist())
    sims = np.array([knn.sentence_match.similarities([[(question, r.sentence, r.title)]])[0][0] for r in rows])
    floor = sims[chosen].min()
    np.testing.assert_allclose(weights, np.where(chosen, sims, floor) / 0.05, rtol=1e-5)
    weighted = knn.vote(found, s, words, weights)
    assert not np.allclose(weighted, plain)
    p = knn.predict(question, "Maren Holtby", settings=s, top_k=3)
    np.testing.assert_allclose(p.p_knn, weighted, rtol=1e-6)
    p_knn, _ = knn.distributions(p.p_bert[: words.vocab], found, s, words, question=question)
    np.testing.assert_allclose(p_knn, weighted, rtol=1e-6)
    np.testing.assert_allclose(
        knn.predict(question, "Maren Holtby", settings=s.replace(sentence_temperature=0)).p_knn, plain
    )


def test_the_paper_and_bad_values_of_the_sentence_temperature():
    assert PAPER.sentence_temperature == 0
    with pytest.raises(ValueError, match="sentence_temperature must be a number >= 0"):
        Settings(sentence_temperature=-1)
    with pytest.raises(ValueError, match="sentence_temperature must be a number >= 0"):
        Settings(sentence_temperature=float("nan"))
    assert Settings(sentence_temperature=0.5).file_tag().endswith("-st0.5-ct1.25-f0.4")


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
        for weights in (0.0, 0.01):  # bertknn's default, and the sentence weights
            born = knn.predict("Maren Holtby was born in [MASK] .", subject, top_k=3, sentence_temperature=weights)
            died = knn.predict("Maren Holtby died in [MASK] .", subject, top_k=3, sentence_temperature=weights)
            assert (born.bert_knn[0].token, died.bert_knn[0].token) == ("bergen", "oslo")
            p_born = {t.token: t.probability for t in born.bert_knn}
            if weights:  # the sentence that says "born" outweighs the one that says "died"
                assert "oslo" not in p_born
            else:  # the keys alone: the death place a close second
                assert p_born["oslo"] > p_born["bergen"] / 2


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
