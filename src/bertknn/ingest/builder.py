"""Builder stage: a corpus into a datastore, as stages over batches (SPEC §1).

documents -> records (sentences, digest: `record`) -> registered in the store -> masked contexts (`contexts`, CPU)
-> keys (`keys`, the model) -> appended to the store (`DatastoreWriter.append`). Each stage is a plain function of its
batch, so the same stages can run elsewhere; the store (datastore.py) knows nothing of the model.
"""

from __future__ import annotations

import hashlib
import logging
import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bertknn.index import tfidf_files
from bertknn.ingest import evidence_encoding, workers
from bertknn.ingest.corpus import Corpus, open_corpus, record_located
from bertknn.model.encoder import Encoder
from bertknn.model.sentences import SENTENCE_MODEL
from bertknn.store.creation import copy_registration as copy_store
from bertknn.store.creation import create as create_store
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.evidence import FIELD
from bertknn.store.manifest import FORMAT, VERSION
from bertknn.store.records import Record
from bertknn.store.writers import open_writer
from bertknn.text import (
    SLOW_SPLITTERS,
    SPLITTER,
    CorpusError,
    Sentence,
    eta,
    tokenize_sentences,
)

if TYPE_CHECKING:
    import os

    from datasets import Dataset

KEY_WINDOW = 128  # tokens a key's context may have; a longer sentence is read in overlapping windows (text.py)
REGISTER_DOCS = 500  # documents registered per transaction by a build
CHUNK_ENTRIES = 4096  # about this many target words are embedded and committed together
CHARS_PER_WORD = 6  # a chunk's size is estimated from its characters: about one target word per 6 of them
LOG_EVERY_S = 10.0  # a progress line of embedding that no caller shows at most this often

log = logging.getLogger(__name__)


def contexts(encoder: Encoder, texts: list[str], whole_words: bool = True, names: bool = False) -> list[Sentence]:
    """Sentences tokenized once, with their targets (the masked contexts are made from these): whole words, or
    words of one token for a datastore of format 1; with `names`, multi-word names too (`text.names_of`)."""
    return tokenize_sentences(encoder.tokenizer, texts, min(KEY_WINDOW, encoder.max_length), whole_words, names)


def values(store: Datastore, encoder: Encoder, sentences: list[Sentence]) -> tuple[np.ndarray, list]:
    """The values of the targets of `sentences` (a word of one token: its vocabulary id; of several: its number in
    the store's lexicon) and the lexicon's new words, to be committed with them (`Datastore.word_values`)."""
    pieces = [p for s in sentences for p in s.target_pieces()]
    out = np.asarray([p[0] if len(p) == 1 else -1 for p in pieces], np.int32)
    longer = np.flatnonzero(out < 0)
    if not len(longer):
        return out, []
    decode = encoder.tokenizer.decode
    found, new = store.writer.word_values([(" ".join(map(str, pieces[i])), decode(pieces[i]).strip()) for i in longer])
    out[longer] = found
    return out, new


def keys(
    encoder: Encoder, sentences: list[Sentence], pack: int, int8_keys: bool, token_budget: int | None
) -> np.ndarray:
    """Layer-L keys of every target of `sentences`, in order (`Encoder.embed`)."""
    return encoder.embed(sentences, token_budget, pack, int8_keys)


def manifest(
    encoder: Encoder,
    corpus: dict | None,
    pack: int,
    int8_keys: bool,
    splitter: str = SPLITTER,
    whole_words: bool = True,
    names: bool = False,
    evidence_vectors: bool = True,
) -> dict:
    """The manifest of a new datastore for `encoder` (model, weights hash, layer, width, key options, the sentence
    splitter its documents are split with, the sentence encoder of its evidence vectors); without `whole_words`, of
    format 1 (the paper's targets: words of one token); with `names`, multi-word names are targets too; without
    `evidence_vectors`, none (the paper's datastore: its questions are answered without sentence weights)."""
    if names and (pack > 1 or not whole_words):
        raise DatastoreError("multi-word names need whole words and one target per pass: drop --pack or --names")
    words = {"words_from": encoder.vocab_size, "names": names} if whole_words else {}  # longer words' values from
    return {
        "format": FORMAT,
        "version": VERSION if whole_words else 1,
        "model": encoder.name,
        "model_hash": encoder.weights_hash,
        "layer": encoder.layer,
        "dim": encoder.dim,
        "pack": pack,
        "int8": int8_keys,
        "key_dtype": encoder.runtime.dtype,
        "splitter": splitter,
        "dtype": "float16",
        "value_dtype": "int32",
        "status": "building",
        "corpus": corpus,
        **(
            {FIELD: SENTENCE_MODEL} if evidence_vectors else {}
        ),  # every entry's evidence texts get vectors (store/evidence.py)
        **words,
    }


