"""A sharded datastore made without Ray: each shard built by the single-process builder, then shards.json written as
`distributed.build` writes it (`distributed._top_manifest`)."""

from __future__ import annotations

from pathlib import Path

from bertknn.ingest import distributed
from bertknn.model.encoder import Encoder
from bertknn.query.pipeline import BertKNN
from bertknn.store.atomic import write_json
from bertknn.store.datastore import Datastore
from bertknn.store.shards import SHARDS_FILE, ShardedDatastore, shard_name

from .conftest import write_corpus


def make_sharded(out: Path, encoder: Encoder, groups: list[list[dict]]) -> Path:
    """A sharded datastore at `out` with one shard per group of documents, in order."""
    dirs = [out / "shards" / shard_name(i) for i in range(len(groups))]
    (out / "inputs").mkdir(parents=True)
    for docs, path in zip(groups, dirs):
        BertKNN.build(write_corpus(out / "inputs" / f"{path.name}.jsonl", docs), path, encoder)
    manifest = {**Datastore(dirs[0]).manifest, "shard_docs": max(map(len, groups))}
    write_json(out / SHARDS_FILE, distributed._top_manifest(manifest, dirs))
    return out


def reader_counts(store: ShardedDatastore) -> tuple:
    """The counts a sharded datastore's manifest shows: documents, entries, live documents, and per shard its offsets
    and sizes."""
    manifest = store.manifest
    rows = [(r["first_document"], r["first_entry"], r["documents"], r["entries"]) for r in manifest["shards"]]
    return manifest["documents"], manifest["entries"], manifest["live_documents"], rows


def true_counts(store: ShardedDatastore) -> tuple:
    """The same counts as the shards themselves hold them (each read from the shard's own store)."""
    rows = [
        (int(d), int(e), s.n_documents, s.size) for d, e, s in zip(store.doc_starts, store.entry_starts, store.shards)
    ]
    return store.n_documents, store.size, store.documents.count_live(), rows
