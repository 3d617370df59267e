"""Pruning: a copy of a datastore in which near-duplicate entries of one document are merged into one entry that
counts for all of them, so the store holds fewer keys while the vote keeps their weight (the greedy merging of He,
Neubig and Berg-Kirkpatrick, "Efficient Nearest Neighbor Language Models", EMNLP 2021).

The rule: within one document, an entry whose word equals a kept entry's and whose key lies within squared L2
distance `radius` of that kept key is merged into it, greedily in entry order (the first entry of a group is kept
with its provenance; its count becomes the sum of the counts it absorbs and its key the mean of their keys, which
stands for the group better than any one of them: the squared distance from a question to the mean is the mean of
its squared distances to the group, less the group's spread). Only within a document: BERT-kNN
searches the entries of the documents retrieval picks, so a merge across documents would move a context into a
document that may not be picked. An entry standing for n contexts votes as n of them at its own distance
(`knn.vote`); `radius` is in the vote's units (squared L2, like its temperature), so a radius well under the
temperature changes little of what the merged contexts would have voted.

The pruned store is a new directory; the source is read under its writer lock and left as it is. Like a build,
whole documents are committed in chunks, and a rerun goes on from the documents written. Its FAISS index is not
copied (entry numbers change): `bertknn index` makes one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from bertknn.index import tfidf_files
from bertknn.ingest.builder import finish, require_built
from bertknn.store.creation import copy_registration
from bertknn.store.datastore import CODEC, Datastore, DatastoreError
from bertknn.store.evidence import Evidence
from bertknn.store.protocol import Store
from bertknn.store.shards import copy_top, open_store
from bertknn.store.writers import open_writer

CHUNK_ENTRIES = 16_384  # source entries read per commit
DROPPED = ("entries", "embedded", "documents", "key_codec_pending")  # what the copy counts anew


def merge(
    keys: np.ndarray, values: np.ndarray, counts: np.ndarray, radius: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy merging of one document's entries: the rows kept (in order), the count each then stands for and its
    key, the mean of the keys it stands for (weighted by their counts).

    An entry not yet merged is kept and absorbs every later entry of the same value within squared L2 `radius` of
    its key that is not merged yet; `counts` are what each entry stood for before (1 unless pruned already)."""
    keys = np.asarray(keys, np.float32)
    keep, total = np.ones(len(values), bool), np.asarray(counts, np.int64).copy()
    merged = keys * total[:, None]  # sums of the keys each kept entry stands for
    order = np.argsort(values, kind="stable")  # entry order within each value
    for group in np.split(order, np.flatnonzero(np.diff(values[order])) + 1):
        if len(group) < 2:
            continue
        vectors = keys[group]
        norms = np.einsum("ij,ij->i", vectors, vectors)
        alive = np.ones(len(group), bool)
        for i in range(len(group) - 1):
            if not alive[i]:
                continue
            near = alive[i + 1 :] & (norms[i + 1 :] + norms[i] - 2 * vectors[i + 1 :] @ vectors[i] <= radius)
            absorbed = group[i + 1 :][near]
            total[group[i]] += total[absorbed].sum()
            merged[group[i]] += merged[absorbed].sum(axis=0)
            alive[i + 1 :] &= ~near
            keep[absorbed] = False
    kept = np.flatnonzero(keep)
    return kept, total[kept], merged[kept] / total[kept, None]


def prune(
    source: str | Path, out: str | Path, radius: float, progress: Callable[[int, int], None] | None = None
) -> Store:
    """A pruned copy of the datastore `source` at `out` (made, or a pruning begun there with the same radius gone
    on with); `progress(documents_done, documents)` after each chunk. A sharded datastore is pruned shard by
    shard, its shards.json written last."""
    if not radius >= 0:
        raise ValueError(f"the pruning radius must be a squared distance >= 0, not {radius}")
    source, out = Path(source), Path(out)
    with open_store(source) as whole:  # its shards pruned in turn, into the same places under `out`
        places = [(shard.path, out / shard.path.relative_to(source)) for shard in whole.shards]
        starts, total = whole.doc_starts.tolist(), whole.n_documents
    for (src, dst), first, end in zip(places, starts, starts[1:]):
        dst.parent.mkdir(parents=True, exist_ok=True)
        step = (lambda done, of, a=first, b=end: progress(a + done, total - (b - a - of))) if progress else None
        _prune_one(src, dst, radius, step)  # `of`: the shard's documents to prune (a lazy one's pending stay)
    copy_top(whole, out)
    return open_store(out)