def check_encoder(store: Datastore, encoder: Encoder) -> None:
    """Refuse a model or layer other than the one the store's keys were made with."""
    store.check_model(encoder.name, encoder.weights_hash, encoder.dim, encoder.layer)


def check_key_dtype(store: Datastore, encoder: Encoder) -> None:
    """Refuse to add keys computed in another precision than the store's (its keys would not be comparable)."""
    if encoder.runtime.dtype != store.manifest.key_dtype:
        raise DatastoreError(
            f"the keys of {store.path} were computed in {store.manifest.key_dtype}: embed its documents with --dtype "
            f"{store.manifest.key_dtype} (this model runs in {encoder.runtime.dtype})"
        )


def create(
    path: str | Path,
    encoder: Encoder,
    corpus: dict | None = None,
    pack: int = 1,
    int8_keys: bool = False,
    whole_words: bool = True,
    names: bool = False,
    evidence_vectors: bool = True,
) -> Datastore:
    """Create an empty datastore directory for `encoder` (or reopen it when it was made for the same model)."""
    path = Path(path)
    if not (path / "manifest.json").exists():
        made = manifest(
            encoder, corpus, pack, int8_keys, whole_words=whole_words, names=names, evidence_vectors=evidence_vectors
        )
        return create_store(path, made)
    store = Datastore(path)
    check_encoder(store, encoder)
    known = store.manifest.get("corpus") or {}
    if corpus and known and _identity(known) != _identity(corpus):
        if store.n_documents:
            raise DatastoreError(
                f"{path} holds a datastore of another corpus ({known.get('path')}); "
                "choose another --out directory or delete this one"
            )
        with open_writer(path) as writer:  # nothing was read from the other corpus: start over with this one
            writer.set_manifest(corpus=corpus)
        store.reopen_if_changed()
    if store.manifest.pack != pack:
        raise DatastoreError(
            f"{path} holds keys computed with pack={store.manifest.pack}; resume it with the same --pack, or choose "
            "another --out directory"
        )
    if store.manifest.int8_keys != int8_keys:
        have, flag = ("int8", "with --int8-keys") if store.manifest.int8_keys else ("float32", "without --int8-keys")
        raise DatastoreError(f"{path} holds {have} keys; resume it {flag}, or choose another --out directory")
    if (store.lexicon.whole_words, store.lexicon.names) != (whole_words, names):
        have = (
            ("whole words" + " and names" * store.lexicon.names)
            if store.lexicon.whole_words
            else "words of one token (format 1)"
        )
        raise DatastoreError(f"{path} holds {have}: resume it with the same targets, or choose another --out directory")
    return store


def _identity(corpus: dict) -> tuple:
    """What tells two corpora apart in a manifest: a file's sha256 or a dataset's fingerprint."""
    return corpus.get("sha256"), corpus.get("fingerprint")


def copy_registration(
    source: str | Path, path: str | Path, encoder: Encoder, pack: int = 1, int8_keys: bool = False
) -> Datastore:
    """A new, empty datastore for `encoder` at `path` with the documents, sentences and IR index of `source`."""
    with Datastore(source) as known:  # its sentences are copied: so is the splitter that made them
        made = manifest(encoder, known.manifest.get("corpus"), pack, int8_keys, known.manifest.splitter)
        listed = known.parts(tfidf_files.KIND)
        listed = tfidf_files.listing(known.path) if listed is None else listed
    return copy_store(source, path, made, {tfidf_files.KIND: listed}, tfidf_files.top_names(listed))


