"""The evidence stage: the sentence encoder's vectors of a chunk's evidence texts (each entry's word, sentence and
clause: `text.evidence_texts`), those the store does not hold yet, committed with the chunk's entries
(`DatastoreWriter.append`, store/evidence.py); and the same for a store made before them (`fill`: `bertknn sentences`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from bertknn.model.runtime import Runtime
from bertknn.model.sentences import SENTENCE_MODEL, sentence_encoder
from bertknn.store import evidence as table
from bertknn.store.datastore import Datastore
from bertknn.store.schema import REMOVED_PREFIX

FILL_ENTRIES = 10_000  # entries whose evidence `fill` embeds and commits at a time
log = logging.getLogger(__name__)


def chunk(
    store: Datastore, rows: Sequence[tuple[int, int, str]], spans: Sequence[np.ndarray], runtime: Runtime
) -> table.Evidence:
    """The evidence of a chunk's entries (`rows`: (sentence index, document, text); `spans[i]`: the character spans
    of `rows[i]`'s targets), the texts new to the store embedded on `runtime`."""
    docs = sorted({doc for _, doc, _ in rows})
    title = dict(zip(docs, store.documents.titles(docs)))
    found = ((text, (int(a), int(b)), title[doc]) for (_, doc, text), where in zip(rows, spans) for a, b in where)
    return _embedded(store, table.entry_texts(found), runtime)


def _embedded(store: Datastore, texts: list[str], runtime: Runtime) -> table.Evidence:
    """Evidence of entries whose texts are `texts` (VIEWS per entry): their ids, and the new ones embedded."""
    ids = [table.text_id(t) for t in texts]
    known = store.evidence.held(ids)
    todo = {i: t for i, t in zip(ids, texts) if i not in known}
    blobs = {}
    if todo:
        blobs = dict(zip(todo, table.encode(sentence_encoder(runtime).sentence_vectors(list(todo.values())))))
    return table.Evidence(np.asarray(ids, np.int64).reshape(-1, table.VIEWS), blobs)


def fill(store: Datastore, runtime: Runtime, progress: Callable[[int, int], None] = lambda done, total: None) -> int:
    """Store the evidence vectors of a store made before them, FILL_ENTRIES entries a transaction (a run killed keeps
    what it committed; a rerun goes on from there), then name the sentence encoder in its manifest, so that its
    questions weigh their neighbours' sentences. Entries of removed documents are skipped. Returns the entries
    filled now (0 for a store that has them). `store`: a writer's own view (`writers.open_writer`)."""
    with store.writer.commit():
        if store.evidence.model:
            return 0
        first, size = store.evidence.filled, store.size
        progress(first, size)
        for start in range(first, size, FILL_ENTRIES):
            stop = min(start + FILL_ENTRIES, size)
            rows = [
                e
                for e in store.documents.provenance(list(range(start, stop)))
                if not e.doc_id.startswith(REMOVED_PREFIX)
            ]
            texts = table.entry_texts((e.sentence, e.span, e.title) for e in rows)
            store.writer.fill_evidence(stop, _embedded(store, texts, runtime))
            progress(stop, size)
        store.writer.set_manifest(**{table.FIELD: SENTENCE_MODEL})
        log.info("%s: evidence vectors stored for %s entries", store.path, f"{size - first:,}")
        return size - first
