"""Grid search of BERT-kNN's hyperparameters on a dev split (the paper's grid, widened to the model's own scale).

Each dev fact is run through the model once: its LM distribution and, for n_docs = 1..5, its 512 nearest neighbours
are cached; every grid point is then scored from that cache alone (no forward pass, no search). The gold token's
BERT-kNN rank is counted exactly and cheaply: kNN puts mass on at most k tokens, so the tokens outside that support
are counted with a binary search in the sorted LM distribution (in the log-linear mixture only the support scores).
The grid scores the paper's vote with both mixtures (MIXTURES); the numbers and the mixture it stores are used with
the datastore's default vote.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bertknn.evaluation.facts import TUNED_GROUPS, Fact, fact_key, held_out, ir_subject, sample_per_relation
from bertknn.evaluation.metrics import UNRANKED, macro_metrics
from bertknn.query.combine import log_linear_scores
from bertknn.query.knn import neighbour_weights
from bertknn.query.settings import MIXTURES, PAPER, Settings

if TYPE_CHECKING:
    from bertknn.query.pipeline import BertKNN

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

    def ranks(
        self, n_docs: int, k: int, temperature: float, lambdas: np.ndarray, mixture: str = "linear"
    ) -> np.ndarray:
        """The gold token's BERT-kNN rank for each lambda (1 + tokens scored strictly higher) under `mixture`."""
        values, dist = self.neighbours[n_docs]
        values, dist = values[:k], dist[:k]
        if not len(values):
            base = 1 + len(self.sorted_bert) - np.searchsorted(self.sorted_bert, self.bert_gold, side="right")
            return np.full(len(lambdas), base)
        support, inverse = np.unique(values, return_inverse=True)
        q = np.bincount(inverse, weights=neighbour_weights(dist, temperature))
        one_token = support < len(self.p_bert)  # LAMA ranks the vocabulary: words of several tokens only take votes
        support, q = support[one_token], q[one_token]
        q_gold = q[support == self.gold].sum()
        b_support = self.p_bert[support]
        if mixture == "log-linear":  # only the neighbours' words score: gold outside them is never a hit
            if not q_gold:
                return np.full(len(lambdas), UNRANKED)
            score = log_linear_scores(q, b_support, lambdas)  # lambdas x support
            gold_score = score[:, support == self.gold][:, 0]
            return 1 + (score > gold_score[:, None]).sum(1)
        thr = lambdas * q_gold + (1 - lambdas) * self.bert_gold  # gold's score per lambda
        x = thr / (1 - lambdas)  # a token outside the support beats gold when its LM probability exceeds x
        above = len(self.sorted_bert) - np.searchsorted(self.sorted_bert, x, side="right")
        above -= (b_support[None, :] > x[:, None]).sum(1)  # those inside the support are counted next
        inside = ((lambdas[:, None] * q[None, :] + (1 - lambdas[:, None]) * b_support[None, :]) > thr[:, None]).sum(1)
        return 1 + above + inside


def cache_facts(
    reader: BertKNN, facts: list[Fact], progress: Callable[[str, int, int], None] | None = None
) -> list[FactCache]:
    """Run each fact through the model once and keep what the grid needs: the neighbours among its first 1..5
    documents, from one retrieval (through the search every prediction makes: `BertKNN.search`).

    In a lazy datastore the documents of all facts are embedded first, in one run; `progress(phase, done, total)`
    reports "embedding" and then "caching".
    """
    report = progress or (lambda phase, done, total: None)
    search = reader.search("ir")
    queries = reader.preprocess([f.question for f in facts], [ir_subject(f) for f in facts])
    docs, _ = reader.embed_retrieved(queries, max(N_DOCS), lambda done, total: report("embedding", done, total))
    report("caching", 0, len(facts))
    out = []
    for start in range(0, len(facts), 32):
        batch = queries[start : start + 32]
        probs, states = reader.encoder.query_ids([(q.ids, q.mask) for q in batch])
        for fact, chosen, p_bert, state in zip(facts[start : start + 32], docs[start : start + 32], probs, states):
            neighbours = {}
            for n in N_DOCS:
                found = search.among(chosen[:n], state, max(KS))
                neighbours[n] = (found.values, found.distances.astype(np.float64))
            out.append(FactCache(p_bert.astype(np.float64), fact.answer_id, neighbours))
        report("caching", min(start + 32, len(facts)), len(facts))
    return out