def embed(
    store: Datastore,
    docs: list[int],
    encoder: Encoder,
    chunk_entries: int = CHUNK_ENTRIES,
    token_budget: int | None = None,
    progress: Callable[[int], None] | None = None,
    prefetch: bool | None = None,
) -> int:
    """Embed the given documents that are not embedded yet; return how many entries were added.

    With `prefetch` (None: on a GPU), the next chunk is tokenized in a thread (the tokenizer releases the GIL)
    while this one embeds, so the device does not wait for the CPU between chunks.

    Documents are taken in index order and committed in chunks of whole documents that end once they hold about
    `chunk_entries` words; `progress(documents_done)` is called after each chunk. Without `progress` (a question to
    a lazy store embeds its documents on demand, and shows nothing of it) the progress is logged at INFO instead.
    `store` is a writer's own view (`writers.open_writer`), which commits each chunk.
    """
    todo = store.documents.pending(docs)
    if not todo:
        return 0
    check_key_dtype(store, encoder)
    with store.writer.commit():
        chunks: list[list[int]] = [[]]
        words = 0
        for doc in todo:
            if words >= chunk_entries:
                chunks.append([])
                words = 0
            chunks[-1].append(doc)
            words += store.documents.text_length(doc) // CHARS_PER_WORD
        added, done = 0, 0
        logged = None if progress else _log_progress(store, len(todo))
        if prefetch is None:
            prefetch = encoder.runtime.torch_device.type == "cuda"
        ahead = ThreadPoolExecutor(1) if prefetch else None
        try:
            prepared = _prepare(store, encoder, chunks[0], ahead)
            for i, chunk in enumerate(chunks):
                current = prepared
                if i + 1 < len(chunks):
                    prepared = _prepare(store, encoder, chunks[i + 1], ahead)
                added += _embed_chunk(store, chunk, *current(), encoder, token_budget)
                done += len(chunk)
                if progress:
                    progress(done)
                else:
                    logged(done, added)
        finally:
            if ahead:
                ahead.shutdown(cancel_futures=True)
        if added and store.manifest.get("status") != "building":
            finish(store)
    return added


