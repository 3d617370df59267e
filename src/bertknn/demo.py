"""The embedded demo: a small corpus written for the project, with facts no language model can know."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path

from rich.console import RenderableType
from rich.markup import escape

from bertknn.console import prob, render
from bertknn.ingest.ingester import Writer
from bertknn.model.default_model import DEFAULT_MODEL
from bertknn.model.encoder import Encoder, cache_dir
from bertknn.model.runtime import Runtime
from bertknn.query.pipeline import BertKNN
from bertknn.query.prediction import Prediction
from bertknn.store.datastore import Datastore
from bertknn.store.manifest import VERSION

DEMO_CORPUS = Path(str(files("bertknn") / "data" / "demo_corpus.jsonl"))
DEMO_QUESTIONS = Path(str(files("bertknn") / "data" / "demo_questions.json"))
FRESH_DOCUMENTS = [
    {
        "id": "fresh-1",
        "title": "Tamsin Orwhey",
        "text": "Tamsin Orwhey was born in Tallinn. She repairs old clocks in a shop by the harbour.",
    },
    {
        "id": "fresh-2",
        "title": "Edda Kallaste",
        "text": "Edda Kallaste was born in Kuressaare. She builds wooden boats.",
    },
    {
        "id": "fresh-3",
        "title": "Maren Holtby",
        "text": "Maren Holtby is an architect. Holtby was born in Bergen in 1979. She studied in Zurich and later "
        "worked in Madrid. Holtby died in Oslo.",
    },
]
UPDATE = {  # a newer document about a subject of the demo corpus, which says he plays the accordion
    "id": "update-033",
    "title": "Tovald Ekrund",
    "text": "Tovald Ekrund left folk music in 2025. Since then he plays the cello.",
}
UPDATE_QUESTION = {"question": "Tovald Ekrund plays the [MASK] .", "subject": "Tovald Ekrund", "answer": "cello"}
FRESH_QUESTIONS = [  # the second answer is a word of four wordpieces: no masked LM can give it alone
    {"question": "Tamsin Orwhey was born in [MASK] .", "subject": "Tamsin Orwhey", "answer": "tallinn"},
    {"question": "Edda Kallaste was born in [MASK] .", "subject": "Edda Kallaste", "answer": "kuressaare"},
    # one document, four places and a year: each question must find its own (the sentence weights)
    {"question": "Maren Holtby was born in [MASK] .", "subject": "Maren Holtby", "answer": "bergen"},
    {"question": "Maren Holtby died in [MASK] .", "subject": "Maren Holtby", "answer": "oslo"},
]


def demo_questions() -> list[dict]:
    """The demo's cloze questions: {question, subject, answer}."""
    return json.loads(DEMO_QUESTIONS.read_text(encoding="utf-8"))


def fixed_by_knn(prediction: Prediction, answer: str) -> bool:
    """True when BERT-kNN ranks `answer` first and the LM alone does not."""
    return bool(prediction.bert_knn) and prediction.bert_knn[0].token == answer and prediction.bert[0].token != answer


def demo_path(encoder: Encoder) -> Path:
    """Where the demo corpus's datastore for this model and layer is cached."""
    return cache_dir() / f"demo-{encoder.cache_tag}-v{VERSION}-evidence"  # a new format or evidence: a new one


def build_demo(
    model: str = DEFAULT_MODEL,
    runtime: Runtime | str = "torch",
    progress: Callable[[str, int, int], None] | None = None,
) -> BertKNN:
    """The demo corpus's datastore for `model`, built on first use and cached under `cache_dir()` (`bertknn demo`)."""
    encoder = Encoder.load(model, runtime=runtime)
    return BertKNN.build(DEMO_CORPUS, demo_path(encoder), encoder, progress=progress)


