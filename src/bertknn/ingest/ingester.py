"""The write side of a datastore: `Writer` builds a corpus into it, keeps its IR index, embeds documents on demand,
and adds and removes documents. `BertKNN` (query.pipeline) only reads; the CLI, the service and the Ray build write
through a `Writer` (as Lucene's IndexWriter is apart from its searcher, and kNN-LM's saver from its reader).

A `Writer` opens the datastore's writer (`store.writers.open_writer`: its lock, one process writing at a time) at
its first write and keeps it until `close`; its reader (the `BertKNN`'s) is moved to each of its commits. A crash
leaves the last committed state queryable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bertknn.index import NPROBE, faiss_files, faiss_index, tfidf_files
from bertknn.index.faiss_files import AUTO
from bertknn.index.faiss_index import FaissIndex, ShardedFaiss
from bertknn.index.merging import merge_plan
from bertknn.index.retrieval import SEGMENT_DOCS, TfidfIndex, feature_array
from bertknn.index.tfidf_files import compact
from bertknn.ingest import builder, workers
from bertknn.ingest.corpus import Corpus, digest, record
from bertknn.ingest.repair import Repair
from bertknn.ingest.repair import repair as repair_datastore
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.store import atomic
from bertknn.store.codec import KeyCodec
from bertknn.store.datastore import CODEC, CODES, KEYS, Datastore, DatastoreError
from bertknn.store.lock import LAZY_WAIT_S
from bertknn.store.manifest import FLOAT16
from bertknn.store.protocol import Store
from bertknn.store.records import Part, Staged
from bertknn.store.shards import open_store
from bertknn.store.writer import DatastoreWriter
from bertknn.store.writers import StoreWriter, open_writer
from bertknn.text import CorpusError, Document, parse_document

if TYPE_CHECKING:
    from datasets import Dataset

CONVERT_CHUNK = 1 << 16  # keys encoded and appended at a time by `convert_keys`


class Writer:
    """What changes a datastore: `build`, `index_documents`, `embed`, `add_documents`, `remove_documents`, `repair`.

    `encoder` is the model the store was built with (`builder.check_encoder`); only `remove_documents` and
    `index_documents` work without one.
    """

    def __init__(self, store: Store, encoder: Encoder | None = None, held: DatastoreWriter | None = None) -> None:
        if encoder is not None:
            builder.check_encoder(store, encoder)
        self.reader, self.encoder = store, encoder  # the reader moved to this writer's commits (`commit`)
        self._held: StoreWriter | None = held  # the store's writer, opened at the first write
        self._owned = held is None  # closed by `close` (a shard's writer given by a sharded one is its own)
        self.index: TfidfIndex | None = None  # the IR index as this writer last wrote it
        self.faiss: FaissIndex | None = None  # the FAISS index this writer extends (`add_documents`)
        self._faiss_state: list | None = None  # `FaissIndex.disk_state` when `faiss` was loaded or written
        self.faiss_error: DatastoreError | None = None  # why the last add could not extend the FAISS index
        self._last: Writer | None = None  # the writer of the shard added documents go to, when that is not the store
        self.completed: list[str] = []  # ids an interrupted add had staged that the last add published with its own
        self.staged = Staged()  # what the last add made of its documents: added, replaced, unchanged (skipped)

    @property
    def store(self) -> Store:
        """The store as this writer sees it: its writer's own view once opened (its commits seen at once), else the
        reader."""
        return self.reader if self._held is None or self._held.closed else self._held.store

    def store_writer(self, wait: float | None = None) -> StoreWriter:
        """The datastore's writer, opened once (waiting up to `wait` seconds for another writer: None, as
        `lock.lock_wait` says) and held until `close`."""
        if self._held is None or self._held.closed:
            self._held = open_writer(self.reader, wait)
        return self._held

    @contextlib.contextmanager
    def commit(self, wait: float | None = None) -> Iterator[Store]:
        """One commit of the store's writer (`store_writer`), giving its view; the reader's own read transaction (a
        question's snapshot, which the commit would wait for) paused meanwhile, and the reader reopened on it."""
        with self.reader.paused(), self.store_writer(wait).commit():
            yield self.store
        self.reader.reopen_if_changed()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let the writer go (its lock: another process may write); a later write opens it again."""
        if self._held is not None and self._owned:
            self._held.close()
            self._held = None
            self.faiss = self._faiss_state = None  # read through the closed writer's view: loaded again

    @classmethod
    def open(cls, datastore: str | Path, model: str | None = None, runtime: Runtime | str = "torch") -> Writer:
        """A writer of the datastore at `datastore`, with the model it was built with (or `model`, the same
        weights) loaded as `runtime` says."""
        store = open_store(datastore)
        return cls(store, Encoder.load(model or store.manifest["model"], store.manifest.layer, runtime))

    @classmethod
    def build(
        cls,
        corpus: str | Path | Corpus | Dataset,
        out: str | Path,
        encoder: Encoder,
        n_workers: int = 0,
        progress: Callable[[str, int, int], None] | None = None,
        key_codec: str = FLOAT16,
        **options: object,
    ) -> Writer:
        """Embed a corpus into a datastore at `out` (resuming an interrupted build) and index it; `options` as
        `builder.build` takes them (lazy, pack, int8_keys, whole_words, names, ...). With a `key_codec` other than
        float16 the keys are then converted (`convert_keys`; not for a lazy store, whose keys come later)."""
        if key_codec != FLOAT16 and options.get("lazy"):
            raise ValueError("a lazy datastore has no keys to train a codec on: build it without --lazy or --key-codec")
        store = builder.build(corpus, out, encoder, progress=progress, n_workers=n_workers, **options)
        with cls(store, encoder) as writer:  # closed when the build is done: the next write opens it again
            writer.index_documents(n_workers=n_workers)
            if key_codec != FLOAT16:
                report = progress or (lambda phase, done, total: None)
                writer.convert_keys(key_codec, progress=lambda done, total: report("encoding keys", done, total))
        return writer

    def index_documents(self, segment_docs: int = SEGMENT_DOCS, n_workers: int = 1) -> TfidfIndex:
        """The datastore's IR index, extended by segments of at most `segment_docs` for the documents it lacks,
        segments merged as `tfidf_files.compact` says, each step committed (a rerun resumes after the last).

        A new datastore's index is built the same way, segment by segment, so memory stays bounded by one segment.
        Texts are hashed in `n_workers` processes (`workers.count`: 0 is every core for a large store). The writer
        lock is taken only when there is something to add.
        """
        if self._unindexed(self.store.parts(tfidf_files.KIND)):
            with self.commit(wait=LAZY_WAIT_S):
                self._extend_index(segment_docs, n_workers, commit=True)
        self.index = TfidfIndex.load(self.store)
        return self.index

    def _unindexed(self, listed: list[Part] | None) -> bool:
        """Whether the IR index lacks documents, or its segments are not merged as `merge_plan` says (a writer
        killed between a segment and its merge), or it is not committed yet (a datastore made before lists)."""
        if listed is None or not all(tfidf_files.is_written(self.store.path, part) for part in listed):
            return True
        sizes = [p.stop - p.first for p in listed]
        return sum(sizes) != self.store.n_documents or merge_plan(sizes) is not None

    def _extend_index(self, segment_docs: int, n_workers: int, commit: bool) -> list[Part]:
        """Index the documents the IR index lacks; return its new list of parts, committed each segment with
        `commit` (else the caller commits it with the documents: `add_documents`)."""
        store = self.store
        listed = self._committed()
        first = listed[-1].stop if listed else 0
        if first > store.n_documents:
            raise DatastoreError(f"the IR index of {store.path} covers {first} documents but the store has fewer")
        ranges = [(a, min(a + segment_docs, store.n_documents)) for a in range(first, store.n_documents, segment_docs)]
        texts = (text for a, b in ranges for text in store.documents.texts(a, b))
        hashed = workers.ordered_map(feature_array, texts, workers.count(n_workers, store.n_documents - first))
        forget = lambda names: store.writer.rewriting(*names)  # noqa: E731
        for start, stop in ranges:
            store.writer.rewriting(*TfidfIndex.files(start))  # parts left by an interrupted run are written anew
            listed = compact(
                store.path,
                [*listed, TfidfIndex.from_features(islice(hashed, stop - start), start).save(store.path, start)],
                forget,
            )
            self._commit_ir(listed, commit)
        listed = compact(store.path, listed, forget)  # what an interrupted writer left unmerged
        self._commit_ir(listed, commit)
        return listed

    def _commit_ir(self, listed: list[Part], commit: bool) -> None:
        """With `commit`, the IR index's parts committed and what they replaced retired."""
        if commit:
            self.store.writer.commit_parts(tfidf=listed)
            tfidf_files.retire(self.store)

    def _committed(self) -> list[Part]:
        """The IR index's committed parts, up to the first whose files are missing; a datastore made before lists
        gets its listing committed first (the FAISS index's too), and what no list names is retired."""
        store = self.store
        if store.parts(tfidf_files.KIND) is None:
            store.writer.commit_parts(tfidf=tfidf_files.listing(store.path), faiss=faiss_files.listing(store))
        listed = store.parts(tfidf_files.KIND)
        kept = next((i for i, part in enumerate(listed) if not tfidf_files.is_written(store.path, part)), len(listed))
        if kept < len(listed):  # segments deleted by hand: indexed again from the first one missing
            store.writer.commit_parts(tfidf=listed[:kept])
        tfidf_files.retire(store)
        faiss_files.retire(store)
        return listed[:kept]

    def index_keys(
        self,
        factory: str = AUTO,
        train_size: int | None = None,
        nprobe: int = NPROBE,
        progress: Callable[[int, int], None] | None = None,
        **options: object,
    ) -> FaissIndex | ShardedFaiss:
        """Train and fill the FAISS index over all keys (`bertknn index`), resuming an interrupted one; a sharded
        datastore's has one quantizer and a part per shard (`on_ray`: shards filled on a Ray cluster)."""
        if options.get("on_ray"):  # the shards are filled by Ray tasks, each through its shard's writer
            self.close()
            built = faiss_index.build(self.reader, factory, train_size, nprobe, progress=progress, on_ray=True)
        else:
            with self.commit() as store:
                built = faiss_index.build(store, factory, train_size, nprobe, progress=progress)
        one = isinstance(built, FaissIndex)  # the index `add_documents` extends; several shards' are loaded again
        self.faiss, self._faiss_state = (built, FaissIndex.disk_state(self.store)) if one else (None, None)
        return built

    def convert_keys(
        self, name: str, train_size: int = 50_000, seed: int = 0, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Store the keys compressed by the codec `name` (a FAISS factory string: `store.codec`), resumably: the
        codec trained on `train_size` keys drawn at random (`seed`) and kept as keys.codec, every key encoded into
        keys.codes (a rerun goes on from the codes written), then the manifest switched (readers read the codes
        from then on) and keys.f16 deleted; a sharded datastore's shards in turn. Returns the keys encoded now."""
        done = 0
        held = self.store_writer()
        with self.commit() as store:  # each shard its own codec, trained on its own keys
            for shard, first in zip(held.shards, store.entry_starts[:-1].tolist()):
                step = (lambda d, t, base=first: progress(base + d, store.size)) if progress else None
                done += _convert(shard.store, name, train_size, seed, step)
        return done

    def embed(self, docs: list[int], progress: Callable[[int], None] | None = None) -> int:
        """Embed the given documents that are not yet (a lazy datastore's, on demand, waiting for another writer
        first); return the entries added."""
        if not self.store.documents.pending(docs):
            return 0
        with self.commit(wait=LAZY_WAIT_S) as store:
            return builder.embed(store, docs, self._encoder(), progress=progress)

    def _encoder(self) -> Encoder:
        if self.encoder is None:
            raise ValueError("this Writer was made without an encoder; give it the datastore's model to embed")
        return self.encoder

    def _faiss(self) -> FaissIndex | None:
        """The FAISS index to extend, (re)loaded when another process wrote it since."""
        state = FaissIndex.disk_state(self.store)
        if state != self._faiss_state:
            self.faiss, self._faiss_state = FaissIndex.load(self.store), state
        return self.faiss

    def add_documents(
        self,
        docs: list[dict | Document],
        skip_existing: bool = False,
        progress=None,
        wait: float | None = None,
        replace: bool = False,
    ) -> int:
        """Embed and index new documents ({id, title, text}) without rebuilding anything; return contexts added.

        Under the datastore's writer lock, the documents are registered hidden, embedded (not in a lazy datastore:
        there on demand), given an IR index segment and appended to the FAISS index, then made live in one
        transaction: a crash at any point leaves the previous state queryable, and calling again completes the
        pending ones. Ids already live raise DatastoreError; with `skip_existing` the same document (same text) is
        skipped instead, while one with other text still raises, unless `replace`: then the new text takes the old
        one's place in the same transaction that publishes it (Lucene's updateDocument; a reader sees the old
        document or the new one, never both or neither). `wait`: seconds to wait for another writer (None: as
        `datastore.lock_wait` says, else 0). Documents an interrupted add had staged are published with these:
        their ids are then in `completed`. What became of each document given is in `staged` (`Staged`).
        """
        parsed = [d if isinstance(d, Document) else parse_document(d, f"document {i + 1}") for i, d in enumerate(docs)]
        ids = [d.id for d in parsed]
        if len(set(ids)) != len(ids):
            raise CorpusError(
                f"duplicate document id(s) in the request: {sorted({i for i in ids if ids.count(i) > 1})}"
            )
        with self.commit(wait):
            target, elsewhere = self.store_writer().place({d.id: digest(d) for d in parsed}, skip_existing, replace)
            writer = self._writer_for(target)
            added = writer._add([d for d in parsed if d.id not in elsewhere], skip_existing, progress, replace)
            self.completed, staged = writer.completed, writer.staged
            self.staged = Staged(staged.added, staged.replaced, (*elsewhere, *staged.unchanged))
        return added

    def _writer_for(self, target: DatastoreWriter) -> Writer:
        """The `Writer` that adds to `target`, the shard added documents go to (`place`): this one when that is the
        store itself, else one of that shard's, holding its writer."""
        if target is self._held:
            return self
        if self._last is None or self._last._held is not target:
            self._last = Writer(target.store, self._encoder(), held=target)
        return self._last

    def _add(self, docs: list[Document], skip_existing: bool, progress, replace: bool) -> int:
        """`add_documents` of `docs` to this writer's one-directory store, within its commit."""
        ids = [d.id for d in docs]
        store = self.store
        builder.require_built(store)
        builder.check_key_dtype(store, self._encoder())  # before anything is staged
        with self.commit() as store:
            live = [i for i, state in store.documents.states(ids).items() if state == "live"]
            if live and not (skip_existing or replace):
                raise DatastoreError(
                    f"document id(s) already in the datastore: {live[:5]}; remove them first, or replace them "
                    "(`bertknn add --replace`)"
                )
            staged = store.writer.stage([record(d, store.manifest.splitter) for d in docs], replace)
            if not store.manifest.lazy:
                builder.embed(store, store.documents.adding(), self._encoder(), progress=progress)
            ranges = self._publish(ids)
            self.staged = staged
        return sum(end - start for start, end in ranges if start is not None)

    def _publish(self, ids: list[str]) -> list[tuple[int, int]]:
        """The staged documents indexed (an IR segment, the FAISS index extended) and made live with their index
        parts in one transaction, under the writer lock; their entry ranges returned. `completed`: the ids published
        besides `ids` (staged by an interrupted add)."""
        store = self.store
        listed = {"tfidf": self._extend_index(SEGMENT_DOCS, 1, commit=False)}
        faiss = self._faiss_or_none()
        if faiss is not None:
            faiss.update(commit=False)
            listed["faiss"] = faiss.listed()
        ranges = store.documents.ranges(store.documents.adding())  # also those an interrupted add embedded
        published = store.writer.publish(**listed)  # the documents and the index parts that hold them, at once
        self.completed = [doc_id for doc_id in published if doc_id not in ids]
        tfidf_files.retire(store)
        faiss_files.retire(store)
        builder.finish(store)
        self.index = TfidfIndex.open(store.path, listed["tfidf"])
        self._faiss_state = FaissIndex.disk_state(store)
        return ranges

    def _faiss_or_none(self) -> FaissIndex | None:
        """The FAISS index to extend, or None when there is none or it is damaged (IR questions still find the new
        documents; `bertknn repair`, or `bertknn index` for an unfinished one, makes it whole with them)."""
        try:
            faiss, self.faiss_error = self._faiss(), None
        except DatastoreError as err:
            faiss = self.faiss = self._faiss_state = None
            self.faiss_error = err
        return faiss

    def repair(self, progress: Callable[[str, int, int], None] | None = None, wait: float | None = None) -> Repair:
        """Check the datastore as `bertknn verify` does and make its damaged index files again from what it keeps
        (`bertknn repair`: `build.repair.repair`): the TF-IDF segments from the stored documents, the FAISS index
        from the keys with its settings; a line per part in the returned `Repair.rebuilt` (none: it was sound).
        `build.repair.Unrepairable` (a DatastoreError), nothing written, when what the store keeps is damaged. `wait` as
        in `add_documents`; `progress(phase, done, total)`."""
        self.close()  # the repair takes the lock itself
        done = repair_datastore(self.reader.path, progress, wait)
        self.reader.reopen_if_changed()  # what this writer had loaded of the indexes is read again when next needed
        self.index, self.faiss, self._faiss_state = None, None, None
        return done

    def remove_documents(self, ids: list[str], wait: float | None = None) -> tuple[list[str], list[str]]:
        """Hide documents from every retrieval path, all in one transaction: (removed now, removed before).
        An unknown id raises DatastoreError and nothing is removed; `wait` as in `add_documents`."""
        with self.commit(wait):
            return self.store_writer().remove([str(i) for i in ids])

    def remove_document(self, doc_id: str, wait: float | None = None) -> None:
        """Hide one document from every retrieval path (DatastoreError for an id never held or removed before)."""
        removed, _ = self.remove_documents([doc_id], wait)
        if not removed:
            raise DatastoreError(f"document {doc_id!r} was removed before from {self.store.path}")


def _convert(
    store: Datastore, name: str, train_size: int, seed: int, progress: Callable[[int, int], None] | None
) -> int:
    """`Writer.convert_keys` of one shard, through its writer's view `store`; the keys encoded now."""
    if store.manifest.key_codec == name:
        return 0
    if store.manifest.key_codec != FLOAT16:
        raise DatastoreError(f"{store.path} holds its keys as {store.manifest.key_codec}; only float16 keys convert")
    codec = _pending_codec(store, name, train_size, seed)
    written = (store.path / CODES).stat().st_size if (store.path / CODES).exists() else 0
    done = start = min(written // codec.code_size, store.size)
    while done < store.size:
        stop = min(done + CONVERT_CHUNK, store.size)
        codes = codec.encode(np.asarray(store.keys[done:stop], np.float32))
        atomic.append(store.path / CODES, done * codec.code_size, codes.data)
        done = stop
        if progress:
            progress(done, store.size)
    store.writer.set_manifest(key_codec=name, key_codec_pending=None)  # the switch
    store.writer.rewriting(KEYS)
    (store.path / KEYS).unlink(missing_ok=True)
    return done - start


def _pending_codec(store: Datastore, name: str, train_size: int, seed: int) -> KeyCodec:
    """The codec of a conversion to `name`: the one an interrupted run trained, else trained now on a sample."""
    if store.manifest.get("key_codec_pending") == name and (store.path / CODEC).is_file():
        return KeyCodec.load(store.path / CODEC, name)
    rows = np.sort(np.random.default_rng(seed).permutation(store.size)[:train_size])
    codec = KeyCodec.train(name, np.asarray(store.keys[rows], np.float32))
    store.writer.rewriting(CODEC, CODES)  # what a conversion to another codec left is written anew
    (store.path / CODES).unlink(missing_ok=True)
    codec.save(store.path / CODEC)
    store.writer.set_manifest(key_codec_pending=name)
    return codec