def _log_progress(store: Datastore, total: int) -> Callable[[int, int], None]:
    """`report(documents, contexts)`: INFO lines on the `bertknn` logger while `total` documents of `store` are
    embedded, one first, then at most one each LOG_EVERY_S seconds, and one at the end (what, how fast, what is
    left), so that a long wait inside a question is seen in a log, a terminal or a service's output."""
    began = last = time.monotonic()
    log.info("embedding %s documents of %s before they are searched", f"{total:,}", store.path)

    def report(done: int, contexts: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < LOG_EVERY_S and done < total:
            return
        last, rate = now, done / max(now - began, 1e-9)
        left = f", {eta(total - done, rate)} left" if done < total else f" in {now - began:.1f} s"
        speed = f"{contexts / max(now - began, 1e-9):,.0f} contexts/s"
        log.info(
            "embedded %s of %s documents, %s contexts (%s%s)", f"{done:,}", f"{total:,}", f"{contexts:,}", speed, left
        )

    return report


def _prepare(
    store: Datastore, encoder: Encoder, docs: list[int], pool: ThreadPoolExecutor | None
) -> Callable[[], tuple[list, list[Sentence]]]:
    """The CPU stages of a chunk: its sentences (read here: SQLite stays in this thread) and their contexts,
    made in `pool` when there is one; returns a function that gives (rows, contexts) when they are ready."""
    rows = store.documents.sentences(docs)
    texts = [text for _, _, text in rows]
    if pool is None:
        return lambda: (rows, contexts(encoder, texts, store.lexicon.whole_words, store.lexicon.names))
    future = pool.submit(contexts, encoder, texts, store.lexicon.whole_words, store.lexicon.names)
    return lambda: (rows, future.result())


def _embed_chunk(
    store: Datastore, docs: list[int], rows: list, sentences: list[Sentence], encoder: Encoder, token_budget: int | None
) -> int:
    """The stages for whole documents: their sentences -> masked contexts -> keys (and, in a store with evidence
    vectors, the sentence encoder's vectors of their evidence texts: ingest/evidence_encoding.py) -> appended to the
    store."""
    found = keys(encoder, sentences, store.manifest.pack, store.manifest.int8_keys, token_budget)
    held, words = values(store, encoder, sentences)
    spans = [s.spans for s in sentences]
    said = evidence_encoding.chunk(store, rows, spans, encoder.runtime) if store.evidence.model else None
    return store.writer.append(docs, rows, found, held, spans, words, evidence=said)


def check_corpus(corpus: Corpus, progress: Callable[[str, int, int], None]) -> int:
    """Read every document of `corpus` once, so a bad one, or an id given twice, fails before anything is written
    (a distributed build's shards could not see an id of another shard); return their number.

    Ids are kept as 8-byte hashes, not as strings, so memory stays small at any corpus size; a hash seen twice is
    looked up in a second read (`_refuse_duplicates`). Where the format counts its documents cheaply
    (`Corpus.count`), this reports phase "checking" to `progress`.
    """
    total = corpus.count()
    hashes = array("Q")
    done = 0
    for done, doc in enumerate(corpus, 1):
        hashes.append(_id_hash(doc.id))
        if total and (done % REGISTER_DOCS == 0 or done == total):
            progress("checking", done, total)
    values, counts = np.unique(np.frombuffer(hashes, np.uint64), return_counts=True)
    if (counts > 1).any():
        _refuse_duplicates(corpus, set(values[counts > 1].tolist()))
    return done


def _id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _refuse_duplicates(corpus: Corpus, suspects: set[int]) -> None:
    """CorpusError naming where an id of `corpus` is given the second time, and the first, when one is: ids whose
    hash is among `suspects` are compared whole (distinct ids may share a hash)."""
    first: dict[str, str] = {}
    for where, doc in corpus.located():
        if _id_hash(doc.id) in suspects:
            if doc.id in first:
                raise CorpusError(f"{where}: duplicate document id {doc.id!r} (given first at {first[doc.id]})")
            first[doc.id] = where


def _register(store: Datastore, chunk: list[tuple[str, Record]], redirects: list[tuple[str, str]] = ()) -> None:
    """Register whole documents (and the `redirects` read with them: aliases of their targets) in one transaction;
    CorpusError naming where a document was read when its id is taken (by a registered document or one before it in
    `chunk`): the store's index finds it, not a set in memory."""
    taken = set(store.documents.states([rec.id for _, rec in chunk]))
    for where, rec in chunk:
        if rec.id in taken:
            raise CorpusError(f"{where}: duplicate document id {rec.id!r}")
        taken.add(rec.id)
    store.writer.register([rec for _, rec in chunk], redirects=redirects)


def build(
    corpus: str | os.PathLike[str] | Corpus | Dataset,
    out: str | Path,
    encoder: Encoder,
    lazy: bool = False,
    pack: int = 1,
    int8_keys: bool = False,
    chunk_entries: int = CHUNK_ENTRIES,
    token_budget: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    n_workers: int = 0,
    whole_words: bool = True,
    names: bool = False,
    evidence_vectors: bool = True,
) -> Datastore:
    """Build (or resume building) the datastore of a corpus: JSONL, Parquet, DrQA's docs.db, a Wikipedia XML dump or
    a datasets.Dataset (`corpus.open_corpus`).

    Documents are first registered (text and sentences, REGISTER_DOCS per transaction), then embedded in chunks
    (`embed`); with `lazy`, embedding is left for later and done per document on demand. `pack` > 1 masks that many
    targets per pass and `int8_keys` runs the encoder quantised (`Encoder.embed`); without `whole_words` only words of
    one token are stored (format 1, the paper's targets); with `names`, multi-word names too (`text.names_of`);
    without `evidence_vectors`, none (ingest/evidence_encoding.py: the sentence weights read them); the
    manifest records them all: a resume with others is refused, and later embedding (lazy, `add`) follows them.
    `progress(phase, done, total)` reports the phases ("checking" where the format counts its documents from
    metadata, "reading", "embedding").
    Sentences are split in `n_workers` processes (0: every core for a corpus of `workers.PARALLEL_FROM`+ documents)
    when the store's splitter is slow (pysbd: `text.SLOW_SPLITTERS`); sentencex splits faster in this process than a
    document is sent to a worker (bench/README.md). IR features are hashed in `n_workers` processes.

    Every format is read in full once first (`check_corpus`), so a malformed document fails before anything is
    written: that read costs little beside registering (sentence splitting), while a bad row found halfway through
    registration would cost the work so far, since the corrected corpus has another fingerprint and cannot resume
    the store. That read refuses a duplicate id too, so a refused corpus leaves `out` as it was; the store's unique
    index still guards every registration.
    A resumed build gives exactly the entries of an uninterrupted one.
    """
    source = open_corpus(corpus)
    report = progress or (lambda phase, done, total: None)
    n_docs = check_corpus(source, report)
    store = create(out, encoder, source.info(n_docs), pack, int8_keys, whole_words, names, evidence_vectors)
    with open_writer(out) as writer, writer.commit():
        written = writer.store
        _register_all(written, source, n_docs, report, n_workers)
        if not lazy:
            todo = written.documents.pending()
            done = n_docs - len(todo)
            report("embedding", done, n_docs)
            embed(written, todo, encoder, chunk_entries, token_budget, lambda d: report("embedding", done + d, n_docs))
        finish(written)
    store.reopen_if_changed()
    return store


def require_built(store: Datastore) -> None:
    """DatastoreError unless the store's build finished (every document embedded, or registered for a lazy one)."""
    if not (store.manifest.complete or store.manifest.lazy):
        raise DatastoreError(f"the datastore at {store.path} is incomplete: rerun `bertknn build` to finish it")


def finish(store: Datastore) -> None:
    """Record in the manifest what a build made: documents, how many are embedded ("complete" when all), entries."""
    embedded = store.n_documents - len(store.documents.pending())
    status = "complete" if embedded == store.n_documents else "lazy"
    store.writer.set_manifest(status=status, documents=store.n_documents, embedded=embedded, entries=store.size)


def _register_all(
    store: Datastore, source: Corpus, n_docs: int, report: Callable[[str, int, int], None], n_workers: int
) -> None:
    """Register the documents of `source` the store does not hold yet (REGISTER_DOCS per transaction)."""
    report("reading", store.n_documents, n_docs)
    chunk: list[tuple[str, Record]] = []
    todo = islice(source.located(), store.n_documents, None)
    processes = workers.count(n_workers, n_docs) if store.manifest.splitter in SLOW_SPLITTERS else 1
    recorded = workers.ordered_map(partial(record_located, splitter=store.manifest.splitter), todo, processes)
    for i, (where, rec) in enumerate(recorded, store.n_documents):
        chunk.append((where, rec))
        if len(chunk) == REGISTER_DOCS or i == n_docs - 1:
            _register(store, chunk, source.take_redirects())
            chunk = []
            report("reading", store.n_documents, n_docs)
    if redirects := source.take_redirects():  # those of the pages after the last article
        _register(store, [], redirects)


def register(corpus: str | Path, out: str | Path, manifest: dict) -> Datastore:
    """Register (or go on registering) a corpus into a datastore whose manifest is given, embedding nothing: the
    CPU half of `build`, for a worker that has no model (a shard of a distributed build). `finish` records it."""
    source = open_corpus(corpus)
    n_docs = check_corpus(source, lambda phase, done, total: None)
    path = Path(out)
    store = Datastore(path) if (path / "manifest.json").exists() else create_store(path, manifest)
    with open_writer(path) as writer, writer.commit():
        _register_all(writer.store, source, n_docs, lambda phase, done, total: None, 1)
        finish(writer.store)
    store.reopen_if_changed()
    return store
