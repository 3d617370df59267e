"""The embedded demo: a small corpus written for the project, with facts no language model can know."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from bertknn.combine import Prediction
from bertknn.datastore import cache_dir
from bertknn.default_model import DEFAULT_MODEL
from bertknn.encoder import Encoder
from bertknn.pipeline import BertKNN

DEMO_CORPUS = Path(str(files("bertknn") / "data" / "demo_corpus.jsonl"))
DEMO_QUESTIONS = Path(str(files("bertknn") / "data" / "demo_questions.json"))


def demo_questions() -> list[dict]:
    """The demo's cloze questions: {question, subject, answer}."""
    return json.loads(DEMO_QUESTIONS.read_text(encoding="utf-8"))


def fixed_by_knn(prediction: Prediction, answer: str) -> bool:
    """True when BERT-kNN ranks `answer` first and the LM alone does not."""
    return bool(prediction.bert_knn) and prediction.bert_knn[0].token == answer and prediction.bert[0].token != answer


def build_demo(model: str = DEFAULT_MODEL, progress: Callable[[str, int, int], None] | None = None) -> BertKNN:
    """The demo corpus's datastore for `model`, built on first use and cached under `cache_dir()` (`bertknn demo`)."""
    encoder = Encoder.load(model)
    out = cache_dir() / f"demo-{encoder.weights_hash[:12]}-L{encoder.layer}"
    return BertKNN.build(DEMO_CORPUS, out, encoder, progress=progress)
