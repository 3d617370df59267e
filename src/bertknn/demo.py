"""The embedded demo: a small corpus written for the project, with facts no language model can know."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from bertknn.combine import Prediction

DEMO_CORPUS = Path(str(files("bertknn") / "data" / "demo_corpus.jsonl"))
DEMO_QUESTIONS = Path(str(files("bertknn") / "data" / "demo_questions.json"))


def demo_questions() -> list[dict]:
    """The demo's cloze questions: {question, subject, answer}."""
    return json.loads(DEMO_QUESTIONS.read_text(encoding="utf-8"))


def fixed_by_knn(prediction: Prediction, answer: str) -> bool:
    """True when BERT-kNN ranks `answer` first and the LM alone does not."""
    return bool(prediction.bert_knn) and prediction.bert_knn[0].token == answer and prediction.bert[0].token != answer
