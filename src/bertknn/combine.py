"""Combine stage: interpolate the LM's and the kNN's distributions, and the result a user gets (SPEC §3).

p = lambda * p_kNN + (1 - lambda) * p_BERT over the full vocabulary; with no neighbours, p = p_BERT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class TokenScore:
    """A vocabulary token and its probability."""

    token: str
    probability: float


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
    """Ranked answers of BERT, kNN and BERT-kNN for one question, with the evidence behind the kNN answers."""

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

    def to_dict(self) -> dict:
        """JSON-ready form (without the full distributions)."""
        out = asdict(self)
        for name in ("p_bert", "p_knn", "p"):
            out.pop(name)
        return out


def interpolate(p_bert: np.ndarray, p_knn: np.ndarray | None, lam: float) -> np.ndarray:
    """lambda * p_kNN + (1 - lambda) * p_BERT; p_BERT alone when there is no kNN distribution."""
    if p_knn is None:
        return p_bert
    return lam * p_knn + (1.0 - lam) * p_bert


def ranked(p: np.ndarray | None, tokens, k: int) -> list[TokenScore]:
    """The k most probable tokens with non-zero probability, best first (ties by vocabulary id)."""
    if p is None:
        return []
    top = torch.topk(torch.from_numpy(p), min(k, len(p))).indices.numpy()  # torch.topk: faster than np.argpartition
    top = top[np.lexsort((top, -p[top]))]
    top = top[p[top] > 0]
    return [TokenScore(t, float(p[i])) for t, i in zip(tokens.convert_ids_to_tokens(top.tolist()), top)]