def temperatures(cache: list[FactCache]) -> list[float]:
    """The paper's 5..12 plus multiples of the median squared distance of the nearest neighbours (the model's scale)."""
    nearest_d = [c.neighbours[PAPER.n_docs][1][: PAPER.k] for c in cache if len(c.neighbours[PAPER.n_docs][1])]
    median = float(np.median(np.concatenate(nearest_d))) if nearest_d else PAPER.temperature
    scaled = {round(m * median, 2) for m in SCALE_MULTIPLES}
    return sorted(set(PAPER_TEMPERATURES) | {t for t in scaled if t > 0})  # a tiny scale rounds to 0: not a setting


def grid_search(facts: list[Fact], cache: list[FactCache]) -> list[tuple[Settings, dict]]:
    """Every grid point's settings (the paper's vote; both mixtures) with its macro P@1, P@10 and MRR of BERT-kNN on
    the dev facts, best first."""
    lambdas = np.asarray(LAMBDAS)
    results = []
    for n_docs, k, temperature, mixture in itertools.product(N_DOCS, KS, temperatures(cache), MIXTURES):
        ranks = np.stack([c.ranks(n_docs, k, temperature, lambdas, mixture) for c in cache])  # facts x lambdas
        for j, lam in enumerate(LAMBDAS):
            macro = macro_metrics(facts, ranks[:, j].tolist())["macro"]
            chosen = PAPER.replace(n_docs=n_docs, k=k, temperature=temperature, lam=lam, mixture=mixture)
            results.append((chosen, macro))
    results.sort(key=lambda r: (-r[1]["P@1"], -r[1]["MRR"]))
    return results


@dataclass(frozen=True)
class DevSplit:
    """The facts `bertknn tune` tunes on: `per_relation` facts of each T-REx and Google-RE relation (seed + 1) and
    `squad` SQuAD questions (None: all), none of them in the sample of `exclude_per_relation` facts per relation that
    `eval lama --sample-per-relation` draws with `seed` from the facts of its default groups (all of LAMA's: the draw
    depends on every relation), so that tuning never sees the facts it is judged on."""

    per_relation: int = 10
    squad: int | None = None
    exclude_per_relation: int = 30
    seed: int = 0
    heldout_only: bool = False
    embedded_only: bool = False

    def choose(self, facts: list[Fact], reader: BertKNN | None = None) -> list[Fact]:
        """The dev facts among LAMA's `facts` (those of facts.GROUPS, as `eval lama` loads them); `reader` (needed for
        embedded_only) says which documents are embedded already, so that tuning costs no embedding. ValueError when
        none is left."""
        if self.heldout_only:
            facts = held_out(facts)
        held = {fact_key(f) for f in sample_per_relation(facts, self.exclude_per_relation, self.seed)}
        rest = [f for f in facts if fact_key(f) not in held and f.group in TUNED_GROUPS]
        if self.embedded_only:
            rest = [f for f in rest if not reader.store.documents.pending(_documents(reader, f))]
        dev = sample_per_relation([f for f in rest if f.group != "SQuAD"], self.per_relation, self.seed + 1)
        dev += [f for f in rest if f.group == "SQuAD"][: self.squad]
        if not dev:
            raise ValueError("no dev facts left to tune on (see --embedded-only and --exclude-sample-per-relation)")
        return dev

    def describe(self, dev: list[Fact]) -> str:
        """The dev split in words, as grid.md, the manifest's "tuned" record and the command's output give it."""
        return (
            f"{len(dev)} dev facts: {sum(f.group == 'SQuAD' for f in dev)} SQuAD + {self.per_relation} per "
            f"T-REx/Google-RE relation (seed {self.seed + 1})"
            f"{', documents already embedded' if self.embedded_only else ''}"
            f"{', held-out subjects' if self.heldout_only else ''}, "
            f"disjoint from the eval sample of {self.exclude_per_relation} per relation (seed {self.seed})"
        )


def _documents(reader: BertKNN, fact: Fact) -> list[int]:
    """The documents the grid searches for a fact: IR's first max(N_DOCS)."""
    return reader.search("ir").documents(fact.question, ir_subject(fact), max(N_DOCS))


def store_best(reader: BertKNN, grid: list[tuple[Settings, dict]], description: str) -> None:
    """Record the grid's best settings, its P@1 and the dev split with the datastore: `BertKNN.load` uses them."""
    best, scores = grid[0]
    with reader.writes("recording the tuned settings").commit() as store:
        store.writer.set_manifest(tuned={"hparams": best.tuned, "dev": description, "P@1": scores["P@1"]})
