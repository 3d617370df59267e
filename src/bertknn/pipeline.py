"""BERT-kNN end to end: the user-facing `BertKNN` (load or build, then `predict`), in the spirit of HF pipelines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bertknn import datastore as ds
from bertknn.combine import Neighbour, Prediction, interpolate, ranked
from bertknn.datastore import Datastore, DatastoreError
from bertknn.default_model import DEFAULT_MODEL
from bertknn.encoder import Encoder, QuestionError
from bertknn.knn import candidates, knn_distribution, nearest, neighbour_weights
from bertknn.retrieval import TfidfIndex, select_documents
from bertknn.text import mask_count_error

DEFAULTS = {"n_docs": 3, "k": 128, "temperature": 6.0, "lam": 0.3}


def _check_hparams(n_docs: int, k: int, temperature: float, lam: float) -> None:
    problems = [
        msg
        for bad, msg in (
            (n_docs < 1, f"n_docs must be >= 1 (got {n_docs})"),
            (k < 1, f"k must be >= 1 (got {k})"),
            (not temperature > 0, f"temperature must be > 0 (got {temperature})"),
            (not 0 <= lam <= 1, f"lam must be in [0, 1] (got {lam})"),
        )
        if bad
    ]
    if problems:
        raise ValueError("; ".join(problems))


def merge_hparams(base: dict, overrides: dict) -> dict:
    """`base` with the non-None `overrides`, checked: unknown names and out-of-range values raise."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown hyperparameter(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    merged = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    _check_hparams(**merged)
    return merged


def ensure_index(store: Datastore) -> TfidfIndex:
    """The datastore's IR index, (re)built when it is missing or covers fewer documents than the store."""
    try:
        index = TfidfIndex.load(store.path)
        if index.n_docs == store.n_documents:
            return index
    except FileNotFoundError:
        pass
    TfidfIndex.build(store.iter_document_texts()).save(store.path)
    return TfidfIndex.load(store.path)


