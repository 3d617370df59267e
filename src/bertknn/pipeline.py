"""BERT-kNN end to end: the user-facing `BertKNN` (load or build, then `predict`), in the spirit of HF pipelines."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from bertknn import builder, onnx_backend
from bertknn import datastore as ds
from bertknn.combine import Neighbour, Prediction, interpolate, ranked
from bertknn.datastore import Datastore, DatastoreError
from bertknn.default_model import DEFAULT_MODEL
from bertknn.encoder import Encoder, QuestionError
from bertknn.faiss_index import INDEX_FILE, SETTINGS_FILE, FaissIndex
from bertknn.knn import candidates, knn_distribution, nearest, neighbour_weights
from bertknn.retrieval import TfidfIndex, select_documents
from bertknn.settings import Settings
from bertknn.text import CorpusError, Document, parse_document, question_error, unicode_error


def _indexed(store: Datastore) -> int:
    """How many documents (from the first) the datastore's IR index covers."""
    try:
        return TfidfIndex.load(store.path).n_docs
    except FileNotFoundError:
        return 0


def ensure_index(store: Datastore, segment_docs: int = 5000) -> TfidfIndex:
    """The datastore's IR index, extended by segments of at most `segment_docs` for the documents it lacks.

    A new datastore's index is built the same way, segment by segment, so memory stays bounded by one segment. Only
    a writer extends it: this takes the datastore's writer lock when there is something to add.
    """
    if _indexed(store) < store.n_documents:
        with store.writing(wait=builder.LAZY_WAIT):
            first = _indexed(store)
            if first > store.n_documents:
                raise DatastoreError(f"the IR index of {store.path} covers {first} documents but the store has fewer")
            for start in range(first, store.n_documents, segment_docs):
                stop = min(start + segment_docs, store.n_documents)
                store.rewriting(*TfidfIndex.files(start))  # parts left by an interrupted run are written anew
                TfidfIndex.build(store.iter_document_texts(start, stop), start).save(store.path, start)
    return TfidfIndex.load(store.path)


def load_index(store: Datastore) -> TfidfIndex:
    """The IR index as it is on disk, extended (by a writer) only when it lacks documents that are live; documents
    being added by another process are hidden until published, so a reader never waits for that writer."""
    try:
        index = TfidfIndex.load(store.path)
    except FileNotFoundError:
        return ensure_index(store)
    live = store.db.execute("SELECT coalesce(max(idx) + 1, 0) FROM documents WHERE state = 'live'").fetchone()[0]
    return index if index.n_docs >= live else ensure_index(store)


