"""Combine stage: interpolate the LM's and the kNN's distributions (SPEC §3), and calibrate the result.

p = lambda * p_kNN + (1 - lambda) * p_BERT over the full vocabulary (the paper), or the log-linear mixture
p ~ p_kNN^lambda * p_BERT^(1 - lambda) (bertknn's default); with no neighbours, p = p_BERT. Distributions are over
words (`words.Words`): the vocabulary's, then the words of several tokens the neighbours hold.
"""

from __future__ import annotations

import numpy as np


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


def interpolate(
    p_bert: np.ndarray, p_knn: np.ndarray | None, lam: float, mixture: str = "linear", prior: np.ndarray | None = None
) -> np.ndarray:
    """The two distributions combined: "linear" (the paper), lambda * p_kNN + (1 - lambda) * p_BERT; "log-linear",
    p_kNN^lambda * p_BERT^(1 - lambda) renormalised, so an answer needs both supports: the neighbours' words ranked
    by how well each fits the question as the LM reads it (words no neighbour holds get 0), each times its `prior`
    if one is given (`Words.prior`). p_BERT alone when there is no kNN distribution."""
    if p_knn is None:
        return p_bert
    if mixture == "linear":
        return lam * p_knn + (1.0 - lam) * p_bert
    held = np.flatnonzero(p_knn > 0)
    score = log_linear_scores(p_knn[held], p_bert[held], lam)
    if prior is not None:
        score = score + np.log(prior[held])
    weights = np.exp(score - score.max())
    out = np.zeros(len(p_bert), dtype=np.float64)
    out[held] = weights / weights.sum()
    return out


def calibrate(p: np.ndarray, p_lm: np.ndarray, temperature: float = 1.0, floor: float = 0.0) -> np.ndarray:
    """Probabilities that mean what they say (Guo et al., On calibration of modern neural networks, ICML 2017:
    temperature scaling): p^(1/temperature) renormalised, then mixed with the LM's distribution by `floor`, (1 -
    floor) p + floor p_LM, so that a word no neighbour holds keeps some probability. The temperature keeps the words'
    order; the floor adds floor p_LM to each, which reorders only words closer than that. Both values are fitted on a
    dev split (bench/calibration.py)."""
    if temperature == 1 and floor == 0:
        return p
    held = p > 0
    scaled = np.zeros(len(p))
    scaled[held] = np.exp((np.log(p[held]) - np.log(p[held]).max()) / temperature)
    return (1.0 - floor) * scaled / scaled.sum() + floor * np.asarray(p_lm, np.float64)
