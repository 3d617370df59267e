"""A sharded datastore made without Ray: each shard built by the single-process builder, then shards.json written as
`distributed.build` writes it (`distributed._top_manifest`)."""

from __future__ import annotations

from pathlib import Path

from bertknn.build import distributed
from bertknn.model.encoder import Encoder
from bertknn.query.pipeline import BertKNN
from bertknn.store.atomic import write_json
from bertknn.store.datastore import Datastore
from bertknn.store.shards import SHARDS_FILE

from .conftest import write_corpus


def make_sharded(out: Path, encoder: Encoder, groups: list[list[dict]]) -> Path:
    """A sharded datastore at `out` with one shard per group of documents, in order."""
    dirs = [out / "shards" / distributed.shard_name(i) for i in range(len(groups))]
    (out / "inputs").mkdir(parents=True)
    for docs, path in zip(groups, dirs):
        BertKNN.build(write_corpus(out / "inputs" / f"{path.name}.jsonl", docs), path, encoder)
    manifest = {**Datastore(dirs[0]).manifest, "shard_docs": max(map(len, groups))}
    write_json(out / SHARDS_FILE, distributed._top_manifest(manifest, dirs))
    return out