class BertKNN:
    """A masked LM plus a datastore: `predict("Dante was born in [MASK].", subject="Dante")`.

    Hyperparameters (the paper's defaults): n_docs=3 documents from IR, k=128 neighbours, temperature=6 (the l of
    exp(-d/l), d the squared distance) and lam=0.3 (weight of p_kNN). Values tuned by `bertknn tune` and stored
    with the datastore replace the defaults; arguments given here (not None) replace both. The layer is the
    datastore's.
    """

    def __init__(self, encoder: Encoder, store: Datastore, index: TfidfIndex | None = None, **hparams: float) -> None:
        tuned = store.manifest.get("tuned", {}).get("hparams", {})  # set by `bertknn tune`
        self.hparams = merge_hparams({**DEFAULTS, **tuned}, hparams)
        if not (store.complete or store.lazy):
            raise DatastoreError(f"the datastore at {store.path} is incomplete: rerun `bertknn build` to finish it")
        store.check_encoder(encoder)
        self.encoder, self.store = encoder, store
        self.index = index or ensure_index(store)

    @classmethod
    def load(
        cls, datastore: str | Path, model: str | None = None, layer: int | None = None, **hparams: float
    ) -> BertKNN:
        """Open a datastore and load the model it was built with (or `model`, which must have the same weights)."""
        store = Datastore(datastore)
        if layer is not None and layer != store.layer:
            raise DatastoreError(f"the datastore at {store.path} holds layer-{store.layer} keys, not layer {layer}")
        return cls(Encoder.load(model or store.manifest["model"], store.layer), store, **hparams)

    @classmethod
    def build(
        cls,
        corpus: str | Path,
        out: str | Path,
        model: str | Encoder = DEFAULT_MODEL,
        layer: int | None = None,
        lazy: bool = False,
        pack: int = 1,
        progress: Callable[[str, int, int], None] | None = None,
        **hparams: float,
    ) -> BertKNN:
        """Embed a JSONL corpus into a datastore at `out` (resuming an interrupted build), index it, and load it.

        With `lazy`, documents are only registered and indexed; each is embedded the first time retrieval picks it.
        `pack` > 1 masks that many non-adjacent targets per pass: faster, approximate keys (`Encoder.embed`).
        """
        encoder = model if isinstance(model, Encoder) else Encoder.load(model, layer)
        store = ds.build(corpus, out, encoder, lazy=lazy, pack=pack, progress=progress)
        return cls(encoder, store, ensure_index(store), **hparams)

    def predict(
        self, text: str, subject: str | None = None, top_k: int = 10, evidence: int = 3, **hparams: float
    ) -> Prediction:
        """Predict the [MASK] of one cloze question; `subject` (knowledge-base questions) steers retrieval.

        Hyperparameters given here (n_docs, k, temperature, lam) apply to this call only.
        """
        return self.predict_batch([text], [subject], top_k, evidence, **hparams)[0]

    def predict_batch(
        self,
        texts: list[str],
        subjects: list[str | None] | None = None,
        top_k: int = 10,
        evidence: int = 3,
        batch_size: int = 32,
        **hparams: float,
    ) -> list[Prediction]:
        """Predict many questions, running the model in batches of `batch_size`; `hparams` as in `predict`."""
        h = merge_hparams(self.hparams, hparams)
        subjects = list(subjects) if subjects is not None else [None] * len(texts)
        if len(subjects) != len(texts):
            raise ValueError(f"{len(texts)} questions but {len(subjects)} subjects")
        for i, text in enumerate(texts):
            error = mask_count_error(text)
            if error:
                raise QuestionError(f"question {i + 1} ({text!r}): {error}")
        out = []
        for start in range(0, len(texts), batch_size):
            probs, states = self.encoder.query(texts[start : start + batch_size])
            for j, (p_bert, state) in enumerate(zip(probs, states)):
                out.append(self._predict_one(texts[start + j], subjects[start + j], p_bert, state, top_k, evidence, h))
        return out

    def retrieve(self, text: str, subject: str | None = None, n_docs: int | None = None) -> list[int]:
        """Indices of the documents searched for a question (title shortcut, else TF-IDF top n_docs)."""
        return select_documents(self.store, self.index, text, subject, int(n_docs or self.hparams["n_docs"]))

    def candidates(self, docs: list[int]) -> np.ndarray:
        """The entries of the given documents (embedding them first in a lazy datastore)."""
        if self.store.lazy:
            self.store.embed(docs, self.encoder)
        return candidates(self.store.document_ranges(docs))

    def _predict_one(
        self,
        text: str,
        subject: str | None,
        p_bert: np.ndarray,
        state: np.ndarray,
        top_k: int,
        n_evidence: int,
        h: dict,
    ) -> Prediction:
        docs = self.retrieve(text, subject, h["n_docs"])
        found = self.candidates(docs)  # first: in a lazy datastore this embeds, and the key memmap grows
        entries, dist = nearest(self.store.keys, found, state, int(h["k"]))
        values = np.asarray(self.store.values[entries]) if len(entries) else np.zeros(0, np.int32)
        p_knn = knn_distribution(values, dist, h["temperature"], len(p_bert)) if len(entries) else None
        p = interpolate(p_bert.astype(np.float64), p_knn, h["lam"])
        tok = self.encoder.tokenizer
        knn_top = ranked(p_knn, tok, top_k)
        return Prediction(
            question=text,
            subject=subject,
            documents=self.store.titles(docs),
            bert=ranked(p_bert, tok, top_k),
            knn=knn_top,
            bert_knn=ranked(p, tok, top_k),
            evidence=self._evidence(knn_top, entries, values, dist, n_evidence, h["temperature"]),
            p_bert=p_bert,
            p_knn=p_knn,
            p=p,
        )

    def _evidence(
        self, words, entries, values, dist, n_evidence: int, temperature: float
    ) -> dict[str, list[Neighbour]]:
        """For each kNN answer, its nearest `n_evidence` neighbours with their sentences."""
        if not words:
            return {}
        weights = neighbour_weights(dist, temperature)
        ids = self.encoder.tokenizer.convert_tokens_to_ids([w.token for w in words])
        out = {}
        for word, token_id in zip(words, ids):
            picks = np.flatnonzero(values == token_id)[:n_evidence]
            found = self.store.evidence(entries[picks].tolist())
            out[word.token] = [
                Neighbour(word.token, float(dist[i]), float(weights[i]), e.doc_id, e.title, e.sentence, e.span)
                for i, e in zip(picks, found)
            ]
        return out


def set_threads(n: int) -> None:
    """Give PyTorch n threads and numpy's BLAS one: two busy pools on few cores stall each other."""
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(1, user_api="blas")