class BertKNN:
    """A masked LM plus a datastore: `predict("Dante was born in [MASK].", subject="Dante")`.

    Settings (n_docs, k, temperature, lam, retrieval: `bertknn.settings.Settings`) are the paper's
    (`settings.PAPER`) unless `bertknn tune` stored tuned values with the datastore; `settings`, when given, replaces
    both, and keyword arguments given here (not None) replace single values. The layer is the datastore's.
    """

    def __init__(
        self,
        encoder: Encoder,
        store: Datastore,
        index: TfidfIndex | None = None,
        settings: Settings | None = None,
        **hparams: float,
    ) -> None:
        if settings is None:
            tuned = store.manifest.get("tuned", {}).get("hparams", {})  # set by `bertknn tune`
            try:
                settings = Settings.from_tuned(tuned)
            except (TypeError, ValueError) as err:
                raise DatastoreError(
                    f"{store.path / 'manifest.json'} holds bad tuned hyperparameters ({err}); rerun `bertknn tune` or "
                    "delete its 'tuned' field"
                ) from None
        self.settings = settings.replace(**hparams)
        if not (store.complete or store.lazy):
            raise DatastoreError(f"the datastore at {store.path} is incomplete: rerun `bertknn build` to finish it")
        builder.check_encoder(store, encoder)
        self.encoder, self.store = encoder, store
        self.index = index or load_index(store)
        self._faiss_stat: tuple | None = None  # (size, mtime) of the FAISS files when they were loaded
        self._load_faiss()
        self._version = store.version  # the store's state that index and faiss were loaded at

    @property
    def hparams(self) -> dict:
        """The numeric settings (n_docs, k, temperature, lam) as a dict."""
        return self.settings.hparams

    def _load_faiss(self) -> None:
        """(Re)open the FAISS index when its file changed; a damaged one is set aside with its error, so IR
        questions still work."""
        stat = ds.file_stat(self.store.path / INDEX_FILE), ds.file_stat(self.store.path / SETTINGS_FILE)
        if stat == self._faiss_stat and not self.store.faiss_damage:
            return
        try:
            self.faiss, self.faiss_error = FaissIndex.load(self.store), None
        except DatastoreError as err:
            self.faiss, self.faiss_error = None, err
        self._faiss_stat = stat

    def refresh(self) -> bool:
        """Take in what another process committed (documents added or removed, a FAISS index built); True if any.

        Cheap when nothing changed (one SQLite pragma and one stat), so a long-running service calls it per request.
        """
        self.store.reload()
        if self.store.version == self._version:
            return False
        self.index = load_index(self.store)
        self._load_faiss()
        self._version = self.store.version
        return True

    @classmethod
    def load(
        cls,
        datastore: str | Path,
        model: str | None = None,
        layer: int | None = None,
        backend: str = "torch",
        **hparams: float,
    ) -> BertKNN:
        """Open a datastore and load the model it was built with (or `model`, which must have the same weights).

        `backend` "onnx" runs the model in ONNX Runtime: the same numbers, faster on CPU (Encoder).
        """
        store = Datastore(datastore)
        if layer is not None and layer != store.layer:
            raise DatastoreError(f"the datastore at {store.path} holds layer-{store.layer} keys, not layer {layer}")
        return cls(Encoder.load(model or store.manifest["model"], store.layer, backend), store, **hparams)

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
        backend: str = "torch",
        int8: bool = False,
        **hparams: float,
    ) -> BertKNN:
        """Embed a JSONL corpus into a datastore at `out` (resuming an interrupted build), index it, and load it.

        With `lazy`, documents are only registered and indexed; each is embedded the first time retrieval picks it.
        `pack` > 1 masks that many non-adjacent targets per pass, `int8` computes keys with the encoder quantised to
        int8: both faster, approximate keys (`Encoder.embed`).
        """
        encoder = model if isinstance(model, Encoder) else Encoder.load(model, layer, backend)
        store = builder.build(corpus, out, encoder, lazy=lazy, pack=pack, int8=int8, progress=progress)
        return cls(encoder, store, ensure_index(store), **hparams)

    def predict(
        self,
        text: str,
        subject: str | None = None,
        top_k: int = 10,
        evidence: int = 3,
        retrieval: str | None = None,
        settings: Settings | None = None,
        **hparams: float,
    ) -> Prediction:
        """Predict the [MASK] of one cloze question; `subject` (knowledge-base questions) steers retrieval.

        `retrieval` picks where neighbours come from: "ir" (the paper, the default: the documents IR selects), "faiss"
        (the whole datastore through its FAISS index, `bertknn index`) or "ir+faiss" (both, merged by distance).
        `settings` (default: this BertKNN's) and the hyperparameters given here (n_docs, k, temperature, lam, not
        None) apply to this call only.
        """
        return self.predict_batch(
            [text], [subject], top_k, evidence, retrieval=retrieval, settings=settings, **hparams
        )[0]

    def predict_batch(
        self,
        texts: list[str],
        subjects: list[str | None] | None = None,
        top_k: int = 10,
        evidence: int = 3,
        batch_size: int = 256,
        retrieval: str | None = None,
        settings: Settings | None = None,
        **hparams: float,
    ) -> list[Prediction]:
        """Predict many questions, `batch_size` at a time (the encoder runs them sorted by length); options as in
        `predict`."""
        s = (settings or self.settings).replace(retrieval=retrieval, **hparams)
        if s.retrieval != "ir" and self.faiss is None:
            raise self.faiss_error or DatastoreError(
                f"{self.store.path} has no FAISS index: create one with `bertknn index {self.store.path}`"
            )
        subjects = list(subjects) if subjects is not None else [None] * len(texts)
        if len(subjects) != len(texts):
            raise ValueError(f"{len(texts)} questions but {len(subjects)} subjects")
        vocab = self.encoder.vocab_size
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= vocab:
            raise ValueError(f"top_k must be an integer from 1 to the vocabulary size {vocab} (got {top_k!r})")
        if isinstance(evidence, bool) or not isinstance(evidence, (int, np.integer)) or evidence < 0:
            raise ValueError(f"evidence must be an integer >= 0 (got {evidence!r})")
        for i, (text, subject) in enumerate(zip(texts, subjects)):
            error = question_error(text)
            if error:
                raise QuestionError(f"question {i + 1} ({text!r}): {error}")
            error = unicode_error(subject) if subject is not None else None
            if error:
                raise QuestionError(f"subject {i + 1} ({subject!r}): the subject is {error}")
        out = []
        for start in range(0, len(texts), batch_size):
            probs, states = self.encoder.query(texts[start : start + batch_size])
            with self.store.sqlite_errors():  # a damaged page met by a question: an error naming the file
                for j, (p_bert, state) in enumerate(zip(probs, states)):
                    question = (texts[start + j], subjects[start + j])
                    out.append(self._predict_one(*question, p_bert, state, top_k, evidence, s))
        return out

    def retrieve(self, text: str, subject: str | None = None, n_docs: int | None = None) -> list[int]:
        """Indices of the documents searched for a question (title shortcut, else TF-IDF top n_docs)."""
        return select_documents(self.store, self.index, text, subject, int(n_docs or self.settings.n_docs))

    def candidates(self, docs: list[int]) -> np.ndarray:
        """The entries of the given documents (embedding them first in a lazy datastore)."""
        if self.store.lazy:
            builder.embed(self.store, docs, self.encoder)
        return candidates(self.store.document_ranges(docs))

    def _predict_one(
        self,
        text: str,
        subject: str | None,
        p_bert: np.ndarray,
        state: np.ndarray,
        top_k: int,
        n_evidence: int,
        s: Settings,
    ) -> Prediction:
        docs, entries, dist = self._neighbours(text, subject, state, s)
        values = np.asarray(self.store.values[entries]) if len(entries) else np.zeros(0, np.int32)
        self._check_neighbours(entries, values, dist, len(p_bert))
        p_knn = knn_distribution(values, dist, s.temperature, len(p_bert)) if len(entries) else None
        p = interpolate(p_bert.astype(np.float64), p_knn, s.lam)
        tok = self.encoder.tokenizer
        knn_top = ranked(p_knn, tok, top_k)
        return Prediction(
            question=text,
            subject=subject,
            documents=self.store.titles(docs),
            retrieval=s.retrieval,
            bert=ranked(p_bert, tok, top_k),
            knn=knn_top,
            bert_knn=ranked(p, tok, top_k),
            evidence=self._evidence(knn_top, entries, values, dist, n_evidence, s.temperature),
            p_bert=p_bert,
            p_knn=p_knn,
            p=p,
        )

    def _check_neighbours(self, entries: np.ndarray, values: np.ndarray, dist: np.ndarray, vocab: int) -> None:
        """A damaged key (NaN) or value (outside the vocabulary) must never reach an answer."""
        bad = ~np.isfinite(dist) | (values < 0) | (values >= vocab)
        if bad.any():
            raise DatastoreError(
                f"{self.store.path} is damaged: entries {entries[bad][:5].tolist()} hold a non-finite key or a value "
                f"outside the model's vocabulary; `bertknn verify {self.store.path}` locates the damage"
            )

    def _neighbours(
        self, text: str, subject: str | None, state: np.ndarray, s: Settings
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """(documents searched, the k nearest entries, their squared distances) by the chosen retrieval path."""
        k, retrieval = int(s.k), s.retrieval
        docs = self.retrieve(text, subject, s.n_docs) if retrieval != "faiss" else []
        found = self.candidates(docs)  # first: in a lazy datastore this embeds, and the key memmap grows
        entries, dist = nearest(self.store.keys, found, state, k)
        if retrieval == "ir":
            return docs, entries, dist
        more, more_dist = self.faiss.search(state, k, self.store.hidden_documents())
        entries, first = np.unique(np.concatenate([entries, more]), return_index=True)
        dist = np.concatenate([dist, more_dist])[first]
        order = np.lexsort((entries, dist))[:k]
        entries, dist = entries[order], dist[order]
        if retrieval == "faiss":  # the documents the neighbours come from, nearest first
            owners = self.store.documents_of(entries).tolist()
            docs = list(dict.fromkeys(owners))
        return docs, entries, dist

    def add_documents(
        self, docs: list[dict | Document], skip_existing: bool = False, progress=None, wait: float | None = None
    ) -> int:
        """Embed and index new documents ({id, title, text}) without rebuilding anything; return contexts added.

        Under the datastore's writer lock, the documents are registered hidden, embedded (not in a lazy datastore:
        there on demand), given an IR index segment and appended to the FAISS index, then made live in one
        transaction: a crash at any point leaves the previous state queryable, and calling again completes the
        pending ones. Ids already live raise DatastoreError; with `skip_existing` the same document (same text) is
        skipped instead, while one with other text still raises. `wait`: seconds to wait for another writer (None:
        as `datastore.lock_wait` says, else 0).
        """
        parsed = [d if isinstance(d, Document) else parse_document(d, f"document {i + 1}") for i, d in enumerate(docs)]
        ids = [d.id for d in parsed]
        if len(set(ids)) != len(ids):
            raise CorpusError(
                f"duplicate document id(s) in the request: {sorted({i for i in ids if ids.count(i) > 1})}"
            )
        with self.store.writing(wait):
            self.refresh()
            live = [i for i, state in self.store.states(ids).items() if state == "live"]
            if live and not skip_existing:
                raise DatastoreError(f"document id(s) already in the datastore: {live[:5]}; remove them first")
            before = self.store.size
            self.store.stage([builder.record(d) for d in parsed])
            if not self.store.lazy:
                builder.embed(self.store, self.store.adding(), self.encoder, progress=progress)
            self.index = ensure_index(self.store)
            if self.faiss is not None:
                self.faiss.update()
            self.store.publish()
            embedded = self.store.n_documents - len(self.store.pending())
            self.store.set_manifest(documents=self.store.n_documents, embedded=embedded, entries=self.store.size)
        self._version = self.store.version  # index and faiss in memory are what this add wrote
        return self.store.size - before

    def remove_documents(self, ids: list[str], wait: float | None = None) -> tuple[list[str], list[str]]:
        """Hide documents from every retrieval path, all in one transaction: (removed now, removed before).
        An unknown id raises DatastoreError and nothing is removed; `wait` as in `add_documents`."""
        with self.store.writing(wait):
            return self.store.remove([str(i) for i in ids])

    def remove_document(self, doc_id: str, wait: float | None = None) -> None:
        """Hide one document from every retrieval path (DatastoreError for an id never held or removed before)."""
        removed, _ = self.remove_documents([doc_id], wait)
        if not removed:
            raise DatastoreError(f"document {doc_id!r} was removed before from {self.store.path}")

    def _evidence(
        self, words, entries, values, dist, n_evidence: int, temperature: float
    ) -> dict[str, list[Neighbour]]:
        """For each kNN answer, its nearest `n_evidence` neighbours with their sentences."""
        if not words:
            return {}
        weights = neighbour_weights(dist, temperature)
        ids = self.encoder.tokenizer.convert_tokens_to_ids([w.token for w in words])
        picks = [np.flatnonzero(values == token_id)[:n_evidence] for token_id in ids]
        found = iter(self.store.evidence(entries[np.concatenate(picks)].tolist()))  # one query for all words
        return {
            word.token: [
                Neighbour(word.token, float(dist[i]), float(weights[i]), e.doc_id, e.title, e.sentence, e.span)
                for i, e in zip(mine, islice(found, len(mine)))
            ]
            for word, mine in zip(words, picks)
        }


def set_threads(n: int, backend: str = "torch") -> None:
    """Give the model n threads and numpy's BLAS one: two busy pools on few cores stall each other.

    With an ONNX backend, ONNX Runtime gets the n threads and PyTorch (left with small array work: softmax, top-k)
    one, so that its OpenMP pool does not stall ONNX Runtime's (the time saved per question: bench/README.md).
    """
    from threadpoolctl import threadpool_limits

    onnx = backend != "torch"
    torch.set_num_threads(1 if onnx else n)
    onnx_backend.set_threads(n if onnx else None)
    threadpool_limits(1, user_api="blas")
