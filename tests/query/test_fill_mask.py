"""The fill-mask output format against transformers' own FillMaskPipeline on the same tiny model."""

from __future__ import annotations

import pytest
from transformers import AutoModelForMaskedLM, AutoTokenizer, FillMaskPipeline

QUESTIONS = ["Ilsa Varnhold was born in [MASK] .", "Paris is the capital of [MASK] ."]


@pytest.fixture(scope="module")
def hf_fill_mask(tiny_model_dir):
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir).eval()
    return FillMaskPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))


def test_the_lm_ranking_as_fill_mask_is_the_pipelines_answer(built, hf_fill_mask):
    for question in QUESTIONS:
        ours = built.predict(question, top_k=5).fill_mask(built.encoder.tokenizer, "bert")
        theirs = hf_fill_mask(question.replace("[MASK]", hf_fill_mask.tokenizer.mask_token), top_k=5)
        assert [list(a) for a in ours] == [list(b) for b in theirs]  # same keys, same order
        for a, b in zip(ours, theirs):
            assert (a["token"], a["token_str"], a["sequence"]) == (b["token"], b["token_str"], b["sequence"])
            assert a["score"] == pytest.approx(b["score"], rel=1e-4)


def test_calling_bertknn_answers_like_the_pipeline(built, hf_fill_mask):
    """`knn(text)` takes the place of `pipeline("fill-mask")(text)`: BERT-kNN's ranking in its shape."""
    one = built(QUESTIONS[0], top_k=3)
    theirs = hf_fill_mask(QUESTIONS[0], top_k=3)
    assert [list(a) for a in one] == [list(b) for b in theirs]
    prediction = built.predict(QUESTIONS[0], top_k=3)
    assert [a["token_str"] for a in one] == [t.token for t in prediction.bert_knn]
    assert [a["score"] for a in one] == [t.probability for t in prediction.bert_knn]
    assert one[0]["sequence"] == f"ilsa varnhold was born in {one[0]['token_str']}."
    many = built(QUESTIONS, top_k=2)
    assert len(many) == 2 and [len(answers) for answers in many] == [2, 2]
    assert [a["sequence"] for a in many[0]] == [a["sequence"] for a in one[:2]]  # batched: scores equal to ~1e-6
    assert [a["score"] for a in many[0]] == pytest.approx([a["score"] for a in one[:2]], rel=1e-4)


def test_to_dict_carries_every_ranking_as_fill_mask_on_request(built):
    prediction = built.predict(QUESTIONS[1], top_k=4)
    plain = prediction.to_dict()
    assert "fill_mask" not in plain and list(plain) == [
        "question",
        "subject",
        "documents",
        "bert",
        "knn",
        "bert_knn",
        "evidence",
        "superseded",
        "linked",
        "retrieval",
    ]
    assert plain["linked"] == {"subject": "Paris", "text": "Paris", "span": [0, 5], "by": "title"}
    full = prediction.to_dict(built.encoder.tokenizer)
    for method in ("bert", "knn", "bert_knn"):
        assert full["fill_mask"][method] == prediction.fill_mask(built.encoder.tokenizer, method)
        assert [a["token"] for a in full["fill_mask"][method]] == [t["id"] for t in plain[method]]
