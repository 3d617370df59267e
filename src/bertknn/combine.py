"""Combine stage: interpolate the LM's and the kNN's distributions, and the result a user gets (SPEC §3).

p = lambda * p_kNN + (1 - lambda) * p_BERT over the full vocabulary (the paper), or the log-linear mixture
p ~ p_kNN^lambda * p_BERT^(1 - lambda) (bertknn's default); with no neighbours, p = p_BERT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from bertknn.search import Neighbours


@dataclass(frozen=True)
class TokenScore:
    """A vocabulary token, its probability and its id."""

    token: str
    probability: float
    id: int


@dataclass(frozen=True)
class Neighbour:
    """One stored context near the question: its word, squared distance, normalised weight and source."""

    token: str
    distance: float
    weight: float
    doc_id: str
    title: str
    sentence: str
    span: tuple[int, int]


@dataclass
class Prediction:
    """Ranked answers of BERT, kNN and BERT-kNN for one question, with the evidence behind the kNN answers.

    Also kept, not shown: the three distributions, the neighbours the kNN answer came from (`search.Neighbours`)
    and the question's token ids with its mask position (for `fill_mask`).
    """

    question: str
    subject: str | None
    documents: list[str]
    bert: list[TokenScore]
    knn: list[TokenScore]
    bert_knn: list[TokenScore]
    evidence: dict[str, list[Neighbour]]
    p_bert: np.ndarray = field(repr=False)
    p_knn: np.ndarray | None = field(repr=False)
    p: np.ndarray = field(repr=False)
    retrieval: str = "ir"  # where the neighbours came from: "ir", "faiss" or "ir+faiss"
    neighbours: Neighbours | None = field(default=None, repr=False)
    input_ids: list[int] = field(default_factory=list, repr=False)
    mask_index: int = 0

    def to_dict(self, tokenizer=None) -> dict:
        """JSON-ready form (without the distributions and neighbours); with a `tokenizer`, also each ranking in the
        fill-mask format under "fill_mask"."""
        out = {
            "question": self.question,
            "subject": self.subject,
            "documents": list(self.documents),
            **{name: [asdict(t) for t in getattr(self, name)] for name in METHODS},
            "evidence": {word: [asdict(n) for n in found] for word, found in self.evidence.items()},
            "retrieval": self.retrieval,
        }
        if tokenizer is not None:
            out["fill_mask"] = {name: self.fill_mask(tokenizer, name) for name in METHODS}
        return out

    def fill_mask(self, tokenizer, method: str = "bert_knn") -> list[dict]:
        """A ranking ("bert", "knn" or "bert_knn") as transformers' `pipeline("fill-mask")` gives one: {score,
        token (id), token_str, sequence (the question with its mask filled, special tokens dropped)} each."""
        out = []
        for t in getattr(self, method):
            ids = list(self.input_ids)
            ids[self.mask_index] = t.id
            sequence = tokenizer.decode(ids, skip_special_tokens=True)
            out.append(
                {"score": t.probability, "token": t.id, "token_str": tokenizer.decode([t.id]), "sequence": sequence}
            )
        return out


METHODS = ("bert", "knn", "bert_knn")


def confident_lam(p_knn: np.ndarray, lam: float, neighbours: int) -> float:
    """The adaptive lambda ("entropy"): `lam` scaled by the kNN's confidence, 1 - H(p_kNN) / log(neighbours), so
    neighbours that agree on one word weigh up to `lam` and neighbours spread over many words weigh little (no extra
    forward pass). One neighbour: `lam`."""
    if neighbours < 2:
        return lam
    p = p_knn[p_knn > 0]
    return float(lam * max(0.0, 1.0 + float(np.sum(p * np.log(p))) / np.log(neighbours)))


def log_linear_scores(p_knn: np.ndarray, p_bert: np.ndarray, lam: float | np.ndarray) -> np.ndarray:
    """lambda * log p_kNN + (1 - lambda) * log p_BERT of words some neighbour holds (p_knn > 0): the log-linear
    mixture before normalising; `lam` a number (one score per word), or an array of them (a row of scores each). An
    LM probability that underflowed to 0 is floored, so the word still ranks, below the others."""
    lam = np.asarray(lam, np.float64)[..., None]
    return lam * np.log(p_knn) + (1.0 - lam) * np.log(np.maximum(p_bert, np.finfo(np.float64).tiny))


def interpolate(p_bert: np.ndarray, p_knn: np.ndarray | None, lam: float, mixture: str = "linear") -> np.ndarray:
    """The two distributions combined: "linear" (the paper), lambda * p_kNN + (1 - lambda) * p_BERT; "log-linear",
    p_kNN^lambda * p_BERT^(1 - lambda) renormalised, so an answer needs both supports: the neighbours' words ranked
    by how well each fits the question as the LM reads it (words no neighbour holds get 0). p_BERT alone when there
    is no kNN distribution."""
    if p_knn is None:
        return p_bert
    if mixture == "linear":
        return lam * p_knn + (1.0 - lam) * p_bert
    held = np.flatnonzero(p_knn > 0)
    score = log_linear_scores(p_knn[held], p_bert[held], lam)
    weights = np.exp(score - score.max())
    out = np.zeros(len(p_bert), dtype=np.float64)
    out[held] = weights / weights.sum()
    return out


def ranked(p: np.ndarray | None, tokens, k: int) -> list[TokenScore]:
    """The k most probable tokens with non-zero probability, best first (ties by vocabulary id)."""
    if p is None:
        return []
    top = torch.topk(torch.from_numpy(p), min(k, len(p))).indices.numpy()  # torch.topk: faster than np.argpartition
    top = top[np.lexsort((top, -p[top]))]
    top = top[p[top] > 0]
    ids = top.tolist()
    return [TokenScore(t, float(p[i]), i) for t, i in zip(tokens.convert_ids_to_tokens(ids), ids)]
