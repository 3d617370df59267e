"""BERT-kNN end to end: the user-facing `BertKNN` (load or build, then `predict`), in the spirit of HF pipelines."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bertknn.index import faiss_index
from bertknn.index.faiss_index import FaissIndex
from bertknn.index.retrieval import TfidfIndex
from bertknn.ingest import builder
from bertknn.ingest.corpus import Corpus
from bertknn.ingest.ingester import Writer
from bertknn.model.default_model import DEFAULT_MODEL
from bertknn.model.encoder import Encoder, QuestionError
from bertknn.model.runtime import Runtime
from bertknn.model.sentences import SCORED_WORDS, SentenceMatch
from bertknn.query import sentence_weights
from bertknn.query.combine import calibrate, confident_lam, interpolate
from bertknn.query.knn import vote
from bertknn.query.linking import linked
from bertknn.query.prediction import Forwarded, Prediction, Query, evidence_shown, ranked, superseded
from bertknn.query.search import DocumentSearch, Neighbours, RemoteShards, Search, searcher
from bertknn.query.settings import Settings
from bertknn.query.words import Words, lexicon, scored
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.shards import open_store
from bertknn.text import Document, unicode_error

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)


class BertKNN:
    """A masked LM plus a datastore: `predict("Dante was born in [MASK].", subject="Dante")`.

    Settings (n_docs, k, temperature, lam, retrieval, ...: `bertknn.query.settings.Settings`) are bertknn's defaults
    (`settings.DEFAULT`; the paper's: `settings.PAPER`) unless `bertknn tune` stored tuned values with the datastore;
    `settings`, when given, replaces both, and keyword arguments given here (not None) replace single values. The
    layer is the datastore's.

    It reads its datastore; writes (adds, removes, a lazy store's on-demand embedding, indexing documents the IR
    index lacks) go through `writer`, the writer side that `load` and `build` supply. Without one nothing is written.
    """

    def __init__(
        self,
        encoder: Encoder,
        store: Datastore,
        index: TfidfIndex | None = None,
        settings: Settings | None = None,
        writer: Writer | None = None,
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
        builder.require_built(store)
        builder.check_encoder(store, encoder)
        self.encoder, self.store = encoder, store
        self.sentence_match = SentenceMatch(encoder.runtime, stored=store.evidence)  # the store's evidence vectors
        self._told_no_vectors = False
        self.settings = self._within_store(settings.replace(**hparams))
        self.writer = writer  # the writer side: None for a reader that never writes
        self.index = index or self._load_index()
        self._faiss_stat: tuple | None = None  # (size, mtime) of the FAISS files when they were loaded
        self.remote_shards: RemoteShards | None = None  # `serve_shards_on`: the shards searched elsewhere
        self._load_faiss()
        self._version = store.version  # the store's state that index and faiss were loaded at

    def close(self) -> None:
        """Let the writer side go (the writer lock: another process may write then) and close the reader."""
        if self.writer is not None:
            self.writer.close()
        self.store.close()

    def writes(self, what: str) -> Writer:
        """The writer side, for `what` (DatastoreError when this `BertKNN` only reads)."""
        if self.writer is None:
            raise DatastoreError(
                f"{what} writes to {self.store.path}, and this BertKNN only reads it: open it with "
                "`BertKNN.load(path)` (not read_only), or give `writer=Writer(store, encoder)`"
            )
        return self.writer

    def _load_index(self) -> TfidfIndex:
        """The IR index as it is on disk, extended (by the writer side) only when it lacks documents that are live;
        documents being added by another process are hidden until published, so a reader never waits for that
        writer. A sharded datastore's is its shards' indexes read as one."""
        store = self.store
        try:
            index = TfidfIndex.load(store)
        except FileNotFoundError:
            return self.writes("indexing its documents (it has no IR index)").index_documents()
        if index.n_docs >= store.documents.live_end():
            return index
        if self.writer is None:
            log.warning("%s: the IR index lacks documents %d and on; they are not retrieved", store.path, index.n_docs)
            return index
        return self.writer.index_documents()

    @property
    def hparams(self) -> dict:
        """The numeric settings (n_docs, k, temperature, lam) as a dict."""
        return self.settings.hparams

    def _load_faiss(self) -> None:
        """(Re)open the FAISS index when its file changed; a damaged one is set aside with its error, so IR
        questions still work."""
        stat = [FaissIndex.disk_state(shard) for shard in self.store.shards]
        if stat == self._faiss_stat and not self.store.faiss_damage:
            return
        try:
            loader = self.remote_shards.faiss if self.remote_shards else faiss_index.load
            self.faiss, self.faiss_error = loader(self.store), None
        except DatastoreError as err:
            self.faiss, self.faiss_error = None, err
        self._faiss_stat = stat

    def serve_shards_on(self, shards: RemoteShards) -> None:
        """Search a sharded datastore's shards through `shards` from now on (`ray_serve.ServedShards`: Ray Serve
        deployments on the machines that hold them): the IR path's exact kNN and the FAISS index."""
        self.remote_shards, self._faiss_stat = shards, None
        self._load_faiss()

    def refresh(self) -> bool:
        """Move the reader to the latest commit (documents another process added or removed, a FAISS index built):
        until then questions are answered from the commit it holds, this object's own writes taken in at once; True
        if anything changed. Cheap when nothing did (one SQLite pragma and one stat): a service calls it per request.
        """
        self.store.reopen_if_changed()
        if self.store.version == self._version:
            return False
        self.index = self._load_index()
        self._load_faiss()
        self._version = self.store.version
        return True

    @classmethod
    def load(
        cls,
        datastore: str | Path,
        model: str | None = None,
        layer: int | None = None,
        runtime: Runtime | str = "torch",
        read_only: bool = False,
        **hparams: float,
    ) -> BertKNN:
        """Open a datastore and load the model it was built with (or `model`, which must have the same weights).

        `runtime` (a `Runtime` or a `--backend` name): where and how the model runs (`Encoder`). With `read_only`,
        no writer side is supplied: nothing is ever written (adds, removes and a lazy store's embedding refused).
        """
        store = open_store(datastore)
        encoder = Encoder.load(
            model or store.manifest["model"], store.manifest.layer if layer is None else layer, runtime
        )
        writer = None if read_only else Writer(store, encoder)  # the model and layer are checked against the store's
        return cls(encoder, store, writer=writer, **hparams)

    @classmethod
    def build(
        cls,
        corpus: str | Path | Corpus | Dataset,
        out: str | Path,
        model: str | Encoder = DEFAULT_MODEL,
        layer: int | None = None,
        lazy: bool = False,
        pack: int = 1,
        progress: Callable[[str, int, int], None] | None = None,
        runtime: Runtime | str = "torch",
        int8_keys: bool = False,
        n_workers: int = 0,
        whole_words: bool = True,
        names: bool = False,
        key_codec: str = "float16",
        evidence_vectors: bool = True,
        **hparams: float,
    ) -> BertKNN:
        """Embed a corpus into a datastore at `out` (resuming an interrupted build), index it, and load it.

        `corpus`: a path (JSONL, Parquet file or directory, DrQA docs.db, Wikipedia XML dump: `corpus.open_corpus`),
        a `datasets.Dataset` with id, title and text columns, or a `Corpus`.

        With `lazy`, documents are only registered and indexed; each is embedded the first time retrieval picks it.
        `pack` > 1 masks that many non-adjacent targets per pass, `int8_keys` computes keys with the encoder quantised
        to int8: both faster, approximate keys (`Encoder.embed`). Without `whole_words`, only words of one token are
        stored (format 1: the paper's targets; an answer of several wordpieces is then never a kNN answer). With
        `names`, runs of capitalised words ("Port Elsmere") are stored as one answer too, besides their words.
        `n_workers`: processes that split sentences and hash IR features (0: every core for a large corpus,
        `workers.count`). `key_codec` (a FAISS factory string: SQ8, PQ96, ...) stores the keys compressed
        (`Writer.convert_keys`). Without `evidence_vectors`, none are stored (the paper's datastore; its
        questions are answered without sentence weights).
        """
        encoder = model if isinstance(model, Encoder) else Encoder.load(model, layer, runtime)
        options = {"lazy": lazy, "pack": pack, "int8_keys": int8_keys, "whole_words": whole_words, "names": names}
        options["evidence_vectors"] = evidence_vectors
        writer = Writer.build(corpus, out, encoder, n_workers, progress, key_codec, **options)
        return cls(encoder, writer.store, writer.index, writer=writer, **hparams)

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

    def __call__(
        self, inputs: str | list[str], top_k: int = 5, subject: str | None = None, **options
    ) -> list[dict] | list[list[dict]]:
        """BERT-kNN's answers as transformers' `pipeline("fill-mask")` gives them: for one question a list of
        {score, token, token_str, sequence}, for a list of questions one such list each. `options` as in `predict`."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        found = self.predict_batch(texts, [subject] * len(texts), top_k, evidence=0, **options)
        answers = [p.fill_mask(self.encoder.tokenizer) for p in found]
        return answers[0] if isinstance(inputs, str) else answers

    def predict_batch(
        self,
        texts: Sequence[str] | Sequence[Query],
        subjects: Sequence[str | None] | None = None,
        top_k: int = 10,
        evidence: int = 3,
        batch_size: int = 256,
        retrieval: str | None = None,
        settings: Settings | None = None,
        **hparams: float,
    ) -> list[Prediction]:
        """Predict many questions, `batch_size` at a time; options as in `predict`.

        The stages of transformers' fill-mask pipeline: options checked once, questions checked and encoded once
        (`preprocess`; `texts` may be its output), then per batch the model (sorted by length), the search, and
        the combined answer (`postprocess`).
        """
        s = self._options(top_k, evidence, retrieval, settings, hparams)
        queries = texts if texts and isinstance(texts[0], Query) else self.preprocess(texts, subjects)
        out = []
        for start in range(0, len(queries), batch_size):
            with self.store.snapshot():  # the batch reads one commit: the reader's (`refresh` moves it on)
                search = self.search(s.retrieval)
                forwarded = self._forward(self._linked(queries[start : start + batch_size], s), search, s)
                with self.store.sqlite_errors():  # a damaged page met by a question: an error naming the file
                    out += [self.postprocess(f, top_k, evidence, s) for f in forwarded]
        return out

    def _linked(self, batch: Sequence[Query], s: Settings) -> list[Query]:
        """The questions, those asked without a subject given the one their text names (`linking.link`), with `link`."""
        with self.store.sqlite_errors():
            return linked(self.store, self.index, batch) if s.link else list(batch)

    def _forward(self, batch: Sequence[Query], search: Search, s: Settings) -> list[Forwarded]:
        """The questions' model pass, search and vote: the LM's distribution and the mask's state (one pass for the
        batch), the neighbours, the words they hold and the vote over them (`_voted`)."""
        self._question_texts_ahead(search, batch, s)
        probs, states = self.encoder.query_ids([(q.ids, q.mask) for q in batch])
        with self.store.sqlite_errors():
            found = search.batch_search([q.text for q in batch], [q.subject for q in batch], states, s)
            words, votes = self._voted(found, [self.words(f) for f in found], probs, [q.text for q in batch], s)
        return [Forwarded(*row) for row in zip(batch, probs, found, words, votes)]

    def _voted(
        self, found: list[Neighbours], words: list[Words], probs: Sequence[np.ndarray], texts: list[str], s: Settings
    ) -> tuple[list[Words], list[np.ndarray]]:
        """The vote of each question's neighbours over its words, weighed by the neighbours' sentences where a
        question's text is given (`sentence_weights.weights`: the words of several tokens among the vote's best are
        scored by the LM first), and the words with the LM's scores of those of several tokens the mixture needs
        (`lm_words`), all from the questions' one pass (`probs`, `words.scored`). The one vote path: `predict` and
        `distributions` alike."""
        votes = [vote(self.store, f, s, w) for f, w in zip(found, words)]
        if s.sentence_temperature and all(texts):  # the LM's choice of words needs its scores of those of several
            words = scored(words, [w.candidates(v, SCORED_WORDS) for w, v in zip(words, votes)], probs)
            weights = sentence_weights.weights(self.store, self.sentence_match, texts, found, words, votes, s, probs)
            votes = [vote(self.store, f, s, w, lw) for f, w, lw in zip(found, words, weights)]
        return scored(words, [w.candidates(v, s.lm_words) for w, v in zip(words, votes)], probs), votes

    def postprocess(self, forwarded: Forwarded, top_k: int, n_evidence: int, s: Settings) -> Prediction:
        """The answer to one question: the LM's distribution and the kNN's vote interpolated (`distributions`) and
        ranked, with the evidence and, where newer documents outvoted older ones, what those said."""
        f, tok = forwarded, self.encoder.tokenizer
        p = self.distributions(f.p_bert, f.found, s, f.words, f.vote, f.query.text)[1]
        knn_top = ranked(f.vote, tok, top_k, f.words)
        older = n_evidence and s.conflicts == "newest"
        return Prediction(
            question=f.query.text,
            subject=f.query.subject,
            documents=self.store.documents.titles(f.found.documents),
            retrieval=s.retrieval,
            bert=ranked(f.p_bert, tok, top_k),
            knn=knn_top,
            bert_knn=ranked(p, tok, top_k, f.words),
            evidence=evidence_shown(self.store, knn_top, f.found, n_evidence, s.temperature),
            p_bert=f.words.lm(f.p_bert),
            p_knn=f.vote,
            p=p,
            neighbours=f.found,
            input_ids=f.query.ids,
            mask_index=f.query.mask,
            superseded=superseded(self.store, tok, f.found, f.words, s.temperature) if older else [],
            linked=f.query.link,
        )

    def _question_texts_ahead(self, search: Search, batch: Sequence[Query], s: Settings) -> None:
        """With sentence weights, where the search knows the questions' documents before their states
        (`Search.ahead`), start embedding the questions' texts (`SentenceMatch.embed_ahead`), their documents' names
        out, so that it runs beside the LM's pass and the search. A question whose neighbours come from fewer
        documents may read another text: it is embedded with its evidence, as without this."""
        if not s.sentence_temperature:
            return
        with self.store.sqlite_errors():
            docs = search.ahead([q.text for q in batch], [q.subject for q in batch], s)
            if docs is None:
                return
            ids = sorted({d for chosen in docs for d in chosen})
            titles = dict(zip(ids, self.store.documents.titles(ids)))
        match = self.sentence_match  # a question without documents has no neighbours to weigh
        match.embed_ahead([match.question_text(q.text, [titles[d] for d in c]) for q, c in zip(batch, docs) if c])

    def words(self, found: Neighbours) -> Words:
        """The words a question's answers are ranked over, `found`'s words of several tokens not yet scored
        (`words.lexicon`)."""
        return lexicon(self.store, self.encoder.vocab_size, found)

    def _options(
        self, top_k: int, evidence: int, retrieval: str | None, settings: Settings | None, hparams
    ) -> Settings:
        """This call's settings, with `top_k` and `evidence` checked (ValueError)."""
        s = (settings or self.settings).replace(retrieval=retrieval, **hparams)
        vocab = self.encoder.vocab_size
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= vocab:
            raise ValueError(f"top_k must be an integer from 1 to the vocabulary size {vocab} (got {top_k!r})")
        if isinstance(evidence, bool) or not isinstance(evidence, (int, np.integer)) or evidence < 0:
            raise ValueError(f"evidence must be an integer >= 0 (got {evidence!r})")
        return self._within_store(s)

    def _within_store(self, s: Settings) -> Settings:
        """`s`, without sentence weights where the datastore has no evidence vectors (made before them, or built
        without): said once, in a warning that names the command that stores them."""
        if not s.sentence_temperature or self.store.evidence.model:
            return s
        if not self._told_no_vectors:
            self._told_no_vectors = True
            log.warning(
                "%s has no evidence vectors: its questions are answered without sentence weights until `bertknn "
                "sentences %s` stores them",
                self.store.path,
                self.store.path,
            )
        return s.replace(sentence_temperature=0.0)

    def preprocess(self, texts: Sequence[str], subjects: Sequence[str | None] | None = None) -> list[Query]:
        """Questions checked and encoded for the model, once: QuestionError names the first bad question or
        subject (not a cloze question with one [MASK], a [MASK] past the model's input length, invalid Unicode)."""
        subjects = list(subjects) if subjects is not None else [None] * len(texts)
        if len(subjects) != len(texts):
            raise ValueError(f"{len(texts)} questions but {len(subjects)} subjects")
        queries = []
        for i, (text, subject) in enumerate(zip(texts, subjects)):
            try:
                ids, mask = self.encoder.question_ids(text)
            except QuestionError as err:
                raise QuestionError(f"question {i + 1} ({text!r}): {err}", index=i) from err
            error = unicode_error(subject) if subject is not None else None
            if error:
                raise QuestionError(f"subject {i + 1} ({subject!r}): the subject is {error}", index=i)
            queries.append(Query(text, subject, ids, mask))
        return queries

    def embed_retrieved(
        self, queries: Sequence[Query], n_docs: int, progress: Callable[[int, int], None] | None = None
    ) -> tuple[list[list[int]], int]:
        """The documents IR picks for each question (its first `n_docs`), and how many of them were embedded now: in a
        lazy datastore those not embedded yet are, in one run, `progress(done, total)` counting documents, so that a
        long wait is seen rather than spent inside a question."""
        search, queries = self.search("ir"), self._linked(queries, self.settings)
        docs = [search.documents(q.text, q.subject, n_docs) for q in queries]
        return docs, self._embed([d for chosen in docs for d in chosen], progress)

    def search(self, retrieval: str = "ir") -> Search:
        """The searcher of a retrieval setting ("ir", "faiss" or "ir+faiss"), over the datastore as loaded now."""
        embed = self._embed if self.store.manifest.lazy else None
        documents = DocumentSearch(self.store, self.index, embed, self.remote_shards)
        return searcher(documents, retrieval, self.faiss, self.faiss_error)

    def _embed(self, docs: list[int], progress: Callable[[int, int], None] | None = None) -> int:
        """Those of `docs` that a lazy datastore holds no keys for yet, embedded by the writer side in one run
        (`progress(done, total)` counting documents; without it the writer logs); how many they were."""
        pending = self.store.documents.pending(sorted(set(docs)))
        if pending:
            writer = self.writes("embedding the documents questions retrieve (a lazy datastore)")
            if progress is not None:  # else the writer logs its progress
                progress(0, len(pending))
            writer.embed(pending, progress=progress and (lambda n: progress(n, len(pending))))
        return len(pending)

    def distributions(
        self,
        p_bert: np.ndarray,
        found: Neighbours,
        s: Settings,
        words: Words | None = None,
        p_knn: np.ndarray | None = None,
        question: str = "",
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """p_kNN and the interpolated p of one question, from `p_bert`, the LM's distribution over the vocabulary, as
        the settings say: a constant or an adaptive lambda (`lam_by`), the linear or the log-linear mixture
        (`mixture`; the latter with `word_bonus` for words of several tokens that `question` does not contain). Given
        `p_knn` (with the `words` it is over), those are mixed; else the vote is made as `predict` makes it (`_voted`,
        over `words`, default `words(found)`: with `question`, the neighbours' sentences weighed against it). The
        result is calibrated (`combine.calibrate`: `confidence_temperature`, `lm_floor`)."""
        if not len(found.entries):
            return None, p_bert.astype(np.float64)
        if p_knn is None:
            (words,), (p_knn,) = self._voted([found], [words or self.words(found)], [p_bert], [question], s)
        words = words or self.words(found)
        p_bert = words.lm(p_bert)
        lam = confident_lam(p_knn, s.lam, len(found.entries)) if s.lam_by == "entropy" else s.lam
        p_lm = p_bert.astype(np.float64)
        if s.mixture == "linear":
            p = interpolate(p_lm, p_knn, lam, s.mixture)
        else:
            held, prior = words.unscored_dropped(p_knn), words.prior(s.word_bonus, question)
            p = interpolate(p_lm, held, lam, s.mixture, prior)
        return p_knn, calibrate(p, p_lm, s.confidence_temperature, s.lm_floor)

    def add_documents(
        self,
        docs: list[dict | Document],
        skip_existing: bool = False,
        progress=None,
        wait: float | None = None,
        replace: bool = False,
    ) -> int:
        """`Writer.add_documents` with this model, then taken in here: the documents are searchable at once; with
        `replace`, documents whose ids are live take the old ones' places in one transaction."""
        writer = self.writes("adding documents")
        added = writer.add_documents(docs, skip_existing, progress, wait, replace)
        self._adopt(writer)
        return added

    def _adopt(self, writer: Writer) -> None:
        """Read the indexes as `writer` just left them (what it wrote is what this reader would load)."""
        if isinstance(self.faiss, FaissIndex) and writer.faiss is not None and self.remote_shards is None:
            self.faiss, self._faiss_stat = writer.faiss, [FaissIndex.disk_state(self.store)]
        self.refresh()

    def remove_documents(self, ids: list[str], wait: float | None = None) -> tuple[list[str], list[str]]:
        """`Writer.remove_documents`: hide documents from every retrieval path, all in one transaction."""
        done = self.writes("removing documents").remove_documents(ids, wait)
        self.refresh()
        return done

    def remove_document(self, doc_id: str, wait: float | None = None) -> None:
        """`Writer.remove_document`: hide one document from every retrieval path."""
        self.writes("removing a document").remove_document(doc_id, wait)
        self.refresh()
