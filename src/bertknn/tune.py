"""Grid search of BERT-kNN's hyperparameters on a dev split (the paper's grid, widened to the model's own scale).

Each dev fact is run through the model once: its LM distribution and, for n_docs = 1..5, its 512 nearest neighbours
are cached; every grid point is then scored from that cache alone (no forward pass, no search). The gold token's
BERT-kNN rank is counted exactly and cheaply: kNN puts mass on at most k tokens, so the tokens outside that support
are counted with a binary search in the sorted LM distribution.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from bertknn.evaluation import Fact, ir_subject, macro_metrics
from bertknn.knn import nearest
from bertknn.settings import PAPER, Settings

N_DOCS = (1, 2, 3, 4, 5)
LAMBDAS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
KS = (64, 128, 512)
PAPER_TEMPERATURES = (5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0)
SCALE_MULTIPLES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)


class FactCache:
    """What the grid needs of one fact: its sorted LM distribution, gold probability and neighbours per n_docs."""

    def __init__(self, p_bert: np.ndarray, gold: int, neighbours: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        self.sorted_bert = np.sort(p_bert)
        self.bert_gold = float(p_bert[gold])
        self.p_bert = p_bert
        self.gold = gold
        self.neighbours = neighbours  # n_docs -> (values, squared distances), nearest first, at most max(KS)

    def ranks(self, n_docs: int, k: int, temperature: float, lambdas: np.ndarray) -> np.ndarray:
        """The gold token's BERT-kNN rank for each lambda (1 + tokens scored strictly higher)."""
        values, dist = self.neighbours[n_docs]
        values, dist = values[:k], dist[:k]
        if not len(values):
            base = 1 + len(self.sorted_bert) - np.searchsorted(self.sorted_bert, self.bert_gold, side="right")
            return np.full(len(lambdas), base)
        w = np.exp(-(dist - dist.min()) / temperature)
        support, inverse = np.unique(values, return_inverse=True)
        q = np.bincount(inverse, weights=w / w.sum())
        q_gold = q[support == self.gold].sum()
        b_support = self.p_bert[support]
        thr = lambdas * q_gold + (1 - lambdas) * self.bert_gold  # gold's score per lambda
        x = thr / (1 - lambdas)  # a token outside the support beats gold when its LM probability exceeds x
        above = len(self.sorted_bert) - np.searchsorted(self.sorted_bert, x, side="right")
        above -= (b_support[None, :] > x[:, None]).sum(1)  # those inside the support are counted next
        inside = ((lambdas[:, None] * q[None, :] + (1 - lambdas[:, None]) * b_support[None, :]) > thr[:, None]).sum(1)
        return 1 + above + inside


def cache_facts(knn, facts: list[Fact], progress: Callable[[int], None] | None = None) -> list[FactCache]:
    """Run each fact through the model once and keep what the grid needs."""
    out = []
    for start in range(0, len(facts), 32):
        batch = facts[start : start + 32]
        probs, states = knn.encoder.query([f.question for f in batch])
        for fact, p_bert, state in zip(batch, probs, states):
            docs = knn.retrieve(fact.question, ir_subject(fact), n_docs=max(N_DOCS))
            neighbours = {}
            for n in N_DOCS:
                found = knn.candidates(docs[:n])  # embeds first in a lazy datastore
                entries, dist = nearest(knn.store.keys, found, state, max(KS))
                neighbours[n] = (np.asarray(knn.store.values[entries]), dist.astype(np.float64))
            out.append(FactCache(p_bert.astype(np.float64), fact.answer_id, neighbours))
        if progress:
            progress(min(start + 32, len(facts)))
    return out


def temperatures(cache: list[FactCache]) -> list[float]:
    """The paper's 5..12 plus multiples of the median squared distance of the nearest neighbours (the model's scale)."""
    nearest_d = [c.neighbours[PAPER.n_docs][1][: PAPER.k] for c in cache if len(c.neighbours[PAPER.n_docs][1])]
    median = float(np.median(np.concatenate(nearest_d))) if nearest_d else PAPER.temperature
    scaled = {round(m * median, 2) for m in SCALE_MULTIPLES}
    return sorted(set(PAPER_TEMPERATURES) | {t for t in scaled if t > 0})  # a tiny scale rounds to 0: not a setting


def grid_search(facts: list[Fact], cache: list[FactCache]) -> list[tuple[Settings, dict]]:
    """Every grid point's settings with its macro P@1, P@10 and MRR of BERT-kNN on the dev facts, best first."""
    lambdas = np.asarray(LAMBDAS)
    results = []
    for n_docs, k, temperature in itertools.product(N_DOCS, KS, temperatures(cache)):
        ranks = np.stack([c.ranks(n_docs, k, temperature, lambdas) for c in cache])  # facts x lambdas
        for j, lam in enumerate(LAMBDAS):
            macro = macro_metrics(facts, ranks[:, j].tolist())["macro"]
            results.append((Settings(n_docs, k, temperature, lam), macro))
    results.sort(key=lambda r: (-r[1]["P@1"], -r[1]["MRR"]))
    return results