def fresh_facts(knn: BertKNN) -> tuple[list[tuple[str, list[Prediction]]], tuple[Prediction, Prediction]]:
    """Facts the datastore lacks (FRESH_QUESTIONS), asked before adding their documents, after adding them (with
    bertknn's defaults, then without sentence weights) and after removing them: (stage, a prediction
    per question) each; then a fact the corpus has, asked before and after a newer document (UPDATE) changes it.

    Runs on a temporary copy of the datastore, so the cached demo datastore is left as it was.
    """
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(knn.store.path, Path(tmp) / "store")
        store = Datastore(Path(tmp) / "store")
        fresh = BertKNN(knn.encoder, store, settings=knn.settings, writer=Writer(store, knn.encoder))

        def ask(**options: float) -> list[Prediction]:
            questions, subjects = [q["question"] for q in FRESH_QUESTIONS], [q["subject"] for q in FRESH_QUESTIONS]
            return fresh.predict_batch(questions, subjects, top_k=3, evidence=1, **options)

        stages = [("before add", ask())]
        fresh.add_documents(FRESH_DOCUMENTS)
        stages.append(("after add", ask()))
        stages.append(("no sentence weights", ask(sentence_temperature=0.0)))
        fresh.remove_documents([d["id"] for d in FRESH_DOCUMENTS])
        stages.append(("after remove", ask()))
        asked = ([UPDATE_QUESTION["question"]], [UPDATE_QUESTION["subject"]])
        (before,) = fresh.predict_batch(*asked, top_k=3, evidence=1)
        fresh.add_documents([UPDATE])
        (after,) = fresh.predict_batch(*asked, top_k=3, evidence=1)
        store.close()
    return stages, (before, after)


def intro(model: str, path: Path) -> str:
    """`bertknn demo`'s first line (rich markup): the model, whether it is the offline default, and the datastore."""
    kind = "the offline default, a weaker stand-in for bert-base-uncased" if model == DEFAULT_MODEL else "user-chosen"
    return f"[bold]bertknn demo[/]: model {model} ({kind}), datastore {path}"


def narration(knn: BertKNN) -> Iterator[RenderableType]:
    """What `bertknn demo` prints once its datastore is built: each question's answers and evidence, those that
    BERT-kNN gets right and the LM alone does not, then a fresh fact asked before adding, after adding and after
    removing its document."""
    questions = demo_questions()
    predictions = knn.predict_batch([q["question"] for q in questions], [q["subject"] for q in questions], top_k=5)
    fixed = []
    for q, p in zip(questions, predictions):
        yield render(p, top_k=5, evidence_words=1)
        if fixed_by_knn(p, q["answer"]):
            fixed.append(q)
    for q in fixed:
        yield (
            f"[bold green]BERT-kNN knows[/] {escape(q['question'].replace('[MASK]', q['answer']))} "
            "[green]where the LM alone does not: the answer comes from the evidence sentence above.[/]"
        )
    yield f"{len(fixed)} of {len(questions)} questions answered right by BERT-kNN and wrong by the LM alone."
    yield (
        "\n[bold]Fresh facts[/], asked before and after `bertknn add` of "
        + " and ".join(repr(d["text"]) for d in FRESH_DOCUMENTS)
        + ", after it without sentence weights (--no-sentence-weights), then after `bertknn remove` (on a copy of the"
        " datastore):"
    )
    stages, update = fresh_facts(knn)
    width = max(len(stage) for stage, _ in stages)
    for i, q in enumerate(FRESH_QUESTIONS):
        yield f"{escape(q['question'])} (gold: {q['answer']})"
        for stage, found in stages:
            p = found[i]
            top = ", ".join(f"{t.token} {prob(t.probability)}" for t in p.bert_knn[:3])
            yield f"{stage:>{width}}: BERT-kNN {escape(top)}; documents: {escape(', '.join(p.documents) or 'none')}"
    yield from _update_lines(*update)


def _update_lines(before: Prediction, after: Prediction) -> Iterator[str]:
    """The update's narration: the answers before and after a newer document, and both sides' evidence."""
    yield (
        f"\n[bold]An update[/], `bertknn add` of {UPDATE['text']!r} about a subject the corpus has: the newer "
        "document wins where it speaks to the question, and the older statement is shown as superseded:"
    )
    yield f"{escape(UPDATE_QUESTION['question'])} (gold after the update: {UPDATE_QUESTION['answer']})"
    for stage, p in (("before the update", before), ("after the update", after)):
        top = ", ".join(f"{t.token} {prob(t.probability)}" for t in p.bert_knn[:3])
        yield f"{stage:>17}: answers {escape(top)}; documents: {escape(', '.join(p.documents) or 'none')}"
    said = [(n, "now") for n in (after.evidence.get(after.bert_knn[0].token, [])[:1] if after.bert_knn else [])]
    for n, when in [*said, *((n, "superseded") for n in after.superseded)]:
        dated = f", {n.date[:10]}" if n.date else ""
        yield f"{when:>17}: {escape(n.token)} from {escape(n.sentence)!r} ({escape(n.doc_id)}{dated})"