def _prune_one(source: Path, out: Path, radius: float, progress: Callable[[int, int], None] | None) -> None:
    """`prune` of a one-directory datastore."""
    with open_writer(source) as reading, reading.commit():  # its lock held: no writer changes the source meanwhile
        src = reading.store
        require_built(src)
        if src.documents.adding():
            raise DatastoreError(f"{source} has documents half-added: rerun that `bertknn add` first, then prune")
        with _target(src, out, radius), open_writer(out) as writer, writer.commit():
            dst = writer.store
            todo = dst.documents.pending()
            held = set(src.documents.pending())  # not embedded in a lazy source: stay to be embedded on demand
            todo, total = [d for d in todo if d not in held], dst.n_documents - len(held)
            done = total - len(todo)
            hidden = set(src.documents.hidden().tolist())  # read once: no writer changes the source meanwhile
            for chunk in _chunks(src, todo):
                _copy_chunk(src, dst, chunk, radius, hidden)
                done += len(chunk)
                if progress:
                    progress(done, total)
            finish(dst)


def _target(src: Datastore, out: Path, radius: float) -> Datastore:
    """The pruned store at `out`: the one a run with this radius began there, else a new copy of `src`'s
    documents, sentences, words, IR index and key codec."""
    if (out / "manifest.json").exists():
        dst = Datastore(out)
        if (dst.manifest.pruned or {}).get("radius") != radius or dst.manifest["model_hash"] != src.manifest[
            "model_hash"
        ]:
            dst.close()
            raise DatastoreError(
                f"{out} holds another datastore (not a pruning of {src.path} with radius {radius}); choose a new "
                "directory"
            )
        return dst
    made = {k: v for k, v in src.manifest.items() if k not in DROPPED}
    made.update(status="building", pruned={"radius": radius, "from_entries": src.size})
    listed = src.parts(tfidf_files.KIND)
    listed = tfidf_files.listing(src.path) if listed is None else listed
    files = tfidf_files.top_names(listed) + ([CODEC] if src.codec is not None else [])
    return copy_registration(src.path, out, made, {tfidf_files.KIND: listed}, files, words=True)


def _chunks(src: Datastore, docs: list[int]) -> list[list[int]]:
    """`docs` in index order, cut where a chunk holds about CHUNK_ENTRIES source entries."""
    chunks: list[list[int]] = [[]]
    held = 0
    for doc, (a, b) in zip(docs, src.documents.ranges(docs)):
        if held >= CHUNK_ENTRIES:
            chunks.append([])
            held = 0
        chunks[-1].append(doc)
        held += b - a
    return [c for c in chunks if c]


def _copy_chunk(src: Datastore, dst: Datastore, docs: list[int], radius: float, hidden: set[int]) -> None:
    """Merge each document's entries and append what is kept to `dst` in one commit (a removed document, one of
    `hidden`, keeps an empty range: its entries are not copied)."""
    keys, values, counts = [np.zeros((0, src.dim), np.float32)], [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
    sentences: list[tuple[int, int, str]] = []
    spans: list[np.ndarray] = []
    sources: list[np.ndarray] = []  # the source entries kept, whose evidence vectors the copies carry
    for doc, (a, b) in zip(docs, src.documents.ranges(docs)):
        rows: list[tuple[int, int, int]] = []
        if doc not in hidden and a < b:
            doc_keys, doc_values = np.asarray(src.keys[a:b], np.float32), np.asarray(src.values[a:b])
            before = src.counts_of(np.arange(a, b))
            kept, count, mean = merge(doc_keys, doc_values, np.ones(b - a) if before is None else before, radius)
            keys.append(mean)
            values.append(doc_values[kept])
            counts.append(count)
            rows = src.documents.entry_rows(a + kept)
            sources.append(a + kept)
        sentences_of, spans_of = _by_sentence(doc, rows)
        sentences += sentences_of
        spans += spans_of
    evidence = _evidence(src, dst, np.concatenate([np.zeros(0, np.int64), *sources])) if dst.evidence.model else None
    keys, values, counts = np.concatenate(keys), np.concatenate(values), np.concatenate(counts)
    dst.writer.append(docs, sentences, keys, values, spans, counts=counts, evidence=evidence)


def _evidence(src: Datastore, dst: Datastore, entries: np.ndarray) -> Evidence:
    """The evidence of the kept `entries` of `src`, as `dst` commits it: their text ids, and the vectors `dst` lacks,
    copied (not embedded again)."""
    ids = src.evidence.ids(entries.tolist())
    return Evidence(ids, src.evidence.blobs(set(ids.ravel().tolist()) - dst.evidence.held(ids.ravel().tolist())))


def _by_sentence(doc: int, rows: list[tuple[int, int, int]]) -> tuple[list[tuple[int, int, str]], list[np.ndarray]]:
    """One document's entry rows (sentence, start, end), in entry order, as `DatastoreWriter.append` takes them: a
    row per sentence and the character spans of its entries (a document without entries: one row without spans,
    which gives it its empty range)."""
    sentences: list[tuple[int, int, str]] = []
    spans: list[list[tuple[int, int]]] = []
    for sentence, start, end in rows:
        if not sentences or sentences[-1][0] != sentence:
            sentences.append((sentence, doc, ""))
            spans.append([])
        spans[-1].append((start, end))
    if not sentences:
        sentences, spans = [(-1, doc, "")], [[]]
    return sentences, [np.asarray(s, np.int64).reshape(-1, 2) for s in spans]
