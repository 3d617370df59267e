"""An edit's questions answered and scored: each answer read from a `Prediction` (`Answer`: the top-k words, whether
the top-1 word is the new or the true target, both targets' probabilities), questions asked a fixed chunk at a time
(`ask`), and the editing scores of a set of answers (`edit_scores`).

Top-1 rates: efficacy (the prompt's top-1 word is the new target), generalisation (the paraphrase's is), locality
(the locality prompt's top-1 word is the one it was before any edit). ROME's scores (Meng et al. 2022): P(new) >
P(true) on the prompt (efficacy score) and on the paraphrase (paraphrase score), P(true) > P(new) on the locality
prompt (neighbourhood score). A target's probability is its entry in the answer's distribution over words (the
vocabulary, then the words of several tokens the neighbours hold: `words.Words`); a target of several tokens that
is not among them has probability 0, and two zeros compare as a failure. The LM alone ranks its vocabulary only, so
there a target of several tokens has probability 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bertknn.evaluation.edits_data import Question
from bertknn.evaluation.facts import is_uncased
from bertknn.query.prediction import Prediction, TokenScore
from bertknn.query.settings import Settings
from bertknn.query.words import Words

ASK_CHUNK = 256  # questions per `predict_batch` call: the pipeline's batch, so each chunk is one model batch
SCORES = ("efficacy", "generalisation", "locality", "efficacy_score", "paraphrase_score", "neighbourhood_score")


@dataclass(frozen=True)
class Answer:
    """One answer to a `Question` as a method (BERT-kNN or the LM alone) gives it: its top-k words' tokens (what the
    undo check compares), the top-1 word, whether that is the new or the true target, and both targets'
    probabilities."""

    top: tuple[tuple[int, ...], ...]
    word: str
    new: bool
    true: bool
    p_new: float
    p_true: float


def target_tokens(tokenizer, word: str) -> tuple[int, ...]:
    """A target word's tokens as a sentence holds it (after a space); () when empty or spelled with the unknown
    token (no answer can be it)."""
    if not word.strip():
        return ()
    ids = tuple(tokenizer(" " + word.strip(), add_special_tokens=False)["input_ids"])
    return () if tokenizer.unk_token_id in ids else ids


def is_target(answer: TokenScore | None, tokens: tuple[int, ...], word: str, uncased: bool) -> bool:
    """Whether an answer word is the target `word` (its `tokens`): the same tokens, or the same text (lowercased for
    an uncased model, as LAMA's answers are compared)."""
    if answer is None or not tokens:
        return False
    a, b = answer.token.strip(), word.strip()
    return answer.pieces == tokens or (a.lower() == b.lower() if uncased else a == b)


def probability(p: np.ndarray, tokens: tuple[int, ...], vocab: int, words: Words | None = None) -> float:
    """A target's probability in `p`, a distribution over `words` (default: the vocabulary alone): a word of one
    token at its id, one of several at its place among the words of several tokens; 0 when it is not there."""
    if not tokens:
        return 0.0
    if len(tokens) == 1 and tokens[0] < vocab:
        return float(p[tokens[0]])
    if words is not None and len(p) == words.size:
        for j, pieces in enumerate(words.pieces):
            if pieces == tokens:
                return float(p[vocab + j])
    return 0.0


class Reading:
    """What answers are read with: the reader's tokenizer and vocabulary, and the targets' tokens, cached."""

    def __init__(self, reader) -> None:
        self.reader, self.tokenizer = reader, reader.encoder.tokenizer
        self.vocab, self.uncased = reader.encoder.vocab_size, is_uncased(self.tokenizer)
        self._tokens: dict[str, tuple[int, ...]] = {}

    def tokens(self, word: str) -> tuple[int, ...]:
        if word not in self._tokens:
            self._tokens[word] = target_tokens(self.tokenizer, word)
        return self._tokens[word]

    def answer(self, pred: Prediction, method: str, question: Question) -> Answer:
        """`pred`'s answer by `method` ("bert_knn", or "bert": the LM alone, over its vocabulary)."""
        new, true = self.tokens(question.new), self.tokens(question.true)
        ranking = pred.bert if method == "bert" else pred.bert_knn
        if method == "bert":
            p, words = np.asarray(pred.p_bert)[: self.vocab], None
        else:
            p, words = np.asarray(pred.p), None
            if len(p) > self.vocab and pred.neighbours is not None and max(len(new), len(true)) > 1:
                words = self.reader.words(pred.neighbours)  # the words of several tokens p is over
        first = ranking[0] if ranking else None
        return Answer(
            top=tuple(t.pieces for t in ranking),
            word=first.token if first else "",
            new=is_target(first, new, question.new, self.uncased),
            true=is_target(first, true, question.true, self.uncased),
            p_new=probability(p, new, self.vocab, words),
            p_true=probability(p, true, self.vocab, words),
        )


def ask(
    reader,
    questions: Sequence[Question],
    settings: Settings | None = None,
    top_k: int = 10,
    report: Callable[[int], None] | None = None,
    reading: Reading | None = None,
) -> dict[str, list[Answer]]:
    """Every question's answer by BERT-kNN ("bert_knn", with `settings`; default: the reader's) and by the LM alone
    ("bert"), asked ASK_CHUNK at a time (`report(n)` after each chunk)."""
    reading = reading or Reading(reader)
    out: dict[str, list[Answer]] = {"bert": [], "bert_knn": []}
    for start in range(0, len(questions), ASK_CHUNK):
        chunk = questions[start : start + ASK_CHUNK]
        texts, subjects = [q.text for q in chunk], [q.subject for q in chunk]
        preds = reader.predict_batch(texts, subjects, top_k=top_k, evidence=0, settings=settings)
        for question, pred in zip(chunk, preds):
            for method, answers in out.items():
                answers.append(reading.answer(pred, method, question))
        if report:
            report(len(chunk))
    return out


def _pct(flags: Sequence[bool]) -> float | None:
    return 100.0 * sum(map(bool, flags)) / len(flags) if len(flags) else None


def edit_scores(
    rewrite: Sequence[Answer], rephrase: Sequence[Answer], locality: Sequence[Answer], before: Sequence[Answer]
) -> dict:
    """The scores (SCORES, in %; None for no edits) of edits' answers: `rewrite`, `rephrase` and `locality` after
    them, `before` the locality answers before any edit."""
    return {
        "edits": len(rewrite),
        "efficacy": _pct([a.new for a in rewrite]),
        "generalisation": _pct([a.new for a in rephrase]),
        "locality": _pct([a.top[:1] == b.top[:1] for a, b in zip(locality, before)]),
        "efficacy_score": _pct([a.p_new > a.p_true for a in rewrite]),
        "paraphrase_score": _pct([a.p_new > a.p_true for a in rephrase]),
        "neighbourhood_score": _pct([a.p_true > a.p_new for a in locality]),
    }
